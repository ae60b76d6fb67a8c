//! DISCO (arXiv 2405.04304): chain drafting with a dynamic lookahead. After each drafted token a
//! stop rule looks at the draft's own numbers and decides whether to draft another:
//!
//! * [`DiscoMode::Threshold`] — transformers' `assistant_confidence_threshold`: continue while the
//!   token's draft probability is ≥ the threshold, which is re-fitted online from the verifier's
//!   accept/reject history ([`ConfidenceThreshold`]);
//! * [`DiscoMode::Classifier`] — the paper's supervised form: continue while a trained
//!   [`DiscoModel`] predicts P(accept) ≥ `stop_prob`.
//!
//! Losslessness: the rule only decides whether to *draw another sample*; the sampled token is
//! always kept (ALGORITHMS.md §2), and tokens are `WithoutReplacement` draws (one child each, so
//! plain speculative sampling) from the processed `q` under sampling, `Deterministic` argmax
//! tokens under greedy decoding.
//!
//! Both rules read the draft's temperature-1 softmax (not the processed `q`): under greedy the
//! processed distribution is a point mass and would carry no signal, and the classifier is
//! trained on greedy oracle runs.

use std::sync::Arc;

use treespec_core::disco::{features, ConfidenceThreshold, DiscoModel};
use treespec_core::rng::{Stream, StreamRng};
use treespec_core::sampling::{softmax, Sampler};
use treespec_core::tree::TokenTree;
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;

use super::chain::draft_chain;
use crate::backend::CausalLm;
use crate::draft_model::{forward_to_draft_model, DraftModel};
use crate::drafter::{Drafter, ProposeContext};
use crate::error::{EngineError, Result};
use crate::method_kind::MethodKind;

/// Which stop rule DISCO uses.
#[derive(Debug, Clone, Default)]
pub enum DiscoMode {
    /// Confidence threshold with online re-fit (unsupervised; transformers' default form).
    #[default]
    Threshold,
    /// A trained classifier (`treespec disco train`).
    Classifier(Arc<DiscoModel>),
}

/// Knobs of [`DiscoDrafter`].
#[derive(Debug, Clone)]
pub struct DiscoConfig {
    /// Stop rule. Default [`DiscoMode::Threshold`].
    pub mode: DiscoMode,
    /// Most tokens drafted per step. Default 20 (transformers' cap).
    pub max_tokens: usize,
    /// Initial confidence threshold, in [0, 1]. Default 0.4 (transformers' default); re-fitted
    /// online in threshold mode.
    pub threshold: f32,
    /// Classifier mode: stop once the predicted P(accept) of the token just drafted is below this.
    /// In [0, 1]. Default 0.5.
    pub stop_prob: f32,
}

impl Default for DiscoConfig {
    fn default() -> Self {
        Self { mode: DiscoMode::Threshold, max_tokens: 20, threshold: 0.4, stop_prob: 0.5 }
    }
}

impl DiscoConfig {
    /// Check every knob, naming the bad one.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::InvalidRequest(m));
        if self.max_tokens == 0 {
            return bad("disco max tokens per step must be ≥ 1".into());
        }
        if !self.threshold.is_finite() || !(0.0..=1.0).contains(&self.threshold) {
            return bad(format!("disco confidence threshold must be in [0, 1], got {}", self.threshold));
        }
        if !self.stop_prob.is_finite() || !(0.0..=1.0).contains(&self.stop_prob) {
            return bad(format!("disco stop probability must be in [0, 1], got {}", self.stop_prob));
        }
        Ok(())
    }
}

/// Chain drafter with DISCO's dynamic lookahead.
pub struct DiscoDrafter<M: CausalLm> {
    draft: DraftModel<M>,
    config: DiscoConfig,
    rng: StreamRng,
    confidence: ConfidenceThreshold,
    /// Draft probabilities of the tokens drafted in the last proposal, in chain order.
    step_probs: Vec<f32>,
}

impl<M: CausalLm> DiscoDrafter<M> {
    /// A DISCO drafter.
    pub fn new(draft: M, config: DiscoConfig) -> Result<Self> {
        config.validate()?;
        let confidence = ConfidenceThreshold::new(config.threshold, config.max_tokens)?;
        Ok(Self {
            draft: DraftModel::new(draft),
            config,
            rng: StreamRng::new(0, Stream::Draft),
            confidence,
            step_probs: Vec::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &DiscoConfig {
        &self.config
    }

    /// The online confidence threshold (its current value and history). It is fed in both modes
    /// and kept across generations, as transformers keeps it on the assistant's config.
    pub fn confidence(&self) -> &ConfidenceThreshold {
        &self.confidence
    }
}

/// DISCO's stop rule: whether to draft another token after `token` (temperature-1 draft
/// probabilities `probs`) at chain index `index` (0-based) — the confidence threshold or the
/// trained classifier. Uses only the draft's own values.
fn keep_going(
    config: &DiscoConfig,
    confidence: &ConfidenceThreshold,
    probs: &[f32],
    token: TokenId,
    index: usize,
) -> bool {
    if index + 1 >= config.max_tokens {
        return false;
    }
    match &config.mode {
        DiscoMode::Threshold => confidence.should_continue(probs[token as usize], index + 1),
        DiscoMode::Classifier(model) => model.predict(&features(probs, token, index)) >= config.stop_prob,
    }
}

impl<M: CausalLm> Drafter for DiscoDrafter<M> {
    fn kind(&self) -> MethodKind {
        MethodKind::Disco
    }

    fn begin(&mut self, prompt: &[TokenId], _: &Sampler, seed: u64) -> Result<()> {
        self.rng = StreamRng::new(seed, Stream::Draft);
        self.step_probs.clear();
        self.draft.begin(prompt)
    }

    fn propose(&mut self, ctx: &ProposeContext) -> Result<TokenTree> {
        let Self { draft, config, rng, confidence, step_probs } = self;
        step_probs.clear();
        draft_chain(draft, ctx, config.max_tokens, rng, |logits, token, i| {
            let probs = softmax(logits)?;
            step_probs.push(probs[token as usize]);
            Ok(keep_going(config, confidence, &probs, token, i))
        })
    }

    fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) -> Result<()> {
        if !self.step_probs.is_empty() {
            self.confidence.record(&self.step_probs, outcome.accepted.len());
            self.step_probs.clear();
        }
        self.draft.observe(tree, outcome)
    }

    forward_to_draft_model!(draft);
}
