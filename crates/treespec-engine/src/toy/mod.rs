//! Toy language models: small, enumerable, pure Rust.
//!
//! The conditionals are a pure function of the last `order` tokens and a seed, so the exact
//! probability of any continuation can be computed and compared with what the speculative loop
//! emits. A draft is the same family with a *divergence* knob: identical to the target, noisy,
//! or with a support disjoint from the target's.

mod batched;
mod draft_lanes;
mod lm;
mod model;
mod slots;
#[cfg(any(test, feature = "test-support"))]
mod watched;

pub use batched::ToyBatchLm;
pub use draft_lanes::ToyDraftLanes;
pub use lm::ToyLm;
pub use model::{Support, ToyModel};
#[cfg(any(test, feature = "test-support"))]
pub use watched::{Watch, WatchedLm};

/// Cost curves for toy models (demos, the toy server, the toy benchmark): a verify that grows
/// slowly with the batch and a draft at a tenth of it, refined online from the toys' own timings.
pub fn toy_costs() -> crate::auto_budget::CostModel {
    let curve =
        |base, per| treespec_core::cost::CostCurve::linear(base, per, 64).expect("valid linear curve");
    crate::auto_budget::CostModel::new(curve(1.0, 0.1), Some(curve(0.1, 0.05)))
}
