//! Method parity: every method name and knob, given to the CLI's parser and to the server's
//! request parser, must come out as the same spec and resolve to the same configuration.

use std::sync::Arc;

use clap::Parser;
use serde_json::{json, Value};
use treespec_core::cost::CostCurve;
use treespec_engine::auto_budget::CostModel;
use treespec_engine::registry::FixedContext;
use treespec_engine::{Method, MethodKind, MethodSpec};
use treespec_server::methods::ServerMethods;
use treespec_server::validate::method_from_json;

use super::generate::GenerateArgs;

#[derive(Parser)]
struct Cmd {
    #[command(flatten)]
    generate: GenerateArgs,
}

/// (CLI flags, the same knobs as a request's `treespec` object).
fn table() -> Vec<(&'static str, Value)> {
    vec![
        ("", json!({})),
        ("-k 3", json!({"k": 3})),
        ("--spec-draft-n-max 5", json!({"draft_max": 5})),
        ("--draft-max 2", json!({"k": 2})),
        ("--widths 3,1", json!({"widths": [3, 1]})),
        ("--expand 2,2,1", json!({"expand": [2, 2, 1]})),
        ("--budget 12", json!({"budget": 12})),
        ("--budget auto", json!({"budget": "auto"})),
        ("--budget 0", json!({"budget": 0})),
        ("--budget-max 8 --depth 3", json!({"budget_max": 8, "depth": 3})),
        ("--dyspec-mode heap --dyspec-threshold 0.1", json!({"dyspec_mode": "heap", "dyspec_threshold": 0.1})),
        ("--eagle-top-k 2", json!({"eagle_top_k": 2})),
        ("--acceptance 0.7,0.2", json!({"acceptance": [0.7, 0.2]})),
        (
            "--gsd-top-n 3 --gsd-ratio 0.5 --gsd-parent-min 0.2 --gsd-r 0",
            json!({"gsd_top_n": 3, "gsd_ratio": 0.5, "gsd_parent_min": 0.2, "gsd_r": 0}),
        ),
        ("--lookahead 2 --branch-depths 1 --branch-width 3", json!({"lookahead": 2, "branch_depths": 1, "branch_width": 3})),
        (
            "--lookup-ngram 4 --lookup-tokens 6 --lookup-branches 2",
            json!({"lookup_ngram": 4, "lookup_tokens": 6, "lookup_branches": 2}),
        ),
        (
            "--suffix-depth 32 --suffix-nodes 24 --suffix-occurrences 4 --suffix-pessimism 0.5 --suffix-explore 0",
            json!({"suffix_depth": 32, "suffix_nodes": 24, "suffix_occurrences": 4, "suffix_pessimism": 0.5, "suffix_explore": 0}),
        ),
        ("--no-global", json!({"global": false})),
        ("--suffix-reanchor off", json!({"suffix_reanchor": false})),
        ("--suffix-reanchor on", json!({"suffix_reanchor": true})),
        (
            "--disco-threshold 0.3 --disco-max 10 --disco-stop-prob 0.4",
            json!({"disco_threshold": 0.3, "disco_max": 10, "disco_stop_prob": 0.4}),
        ),
    ]
}

fn cli_spec(kind: MethodKind, flags: &str) -> MethodSpec {
    let line = format!("t -m T.gguf -p x --method {kind} {flags}");
    let cmd = Cmd::try_parse_from(line.split_whitespace()).unwrap_or_else(|e| panic!("{line}: {e}"));
    cmd.generate.method.spec()
}

fn context() -> FixedContext {
    let curve = |base, per| CostCurve::linear(base, per, 32).unwrap();
    FixedContext {
        costs: Some(CostModel::new(curve(20.0, 2.0), Some(curve(5.0, 1.0)))),
        suffix: Some(treespec_engine::drafters::SuffixShared::empty()),
        ..Default::default()
    }
}

#[test]
fn every_method_and_knob_means_the_same_on_the_command_line_and_in_a_request() {
    let ctx = context();
    let mut compared = 0;
    for kind in MethodKind::ALL {
        for (flags, knobs) in table() {
            let cli = cli_spec(kind, flags);
            let mut body = knobs.clone();
            body["method"] = json!(kind.as_str());
            let server = method_from_json(body, true);
            // The CLI checks knobs when it resolves (and builds); the server when it validates.
            let cli_ok = cli.validate().and_then(|_| cli.resolve(&ctx).map(|_| ()));
            match (&cli_ok, &server) {
                (Ok(()), Ok(Some(spec))) => {
                    assert_eq!(&cli, spec, "{kind} {flags}");
                    let (a, b) = (cli.resolve(&ctx).unwrap(), spec.resolve(&ctx).unwrap());
                    assert_eq!(format!("{a:?}"), format!("{b:?}"), "{kind} {flags}");
                    compared += 1;
                }
                (Err(_), Err(_)) => {}
                (a, b) => panic!("{kind} {flags}: CLI {a:?} but server {b:?}"),
            }
        }
    }
    assert!(compared > 200, "only {compared} pairs compared");
}

#[test]
fn process_wide_knobs_are_flags_only() {
    for (flag, knob) in [
        ("--ngram t.bin", json!({"ngram": "t.bin"})),
        ("--calibration c.json", json!({"calibration": "c.json"})),
        ("--suffix-history h.bin", json!({"suffix_history": "h.bin"})),
        ("--suffix-cap 1000", json!({"suffix_cap": 1000})),
        ("--disco-model d.json", json!({"disco_model": "d.json"})),
    ] {
        let spec = cli_spec(MethodKind::Lookup, flag);
        assert!(!spec.knobs.process_wide().is_empty(), "{flag}");
        let mut body = knob;
        body["method"] = json!("lookup");
        let e = method_from_json(body, true).unwrap_err();
        assert!(e.message.contains("set when the server starts"), "{flag}: {}", e.message);
    }
}

#[test]
fn a_server_dyspec_request_without_knobs_gets_the_cost_aware_budget() {
    let spec = method_from_json(json!({"method": "dyspec"}), true).unwrap().unwrap();
    let methods = ServerMethods::new(Method::Plain, Arc::new(context()));
    let Method::DySpec(server) = methods.for_request(Some(&spec), treespec_server::Tenant::SHARED).unwrap()
    else {
        panic!()
    };
    assert!(server.costs.is_some(), "a request's dyspec must size its budget from the measured costs");
    let Method::DySpec(cli) = cli_spec(MethodKind::DySpec, "").resolve(&context()).unwrap() else { panic!() };
    assert_eq!((server.budget, server.max_depth, server.mode), (cli.budget, cli.max_depth, cli.mode));
    assert!(cli.costs.is_some());
    // The same spec again is the same method, with what it learned.
    let Method::DySpec(again) = methods.for_request(Some(&spec), treespec_server::Tenant::SHARED).unwrap()
    else {
        panic!()
    };
    assert!(Arc::ptr_eq(server.costs.as_ref().unwrap(), again.costs.as_ref().unwrap()));
}
