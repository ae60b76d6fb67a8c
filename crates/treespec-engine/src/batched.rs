//! Continuous batching: many requests, each in its own *lane* of one model, decoded together —
//! every step is ONE forward holding every active request's rows (prompt chunks and draft trees).
//!
//! [`BatchedLm`] is the backend seam (llama.cpp: one context whose KV cache holds every lane's
//! sequence; toys: one toy model per lane). [`step`] runs one step over a set of [`Lane`]s with the
//! same per-request machine as [`generate`](crate::generate()) ([`Generation`]), so each request
//! keeps its own tree, verifier, random streams and stop handling: batching changes when its rows
//! are scored, never what it emits. Cost-aware drafters see the rows already in the forward
//! ([`ProposeContext::batch_rows`](crate::ProposeContext)) and price their nodes at the marginal
//! cost of the merged forward, so speculation shrinks on its own as the batch grows.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use treespec_core::budget::batch_cut;
use treespec_core::TokenId;

use crate::constraint::TokenConstraint;
use crate::drafter::Drafter;
use crate::error::{EngineError, Result};
use crate::generate::{GenerateOutput, GenerateRequest};
use crate::generation::{Generation, StepOutcome};
use crate::model::{Logits, TreeBatch};
use crate::shared_draft::SharedDraft;
use crate::stop::TokenBytes;

/// A lane of a [`BatchedLm`]: one request's sequence.
pub type LaneId = usize;

/// What one lane feeds in a batched forward.
#[derive(Debug, Clone, Copy)]
pub enum LaneWork<'a> {
    /// Prompt tokens appended to the lane's committed prefix (no logits).
    Prefill {
        /// The lane.
        lane: LaneId,
        /// The tokens.
        tokens: &'a [TokenId],
    },
    /// A token tree on top of the lane's committed prefix (pending until `commit`), logits for
    /// every node.
    Tree {
        /// The lane.
        lane: LaneId,
        /// The tree's nodes (parents before children, first node the root).
        batch: &'a TreeBatch,
    },
}

/// How much a step may still add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchRoom {
    /// Rows (KV cells) the next forward may hold in all.
    pub rows: usize,
    /// Root-to-leaf tree paths the next forward may open in all (a tree of n nodes opens at
    /// most n).
    pub paths: usize,
}

/// A model serving many lanes, scoring all of their rows in one forward.
pub trait BatchedLm {
    /// Vocabulary size.
    fn vocab_size(&self) -> usize;

    /// Most positions one lane may hold (prompt + generated).
    fn context_size(&self) -> usize;

    /// Positions all lanes together may hold (admission control reserves against this).
    fn capacity(&self) -> usize;

    /// Open a lane for a request whose prompt starts with `prompt_head`. Returns the lane and how
    /// many leading tokens of `prompt_head` it already holds (a cached prefix reused rather
    /// than prefilled, only ever from a lane opened with the same `scope`: a server's tenant,
    /// which must not learn from a faster prefill what another tenant sent). Errors when no lane
    /// is free.
    fn open(&mut self, prompt_head: &[TokenId], scope: u64) -> Result<(LaneId, usize)>;

    /// Tokens the lane holds.
    fn committed_len(&self, lane: LaneId) -> usize;

    /// What the next forward may hold.
    fn room(&self) -> BatchRoom;

