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
//! in lane order. A finished lane's cells stay (a cached prefix a later request may reuse, such
//! as the next turn of a conversation); when the cache runs out of room or sequence ids, or
//! holds too many cells nobody will read, a compaction rewrites every live lane and every cached
//! prefix still worth its keep contiguously, moves the other prefixes to host memory and drops
//! those a later lane took over (see [`KEEP_CACHED_ROWS`], [`TAKE_OVER_SHARE`]).
//! Both moves keep each sequence's cells in position order.

use llama_cpp_2::context::session::{LlamaStateSeqFlags, SeqState};
use llama_cpp_2::context::LlamaContext;

use treespec_core::cost::shapes::ShapeBuckets;
use treespec_core::TokenId;
use treespec_engine::backend::{BatchRoom, BatchedLm, LaneId, LaneWork};
use treespec_engine::{EngineError, Logits, Result};

use crate::backend;
use crate::kv::PendingTree;
use crate::lm::{backend_err, seq_rm, BatchBuf};
use crate::load::LlamaModel;
use crate::padding::Padding;

mod forward;
mod saved_prefixes;

use forward::StepPlan;
pub use saved_prefixes::SAVED_PREFIX_BYTES;
use saved_prefixes::{SavedPrefix, SavedPrefixes};

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
    /// Its prompt chunk of this step, if it feeds one: the tokens it adds (its tree, if it feeds
    /// one too, sits right after them) and the sequence ids of their rows — its base, and the
    /// path ids of that tree, whose rows must see the chunk's cells (the paths' copies of the
    /// base, made before the decode, cannot hold cells the decode has yet to write).
    chunk: StepChunk,
    /// Whose prefix it is: reused only by lanes opened with the same scope.
    scope: u64,
}

/// A lane's prompt chunk in the step being planned (see [`LaneSeq::chunk`]).
#[derive(Debug, Default)]
struct StepChunk {
    len: usize,
    seqs: Vec<i32>,
}

/// A finished lane's tokens, kept for prefix reuse.
#[derive(Debug)]
struct Cached {
    seq: i32,
    tokens: Vec<TokenId>,
    scope: u64,
    /// Rows the forwards since it was cached have fed: what its cells have cost in attention
    /// (see [`KEEP_CACHED_ROWS`]); set to that bound once it is given up (a later lane took
    /// most of it over, or room ran short).
    rent: u64,
    /// A later lane took most of it over ([`TAKE_OVER_SHARE`]): the next compaction drops it
    /// instead of moving it to host memory.
    taken_over: bool,
}

impl Cached {
    /// Whether a compaction keeps it: it has not yet cost its keep (see [`KEEP_CACHED_ROWS`]).
    fn kept(&self) -> bool {
        self.rent < KEEP_CACHED_ROWS
    }

    /// Let the next compaction move it to host memory.
    fn give_up(&mut self) {
        self.rent = KEEP_CACHED_ROWS;
    }

    /// A later lane reused most of it: let the next compaction drop it.
    fn take_over(&mut self) {
        self.give_up();
        self.taken_over = true;
    }
}

/// How long a cached prefix stays in the cells, in rows fed since it was cached; a compaction
/// after that moves it to host memory ([`saved_prefixes`]), from where a lane that reuses it
/// restores it.
///
/// In the cells a prefix is reused by a sequence copy (free) but costs every row of every later
/// forward (its cells are scanned, and they unbalance llama.cpp's split of the attention over
/// threads, see [`saved_prefixes`]); in host memory it costs a copy when a compaction moves it
/// and another when a lane restores it (a few tens of KB a token, about a millisecond per
/// hundred tokens on the 1.5B). An agent's or a chat's next turn, which comes right after its
/// last one, still finds its prefix in the cells; one that comes back after other requests'
/// rows restores it from memory.
pub const KEEP_CACHED_ROWS: u64 = 256;

/// A lane that reuses at least this share of a cached prefix takes it over: the prefix is then
/// dropped at the next compaction (the lane's own tokens, cached when it closes, carry it on),
/// not moved to host memory. What is lost is its unshared tail, less than half of it; what is
/// saved is a copy of the whole: a conversation's turns each take over the one before, and
/// moving each earlier turn out (a few tens of KB a token, first-touch page faults included)
/// cost 290 ms per 3,600-token turn of a document Q&A on the 1.5B (Zen 5), inside a decode.
const TAKE_OVER_SHARE: f64 = 0.5;

