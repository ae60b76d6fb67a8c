//! Timing a model's forwards: the start-up profile behind `treespec profile` and the measured cost
//! curves (`treespec costs`) that the cost-aware drafters in [`crate::auto_budget`] decide on.

use std::time::Instant;

use treespec_core::cost::CostCurve;

use crate::error::{EngineError, Result};
use crate::model::{CausalLm, TreeBatch};

/// Batch sizes a start-up profile times (sizes in between are interpolated, larger ones
/// extrapolated), out to 64 rows since suffix drafts of long exact copies reach that far.
///
/// The curve is not smooth, and a sparse grid misprices it badly. llama.cpp's repacked
/// quantized kernels multiply 4 rows at a time and the remainder row by row, so T climbs by a
/// row's full cost from 4k to 4k + 3 rows and drops at 4k + 4; multiples of 16 run lower still.
/// Measured on the 1.5B target (2 AMD cores): T(15) = 178 ms, T(16) = 140 ms, T(31) = 267 ms,
/// T(32) = 240 ms — an interpolated T(15) read 148. So every size up to 24 is timed, and beyond
/// it both ends of each 4-row step (4k − 1 and 4k), between which the climb is linear, and the
/// row after each multiple of 16, where the climb starts from the dip.
pub const PROFILE_SIZES: &[usize] = &[
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 27, 28, 31, 32,
    33, 35, 36, 39, 40, 43, 44, 47, 48, 49, 51, 52, 55, 56, 59, 60, 63, 64,
];

/// Committed tokens under the timed batches (a realistic, short KV length).
const PROFILE_PREFIX: usize = 64;

/// The longer cache the context cost is measured on (or what the context allows, if at least
/// [`MIN_CONTEXT_SPAN`] tokens above [`PROFILE_PREFIX`]).
const CONTEXT_PREFIX: usize = 1024;

/// The least span between the two caches for a context cost worth fitting.
const MIN_CONTEXT_SPAN: usize = 256;

/// Batch sizes timed again on the long cache, for the context cost.
const CONTEXT_SIZES: &[usize] = &[1, 4, 8, 16];

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
/// forwards for each size in `sizes`, on a short committed prefix, with the cost of context
/// (see [`CostCurve::row_surcharge`]) fitted from the sizes in [`CONTEXT_SIZES`] timed again
/// on a cache of [`CONTEXT_PREFIX`] tokens — 0 when the context is too small to measure it.
pub fn measure_curve(lm: &mut dyn CausalLm, sizes: &[usize], repeat: usize) -> Result<CostCurve> {
    let spec = ProfileSpec { sizes, repeat, prefix: PROFILE_PREFIX, last_only: false };
    let short = time_forwards(lm, spec)?;
    let points: Vec<(usize, f64)> = short.iter().map(|t| (t.n, t.median_ms)).collect();
    let curve = CostCurve::from_points(&points)?;
    let again: Vec<usize> = CONTEXT_SIZES.iter().copied().filter(|n| sizes.contains(n)).collect();
    let largest = again.iter().copied().max().unwrap_or(0);
    let long = CONTEXT_PREFIX.min(lm.context_size().saturating_sub(largest + 1));
    if again.is_empty() || long < PROFILE_PREFIX + MIN_CONTEXT_SPAN {
        return Ok(curve.with_context_cost(0.0, PROFILE_PREFIX)?);
    }
    let spec = ProfileSpec { sizes: &again, repeat, prefix: long, last_only: false };
    let slope = context_slope(&short, &time_forwards(lm, spec)?, long - PROFILE_PREFIX);
    Ok(curve.with_context_cost(slope, PROFILE_PREFIX)?)
}

/// The extra ms per row per committed token that best explains (least squares through the
/// origin) how much slower each size of `long` ran than the same size of `short`, on a cache
/// `span` tokens longer: `T_long(n) − T_short(n) ≈ n · span · slope`. Never negative (a timing
/// that came out faster on the longer cache is noise, not a discount).
pub fn context_slope(short: &[TimedSize], long: &[TimedSize], span: usize) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for l in long {
        if let Some(s) = short.iter().find(|s| s.n == l.n) {
            let x = (l.n * span) as f64;
            num += x * (l.median_ms - s.median_ms);
            den += x * x;
        }
    }
    if den > 0.0 {
        (num / den).max(0.0)
    } else {
        0.0
    }
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
        // 256 tokens of context leave no room for a long cache: no context cost.
        assert_eq!(c.row_ms_per_context_token(), 0.0);
    }

    #[test]
    fn the_profiled_sizes_pin_down_a_curve_of_four_row_kernels() {
        // The shape of the repacked kernels: 4 rows at a time cost 46 ms, each remainder row
        // 16 ms, and multiples of 16 rows 20 ms less (what the 1.5B target measures on 2 cores).
        let kernel = |n: usize| {
            12.0 + 46.0 * (n / 4) as f64 + 16.0 * (n % 4) as f64
                - if n.is_multiple_of(16) { 20.0 } else { 0.0 }
        };
        let points: Vec<(usize, f64)> = PROFILE_SIZES.iter().map(|&n| (n, kernel(n))).collect();
        let c = CostCurve::from_points(&points).unwrap();
        assert_eq!(c.max_n(), 64);
        for n in 1..=64 {
            assert!((c.ms(n) - kernel(n)).abs() < 1e-9, "T({n}) reads {} instead of {}", c.ms(n), kernel(n));
        }
    }

    fn timed(points: &[(usize, f64)]) -> Vec<TimedSize> {
        points.iter().map(|&(n, ms)| TimedSize { n, median_ms: ms, min_ms: ms }).collect()
    }

    #[test]
    fn the_context_slope_fits_what_each_row_costs_per_committed_token() {
        // The 1.5B target on 2 AMD cores, 64 and 1,536 committed tokens.
        let short = timed(&[(1, 25.0), (4, 76.2), (8, 118.1), (16, 136.1)]);
        let long = timed(&[(1, 33.2), (4, 89.4), (8, 149.1), (16, 207.4)]);
        let slope = context_slope(&short, &long, 1472);
        assert!((0.0028..0.0032).contains(&slope), "{slope}");
        // Exactly linear timings give their slope back; sizes timed only once are ignored.
        let long = timed(&[(1, 25.0 + 0.5), (4, 76.2 + 2.0), (32, 999.0)]);
        assert!((context_slope(&short, &long, 100) - 0.005).abs() < 1e-12);
        // Faster on the long cache (noise) is no discount; nothing to compare is no slope.
        assert_eq!(context_slope(&short, &timed(&[(4, 70.0)]), 1000), 0.0);
        assert_eq!(context_slope(&short, &timed(&[(2, 70.0)]), 1000), 0.0);
        assert_eq!(context_slope(&short, &long, 0), 0.0);
    }

    #[test]
    fn a_context_long_enough_measures_the_context_cost() {
        let mut lm = crate::toy::ToyLm::new(crate::toy::ToyModel::new(8, 1, 1), 2048);
        let c = measure_curve(&mut lm, &[1, 2, 4], 1).unwrap();
        // The toy model's cost hardly grows with its cache; the slope is measured and ≥ 0.
        assert!(c.row_ms_per_context_token().is_finite() && c.row_ms_per_context_token() >= 0.0);
        assert_eq!(c.row_surcharge(64), 0.0, "no surcharge up to the profiled cache");
        assert_eq!(lm.committed_len(), 0);
    }
}
