//! Offline measurements on a model pair that the fixed and learned drafters need:
//!
//! * [`measure_acceptance`] — Sequoia's positional acceptance vector `P[1..B]`: along plain target
//!   decoding, draw B children from the draft at every position and record which rank the
//!   verifier accepts, using the real verifier so `P` means exactly what the drafter will see;
//! * [`collect_training_data`] — DISCO's oracle data: features of every greedily drafted token
//!   labelled "the draft still agrees with the target here".
//!
//! The acceptance vector depends on the model pair and the sampling settings, so its file
//! ([`AcceptanceVector::save`]) records both; the caller supplies the pair's identity (model
//! file names and sizes) as strings.

use std::path::Path;

use serde::{Deserialize, Serialize};
use treespec_core::disco::{features, Features};
use treespec_core::dist::Dist;
use treespec_core::rng::{Stream, StreamRng};
use treespec_core::sampling::{softmax, Sampler};
use treespec_core::sequoia::validate_acceptance;
use treespec_core::tree::{NodeId, TokenTree, ROOT};
use treespec_core::verify::{verify, Choice, TargetDists};
use treespec_core::TokenId;

use crate::backend::{CausalLm, TreeBatch};
use crate::drafters::{draw_children, SampleMode};
use crate::error::{EngineError, Result};

/// Version of the acceptance-vector file format.
pub const ACCEPTANCE_VERSION: u32 = 1;
/// Tag of the acceptance-vector file format.
pub const ACCEPTANCE_FORMAT: &str = "treespec-acceptance";

/// A measured positional acceptance vector and what it was measured on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AcceptanceVector {
    /// Always [`ACCEPTANCE_FORMAT`].
    pub format: String,
    /// File format version ([`ACCEPTANCE_VERSION`]).
    pub version: u32,
    /// Identity of the target model (e.g. file name and size), set by the caller.
    pub target: String,
    /// Identity of the draft model.
    pub draft: String,
    /// Sampling temperature (0 = greedy) the vector was measured at.
    pub temperature: f32,
    /// Top-p it was measured with.
    pub top_p: f32,
    /// Top-k it was measured with.
    pub top_k: Option<usize>,
    /// Children drawn per position (B).
    pub width: usize,
    /// Positions measured.
    pub positions: u64,
    /// `counts[k − 1]`: positions where the rank-k child was accepted.
    pub counts: Vec<u64>,
    /// `P[k] = counts[k − 1] / positions`.
    pub acceptance: Vec<f32>,
}

impl AcceptanceVector {
    /// Attach the model pair's identity.
    pub fn with_identity(mut self, target: impl Into<String>, draft: impl Into<String>) -> Self {
        self.target = target.into();
        self.draft = draft.into();
        self
    }

    /// Write as JSON.
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("an acceptance vector always serialises");
        std::fs::write(path, text).map_err(|e| {
            EngineError::InvalidRequest(format!("cannot write calibration file {}: {e}", path.display()))
        })
    }

    /// Read a file written by [`AcceptanceVector::save`]; a missing, unreadable or malformed file
    /// is an error naming it.
    pub fn load(path: &Path) -> Result<Self> {
        let bad =
            |m: String| EngineError::InvalidRequest(format!("calibration file {}: {m}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        let v: Self = serde_json::from_str(&text).map_err(|e| bad(format!("malformed: {e}")))?;
        v.check().map_err(|e| bad(e.to_string()))?;
        Ok(v)
    }

    fn check(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::InvalidRequest(m));
        if self.format != ACCEPTANCE_FORMAT {
            return bad(format!("format is {:?}, expected {ACCEPTANCE_FORMAT:?}", self.format));
        }
        if self.version != ACCEPTANCE_VERSION {
            return bad(format!(
                "version {} is not supported (this build reads {ACCEPTANCE_VERSION})",
                self.version
            ));
        }
        if self.counts.len() != self.acceptance.len() || self.width != self.acceptance.len() {
            return bad(format!(
                "width {}, {} counts and {} probabilities disagree",
                self.width,
                self.counts.len(),
                self.acceptance.len()
            ));
        }
        validate_acceptance(&self.acceptance).map_err(|e| EngineError::InvalidRequest(e.to_string()))
    }

    /// Error unless the vector was measured on this pair at this temperature (±1e-6): a vector for
    /// another pair or temperature gives a tree optimal for the wrong acceptance rates.
    pub fn check_matches(&self, target: &str, draft: &str, temperature: f32) -> Result<()> {
        if self.target != target || self.draft != draft {
            return Err(EngineError::Incompatible(format!(
                "calibration was measured on target {:?} / draft {:?}, not {target:?} / {draft:?}",
                self.target, self.draft
            )));
        }
        if (self.temperature - temperature).abs() > 1e-6 {
            return Err(EngineError::Incompatible(format!(
                "calibration was measured at temperature {}, not {temperature}",
                self.temperature
            )));
        }
        Ok(())
    }
}

