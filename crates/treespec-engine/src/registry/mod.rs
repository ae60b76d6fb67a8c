//! The method registry: names ([`MethodKind`]), knobs ([`MethodKnobs`]) and their resolution
//! into a drafter configuration ([`MethodSpec::resolve`]).
//!
//! Every front end produces a [`MethodSpec`] — the CLI from its flags, the server from a
//! request's `treespec` object, the benchmark from its method list — and none of them maps names
//! to drafters itself. Modelled on vLLM's `SpeculativeMethod` + `SpeculativeConfig` and
//! llama.cpp's single `common_speculative_type_from_name_map`.

mod knobs;
mod resolve;

pub use crate::method_kind::{MethodKind, METHOD_NAMES};
pub use knobs::{Budget, MethodKnobs};
pub use resolve::{FixedContext, MethodContext, MethodSpec, DEFAULT_SEQUOIA_ACCEPTANCE};

#[cfg(test)]
mod tests {
    use serde_json::json;
    use treespec_core::cost::CostCurve;

    use super::*;
    use crate::auto_budget::CostModel;
    use crate::drafters::DySpecMode;
    use crate::Method;

    fn ctx() -> FixedContext {
        let curve = |base, per| CostCurve::linear(base, per, 16).unwrap();
        FixedContext {
            costs: Some(CostModel::new(curve(20.0, 2.0), Some(curve(5.0, 1.0)))),
            ..Default::default()
        }
    }

    #[test]
    fn every_method_resolves_with_default_knobs_and_validates() {
        for kind in MethodKind::ALL {
            let spec = MethodSpec::new(kind);
            spec.validate().unwrap_or_else(|e| panic!("{kind}: {e}"));
            let m = spec.resolve(&ctx()).unwrap();
            assert_eq!(m.kind(), kind);
            assert_eq!(m.needs_draft(), kind.needs_draft());
        }
    }

    #[test]
    fn dyspec_is_cost_aware_unless_given_a_number() {
        let spec = MethodSpec::new(MethodKind::DySpec);
        assert!(spec.needs_costs());
        let Method::DySpec(c) = spec.resolve(&ctx()).unwrap() else { panic!() };
        assert!(c.costs.is_some());
        assert_eq!((c.budget, c.mode), (16, DySpecMode::Layer));
        assert!(spec.resolve(&FixedContext::default()).is_err(), "costs are required");
        let fixed = MethodSpec {
            knobs: MethodKnobs { budget: Some(Budget::Nodes(5)), ..Default::default() },
            ..spec
        };
        assert!(!fixed.needs_costs());
        let Method::DySpec(c) = fixed.resolve(&FixedContext::default()).unwrap() else { panic!() };
        assert_eq!((c.budget, c.costs.is_none()), (5, true));
    }

    #[test]
    fn sequoia_runs_without_a_calibration_file() {
        let Method::Sequoia(c) = MethodSpec::new(MethodKind::Sequoia).resolve(&ctx()).unwrap() else {
            panic!()
        };
        assert_eq!(c.acceptance, DEFAULT_SEQUOIA_ACCEPTANCE.to_vec());
    }

    #[test]
    fn the_largest_sizes_are_refused_or_served_never_a_panic() {
        for &kind in crate::METHOD_NAMES {
            for knob in ["k", "budget", "budget_max", "depth", "lookup_tokens", "lookup_ngram"] {
                let mut v = json!({ knob: u64::MAX });
                v["method"] = json!(kind);
                let Ok(Some(spec)) = MethodSpec::from_json(v) else { continue };
                let checked = std::panic::catch_unwind(|| spec.validate().map(|_| ()));
                assert!(checked.is_ok(), "{kind} with {knob} = u64::MAX panicked");
            }
        }
    }

    #[test]
    fn bad_knobs_are_refused_naming_the_knob() {
        let bad = |kind, knobs: serde_json::Value| {
            let mut v = knobs;
            v["method"] = json!(kind);
            let spec = MethodSpec::from_json(v).unwrap().unwrap();
            spec.validate().unwrap_err().to_string()
        };
        assert!(bad("chain", json!({"k": 0})).contains("chain length"));
        assert!(bad("sequoia", json!({"budget": u64::MAX})).contains("sequoia budget"));
        assert!(bad("tree", json!({"widths": [2, 0]})).contains("widths"));
        assert!(bad("eagle2", json!({"budget": "auto"})).contains("budget auto"));
        assert!(bad("dyspec", json!({"budget": 0})).contains("budget"));
        assert!(bad("suffix", json!({"suffix_pessimism": 9.0})).contains("pessimism"));
        assert!(bad("lookup", json!({"lookup_tokens": 0})).contains("max_tokens"));
    }

    #[test]
    fn json_specs_name_the_method_and_refuse_unknown_knobs() {
        assert_eq!(MethodSpec::from_json(json!({})).unwrap(), None);
        assert_eq!(MethodSpec::from_json(json!({"method": null})).unwrap(), None);
        let s = MethodSpec::from_json(json!({"method": "chain", "draft_max": 3})).unwrap().unwrap();
        assert_eq!((s.method, s.knobs.k), (MethodKind::Chain, Some(3)));
        assert!(MethodSpec::from_json(json!({"k": 3})).unwrap_err().to_string().contains("need a `method`"));
        assert!(MethodSpec::from_json(json!({"method": "magic"}))
            .unwrap_err()
            .to_string()
            .contains("unknown method"));
        assert!(MethodSpec::from_json(json!({"method": 3})).is_err());
        assert!(MethodSpec::from_json(json!({"method": "chain", "kk": 3}))
            .unwrap_err()
            .to_string()
            .contains("kk"));
        assert!(MethodSpec::from_json(json!([1])).is_err());
        // The recorded form reads back as the same spec.
        let back = MethodSpec::from_json(serde_json::to_value(&s).unwrap()).unwrap().unwrap();
        assert_eq!(back, s);
    }
}
