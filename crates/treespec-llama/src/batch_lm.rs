//! [`LlamaBatchLm`]: one llama.cpp context serving many lanes (requests) at once, behind the
//! engine's [`BatchedLm`]: every step is ONE `llama_decode` holding every lane's prompt chunk and
//! draft tree.
//!
//! Each lane owns a base sequence id (its committed tokens); its tree paths take ids from a pool
//! shared by every lane for one step (`kv.rs` plans them exactly as for a lone context, on the
//! lane's base). So a lane's rows attend to its own prefix and its own tree only.
//!
//! Exactness needs more than that. Attention sums a query's KV cells in cell-index order (see
//! `lm.rs`), so a lane's cells must stay in position order whatever the other lanes do. This
//! context keeps one invariant: at every step boundary the occupied cells are exactly
//! `0..used` — no holes — so llama.cpp puts a forward's rows, in batch order, into
//! `used..used + rows`. Prompt chunks and single-row trees come first in a step (all kept), then
//! the multi-row trees. `settle` keeps each lane's accepted path: rows before the first dropped
//! row stay where they are; the kept rows above it are saved (`state_seq_get`, a few KB per
//! token), every row of the step's paths is freed, and the saved rows are restored right above,
//! in lane order. A finished lane's cells stay (a cached prefix a later request may reuse); when
//! the cache runs out of room or sequence ids, a compaction evicts the cached prefixes and
//! rewrites every live lane contiguously. Both moves keep each lane's cells in position order.

use llama_cpp_2::context::session::{LlamaStateSeqFlags, SeqState};
use llama_cpp_2::context::LlamaContext;

use treespec_core::TokenId;
use treespec_engine::batched::{BatchRoom, BatchedLm, LaneId, LaneWork};
use treespec_engine::{EngineError, Logits, Result};

use crate::backend;
use crate::kv::{PendingTree, Plan};
use crate::lm::{backend_err, lend_rows, seq_rm, undo_plan, BatchBuf};
use crate::load::LlamaModel;

/// llama.cpp's limit on sequence ids in one context.
pub(crate) const SEQ_IDS: usize = 256;

/// One lane: a request's sequence.
#[derive(Debug)]
struct LaneSeq {
    /// Its base sequence id.
    seq: i32,
    /// Its committed tokens (the cells of `seq`, in position order).
    tokens: Vec<TokenId>,
    /// Its tree of this step (path ids from the pool), if it fed one, and the tree's tokens.
    tree: Option<(PendingTree, Vec<TokenId>)>,
    /// The path its commit keeps.
    commit: Option<Vec<usize>>,
    /// Whose prefix it is: reused only by lanes opened with the same scope.
    scope: u64,
}

/// A finished lane's tokens, kept for prefix reuse until the next compaction.
#[derive(Debug)]
struct Cached {
    seq: i32,
    tokens: Vec<TokenId>,
    scope: u64,
}

/// Where a step's rows went: `rows` rows of `lane` from row `start` (cell `used + start`).
#[derive(Debug, Clone, Copy)]
struct Placed {
    lane: LaneId,
    start: usize,
    rows: usize,
    tree: bool,
}

/// Counters for reports and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchCounters {
    /// Forwards (one `llama_decode` each).
    pub forwards: u64,
    /// Rows fed in all.
    pub rows: u64,
    /// Kept rows moved by `settle` (saved and restored above the step's first dropped row).
    pub moved_rows: u64,
    /// Compactions (cached prefixes evicted, live lanes rewritten contiguously).
    pub compactions: u64,
    /// Prompt tokens served from a cached prefix instead of being prefilled.
    pub reused_tokens: u64,
}

/// Many lanes in one llama.cpp context.
pub struct LlamaBatchLm<'m> {
    model: &'m LlamaModel,
    ctx: LlamaContext<'m>,
    batch: BatchBuf,
    n_ctx: usize,
    n_vocab: usize,
    lanes: Vec<Option<LaneSeq>>,
    cached: Vec<Cached>,
    /// Sequence ids not in use (bases of lanes and cached prefixes, paths of this step's trees).
    free_seqs: Vec<i32>,
    /// Occupied cells: exactly `0..used` between steps.
    used: usize,
    /// This step's rows, in batch order, while a step is open.
    placed: Vec<Placed>,
    /// Counters.
    pub counters: BatchCounters,
}

impl std::fmt::Debug for LlamaBatchLm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaBatchLm")
            .field("model", &self.model.path())
            .field("n_ctx", &self.n_ctx)
            .field("used", &self.used)
            .field("lanes", &self.lanes.iter().filter(|l| l.is_some()).count())
            .finish_non_exhaustive()
    }
}

