//! [`LlamaDraftLanes`]: one llama.cpp context holding the draft model's sequence of every request
//! in a continuous batch, behind the engine's [`DraftLanes`] — each batched draft forward is ONE
//! `llama_decode` holding every drafting request's rows.
//!
//! Each lane owns a base sequence id (its committed tokens) and takes path ids for its pending
//! tree from a pool shared by all lanes, only for as long as a pending node uses them (`kv.rs`
//! plans a lane's tree exactly as for a lone context, on the lane's base). A commit joins the kept
//! path to the base sequence where its cells are and frees every other pending cell.
//!
//! Unlike the target's [`LlamaBatchLm`](crate::LlamaBatchLm), this context does not keep a lane's
//! cells in position order: a draft's logits only steer what is proposed, and the target verifies
//! every proposal exactly, so the draft needs no bit-exactness and no cell moves.

use llama_cpp_2::context::LlamaContext;

use treespec_engine::backend::{DraftFeed, DraftLanes, LaneId};
use treespec_engine::{EngineError, Logits, Result};

use crate::batch_lm::SEQ_IDS;
use crate::kv::{PendingTree, Plan};
use crate::lm::{check_tokens, lend_rows, seq_rm, undo_plan, BatchBuf};
use crate::load::LlamaModel;

/// One lane: a request's draft sequence.
#[derive(Debug)]
struct DraftSeq {
    /// Its base sequence id.
    seq: i32,
    /// Its committed tokens.
    committed: usize,
    /// Its pending tree (path ids borrowed from the pool).
    tree: PendingTree,
}

/// Many requests' draft sequences in one llama.cpp context.
pub struct LlamaDraftLanes<'m> {
    model: &'m LlamaModel,
    ctx: LlamaContext<'m>,
    batch: BatchBuf,
    /// Cells of the context.
    n_ctx: usize,
    /// Positions one lane may hold.
    lane_ctx: usize,
    n_vocab: usize,
    lanes: Vec<Option<DraftSeq>>,
    /// Sequence ids not in use (lane bases and pending paths take them).
    free_seqs: Vec<i32>,
}

impl std::fmt::Debug for LlamaDraftLanes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaDraftLanes")
            .field("model", &self.model.path())
            .field("n_ctx", &self.n_ctx)
            .field("lanes", &self.lanes.iter().filter(|l| l.is_some()).count())
            .finish_non_exhaustive()
    }
}

impl LlamaModel {
    /// A draft context of `ctx_size` cells for up to `lanes` requests of at most `lane_ctx`
    /// positions each (the model's threads and exact mode apply).
    pub fn new_draft_lanes(
        &self,
        ctx_size: usize,
        lane_ctx: usize,
        lanes: usize,
    ) -> Result<LlamaDraftLanes<'_>> {
        let (ctx, n_ctx) = self.lanes_context(ctx_size, lanes, "draft lanes")?;
        Ok(LlamaDraftLanes {
            model: self,
            ctx,
            batch: BatchBuf::new(SEQ_IDS),
            n_ctx,
            lane_ctx: lane_ctx.min(n_ctx),
            n_vocab: self.vocab_size(),
            lanes: (0..lanes).map(|_| None).collect(),
            free_seqs: (0..SEQ_IDS as i32).rev().collect(),
        })
    }
}

