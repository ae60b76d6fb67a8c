//! One continuous-batching step as a sequence of phases: prompt chunks → begin drafters →
//! propose → cut → forward (and complete each tree) → commit → settle.
//!
//! Every phase works on the step's lanes by *member* index (position in the slice), so results
//! come back in member order. A lane's own failure fails only that lane; a failed forward fails
//! every lane that had rows in it, a failed settle every lane that decoded.

use std::time::{Duration, Instant};

use super::chunks::{plan_chunks, Chunk, PromptLeft, STARVE_STEPS};
use super::cut::cut_together;
use super::propose::{propose_trees, Proposals};
use super::{Lane, LaneStep, StepLimits, StepReport};
use crate::backend::TokenBytes;
use crate::backend::{BatchedLm, LaneWork, Logits, TreeBatch};
use crate::drafter::ForwardCost;
use crate::error::{EngineError, Result};
use crate::generation::{Scored, StepOutcome};
use crate::shared_draft::SharedDraft;

/// A tree of the step: member `member`'s proposal as the rows it feeds.
#[derive(Debug)]
struct Tree {
    member: usize,
    batch: TreeBatch,
}

/// What the step's one forward gave: its time, and each tree's completed step (in tree order).
type Completed = (Duration, Vec<Result<StepOutcome>>);

