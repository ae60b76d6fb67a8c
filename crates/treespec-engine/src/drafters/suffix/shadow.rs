//! Learning from the whole of the last proposal, not only the nodes verified: once the text has
//! moved on, whether each child along the path it took was the token that came next is known for
//! free.

use treespec_core::suffix::{Features, SuffixPricing};
use treespec_core::tree::{TokenTree, ROOT};
use treespec_core::TokenId;

use super::calibration::{RequestCalibration, NODE_DECAY};

/// A proposal's whole trie (not only the nodes verified), scored at the next step against the
/// tokens the target emitted meanwhile. A free draft needs no verification to be learned from:
/// whether each child of the emitted path was the token that came next is known for free once the
/// text has moved on. So the pricing learns from every match, including the many it priced out —
/// which is how a cell priced too low gets to show it is better (a copy of an article being
/// summarised), without paying rows to explore it.
#[derive(Debug)]
pub(super) struct Shadow {
    /// History length when proposed: the root is `history[len − 1]`, depth-d nodes predict
    /// `history[len + d − 1]`.
    pub(super) len: usize,
    /// The whole trie, and each node's features and posterior mean acceptance when proposed.
    pub(super) trie: TokenTree,
    pub(super) features: Vec<Features>,
    pub(super) means: Vec<f64>,
    /// Each trie node's id in the proposal (`None`: not proposed).
    pub(super) proposed: Vec<Option<usize>>,
    /// Rows of the proposal that were verified (set by `observe`; a batch budget may cut it).
    pub(super) verified_rows: usize,
}

impl Shadow {
    /// Record every not-yet-verified child along the path the text took since the proposal in
    /// the shared prices, and every child (verified or not) in the request's calibration.
    pub(super) fn learn(
        &self,
        history: &[TokenId],
        pricing: &mut SuffixPricing,
        calibration: &mut RequestCalibration,
    ) {
        let Some(emitted) = history.get(self.len..) else { return };
        let mut at = ROOT;
        for &next in emitted {
            let mut taken = None;
            for &id in self.trie.children(at) {
                let hit = self.trie.node(id).token == next;
                // Verified nodes were recorded by `observe`.
                if self.proposed[id].is_none_or(|row| row >= self.verified_rows) {
                    pricing.record(&self.features[id], hit);
                }
                // The request's tally is of how its text follows its matches: the guesses of where
                // a broken copy resumes, several a step after an edit, would drown it.
                if !matches!(self.features[id], Features::Anchored(_)) {
                    calibration.record(f64::from(hit), self.means[id], 1.0, NODE_DECAY);
                }
                if hit {
                    taken = Some(id);
                }
            }
            match taken {
                Some(id) => at = id,
                None => return,
            }
        }
    }
}
