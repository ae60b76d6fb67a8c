//! Sequence-id bookkeeping for token trees in llama.cpp's unified KV cache.
//!
//! llama.cpp has no tree attention, but its unified KV cache gives every cell a *set* of sequence
//! ids, and a query token attends to the cells that share its first sequence id and sit at a
//! position no later than its own. So a tree becomes: one sequence id per root-to-leaf path, every
//! node carrying the ids of all paths through it, the committed prefix carrying them all, and
//! position = committed length + depth. A query on a path then sees exactly the prefix and its own
//! ancestors.
//!
//! Sequence [`BASE_SEQ`] holds the committed prefix and nothing else; paths use ids from 1. When a
//! node gets its first child, the child continues the node's path (same id). Any further child
//! opens a new path: a fresh id that the child, all its ancestors and the prefix join. Ancestors
//! already in the cache join through `seq_cp` (metadata only in a unified cache); ancestors in the
//! same batch just list the id. This also keeps llama.cpp's batch checks happy: each sequence's
//! new positions continue right after its last cached position, and sequences sharing a batch
//! token have identical cached ranges.
//!
//! This module only plans; `lm.rs` applies the plan to the context.

use treespec_engine::{EngineError, Result, TreeBatch};

/// Sequence id of the committed prefix.
pub(crate) const BASE_SEQ: i32 = 0;

/// A pending (fed, uncommitted) node.
#[derive(Debug, Clone)]
struct Node {
    parent: Option<usize>,
    depth: usize,
    /// Ids of the paths through this node; exactly one while it is a leaf.
    seqs: Vec<i32>,
    children: usize,
}

/// `seq_cp(src, dst, p0 = 0, p1 = end)`: `dst` joins every cell of `src` before position `end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SeqCopy {
    pub src: i32,
    pub dst: i32,
    pub end: usize,
}

/// How to take a failed batch back out of the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Undo {
    /// A path opened by the batch: remove the id from every cell.
    DropSeq(i32),
    /// A cached leaf's path extended by the batch: remove the id from positions `from..`.
    TrimSeq { seq: i32, from: usize },
}

/// What `forward` must do, in order: copies, then one decode of the batch's nodes (each row's
/// position and sequence ids from [`PendingTree::row`]); `undo` on failure.
#[derive(Debug, Clone, Default)]
pub(crate) struct Plan {
    pub copies: Vec<SeqCopy>,
    pub undo: Vec<Undo>,
}

/// The pending tree and its path ids.
#[derive(Debug, Clone)]
pub(crate) struct PendingTree {
    nodes: Vec<Node>,
    /// The sequence of the committed prefix the tree sits on.
    base: i32,
    /// Every path id the tree may use, largest first.
    ids: Vec<i32>,
    /// Unused path ids, largest first so `pop` hands out the smallest.
    free: Vec<i32>,
}

impl PendingTree {
    /// An empty tree on [`BASE_SEQ`] allowing up to `max_paths` simultaneous root-to-leaf paths
    /// (ids `1..=max_paths`).
    pub fn new(max_paths: usize) -> Self {
        Self::with_ids(BASE_SEQ, (1..=max_paths as i32).collect())
    }

    /// An empty tree on the prefix in sequence `base`, whose paths use the ids `ids` (a lane of
    /// a batched context gets them from the context's pool for one step).
    pub fn with_ids(base: i32, mut ids: Vec<i32>) -> Self {
        ids.sort_unstable_by(|a, b| b.cmp(a));
        let mut t = Self { nodes: Vec::new(), base, free: Vec::new(), ids };
        t.clear();
        t
    }

    /// The path ids this tree may use.
    pub fn ids(&self) -> &[i32] {
        &self.ids
    }

