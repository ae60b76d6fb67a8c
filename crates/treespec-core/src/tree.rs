//! Arena token trees: what a drafter proposes in one step.
//!
//! Node 0 is the root: the last emitted token, which the target has not consumed yet. Every other
//! node is a drafted token with a parent that was added before it, so the arena order is already
//! a valid flattening (parents before children). Each drafted node records how it was drawn,
//! because that decides which exact verification rule applies (ALGORITHMS.md §2).

use std::sync::Arc;

use crate::dist::Dist;
use crate::{Error, Result, TokenId};

/// Index of a node in a [`TokenTree`].
pub type NodeId = usize;

/// The root's id.
pub const ROOT: NodeId = 0;

/// How a drafted token was chosen; decides its verification family.
#[derive(Debug, Clone, PartialEq)]
pub enum Draw {
    /// Sampled independently from `q` (SpecInfer multi-round: family 1).
    Iid { q: Arc<Dist> },
    /// Sampled from `q` with this node's earlier without-replacement siblings removed
    /// (Sequoia/DySpec: family 2). All such siblings share the same full `q`.
    WithoutReplacement { q: Arc<Dist> },
    /// Chosen without sampling (top-k, n-gram, merged DAG node): a point mass (family 3).
    Deterministic,
}

impl Draw {
    /// The draft distribution the token was sampled from, if it was sampled.
    pub fn q(&self) -> Option<&Arc<Dist>> {
        match self {
            Draw::Iid { q } | Draw::WithoutReplacement { q } => Some(q),
            Draw::Deterministic => None,
        }
    }
}

/// One node of a token tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The token.
    pub token: TokenId,
    /// Parent node; `None` only for the root.
    pub parent: Option<NodeId>,
    /// Distance from the root (root = 0).
    pub depth: usize,
    /// How the token was chosen.
    pub draw: Draw,
    /// The draft's probability of this token given its path (a drafter's score; 1 for the root).
    pub draft_prob: f32,
}

/// A token tree in arena form.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenTree {
    nodes: Vec<Node>,
    children: Vec<Vec<NodeId>>,
}

impl TokenTree {
    /// A tree holding only the root token.
    pub fn new(root_token: TokenId) -> Self {
        let root =
            Node { token: root_token, parent: None, depth: 0, draw: Draw::Deterministic, draft_prob: 1.0 };
        Self { nodes: vec![root], children: vec![Vec::new()] }
    }

    /// Add a drafted token under `parent`; children are verified in the order they are added.
    pub fn add(&mut self, parent: NodeId, token: TokenId, draw: Draw, draft_prob: f32) -> Result<NodeId> {
        let id = self.nodes.len();
        if parent >= id {
            return Err(Error::BadParent { node: id, parent });
        }
        if let Some(q) = draw.q() {
            if (token as usize) >= q.len() {
                return Err(Error::TokenOutOfRange { token, vocab: q.len() });
            }
            // Without-replacement siblings must all come from one distribution, else the
            // verifier cannot rebuild the q_i sequence the drafter used.
            if let Draw::WithoutReplacement { q } = &draw {
                for &s in &self.children[parent] {
                    if let Draw::WithoutReplacement { q: qs } = &self.nodes[s].draw {
                        if !Arc::ptr_eq(q, qs) && q != qs {
                            return Err(Error::BadDraftNode {
                                node: id,
                                reason: "without-replacement siblings drawn from different distributions"
                                    .into(),
                            });
                        }
                    }
                }
            }
        }
        let depth = self.nodes[parent].depth + 1;
        self.nodes.push(Node { token, parent: Some(parent), depth, draw, draft_prob });
        self.children.push(Vec::new());
        self.children[parent].push(id);
        Ok(id)
    }

    /// Number of nodes including the root.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Never true: the root is always present.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Number of drafted nodes (excluding the root).
    pub fn drafted(&self) -> usize {
        self.nodes.len() - 1
    }