const SCRATCH: i32 = SEQ_IDS as i32 - 1;

/// Dead cells (finished requests, cached prefixes) tolerated before a compaction, however few
/// the live ones.
const COMPACT_MIN_DEAD: usize = 1024;

impl LlamaModel {
    /// A context of `ctx_size` cells with every sequence id, for up to `lanes` lanes (`what`
    /// names them in the error), and the cells it may use: the size asked for (the context may
    /// hold more, see `new_context`).
    pub(crate) fn lanes_context(
        &self,
        ctx_size: usize,
        lanes: usize,
        what: &str,
    ) -> Result<(LlamaContext<'_>, usize)> {
        if lanes == 0 || lanes > SEQ_IDS / 2 {
            return Err(EngineError::InvalidRequest(format!(
                "the number of {what} must be between 1 and {} (got {lanes})",
                SEQ_IDS / 2
            )));
        }
        let ctx = self.new_context(ctx_size, SEQ_IDS)?;
        let n_ctx = (ctx.n_ctx() as usize).min(ctx_size);
        Ok((ctx, n_ctx))
    }

    /// A context of `ctx_size` cells shared by up to `lanes` concurrent requests (the model's
    /// threads and exact mode apply).
    pub fn new_batch_lm(&self, ctx_size: usize, lanes: usize) -> Result<LlamaBatchLm<'_>> {
        let (ctx, n_ctx) = self.lanes_context(ctx_size, lanes, "parallel lanes")?;
        Ok(LlamaBatchLm {
            model: self,
            ctx,
            batch: BatchBuf::new(SEQ_IDS),
            n_ctx,
            n_vocab: self.vocab_size(),
            lanes: (0..lanes).map(|_| None).collect(),
            cached: Vec::new(),
            free_seqs: (0..SCRATCH).rev().collect(),
            used: 0,
            placed: Vec::new(),
            counters: BatchCounters::default(),
        })
    }
}

fn kv_err(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Backend(format!("{what}: {e}"))
}