/// The most cells a compaction made to restore a saved prefix may rewrite per token restored.
/// A compaction copies each live and kept cell out and back (250–340 ms for 3,600 cells of the
/// 1.5B on 2 Zen 5 cores, about 0.08 ms a cell), while each token restored is a prompt row not
/// computed again (several ms a row on those cores): at 32 cells a token the compaction costs
/// well under the rows it spares.
const RESTORE_COMPACT_CELLS_PER_TOKEN: usize = 32;

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
    /// Compactions (live lanes and the cached prefixes kept rewritten contiguously).
    pub compactions: u64,
    /// Cached prefixes a compaction kept (counted once per compaction).
    pub kept_prefixes: u64,
    /// Cached prefixes given up for good (the host-memory store was full).
    pub dropped_prefixes: u64,
    /// Cached prefixes a compaction moved from the cells to host memory.
    pub saved_prefixes: u64,
    /// Cached prefixes a compaction dropped because a later lane took most of them over.
    pub taken_over_prefixes: u64,
    /// Prefixes restored from host memory into a lane's cells.
    pub restored_prefixes: u64,
    /// Bytes the prefixes in host memory hold now.
    pub saved_bytes: u64,
    /// Prompt tokens served from a cached prefix instead of being prefilled.
    pub reused_tokens: u64,
    /// Decodes that reused the graph of the decode before (llama.cpp's `n_reused`).
    pub graph_reuses: u64,
}