    /// A node.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id]
    }

    /// All nodes in arena order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Children of `id` in verification order.
    pub fn children(&self, id: NodeId) -> &[NodeId] {
        &self.children[id]
    }

    /// Maximum depth of any node.
    pub fn max_depth(&self) -> usize {
        self.nodes.iter().map(|n| n.depth).max().unwrap_or(0)
    }

    /// Tokens from the root's first child down to `id` (excluding the root token).
    pub fn path_tokens(&self, id: NodeId) -> Vec<TokenId> {
        let mut out: Vec<TokenId> = self.path(id).into_iter().skip(1).map(|n| self.nodes[n].token).collect();
        out.shrink_to_fit();
        out
    }

    /// Node ids from the root down to `id`, inclusive.
    pub fn path(&self, id: NodeId) -> Vec<NodeId> {
        let mut path = Vec::with_capacity(self.nodes[id].depth + 1);
        let mut at = Some(id);
        while let Some(n) = at {
            path.push(n);
            at = self.nodes[n].parent;
        }
        path.reverse();
        path
    }

    /// Leaves (nodes without children) in arena order.
    pub fn leaves(&self) -> Vec<NodeId> {
        (0..self.nodes.len()).filter(|&i| self.children[i].is_empty()).collect()
    }

    /// Keep only the first `len` nodes in arena order (at least the root). Parents come before
    /// children, so any arena prefix is a tree and keeps every node id; a batch budget cuts a
    /// value-ordered proposal this way without renumbering what its drafter recorded per node.
    /// Exact only for deterministic candidates (see [`retain`](Self::retain)); a tree holding
    /// sampled nodes is refused unless nothing is cut.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        let len = len.max(1);
        if len >= self.nodes.len() {
            return Ok(());
        }
        if let Some(id) = self.nodes.iter().position(|n| !matches!(n.draw, Draw::Deterministic)) {
            return Err(Error::BadDraftNode {
                node: id,
                reason: "a tree with sampled nodes cannot be pruned after drafting".into(),
            });
        }
        self.nodes.truncate(len);
        self.children.truncate(len);
        for c in &mut self.children {
            c.retain(|&k| k < len);
        }
        Ok(())
    }

    /// The subtree made of the root and the drafted nodes in `keep` (any order; the root is always
    /// kept), in arena order, plus the old → new id map. Every kept node's parent must be kept.
    ///
    /// Dropping nodes after they were drafted is only exact for deterministic candidates: a sampled
    /// node's presence must not depend on draws made after it (see ALGORITHMS.md §2), so pruning
    /// a tree that holds sampled nodes is refused.
    pub fn retain(&self, keep: &[NodeId]) -> Result<(TokenTree, Vec<Option<NodeId>>)> {
        let mut kept = vec![false; self.nodes.len()];
        kept[ROOT] = true;
        for &k in keep {
            if k >= self.nodes.len() {
                return Err(Error::Invalid(format!(
                    "cannot keep node {k} of a {}-node tree",
                    self.nodes.len()
                )));
            }
            kept[k] = true;
        }
        let mut map = vec![None; self.nodes.len()];
        map[ROOT] = Some(ROOT);
        let mut out = TokenTree::new(self.nodes[ROOT].token);
        for (id, node) in self.nodes.iter().enumerate().skip(1) {
            if !matches!(node.draw, Draw::Deterministic) && kept.iter().any(|k| !k) {
                return Err(Error::BadDraftNode {
                    node: id,
                    reason: "a tree with sampled nodes cannot be pruned after drafting".into(),
                });
            }
            if !kept[id] {
                continue;
            }
            let parent = node
                .parent
                .and_then(|p| map[p])
                .ok_or(Error::Invalid(format!("kept node {id} has a parent that is not kept")))?;
            map[id] = Some(out.add(parent, node.token, node.draw.clone(), node.draft_prob)?);
        }
        Ok((out, map))
    }

    /// Build a tree from raw parent indices (`parents[0]` must be `None`), e.g. from a wire
    /// format or a test; every non-root node is a deterministic candidate.
    pub fn from_parents(tokens: &[TokenId], parents: &[Option<usize>]) -> Result<Self> {
        if tokens.is_empty() || tokens.len() != parents.len() {
            return Err(Error::Invalid("tokens and parents must be non-empty and of equal length".into()));
        }
        if parents[0].is_some() {
            return Err(Error::Invalid("node 0 is the root and has no parent".into()));
        }
        let mut tree = Self::new(tokens[0]);
        for i in 1..tokens.len() {
            let parent =
                parents[i].ok_or(Error::Invalid(format!("node {i} has no parent; only the root may")))?;
            if parent >= i {
                return Err(Error::BadParent { node: i, parent });
            }
            tree.add(parent, tokens[i], Draw::Deterministic, 1.0)?;
        }
        Ok(tree)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_keeps_an_arena_prefix_with_its_ids_and_refuses_sampled_trees() {
        let mut t = TokenTree::new(9);
        let a = t.add(ROOT, 1, Draw::Deterministic, 1.0).unwrap();
        let b = t.add(ROOT, 2, Draw::Deterministic, 1.0).unwrap();
        let c = t.add(a, 3, Draw::Deterministic, 1.0).unwrap();
        t.truncate(3).unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t.children(ROOT), &[a, b]);
        assert!(t.children(a).is_empty(), "node {c} is gone from its parent's children");
        assert_eq!(t.leaves(), vec![a, b]);
        t.truncate(0).unwrap();
        assert_eq!(t.len(), 1, "the root always stays");

        let q = Arc::new(Dist::from_weights(vec![0.5, 0.5]).unwrap());
        let mut s = TokenTree::new(0);
        s.add(ROOT, 1, Draw::Iid { q }, 0.5).unwrap();
        assert!(s.truncate(1).is_err());
        s.truncate(2).unwrap();
        assert_eq!(s.len(), 2, "cutting nothing is fine");
    }

    #[test]
    fn builds_paths_and_leaves() {
        let mut t = TokenTree::new(9);
        let a = t.add(ROOT, 1, Draw::Deterministic, 0.5).unwrap();
        let b = t.add(a, 2, Draw::Deterministic, 0.5).unwrap();
        let c = t.add(ROOT, 3, Draw::Deterministic, 0.2).unwrap();
        assert_eq!(t.path(b), vec![ROOT, a, b]);
        assert_eq!(t.path_tokens(b), vec![1, 2]);
        assert_eq!(t.leaves(), vec![b, c]);
        assert_eq!(t.node(b).depth, 2);
        assert_eq!(t.max_depth(), 2);
    }

    #[test]
    fn missing_parent_is_an_error() {
        let mut t = TokenTree::new(0);
        assert_eq!(t.add(5, 1, Draw::Deterministic, 1.0), Err(Error::BadParent { node: 1, parent: 5 }));
        assert!(TokenTree::from_parents(&[0, 1], &[None, Some(1)]).is_err());
        assert!(TokenTree::from_parents(&[0, 1], &[None, Some(3)]).is_err());
        assert!(TokenTree::from_parents(&[0, 1], &[Some(0), Some(0)]).is_err());
    }

    #[test]
    fn retain_keeps_an_ancestor_closed_subtree() {
        let mut t = TokenTree::new(9);
        let a = t.add(ROOT, 1, Draw::Deterministic, 0.5).unwrap();
        let b = t.add(ROOT, 2, Draw::Deterministic, 0.3).unwrap();
        let c = t.add(a, 3, Draw::Deterministic, 0.4).unwrap();
        let d = t.add(b, 4, Draw::Deterministic, 0.1).unwrap();
        let (r, map) = t.retain(&[c, a, b]).unwrap();
        assert_eq!(r.len(), 4);
        assert_eq!(map, vec![Some(0), Some(1), Some(2), Some(3), None]);
        assert_eq!(r.path_tokens(map[c].unwrap()), vec![1, 3]);
        assert_eq!(r.node(map[b].unwrap()).draft_prob, 0.3);
        assert!(t.retain(&[c]).is_err(), "c's parent a is dropped");
        assert!(t.retain(&[d + 1]).is_err());
        assert_eq!(t.retain(&[a, b, c, d]).unwrap().0, t);
        let q = Arc::new(Dist::from_weights(vec![1.0; 8]).unwrap());
        let mut s = TokenTree::new(0);
        let x = s.add(ROOT, 1, Draw::WithoutReplacement { q: q.clone() }, 0.5).unwrap();
        s.add(ROOT, 2, Draw::WithoutReplacement { q }, 0.5).unwrap();
        assert!(s.retain(&[x]).is_err(), "sampled trees cannot be pruned");
        assert!(s.retain(&[1, 2]).is_ok(), "keeping everything is not pruning");
    }

    #[test]
    fn without_replacement_siblings_must_share_q() {
        let q1 = Arc::new(Dist::from_weights(vec![1.0, 1.0]).unwrap());
        let q2 = Arc::new(Dist::from_weights(vec![1.0, 3.0]).unwrap());
        let mut t = TokenTree::new(0);
        t.add(ROOT, 0, Draw::WithoutReplacement { q: q1.clone() }, 0.5).unwrap();
        assert!(t.add(ROOT, 1, Draw::WithoutReplacement { q: q2 }, 0.5).is_err());
        assert!(t.add(ROOT, 1, Draw::WithoutReplacement { q: q1.clone() }, 0.5).is_ok());
        assert!(t.add(ROOT, 7, Draw::Iid { q: q1 }, 0.5).is_err());
    }
}