/// Length of the common prefix of two token slices.
fn common_prefix(a: &[TokenId], b: &[TokenId]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<'m> LlamaBatchLm<'m> {
    fn lane(&self, lane: LaneId) -> Result<&LaneSeq> {
        self.lanes
            .get(lane)
            .and_then(Option::as_ref)
            .ok_or_else(|| EngineError::State(format!("lane {lane} is not open")))
    }

    fn lane_mut(&mut self, lane: LaneId) -> Result<&mut LaneSeq> {
        self.lanes
            .get_mut(lane)
            .and_then(Option::as_mut)
            .ok_or_else(|| EngineError::State(format!("lane {lane} is not open")))
    }

    /// Cells the live lanes hold (what a compaction keeps).
    fn live_cells(&self) -> usize {
        self.lanes.iter().flatten().map(|l| l.tokens.len()).sum()
    }

    fn seq_rm(&mut self, seq: i32, from: Option<usize>, to: Option<usize>) -> Result<()> {
        seq_rm(&mut self.ctx, seq, from, to)
    }

    fn seq_cp(&mut self, src: i32, dst: i32, from: Option<usize>, to: Option<usize>) -> Result<()> {
        self.ctx
            .copy_kv_cache_seq(src, dst, from.map(|p| p as u32), to.map(|p| p as u32))
            .map_err(|e| kv_err("KV cache copy failed", e))
    }

    /// Save the cells of `seq` at positions `from..to` (through the scratch sequence).
    fn save(&mut self, seq: i32, from: usize, to: usize) -> Result<SeqState> {
        self.seq_cp(seq, SCRATCH, Some(from), Some(to))?;
        backend::clear_captured();
        let saved = self.ctx.state_seq_get(SCRATCH, LlamaStateSeqFlags::empty());
        self.seq_rm(SCRATCH, None, None)?;
        saved.map_err(|e| backend_err("cannot save KV cells", e))
    }

    /// Restore saved cells into the lowest free cells, as sequence `seq`.
    fn restore(&mut self, saved: &SeqState, seq: i32) -> Result<()> {
        backend::clear_captured();
        if let Err(e) = self.ctx.state_seq_set(saved, SCRATCH) {
            let _ = self.seq_rm(SCRATCH, None, None);
            return Err(backend_err("cannot restore KV cells", e));
        }
        self.seq_cp(SCRATCH, seq, None, None)?;
        self.seq_rm(SCRATCH, None, None)
    }

    /// Evict every cached prefix and rewrite the live lanes contiguously from cell 0, freeing
    /// the cells of finished requests and the cells a prefix shared.
    fn compact(&mut self) -> Result<()> {
        let mut blobs = Vec::new();
        for lane in self.lanes.iter().flatten().filter(|l| !l.tokens.is_empty()) {
            backend::clear_captured();
            let blob = self
                .ctx
                .state_seq_get(lane.seq, LlamaStateSeqFlags::empty())
                .map_err(|e| backend_err("cannot save a lane for compaction", e))?;
            blobs.push((lane.seq, blob));
        }
        self.ctx.clear_kv_cache();
        for c in self.cached.drain(..) {
            self.free_seqs.push(c.seq);
        }
        for (seq, blob) in &blobs {
            backend::clear_captured();
            self.ctx
                .state_seq_set(blob, *seq)
                .map_err(|e| backend_err("cannot restore a lane after compaction", e))?;
        }
        self.used = self.live_cells();
        self.counters.compactions += 1;
        Ok(())
    }
}

impl BatchedLm for LlamaBatchLm<'_> {
    fn vocab_size(&self) -> usize {
        self.n_vocab
    }

    fn context_size(&self) -> usize {
        self.n_ctx
    }

    fn capacity(&self) -> usize {
        self.n_ctx
    }

    fn open(&mut self, prompt_head: &[TokenId], scope: u64) -> Result<(LaneId, usize)> {
        let Some(slot) = self.lanes.iter().position(Option::is_none) else {
            return Err(EngineError::InvalidRequest("every lane is busy".into()));
        };
        if self.free_seqs.is_empty() {
            self.compact()?;
        }
        let seq = self.free_seqs.pop().ok_or_else(|| EngineError::State("no free sequence id".into()))?;
        // Reuse the longest cached or live prefix of the prompt within its scope.
        let best = self
            .cached
            .iter()
            .filter(|c| c.scope == scope)
            .map(|c| (c.seq, common_prefix(&c.tokens, prompt_head)))
            .chain(
                self.lanes
                    .iter()
                    .flatten()
                    .filter(|l| l.scope == scope)
                    .map(|l| (l.seq, common_prefix(&l.tokens, prompt_head))),
            )
            .max_by_key(|&(_, n)| n);
        let mut reused = 0;
        if let Some((src, n)) = best.filter(|&(_, n)| n > 0) {
            if self.seq_cp(src, seq, None, Some(n)).is_ok() {
                reused = n;
                self.counters.reused_tokens += n as u64;
            }
        }
        self.lanes[slot] =
            Some(LaneSeq { seq, tokens: prompt_head[..reused].to_vec(), tree: None, commit: None, scope });
        Ok((slot, reused))
    }

    fn committed_len(&self, lane: LaneId) -> usize {
        self.lane(lane).map_or(0, |l| l.tokens.len())
    }

    fn room(&self) -> BatchRoom {
        BatchRoom {
            rows: self.n_ctx.saturating_sub(self.live_cells()),
            paths: self.free_seqs.len() + self.cached.len(),
        }
    }

    fn forward(&mut self, work: &[LaneWork<'_>]) -> Result<Logits<'_>> {
        if !self.placed.is_empty() {
            return Err(EngineError::State("forward before the last step was settled".into()));
        }
        let rows: usize = work
            .iter()
            .map(|w| match w {
                LaneWork::Prefill { tokens, .. } => tokens.len(),
                LaneWork::Tree { batch, .. } => batch.len(),
            })
            .sum();
        if rows == 0 {
            return Ok(Logits::new(self.n_vocab, Vec::new()));
        }
        let first_tree = work.iter().position(|w| matches!(w, LaneWork::Tree { .. })).unwrap_or(work.len());
        if work[first_tree..].iter().any(|w| matches!(w, LaneWork::Prefill { .. })) {
            return Err(EngineError::State(
                "prompt chunks must come before the trees in a batched forward".into(),
            ));
        }
        let paths: usize =
            work.iter().map(|w| if let LaneWork::Tree { batch, .. } = w { batch.len() } else { 0 }).sum();
        // Compact when the cache is full, short of sequence ids, or holding more dead cells
        // (finished requests, cached prefixes) than live ones: every query scans the occupied
        // cells, masked or not, so dead cells cost attention time on every step.
        let live = self.live_cells();
        let dead = self.used - live.min(self.used);
        if self.used + rows > self.n_ctx || paths > self.free_seqs.len() || dead > live.max(COMPACT_MIN_DEAD)
        {
            self.compact()?;
        }
        if self.used + rows > self.n_ctx {
            return Err(EngineError::InvalidRequest(format!(
                "a forward of {rows} rows does not fit the {} free cells of the {}-cell context",
                self.n_ctx - self.used,
                self.n_ctx
            )));
        }
        // Plan every lane's rows: prefill rows on the lane's base sequence, trees on path ids
        // from the pool.
        let mut plans: Vec<(LaneId, Plan)> = Vec::new();
        let mut placed = Vec::with_capacity(work.len());
        let mut start = 0;
        let mut fail: Option<EngineError> = None;
        for w in work {
            match *w {
                LaneWork::Prefill { lane, tokens } => {
                    if let Err(e) = self.lane(lane) {
                        fail = Some(e);
                        break;
                    }
                    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.n_vocab) {
                        fail = Some(EngineError::State(format!("token {t} is outside the vocabulary")));
                        break;
                    }
                    placed.push(Placed { lane, start, rows: tokens.len(), tree: false });
                    start += tokens.len();
                }
                LaneWork::Tree { lane, batch } => {
                    let leaves = {
                        let mut has_child = vec![false; batch.len()];
                        batch.parents.iter().flatten().for_each(|&p| {
                            if p < has_child.len() {
                                has_child[p] = true
                            }
                        });
                        has_child.iter().filter(|&&c| !c).count().max(1)
                    };
                    if leaves > self.free_seqs.len() {
                        fail = Some(EngineError::InvalidRequest(
                            "no sequence ids left for the step's trees".into(),
                        ));
                        break;
                    }
                    if let Some(&t) = batch.tokens.iter().find(|&&t| t as usize >= self.n_vocab) {
                        fail = Some(EngineError::State(format!("token {t} is outside the vocabulary")));
                        break;
                    }
                    let ids: Vec<i32> = (0..leaves).filter_map(|_| self.free_seqs.pop()).collect();
                    let (base, committed) = match self.lane(lane) {
                        Ok(l) => (l.seq, l.tokens.len()),
                        Err(e) => {
                            self.free_seqs.extend(ids);
                            fail = Some(e);
                            break;
                        }
                    };
                    let mut tree = PendingTree::with_ids(base, ids);
                    match tree.extend(batch, committed) {
                        Ok(plan) => {
                            plans.push((lane, plan));
                            if let Ok(l) = self.lane_mut(lane) {
                                l.tree = Some((tree, batch.tokens.clone()));
                            }
                        }
                        Err(e) => {
                            self.free_seqs.extend(tree.ids());
                            fail = Some(e);
                            break;
                        }
                    }
                    placed.push(Placed { lane, start, rows: batch.len(), tree: true });
                    start += batch.len();
                }
            }
        }
        let mut copy_err = None;
        if fail.is_none() {
            for (_, plan) in &plans {
                for c in &plan.copies {
                    if let Err(e) = self.ctx.copy_kv_cache_seq(c.src, c.dst, None, Some(c.end as u32)) {
                        copy_err = Some(kv_err("KV cache copy failed", e));
                    }
                }
            }
        }
        let decoded = match fail.or(copy_err) {
            Some(e) => Err(e),
            None => {
                let lanes = &self.lanes;
                let rows_iter =
                    work.iter().flat_map(|w| -> Box<dyn Iterator<Item = (TokenId, usize, &[i32], bool)>> {
                        match *w {
                            LaneWork::Prefill { lane, tokens } => {
                                let l = lanes[lane].as_ref().expect("checked above");
                                let committed = l.tokens.len();
                                let seq = std::slice::from_ref(&l.seq);
                                Box::new(
                                    tokens
                                        .iter()
                                        .enumerate()
                                        .map(move |(i, &t)| (t, committed + i, seq, false)),
                                )
                            }
                            LaneWork::Tree { lane, batch } => {
                                let l = lanes[lane].as_ref().expect("checked above");
                                let committed = l.tokens.len();
                                let (tree, _) = l.tree.as_ref().expect("planned above");
                                Box::new((0..batch.len()).map(move |i| {
                                    let (depth, seqs) = tree.row(i);
                                    (batch.tokens[i], committed + depth, seqs, true)
                                }))
                            }
                        }
                    });
                self.batch.decode(&mut self.ctx, self.n_ctx, rows, rows_iter)
            }
        };
        if let Err(e) = decoded {
            // Take every planned path and prefill row back out.
            for (lane, plan) in &plans {
                undo_plan(&mut self.ctx, plan);
                if let Ok(l) = self.lane_mut(*lane) {
                    if let Some((t, _)) = l.tree.take() {
                        let ids = t.ids().to_vec();
                        self.free_seqs.extend(ids);
                    }
                }
            }
            for p in placed.iter().filter(|p| !p.tree) {
                if let Ok(l) = self.lane(p.lane) {
                    let (seq, from) = (l.seq, l.tokens.len());
                    let _ = self.seq_rm(seq, Some(from), None);
                }
            }
            // Whatever llama.cpp left behind, the invariant is restored by rewriting the lanes.
            let _ = self.compact();
            return Err(e);
        }
        // Prefill rows are committed at once.
        for w in work {
            if let LaneWork::Prefill { lane, tokens } = *w {
                if let Ok(l) = self.lane_mut(lane) {
                    l.tokens.extend_from_slice(tokens);
                }
            }
        }
        self.used += rows;
        self.counters.forwards += 1;
        self.counters.rows += rows as u64;
        let wanted: Vec<bool> = placed.iter().flat_map(|p| std::iter::repeat_n(p.tree, p.rows)).collect();
        self.placed = placed;
        Ok(lend_rows(&self.ctx, self.n_vocab, &wanted))
    }

    fn commit(&mut self, lane: LaneId, path: &[usize]) -> Result<()> {
        let l = self.lane_mut(lane)?;
        let (tree, _) =
            l.tree.as_ref().ok_or_else(|| EngineError::State(format!("lane {lane} fed no tree")))?;
        tree.path_seq(path)?;
        l.commit = Some(path.to_vec());
        Ok(())
    }

    fn settle(&mut self) -> Result<()> {
        let placed = std::mem::take(&mut self.placed);
        let step_base = self.used - placed.iter().map(|p| p.rows).sum::<usize>();
        // The first dropped row of the step (rows are cells `step_base + row`).
        let mut first_drop = None;
        for p in placed.iter().filter(|p| p.tree) {
            let l = self.lane(p.lane)?;
            let path = l.commit.as_deref().unwrap_or(&[]);
            let in_place = path.iter().enumerate().take_while(|&(k, &i)| k == i).count();
            if in_place < p.rows {
                first_drop = Some(p.start + in_place);
                break;
            }
        }
        let first_drop = first_drop.unwrap_or(usize::MAX);
        // Keep in place what lies below the first drop; save what lies above it.
        let mut moves: Vec<(i32, SeqState)> = Vec::new();
        let mut moved = 0;
        let mut step_ids: Vec<i32> = Vec::new();
        for p in placed.iter().filter(|p| p.tree) {
            let (seq, committed, path, tree) = {
                let l = self.lane_mut(p.lane)?;
                (l.seq, l.tokens.len(), l.commit.take().unwrap_or_default(), l.tree.take())
            };
            let Some((tree, tokens)) = tree else { continue };
            step_ids.extend_from_slice(tree.ids());
            let Some(path_seq) = tree.path_seq(&path)? else { continue };
            let in_place =
                path.iter().enumerate().take_while(|&(k, &i)| k == i && p.start + i < first_drop).count();
            if in_place > 0 {
                self.seq_cp(path_seq, seq, Some(committed), Some(committed + in_place))?;
            }
            if in_place < path.len() {
                let saved = self.save(path_seq, committed + in_place, committed + path.len())?;
                moves.push((seq, saved));
                moved += path.len() - in_place;
            }
            let l = self.lane_mut(p.lane)?;
            l.tokens.extend(path.iter().map(|&i| tokens[i]));
        }
        // Free every row of the step's paths: dropped rows and saved rows (kept rows in place
        // joined their lane's base sequence above).
        for &id in &step_ids {
            self.seq_rm(id, None, None)?;
        }
        self.free_seqs.extend(step_ids);
        if first_drop != usize::MAX {
            self.used = step_base + first_drop;
        }
        for (seq, saved) in &moves {
            self.restore(saved, *seq)?;
        }
        self.used += moved;
        self.counters.moved_rows += moved as u64;
        Ok(())
    }

    fn close(&mut self, lane: LaneId) {
        if let Some(Some(l)) = self.lanes.get_mut(lane).map(Option::take) {
            if let Some((t, _)) = &l.tree {
                self.free_seqs.extend(t.ids());
            }
            if l.tokens.is_empty() {
                self.free_seqs.push(l.seq);
            } else {
                self.cached.push(Cached { seq: l.seq, tokens: l.tokens, scope: l.scope });
            }
        }
    }
}