/// Many lanes in one llama.cpp context.
pub struct LlamaBatchLm<'m> {
    model: &'m LlamaModel,
    ctx: LlamaContext<'m>,
    batch: BatchBuf,
    n_ctx: usize,
    n_vocab: usize,
    lanes: Vec<Option<LaneSeq>>,
    /// Finished lanes' prefixes still in the cells.
    cached: Vec<Cached>,
    /// Finished lanes' prefixes moved to host memory.
    saved: SavedPrefixes,
    /// Sequence ids not in use (bases of lanes and cached prefixes, paths of this step's trees).
    free_seqs: Vec<i32>,
    /// Occupied cells: exactly `0..used` between steps.
    used: usize,
    /// Dead cells summed over the forwards since the last compaction: what they have cost in
    /// attention so far (see `make_room`).
    dead_rent: u64,
    /// This step's rows, in batch order, while a step is open.
    placed: Vec<Placed>,
    /// The shapes forwards are padded to, and the current forward's filler rows.
    padding: Padding,
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
            saved: SavedPrefixes::new(SAVED_PREFIX_BYTES),
            free_seqs: (0..SCRATCH).rev().collect(),
            used: 0,
            dead_rent: 0,
            placed: Vec::new(),
            padding: Padding::default(),
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

    /// Cells the live lanes hold.
    fn live_cells(&self) -> usize {
        self.lanes.iter().flatten().map(|l| l.tokens.len()).sum()
    }

    /// Cells the cached prefixes still worth their keep hold (what a compaction keeps beside
    /// the live lanes).
    fn kept_cells(&self) -> usize {
        self.cached.iter().filter(|c| c.kept()).map(|c| c.tokens.len()).sum()
    }

    /// Charge every cached prefix for a forward of `rows` rows.
    fn charge_cached(&mut self, rows: usize) {
        for c in &mut self.cached {
            c.rent = c.rent.saturating_add(rows as u64);
        }
    }

    /// Give up the oldest cached prefix still kept (a compaction then drops it); false when
    /// none is left.
    fn give_up_oldest_cached(&mut self) -> bool {
        match self.cached.iter_mut().filter(|c| c.kept()).max_by_key(|c| c.rent) {
            Some(c) => {
                c.give_up();
                true
            }
            None => false,
        }
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

    /// Rewrite the live lanes and the cached prefixes still worth their keep contiguously from
    /// cell 0, moving the other cached prefixes to host memory (dropping those a later lane took
    /// over): frees the cells nobody reads now (and the cells two sequences shared, each now
    /// holding its own).
    fn compact(&mut self) -> Result<()> {
        let (kept, leaving): (Vec<Cached>, Vec<Cached>) =
            std::mem::take(&mut self.cached).into_iter().partition(Cached::kept);
        let (superseded, leaving): (Vec<Cached>, Vec<Cached>) =
            leaving.into_iter().partition(|c| c.taken_over);
        let seqs: Vec<i32> = self
            .lanes
            .iter()
            .flatten()
            .filter(|l| !l.tokens.is_empty())
            .map(|l| l.seq)
            .chain(kept.iter().map(|c| c.seq))
            .collect();
        let mut blobs = Vec::with_capacity(seqs.len());
        for seq in seqs {
            blobs.push((seq, self.seq_state(seq, "cannot save a sequence for compaction")?));
        }
        let mut saving = Vec::with_capacity(leaving.len());
        for c in &leaving {
            saving.push(self.seq_state(c.seq, "cannot save a cached prefix to host memory")?);
        }
        self.ctx.clear_kv_cache();
        self.counters.kept_prefixes += kept.len() as u64;
        self.counters.taken_over_prefixes += superseded.len() as u64;
        self.free_seqs.extend(superseded.iter().chain(&leaving).map(|c| c.seq));
        for (c, state) in leaving.into_iter().zip(saving) {
            self.counters.saved_prefixes += 1;
            let evicted = self.saved.push(SavedPrefix { tokens: c.tokens, scope: c.scope, state });
            self.counters.dropped_prefixes += evicted as u64;
        }
        self.counters.saved_bytes = self.saved.bytes() as u64;
        self.cached = kept;
        for (seq, blob) in &blobs {
            backend::clear_captured();
            self.ctx
                .state_seq_set(blob, *seq)
                .map_err(|e| backend_err("cannot restore a sequence after compaction", e))?;
        }
        self.used = self.live_cells() + self.kept_cells();
        self.dead_rent = 0;
        self.counters.compactions += 1;
        Ok(())
    }

    /// Sequence `seq`'s state (every cell of it), `what` naming a failure.
    fn seq_state(&mut self, seq: i32, what: &str) -> Result<SeqState> {
        backend::clear_captured();
        self.ctx.state_seq_get(seq, LlamaStateSeqFlags::empty()).map_err(|e| backend_err(what, e))
    }

    /// Reuse the first `n` tokens of the saved prefix `i` as sequence `seq`: restored above the
    /// occupied cells, its tail past `n` cut off (the topmost cells: no hole). When the cells
    /// above are too few, room is made as [`Self::make_room`] makes it for a forward: the oldest
    /// cached prefixes still kept go to host memory (from where they come back the same way) and
    /// a compaction frees the dead cells — a reuse that is sure now outranks one that may come,
    /// and without this a saved prefix never came back while kept ones filled the cells. False
    /// when the live lanes leave no room for the whole saved prefix, when the compaction would
    /// rewrite more than [`RESTORE_COMPACT_CELLS_PER_TOKEN`] cells for each token reused, or when
    /// restoring failed (nothing reused; the prefix stays saved).
    fn restore_saved(&mut self, i: usize, seq: i32, n: usize) -> Result<bool> {
        let Some(prefix) = self.saved.take(i) else { return Ok(false) };
        let len = prefix.tokens.len();
        if self.used + len > self.n_ctx {
            let live = self.live_cells();
            if live + len > self.n_ctx {
                self.keep_saved(prefix);
                return Ok(false);
            }
            while live + self.kept_cells() + len > self.n_ctx && self.give_up_oldest_cached() {}
            if n * RESTORE_COMPACT_CELLS_PER_TOKEN < live + self.kept_cells() {
                self.keep_saved(prefix);
                return Ok(false);
            }
            self.compact()?;
        }
        backend::clear_captured();
        let restored = self.ctx.state_seq_set(&prefix.state, seq).is_ok();
        if !restored || self.seq_rm(seq, Some(n), None).is_err() {
            let _ = self.seq_rm(seq, None, None);
            self.keep_saved(prefix);
            return Ok(false);
        }
        self.used += n;
        self.counters.restored_prefixes += 1;
        if (n as f64) < TAKE_OVER_SHARE * len as f64 {
            self.keep_saved(prefix);
        }
        self.counters.saved_bytes = self.saved.bytes() as u64;
        Ok(true)
    }

    /// Put a saved prefix back (as the newest: it was just wanted).
    fn keep_saved(&mut self, prefix: SavedPrefix) {
        self.counters.dropped_prefixes += self.saved.push(prefix) as u64;
        self.counters.saved_bytes = self.saved.bytes() as u64;
    }

    /// The live lane or cached prefix of `scope` in the cells sharing the longest start with
    /// `prompt`: its sequence and the tokens shared.
    fn best_in_cells(&self, prompt: &[TokenId], scope: u64) -> Option<(i32, usize)> {
        self.cached
            .iter()
            .filter(|c| c.scope == scope)
            .map(|c| (c.seq, common_prefix(&c.tokens, prompt)))
            .chain(
                self.lanes
                    .iter()
                    .flatten()
                    .filter(|l| l.scope == scope)
                    .map(|l| (l.seq, common_prefix(&l.tokens, prompt))),
            )
            .max_by_key(|&(_, n)| n)
            .filter(|&(_, n)| n > 0)
    }
}

