//! Graph-structured drafts (GSD): a DAG whose merged nodes are computed once by the draft and
//! unrolled into a plain token tree for verification.
//!
//! A node reached through a *link* (an edge added by merging, not by drawing) was drafted under a
//! different prefix, so its draft probabilities do not describe the new path: in the unrolled
//! tree it, and everything below it, becomes a deterministic candidate (family 3), which keeps
//! sampling lossless whatever the merge did.

use crate::tree::{Draw, NodeId, TokenTree, ROOT};
use crate::{Error, Result, TokenId};

/// One DAG node.
#[derive(Debug, Clone, PartialEq)]
pub struct DagNode {
    /// The token.
    pub token: TokenId,
    /// How the token was drawn under its original parent.
    pub draw: Draw,
    /// Draft probability under its original parent.
    pub draft_prob: f32,
    /// Outgoing edges `(child, linked)`; `linked` = added by merging.
    pub edges: Vec<(NodeId, bool)>,
}

/// A token DAG; node 0 is the root.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenDag {
    nodes: Vec<DagNode>,
}

impl TokenDag {
    /// A DAG holding only the root token.
    pub fn new(root_token: TokenId) -> Self {
        Self {
            nodes: vec![DagNode {
                token: root_token,
                draw: Draw::Deterministic,
                draft_prob: 1.0,
                edges: Vec::new(),
            }],
        }
    }

    /// Draft a new node under `parent`.
    pub fn add(&mut self, parent: NodeId, token: TokenId, draw: Draw, draft_prob: f32) -> Result<NodeId> {
        let id = self.nodes.len();
        if parent >= id {
            return Err(Error::BadParent { node: id, parent });
        }
        self.nodes.push(DagNode { token, draw, draft_prob, edges: Vec::new() });
        self.nodes[parent].edges.push((id, false));
        Ok(id)
    }

    /// Merge: make the existing node `to` also a child of `from`. Refuses edges that would close a
    /// cycle (`to` reaches `from`), self-links, missing nodes, the root as target, and duplicates.
    pub fn link(&mut self, from: NodeId, to: NodeId) -> Result<()> {
        let bad = |reason: &str| Err(Error::BadDagEdge { from, to, reason: reason.into() });
        if from >= self.nodes.len() || to >= self.nodes.len() {
            return bad("node does not exist");
        }
        if to == ROOT {
            return bad("the root cannot be a child");
        }
        if self.nodes[from].edges.iter().any(|&(c, _)| c == to) {
            return bad("edge already present");
        }
        if self.reaches(to, from) {
            return bad("the edge would close a cycle");
        }
        self.nodes[from].edges.push((to, true));
        Ok(())
    }

    /// Whether `from` reaches `to` (inclusive).
    pub fn reaches(&self, from: NodeId, to: NodeId) -> bool {
        let mut seen = vec![false; self.nodes.len()];
        let mut stack = vec![from];
        while let Some(n) = stack.pop() {
            if n == to {
                return true;
            }
            if !std::mem::replace(&mut seen[n], true) {
                stack.extend(self.nodes[n].edges.iter().map(|&(c, _)| c));
            }
        }
        false
    }

    /// Number of DAG nodes (each costs the draft one computation).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Never true: the root is always present.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// A node.
    pub fn node(&self, id: NodeId) -> &DagNode {
        &self.nodes[id]
    }

    /// Unroll into a tree, depth-first in edge order, stopping once the tree holds `max_nodes`
    /// nodes (root included). Returns the tree and, per tree node, the DAG node it copies.
    pub fn unroll(&self, max_nodes: usize) -> (TokenTree, Vec<NodeId>) {
        let mut tree = TokenTree::new(self.nodes[ROOT].token);
        let mut origin = vec![ROOT];
        // (dag node, tree parent, reached through a link somewhere above)
        let mut stack: Vec<(NodeId, NodeId, bool)> = Vec::new();
        let push_children = |stack: &mut Vec<_>, dag: NodeId, tree_node: NodeId, linked: bool| {
            for &(c, l) in self.nodes[dag].edges.iter().rev() {
                stack.push((c, tree_node, linked || l));
            }
        };
        push_children(&mut stack, ROOT, ROOT, false);
        while let Some((dag, parent, linked)) = stack.pop() {
            if tree.len() >= max_nodes {
                break;
            }
            let n = &self.nodes[dag];
            let draw = if linked { Draw::Deterministic } else { n.draw.clone() };
            let id =
                tree.add(parent, n.token, draw, n.draft_prob).expect("parent precedes child by construction");
            origin.push(dag);
            push_children(&mut stack, dag, id, linked);
        }
        (tree, origin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// root ─ a(1) ─ b(2) ─ c(3)
    ///      └ d(4) ──link──┘ (d → b: "4 2 3" reuses b's subtree)
    #[test]
    fn unroll_copies_linked_subtrees_as_deterministic() {
        let q = std::sync::Arc::new(crate::Dist::from_weights(vec![1.0; 8]).unwrap());
        let mut g = TokenDag::new(0);
        let a = g.add(ROOT, 1, Draw::Iid { q: q.clone() }, 0.5).unwrap();
        let b = g.add(a, 2, Draw::Iid { q: q.clone() }, 0.5).unwrap();
        g.add(b, 3, Draw::Iid { q: q.clone() }, 0.5).unwrap();
        let d = g.add(ROOT, 4, Draw::Iid { q }, 0.5).unwrap();
        g.link(d, b).unwrap();
        let (t, origin) = g.unroll(100);
        let paths: Vec<Vec<TokenId>> = t.leaves().into_iter().map(|l| t.path_tokens(l)).collect();
        assert_eq!(paths, vec![vec![1, 2, 3], vec![4, 2, 3]]);
        assert_eq!(origin.len(), t.len());
        for (id, &o) in origin.iter().enumerate() {
            assert_eq!(t.node(id).token, g.node(o).token);
        }
        // The copies under d are deterministic, the originals keep their draw.
        let under_d: Vec<_> = (0..t.len()).filter(|&i| t.path(i).contains(&5)).collect();
        assert!(under_d.iter().skip(1).all(|&i| t.node(i).draw == Draw::Deterministic));
        assert!(matches!(t.node(2).draw, Draw::Iid { .. }));
    }

    #[test]
    fn cycles_and_bad_edges_are_refused() {
        let mut g = TokenDag::new(0);
        let a = g.add(ROOT, 1, Draw::Deterministic, 1.0).unwrap();
        let b = g.add(a, 2, Draw::Deterministic, 1.0).unwrap();
        assert!(g.link(b, a).is_err());
        assert!(g.link(b, b).is_err());
        assert!(g.link(a, ROOT).is_err());
        assert!(g.link(a, b).is_err());
        assert!(g.link(a, 99).is_err());
        assert!(g.add(99, 1, Draw::Deterministic, 1.0).is_err());
    }

    #[test]
    fn unroll_respects_the_cap() {
        let mut g = TokenDag::new(0);
        let mut at = ROOT;
        for t in 1..10 {
            at = g.add(at, t, Draw::Deterministic, 1.0).unwrap();
        }
        let (t, _) = g.unroll(4);
        assert_eq!(t.len(), 4);
    }
}
