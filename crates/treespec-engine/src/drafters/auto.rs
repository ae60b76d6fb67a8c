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
use treespec_core::tree::{Draw, TokenTree, ROOT};
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;

use super::{DySpecConfig, DySpecDrafter, SuffixConfig, SuffixDrafter};
use crate::auto_budget::SharedCosts;
use crate::backend::CausalLm;
use crate::drafter::{Cuttable, Drafter, ProposeContext, Provenance};
use crate::error::{EngineError, Result};
use crate::extra_stats::{AutoChoices, ExtraStats};
use crate::registry::MethodKind;

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
    combined: u64,
    steps: u64,
    /// Serving in a continuous batch ([`Drafter::join_batch`]): the draft model starts deferred.
    batched: bool,
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
        Ok(Self {
            suffix,
            model,
            choice: Choice::Plain,
            counts: [0; 3],
            combined: 0,
            steps: 0,
            batched: false,
        })
    }
}

impl<M: CausalLm> Drafter for AutoDrafter<M> {
    fn kind(&self) -> MethodKind {
        MethodKind::Auto
    }

    /// The proposal the last step verified: the free one is a copy, the model's a draft.
    fn source(&self) -> Provenance {
        match self.choice {
            Choice::Suffix | Choice::Plain => Provenance::Copied,
            Choice::Model => Provenance::Drafted,
        }
    }

    fn join_batch(&mut self) {
        self.batched = true;
    }

    /// Alone, the draft model takes the prompt now, as part of prefill. In a batch its prompt
    /// prefill would stall every other request's step, so it gets the text only when a step
    /// finds that the model's extra tokens over the steps left pay for that prefill. Where not
    /// even a perfect draft could pay on this machine's curves, it never gets it.
    fn begin(&mut self, prompt: &[TokenId], sampler: &Sampler, seed: u64) -> Result<()> {
        self.suffix.begin(prompt, sampler, seed)?;
        self.counts = [0; 3];
        self.combined = 0;
        if let Some(m) = self.model.as_mut() {
            m.set_forward(0, prompt.len());
            if self.batched || !m.perfect_chain_can_pay() {
                m.begin_deferred(seed);
            } else {
                m.begin(prompt, sampler, seed)?;
            }
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
        // step that lets its calibration see whether the text got easier (its own step declines
        // where not even a perfect draft could pay, catch-up of a deferred start included).
        if let Some(m) = self.model.as_mut() {
            m.set_forward(ctx.batch_rows, ctx.history.len());
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
                let suffix_tree = std::mem::replace(&mut best, (model_tree, model_gain)).0;
                self.choice = Choice::Model;
                // Greedy: the suffix draft's nodes grafted onto the model's tree, if they pay.
                if ctx.sampler.is_greedy() {
                    if let Some(combined) = graft(&best, &suffix_tree, &self.suffix)? {
                        best = combined;
                        self.combined += 1;
                    }
                }
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
            combined_steps: self.combined,
        };
        ExtraStats {
            auto: Some(auto),
            calibrated: self.model.as_ref().and_then(|m| m.extra_stats().calibrated),
            ..self.suffix.extra_stats()
        }
    }
}

/// The model's greedy tree `model` (with its estimated gain) plus the suffix draft's nodes: each
/// suffix node joins under its parent's image, merged with a model node of the same token. The
/// model's nodes keep their ids (the draft model's bookkeeping and calibration rely on them);
/// suffix-only nodes come after. Returns the combined tree and its gain when the added nodes'
/// expected tokens (their suffix values, an upper bound where they are siblings of model nodes)
/// pay for the rows they add, else `None`.
fn graft(
    model: &(TokenTree, f64),
    suffix_tree: &TokenTree,
    suffix: &SuffixDrafter,
) -> Result<Option<(TokenTree, f64)>> {
    let (Some(cut), Some(econ)) = (suffix.cuttable(), suffix.economics()) else { return Ok(None) };
    if cut.values.len() != suffix_tree.drafted() {
        return Ok(None);
    }
    let (model_tree, model_gain) = model;
    let mut combined = model_tree.clone();
    let mut image = vec![ROOT; suffix_tree.len()];
    let mut added = 0.0;
    for (id, node) in suffix_tree.nodes().iter().enumerate().skip(1) {
        let parent = image[node.parent.unwrap_or(ROOT)];
        let same = combined.children(parent).iter().copied().find(|&c| combined.node(c).token == node.token);
        image[id] = match same {
            Some(c) => c,
            None => {
                added += cut.values[id - 1];
                combined.add(parent, node.token, Draw::Deterministic, cut.values[id - 1] as f32)?
            }
        };
    }
    if combined.len() == model_tree.len() {
        return Ok(None);
    }
    let extra_ms = econ.ms(combined.drafted()) - econ.ms(model_tree.drafted());
    let gain = model_gain + added - econ.rate * extra_ms;
    Ok((gain > *model_gain).then_some((combined, gain)))
}
