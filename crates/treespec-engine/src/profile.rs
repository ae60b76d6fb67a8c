//! Timing a model's forwards: the start-up profile behind `treespec profile` and the measured cost
//! curves (`treespec costs`) that the cost-aware drafters in [`crate::auto_budget`] decide on.

use std::time::Instant;

use treespec_core::cost::CostCurve;

use crate::error::{EngineError, Result};
use crate::model::{CausalLm, TreeBatch};

/// Batch sizes a start-up profile times (sizes in between are interpolated, larger ones
/// extrapolated): every size up to 8, where the kernels change most, then a sparser grid out to
/// 64 rows, since suffix drafts of long exact copies reach that far.
pub const PROFILE_SIZES: &[usize] = &[1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 32, 48, 64];

/// Committed tokens under the timed batches (a realistic, short KV length).
const PROFILE_PREFIX: usize = 64;

/// What a profile times: one forward of `n` new tokens (a chain) for each `n` in `sizes`, on top
/// of `prefix` committed tokens, `repeat` times each.
#[derive(Debug, Clone, Copy)]
pub struct ProfileSpec<'a> {
    /// Batch sizes.
    pub sizes: &'a [usize],
    /// Timed runs per size.
    pub repeat: usize,
    /// Committed tokens under the timed batches.
    pub prefix: usize,
    /// Logits for the last row only (a prompt batch) instead of every row (a verify batch).
    pub last_only: bool,
}

/// The timing of one batch size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimedSize {
    /// Tokens in the batch.
    pub n: usize,
    /// Median milliseconds.
    pub median_ms: f64,
    /// Fastest run.
    pub min_ms: f64,
}

/// Time forwards as `spec` says (after a warm-up of the smallest and largest size, whose first
/// decodes allocate buffers). The model's cache is left empty.
pub fn time_forwards(lm: &mut dyn CausalLm, spec: ProfileSpec) -> Result<Vec<TimedSize>> {
    let max_n = spec.sizes.iter().copied().max().unwrap_or(0);
    if spec.sizes.is_empty() || spec.repeat == 0 || spec.sizes.contains(&0) {
        return Err(EngineError::InvalidRequest(
            "a cost profile needs batch sizes ≥ 1 and repeat ≥ 1".into(),
        ));
    }
    if spec.prefix + max_n >= lm.context_size() {
        return Err(EngineError::InvalidRequest(format!(
            "a cost profile up to {max_n} tokens on {} committed ones needs a context above {}",
            spec.prefix,
            spec.prefix + max_n
        )));
    }
    let vocab = lm.vocab_size() as u32;
    // Ordinary ids spread over the vocabulary; their values do not change the cost.
    let tokens: Vec<u32> = (0..(spec.prefix + max_n) as u32).map(|i| (i * 7919 + 13) % vocab).collect();
    let (head, tail) = tokens.split_at(spec.prefix);
    lm.truncate(0)?;
    lm.prefill(head)?;
    let chain = |n: usize| TreeBatch::chain(&tail[..n], None, 0, spec.last_only);
    for n in [1, max_n] {
        lm.forward(&chain(n))?;
        lm.commit(&[])?;
    }
    let mut out = Vec::with_capacity(spec.sizes.len());
    for &n in spec.sizes {
        let mut times = Vec::with_capacity(spec.repeat);
        for _ in 0..spec.repeat {
            let batch = chain(n);
            let t = Instant::now();
            lm.forward(&batch)?;
            times.push((t.elapsed().as_secs_f64() * 1e3).max(1e-6));
            lm.commit(&[])?;
        }
        times.sort_by(f64::total_cmp);
        out.push(TimedSize { n, median_ms: times[times.len() / 2], min_ms: times[0] });
    }
    lm.truncate(0)?;
    Ok(out)
}

/// The verify-batch cost curve (logits on every row) of a model: the median time of `repeat`
/// forwards for each size in `sizes`, on a short committed prefix.
pub fn measure_curve(lm: &mut dyn CausalLm, sizes: &[usize], repeat: usize) -> Result<CostCurve> {
    let spec = ProfileSpec { sizes, repeat, prefix: PROFILE_PREFIX, last_only: false };
    let points: Vec<(usize, f64)> = time_forwards(lm, spec)?.iter().map(|t| (t.n, t.median_ms)).collect();
    Ok(CostCurve::from_points(&points)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_curve_on_a_model() {
        let mut lm = crate::toy::ToyLm::new(crate::toy::ToyModel::new(8, 1, 1), 256);
        let c = measure_curve(&mut lm, &[1, 2, 4], 3).unwrap();
        assert_eq!(c.max_n(), 4);
        assert!(c.ms(3) > 0.0);
        assert_eq!(lm.committed_len(), 0);
        assert!(measure_curve(&mut lm, &[1, 300], 1).is_err(), "past the context");
        assert!(measure_curve(&mut lm, &[], 1).is_err());
    }
}