    /// Feed every lane's work in ONE forward. Returns the logits of every tree node, in `work`
    /// order (prefill rows have none).
    fn forward(&mut self, work: &[LaneWork<'_>]) -> Result<Logits<'_>>;

    /// Keep the lane's pending nodes of `path` (indices into the tree it fed last; the first
    /// attached to its prefix) and drop its other pending nodes. Takes effect by [`settle`].
    ///
    /// [`settle`]: BatchedLm::settle
    fn commit(&mut self, lane: LaneId, path: &[usize]) -> Result<()>;

    /// Apply every commit of the step (call once after the step's commits).
    fn settle(&mut self) -> Result<()>;

    /// The lane's request is over: free it (its tokens may stay cached for prefix reuse).
    fn close(&mut self, lane: LaneId);
}

/// One request being decoded in a lane.
pub struct Lane<'d> {
    /// The lane it holds.
    pub lane: LaneId,
    /// Its generation.
    pub generation: Generation,
    /// Its drafter.
    pub drafter: Box<dyn Drafter + 'd>,
    /// Its grammar state, when it asked for structured output.
    pub constraint: Option<Box<dyn TokenConstraint + 'd>>,
    /// Prompt-head tokens the lane holds so far (prefill progress).
    pub prefilled: usize,
    /// Time spent in forwards that carried its prompt.
    pub prefill_time: Duration,
    /// Whether its drafter has begun (at the first step after the request joined).
    pub begun: bool,
    /// Rows its tree put in the last forward it decoded in (1 before its first): what the other
    /// lanes expect of it when all propose at once.
    last_rows: usize,
}

impl std::fmt::Debug for Lane<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("lane", &self.lane)
            .field("prefilled", &self.prefilled)
            .field("begun", &self.begun)
            .finish_non_exhaustive()
    }
}

impl<'d> Lane<'d> {
    /// A request in `lane`, which already holds `cached` tokens of its prompt head.
    pub fn new(
        lane: LaneId,
        generation: Generation,
        mut drafter: Box<dyn Drafter + 'd>,
        constraint: Option<Box<dyn TokenConstraint + 'd>>,
        cached: usize,
    ) -> Self {
        drafter.join_batch();
        Self {
            lane,
            generation,
            drafter,
            constraint,
            prefilled: cached,
            prefill_time: Duration::ZERO,
            begun: false,
            last_rows: 1,
        }
    }

    fn prefill_left(&self) -> usize {
        self.generation.prompt_head().len() - self.prefilled
    }
}

/// What a step did for one lane.
#[derive(Debug)]
pub enum LaneStep {
    /// Its prompt is (still) being prefilled, or it waited for room this step.
    Waiting,
    /// It decoded a step.
    Stepped(StepOutcome),
    /// It failed; the others go on.
    Failed(EngineError),
}

/// Knobs of [`step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLimits {
    /// Most prompt tokens one step prefills (chunked prefill: a long prompt does not stall
    /// everyone's decoding).
    pub prefill_chunk: usize,
    /// Most drafted nodes one lane's tree may hold.
    pub max_tree: usize,
    /// One value-ordered budget over every request's cuttable draft nodes (the default): when
    /// two or more requests decode in a step, their [`Cuttable`](crate::Cuttable) proposals are
    /// cut together where the next node no longer pays on the merged forward
    /// ([`batch_cut`](treespec_core::budget::batch_cut)). Off, each request prices its own
    /// tree on the rows proposed before it.
    pub batch_budget: bool,
    /// With a shared draft model (the default): the requests of a step propose together, so
    /// their draft forwards batch. Off, they propose one after another, each running its own
    /// draft forwards.
    pub batch_draft: bool,
}

impl Default for StepLimits {
    fn default() -> Self {
        Self { prefill_chunk: 256, max_tree: 64, batch_budget: true, batch_draft: true }
    }
}

/// What one step cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Rows in the forward (prompt chunks and tree nodes).
    pub rows: usize,
    /// Lanes that decoded a step.
    pub decoding: usize,
    /// Prompt tokens prefilled.
    pub prefilled: usize,
    /// Time in the forward itself (the rest of a step is proposing, verifying and settling).
    pub forward_time: Duration,
}

