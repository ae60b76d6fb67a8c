//! From matches to a speculation tree: the continuations that followed the earlier occurrences of
//! the text's suffix, merged into one trie whose nodes carry what predicts their acceptance.
//!
//! Each occurrence votes for its continuation with weight `len²` (a 16-token match says far more
//! than a 4-token one). A node records the longest match behind it, how many occurrences pass
//! through it, its share of its siblings' weight, and whether only other requests' text (the global
//! history) supports it. Those features, not a raw probability, are what the pricing learns.
//!
//! Places to resume a broken copy ([`super::anchor`]) are grafted onto the same trie
//! ([`graft_resumes`]): each a chain under the root, merged with the equal paths already there,
//! its nodes carrying the resume's features ([`AnchorFeatures`]) for the pricing.

use super::anchor::{Resume, ResumeKind};
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

/// What predicts whether the target accepts a node that resumes a broken copy (given its parent
/// was accepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnchorFeatures {
    /// How the resume place was chosen.
    pub kind: ResumeKind,
    /// Tokens tying the place to the text ([`Resume::evidence`]).
    pub evidence: usize,
    /// Depth below the root (1 = the first drafted token).
    pub depth: usize,
}

/// What a drafted node is priced by: the suffix match it continues, or the broken copy it
/// resumes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Features {
    /// A continuation of earlier occurrences of the text's suffix.
    Match(NodeFeatures),
    /// A node only a place to resume a broken copy near its anchor drafts.
    Anchored(AnchorFeatures),
    /// A node both draft: priced as its match, learned in both cells (each learns what its own
    /// features predict, whatever else supports the node).
    Both(NodeFeatures, AnchorFeatures),
}

/// What a node is priced by, as [`Features`]: implemented by [`NodeFeatures`],
/// [`AnchorFeatures`] and [`Features`] itself, so the pricing takes any of them.
pub trait AsFeatures {
    /// The node's features.
    fn as_features(&self) -> Features;
}

impl AsFeatures for NodeFeatures {
    fn as_features(&self) -> Features {
        Features::Match(*self)
    }
}

impl AsFeatures for AnchorFeatures {
    fn as_features(&self) -> Features {
        Features::Anchored(*self)
    }
}

impl AsFeatures for Features {
    fn as_features(&self) -> Features {
        *self
    }
}

impl Features {
    /// Whether the node lies on a place to resume a broken copy.
    pub fn is_anchored(&self) -> bool {
        matches!(self, Features::Anchored(_) | Features::Both(..))
    }
}

/// One node of a continuation trie; node 0 is the root (the last token of the text).
#[derive(Debug, Clone, PartialEq)]
pub struct TrieNode {
    /// The token.
    pub token: TokenId,
    /// Parent node (the root's is 0).
    pub parent: usize,
    /// Features for pricing (meaningless at the root; `support` 0 on a node only a resume
    /// drafts).
    pub features: NodeFeatures,
    /// The first resume place whose chain passes through this node, if any.
    pub anchor: Option<AnchorFeatures>,
    weight: f64,
}

impl TrieNode {
    /// What the node is priced by: its suffix match, the resume it lies on, or both.
    pub fn priced(&self) -> Features {
        match (self.anchor, self.features.support) {
            (None, _) => Features::Match(self.features),
            (Some(a), 0) => Features::Anchored(a),
            (Some(a), _) => Features::Both(self.features, a),
        }
    }
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
    let mut nodes = vec![TrieNode { token: root, parent: 0, features: blank, anchor: None, weight: 0.0 }];
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
                    nodes.push(TrieNode { token, parent: at, features, anchor: None, weight: 0.0 });
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

/// Graft places to resume a broken copy onto a trie (nodes parent first, node 0 the root): each
/// `(resume, tokens)` a chain of `tokens` under the root, following the equal paths already
/// there, new nodes added while the trie holds at most `max_nodes` drafted nodes. Each node on a
/// chain gets the chain's [`AnchorFeatures`] at its depth, unless an earlier chain gave it some.
/// Returns the nodes added.
pub fn graft_resumes(
    nodes: &mut Vec<TrieNode>,
    branches: &[(Resume, &[TokenId])],
    max_nodes: usize,
) -> usize {
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (id, n) in nodes.iter().enumerate().skip(1) {
        children[n.parent].push(id);
    }
    let before = nodes.len();
    for (resume, tokens) in branches {
        let mut at = 0;
        for (d, &token) in tokens.iter().enumerate() {
            let next = match children[at].iter().find(|&&c| nodes[c].token == token) {
                Some(&c) => c,
                None => {
                    if nodes.len() > max_nodes {
                        break;
                    }
                    let features =
                        NodeFeatures { match_len: 0, depth: d + 1, share: 1.0, support: 0, global: false };
                    nodes.push(TrieNode { token, parent: at, features, anchor: None, weight: 0.0 });
                    children.push(Vec::new());
                    children[at].push(nodes.len() - 1);
                    nodes.len() - 1
                }
            };
            let f = AnchorFeatures { kind: resume.kind, evidence: resume.evidence, depth: d + 1 };
            nodes[next].anchor.get_or_insert(f);
            at = next;
        }
    }
    nodes.len() - before
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

    #[test]
    fn resumes_graft_as_chains_merged_with_equal_paths() {
        let mut local = SuffixIndex::new();
        local.extend(&[1, 2, 3, 4, 5, 0, 7, 1, 2, 3, 4, 6, 0, 7, 1, 2, 3]);
        let occ = local.lookup(local.tokens(), LookupLimits { want: 4, ..Default::default() });
        let m = [Matches { index: &local, occurrences: &occ, global: false }];
        let mut trie = continuation_trie(3, &m, 2, 16);
        assert!(trie.iter().all(|n| n.anchor.is_none()));
        let stay = Resume { kind: ResumeKind::Stay, start: 0, evidence: 0 };
        let skip = Resume { kind: ResumeKind::Skip, start: 0, evidence: 2 };
        // [4, 6, 9] follows the trie's 4 → 6 and adds 9; [4, 6] again is already there; [8]
        // is a new child of the root.
        let added = graft_resumes(&mut trie, &[(stay, &[4, 6, 9]), (skip, &[4, 6]), (skip, &[8])], 16);
        assert_eq!(added, 2);
        let tokens: Vec<TokenId> = trie.iter().map(|n| n.token).collect();
        assert_eq!(tokens, vec![3, 4, 6, 5, 9, 8]);
        assert_eq!((trie[4].parent, trie[5].parent), (2, 0));
        // The first chain through a node gives it its features.
        assert_eq!(trie[2].anchor, Some(AnchorFeatures { kind: ResumeKind::Stay, evidence: 0, depth: 2 }));
        assert_eq!(trie[5].anchor, Some(AnchorFeatures { kind: ResumeKind::Skip, evidence: 2, depth: 1 }));
        assert_eq!(trie[3].anchor, None);
        // A node on a match and a chain is priced by both, a chain-only node as its resume, a
        // node off the chains as its match.
        assert_eq!(trie[1].priced(), Features::Both(trie[1].features, trie[1].anchor.unwrap()));
        assert_eq!(trie[4].priced(), Features::Anchored(trie[4].anchor.unwrap()));
        assert!(trie[1].priced().is_anchored() && trie[4].priced().is_anchored());
        assert_eq!(trie[3].priced(), Features::Match(trie[3].features));
        // The node cap holds.
        let mut capped = trie.clone();
        assert_eq!(graft_resumes(&mut capped, &[(stay, &[20, 21, 22])], 6), 1);
    }
}
