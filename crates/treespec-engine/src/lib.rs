//! treespec-engine: the model seam ([`CausalLm`]), drafters over models, the speculative
//! generation loop, and pure-Rust toy models for tests and demos.

pub mod auto_budget;
pub mod backend;
pub mod batched;
pub mod constraint;
pub mod draft_model;
pub mod drafter;
pub mod drafters;
pub mod error;
pub mod extra_stats;
pub mod generate;
pub mod generation;
pub mod methods;
pub mod model;
pub mod offline_measure;
pub mod profile;
pub mod registry;
pub mod request;
pub mod shared_draft;
pub mod stop;
pub mod text_stream;
pub mod toy;

pub use backend::{
    BatchRoom, BatchedLm, CausalLm, DraftFeed, DraftLanes, LaneId, LaneWork, Logits, TreeBatch,
};
pub use constraint::{DfaConstraint, TokenConstraint, WithoutForcing};
pub use drafter::{Cuttable, Drafter, PlainDrafter, ProposeContext, Provenance};
pub use error::{EngineError, Result};
pub use extra_stats::ExtraStats;
pub use generate::{generate, generate_constrained};
pub use generation::{Generation, ProposeAt, Scored, StepOutcome, TextRun, TokenLogprob};
pub use methods::Method;
pub use registry::{MethodKind, MethodSpec, METHOD_NAMES};
pub use request::{GenerateOutput, GenerateRequest};
pub use shared_draft::{DraftLane, SharedDraft};
pub use stop::{FinishReason, StopConditions, TokenBytes};
pub use text_stream::TextStream;
