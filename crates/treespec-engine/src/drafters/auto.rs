//! `--method auto`: per step, the proposal with the best expected gain on the measured cost
//! curves — a model-free prompt lookup, DySpec's cost-aware tree over the draft model, or nothing
//! (plain decoding).
//!
//! Every step the lookup proposes first (it costs nothing); its chain or trie is priced with its
//! own online calibration (acceptance per depth) and cut to its best prefix. The draft model runs
//! only if an optimistic bound on what it could add beats that. Under greedy decoding the two
//! finished trees are compared and the better one is verified. Under sampling the choice must not
//! depend on the model tree's own draws (that would bias them), so once the bound says the model
//! may win, its tree is verified whatever it turned out to be; lookup trees are deterministic
//! candidates, exact in either case.

use std::sync::Arc;

use treespec_core::budget::value_order;
use treespec_core::ngram::NgramTable;
use treespec_core::sampling::Sampler;
use treespec_core::tree::{TokenTree, ROOT};
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;

use super::{DySpecConfig, DySpecDrafter, LookupConfig, LookupDrafter};
use crate::auto_budget::{AutoBudget, SharedCosts};
use crate::drafter::{Drafter, ProposeContext};
use crate::error::{EngineError, Result};
use crate::model::CausalLm;

/// Knobs of the `auto` method.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoConfig {
    /// The measured cost curves (required), shared with every drafter of this method.
    pub costs: Arc<SharedCosts>,
    /// The lookup proposal's knobs.
    pub lookup: LookupConfig,
    /// Static n-gram table for the lookup, if any.
    pub table: Option<Arc<NgramTable>>,
    /// The model proposal's knobs (its `costs` are set from `costs`).
    pub dyspec: DySpecConfig,
}

/// Which proposal a step verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    Plain,
    Lookup,
    Model,
}

/// The `auto` drafter.
pub struct AutoDrafter<M: CausalLm> {
    lookup: LookupDrafter,
    lookup_budget: AutoBudget,
    model: Option<DySpecDrafter<M>>,
    choice: Choice,
    counts: [u64; 3],
}

impl<M: CausalLm> AutoDrafter<M> {
    /// An `auto` drafter; `draft` is optional (lookup or plain decoding only without it).
    pub fn new(draft: Option<M>, config: AutoConfig) -> Result<Self> {
        let lookup = match &config.table {
            Some(t) => LookupDrafter::with_table(config.lookup, t.clone())?,
            None => LookupDrafter::new(config.lookup)?,
        };
        let model = match draft {
            Some(d) => {
                if config.costs.initial().draft.is_none() {
                    return Err(EngineError::InvalidRequest(
                        "auto: a draft model needs its measured cost curve".into(),
                    ));
                }
                let dyspec = DySpecConfig { costs: Some(config.costs.clone()), ..config.dyspec };
                Some(DySpecDrafter::new(d, dyspec)?)
            }
            None => None,
        };
        Ok(Self {
            lookup,
            lookup_budget: AutoBudget::shared(config.costs.clone(), "lookup", false),
            model,
            choice: Choice::Plain,
            counts: [0; 3],
        })
    }

    /// The lookup's proposal cut to its best prefix, its gain, and each kept node's raw score.
    fn priced_lookup(&mut self, ctx: &ProposeContext) -> Result<(TokenTree, f64)> {
        let tree = self.lookup.propose(ctx)?;
        // A lookup node's score is its match's confidence (see `LookupDrafter`), the same for
        // every node of a continuation: it is what the calibration bins, per depth.
        let mut value = vec![1.0; tree.len()];
        for (id, node) in tree.nodes().iter().enumerate().skip(1) {
            let parent = node.parent.unwrap_or(ROOT);
            value[id] = value[parent] * self.lookup_budget.acceptance(node.depth, node.draft_prob as f64);
        }
        let order = value_order(&tree, &value);
        let values: Vec<f64> = order.iter().map(|&n| value[n]).collect();
        let (n, gain) = self.lookup_budget.economics().best_prefix(&values);
        let (cut, _) = tree.retain(&order[..n])?;
        Ok((cut, gain))
    }
}

impl<M: CausalLm> Drafter for AutoDrafter<M> {
    fn name(&self) -> &str {
        "auto"
    }

    fn begin(&mut self, prompt: &[TokenId], sampler: &Sampler, seed: u64) -> Result<()> {
        self.lookup.begin(prompt, sampler, seed)?;
        self.lookup_budget.begin();
        self.counts = [0; 3];
        if let Some(m) = self.model.as_mut() {
            m.begin(prompt, sampler, seed)?;
        }
        Ok(())
    }

    fn propose(&mut self, ctx: &ProposeContext) -> Result<TokenTree> {
        let (lookup_tree, lookup_gain) = self.priced_lookup(ctx)?;
        let mut best = (lookup_tree, lookup_gain.max(0.0));
        self.choice = if best.0.drafted() > 0 { Choice::Lookup } else { Choice::Plain };
        if let Some(m) = self.model.as_mut() {
            m.set_bar(best.1);
            let model_tree = m.propose(ctx)?;
            let model_gain = m.last_gain();
            let model_wins = if ctx.sampler.is_greedy() {
                model_tree.drafted() > 0 && model_gain > best.1
            } else {
                // The model ran only because its bound beat the bar: verify its tree as drawn.
                model_tree.drafted() > 0
            };
            if model_wins {
                best = (model_tree, model_gain);
                self.choice = Choice::Model;
            } else {
                m.discard_proposal(model_tree.len());
            }
        }
        self.counts[self.choice as usize] += 1;
        // Only the lookup's own trees are calibration trials for the lookup.
        let raw = if self.choice == Choice::Lookup {
            best.0.nodes().iter().map(|n| n.draft_prob as f64).collect()
        } else {
            Vec::new()
        };
        self.lookup_budget.set_raw(raw);
        Ok(best.0)
    }

    fn observe_cost(&mut self, target_rows: usize, target_ms: f64) {
        self.lookup_budget.observe_target(target_rows, target_ms);
        if let Some(m) = self.model.as_mut() {
            m.observe_cost(target_rows, target_ms);
        }
    }

    fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) -> Result<()> {
        self.lookup.observe(tree, outcome)?;
        self.lookup_budget.observe(tree, outcome);
        if let Some(m) = self.model.as_mut() {
            m.observe(tree, outcome)?;
        }
        Ok(())
    }

    fn draft_forwards(&self) -> u64 {
        self.model.as_ref().map_or(0, |m| m.draft_forwards())
    }

    fn extra_stats(&self) -> Vec<(&'static str, f64)> {
        let mut out = vec![
            ("auto_plain_steps", self.counts[Choice::Plain as usize] as f64),
            ("auto_lookup_steps", self.counts[Choice::Lookup as usize] as f64),
            ("auto_model_steps", self.counts[Choice::Model as usize] as f64),
        ];
        if let Some(a) = self.lookup_budget.calibrator().per_depth().first().copied().flatten() {
            out.push(("lookup_calibrated_accept_d1", a));
        }
        if let Some(m) = &self.model {
            out.extend(m.extra_stats().into_iter().filter(|(k, _)| k.starts_with("calibrated")));
        }
        out
    }
}