/// A one-node "tree" whose root has the given target distribution.
struct RootDist(Dist);

impl TargetDists for RootDist {
    fn dist(&mut self, _: NodeId) -> treespec_core::Result<Dist> {
        Ok(self.0.clone())
    }
    fn greedy(&mut self, _: NodeId) -> treespec_core::Result<TokenId> {
        Ok(self.0.argmax())
    }
}

/// Feed `token` on top of `model`'s committed prefix, keep it, and return its logits row.
fn step(model: &mut dyn CausalLm, token: TokenId) -> Result<Vec<f32>> {
    let logits = model.forward(&TreeBatch::chain(&[token], None, 0, false))?;
    let row = logits.row(0).to_vec();
    model.commit(&[0])?;
    Ok(row)
}

fn check_pair(target: &dyn CausalLm, draft: &dyn CausalLm) -> Result<()> {
    if target.vocab_size() != draft.vocab_size() {
        return Err(EngineError::Incompatible(format!(
            "draft vocabulary has {} tokens, target {}",
            draft.vocab_size(),
            target.vocab_size()
        )));
    }
    Ok(())
}

/// Reset both models and consume all prompt tokens but the last (the first root).
fn start(model: &mut dyn CausalLm, prompt: &[TokenId]) -> Result<()> {
    let (_, head) = prompt.split_last().ok_or(EngineError::EmptyPrompt)?;
    model.truncate(0)?;
    model.prefill(head)
}

/// Measure the positional acceptance vector of width `width` on `prompts`, `tokens_per_prompt`
/// target tokens each (fewer where the context runs out).
///
/// At each position the draft draws `width` children without replacement (greedy: its top
/// tokens) exactly as the Sequoia drafter does, the real verifier ([`verify`]) runs on that
/// one-level tree against the target's processed distribution, and the rank of the accepted child
/// is counted. The verifier's emitted token is the target's own sample (verification is
/// lossless), so the run is plain target decoding and positions are weighted as in real use.
#[allow(clippy::too_many_arguments)]
pub fn measure_acceptance(
    target: &mut dyn CausalLm,
    draft: &mut dyn CausalLm,
    prompts: &[Vec<TokenId>],
    tokens_per_prompt: usize,
    width: usize,
    sampler: &Sampler,
    seed: u64,
) -> Result<AcceptanceVector> {
    if width == 0 {
        return Err(EngineError::InvalidRequest("calibration width B must be ≥ 1".into()));
    }
    if prompts.is_empty() || tokens_per_prompt == 0 {
        return Err(EngineError::InvalidRequest(
            "calibration needs at least one prompt and one token per prompt".into(),
        ));
    }
    check_pair(target, draft)?;
    let mut draft_rng = StreamRng::new(seed, Stream::Draft);
    let mut verify_rng = StreamRng::new(seed, Stream::Verify);
    let mut counts = vec![0u64; width];
    let mut positions = 0u64;
    let room = target.context_size().min(draft.context_size());
    for prompt in prompts {
        start(target, prompt)?;
        start(draft, prompt)?;
        let mut history = prompt.clone();
        for _ in 0..tokens_per_prompt {
            if history.len() > room {
                break;
            }
            let root = *history.last().expect("non-empty prompt");
            let t_logits = step(target, root)?;
            let d_logits = step(draft, root)?;
            let mut tree = TokenTree::new(root);
            draw_children(
                &mut tree,
                ROOT,
                &d_logits,
                &history,
                width,
                SampleMode::WithoutReplacement,
                sampler,
                &mut draft_rng,
            )?;
            let p = sampler.distribution(&t_logits, &history)?;
            let choice = Choice::for_sampler(sampler, seed, history.len(), &mut verify_rng);
            let out = verify(&tree, &mut RootDist(p), choice)?;
            if let Some(&node) = out.accepted.first() {
                let rank = tree.children(ROOT).iter().position(|&c| c == node).expect("accepted a child");
                counts[rank] += 1;
            }
            positions += 1;
            history.push(out.tokens[0]);
        }
    }
    if positions == 0 {
        return Err(EngineError::InvalidRequest(
            "calibration measured no position (context too small?)".into(),
        ));
    }
    let acceptance = counts.iter().map(|&c| (c as f64 / positions as f64) as f32).collect();
    let params = sampler.params();
    Ok(AcceptanceVector {
        format: ACCEPTANCE_FORMAT.into(),
        version: ACCEPTANCE_VERSION,
        target: String::new(),
        draft: String::new(),
        temperature: params.temperature,
        top_p: params.top_p,
        top_k: params.top_k,
        width,
        positions,
        counts,
        acceptance,
    })
}

