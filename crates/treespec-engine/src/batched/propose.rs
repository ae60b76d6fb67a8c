//! The propose phase of a step: every decoding lane's tree, proposed one after another, each
//! seeing the rows before it, or — with a shared draft model and two or more lanes to propose —
//! all at once, one thread each, so their draft forwards batch.

use super::{Lane, LaneStep, StepLimits};
use crate::backend::{BatchRoom, BatchedLm};
use crate::error::Result;
use crate::generation::{ProposeAt, StepOutcome};
use crate::shared_draft::SharedDraft;

/// The forward being put together: its rows so far (the prompt chunks', then each tree's), and
/// the members whose trees are in it, in the order they were proposed.
#[derive(Debug)]
pub(super) struct Proposals {
    pub(super) rows: usize,
    pub(super) members: Vec<usize>,
}

impl Proposals {
    /// File member `member`'s proposal: its tree joins the forward, or the lane is done
    /// (finished without a step: grammar complete, or nothing left to emit), or it failed.
    /// Returns the rows its tree adds.
    fn file(&mut self, member: usize, outcome: Result<Option<usize>>, results: &mut [LaneStep]) -> usize {
        match outcome {
            Ok(Some(len)) => {
                self.members.push(member);
                self.rows += len;
                len
            }
            Ok(None) => {
                results[member] = LaneStep::Stepped(StepOutcome {
                    path: Vec::new(),
                    emitted: Vec::new(),
                    done: true,
                    logprobs: Vec::new(),
                    text: Vec::new(),
                });
                0
            }
            Err(e) => {
                results[member] = LaneStep::Failed(e);
                0
            }
        }
    }
}

/// What bounds the step's trees: the room in the forward, the paths the shared draft model has
/// free (unbounded without one), and the step's limits.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    room: BatchRoom,
    draft_paths: usize,
    limits: StepLimits,
}

