//! The steps of one batched forward ([`LlamaBatchLm`]'s `BatchedLm::forward`), in order: make
//! room (compacting if need be), plan every lane's rows, copy the planned paths' KV cells, decode;
//! then book the step (prompt chunks committed, trees pending until `settle`) and lend the trees'
//! logits — or, when anything after planning began fails, roll the whole step back.
//!
//! Planning records what it did as it goes ([`StepPlan`]), so the rollback takes back exactly the
//! lanes planned before the failure.

use treespec_core::TokenId;
use treespec_engine::backend::{LaneId, LaneWork};
use treespec_engine::{EngineError, Logits, Result, TreeBatch};

use super::{kv_err, LaneSeq, LlamaBatchLm, Placed, SCRATCH};
use crate::kv::{PendingTree, Plan};
use crate::lm::{lend_rows, undo_plan};

/// Dead cells (cached prefixes past their keep) tolerated before a compaction moves them to
/// host memory, however many cells the kept ones hold: a compaction copies every kept cell
/// twice, so fewer dead cells than this wait until they outnumber the kept ones — or until
/// their rent says the compaction has paid ([`COMPACT_RENT`]).
const COMPACT_MIN_DEAD: usize = 1024;

/// A compaction pays once the dead cells, summed over the forwards since the last one, reach
/// this many times the cells it keeps (ski rental: pay rent until it matches the purchase; a
/// compaction copies each kept cell out and back). Dead cells cost more than their bytes:
/// llama.cpp's one-row attention gives each thread one slice of the occupied cells, and the
/// slice holding dead ones finishes early and waits. Measured (Qwen2.5-Coder-1.5B, 2 threads,
/// Zen 5, `treespec serve` answering one 1,260-token prompt again and again): each answer left
/// 128 dead cells behind (the unshared tail of the prefix the next request took over), and
/// decoding slowed from 32 to 27 tokens/s over five requests; compacting then (a threshold of 64
/// dead cells) held all five at 32, level with llama-server. With this rule those 128 cells go
/// after about 2 × 1,400 / 128 ≈ 22 forwards, and a busy server's larger kept set waits longer.
const COMPACT_RENT: u64 = 2;

/// What a forward has planned so far: what a failure must take back out, and, once decoded,
/// where the step's rows went.
#[derive(Debug, Default)]
pub(super) struct StepPlan {
    /// Each tree lane's plan (path copies, and how to undo them), in batch order.
    plans: Vec<(LaneId, Plan)>,
    /// Where each lane's rows go, in batch order.
    pub(super) placed: Vec<Placed>,
}