/// One continuous-batching step over `lanes`: prompt chunks, then every decoding lane's tree,
/// ONE forward, then per lane: verify, commit, emit. Trees are proposed in lane order, each
/// seeing the rows before it — or, with a shared `draft` model and two or more lanes to propose,
/// all at once, so their draft forwards batch too. A lane's own failure fails only that lane; a
/// failed forward fails every lane that had rows in it.
///
/// The lanes are wherever their owner keeps them (a [`Batch`](super::Batch) keeps each beside
/// its data): the phases in order, each one's results (a failure, a finished request) filed in
/// `results` by member.
pub(super) fn step_lanes(
    lm: &mut dyn BatchedLm,
    lanes: &mut [&mut Lane<'_>],
    limits: StepLimits,
    bytes: Option<&dyn TokenBytes>,
    draft: Option<&SharedDraft<'_>>,
) -> (Vec<LaneStep>, StepReport) {
    let mut results: Vec<LaneStep> = lanes.iter().map(|_| LaneStep::Waiting).collect();
    let room = lm.room();
    let budget = prompt_budget(lanes, limits);
    let chunks = prompt_chunks(lanes, budget, room.rows);
    let prefilled: usize = chunks.iter().map(|c| c.tokens).sum();
    begin_drafters(lanes, &mut results);
    if let Some(draft) = draft {
        draft.drain(budget);
    }
    let mut reading = vec![0; lanes.len()];
    chunks.iter().for_each(|c| reading[c.member] = c.tokens);
    let proposals = propose_trees(lm, lanes, &mut results, room, &reading, limits, draft);
    let rows = cut(lanes, &proposals, &reading, limits.batch_budget);
    let trees = tree_batches(lanes, &proposals.members);
    if rows == 0 {
        return (results, StepReport::default());
    }
    let (forward_time, outcomes) = match forward(lm, lanes, &chunks, &trees, rows, bytes) {
        Ok(completed) => completed,
        Err(e) => {
            let members = chunks.iter().map(|c| c.member).chain(trees.iter().map(|t| t.member));
            fail(&mut results, members, || EngineError::Backend(format!("batched forward: {e}")));
            return (results, StepReport::default());
        }
    };
    commit(lm, lanes, &trees, outcomes, &mut results);
    if let Err(e) = lm.settle() {
        let members = trees.iter().map(|t| t.member);
        fail(&mut results, members, || EngineError::Backend(format!("settling the step: {e}")));
    }
    let report = StepReport { rows, decoding: trees.len(), prefilled, forward_time };
    (results, report)
}

/// Most prompt tokens the step reads (target and shared draft model alike): `decode_chunk`
/// while any request is decoding — its next token waits for the whole step — and
/// `prefill_chunk` when every request in the batch is still reading its prompt.
fn prompt_budget(lanes: &[&mut Lane<'_>], limits: StepLimits) -> usize {
    let decoding = lanes.iter().any(|l| l.prefill_left() == 0 && !l.generation.is_done());
    match decoding {
        true => limits.decode_chunk.clamp(1, limits.prefill_chunk.max(1)),
        false => limits.prefill_chunk,
    }
}

/// The step's prompt chunks (`chunks.rs`: shortest prompt first, a short step when a first token
/// is near, no prompt starved), at most `budget` tokens in all and no more than the forward
/// holds: a long prompt is read over several steps, so it never stalls the requests already
/// decoding. Each lane with prompt left that gets no chunk counts one more step passed over.
fn prompt_chunks(lanes: &mut [&mut Lane<'_>], budget: usize, room_rows: usize) -> Vec<Chunk> {
    let prompts: Vec<PromptLeft> = lanes
        .iter()
        .map(|l| PromptLeft { left: l.prefill_left(), starved: l.passed_over >= STARVE_STEPS })
        .collect();
    let first_token_due = lanes.iter().any(|l| l.awaits_first_step());
    let chunks = plan_chunks(&prompts, first_token_due, budget, room_rows);
    for (member, lane) in lanes.iter_mut().enumerate() {
        if chunks.iter().any(|c| c.member == member) {
            lane.passed_over = 0;
        } else if lane.prefill_left() > 0 {
            lane.passed_over += 1;
        }
    }
    chunks
}

/// Drafters begin as soon as their request joins, so that a draft model may read the prompt a
/// chunk per step beside the target ([`SharedDraft::drain`]) instead of all at once when the
/// target is done with it. A drafter that cannot begin fails its lane.
fn begin_drafters(lanes: &mut [&mut Lane<'_>], results: &mut [LaneStep]) {
    for (member, lane) in lanes.iter_mut().enumerate().filter(|(_, l)| !l.begun) {
        match lane.generation.begin(lane.drafter.as_mut(), Duration::ZERO) {
            Ok(()) => lane.begun = true,
            Err(e) => results[member] = LaneStep::Failed(e),
        }
    }
}

/// The batch budget, when on and when there is more than one request's work in the forward (a
/// request alone in a forward with no prompt chunk but its own already priced its tree with its
/// own budget, as its first step alone would): every cuttable proposal cut together on the merged
/// forward. Returns the forward's rows.
fn cut(lanes: &mut [&mut Lane<'_>], proposals: &Proposals, reading: &[usize], batch_budget: bool) -> usize {
    let prefilled: usize = reading.iter().sum();
    let others = prefilled - proposals.members.iter().map(|&m| reading[m]).sum::<usize>();
    if batch_budget && (proposals.members.len() > 1 || others > 0) {
        proposals.rows - cut_together(lanes, &proposals.members, proposals.rows, prefilled)
    } else {
        proposals.rows
    }
}

/// The proposed trees (after any cut) as the rows they feed. Each lane remembers its tree's rows
/// (what the others expect of it next step). Single-row trees (plain steps) go first: every one
/// of them is kept, so the rows a commit drops sit above them (the backend then moves fewer kept
/// rows).
fn tree_batches(lanes: &mut [&mut Lane<'_>], members: &[usize]) -> Vec<Tree> {
    let mut trees: Vec<Tree> = members
        .iter()
        .filter_map(|&member| {
            let tree = lanes[member].generation.proposed()?;
            Some(Tree { member, batch: TreeBatch::from_tree(tree, 0) })
        })
        .collect();
    for tree in &trees {
        lanes[tree.member].last_rows = tree.batch.len();
        lanes[tree.member].decoded = true;
    }
    trees.sort_by_key(|t| t.batch.len() > 1);
    trees
}

/// The step's ONE forward over every prompt chunk and every tree, then, on its rows as the
/// backend lends them (no copy): the chunks' prefill progress, and each tree's verification and
/// emission. Errors when the forward fails (every lane in it fails).
fn forward(
    lm: &mut dyn BatchedLm,
    lanes: &mut [&mut Lane<'_>],
    chunks: &[Chunk],
    trees: &[Tree],
    rows: usize,
    bytes: Option<&dyn TokenBytes>,
) -> Result<Completed> {
    let work = lane_work(lanes, chunks, trees);
    let t = Instant::now();
    let logits = lm.forward(&work);
    drop(work);
    let logits = logits?;
    let time = t.elapsed();
    advance_prefill(lanes, chunks, time);
    let prompt_rows = chunks.iter().map(|c| c.tokens).sum();
    let forward = ForwardCost { rows, prompt_rows, time, graph_reused: logits.graph_reused() };
    let outcomes = complete(lanes, trees, &logits, forward, bytes);
    Ok((time, outcomes))
}

/// What each lane feeds, prompt chunks first, then the trees in their order.
fn lane_work<'a>(lanes: &'a [&mut Lane<'_>], chunks: &[Chunk], trees: &'a [Tree]) -> Vec<LaneWork<'a>> {
    let mut work: Vec<LaneWork<'a>> = Vec::with_capacity(chunks.len() + trees.len());
    for &Chunk { member, tokens } in chunks {
        let lane: &'a Lane<'_> = &*lanes[member];
        let head = lane.generation.prompt_head();
        work.push(LaneWork::Prefill {
            lane: lane.lane,
            tokens: &head[lane.prefilled..lane.prefilled + tokens],
        });
    }
    for tree in trees {
        work.push(LaneWork::Tree { lane: lanes[tree.member].lane, batch: &tree.batch });
    }
    work
}

/// The chunks are in: each lane's prefill progress and prefill time (the whole forward's time,
/// as it waited that long); a lane whose prompt head is all in tells its generation.
fn advance_prefill(lanes: &mut [&mut Lane<'_>], chunks: &[Chunk], time: Duration) {
    for &Chunk { member, tokens } in chunks {
        let lane = &mut *lanes[member];
        lane.prefilled += tokens;
        lane.prefill_time += time;
        if lane.prefill_left() == 0 {
            let t = lane.prefill_time;
            lane.generation.prefilled(t);
        }
    }
}

/// Each tree's step completed on its own rows of the `forward`, in tree order.
fn complete(
    lanes: &mut [&mut Lane<'_>],
    trees: &[Tree],
    logits: &Logits<'_>,
    forward: ForwardCost,
    bytes: Option<&dyn TokenBytes>,
) -> Vec<Result<StepOutcome>> {
    let mut offset = 0;
    trees
        .iter()
        .map(|tree| {
            let lane = &mut *lanes[tree.member];
            let own = logits.slice(offset..offset + tree.batch.len());
            offset += tree.batch.len();
            let scored = Scored { logits: &own, forward };
            lane.generation.complete(lane.drafter.as_mut(), lane.constraint.as_deref_mut(), scored, bytes)
        })
        .collect()
}

/// Each lane whose step completed keeps its accepted path in the target (taking effect at the
/// settle); the step's result is filed, or the lane's own error.
fn commit(
    lm: &mut dyn BatchedLm,
    lanes: &[&mut Lane<'_>],
    trees: &[Tree],
    outcomes: Vec<Result<StepOutcome>>,
    results: &mut [LaneStep],
) {
    for (tree, outcome) in trees.iter().zip(outcomes) {
        let lane = lanes[tree.member].lane;
        results[tree.member] = match outcome.and_then(|o| lm.commit(lane, &o.path).map(|()| o)) {
            Ok(o) => LaneStep::Stepped(o),
            Err(e) => LaneStep::Failed(e),
        };
    }
}

/// Fail every one of `members` with an error of work they shared (the forward, the settle).
fn fail(results: &mut [LaneStep], members: impl Iterator<Item = usize>, error: impl Fn() -> EngineError) {
    for member in members {
        results[member] = LaneStep::Failed(error());
    }
}