/// One continuous-batching step over `lanes`: prompt chunks, then every decoding lane's tree,
/// ONE forward, then per lane: verify, commit, emit. Trees are proposed in lane order, each
/// seeing the rows before it — or, with a shared `draft` model and two or more lanes to propose,
/// all at once, so their draft forwards batch too. A lane's own failure fails only that lane; a
/// failed forward fails every lane that had rows in it.
pub fn step(
    lm: &mut dyn BatchedLm,
    lanes: &mut [Lane<'_>],
    limits: StepLimits,
    bytes: Option<&dyn TokenBytes>,
    draft: Option<&SharedDraft<'_>>,
) -> (Vec<LaneStep>, StepReport) {
    let mut results: Vec<LaneStep> = lanes.iter().map(|_| LaneStep::Waiting).collect();
    let room = lm.room();
    let mut rows = 0usize;

    // 1. Prompt chunks, oldest lanes first.
    let mut chunks: Vec<(usize, usize)> = Vec::new(); // (lane index, tokens)
    let mut budget = limits.prefill_chunk.max(1);
    for (i, lane) in lanes.iter().enumerate() {
        let left = lane.prefill_left();
        if left == 0 {
            continue;
        }
        let n = left.min(budget).min(room.rows.saturating_sub(rows));
        if n == 0 {
            break;
        }
        chunks.push((i, n));
        budget -= n;
        rows += n;
    }
    let prefill_rows = rows;

    // Drafters begin as soon as their request joins, so that a draft model may read the prompt
    // a chunk per step beside the target (`SharedDraft::drain`) instead of all at once when the
    // target is done with it.
    for (i, lane) in lanes.iter_mut().enumerate().filter(|(_, l)| !l.begun) {
        match lane.generation.begin(lane.drafter.as_mut(), Duration::ZERO) {
            Ok(()) => lane.begun = true,
            Err(e) => results[i] = LaneStep::Failed(e),
        }
    }
    if let Some(draft) = draft {
        draft.drain(limits.prefill_chunk);
    }

    // 2. Trees. Every decoding lane puts at least its root in, whatever the order.
    let proposes = |i: usize, lane: &Lane<'_>, results: &[LaneStep]| {
        lane.begun
            && lane.prefill_left() == 0
            && matches!(results[i], LaneStep::Waiting)
            && !lane.generation.is_done()
    };
    let proposing: Vec<usize> =
        lanes.iter().enumerate().filter(|(i, l)| proposes(*i, l, &results)).map(|(i, _)| i).collect();
    let n = proposing.len();
    let (free_rows, free_paths) = (room.rows.saturating_sub(rows), room.paths);
    let draft_paths = draft.map_or(usize::MAX, SharedDraft::free_paths);
    let mut proposed: Vec<usize> = Vec::new();
    let together = limits.batch_draft && n >= 2 && free_rows >= n && free_paths >= n;
    if let Some(draft) = draft.filter(|_| together) {
        // With a shared draft model, the lanes propose together, so their draft forwards batch:
        // each tree gets an equal share of the room and, not seeing the others' trees, expects
        // each other lane to put in as many rows as its last tree did.
        let cap = (free_rows / n - 1).min(free_paths / n - 1).min(draft_paths / n).min(limits.max_tree);
        let expected: usize = proposing.iter().map(|&i| lanes[i].last_rows).sum();
        let at: Vec<ProposeAt> = lanes
            .iter()
            .map(|l| ProposeAt {
                batch_rows: rows + expected.saturating_sub(l.last_rows),
                cap,
                batch_cut: limits.batch_budget,
            })
            .collect();
        for (i, outcome) in propose_together(lm, lanes, &proposing, draft, &at) {
            rows += record_proposal(i, outcome, &mut proposed, &mut results);
        }
    } else {
        // One after another, each proposed knowing the rows already in the forward and the roots
        // still to come.
        let mut roots_to_come = n;
        let mut paths = 0usize;
        for &i in &proposing {
            roots_to_come -= 1;
            let free_rows = room.rows.saturating_sub(rows);
            let free_paths = room.paths.saturating_sub(paths);
            if free_rows == 0 || free_paths == 0 {
                continue; // no room this step: it waits
            }
            let committed = lm.committed_len(lanes[i].lane);
            // The tree may use the rows and paths left, and at most `max_tree` drafted nodes.
            let cap = (free_rows - 1).min(free_paths - 1).min(draft_paths).min(limits.max_tree);
            let context = ProposeAt { batch_rows: rows + roots_to_come, cap, batch_cut: limits.batch_budget };
            let outcome = propose_lane(&mut lanes[i], committed, context);
            let added = record_proposal(i, outcome, &mut proposed, &mut results);
            rows += added;
            paths += added;
        }
    }
    // Alone in a forward with no prompt chunk, a request's own budget already priced its tree.
    if limits.batch_budget && (proposed.len() > 1 || prefill_rows > 0) {
        rows -= cut_together(lanes, &proposed, rows, prefill_rows);
    }
    let mut trees: Vec<(usize, TreeBatch)> = proposed
        .iter()
        .filter_map(|&i| lanes[i].generation.proposed().map(|t| (i, TreeBatch::from_tree(t, 0))))
        .collect();
    for (i, batch) in &trees {
        lanes[*i].last_rows = batch.len();
    }
    // Single-row trees (plain steps) go first: every one of them is kept, so the rows a commit
    // drops sit above them (the backend then moves fewer kept rows).
    trees.sort_by_key(|(_, b)| b.len() > 1);

    if rows == 0 {
        return (results, StepReport::default());
    }
    let mut work: Vec<LaneWork<'_>> = Vec::with_capacity(chunks.len() + trees.len());
    for &(i, n) in &chunks {
        let lane = &lanes[i];
        let head = lane.generation.prompt_head();
        work.push(LaneWork::Prefill { lane: lane.lane, tokens: &head[lane.prefilled..lane.prefilled + n] });
    }
    for (i, batch) in &trees {
        work.push(LaneWork::Tree { lane: lanes[*i].lane, batch });
    }

    // 3. One forward.
    let t = Instant::now();
    let forward = lm.forward(&work);
    drop(work);
    // 4. Verify and emit, lane by lane, on the forward's rows as the backend lends them (no
    // copy); then commit each lane's accepted path.
    let (forward_time, outcomes): (Duration, Vec<Result<StepOutcome>>) = {
        let logits = match forward {
            Ok(l) => l,
            Err(e) => {
                let failed = chunks.iter().map(|&(i, _)| i).chain(trees.iter().map(|&(i, _)| i));
                for i in failed.collect::<Vec<_>>() {
                    results[i] = LaneStep::Failed(EngineError::Backend(format!("batched forward: {e}")));
                }
                return (results, StepReport::default());
            }
        };
        let time = t.elapsed();
        for &(i, n) in &chunks {
            let lane = &mut lanes[i];
            lane.prefilled += n;
            lane.prefill_time += time;
            if lane.prefill_left() == 0 {
                let t = lane.prefill_time;
                lane.generation.prefilled(t);
            }
        }
        let mut offset = 0;
        let outcomes = trees
            .iter()
            .map(|(i, batch)| {
                let lane = &mut lanes[*i];
                let own = logits.slice(offset..offset + batch.len());
                offset += batch.len();
                lane.generation.complete(
                    lane.drafter.as_mut(),
                    lane.constraint.as_deref_mut(),
                    &own,
                    rows,
                    time,
                    bytes,
                )
            })
            .collect();
        (time, outcomes)
    };
    for ((i, _), outcome) in trees.iter().zip(outcomes) {
        results[*i] = match outcome.and_then(|o| lm.commit(lanes[*i].lane, &o.path).map(|()| o)) {
            Ok(o) => LaneStep::Stepped(o),
            Err(e) => LaneStep::Failed(e),
        };
    }
    if let Err(e) = lm.settle() {
        for (i, _) in &trees {
            results[*i] = LaneStep::Failed(EngineError::Backend(format!("settling the step: {e}")));
        }
    }
    let report = StepReport { rows, decoding: trees.len(), prefilled: prefill_rows, forward_time };
    (results, report)
}

