//! A recorded run's shape sequence replayed as real forwards (`treespec profile --replay-trace`):
//! each step's rows fed and its emitted tokens committed, in order, on any model — on a device,
//! the random-weight files of `scripts/gpu-check.sh` — so the wall time holds what a curve leaves
//! out: the host's work between forwards, graph rebuilds when the shape changes, and the KV
//! bookkeeping. Beside it, what the measured times predict for the same sequence, so a curve's
//! prediction can be checked against the loop it prices.
//!
//! A decision trace records each step's rows and emitted tokens, not its tree's shape: a step is
//! replayed as a chain of its rows (a real tree's branches add path copies, and a commit off the
//! first path a compaction, which the replay leaves out).

use std::time::Instant;

use treespec_core::cost::shapes::ShapeTimes;
use treespec_core::cost::CostCurve;

use crate::backend::{CausalLm, TreeBatch};
use crate::error::{EngineError, Result};

/// One recorded step: the committed tokens it attended to, the rows of its forward and the
/// tokens it emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayStep {
    /// Committed tokens before the step.
    pub context: usize,
    /// Rows of the target forward (the root and the drafted nodes).
    pub rows: usize,
    /// Tokens the step emitted (its accepted nodes and the target's own).
    pub emitted: usize,
}

/// A sequence replayed.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ReplayTiming {
    /// Steps replayed.
    pub steps: usize,
    /// Wall milliseconds of the whole loop (forwards, commits, the host's work between them).
    pub wall_ms: f64,
    /// Of them, inside the forwards.
    pub forward_ms: f64,
    /// Forwards that reused the graph of the forward before (where the backend counts).
    pub graph_reuses: u64,
}

impl ReplayTiming {
    /// The host's milliseconds per step outside the forwards.
    pub fn host_ms_per_step(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            (self.wall_ms - self.forward_ms) / self.steps as f64
        }
    }
}

/// The plain-decoding sequence that emits what `steps` emit: one row, one token, from the first
/// step's context.
pub fn plain_sequence(steps: &[ReplayStep]) -> Vec<ReplayStep> {
    let start = steps.first().map_or(0, |s| s.context);
    let tokens: usize = steps.iter().map(|s| s.emitted).sum();
    (0..tokens).map(|i| ReplayStep { context: start + i, rows: 1, emitted: 1 }).collect()
}

/// Replay `steps` on `lm` (as it is set up: padded or not), starting from a cache of the first
/// step's context (ordinary tokens), and leave its cache empty. Errors when a step does not fit
/// the context.
pub fn replay(lm: &mut dyn CausalLm, steps: &[ReplayStep]) -> Result<ReplayTiming> {
    let Some(first) = steps.first() else { return Ok(ReplayTiming::default()) };
    let vocab = lm.vocab_size() as u32;
    let token = |i: usize| (i as u32).wrapping_mul(7919).wrapping_add(13) % vocab;
    let end = first.context + steps.iter().map(|s| s.emitted).sum::<usize>();
    let widest = steps.iter().map(|s| s.rows).max().unwrap_or(1);
    if end + widest > lm.context_size() {
        return Err(EngineError::InvalidRequest(format!(
            "the sequence reaches {} positions; the context holds {}",
            end + widest,
            lm.context_size()
        )));
    }
    lm.truncate(0)?;
    lm.prefill(&(0..first.context).map(token).collect::<Vec<_>>())?;
    let reuses_before = lm.graph_reuses().unwrap_or(0);
    let mut timing = ReplayTiming { steps: steps.len(), ..Default::default() };
    let started = Instant::now();
    for s in steps {
        let at = lm.committed_len();
        let tokens: Vec<u32> = (at..at + s.rows.max(1)).map(token).collect();
        let batch = TreeBatch::chain(&tokens, None, 0, false);
        let t = Instant::now();
        lm.forward(&batch)?;
        timing.forward_ms += t.elapsed().as_secs_f64() * 1e3;
        let keep: Vec<usize> = (0..s.emitted.clamp(1, tokens.len())).collect();
        lm.commit(&keep)?;
    }
    timing.wall_ms = started.elapsed().as_secs_f64() * 1e3;
    timing.graph_reuses = lm.graph_reuses().unwrap_or(0).saturating_sub(reuses_before);
    lm.truncate(0)?;
    Ok(timing)
}

/// What `curve` and the measured `shapes` predict the forwards of `steps` take: padded, each step
/// at its shape's replay when the step before had that shape and at its changed time otherwise;
/// unpadded the same for sizes the shapes were timed at (one row, the buckets), and T(rows)
/// elsewhere, as the curve times a size after other sizes.
pub fn predict_ms(steps: &[ReplayStep], curve: &CostCurve, shapes: &ShapeTimes, padded: bool) -> f64 {
    let mut previous = None;
    let mut total = 0.0;
    for s in steps {
        let shape = if padded { shapes.buckets.shape(s.rows) } else { s.rows };
        total += shapes.shape_ms(curve, shape, previous);
        previous = Some(shape);
    }
    total
}

#[cfg(test)]
mod tests {
    use treespec_core::cost::shapes::{ShapeBuckets, ShapeTime};

    use super::*;
    use crate::toy::{ToyLm, ToyModel};

    fn steps() -> Vec<ReplayStep> {
        let rows_emitted = [(1, 1), (1, 1), (5, 3), (7, 7), (1, 1), (12, 2)];
        let mut context = 10;
        rows_emitted
            .iter()
            .map(|&(rows, emitted)| {
                let s = ReplayStep { context, rows, emitted };
                context += emitted;
                s
            })
            .collect()
    }

    #[test]
    fn a_replay_commits_what_each_step_emitted_and_leaves_the_cache_empty() {
        let mut lm = ToyLm::new(ToyModel::new(32, 2, 1), 256);
        let t = replay(&mut lm, &steps()).unwrap();
        assert_eq!(t.steps, 6);
        assert!(t.wall_ms >= t.forward_ms);
        assert_eq!(lm.committed_len() + lm.pending_len(), 0);
        let plain = plain_sequence(&steps());
        assert_eq!(plain.len(), 15);
        assert!(plain.iter().all(|s| s.rows == 1 && s.emitted == 1));
        assert_eq!(plain.last().unwrap().context, 24);
        let mut small = ToyLm::new(ToyModel::new(32, 2, 1), 30);
        assert!(replay(&mut small, &steps()).unwrap_err().to_string().contains("context holds 30"));
    }

    #[test]
    fn the_prediction_prices_a_repeated_shape_at_its_replay() {
        let b = ShapeBuckets::new(&[8, 16]).unwrap();
        let t = |rows| ShapeTime { rows, changed_ms: 10.0, replayed_ms: 2.0 };
        let shapes = ShapeTimes::new(b, vec![t(1), t(8), t(16)]).unwrap();
        let curve = CostCurve::linear(10.0, 0.0, 64).unwrap();
        // Unpadded: 1 (changed), 1 (replayed), 5, 7, 1, 12 (sizes not timed: T(n) = 10).
        assert_eq!(predict_ms(&steps(), &curve, &shapes, false), 10.0 + 2.0 + 10.0 + 10.0 + 10.0 + 10.0);
        // Padded: 1, 1 (replayed), 8, 8 (replayed), 1, 16.
        assert_eq!(predict_ms(&steps(), &curve, &shapes, true), 10.0 + 2.0 + 10.0 + 2.0 + 10.0 + 10.0);
    }
}