    /// Let the tree use `more` path ids too (a lane of a shared draft context borrows them from
    /// the context's pool for one forward).
    pub fn grant(&mut self, more: impl IntoIterator<Item = i32>) {
        for id in more {
            self.ids.push(id);
            self.free.push(id);
        }
        self.ids.sort_unstable_by(|a, b| b.cmp(a));
        self.free.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// Give back every path id no pending node uses.
    pub fn reclaim(&mut self) -> Vec<i32> {
        let unused = std::mem::take(&mut self.free);
        self.ids.retain(|id| !unused.contains(id));
        unused
    }

    /// Drop every pending node and recycle all path ids.
    pub fn clear(&mut self) {
        self.nodes.clear();
        self.free = self.ids.clone();
    }

    /// Number of pending nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The path ids no pending node uses.
    pub fn unused_ids(&self) -> &[i32] {
        &self.free
    }

    /// Number of paths (leaves) in use.
    pub fn paths(&self) -> usize {
        self.ids.len() - self.free.len()
    }

    fn alloc(&mut self, needed_paths: usize) -> Result<i32> {
        self.free.pop().ok_or_else(|| {
            EngineError::InvalidRequest(format!(
                "the pending tree would have more than {} root-to-leaf paths (n_seq_max); load the \
                 model with a larger n_seq_max or feed a narrower tree (at least {needed_paths} needed)",
                self.ids.len()
            ))
        })
    }

    /// Add `batch` on top of `committed` committed tokens and return the plan to feed it; the
    /// batch's nodes are the last `batch.len()` pending nodes. On error nothing changes; if the
    /// plan cannot be applied, [`rollback`](Self::rollback) takes the batch back out.
    pub fn extend(&mut self, batch: &TreeBatch, committed: usize) -> Result<Plan> {
        let n = batch.tokens.len();
        if batch.parents.len() != n || batch.logits.len() != n {
            return Err(EngineError::State(format!(
                "malformed TreeBatch: {} tokens, {} parents, {} logits flags",
                n,
                batch.parents.len(),
                batch.logits.len()
            )));
        }
        let base = self.nodes.len();
        let mut plan = Plan::default();
        if let Err(e) = self.add_nodes(batch, committed, &mut plan) {
            self.rollback(base, &plan);
            return Err(e);
        }
        Ok(plan)
    }

    fn add_nodes(&mut self, batch: &TreeBatch, committed: usize, plan: &mut Plan) -> Result<()> {
        let base = self.nodes.len();
        for (i, &parent) in batch.parents.iter().enumerate() {
            let idx = base + i;
            let (depth, seqs) = match parent {
                Some(p) if p >= idx => {
                    return Err(EngineError::State(format!(
                        "node {idx} names parent {p}, which is not an earlier pending node"
                    )));
                }
                None => {
                    let s = self.alloc(self.paths() + 1)?;
                    plan.copies.push(SeqCopy { src: self.base, dst: s, end: committed });
                    plan.undo.push(Undo::DropSeq(s));
                    (0, vec![s])
                }
                Some(p) => {
                    let depth = self.nodes[p].depth + 1;
                    let seqs = if self.nodes[p].children == 0 {
                        // Continue the parent's path.
                        debug_assert_eq!(self.nodes[p].seqs.len(), 1, "a leaf is on exactly one path");
                        if p < base {
                            plan.undo
                                .push(Undo::TrimSeq { seq: self.nodes[p].seqs[0], from: committed + depth });
                        }
                        self.nodes[p].seqs.clone()
                    } else {
                        // Open a new path: cached ancestors join by copy, batch ancestors by listing.
                        let s = self.alloc(self.paths() + 1)?;
                        plan.undo.push(Undo::DropSeq(s));
                        plan.copies.push(SeqCopy {
                            src: self.nodes[p].seqs[0],
                            dst: s,
                            end: committed + depth,
                        });
                        let mut a = Some(p);
                        while let Some(k) = a {
                            self.nodes[k].seqs.push(s);
                            a = self.nodes[k].parent;
                        }
                        vec![s]
                    };
                    self.nodes[p].children += 1;
                    (depth, seqs)
                }
            };
            self.nodes.push(Node { parent, depth, seqs, children: 0 });
        }
        Ok(())
    }

    /// Take back out the nodes from `base` on, added by the `extend` that returned `plan`: the
    /// paths it opened go back to the free ids and leave the older nodes, whose child counts are
    /// recounted. The tree is then exactly as before that `extend`.
    pub fn rollback(&mut self, base: usize, plan: &Plan) {
        let opened: Vec<i32> = plan
            .undo
            .iter()
            .filter_map(|u| match *u {
                Undo::DropSeq(s) => Some(s),
                Undo::TrimSeq { .. } => None,
            })
            .collect();
        self.nodes.truncate(base);
        for node in &mut self.nodes {
            node.seqs.retain(|s| !opened.contains(s));
            node.children = 0;
        }
        for i in 0..self.nodes.len() {
            if let Some(p) = self.nodes[i].parent {
                self.nodes[p].children += 1;
            }
        }
        // `free` is always sorted largest first (ids are only popped from its end).
        self.free.extend(opened);
        self.free.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// Depth and sequence ids of pending node `idx`: its batch row sits at position
    /// `committed + depth` and carries those ids.
    pub fn row(&self, idx: usize) -> (usize, &[i32]) {
        let node = &self.nodes[idx];
        (node.depth, &node.seqs)
    }

    /// Check that `path` is a chain from a root-attached node and return the id of a path through
    /// its last node (whose cells at the path's positions are exactly the path's nodes).
    pub fn path_seq(&self, path: &[usize]) -> Result<Option<i32>> {
        let mut prev: Option<usize> = None;
        for (k, &idx) in path.iter().enumerate() {
            let node = self.nodes.get(idx).ok_or_else(|| {
                EngineError::State(format!(
                    "commit path names node {idx}, but only {} are pending",
                    self.nodes.len()
                ))
            })?;
            if node.parent != prev {
                return Err(EngineError::State(match prev {
                    None => format!("commit path must start at a root-attached node; node {idx} is not"),
                    Some(p) => format!(
                        "commit path is not a chain: node {idx} (step {k}) is not a child of node {p}"
                    ),
                }));
            }
            prev = Some(idx);
        }
        Ok(prev.map(|last| self.nodes[last].seqs[0]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(parents: &[Option<usize>]) -> TreeBatch {
        TreeBatch {
            tokens: (0..parents.len() as u32).collect(),
            parents: parents.to_vec(),
            logits: vec![true; parents.len()],
        }
    }

    #[test]
    fn chain_uses_one_path() {
        let mut t = PendingTree::new(4);
        let plan = t.extend(&batch(&[None, Some(0), Some(1)]), 5).unwrap();
        assert_eq!(plan.copies, vec![SeqCopy { src: 0, dst: 1, end: 5 }]);
        assert_eq!((0..3).map(|i| 5 + t.row(i).0).collect::<Vec<_>>(), vec![5, 6, 7]);
        assert!((0..3).all(|i| t.row(i).1 == [1]));
        assert_eq!(t.paths(), 1);
    }

    #[test]
    fn branching_in_one_batch_lists_new_path_on_ancestors() {
        // A; B, C under A; D beside A.
        let mut t = PendingTree::new(4);
        let plan = t.extend(&batch(&[None, Some(0), Some(0), None]), 3).unwrap();
        assert_eq!(t.row(0).1, [1, 2]);
        assert_eq!(t.row(1).1, [1]);
        assert_eq!(t.row(2).1, [2]);
        assert_eq!(t.row(3).1, [3]);
        assert_eq!(
            plan.copies,
            vec![
                SeqCopy { src: 0, dst: 1, end: 3 },
                SeqCopy { src: 1, dst: 2, end: 4 },
                SeqCopy { src: 0, dst: 3, end: 3 }
            ]
        );
    }

    #[test]
    fn branching_under_cached_node_copies_its_path() {
        let mut t = PendingTree::new(4);
        t.extend(&batch(&[None, Some(0)]), 2).unwrap();
        // Second call: child under node 1 (a leaf: continues path 1), and under node 0 (branched).
        let plan = t.extend(&batch(&[Some(1), Some(0)]), 2).unwrap();
        assert_eq!(t.row(2), (2, &[1][..]));
        assert_eq!(t.row(3), (1, &[2][..]));
        assert_eq!(plan.copies, vec![SeqCopy { src: 1, dst: 2, end: 3 }]);
        assert_eq!(plan.undo, vec![Undo::TrimSeq { seq: 1, from: 4 }, Undo::DropSeq(2)]);
        assert_eq!(t.path_seq(&[0, 3]).unwrap(), Some(2));
        assert_eq!(t.path_seq(&[0, 1, 2]).unwrap(), Some(1));
    }

    #[test]
    fn too_many_paths_is_an_error() {
        let mut t = PendingTree::new(2);
        let err = t.extend(&batch(&[None, None, None]), 0).unwrap_err();
        assert!(err.to_string().contains("more than 2"), "{err}");
    }

    #[test]
    fn bad_parent_and_bad_path_are_errors() {
        let mut t = PendingTree::new(2);
        assert!(t.clone().extend(&batch(&[Some(0)]), 0).is_err());
        t.extend(&batch(&[None, Some(0), None]), 0).unwrap();
        assert!(t.path_seq(&[1]).is_err());
        assert!(t.path_seq(&[0, 2]).is_err());
        assert!(t.path_seq(&[0, 9]).is_err());
        assert_eq!(t.path_seq(&[]).unwrap(), None);
    }

    #[test]
    fn clear_recycles_ids() {
        let mut t = PendingTree::new(2);
        t.extend(&batch(&[None, None]), 0).unwrap();
        t.clear();
        t.extend(&batch(&[None, None]), 0).unwrap();
        assert_eq!(t.row(0).1, [1]);
        assert_eq!(t.row(1).1, [2]);
    }

    /// A failed extend, and a rollback after a good one, leave the tree exactly as it was.
    #[test]
    fn failed_extend_and_rollback_restore_the_tree() {
        let mut t = PendingTree::new(3);
        t.extend(&batch(&[None, Some(0), Some(0)]), 4).unwrap();
        let before = format!("{t:?}");
        // Two more paths under node 1 and beside: the third path id runs out on the second.
        assert!(t.extend(&batch(&[Some(1), Some(1), None]), 4).is_err());
        assert_eq!(format!("{t:?}"), before);
        assert!(t.extend(&batch(&[Some(9)]), 4).is_err());
        assert_eq!(format!("{t:?}"), before);
        let plan = t.extend(&batch(&[Some(1), Some(0)]), 4).unwrap();
        assert_ne!(format!("{t:?}"), before);
        t.rollback(3, &plan);
        assert_eq!(format!("{t:?}"), before);
    }
}
