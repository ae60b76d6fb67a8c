//! Keeping a draft model's KV cache in step with the target.
//!
//! The draft keeps its cache for accepted tokens instead of re-feeding them every step (the
//! re-feed costs llama.cpp's drafter an extra draft pass per step). Tokens the draft has not
//! consumed yet — the bonus token, and accepted leaves it never ran — wait in `unfed` and are fed
//! as a chain in the first forward of the next step, whose last row gives the root's distribution.

use treespec_core::tree::{NodeId, TokenTree};
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;

use crate::backend::{CausalLm, Logits, TreeBatch};
use crate::error::{EngineError, Result};

/// A draft model plus the bookkeeping that maps tree nodes to its pending nodes.
pub struct DraftModel<M: CausalLm> {
    model: M,
    unfed: Vec<TokenId>,
    /// For each node of the tree being drafted: its pending index in the draft model, if fed.
    fed: Vec<Option<usize>>,
    forwards: u64,
    /// (rows, ms) of every forward since the last `take_timings`, for cost-aware drafters.
    timings: Vec<(usize, f64)>,
}

impl<M: CausalLm> DraftModel<M> {
    /// Wrap a draft model.
    pub fn new(model: M) -> Self {
        Self { model, unfed: Vec::new(), fed: Vec::new(), forwards: 0, timings: Vec::new() }
    }

    /// The wrapped model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// Forward calls made since `begin`.
    pub fn forwards(&self) -> u64 {
        self.forwards
    }

    /// Reset and consume all prompt tokens but the last, which becomes the first root.
    pub fn begin(&mut self, prompt: &[TokenId]) -> Result<()> {
        let (last, head) = prompt.split_last().ok_or(EngineError::EmptyPrompt)?;
        self.model.truncate(0)?;
        self.model.prefill(head)?;
        self.unfed = vec![*last];
        self.fed.clear();
        self.forwards = 0;
        self.timings.clear();
        Ok(())
    }

    /// Start a step: feed the unfed chain and return the root's logits row (row 0), borrowed
    /// from the draft model's output until its next call, like [`feed`](Self::feed)'s rows: a
    /// drafter reads the rows of one forward before it makes the next, and copies none.
    pub fn start_step(&mut self) -> Result<Logits<'_>> {
        if self.unfed.is_empty() {
            return Err(EngineError::State("draft has no root to feed".into()));
        }
        let batch = TreeBatch::chain(&self.unfed, None, 0, true);
        let logits = timed_forward(&mut self.model, &mut self.forwards, &mut self.timings, &batch)?;
        self.fed = vec![Some(self.unfed.len() - 1)];
        Ok(logits)
    }

    /// Feed tree nodes `nodes` (each's parent already fed) in one forward; returns their logits
    /// rows in the same order, borrowed from the draft model's output until its next call.
    pub fn feed(&mut self, tree: &TokenTree, nodes: &[NodeId]) -> Result<Logits<'_>> {
        if self.fed.len() < tree.len() {
            self.fed.resize(tree.len(), None);
        }
        let base = self.model.pending_len();
        let mut batch = TreeBatch::default();
        for (i, &n) in nodes.iter().enumerate() {
            let parent =
                tree.node(n).parent.ok_or_else(|| EngineError::State("cannot feed the root".into()))?;
            let parent_idx = self.fed[parent]
                .ok_or_else(|| EngineError::State(format!("parent {parent} of node {n} not fed")))?;
            batch.push(tree.node(n).token, Some(parent_idx), true);
            self.fed[n] = Some(base + i);
        }
        self.forward(&batch)
    }

    /// Commit the accepted path: keep the fed prefix of it, queue the rest plus the bonus.
    pub fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) -> Result<()> {
        let chain_len = self.fed.first().copied().flatten().map(|r| r + 1).unwrap_or(0);
        let mut keep: Vec<usize> = (0..chain_len).collect();
        let mut unfed = Vec::new();
        for &n in &outcome.accepted {
            match (unfed.is_empty(), self.fed.get(n).copied().flatten()) {
                (true, Some(idx)) => keep.push(idx),
                _ => unfed.push(tree.node(n).token),
            }
        }
        unfed.push(outcome.bonus());
        if chain_len == 0 {
            // The step never started (nothing fed): everything is still unfed.
            let mut all = std::mem::take(&mut self.unfed);
            all.extend(unfed);
            self.unfed = all;
            self.model.commit(&[])?;
        } else {
            self.model.commit(&keep)?;
            self.unfed = unfed;
        }
        self.fed.clear();
        Ok(())
    }

    /// Rows and milliseconds of the forwards made since the last call.
    pub fn take_timings(&mut self) -> Vec<(usize, f64)> {
        std::mem::take(&mut self.timings)
    }

    /// Tokens waiting to be fed at the start of the next step (accepted leaves and the bonus).
    pub fn unfed_len(&self) -> usize {
        self.unfed.len()
    }

    /// Follow a pruning of the tree being drafted: `map[old] = new` node id (`None` = dropped).
    /// Dropped nodes' draft cells are discarded at the next `observe`, as every unaccepted one is.
    pub fn remap(&mut self, map: &[Option<NodeId>]) {
        let mut fed = vec![None; map.iter().flatten().count()];
        for (old, new) in map.iter().enumerate() {
            if let (Some(new), Some(f)) = (new, self.fed.get(old).copied().flatten()) {
                fed[*new] = Some(f);
            }
        }
        self.fed = fed;
    }

    fn forward(&mut self, batch: &TreeBatch) -> Result<Logits<'_>> {
        timed_forward(&mut self.model, &mut self.forwards, &mut self.timings, batch)
    }
}

