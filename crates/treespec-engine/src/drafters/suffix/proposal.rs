//! Turning the step's choice into the proposal: the kept nodes copied out of the trie in value
//! order, each with its features and its pessimistic path value, and the whole trie kept as the
//! [`Shadow`] the next step learns from.

use treespec_core::suffix::Features;
use treespec_core::tree::{Draw, TokenTree, ROOT};

use super::selection::Selection;
use super::shadow::Shadow;
use super::SuffixDrafter;
use crate::error::{EngineError, Result};

impl SuffixDrafter {
    /// The proposal of the `chosen` nodes of `trie` (drafted for a history of `history_len`
    /// tokens, with each node's `features`). The kept nodes come in value order (parents come
    /// first in it), so that every arena prefix is the best tree of its size: a batch budget may
    /// cut the proposal by truncating it.
    pub(super) fn proposal(
        &mut self,
        history_len: usize,
        trie: TokenTree,
        features: Vec<Features>,
        chosen: Selection,
    ) -> Result<TokenTree> {
        let Selection { order, keep, gain, value, means } = chosen;
        let mut cut = TokenTree::new(trie.node(ROOT).token);
        let mut new_id = vec![None; trie.len()];
        new_id[ROOT] = Some(ROOT);
        self.features.push(features[ROOT]);
        for &n in &order[..keep] {
            let node = trie.node(n);
            let parent = node
                .parent
                .and_then(|p| new_id[p])
                .ok_or_else(|| EngineError::State(format!("suffix: node {n} ordered before its parent")))?;
            new_id[n] = Some(cut.add(parent, node.token, Draw::Deterministic, 0.0)?);
            self.features.push(features[n]);
            self.stats.anchored_nodes_proposed += features[n].is_anchored() as u64;
            // Pessimistic values, non-increasing even where exploration reordered the nodes.
            let floor = self.values.last().copied().unwrap_or(1.0);
            self.values.push(value[n].min(floor));
        }
        self.last_gain = gain.max(0.0);
        self.shadow =
            Some(Shadow { len: history_len, trie, features, means, proposed: new_id, verified_rows: 0 });
        Ok(cut)
    }
}
