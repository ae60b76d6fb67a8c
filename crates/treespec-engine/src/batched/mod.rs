//! Continuous batching: many requests, each in its own *lane* of one model, decoded together —
//! every step is ONE forward holding every active request's rows (prompt chunks and draft trees).
//!
//! [`BatchedLm`](crate::BatchedLm) is the backend seam (llama.cpp: one context whose KV cache holds every lane's
//! sequence; toys: one toy model per lane). [`Batch::step`] runs one step over its [`Lane`]s with the
//! same per-request machine as [`generate`](crate::generate()) ([`Generation`]), so each request
//! keeps its own tree, verifier, random streams and stop handling: batching changes when its rows
//! are scored, never what it emits. Cost-aware drafters see the rows already in the forward
//! ([`ProposeContext::batch_rows`](crate::ProposeContext)) and price their nodes at the marginal
//! cost of the merged forward, so speculation shrinks on its own as the batch grows.
//!
//! A [`Batch`] is the loop's core: the requests decoding together, each lane beside its owner's
//! data, joining, stepping and leaving. [`run_batched`] (tests and benchmarks) runs on it.
//!
//! - `phases`: one step as a sequence of phases (prompt chunks → propose → cut → forward →
//!   complete and commit → settle).
//! - `chunks`: which prompts a step reads (shortest first, short steps near a first token).
//! - `propose`: the trees of a step, in turn or together on a shared draft model.
//! - `cut`: the batch budget over every request's cuttable nodes.
//! - `batch`: [`Batch`]; `run`: `run_batched`, a whole run over a list of jobs (test support:
//!   the crate's tests and the `test-support` feature).

use std::time::Duration;

use crate::backend::LaneId;
use crate::constraint::TokenConstraint;
use crate::drafter::Drafter;
use crate::error::EngineError;
use crate::generation::{Generation, StepOutcome};

mod batch;
mod chunks;
mod cut;
mod phases;
mod propose;
#[cfg(any(test, feature = "test-support"))]
mod run;

pub use batch::Batch;
#[cfg(any(test, feature = "test-support"))]
pub use run::run_batched;

/// One request being decoded in a lane.
pub struct Lane<'d> {
    /// The lane it holds.
    pub lane: LaneId,
    /// Its generation.
    pub generation: Generation,
    /// Its drafter.
    pub drafter: Box<dyn Drafter + 'd>,
    /// Its grammar state, when it asked for structured output.
    pub constraint: Option<Box<dyn TokenConstraint + 'd>>,
    /// Prompt-head tokens the lane holds so far (prefill progress).
    pub prefilled: usize,
    /// Time spent in forwards that carried its prompt.
    pub prefill_time: Duration,
    /// Whether its drafter has begun (at the first step after the request joined).
    pub begun: bool,
    /// Rows its tree put in the last forward it decoded in (1 before its first): what the other
    /// lanes expect of it when all propose at once.
    last_rows: usize,
    /// Steps in a row it had prompt left and got no chunk (`chunks.rs`).
    passed_over: u32,
    /// It has put a tree in a forward (its first token is out or on its way).
    decoded: bool,
}

impl std::fmt::Debug for Lane<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("lane", &self.lane)
            .field("prefilled", &self.prefilled)
            .field("begun", &self.begun)
            .finish_non_exhaustive()
    }
}

impl<'d> Lane<'d> {
    /// A request in `lane`, which already holds `cached` tokens of its prompt head.
    pub fn new(
        lane: LaneId,
        generation: Generation,
        mut drafter: Box<dyn Drafter + 'd>,
        constraint: Option<Box<dyn TokenConstraint + 'd>>,
        cached: usize,
    ) -> Self {
        drafter.join_batch();
        Self {
            lane,
            generation,
            drafter,
            constraint,
            prefilled: cached,
            prefill_time: Duration::ZERO,
            begun: false,
            last_rows: 1,
            passed_over: 0,
            decoded: false,
        }
    }

    fn prefill_left(&self) -> usize {
        self.generation.prompt_head().len() - self.prefilled
    }

    /// Its prompt is in and its first step is next: the step that emits its first token.
    fn awaits_first_step(&self) -> bool {
        !self.decoded && self.prefill_left() == 0 && !self.generation.is_done()
    }
}

/// What a step did for one lane.
#[derive(Debug)]
pub enum LaneStep {
    /// Its prompt is (still) being prefilled, or it waited for room this step.
    Waiting,
    /// It decoded a step.
    Stepped(StepOutcome),
    /// It failed; the others go on.
    Failed(EngineError),
}

/// Knobs of [`Batch::step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLimits {
    /// Most prompt tokens one step prefills (chunked prefill: a long prompt does not stall
    /// everyone's decoding).
    pub prefill_chunk: usize,
    /// Most prompt tokens one step reads while a request is decoding (at most `prefill_chunk`;
    /// the default is `prefill_chunk` itself). Every decoding request waits for the whole step
    /// for its next token and a step's time is mostly its prompt rows, so a smaller chunk streams
    /// their tokens more evenly (Sarathi-Serve's stall-free batching). It is not free on a CPU:
    /// attention reads the whole context once per step, so more, smaller steps read the prompt
    /// slower (SERVING.md, "Design decisions"). A prompt read while nothing decodes gets
    /// `prefill_chunk`.
    pub decode_chunk: usize,
    /// Most drafted nodes one lane's tree may hold.
    pub max_tree: usize,
    /// One value-ordered budget over every request's cuttable draft nodes (the default): when
    /// two or more requests decode in a step, their [`Cuttable`](crate::Cuttable) proposals are
    /// cut together where the next node no longer pays on the merged forward
    /// ([`batch_cut`](treespec_core::budget::batch_cut)). Off, each request prices its own
    /// tree on the rows proposed before it.
    pub batch_budget: bool,
    /// With a shared draft model (the default): the requests of a step propose together, so
    /// their draft forwards batch. Off, they propose one after another, each running its own
    /// draft forwards.
    pub batch_draft: bool,
}

impl Default for StepLimits {
    fn default() -> Self {
        Self { prefill_chunk: 256, decode_chunk: 256, max_tree: 64, batch_budget: true, batch_draft: true }
    }
}

/// What one step cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Rows in the forward (prompt chunks and tree nodes).
    pub rows: usize,
    /// Lanes that decoded a step.
    pub decoding: usize,
    /// Prompt tokens prefilled.
    pub prefilled: usize,
    /// Time in the forward itself (the rest of a step is proposing, verifying and settling).
    pub forward_time: Duration,
}