/// Where a lane proposes: rows other requests hold in the forward, its tree's cap, and whether
/// the batch budget cuts proposals together.
#[derive(Debug, Clone, Copy)]
struct ProposeAt {
    batch_rows: usize,
    cap: usize,
    batch_cut: bool,
}

/// Propose the lane's tree: its size, or `None` when it finished without a step.
fn propose_lane(lane: &mut Lane<'_>, committed: usize, at: ProposeAt) -> Result<Option<usize>> {
    let tree = lane.generation.propose(
        lane.drafter.as_mut(),
        lane.constraint.as_deref_mut(),
        committed,
        at.batch_rows,
        at.cap,
        at.batch_cut,
    )?;
    Ok(tree.map(|t| t.len()))
}

/// File lane `i`'s proposal outcome; returns the rows its tree adds to the forward.
fn record_proposal(
    i: usize,
    outcome: Result<Option<usize>>,
    proposed: &mut Vec<usize>,
    results: &mut [LaneStep],
) -> usize {
    match outcome {
        Ok(Some(len)) => {
            proposed.push(i);
            len
        }
        Ok(None) => {
            // Finished without a step (grammar complete, or nothing left to emit).
            results[i] = LaneStep::Stepped(StepOutcome {
                path: Vec::new(),
                emitted: Vec::new(),
                done: true,
                logprobs: Vec::new(),
                provenance: Vec::new(),
            });
            0
        }
        Err(e) => {
            results[i] = LaneStep::Failed(e);
            0
        }
    }
}

