//! Toy language models: small, enumerable, pure Rust.
//!
//! The conditionals are a pure function of the last `order` tokens and a seed, so the exact
//! probability of any continuation can be computed and compared with what the speculative loop
//! emits. A draft is the same family with a *divergence* knob: identical to the target, noisy,
//! or with a support disjoint from the target's.

mod lm;
mod model;

pub use lm::ToyLm;
pub use model::{Support, ToyModel};
