//! `--method auto`: per step, the proposal with the best expected gain on the measured cost
//! curves — a free suffix draft (this request's and earlier requests' text), DySpec's cost-aware
//! tree over the draft model, or nothing (plain decoding).
//!
//! Every step the suffix drafter proposes first (it costs nothing); its trie is priced with its
//! own pessimistic, learned acceptance and cut to its best prefix. The draft model runs only if an
//! optimistic bound on what it could add beats that. Under greedy decoding the two finished trees
//! are compared and the better one is verified. Under sampling the choice must not depend on the
//! model tree's own draws (that would bias them), so once the bound says the model may win, its
//! tree is verified whatever it turned out to be; suffix trees are deterministic candidates, exact
//! in either case.

use std::sync::Arc;

use treespec_core::sampling::Sampler;
use treespec_core::tree::TokenTree;
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;

use super::{DySpecConfig, DySpecDrafter, SuffixConfig, SuffixDrafter};
use crate::auto_budget::SharedCosts;
use crate::drafter::{Cuttable, Drafter, ProposeContext};
use crate::error::{EngineError, Result};
use crate::extra_stats::{AutoChoices, ExtraStats};
use crate::model::CausalLm;

/// Knobs of the `auto` method.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoConfig {
    /// The measured cost curves (required), shared with every drafter of this method.
    pub costs: Arc<SharedCosts>,
    /// The free proposal's knobs (its `costs` are set from `costs`).
    pub suffix: SuffixConfig,
    /// The model proposal's knobs (its `costs` are set from `costs`).
    pub dyspec: DySpecConfig,
}

/// Steps between chances for a gated-off draft model to show it pays after all.
const MODEL_RECHECK_EVERY: u64 = 64;

/// Which proposal a step verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    Plain,
    Suffix,
    Model,
}

/// The `auto` drafter.
pub struct AutoDrafter<M: CausalLm> {
    suffix: SuffixDrafter,
    model: Option<DySpecDrafter<M>>,
    choice: Choice,
    counts: [u64; 3],
    steps: u64,
}

impl<M: CausalLm> AutoDrafter<M> {
    /// An `auto` drafter; `draft` is optional (suffix drafts or plain decoding only without it).
    pub fn new(draft: Option<M>, config: AutoConfig) -> Result<Self> {
        let suffix = SuffixDrafter::new(SuffixConfig { costs: Some(config.costs.clone()), ..config.suffix })?;
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
        Ok(Self { suffix, model, choice: Choice::Plain, counts: [0; 3], steps: 0 })
    }
}

impl<M: CausalLm> Drafter for AutoDrafter<M> {
    fn name(&self) -> &str {
        "auto"
    }

    /// The draft model gets the text only when a step first asks it to draft: its prompt
    /// prefill (a large part of a request's first-token time, and in a batch a stall for every
    /// other request) is not spent on requests whose steps never find that it can pay.
    fn begin(&mut self, prompt: &[TokenId], sampler: &Sampler, seed: u64) -> Result<()> {
        self.suffix.begin(prompt, sampler, seed)?;
        self.counts = [0; 3];
        if let Some(m) = self.model.as_mut() {
            m.begin_deferred(seed);
        }
        Ok(())
    }

    fn propose(&mut self, ctx: &ProposeContext) -> Result<TokenTree> {
        let suffix_tree = self.suffix.propose(ctx)?;
        let mut best = (suffix_tree, self.suffix.last_gain());
        self.choice = if best.0.drafted() > 0 { Choice::Suffix } else { Choice::Plain };
        self.steps += 1;
        // A draft model that cannot pay even along its best chain (in a batch: on the batch's
        // rate, which its drafting time holds up for every request) stays idle, apart from a rare
        // step that lets its calibration see whether the text got easier.
        if let Some(m) = self.model.as_mut() {
            m.set_batch_rows(ctx.batch_rows);
        }
        let model = self
            .model
            .as_mut()
            .filter(|m| m.chain_can_pay() || self.steps.is_multiple_of(MODEL_RECHECK_EVERY));
        if let Some(m) = model {
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
                self.suffix.discard_proposal();
            } else {
                m.discard_proposal(model_tree.len());
            }
        }
        self.counts[self.choice as usize] += 1;
        Ok(best.0)
    }

    /// A suffix proposal may be cut by a batch budget; a model tree may not (its nodes are
    /// sampled under sampling, and its drafter maps node ids to draft-model rows).
    fn cuttable(&self) -> Option<Cuttable<'_>> {
        match self.choice {
            Choice::Suffix => self.suffix.cuttable(),
            Choice::Plain | Choice::Model => None,
        }
    }

    fn observe_cost(&mut self, target_rows: usize, target_ms: f64) {
        self.suffix.observe_cost(target_rows, target_ms);
        if let Some(m) = self.model.as_mut() {
            m.observe_cost(target_rows, target_ms);
        }
    }

    fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) -> Result<()> {
        self.suffix.observe(tree, outcome)?;
        if let Some(m) = self.model.as_mut() {
            m.observe(tree, outcome)?;
        }
        Ok(())
    }

    fn finish(&mut self, text: &[TokenId]) {
        self.suffix.finish(text);
    }

    fn draft_forwards(&self) -> u64 {
        self.model.as_ref().map_or(0, |m| m.draft_forwards())
    }

    fn extra_stats(&self) -> ExtraStats {
        let auto = AutoChoices {
            plain_steps: self.counts[Choice::Plain as usize],
            suffix_steps: self.counts[Choice::Suffix as usize],
            model_steps: self.counts[Choice::Model as usize],
        };
        ExtraStats {
            auto: Some(auto),
            calibrated: self.model.as_ref().and_then(|m| m.extra_stats().calibrated),
            ..self.suffix.extra_stats()
        }
    }
}