/// Propose the `proposing` lanes' trees concurrently, one thread each (lane i where `at[i]`
/// says), while this thread serves their draft forwards batched ([`SharedDraft::serve`]). Returns each lane's outcome, in lane
/// order; a lane whose thread could not start waits for the next step.
fn propose_together(
    lm: &dyn BatchedLm,
    lanes: &mut [Lane<'_>],
    proposing: &[usize],
    draft: &SharedDraft<'_>,
    at: &[ProposeAt],
) -> Vec<(usize, Result<Option<usize>>)> {
    let committed: Vec<usize> = lanes.iter().map(|l| lm.committed_len(l.lane)).collect();
    std::thread::scope(|scope| {
        let mut running = Vec::with_capacity(proposing.len());
        for (i, lane) in lanes.iter_mut().enumerate().filter(|(i, _)| proposing.contains(i)) {
            // Every seat is taken before the draft is served: no forward runs short of a lane.
            let seat = draft.seat();
            let (committed, at) = (committed[i], at[i]);
            let spawned =
                std::thread::Builder::new().name("treespec-propose".into()).spawn_scoped(scope, move || {
                    let _seat = seat;
                    propose_lane(lane, committed, at)
                });
            if let Ok(handle) = spawned {
                running.push((i, handle));
            }
        }
        draft.serve();
        running
            .into_iter()
            .map(|(i, h)| (i, h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))))
            .collect()
    })
}

/// The batch budget: every cuttable proposal of the step (`proposed` lanes) cut together by one
/// value-ordered budget on the merged forward of `rows` rows; returns the rows dropped. Lanes
/// whose trees may not be cut keep them whole; they count as rows already in the forward.
fn cut_together(lanes: &mut [Lane<'_>], proposed: &[usize], rows: usize, prompt_rows: usize) -> usize {
    let mut target = None;
    let mut candidates: Vec<(f64, usize, usize)> = Vec::new(); // (value, lane, node)
    let mut cuttable: Vec<(usize, usize)> = Vec::new(); // (lane, drafted nodes)
    for &i in proposed {
        let lane = &lanes[i];
        if let Some(c) = lane.generation.cuttable(lane.drafter.as_ref()) {
            target.get_or_insert_with(|| c.target.clone());
            candidates.extend(c.values.iter().enumerate().map(|(k, &v)| (v, i, k)));
            cuttable.push((i, c.values.len()));
        }
    }
    let Some(target) = target else { return 0 };
    let cuttable_nodes: usize = cuttable.iter().map(|&(_, n)| n).sum();
    // One order over every request's nodes: by value, then (ties) each lane's arena order, so
    // the kept nodes of a lane are a prefix of its tree.
    candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.2.cmp(&b.2)).then(a.1.cmp(&b.1)));
    // Each row also costs what its request's context adds; the fixed decoding rows are priced at
    // the proposing requests' mean context surcharge (prompt chunks count as work, see
    // `batch_cut`).
    let surcharge: Vec<f64> =
        lanes.iter().map(|l| target.row_surcharge(l.generation.context_len())).collect();
    let mean = proposed.iter().map(|&i| surcharge[i]).sum::<f64>() / proposed.len().max(1) as f64;
    let nodes: Vec<(f64, f64)> = candidates.iter().map(|c| (c.0, surcharge[c.1])).collect();
    let fixed = rows - cuttable_nodes;
    let decoding = fixed.saturating_sub(prompt_rows);
    let keep = batch_cut(&target, fixed, prompt_rows, decoding as f64 * mean, proposed.len() as f64, &nodes);
    let mut kept = vec![0usize; lanes.len()];
    for &(_, i, _) in &candidates[..keep] {
        kept[i] += 1;
    }
    let mut dropped = 0;
    for (i, n) in cuttable {
        if kept[i] < n && lanes[i].generation.cut(kept[i]).is_ok() {
            dropped += n - kept[i];
        }
    }
    dropped
}

