//! Every drafter: the ones that run a draft model (chain, tree, sequoia, dyspec, eagle2, gsd,
//! staged, disco), the model-free ones (lookup, suffix) and the policy that picks per step
//! (auto), plus what they share: drawing children from logits (`sample`) and ranking
//! deterministic candidates (`candidates`).

mod auto;
mod candidates;
mod chain;
mod disco;
mod dyspec;
mod eagle2;
mod gsd;
mod lookup;
mod sample;
mod sequoia;
mod staged;
mod suffix;
mod tree;

pub use auto::{AutoConfig, AutoDrafter, DecisionTrace};
pub use chain::ChainDrafter;
pub use disco::{DiscoConfig, DiscoDrafter, DiscoMode};
pub use dyspec::{DySpecConfig, DySpecDrafter, DySpecMode, DySpecStats};
pub use eagle2::{Eagle2Config, Eagle2Drafter, Eagle2Stats};
pub use gsd::{GsdConfig, GsdDrafter, GsdStats};
pub use lookup::{LookupConfig, LookupDrafter, LookupStats};
pub use sample::{draw_children, top_tokens, SampleMode};
pub use sequoia::{SequoiaConfig, SequoiaDrafter};
pub use staged::{StagedConfig, StagedDrafter, StagedStats};
pub use suffix::history_file::{self, HistoryFile};
pub use suffix::{
    StorePlaces, StoreSave, SuffixConfig, SuffixDrafter, SuffixShared, SuffixStats, SuffixStore,
};
pub use tree::TreeDrafter;
