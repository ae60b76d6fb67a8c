//! treespec-engine: the model seam ([`CausalLm`]), drafters over models, the speculative
//! generation loop, and pure-Rust toy models for tests and demos.
//!
//! Floors: the leaf types every room points down to (`MethodKind`, errors, the backend seam) on
//! the ground floor; the loop (`generation`, `generate`, `batched`), the drafters and the method
//! registry above them; measurement (`measure`: cost curves, acceptance) in a room of its own.
//! What only tests use (`DfaConstraint`, `toy::WatchedLm`, `batched::run_batched`, `every_method`) is built for
//! the crate's tests and with the `test-support` feature, which the workspace's tests enable.

// Tests are exempt from the 80-line limit (clippy.toml): a test reads top to bottom as one story.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod auto_budget;
pub mod backend;
pub mod batched;
mod constraint;
pub mod draft_model;
mod drafter;
pub mod drafters;
mod error;
#[cfg(any(test, feature = "test-support"))]
pub mod every_method;
mod extra_stats;
mod generate;
mod generation;
mod generation_io;
mod graft;
pub mod measure;
mod method_kind;
mod methods;
pub mod registry;
pub mod shared_draft;
mod stop;
mod text_stream;
pub mod toy;

pub use backend::{
    BatchRoom, BatchedLm, CausalLm, DraftFeed, DraftLanes, LaneId, LaneWork, Logits, TokenBytes, TreeBatch,
};
#[cfg(any(test, feature = "test-support"))]
pub use constraint::DfaConstraint;
pub use constraint::{NewInner, Opening, TaggedConstraint, TokenConstraint, WithoutForcing};
pub use drafter::{Cuttable, Drafter, ForwardCost, PlainDrafter, ProposeContext, Provenance};
pub use error::{EngineError, Result};
pub use extra_stats::ExtraStats;
pub use generate::{generate, generate_constrained};
pub use generation::{Generation, ProposeAt, Scored, StepOutcome, TextRun, TokenLogprob};
pub use generation_io::{GenerateOutput, GenerateRequest, Prepared};
pub use method_kind::{MethodKind, METHOD_NAMES};
pub use methods::Method;
pub use registry::MethodSpec;
pub use shared_draft::{DraftLane, SharedDraft};
pub use stop::{FinishReason, StopConditions};
pub use text_stream::TextStream;