/// Propose the tree of every lane that decodes this step (begun, its prompt in or finished by
/// this step's chunk, not done, not failed this step) on top of the `prefilled` rows of prompt
/// chunks, within `room`; `reading[member]` is the prompt tokens member reads this step. A lane
/// whose chunk finishes its prompt takes its first step in the same forward: its tree sits right
/// after the chunk (one step sooner to the first token). Every decoding lane puts at least its
/// root in, whatever the order; a lane that finds no room waits for the next step.
pub(super) fn propose_trees(
    lm: &dyn BatchedLm,
    lanes: &mut [&mut Lane<'_>],
    results: &mut [LaneStep],
    room: BatchRoom,
    reading: &[usize],
    limits: StepLimits,
    draft: Option<&SharedDraft<'_>>,
) -> Proposals {
    let prefilled: usize = reading.iter().sum();
    let proposing: Vec<usize> =
        (0..lanes.len()).filter(|&i| proposes(lanes[i], &results[i], reading[i])).collect();
    let n = proposing.len();
    let free_rows = room.rows.saturating_sub(prefilled);
    let draft_paths = draft.map_or(usize::MAX, SharedDraft::free_paths);
    let mut proposals = Proposals { rows: prefilled, members: Vec::new() };
    let together = limits.batch_draft && n >= 2 && free_rows >= n && room.paths >= n;
    match draft.filter(|_| together) {
        Some(draft) => {
            // Each tree gets an equal share of the room.
            let cap = (free_rows / n - 1).min(room.paths / n - 1).min(draft_paths / n).min(limits.max_tree);
            let at = shares(lm, lanes, &proposing, reading, proposals.rows, cap, limits.batch_budget);
            for (member, outcome) in propose_together(lanes, &at, draft) {
                proposals.file(member, outcome, results);
            }
        }
        None => {
            let bounds = Bounds { room, draft_paths, limits };
            propose_in_turn(lm, lanes, results, &proposing, reading, bounds, &mut proposals);
        }
    }
    proposals
}

/// Whether a lane proposes this step: its drafter began, its prompt is in once it has read the
/// `reading` tokens of this step's chunk, it is not done, and nothing failed it this step.
fn proposes(lane: &Lane<'_>, result: &LaneStep, reading: usize) -> bool {
    lane.begun
        && lane.prefill_left() == reading
        && matches!(result, LaneStep::Waiting)
        && !lane.generation.is_done()
}

/// Where each of the `proposing` lanes proposes when all propose at once: on top of what it holds
/// and reads this step, at most `cap` drafted nodes, and, not seeing the others' trees, expecting
/// each other lane to put in as many rows as its last tree did (beside the `rows` already in).
fn shares(
    lm: &dyn BatchedLm,
    lanes: &[&mut Lane<'_>],
    proposing: &[usize],
    reading: &[usize],
    rows: usize,
    cap: usize,
    batch_cut: bool,
) -> Vec<(usize, ProposeAt)> {
    let expected: usize = proposing.iter().map(|&i| lanes[i].last_rows).sum();
    proposing
        .iter()
        .map(|&i| {
            let lane = &lanes[i];
            let committed = lm.committed_len(lane.lane) + reading[i];
            // Its own chunk is not another request's work: it prices its first step as alone.
            let batch_rows = rows - reading[i] + expected.saturating_sub(lane.last_rows);
            (i, ProposeAt { committed, batch_rows, cap, batch_cut })
        })
        .collect()
}

/// One after another, each tree proposed knowing the rows already in the forward and the roots
/// still to come, and capped by the rows and paths left (a lane finding none waits).
fn propose_in_turn(
    lm: &dyn BatchedLm,
    lanes: &mut [&mut Lane<'_>],
    results: &mut [LaneStep],
    proposing: &[usize],
    reading: &[usize],
    bounds: Bounds,
    proposals: &mut Proposals,
) {
    let Bounds { room, draft_paths, limits } = bounds;
    let mut roots_to_come = proposing.len();
    let mut paths = 0usize;
    for &i in proposing {
        roots_to_come -= 1;
        let free_rows = room.rows.saturating_sub(proposals.rows);
        let free_paths = room.paths.saturating_sub(paths);
        if free_rows == 0 || free_paths == 0 {
            continue; // no room this step: it waits
        }
        let committed = lm.committed_len(lanes[i].lane) + reading[i];
        // The tree may use the rows and paths left, and at most `max_tree` drafted nodes.
        let cap = (free_rows - 1).min(free_paths - 1).min(draft_paths).min(limits.max_tree);
        let batch_rows = proposals.rows - reading[i] + roots_to_come;
        let at = ProposeAt { committed, batch_rows, cap, batch_cut: limits.batch_budget };
        let outcome = propose_lane(lanes[i], at);
        paths += proposals.file(i, outcome, results);
    }
}

/// Propose the lane's tree where `at` says: its size, or `None` when it finished without a
/// step.
fn propose_lane(lane: &mut Lane<'_>, at: ProposeAt) -> Result<Option<usize>> {
    let tree = lane.generation.propose(lane.drafter.as_mut(), lane.constraint.as_deref_mut(), at)?;
    Ok(tree.map(|t| t.len()))
}

/// Propose the trees of the members `at` lists concurrently, one thread each (where `at` says),
/// while this thread serves their draft forwards batched ([`SharedDraft::serve`]). Returns each
/// member's outcome, in member order; a member whose thread could not start waits for the next
/// step.
fn propose_together(
    lanes: &mut [&mut Lane<'_>],
    at: &[(usize, ProposeAt)],
    draft: &SharedDraft<'_>,
) -> Vec<(usize, Result<Option<usize>>)> {
    std::thread::scope(|scope| {
        let mut running = Vec::with_capacity(at.len());
        for (member, lane) in lanes.iter_mut().enumerate() {
            let Some(&(_, place)) = at.iter().find(|(m, _)| *m == member) else { continue };
            let lane: &mut Lane<'_> = lane;
            // Every seat is taken before the draft is served: no forward runs short of a lane.
            let seat = draft.seat();
            let spawned =
                std::thread::Builder::new().name("treespec-propose".into()).spawn_scoped(scope, move || {
                    let _seat = seat;
                    propose_lane(lane, place)
                });
            if let Ok(handle) = spawned {
                running.push((member, handle));
            }
        }
        draft.serve();
        running
            .into_iter()
            .map(|(member, h)| (member, h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))))
            .collect()
    })
}