impl LlamaBatchLm<'_> {
    /// Bound the host memory finished prefixes are kept in (default [`SAVED_PREFIX_BYTES`]; 0:
    /// a prefix past its keep is dropped, as before they were kept in memory).
    pub fn set_saved_prefix_bytes(&mut self, bytes: usize) {
        self.counters.dropped_prefixes += self.saved.set_budget(bytes) as u64;
        self.counters.saved_bytes = self.saved.bytes() as u64;
    }
}

impl BatchedLm for LlamaBatchLm<'_> {
    fn vocab_size(&self) -> usize {
        self.n_vocab
    }

    fn pad_shapes(&mut self, buckets: Option<&ShapeBuckets>) -> bool {
        self.padding.set(buckets);
        true
    }

    fn graph_reuses(&self) -> Option<u64> {
        Some(self.batch.reuses)
    }

    fn context_size(&self) -> usize {
        self.n_ctx
    }

    fn capacity(&self) -> usize {
        self.n_ctx
    }

    fn saved_prefix_bytes(&self) -> usize {
        self.saved.bytes()
    }

    fn open(&mut self, prompt_head: &[TokenId], scope: u64) -> Result<(LaneId, usize)> {
        let Some(slot) = self.lanes.iter().position(Option::is_none) else {
            return Err(EngineError::InvalidRequest("every lane is busy".into()));
        };
        if self.free_seqs.is_empty() {
            self.give_up_oldest_cached();
            self.compact()?;
        }
        let seq = self.free_seqs.pop().ok_or_else(|| EngineError::State("no free sequence id".into()))?;
        // Reuse the longest cached (in the cells or in memory) or live prefix of the prompt
        // within its scope.
        let in_cells = self.best_in_cells(prompt_head, scope).map_or(0, |(_, n)| n);
        let in_memory = self.saved.best(prompt_head, scope).filter(|&(_, n)| n > in_cells);
        let mut reused = match in_memory {
            Some((i, n)) if self.restore_saved(i, seq, n)? => n,
            _ => 0,
        };
        // Looked up again: making room for a restore may have moved a cached prefix out.
        let found = if reused == 0 { self.best_in_cells(prompt_head, scope) } else { None };
        if let Some((src, n)) = found {
            if self.seq_cp(src, seq, None, Some(n)).is_ok() {
                reused = n;
                let most = |c: &Cached| n as f64 >= TAKE_OVER_SHARE * c.tokens.len() as f64;
                if let Some(c) = self.cached.iter_mut().find(|c| c.seq == src && most(c)) {
                    c.take_over();
                }
            }
        }
        self.counters.reused_tokens += reused as u64;
        self.lanes[slot] = Some(LaneSeq {
            seq,
            tokens: prompt_head[..reused].to_vec(),
            tree: None,
            commit: None,
            chunk: StepChunk::default(),
            scope,
        });
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

    /// One `llama_decode` of every lane's work, in steps (`forward.rs`): make room, plan every
    /// lane's rows, copy the planned paths' KV and decode; then commit the prompt chunks and lend
    /// the trees' logits. A failure after planning began rolls the whole step back.
    fn forward(&mut self, work: &[LaneWork<'_>]) -> Result<Logits<'_>> {
        if !self.placed.is_empty() {
            return Err(EngineError::State("forward before the last step was settled".into()));
        }
        let rows = forward::step_rows(work);
        if rows == 0 {
            return Ok(Logits::new(self.n_vocab, Vec::new()));
        }
        forward::check_prefills_first(work)?;
        self.make_room(work, rows)?;
        let mut step = StepPlan::default();
        if let Err(e) = self.plan_and_decode(work, rows, &mut step) {
            self.roll_back(&step);
            return Err(e);
        }
        self.book_step(work, rows, step.placed);
        Ok(self.lend_tree_rows())
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
                self.cached.push(Cached {
                    seq: l.seq,
                    tokens: l.tokens,
                    scope: l.scope,
                    rent: 0,
                    taken_over: false,
                });
            }
        }
    }
}