/// A request for [`run_batched`]: what to generate, with its own drafter (and grammar).
pub struct BatchJob<'d> {
    /// The request.
    pub request: GenerateRequest,
    /// Its drafter.
    pub drafter: Box<dyn Drafter + 'd>,
    /// Its grammar state, if any.
    pub constraint: Option<Box<dyn TokenConstraint + 'd>>,
}

/// Decode `jobs` with continuous batching on `lm`: at most `max_lanes` at once, the next job
/// joining as soon as one finishes (in order). Jobs whose drafters draft on lanes of `draft` get
/// their draft forwards batched. Returns each job's output in job order. The server runs the
/// same steps; this is the loop for tests and benchmarks.
pub fn run_batched(
    lm: &mut dyn BatchedLm,
    jobs: Vec<BatchJob<'_>>,
    max_lanes: usize,
    limits: StepLimits,
    bytes: Option<&dyn TokenBytes>,
    draft: Option<&SharedDraft<'_>>,
) -> Vec<Result<GenerateOutput>> {
    let n = jobs.len();
    let mut outputs: Vec<Option<Result<GenerateOutput>>> = (0..n).map(|_| None).collect();
    let mut waiting: VecDeque<(usize, BatchJob<'_>)> = jobs.into_iter().enumerate().collect();
    let mut ids: Vec<usize> = Vec::new();
    let mut lanes: Vec<Lane<'_>> = Vec::new();
    while !waiting.is_empty() || !lanes.is_empty() {
        while lanes.len() < max_lanes.max(1) {
            let Some((i, job)) = waiting.pop_front() else { break };
            let opened = Generation::new(job.request, lm.context_size(), lm.vocab_size(), bytes)
                .and_then(|g| lm.open(g.prompt_head(), 0).map(|(lane, cached)| (g, lane, cached)));
            match opened {
                Ok((generation, lane, cached)) => {
                    ids.push(i);
                    lanes.push(Lane::new(lane, generation, job.drafter, job.constraint, cached));
                }
                Err(e) => outputs[i] = Some(Err(e)),
            }
        }
        let (results, report) = step(lm, &mut lanes, limits, bytes, draft);
        if report.rows == 0 && results.iter().all(|r| matches!(r, LaneStep::Waiting)) {
            // Nothing could run: no room for even one row.
            for (lane, i) in lanes.drain(..).zip(ids.drain(..)) {
                lm.close(lane.lane);
                outputs[i] = Some(Err(EngineError::InvalidRequest("no room in the batched context".into())));
            }
            break;
        }
        // Retire finished and failed lanes (from the back, so indices stay valid).
        let mut results = results;
        for k in (0..lanes.len()).rev() {
            let output = match std::mem::replace(&mut results[k], LaneStep::Waiting) {
                LaneStep::Stepped(o) if o.done => None,
                LaneStep::Failed(e) => Some(e),
                _ => continue,
            };
            let mut lane = lanes.remove(k);
            let i = ids.remove(k);
            lm.close(lane.lane);
            outputs[i] = Some(match output {
                None => Ok(lane.generation.finish(lane.drafter.as_mut())),
                Some(e) => {
                    lane.generation.cancel(lane.drafter.as_mut());
                    Err(e)
                }
            });
        }
    }
    outputs
        .into_iter()
        .map(|o| o.unwrap_or_else(|| Err(EngineError::State("job never ran".into()))))
        .collect()
}
