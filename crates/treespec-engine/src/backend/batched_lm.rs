//! Many sequences of one target model (*lanes*), every lane's rows scored in one forward:
//! the seam continuous batching ([`crate::batched`]) runs on.

use treespec_core::TokenId;

use super::{Logits, TreeBatch};
use crate::error::Result;

/// A lane of a [`BatchedLm`]: one request's sequence.
pub type LaneId = usize;

/// What one lane feeds in a batched forward.
#[derive(Debug, Clone, Copy)]
pub enum LaneWork<'a> {
    /// Prompt tokens appended to the lane's committed prefix (no logits).
    Prefill {
        /// The lane.
        lane: LaneId,
        /// The tokens.
        tokens: &'a [TokenId],
    },
    /// A token tree on top of the lane's committed prefix and of its prompt chunk when the same
    /// step feeds one (a request's first tree rides the chunk that finishes its prompt), pending
    /// until `commit`, logits for every node.
    Tree {
        /// The lane.
        lane: LaneId,
        /// The tree's nodes (parents before children, first node the root).
        batch: &'a TreeBatch,
    },
}

/// How much a step may still add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchRoom {
    /// Rows (KV cells) the next forward may hold in all.
    pub rows: usize,
    /// Root-to-leaf tree paths the next forward may open in all (a tree of n nodes opens at
    /// most n).
    pub paths: usize,
}

/// A model serving many lanes, scoring all of their rows in one forward.
pub trait BatchedLm {
    /// Vocabulary size.
    fn vocab_size(&self) -> usize;

    /// Most positions one lane may hold (prompt + generated).
    fn context_size(&self) -> usize;

    /// Positions all lanes together may hold (admission control reserves against this).
    fn capacity(&self) -> usize;

    /// Bytes of finished requests' KV prefixes kept in host memory for later turns (the
    /// server's `--cache-ram`), which a memory watch counts apart from growth; 0 without such a
    /// store.
    fn saved_prefix_bytes(&self) -> usize {
        0
    }

    /// Open a lane for a request whose prompt starts with `prompt_head`. Returns the lane and how
    /// many leading tokens of `prompt_head` it already holds (a cached prefix reused rather
    /// than prefilled, only ever from a lane opened with the same `scope`: a server's tenant,
    /// which must not learn from a faster prefill what another tenant sent). Errors when no lane
    /// is free.
    fn open(&mut self, prompt_head: &[TokenId], scope: u64) -> Result<(LaneId, usize)>;

    /// Tokens the lane holds.
    fn committed_len(&self, lane: LaneId) -> usize;

    /// What the next forward may hold.
    fn room(&self) -> BatchRoom;

    /// Feed every lane's work in ONE forward. Returns the logits of every tree node, in `work`
    /// order (prefill rows have none).
    fn forward(&mut self, work: &[LaneWork<'_>]) -> Result<Logits<'_>>;

    /// Keep the lane's pending nodes of `path` (indices into the tree it fed last; the first
    /// attached to its prefix) and drop its other pending nodes. Takes effect by [`settle`].
    ///
    /// [`settle`]: BatchedLm::settle
    fn commit(&mut self, lane: LaneId, path: &[usize]) -> Result<()>;

    /// Apply every commit of the step (call once after the step's commits).
    fn settle(&mut self) -> Result<()>;

    /// The lane's request is over: free it (its tokens may stay cached for prefix reuse).
    fn close(&mut self, lane: LaneId);

    /// Pad every later forward of two or more rows (all lanes' together) up to a shape of
    /// `buckets` (see [`CausalLm::pad_shapes`](crate::CausalLm::pad_shapes)); None stops
    /// padding. False when this backend cannot pad.
    fn pad_shapes(&mut self, buckets: Option<&treespec_core::cost::shapes::ShapeBuckets>) -> bool {
        let _ = buckets;
        false
    }

    /// Forwards so far that reused the graph of the forward before, where the backend counts.
    fn graph_reuses(&self) -> Option<u64> {
        None
    }
}
