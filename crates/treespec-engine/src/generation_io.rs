//! What one generation is asked for and what it gives back, shared by the single-request loop
//! ([`generate`](crate::generate())), the per-request step machine ([`Generation`](crate::Generation))
//! and the batched step.

use treespec_core::sampling::SamplingParams;
use treespec_core::stats::DecodeStats;
use treespec_core::TokenId;

use crate::constraint::TokenConstraint;
use crate::drafter::Drafter;
use crate::stop::{FinishReason, StopConditions};

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

/// A request made ready to generate, the one shape every front end hands the engine: the CLI's
/// `generate` and the benchmark to [`generate_constrained`](crate::generate_constrained), the
/// server's scheduler to its lanes, tests to [`run_batched`](crate::batched). Made by
/// treespec-request's `prepare` (for any model) from what a front end was asked for.
pub struct Prepared<'d> {
    /// Prompt tokens, most new tokens, sampling, seed, stop strings and the target's end tokens.
    pub request: GenerateRequest,
    /// The method's drafter (on the caller's draft model when the method runs one).
    pub drafter: Box<dyn Drafter + 'd>,
    /// The grammar state, for structured output (or tool calls between tags).
    pub constraint: Option<Box<dyn TokenConstraint + 'd>>,
    /// An answer that opens with a ```` ```json ```` fence is decoded under the call grammar to
    /// its end: it is then exactly one call of a declared tool, which a server may stream as
    /// `tool_calls` pieces from the fence on instead of holding the answer back.
    pub fenced_calls: bool,
}

impl<'d> Prepared<'d> {
    /// `request` decoded by `drafter`, free (no grammar).
    pub fn free(request: GenerateRequest, drafter: Box<dyn Drafter + 'd>) -> Self {
        Self { request, drafter, constraint: None, fenced_calls: false }
    }
}

/// The result of one generation.
#[derive(Debug, Clone)]
pub struct GenerateOutput {
    /// Emitted token ids (without the end-of-generation token).
    pub tokens: Vec<TokenId>,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// The generation ended on an end-of-generation token the model generated (not in
    /// [`tokens`](Self::tokens)); false when it ended at the length, a stop string or a complete
    /// grammar (which also report [`FinishReason::Eos`] but took no forward for it).
    pub end_token: bool,
    /// With a stop string: the byte length the decoded text must be cut to.
    pub text_cut: Option<usize>,
    /// The whole text (whole characters, cut at the stop string; empty when the generation had
    /// no token bytes to decode with).
    pub text: String,
    /// The end of [`text`](Self::text) that no step released: what was held back for a
    /// possible stop string or an unfinished character and turned out final. A front end that
    /// streamed each step's text sends this last.
    pub tail: String,
    /// The stop string the text ended at, when one did (llama-server's `stopping_word`).
    pub stopped_by: Option<String>,
    /// Statistics.
    pub stats: DecodeStats,
}