/// DISCO oracle data: run the target greedily for `tokens_per_prompt` tokens per prompt; at each
/// position draft a greedy chain of up to `max_tokens` tokens from the draft and label each
/// drafted token `true` while the chain still equals the target's continuation, `false` from the
/// first mismatch on. Features are [`features`] of the draft's temperature-1 softmax. Feed the
/// result to `treespec_core::disco::DiscoModel::train`.
///
/// Costs `max_tokens` draft forwards per position (chains past a mismatch are drafted too: the
/// deployed stop rule sees such tokens and must learn to stop on them).
pub fn collect_training_data(
    target: &mut dyn CausalLm,
    draft: &mut dyn CausalLm,
    prompts: &[Vec<TokenId>],
    tokens_per_prompt: usize,
    max_tokens: usize,
) -> Result<Vec<(Features, bool)>> {
    if max_tokens == 0 {
        return Err(EngineError::InvalidRequest("DISCO training max tokens must be ≥ 1".into()));
    }
    check_pair(target, draft)?;
    let greedy = Sampler::new(Default::default())?;
    let mut out = Vec::new();
    for prompt in prompts {
        // The target's greedy continuation, long enough to label the last position's chain.
        start(target, prompt)?;
        let mut seq = prompt.clone();
        let want = prompt.len() + tokens_per_prompt + max_tokens;
        while seq.len() < want && seq.len() <= target.context_size() {
            let row = step(target, *seq.last().expect("non-empty prompt"))?;
            seq.push(greedy.greedy_token(&row, &seq)?);
        }
        start(draft, prompt)?;
        let ctx = draft.context_size();
        for pos in prompt.len()..(prompt.len() + tokens_per_prompt).min(seq.len()) {
            if pos > ctx {
                break;
            }
            // The draft has committed seq[..pos − 1]; the root seq[pos − 1] goes in as pending 0.
            let root = seq[pos - 1];
            let mut row = draft.forward(&TreeBatch::chain(&[root], None, 0, false))?.row(0).to_vec();
            let mut agree = true;
            let mut path = seq[..pos].to_vec();
            for i in 0..max_tokens {
                let Some(&truth) = seq.get(pos + i) else { break };
                let token = greedy.greedy_token(&row, &path)?;
                let probs = softmax(&row)?;
                agree &= token == truth;
                out.push((features(&probs, token, i), agree));
                path.push(token);
                // Positions used: committed (pos − 1) + pending (i + 1) + this one.
                if i + 1 == max_tokens || pos + i + 1 > ctx {
                    break;
                }
                let batch = TreeBatch::chain(&[token], Some(i), i + 1, false);
                row = draft.forward(&batch)?.row(0).to_vec();
            }
            draft.commit(&[0])?;
        }
    }
    Ok(out)
}
