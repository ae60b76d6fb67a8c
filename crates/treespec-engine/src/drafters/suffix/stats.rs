//! The suffix drafter's per-generation counters, and the part of them a run reports.

use crate::extra_stats::SuffixCounts;

/// Per-generation counters of a [`SuffixDrafter`](super::SuffixDrafter).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SuffixStats {
    /// `propose` calls.
    pub steps: u64,
    /// Steps whose own text had a match.
    pub local_hits: u64,
    /// Steps where the global history had a match.
    pub global_hits: u64,
    /// Steps that verified at least one node.
    pub drafting_steps: u64,
    /// Steps priced optimistically.
    pub explore_steps: u64,
    /// Nodes verified, summed over steps.
    pub verified: u64,
    /// Verified nodes accepted.
    pub accepted: u64,
    /// Steps whose trie held re-anchoring chains.
    pub reanchor_steps: u64,
    /// Re-anchoring nodes in the proposals (verified or not, before a batch budget's cut).
    pub anchored_nodes_proposed: u64,
    /// Re-anchoring nodes verified.
    pub anchored_nodes_verified: u64,
    /// Re-anchoring nodes verified and accepted.
    pub anchored_nodes_accepted: u64,
}

impl SuffixStats {
    /// The counters a run's extra statistics report.
    pub(super) fn counts(&self) -> SuffixCounts {
        SuffixCounts {
            local_hit_steps: self.local_hits,
            global_hit_steps: self.global_hits,
            drafting_steps: self.drafting_steps,
            explore_steps: self.explore_steps,
            verified_nodes: self.verified,
            accepted_nodes: self.accepted,
            node_accept_rate: (self.verified > 0).then(|| self.accepted as f64 / self.verified as f64),
        }
    }
}
