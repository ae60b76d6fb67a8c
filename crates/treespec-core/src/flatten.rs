//! Flattening a token tree into one verify batch.
//!
//! The target scores every node of a step in ONE forward pass. A backend needs, per row: the
//! token, its rotary position (`prefix_len + depth`), which earlier rows it may attend to (its
//! ancestors and itself, on top of the whole committed prefix), and — for KV caches that key
//! attention by sequence — the root-to-leaf paths, each of which becomes one sequence id.

use crate::tree::TokenTree;
use crate::TokenId;

/// One verify batch, rows in the tree's arena order (parents before children).
#[derive(Debug, Clone, PartialEq)]
pub struct FlatTree {
    /// Token of each row.
    pub tokens: Vec<TokenId>,
    /// Rotary position of each row: `prefix_len + depth`.
    pub positions: Vec<usize>,
    /// Parent row of each row (`None` for the root, which attaches to the committed prefix).
    pub parents: Vec<Option<usize>>,
    /// Depth of each row (root = 0).
    pub depths: Vec<usize>,
    /// For each row, the rows it may attend to: its root path, root first, itself last.
    pub ancestors: Vec<Vec<usize>>,
    /// Every root-to-leaf path (one per leaf, in arena order of the leaves).
    pub leaf_paths: Vec<Vec<usize>>,
}

impl FlatTree {
    /// Flatten `tree` to sit on top of a committed prefix of `prefix_len` tokens.
    pub fn new(tree: &TokenTree, prefix_len: usize) -> Self {
        let n = tree.len();
        let mut tokens = Vec::with_capacity(n);
        let mut positions = Vec::with_capacity(n);
        let mut parents = Vec::with_capacity(n);
        let mut depths = Vec::with_capacity(n);
        let mut ancestors: Vec<Vec<usize>> = Vec::with_capacity(n);
        for (i, node) in tree.nodes().iter().enumerate() {
            tokens.push(node.token);
            positions.push(prefix_len + node.depth);
            parents.push(node.parent);
            depths.push(node.depth);
            let mut anc = match node.parent {
                Some(p) => ancestors[p].clone(),
                None => Vec::with_capacity(1),
            };
            anc.push(i);
            ancestors.push(anc);
        }
        let leaf_paths = tree.leaves().into_iter().map(|l| ancestors[l].clone()).collect();
        Self { tokens, positions, parents, depths, ancestors, leaf_paths }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Never true for a flattened tree (the root is a row).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// For each row, the indices of the leaf paths that contain it: the sequence ids a
    /// sequence-keyed KV cache gives that row (a shared node carries all of them).
    pub fn row_paths(&self) -> Vec<Vec<usize>> {
        let mut out = vec![Vec::new(); self.len()];
        for (p, path) in self.leaf_paths.iter().enumerate() {
            for &row in path {
                out[row].push(p);
            }
        }
        out
    }

    /// Whether row `i` may attend to row `j` of the batch.
    pub fn attends(&self, i: usize, j: usize) -> bool {
        // Ancestor rows are exactly the root path, whose depths are 0..=depth(i).
        j <= i && self.ancestors[i].get(self.depths[j]) == Some(&j)
    }

    /// Additive `len × len` attention mask over the batch rows, row-major: 0 where row i may
    /// attend to row j, −inf elsewhere. The committed prefix (not included) is visible to all.
    pub fn additive_mask(&self) -> Vec<f32> {
        let n = self.len();
        let mut mask = vec![f32::NEG_INFINITY; n * n];
        for (i, anc) in self.ancestors.iter().enumerate() {
            for &j in anc {
                mask[i * n + j] = 0.0;
            }
        }
        mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{Draw, ROOT};

    /// root(7) ─ a(1) ─ b(2)
    ///         └ c(3)
    #[test]
    fn small_tree_layout() {
        let mut t = TokenTree::new(7);
        let a = t.add(ROOT, 1, Draw::Deterministic, 1.0).unwrap();
        t.add(a, 2, Draw::Deterministic, 1.0).unwrap();
        t.add(ROOT, 3, Draw::Deterministic, 1.0).unwrap();
        let f = FlatTree::new(&t, 10);
        assert_eq!(f.tokens, vec![7, 1, 2, 3]);
        assert_eq!(f.positions, vec![10, 11, 12, 11]);
        assert_eq!(f.leaf_paths, vec![vec![0, 1, 2], vec![0, 3]]);
        assert_eq!(f.row_paths(), vec![vec![0, 1], vec![0], vec![0], vec![1]]);
        let ninf = f32::NEG_INFINITY;
        #[rustfmt::skip]
        let expect = vec![
            0.0, ninf, ninf, ninf,
            0.0, 0.0,  ninf, ninf,
            0.0, 0.0,  0.0,  ninf,
            0.0, ninf, ninf, 0.0,
        ];
        assert_eq!(f.additive_mask(), expect);
        assert!(f.attends(2, 1) && !f.attends(3, 1) && !f.attends(1, 2));
    }
}
