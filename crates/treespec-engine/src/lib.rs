//! treespec-engine: the model seam ([`CausalLm`]), drafters over models, the speculative
//! generation loop, and pure-Rust toy models for tests and demos.

pub mod auto_budget;
pub mod backend;
pub mod batched;
mod constraint;
mod cpu_time;
pub mod draft_model;
mod drafter;
pub mod drafters;
mod error;
mod extra_stats;
mod generate;
mod generation;
mod graft;
mod methods;
pub mod offline_measure;
pub mod profile;
pub mod registry;
mod request;
pub mod serving_gate;
pub mod shared_draft;
mod stop;
mod text_stream;
pub mod toy;

pub use backend::{
    BatchRoom, BatchedLm, CausalLm, DraftFeed, DraftLanes, LaneId, LaneWork, Logits, TokenBytes, TreeBatch,
};
pub use constraint::{DfaConstraint, NewInner, Opening, TaggedConstraint, TokenConstraint, WithoutForcing};
pub use drafter::{Cuttable, Drafter, PlainDrafter, ProposeContext, Provenance};
pub use error::{EngineError, Result};
pub use extra_stats::ExtraStats;
pub use generate::{generate, generate_constrained};
pub use generation::{Generation, ProposeAt, Scored, StepOutcome, TextRun, TokenLogprob};
pub use methods::Method;
pub use registry::{MethodKind, MethodSpec, METHOD_NAMES};
pub use request::{GenerateOutput, GenerateRequest};
pub use shared_draft::{DraftLane, SharedDraft};
pub use stop::{FinishReason, StopConditions};
pub use text_stream::TextStream;
