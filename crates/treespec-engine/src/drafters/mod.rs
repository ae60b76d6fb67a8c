//! Drafters that run a draft model (the model-free and policy-driven ones live beside them as
//! the methods grow).

mod auto;
mod chain;
mod disco;
mod dyspec;
mod eagle2;
mod gsd;
mod lookup;
mod sample;
mod sequoia;
mod staged;
mod tree;

pub use auto::{AutoConfig, AutoDrafter};
pub use chain::ChainDrafter;
pub use disco::{DiscoConfig, DiscoDrafter, DiscoMode};
pub use dyspec::{DySpecConfig, DySpecDrafter, DySpecMode, DySpecStats};
pub use eagle2::{Eagle2Config, Eagle2Drafter, Eagle2Stats};
pub use gsd::{GsdConfig, GsdDrafter, GsdStats};
pub use lookup::{LookupConfig, LookupDrafter, LookupStats};
pub use sample::{draw_children, top_tokens, SampleMode};
pub use sequoia::{SequoiaConfig, SequoiaDrafter};
pub use staged::{StagedConfig, StagedDrafter, StagedStats};
pub use tree::TreeDrafter;
