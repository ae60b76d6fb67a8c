//! A resolved method: its drafter configuration as plain data, and [`Method::build`], which turns
//! it into a drafter. Names and knobs become a `Method` in one place, [`crate::registry`].

use std::sync::Arc;

use treespec_core::ngram::NgramTable;

use crate::auto_budget::SharedCosts;
use crate::backend::CausalLm;
use crate::drafter::{Drafter, PlainDrafter};
use crate::drafters::{
    AutoConfig, AutoDrafter, ChainDrafter, DiscoConfig, DiscoDrafter, DySpecConfig, DySpecDrafter,
    Eagle2Config, Eagle2Drafter, GsdConfig, GsdDrafter, LookupConfig, LookupDrafter, SampleMode,
    SequoiaConfig, SequoiaDrafter, StagedConfig, StagedDrafter, SuffixConfig, SuffixDrafter, SuffixShared,
    TreeDrafter,
};
use crate::error::{EngineError, Result};
use crate::method_kind::MethodKind;

/// A decoding method and its knobs.
#[derive(Debug, Clone)]
pub enum Method {
    /// Plain decoding: one target forward per token.
    Plain,
    /// Chain speculative decoding with `k` draft tokens.
    Chain { k: usize },
    /// Fixed tree, children drawn without replacement, `widths[d]` per node at depth d+1.
    Tree { widths: Vec<usize> },
    /// SpecInfer's static expansion tree `<k1,…,km>`, i.i.d. children.
    SpecInfer { expand: Vec<usize> },
    /// Sequoia's DP-optimal tree.
    Sequoia(SequoiaConfig),
    /// DySpec's dynamic token tree.
    DySpec(DySpecConfig),
    /// EAGLE-2's dynamic tree (top-k expansion and reranking).
    Eagle2(Eagle2Config),
    /// Graph-structured drafts.
    Gsd(GsdConfig),
    /// Staged drafting with an n-gram second stage.
    Staged(StagedConfig),
    /// Model-free prompt lookup / context n-grams.
    Lookup { config: LookupConfig, table: Option<Arc<NgramTable>> },
    /// Model-free suffix drafting over this request's and earlier requests' text.
    Suffix(SuffixConfig),
    /// Dynamic speculation lookahead.
    Disco(DiscoConfig),
    /// Per step, the best of suffix drafts, cost-aware DySpec (with a draft model) and plain
    /// decoding on the measured cost curves.
    Auto(AutoConfig),
}

impl Method {
    /// The method's name.
    pub fn kind(&self) -> MethodKind {
        match self {
            Method::Plain => MethodKind::Plain,
            Method::Chain { .. } => MethodKind::Chain,
            Method::Tree { .. } => MethodKind::Tree,
            Method::SpecInfer { .. } => MethodKind::SpecInfer,
            Method::Sequoia(_) => MethodKind::Sequoia,
            Method::DySpec(_) => MethodKind::DySpec,
            Method::Eagle2(_) => MethodKind::Eagle2,
            Method::Gsd(_) => MethodKind::Gsd,
            Method::Staged(_) => MethodKind::Staged,
            Method::Lookup { .. } => MethodKind::Lookup,
            Method::Suffix(_) => MethodKind::Suffix,
            Method::Disco(_) => MethodKind::Disco,
            Method::Auto(_) => MethodKind::Auto,
        }
    }

