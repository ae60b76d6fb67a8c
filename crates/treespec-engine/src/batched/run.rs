//! [`run_batched`]: a whole continuous-batching run over a list of jobs, on a [`Batch`].

use std::collections::VecDeque;

use super::{Batch, LaneStep, StepLimits};
use crate::backend::{BatchedLm, TokenBytes};
use crate::error::{EngineError, Result};
use crate::generation::Generation;
use crate::generation_io::{GenerateOutput, Prepared};
use crate::shared_draft::SharedDraft;

/// Each job's output, by job index, as the run files them.
type Outputs = Vec<Option<Result<GenerateOutput>>>;

/// Decode `jobs` with continuous batching on `lm`: at most `max_lanes` at once, the next job
/// joining as soon as one finishes (in order). Jobs whose drafters draft on lanes of `draft` get
/// their draft forwards batched. Returns each job's output in job order. The server runs the
/// same steps; this is the loop for tests and benchmarks.
pub fn run_batched<'d>(
    lm: &mut dyn BatchedLm,
    jobs: Vec<Prepared<'d>>,
    max_lanes: usize,
    limits: StepLimits,
    bytes: Option<&dyn TokenBytes>,
    draft: Option<&SharedDraft<'_>>,
) -> Vec<Result<GenerateOutput>> {
    let mut outputs: Outputs = jobs.iter().map(|_| None).collect();
    let mut waiting: VecDeque<(usize, Prepared<'d>)> = jobs.into_iter().enumerate().collect();
    // Each member's data is its job's index.
    let mut batch: Batch<'d, usize> = Batch::new();
    while !waiting.is_empty() || !batch.is_empty() {
        admit(lm, &mut batch, &mut waiting, max_lanes.max(1), bytes, &mut outputs);
        let (results, report) = batch.step(lm, limits, bytes, draft);
        if report.rows == 0 && results.iter().all(|r| matches!(r, LaneStep::Waiting)) {
            // Nothing could run: no room for even one row.
            while !batch.is_empty() {
                let i = batch.abandon(lm, 0);
                outputs[i] = Some(Err(EngineError::InvalidRequest("no room in the batched context".into())));
            }
            break;
        }
        retire(lm, &mut batch, results, &mut outputs);
    }
    outputs
        .into_iter()
        .map(|o| o.unwrap_or_else(|| Err(EngineError::State("job never ran".into()))))
        .collect()
}

/// Waiting jobs join, in order, while the batch has fewer than `max_lanes` members. A job whose
/// request is invalid, or that finds no lane, fails alone and the next one tries.
fn admit<'d>(
    lm: &mut dyn BatchedLm,
    batch: &mut Batch<'d, usize>,
    waiting: &mut VecDeque<(usize, Prepared<'d>)>,
    max_lanes: usize,
    bytes: Option<&dyn TokenBytes>,
    outputs: &mut Outputs,
) {
    while batch.len() < max_lanes {
        let Some((i, job)) = waiting.pop_front() else { break };
        let Prepared { request, drafter, constraint, .. } = job;
        let joined = Generation::new(request, lm.context_size(), lm.vocab_size(), bytes)
            .and_then(|generation| batch.join(lm, generation, drafter, constraint, 0, i));
        if let Err(e) = joined {
            outputs[i] = Some(Err(e));
        }
    }
}

/// Members that finished or failed this step leave (from the back, so the earlier members'
/// indices stay valid), and their outputs are filed under their jobs.
fn retire(
    lm: &mut dyn BatchedLm,
    batch: &mut Batch<'_, usize>,
    results: Vec<LaneStep>,
    outputs: &mut Outputs,
) {
    for (k, result) in results.into_iter().enumerate().rev() {
        let failure = match result {
            LaneStep::Stepped(o) if o.done => None,
            LaneStep::Failed(e) => Some(e),
            _ => continue,
        };
        let (i, output) = batch.leave(lm, k, failure.is_none());
        outputs[i] = Some(match failure {
            Some(e) => Err(e),
            None => output.ok_or_else(|| EngineError::State("a finished request left no output".into())),
        });
    }
}
