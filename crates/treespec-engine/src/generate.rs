//! The speculative generation loop for one request on its own target: prefill → { propose →
//! score → verify → commit → emit } … The step itself is [`Generation`]'s; this file only runs it
//! against one target (a batching scheduler runs the same steps with many requests per forward).
//!
//! One step: the drafter proposes a token tree rooted at the last emitted token; the target scores
//! the whole tree in ONE forward pass; the verifier walks it and returns the accepted path plus a
//! bonus token; both models keep only the accepted path; the emitted tokens are checked against
//! the stop conditions and streamed out. Plain decoding is the same loop with an empty tree.

use std::time::Instant;

use treespec_core::sampling::SamplingParams;
use treespec_core::stats::DecodeStats;
use treespec_core::TokenId;

use crate::constraint::TokenConstraint;
use crate::drafter::Drafter;
use crate::error::{EngineError, Result};
use crate::generation::Generation;
use crate::model::{CausalLm, TreeBatch};
use crate::stop::{FinishReason, StopConditions, TokenBytes};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Prompt tokens (already templated/tokenized).
    pub prompt: Vec<TokenId>,
    /// Most new tokens to emit (≥ 1).
    pub max_new_tokens: usize,
    /// Sampling parameters shared by draft and target.
    pub sampling: SamplingParams,
    /// Seed for the draft and verifier streams.
    pub seed: u64,
    /// When to stop.
    pub stop: StopConditions,
}

impl GenerateRequest {
    /// `max_new_tokens` tokens after `prompt` with `sampling` and `seed`, stopping at nothing
    /// else (no end-of-generation tokens, no stop strings).
    pub fn new(prompt: Vec<TokenId>, max_new_tokens: usize, sampling: SamplingParams, seed: u64) -> Self {
        Self { prompt, max_new_tokens, sampling, seed, stop: StopConditions::default() }
    }
}

/// The result of one generation.
#[derive(Debug, Clone)]
pub struct GenerateOutput {
    /// Emitted token ids (without the end-of-generation token).
    pub tokens: Vec<TokenId>,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// With a stop string: the byte length the decoded text must be cut to.
    pub text_cut: Option<usize>,
    /// Statistics.
    pub stats: DecodeStats,
}

/// Run one generation. `on_tokens` receives each step's newly emitted tokens and returns false
/// to cancel. `bytes` is needed only for stop strings.
pub fn generate(
    target: &mut dyn CausalLm,
    drafter: &mut dyn Drafter,
    request: &GenerateRequest,
    bytes: Option<&dyn TokenBytes>,
    on_tokens: &mut dyn FnMut(&[TokenId]) -> bool,
) -> Result<GenerateOutput> {
    generate_constrained(target, drafter, request, None, bytes, on_tokens)
}

/// [`generate`] under a grammar: every target distribution is the grammar-masked one, tokens the
/// grammar forces are verified as a free chain, and generation ends where the grammar does.
pub fn generate_constrained(
    target: &mut dyn CausalLm,
    drafter: &mut dyn Drafter,
    request: &GenerateRequest,
    mut constraint: Option<&mut dyn TokenConstraint>,
    bytes: Option<&dyn TokenBytes>,
    on_tokens: &mut dyn FnMut(&[TokenId]) -> bool,
) -> Result<GenerateOutput> {
    let mut generation = Generation::new(request.clone(), target.context_size(), target.vocab_size(), bytes)?;
    let t = Instant::now();
    target.truncate(0)?;
    target.prefill(generation.prompt_head())?;
    generation.begin(drafter, t.elapsed())?;
    while let Some(tree) = generation.propose(
        drafter,
        constraint.as_deref_mut(),
        target.committed_len(),
        0,
        usize::MAX,
        false,
    )? {
        let t = Instant::now();
        let logits = target.forward(&TreeBatch::from_tree(tree, 0))?;
        let rows = logits.rows();
        let step =
            generation.complete(drafter, constraint.as_deref_mut(), &logits, rows, t.elapsed(), bytes)?;
        target.commit(&step.path)?;
        if !on_tokens(&step.emitted) {
            generation.cancel(drafter);
            return Err(EngineError::Cancelled);
        }
        if step.done {
            break;
        }
    }
    Ok(generation.finish(drafter))
}