    /// The method's name.
    pub fn name(&self) -> &'static str {
        self.kind().as_str()
    }

    /// Whether the method runs a draft model.
    pub fn needs_draft(&self) -> bool {
        self.kind().needs_draft()
    }

    /// Whether the method runs a draft model when one is given (`auto` uses one if offered).
    pub fn uses_draft(&self) -> bool {
        self.kind().uses_draft()
    }

    /// The suffix drafts' shared state (global history and learned prices), for the methods that
    /// draft from it: the caller may save the history after a run.
    pub fn suffix_shared(&self) -> Option<&Arc<SuffixShared>> {
        match self {
            Method::Suffix(c) => Some(&c.shared),
            Method::Auto(c) => Some(&c.suffix.shared),
            _ => None,
        }
    }

    /// The same method, learning apart: its suffix drafts on `suffix` (another history and
    /// learned prices) and its cost curves' learned calibration started afresh from the measured
    /// curves. A server gives each tenant its own, so that what one tenant's requests teach
    /// never speeds up, and so never reveals itself to, another's.
    pub fn learning_apart(&self, suffix: Arc<SuffixShared>) -> Method {
        let fresh = |c: &Arc<SharedCosts>| SharedCosts::new(c.initial().clone());
        let mut m = self.clone();
        match &mut m {
            Method::Suffix(c) => {
                c.shared = suffix;
                c.costs = c.costs.as_ref().map(fresh);
            }
            Method::DySpec(c) => c.costs = c.costs.as_ref().map(fresh),
            Method::Auto(c) => {
                let costs = fresh(&c.costs);
                c.suffix.shared = suffix;
                c.suffix.costs = c.suffix.costs.as_ref().map(|_| costs.clone());
                c.dyspec.costs = c.dyspec.costs.as_ref().map(|_| costs.clone());
                c.costs = costs;
            }
            _ => {}
        }
        m
    }

    /// Keep suffix drafts from earlier requests with the very same prompt (a benchmark's warm-up
    /// and repeats must not speed a prompt up with its own earlier answer).
    pub fn exclude_same_prompt(&mut self) {
        match self {
            Method::Suffix(c) => c.exclude_same_prompt = true,
            Method::Auto(c) => c.suffix.exclude_same_prompt = true,
            _ => {}
        }
    }

    /// Build the drafter. `draft` is the draft model for methods that need one (ignored by the
    /// others); a method that needs one and gets none is an error.
    pub fn build<'a, M: CausalLm + 'a>(&self, draft: Option<M>) -> Result<Box<dyn Drafter + 'a>> {
        if let Method::Auto(c) = self {
            return Ok(Box::new(AutoDrafter::new(draft, c.clone())?));
        }
        if !self.needs_draft() {
            return Ok(match self {
                Method::Lookup { config, table } => match table {
                    Some(t) => Box::new(LookupDrafter::with_table(*config, t.clone())?),
                    None => Box::new(LookupDrafter::new(*config)?),
                },
                Method::Suffix(c) => Box::new(SuffixDrafter::new(c.clone())?),
                _ => Box::new(PlainDrafter),
            });
        }
        let draft = draft.ok_or_else(|| {
            EngineError::InvalidRequest(format!(
                "method '{}' needs a draft model (-md DRAFT.gguf); 'plain', 'lookup', 'suffix' and 'auto' do not",
                self.name()
            ))
        })?;
        Ok(match self {
            Method::Chain { k } => Box::new(ChainDrafter::new(draft, *k)?),
            Method::Tree { widths } => Box::new(TreeDrafter::new(draft, widths.clone())?),
            Method::SpecInfer { expand } => {
                Box::new(TreeDrafter::with_mode(draft, expand.clone(), SampleMode::Iid)?)
            }
            Method::Sequoia(c) => Box::new(SequoiaDrafter::new(draft, c.clone())?),
            Method::DySpec(c) => Box::new(DySpecDrafter::new(draft, c.clone())?),
            Method::Eagle2(c) => Box::new(Eagle2Drafter::new(draft, *c)?),
            Method::Gsd(c) => Box::new(GsdDrafter::new(draft, *c)?),
            Method::Staged(c) => Box::new(StagedDrafter::new(draft, c.clone())?),
            Method::Disco(c) => Box::new(DiscoDrafter::new(draft, c.clone())?),
            Method::Plain | Method::Lookup { .. } | Method::Suffix(_) | Method::Auto(_) => {
                unreachable!("handled above")
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toy::{ToyLm, ToyModel};

    #[test]
    fn every_method_builds_on_a_toy_pair_and_needs_its_draft() {
        let m = ToyModel::new(8, 1, 1);
        let methods = [
            Method::Plain,
            Method::Chain { k: 3 },
            Method::Tree { widths: vec![2, 1] },
            Method::SpecInfer { expand: vec![2, 1] },
            Method::Sequoia(SequoiaConfig { acceptance: vec![0.6, 0.2], ..Default::default() }),
            Method::DySpec(DySpecConfig::default()),
            Method::Eagle2(Eagle2Config::default()),
            Method::Gsd(GsdConfig::default()),
            Method::Staged(StagedConfig::default()),
            Method::Lookup { config: LookupConfig::default(), table: None },
            Method::Suffix(SuffixConfig::default()),
            Method::Disco(DiscoConfig::default()),
            Method::Auto(AutoConfig {
                costs: crate::auto_budget::SharedCosts::new(crate::auto_budget::CostModel::new(
                    treespec_core::cost::CostCurve::linear(20.0, 10.0, 8).unwrap(),
                    Some(treespec_core::cost::CostCurve::linear(2.0, 1.0, 8).unwrap()),
                )),
                suffix: SuffixConfig::default(),
                dyspec: DySpecConfig::default(),
                trace: None,
            }),
        ];
        assert_eq!(methods.len(), crate::method_kind::METHOD_NAMES.len());
        for (method, &name) in methods.iter().zip(crate::method_kind::METHOD_NAMES) {
            assert_eq!(method.name(), name);
            let d = method.build(Some(ToyLm::new(m.clone(), 64))).unwrap();
            assert_eq!(d.name(), name);
            let none: Option<ToyLm> = None;
            assert_eq!(method.build(none).is_err(), method.needs_draft());
        }
        assert!(Method::Chain { k: 0 }.build(Some(ToyLm::new(m, 64))).is_err());
    }
}