impl LlamaDraftLanes<'_> {
    fn lane(&self, lane: LaneId) -> Result<&DraftSeq> {
        self.lanes
            .get(lane)
            .and_then(Option::as_ref)
            .ok_or_else(|| EngineError::State(format!("draft lane {lane} is not open")))
    }

    /// Cells in use: every lane's committed tokens and pending nodes.
    fn used(&self) -> usize {
        self.lanes.iter().flatten().map(|l| l.committed + l.tree.len()).sum()
    }

    /// Drop the lane's pending nodes and give their path ids back.
    fn drop_pending(&mut self, lane: LaneId) {
        let Some(Some(l)) = self.lanes.get_mut(lane) else { return };
        let ids = l.tree.ids().to_vec();
        l.tree = PendingTree::with_ids(l.seq, Vec::new());
        for &id in &ids {
            let _ = seq_rm(&mut self.ctx, id, None, None);
        }
        self.free_seqs.extend(ids);
    }

    /// Check a forward's work before anything is planned: open lanes, each once, known tokens,
    /// and room in the lanes and the context.
    fn check(&self, work: &[(LaneId, DraftFeed<'_>)]) -> Result<()> {
        let mut rows = 0;
        for (i, (lane, feed)) in work.iter().enumerate() {
            let l = self.lane(*lane)?;
            if work[..i].iter().any(|(other, _)| other == lane) {
                return Err(EngineError::State(format!("draft lane {lane} fed twice in one forward")));
            }
            let tokens = match feed {
                DraftFeed::Prefill(t) => {
                    if l.tree.len() > 0 {
                        return Err(EngineError::State("draft prefill with pending nodes".into()));
                    }
                    *t
                }
                DraftFeed::Tree(b) => &b.tokens[..],
            };
            check_tokens(tokens, self.n_vocab)?;
            if l.committed + l.tree.len() + tokens.len() > self.lane_ctx {
                return Err(EngineError::InvalidRequest(format!(
                    "feeding {} draft rows on top of {} positions exceeds the draft lane's {}",
                    tokens.len(),
                    l.committed + l.tree.len(),
                    self.lane_ctx
                )));
            }
            rows += tokens.len();
        }
        if self.used() + rows > self.n_ctx {
            return Err(EngineError::InvalidRequest(format!(
                "a draft forward of {rows} rows does not fit the {} free cells of the {}-cell draft context",
                self.n_ctx.saturating_sub(self.used()),
                self.n_ctx
            )));
        }
        Ok(())
    }

    /// Take planned trees back out (their cells and path ids), newest first.
    fn unplan(&mut self, planned: &mut Vec<(LaneId, usize, Plan)>) {
        while let Some((lane, base, plan)) = planned.pop() {
            undo_plan(&mut self.ctx, &plan);
            if let Some(Some(l)) = self.lanes.get_mut(lane) {
                l.tree.rollback(base, &plan);
                let ids = l.tree.reclaim();
                self.free_seqs.extend(ids);
            }
        }
    }
}

impl DraftLanes for LlamaDraftLanes<'_> {
    fn vocab_size(&self) -> usize {
        self.n_vocab
    }

    fn context_size(&self) -> usize {
        self.lane_ctx
    }

    fn free_paths(&self) -> usize {
        self.free_seqs.len()
    }

    fn open(&mut self) -> Result<LaneId> {
        let slot = self
            .lanes
            .iter()
            .position(Option::is_none)
            .ok_or_else(|| EngineError::InvalidRequest("every draft lane is busy".into()))?;
        let seq =
            self.free_seqs.pop().ok_or_else(|| EngineError::State("no free draft sequence id".into()))?;
        self.lanes[slot] = Some(DraftSeq { seq, committed: 0, tree: PendingTree::with_ids(seq, Vec::new()) });
        Ok(slot)
    }

    fn close(&mut self, lane: LaneId) {
        self.drop_pending(lane);
        if let Some(Some(l)) = self.lanes.get_mut(lane).map(Option::take) {
            let _ = seq_rm(&mut self.ctx, l.seq, None, None);
            self.free_seqs.push(l.seq);
        }
    }

    fn committed_len(&self, lane: LaneId) -> usize {
        self.lane(lane).map_or(0, |l| l.committed)
    }

    fn pending_len(&self, lane: LaneId) -> usize {
        self.lane(lane).map_or(0, |l| l.tree.len())
    }

    fn forward(&mut self, work: &[(LaneId, DraftFeed<'_>)]) -> Result<Logits<'_>> {
        self.check(work)?;
        let rows: usize = work.iter().map(|(_, f)| f.rows()).sum();
        if rows == 0 {
            return Ok(Logits::new(self.n_vocab, Vec::new()));
        }
        // Plan every tree on path ids lent from the pool (each new node opens at most one path);
        // the ids a plan does not use go straight back.
        let mut planned: Vec<(LaneId, usize, Plan)> = Vec::new();
        for &(lane, feed) in work {
            let DraftFeed::Tree(batch) = feed else { continue };
            let lend = batch.len().min(self.free_seqs.len());
            let ids = self.free_seqs.split_off(self.free_seqs.len() - lend);
            let l = self.lanes[lane].as_mut().expect("checked");
            let base = l.tree.len();
            l.tree.grant(ids);
            let plan = l.tree.extend(batch, l.committed);
            let unused = l.tree.reclaim();
            self.free_seqs.extend(unused);
            match plan {
                Ok(plan) => planned.push((lane, base, plan)),
                Err(e) => {
                    self.unplan(&mut planned);
                    return Err(e);
                }
            }
        }
        for (_, _, plan) in &planned {
            for c in &plan.copies {
                if let Err(e) = self.ctx.copy_kv_cache_seq(c.src, c.dst, None, Some(c.end as u32)) {
                    self.unplan(&mut planned);
                    return Err(EngineError::Backend(format!("draft KV cache copy failed: {e}")));
                }
            }
        }
        let lanes = &self.lanes;
        let rows_iter = work.iter().flat_map(|&(lane, feed)| -> Box<dyn Iterator<Item = _>> {
            let l = lanes[lane].as_ref().expect("checked");
            let committed = l.committed;
            match feed {
                DraftFeed::Prefill(tokens) => {
                    let seq = std::slice::from_ref(&l.seq);
                    Box::new(tokens.iter().enumerate().map(move |(i, &t)| (t, committed + i, seq, false)))
                }
                DraftFeed::Tree(batch) => {
                    let base = l.tree.len() - batch.len();
                    Box::new((0..batch.len()).map(move |i| {
                        let (depth, seqs) = l.tree.row(base + i);
                        (batch.tokens[i], committed + depth, seqs, batch.logits[i])
                    }))
                }
            }
        });
        if let Err(e) = self.batch.decode(&mut self.ctx, self.n_ctx, rows, rows_iter) {
            self.unplan(&mut planned);
            for &(lane, feed) in work {
                if let (DraftFeed::Prefill(_), Some(Some(l))) = (feed, self.lanes.get(lane)) {
                    let (seq, from) = (l.seq, l.committed);
                    let _ = seq_rm(&mut self.ctx, seq, Some(from), None);
                }
            }
            return Err(e);
        }
        for &(lane, feed) in work {
            if let (DraftFeed::Prefill(tokens), Some(Some(l))) = (feed, self.lanes.get_mut(lane)) {
                l.committed += tokens.len();
            }
        }
        let mut wanted: Vec<bool> = Vec::with_capacity(rows);
        for (_, feed) in work {
            match feed {
                DraftFeed::Prefill(t) => wanted.extend(std::iter::repeat_n(false, t.len())),
                DraftFeed::Tree(b) => wanted.extend(&b.logits),
            }
        }
        Ok(lend_rows(&self.ctx, self.n_vocab, &wanted))
    }

    fn commit(&mut self, lane: LaneId, path: &[usize]) -> Result<()> {
        let l = self.lane(lane)?;
        let (seq, committed) = (l.seq, l.committed);
        let Some(path_seq) = l.tree.path_seq(path)? else {
            self.drop_pending(lane);
            return Ok(());
        };
        // The path's cells join the base sequence where they are; every other pending cell goes.
        self.ctx
            .copy_kv_cache_seq(path_seq, seq, Some(committed as u32), Some((committed + path.len()) as u32))
            .map_err(|e| EngineError::Backend(format!("draft KV cache copy failed: {e}")))?;
        self.drop_pending(lane);
        if let Some(Some(l)) = self.lanes.get_mut(lane) {
            l.committed += path.len();
        }
        Ok(())
    }

    fn truncate(&mut self, lane: LaneId, len: usize) -> Result<()> {
        self.lane(lane)?;
        self.drop_pending(lane);
        let l = self.lanes[lane].as_mut().expect("checked");
        if len < l.committed {
            let seq = l.seq;
            l.committed = len;
            seq_rm(&mut self.ctx, seq, Some(len), None)?;
        }
        Ok(())
    }
}
