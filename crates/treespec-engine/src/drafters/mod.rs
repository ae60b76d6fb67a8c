//! Drafters that run a draft model (the model-free and policy-driven ones live beside them as
//! the methods grow).

mod chain;
mod sample;
mod tree;

pub use chain::ChainDrafter;
pub use sample::{draw_children, top_tokens, SampleMode};
pub use tree::TreeDrafter;