/// Rows a step feeds: every prompt chunk's tokens and every tree's nodes.
pub(super) fn step_rows(work: &[LaneWork<'_>]) -> usize {
    work.iter()
        .map(|w| match w {
            LaneWork::Prefill { tokens, .. } => tokens.len(),
            LaneWork::Tree { batch, .. } => batch.len(),
        })
        .sum()
}

/// Prompt chunks must come before the trees: `settle` keeps every row below the step's first
/// dropped tree row where it is, and prompt chunks are kept whole, so they must lie below every
/// tree row.
pub(super) fn check_prefills_first(work: &[LaneWork<'_>]) -> Result<()> {
    let first_tree = work.iter().position(|w| matches!(w, LaneWork::Tree { .. })).unwrap_or(work.len());
    if work[first_tree..].iter().any(|w| matches!(w, LaneWork::Prefill { .. })) {
        return Err(EngineError::State(
            "prompt chunks must come before the trees in a batched forward".into(),
        ));
    }
    Ok(())
}

/// Tree nodes of a step: a bound on the path ids its trees may take from the pool.
fn tree_nodes(work: &[LaneWork<'_>]) -> usize {
    work.iter().map(|w| if let LaneWork::Tree { batch, .. } = w { batch.len() } else { 0 }).sum()
}

/// Root-to-leaf paths of a tree batch (nodes with no child in it), at least one: the path ids
/// its plan takes from the pool.
fn leaves(batch: &TreeBatch) -> usize {
    let mut has_child = vec![false; batch.len()];
    batch.parents.iter().flatten().for_each(|&p| {
        if p < has_child.len() {
            has_child[p] = true
        }
    });
    has_child.iter().filter(|&&c| !c).count().max(1)
}

/// Every token of `tokens` is in the vocabulary: checked before anything is planned, so the
/// error names the token and no lane's state has changed yet.
fn check_vocab(tokens: &[TokenId], n_vocab: usize) -> Result<()> {
    match tokens.iter().find(|&&t| t as usize >= n_vocab) {
        Some(&t) => Err(EngineError::State(format!("token {t} is outside the vocabulary"))),
        None => Ok(()),
    }
}

/// The batch rows of a step, in `work` order: (token, position, sequence ids, logits wanted). A
/// prompt chunk's rows follow its lane's committed tokens on the lane's base sequence (and the
/// path ids of the lane's tree, when one rides the chunk), without logits; a tree's rows sit at
/// committed length + the lane's chunk + depth on the path ids its plan gave them, with logits.
/// Every lane must be open and every tree planned.
fn batch_rows<'a>(
    lanes: &'a [Option<LaneSeq>],
    work: &'a [LaneWork<'a>],
) -> impl Iterator<Item = (TokenId, usize, &'a [i32], bool)> + 'a {
    work.iter().flat_map(move |w| -> Box<dyn Iterator<Item = (TokenId, usize, &'a [i32], bool)> + 'a> {
        match *w {
            LaneWork::Prefill { lane, tokens } => {
                let l = lanes[lane].as_ref().expect("checked above");
                let committed = l.tokens.len();
                let seqs = l.chunk.seqs.as_slice();
                Box::new(tokens.iter().enumerate().map(move |(i, &t)| (t, committed + i, seqs, false)))
            }
            LaneWork::Tree { lane, batch } => {
                let l = lanes[lane].as_ref().expect("checked above");
                let committed = l.tokens.len() + l.chunk.len;
                let (tree, _) = l.tree.as_ref().expect("planned above");
                Box::new((0..batch.len()).map(move |i| {
                    let (depth, seqs) = tree.row(i);
                    (batch.tokens[i], committed + depth, seqs, true)
                }))
            }
        }
    })
}

impl LlamaBatchLm<'_> {
    /// Make room for a step of `rows` rows, or say why there is none. Compact when the cache is
    /// full, short of sequence ids, or holding dead cells (cached prefixes past their keep, see
    /// [`super::KEEP_CACHED_ROWS`]) more than [`COMPACT_MIN_DEAD`] or than the kept ones: every
    /// query scans the occupied cells, masked or not, and a slice of dead cells leaves a thread
    /// idle, so dead cells cost attention time on every step; the compaction moves them to host
    /// memory. When the lanes need the room or the ids, the oldest cached prefixes go first.
    pub(super) fn make_room(&mut self, work: &[LaneWork<'_>], rows: usize) -> Result<()> {
        let paths = tree_nodes(work);
        let kept = self.live_cells() + self.kept_cells();
        let dead = self.used - kept.min(self.used);
        self.dead_rent += dead as u64;
        if self.used + rows > self.n_ctx
            || paths > self.free_seqs.len()
            || dead > kept.min(COMPACT_MIN_DEAD)
            || (dead > 0 && self.dead_rent >= COMPACT_RENT * kept as u64)
        {
            let freed_ids = |b: &Self| b.cached.iter().filter(|c| !c.kept()).count();
            while (self.live_cells() + self.kept_cells() + rows > self.n_ctx
                || paths > self.free_seqs.len() + freed_ids(self))
                && self.give_up_oldest_cached()
            {}
            self.compact()?;
        }
        if self.used + rows > self.n_ctx {
            return Err(EngineError::InvalidRequest(format!(
                "a forward of {rows} rows does not fit the {} free cells of the {}-cell context",
                self.n_ctx - self.used,
                self.n_ctx
            )));
        }
        Ok(())
    }

    /// Plan, copy, decode. Each step records in `step` what it did before it can fail, so that
    /// the caller can roll back whatever of it happened.
    pub(super) fn plan_and_decode(
        &mut self,
        work: &[LaneWork<'_>],
        rows: usize,
        step: &mut StepPlan,
    ) -> Result<()> {
        self.plan_rows(work, step)?;
        self.copy_planned_kv(&step.plans)?;
        let token = batch_rows(&self.lanes, work).next().map_or(0, |r| r.0);
        let n = self.padding.plan(rows, self.used, self.n_ctx, SCRATCH, &self.free_seqs, token);
        let rows = batch_rows(&self.lanes, work).chain(self.padding.rows());
        let decoded = self.batch.decode(&mut self.ctx, self.n_ctx, n, rows);
        let removed = self.padding.remove(&mut self.ctx);
        decoded.and(removed)
    }

    /// Plan every lane's rows in batch order: prompt chunks on the lane's base sequence, trees on
    /// path ids from the pool, after the lane's chunk when it feeds one too (the chunk's rows then
    /// carry the tree's path ids as well). Stops at the first bad lane; what was planned before it
    /// stays in `step` for the rollback.
    fn plan_rows(&mut self, work: &[LaneWork<'_>], step: &mut StepPlan) -> Result<()> {
        for l in self.lanes.iter_mut().flatten() {
            // Reused every step: no allocation on the decode path.
            l.chunk.len = 0;
            l.chunk.seqs.clear();
            l.chunk.seqs.push(l.seq);
        }
        let mut start = 0;
        for w in work {
            let (lane, rows, tree) = match *w {
                LaneWork::Prefill { lane, tokens } => {
                    check_vocab(tokens, self.n_vocab)?;
                    self.lane_mut(lane)?.chunk.len += tokens.len();
                    (lane, tokens.len(), false)
                }
                LaneWork::Tree { lane, batch } => {
                    let plan = self.plan_tree(lane, batch)?;
                    step.plans.push((lane, plan));
                    let l = self.lane_mut(lane)?;
                    if l.chunk.len > 0 {
                        let ids = l.tree.as_ref().map(|(t, _)| t.ids().to_vec()).unwrap_or_default();
                        l.chunk.seqs.extend(ids);
                    }
                    (lane, batch.len(), true)
                }
            };
            step.placed.push(Placed { lane, start, rows, tree });
            start += rows;
        }
        Ok(())
    }

    /// Plan one lane's tree on path ids taken from the pool (one per leaf), and keep the tree in
    /// the lane for `commit` and `settle`. On error the ids go back to the pool.
    fn plan_tree(&mut self, lane: LaneId, batch: &TreeBatch) -> Result<Plan> {
        let leaves = leaves(batch);
        if leaves > self.free_seqs.len() {
            return Err(EngineError::InvalidRequest("no sequence ids left for the step's trees".into()));
        }
        check_vocab(&batch.tokens, self.n_vocab)?;
        let ids: Vec<i32> = (0..leaves).filter_map(|_| self.free_seqs.pop()).collect();
        let (base, committed) = match self.lane(lane) {
            Ok(l) => (l.seq, l.tokens.len() + l.chunk.len),
            Err(e) => {
                self.free_seqs.extend(ids);
                return Err(e);
            }
        };
        let mut tree = PendingTree::with_ids(base, ids);
        match tree.extend(batch, committed) {
            Ok(plan) => {
                if let Ok(l) = self.lane_mut(lane) {
                    l.tree = Some((tree, batch.tokens.clone()));
                }
                Ok(plan)
            }
            Err(e) => {
                self.free_seqs.extend(tree.ids());
                Err(e)
            }
        }
    }

    /// Apply the plans' KV copies (each new path joins the cells of the prefix and ancestors it
    /// sits on) before the decode, which needs them. Every copy is tried even after one fails,
    /// and the last failure is reported: the rollback takes them all back out either way.
    fn copy_planned_kv(&mut self, plans: &[(LaneId, Plan)]) -> Result<()> {
        let mut result = Ok(());
        for c in plans.iter().flat_map(|(_, plan)| &plan.copies) {
            if let Err(e) = self.ctx.copy_kv_cache_seq(c.src, c.dst, None, Some(c.end as u32)) {
                result = Err(kv_err("KV cache copy failed", e));
            }
        }
        result
    }

    /// Take a failed step back out (best effort: the step's error is what gets reported): every
    /// planned path leaves the cache and its ids go back to the pool, every prompt chunk's rows
    /// leave its lane's base sequence, and, whatever llama.cpp left behind, a compaction restores
    /// the no-holes invariant by rewriting the lanes.
    pub(super) fn roll_back(&mut self, step: &StepPlan) {
        for (lane, plan) in &step.plans {
            undo_plan(&mut self.ctx, plan);
            if let Some((tree, _)) = self.lane_mut(*lane).ok().and_then(|l| l.tree.take()) {
                self.free_seqs.extend(tree.ids());
            }
        }
        for p in step.placed.iter().filter(|p| !p.tree) {
            if let Ok(l) = self.lane(p.lane) {
                let (seq, from) = (l.seq, l.tokens.len());
                let _ = self.seq_rm(seq, Some(from), None);
            }
        }
        let _ = self.compact();
    }

    /// Book a decoded step: its rows now fill the cells above `used`; prompt chunks are committed
    /// at once (nothing to verify), trees stay pending until `settle`, which needs `placed`.
    pub(super) fn book_step(&mut self, work: &[LaneWork<'_>], rows: usize, placed: Vec<Placed>) {
        for w in work {
            if let LaneWork::Prefill { lane, tokens } = *w {
                if let Ok(l) = self.lane_mut(lane) {
                    l.tokens.extend_from_slice(tokens);
                    l.chunk.len = 0;
                }
            }
        }
        self.used += rows;
        self.charge_cached(rows);
        self.counters.forwards += 1;
        self.counters.rows += rows as u64;
        self.counters.graph_reuses = self.batch.reuses;
        self.placed = placed;
    }

    /// The logits of the booked step's tree rows (prompt chunks ask for none), lent from
    /// llama.cpp's output buffer.
    pub(super) fn lend_tree_rows(&self) -> Logits<'_> {
        let wanted: Vec<bool> =
            self.placed.iter().flat_map(|p| std::iter::repeat_n(p.tree, p.rows)).collect();
        lend_rows(&self.ctx, self.n_vocab, &wanted).with_graph_reused(self.batch.reused)
    }
}
