//! The suffix drafter's knobs and their domains.

use std::sync::Arc;

use super::SuffixShared;
use crate::auto_budget::SharedCosts;
use crate::error::{EngineError, Result};

/// Knobs of the suffix drafter.
#[derive(Debug, Clone, PartialEq)]
pub struct SuffixConfig {
    /// Longest match measured, in tokens. Default 64.
    pub max_match: usize,
    /// Deepest draft, in tokens. Default 64.
    pub max_depth: usize,
    /// Occurrences (per index) whose continuations are merged into the tree. Default 8.
    pub occurrences: usize,
    /// Most drafted nodes verified per step. Default 64.
    pub max_nodes: usize,
    /// Draft from, and add finished requests to, the global history. Default on.
    pub global: bool,
    /// Never draft from earlier requests with the very same prompt (benchmarks: a prompt must
    /// not be sped up by its own earlier answer). Default off.
    pub exclude_same_prompt: bool,
    /// Standard deviations below the mean acceptance a node is priced at. Default 0.9: on the
    /// stepped cost curve (every 4-row step measured), replaying the main set's 52 recorded
    /// answers through the drafter (`treespec-bench` example `suffix_replay`) gave 1.301× plain
    /// at 0.9 against 1.288× at 1 and 1.305× at 0.8, where translation starts to lose.
    pub pessimism: f64,
    /// Every this many steps, price little-tried cells optimistically (0 = never). Default 16.
    pub explore_every: u32,
    /// Re-anchor copies broken by an edit: while the suffix match is short after a long copy of
    /// the request's own text broke, also draft the places where the copy may resume near where
    /// it stood. Default on.
    pub reanchor: bool,
    /// Without cost curves: keep nodes whose path value is at least this. Default 0.3.
    pub min_value: f64,
    /// The measured cost curves: with them a step keeps the prefix with the best gain.
    pub costs: Option<Arc<SharedCosts>>,
    /// State shared by every drafter of the method.
    pub shared: Arc<SuffixShared>,
}

impl Default for SuffixConfig {
    fn default() -> Self {
        Self {
            max_match: 64,
            max_depth: 64,
            occurrences: 8,
            max_nodes: 64,
            global: true,
            exclude_same_prompt: false,
            pessimism: 0.9,
            explore_every: 16,
            reanchor: true,
            min_value: 0.3,
            costs: None,
            shared: SuffixShared::empty(),
        }
    }
}

impl SuffixConfig {
    /// Check every knob's domain; the message names the knob.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::InvalidRequest(format!("suffix {m}")));
        for (name, v) in [
            ("max_match", self.max_match),
            ("max_depth", self.max_depth),
            ("occurrences", self.occurrences),
            ("max_nodes", self.max_nodes),
        ] {
            if v == 0 {
                return bad(format!("{name} must be ≥ 1"));
            }
        }
        if self.max_match < 2 {
            return bad(format!("max_match must be ≥ 2 (the shortest key), got {}", self.max_match));
        }
        if !(self.pessimism.is_finite() && (0.0..=5.0).contains(&self.pessimism)) {
            return bad(format!("pessimism must be in [0, 5], got {}", self.pessimism));
        }
        if !(self.min_value.is_finite() && (0.0..=1.0).contains(&self.min_value)) {
            return bad(format!("min_value must be in [0, 1], got {}", self.min_value));
        }
        Ok(())
    }
}
