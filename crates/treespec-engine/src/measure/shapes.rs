//! Timing the padded shapes (`treespec_core::cost::shapes`): each shape as a *changed* forward,
//! right after a forward of another shape, and as a *replayed* one, after forwards of its own —
//! the two prices a padded step pays. Measured through the model's own padding, so a bucket's
//! time includes its filler rows and its fixed set of sequence ids exactly as decoding runs them.

use std::time::Instant;

use treespec_core::cost::shapes::{ShapeBuckets, ShapeTime, ShapeTimes};

use crate::backend::{CausalLm, TreeBatch};
use crate::error::{EngineError, Result};

/// Forwards of a shape before one is timed as replayed: llama.cpp reuses a graph from the second
/// forward of a shape, and ggml-cuda captures a CUDA graph on the second and replays it from the
/// third.
const REPLAY_LEAD_IN: usize = 2;

/// Committed tokens under the timed forwards.
const PREFIX: usize = 64;

/// Time one row and every bucket of `buckets`, `repeat` times each (the median is kept), changed
/// and replayed, on `lm` padded to `buckets` for the measurement (left unpadded after it, with an
/// empty cache). Errors when the model cannot pad or the context is too small.
pub fn time_shapes(lm: &mut dyn CausalLm, buckets: &ShapeBuckets, repeat: usize) -> Result<ShapeTimes> {
    let largest = buckets.sizes().last().copied().unwrap_or(1);
    if PREFIX + largest >= lm.context_size() {
        return Err(EngineError::InvalidRequest(format!(
            "timing shapes up to {largest} rows needs a context above {}",
            PREFIX + largest
        )));
    }
    if !lm.pad_shapes(Some(buckets)) {
        return Err(EngineError::InvalidRequest("this model cannot pad its forwards to fixed shapes".into()));
    }
    let result = time_padded(lm, buckets, repeat.max(1));
    lm.pad_shapes(None);
    lm.truncate(0)?;
    result
}

fn time_padded(lm: &mut dyn CausalLm, buckets: &ShapeBuckets, repeat: usize) -> Result<ShapeTimes> {
    let vocab = lm.vocab_size() as u32;
    let tokens: Vec<u32> = (0..(PREFIX + 64) as u32).map(|i| (i * 7919 + 13) % vocab).collect();
    lm.truncate(0)?;
    lm.prefill(&tokens[..PREFIX])?;
    // Each shape's real rows: one row alone, a bucket's rows less its one filler row.
    let shapes: Vec<(usize, usize)> =
        std::iter::once((1, 1)).chain(buckets.sizes().iter().map(|&b| (b, b - 1))).collect();
    let chain = |rows: usize| TreeBatch::chain(&tokens[PREFIX..PREFIX + rows.min(64)], None, 0, false);
    let mut forward = |rows: usize| -> Result<f64> {
        let batch = chain(rows);
        let t = Instant::now();
        lm.forward(&batch)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        lm.commit(&[])?;
        Ok(ms.max(1e-6))
    };
    // Warm every shape once (a device loads each kernel on its first use).
    for &(_, rows) in &shapes {
        forward(rows)?;
    }
    let mut times = Vec::with_capacity(shapes.len());
    for (k, &(shape, rows)) in shapes.iter().enumerate() {
        // Another shape before each changed timing: the neighbour in the list.
        let other = shapes[(k + 1) % shapes.len()].1;
        let (mut changed, mut replayed) = (Vec::new(), Vec::new());
        for _ in 0..repeat {
            forward(other)?;
            changed.push(forward(rows)?);
            for _ in 1..REPLAY_LEAD_IN {
                forward(rows)?;
            }
            replayed.push(forward(rows)?);
        }
        times.push(ShapeTime { rows: shape, changed_ms: median(changed), replayed_ms: median(replayed) });
    }
    ShapeTimes::new(buckets.clone(), times).map_err(|e| EngineError::Backend(format!("shape times: {e}")))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use treespec_core::cost::CostCurve;

    use super::*;
    use crate::toy::{ToyLm, ToyModel};

    fn toy() -> ToyLm {
        ToyLm::new(ToyModel::new(32, 2, 1), 512)
    }

    #[test]
    fn a_context_too_small_for_the_largest_bucket_is_refused() {
        let mut lm = ToyLm::new(ToyModel::new(32, 2, 1), 100);
        let err = time_shapes(&mut lm, &ShapeBuckets::default(), 1).unwrap_err();
        assert!(err.to_string().contains("context above 128"), "{err}");
    }

    /// A simulated device bound by launches: 8 ms for a shape that changed, 1 ms a replay.
    fn launch_bound(rows: usize, repeats: usize) -> Duration {
        Duration::from_micros(if repeats >= 2 { 1000 + rows as u64 } else { 8000 + 10 * rows as u64 })
    }

    #[test]
    fn a_device_that_replays_repeated_shapes_makes_padding_pay() {
        let buckets = ShapeBuckets::new(&[8, 16]).unwrap();
        let mut lm = toy().on_device(launch_bound);
        let times = time_shapes(&mut lm, &buckets, 3).unwrap();
        let t8 = times.time(8).unwrap();
        assert!(t8.replayed_ms < t8.changed_ms / 3.0, "{t8:?}");
        // Unpadded, tree sizes change every step: the curve's T(n) is the changed time.
        let curve = CostCurve::from_points(&[(1, 8.0), (16, 8.2)]).unwrap();
        assert!(times.padding_pays(&curve));
        assert_eq!(lm.pending_len() + lm.committed_len(), 0, "the cache is left empty");
    }

    #[test]
    fn a_cpu_where_rows_cost_time_makes_padding_lose() {
        let buckets = ShapeBuckets::new(&[8, 16]).unwrap();
        let mut lm = toy().with_forward_time(|rows| Duration::from_micros(2000 + 1000 * rows as u64));
        let times = time_shapes(&mut lm, &buckets, 3).unwrap();
        let curve = CostCurve::linear(3.0, 1.0, 64).unwrap();
        assert!(!times.padding_pays(&curve), "{times:?}");
    }
}
