//! Many sequences of one draft model, for the draft model the requests of a continuous batch
//! share ([`SharedDraft`](crate::SharedDraft)).

use treespec_core::TokenId;

use super::{LaneId, Logits, TreeBatch};
use crate::error::Result;

/// What one lane feeds in a batched draft forward.
#[derive(Debug, Clone, Copy)]
pub enum DraftFeed<'a> {
    /// Tokens appended to the lane's committed prefix (no logits).
    Prefill(&'a [TokenId]),
    /// Nodes on top of the lane's committed prefix and pending nodes, as
    /// [`CausalLm::forward`](super::CausalLm::forward) takes them: parents are the lane's own
    /// pending indices.
    Tree(&'a TreeBatch),
}

impl DraftFeed<'_> {
    /// Logits rows the feed asks for.
    pub fn logits_rows(&self) -> usize {
        match self {
            DraftFeed::Prefill(_) => 0,
            DraftFeed::Tree(b) => b.logits.iter().filter(|&&l| l).count(),
        }
    }

    /// Rows the feed puts in the forward.
    pub fn rows(&self) -> usize {
        match self {
            DraftFeed::Prefill(t) => t.len(),
            DraftFeed::Tree(b) => b.len(),
        }
    }
}

/// A draft model holding many lanes (one per request), each with
/// [`CausalLm`](super::CausalLm)'s committed and pending semantics, scoring every lane's feed in
/// ONE forward.
pub trait DraftLanes: Send {
    /// Vocabulary size.
    fn vocab_size(&self) -> usize;

    /// Most positions one lane may hold (committed + pending).
    fn context_size(&self) -> usize;

    /// Root-to-leaf paths the pending trees of all lanes may open together (sequence ids).
    fn free_paths(&self) -> usize;

    /// Open an empty lane. Errors when none is free.
    fn open(&mut self) -> Result<LaneId>;

    /// Free a lane and everything it holds.
    fn close(&mut self, lane: LaneId);

    /// Committed tokens of the lane.
    fn committed_len(&self, lane: LaneId) -> usize;

    /// Pending nodes of the lane.
    fn pending_len(&self, lane: LaneId) -> usize;

    /// Feed every lane's work in ONE forward. Returns the logits rows asked for, in `work` order.
    /// On error nothing of `work` stays.
    fn forward(&mut self, work: &[(LaneId, DraftFeed<'_>)]) -> Result<Logits<'_>>;

    /// [`CausalLm::commit`](super::CausalLm::commit) for the lane.
    fn commit(&mut self, lane: LaneId, path: &[usize]) -> Result<()>;

    /// [`CausalLm::truncate`](super::CausalLm::truncate) for the lane.
    fn truncate(&mut self, lane: LaneId, len: usize) -> Result<()>;
}
