//! The backend seam: everything the engine asks of a model, in one place.
//!
//! - [`CausalLm`]: one sequence of a model that scores token trees (a target alone, a draft model,
//!   one lane of a shared draft), with the [`TreeBatch`] it is fed and the [`Logits`] it returns.
//! - [`BatchedLm`]: one target holding many requests' sequences (*lanes*, [`LaneId`]), every
//!   lane's [`LaneWork`] scored in one forward, as much as its [`BatchRoom`] allows
//!   (continuous batching, [`crate::batched`]).
//! - [`DraftLanes`]: one draft model holding many lanes, each lane's [`DraftFeed`] scored in one
//!   forward (the draft the requests of a batch share, [`SharedDraft`](crate::SharedDraft)).
//! - [`TokenBytes`]: a token's bytes (the text a generation releases, and its stop strings).
//!
//! The llama.cpp crate and the toy models implement these; the engine depends on nothing else of
//! a backend, and nothing here depends on the engine's decoding code.

mod batched_lm;
mod causal_lm;
mod draft_lanes;
mod token_bytes;

pub use batched_lm::{BatchRoom, BatchedLm, LaneId, LaneWork};
pub use causal_lm::{CausalLm, Logits, TreeBatch};
pub use draft_lanes::{DraftFeed, DraftLanes};
pub use token_bytes::TokenBytes;