/// The [`Drafter`](crate::Drafter) methods of a drafter over a [`DraftModel`] field that only
/// forward to it: `draft_forwards` (its forward count) and, with `observe`, `observe` (commit the
/// accepted path), for drafters that learn nothing else from an outcome. Use inside the
/// `impl Drafter` block: `forward_to_draft_model!(draft, observe);`.
macro_rules! forward_to_draft_model {
    ($field:ident) => {
        fn draft_forwards(&self) -> u64 {
            self.$field.forwards()
        }
    };
    ($field:ident, observe) => {
        forward_to_draft_model!($field);

        fn observe(
            &mut self,
            tree: &::treespec_core::tree::TokenTree,
            outcome: &::treespec_core::verify::VerifyOutcome,
        ) -> $crate::error::Result<()> {
            self.$field.observe(tree, outcome)
        }
    };
}
pub(crate) use forward_to_draft_model;

/// One counted, timed draft forward (split from `DraftModel` so the returned rows borrow only
/// the model, not the bookkeeping).
fn timed_forward<'m, M: CausalLm>(
    model: &'m mut M,
    forwards: &mut u64,
    timings: &mut Vec<(usize, f64)>,
    batch: &TreeBatch,
) -> Result<Logits<'m>> {
    *forwards += 1;
    let t = std::time::Instant::now();
    let out = model.forward(batch);
    if timings.len() < 256 {
        // Bounded: drafters that never read timings must not grow this without limit.
        timings.push((batch.len(), t.elapsed().as_secs_f64() * 1e3));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toy::{ToyLm, ToyModel};
    use treespec_core::tree::{Draw, ROOT};

    /// After every observe, the draft's committed tokens plus its unfed queue must spell the
    /// whole history, whatever was accepted.
    #[test]
    fn draft_cache_tracks_history() {
        let m = ToyModel::new(8, 2, 1);
        let mut d = DraftModel::new(ToyLm::new(m, 64));
        let mut history = vec![1, 2, 3];
        d.begin(&history).unwrap();
        for step in 0..6usize {
            d.start_step().unwrap();
            let mut tree = TokenTree::new(*history.last().unwrap());
            let a = tree.add(ROOT, 4, Draw::Deterministic, 1.0).unwrap();
            d.feed(&tree, &[a]).unwrap();
            let b = tree.add(a, 5, Draw::Deterministic, 1.0).unwrap();
            let accepted = match step % 3 {
                0 => vec![],
                1 => vec![a],
                _ => vec![a, b],
            };
            let mut tokens: Vec<u32> = accepted.iter().map(|&n| tree.node(n).token).collect();
            tokens.push(6);
            let outcome = VerifyOutcome { accepted, tokens: tokens.clone(), depths: vec![] };
            d.observe(&tree, &outcome).unwrap();
            history.extend(tokens);
            let mut spelled = d.model().committed().to_vec();
            spelled.extend(&d.unfed);
            assert_eq!(spelled, history, "step {step}");
        }
    }
}
