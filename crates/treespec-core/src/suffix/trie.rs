//! From matches to a speculation tree: the continuations that followed the earlier occurrences of
//! the text's suffix, merged into one trie whose nodes carry what predicts their acceptance.
//!
//! Each occurrence votes for its continuation with weight `len²` (a 16-token match says far more
//! than a 4-token one). A node records the longest match behind it, how many occurrences pass
//! through it, its share of its siblings' weight, and whether only other requests' text (the global
//! history) supports it. Those features, not a raw probability, are what the pricing learns.

use super::index::{Occurrence, SuffixIndex};
use crate::TokenId;

/// What predicts whether the target accepts a suffix-drafted node (given its parent accepted).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeFeatures {
    /// Longest match among the occurrences that continue through this node.
    pub match_len: usize,
    /// Depth below the root (1 = the first drafted token).
    pub depth: usize,
    /// This node's share of the vote among its siblings, in (0, 1].
    pub share: f64,
    /// Occurrences that continue through this node.
    pub support: u32,
    /// Supported only by the global history (other requests), not by this request's own text.
    pub global: bool,
}

/// One node of a continuation trie; node 0 is the root (the last token of the text).
#[derive(Debug, Clone, PartialEq)]
pub struct TrieNode {
    /// The token.
    pub token: TokenId,
    /// Parent node (the root's is 0).
    pub parent: usize,
    /// Features for pricing (meaningless at the root).
    pub features: NodeFeatures,
    weight: f64,
}

/// Occurrences found in one store.
#[derive(Debug, Clone, Copy)]
pub struct Matches<'a> {
    /// The store they were found in.
    pub index: &'a SuffixIndex,
    /// The occurrences.
    pub occurrences: &'a [Occurrence],
    /// Whether the store is the global history.
    pub global: bool,
}

/// Merge the continuations of every occurrence (longest matches first) into a trie of at most
/// `max_nodes` drafted nodes and `max_depth` levels. Nodes come parent first.
pub fn continuation_trie(
    root: TokenId,
    sources: &[Matches],
    max_depth: usize,
    max_nodes: usize,
) -> Vec<TrieNode> {
    let blank = NodeFeatures { match_len: 0, depth: 0, share: 1.0, support: 0, global: false };
    let mut nodes = vec![TrieNode { token: root, parent: 0, features: blank, weight: 0.0 }];
    let mut children: Vec<Vec<usize>> = vec![Vec::new()];
    let mut all: Vec<(&SuffixIndex, Occurrence, bool)> =
        sources.iter().flat_map(|s| s.occurrences.iter().map(move |&o| (s.index, o, s.global))).collect();
    all.sort_by_key(|a| std::cmp::Reverse(a.1.len));
    'occurrences: for (index, occ, global) in all {
        let weight = (occ.len * occ.len) as f64;
        let mut at = 0;
        for (d, &token) in index.continuation(occ.start, max_depth).iter().enumerate() {
            let next = match children[at].iter().find(|&&c| nodes[c].token == token) {
                Some(&c) => c,
                None => {
                    if nodes.len() > max_nodes {
                        continue 'occurrences;
                    }
                    let features = NodeFeatures { depth: d + 1, global: true, ..blank };
                    nodes.push(TrieNode { token, parent: at, features, weight: 0.0 });
                    children.push(Vec::new());
                    children[at].push(nodes.len() - 1);
                    nodes.len() - 1
                }
            };
            let f = &mut nodes[next].features;
            f.match_len = f.match_len.max(occ.len);
            f.support += 1;
            f.global &= global;
            nodes[next].weight += weight;
            at = next;
        }
    }
    for kids in &children {
        let total: f64 = kids.iter().map(|&c| nodes[c].weight).sum();
        for &c in kids {
            nodes[c].features.share = if total > 0.0 { nodes[c].weight / total } else { 1.0 };
        }
    }
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suffix::index::LookupLimits;

    #[test]
    fn merges_continuations_and_weights_them_by_match_length() {
        let mut local = SuffixIndex::new();
        // "1 2 3" was followed by "4 5"; "0 7 1 2 3" by "4 6" (a longer match); the query ends in
        // "0 7 1 2 3".
        local.extend(&[1, 2, 3, 4, 5, 0, 7, 1, 2, 3, 4, 6, 0, 7, 1, 2, 3]);
        let occ = local.lookup(local.tokens(), LookupLimits { want: 4, ..Default::default() });
        let m = [Matches { index: &local, occurrences: &occ, global: false }];
        let trie = continuation_trie(3, &m, 2, 16);
        let tokens: Vec<TokenId> = trie.iter().map(|n| n.token).collect();
        assert_eq!(tokens, vec![3, 4, 6, 5]);
        let (four, six, five) = (&trie[1].features, &trie[2].features, &trie[3].features);
        assert_eq!((four.depth, four.support, four.match_len, four.share), (1, 2, 5, 1.0));
        assert_eq!((six.depth, six.support, six.match_len), (2, 1, 5));
        assert_eq!(five.match_len, 3);
        // 25 : 9 votes.
        assert!((six.share - 25.0 / 34.0).abs() < 1e-12 && (five.share - 9.0 / 34.0).abs() < 1e-12);
        assert!(!four.global);
        assert_eq!(trie[3].parent, 1);
        // A node cap keeps the longest match's path.
        let small = continuation_trie(3, &m, 2, 2);
        assert_eq!(small.iter().map(|n| n.token).collect::<Vec<_>>(), vec![3, 4, 6]);
    }
}
