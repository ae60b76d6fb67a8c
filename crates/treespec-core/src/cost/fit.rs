//! Fitting a cost curve to timings taken on a machine that may be busy.
//!
//! Another process can only ever add time to a forward: it takes cores, caches and memory
//! bandwidth away, never gives them. So the noise in a timed forward is one-sided, and the
//! statistics here are lower envelopes, never averages: an average lets one bad second lift
//! a size for as long as the curve is cached (the issue that led here: T(13) = 2,388 ms next
//! to T(16) = 533 ms, measured while the machine was busy).
//!
//! The shape a batched matmul allows is used to find what the repeats did not remove. On
//! llama.cpp's repacked kernels T climbs within each 4-row step (4k … 4k + 3) and may drop at
//! the next multiple of 4 (lower still at multiples of 16), so a fit must keep those drops; it
//! removes only what no kernel produces:
//!
//! - a size that timed above a later size of its own step (within a step more rows never cost
//!   less, so the earlier size was disturbed);
//! - a size far ([`SPIKE_RATIO`]) above both the interpolation of its neighbours and the next
//!   size (a real step end sits at most a few rows' cost above the drop after it).
//!
//! A removed size is predicted from the sizes kept: along a line through two others of its
//! step, else from a neighbour plus the same difference 16 rows away (the kernels repeat every
//! 16 rows), else by interpolation; the prediction replaces it only where it is lower.
//! Finally each step is made non-decreasing from below (each size is capped by the cheapest
//! later size of its step), which never raises a point.

/// Rows the repacked kernels multiply at a time: T may drop only at multiples of this.
pub const STEP: usize = 4;

/// The kernels' pattern of steps repeats every this many rows (the deeper dip at multiples of 16).
pub const PERIOD: usize = 16;

/// A size timed more than this multiple above what its neighbours allow is a spike.
pub const SPIKE_RATIO: f64 = 1.5;

/// Within a step, a later size may time this fraction below an earlier one (timer jitter)
/// before the earlier one counts as disturbed.
pub const MONOTONE_SLACK: f64 = 0.02;

/// The step of batch size `n`: sizes with the same step share a kernel tiling (1–3 are step 0).
pub fn step_of(n: usize) -> usize {
    n / STEP
}

/// The robust time of one size from its repeats: the fastest. Interference only adds time, so
/// the fastest repeat is the one least disturbed, and on a quiet machine the repeats of a
/// forward agree to a percent or two, so little is lost to the minimum's optimism. (A median
/// needs a quiet majority of repeats; the minimum needs one quiet repeat, and the measurement
/// checks that the two fastest agree before trusting it: [`agree`].) `None` without a finite
/// positive sample.
pub fn robust_ms(samples: &[f64]) -> Option<f64> {
    samples.iter().copied().filter(|t| t.is_finite() && *t > 0.0).min_by(f64::total_cmp)
}

/// Whether the two fastest repeats agree within the fraction `tolerance`: then the fastest is
/// confirmed by an independent quiet repeat. Fewer than two repeats never agree.
pub fn agree(samples: &[f64], tolerance: f64) -> bool {
    let mut s: Vec<f64> = samples.iter().copied().filter(|t| t.is_finite() && *t > 0.0).collect();
    if s.len() < 2 {
        return false;
    }
    s.sort_by(f64::total_cmp);
    s[1] <= s[0] * (1.0 + tolerance)
}

/// The spread of the repeats: slowest over fastest, minus one (0 when fewer than two).
pub fn spread(samples: &[f64]) -> f64 {
    let ok = || samples.iter().copied().filter(|t| t.is_finite() && *t > 0.0);
    match (ok().min_by(f64::total_cmp), ok().max_by(f64::total_cmp)) {
        (Some(lo), Some(hi)) => hi / lo - 1.0,
        _ => 0.0,
    }
}

/// A fitted curve: one time per measured size, and the sizes whose time was judged a spike.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    /// `(n, ms)`, sorted by n.
    pub points: Vec<(usize, f64)>,
    /// Sizes replaced because their time was a spike (re-measure them if possible).
    pub spikes: Vec<usize>,
}

/// [`fit`] of the [`robust_ms`] of each size's repeats (sizes without a usable repeat are left
/// out).
pub fn fit_samples(samples: &[(usize, Vec<f64>)]) -> Fitted {
    let points: Vec<(usize, f64)> =
        samples.iter().filter_map(|(n, s)| robust_ms(s).map(|ms| (*n, ms))).collect();
    fit(&points)
}

/// Fit measured `(n, ms)` points (distinct n ≥ 1, ms > 0) to the shape a batched matmul
/// allows; see the module documentation. The result is never above the input at any size, and
/// non-decreasing within each step.
pub fn fit(points: &[(usize, f64)]) -> Fitted {
    let mut pts: Vec<(usize, f64)> = points.to_vec();
    pts.sort_by_key(|p| p.0);
    let ns: Vec<usize> = pts.iter().map(|p| p.0).collect();
    let ms: Vec<f64> = pts.iter().map(|p| p.1).collect();
    let len = ms.len();
    let mut spike = vec![false; len];
    for i in 0..len {
        let later_cheaper = (i + 1..len)
            .take_while(|&j| step_of(ns[j]) == step_of(ns[i]))
            .any(|j| ms[j] * (1.0 + MONOTONE_SLACK) < ms[i]);
        spike[i] = later_cheaper || ms[i] > SPIKE_RATIO * neighbour_bound(&ns, &ms, i);
    }
    let mut out = ms.clone();
    for i in (0..len).filter(|&i| spike[i]) {
        if let Some(p) = predict(&ns, &ms, &spike, i).filter(|p| p.is_finite() && *p > 0.0) {
            out[i] = p.min(ms[i]);
        }
    }
    // Each step non-decreasing from below: the cheapest later size of the step caps each size.
    for i in (0..len.saturating_sub(1)).rev() {
        if step_of(ns[i]) == step_of(ns[i + 1]) {
            out[i] = out[i].min(out[i + 1]);
        }
    }
    Fitted {
        points: ns.iter().copied().zip(out).collect(),
        spikes: ns.iter().zip(&spike).filter(|(_, s)| **s).map(|(n, _)| *n).collect(),
    }
}

/// The most a size's neighbours allow it: the larger of their linear interpolation at it and
/// the next size (a step end may sit above the drop after it); for the last size, the previous
/// size continued along the previous slope. Infinite for a lone point.
fn neighbour_bound(ns: &[usize], ms: &[f64], i: usize) -> f64 {
    let at = |a: usize, b: usize, n: usize| {
        ms[a] + (ms[b] - ms[a]) * (n as f64 - ns[a] as f64) / (ns[b] as f64 - ns[a] as f64)
    };
    match (i.checked_sub(1), (i + 1 < ns.len()).then_some(i + 1)) {
        (Some(p), Some(q)) => at(p, q, ns[i]).max(ms[q]),
        (None, Some(q)) => ms[q],
        (Some(p), None) => match p.checked_sub(1) {
            Some(pp) => at(pp, p, ns[i]).max(ms[p]),
            None => ms[p] * ns[i] as f64 / ns[p] as f64,
        },
        (None, None) => f64::INFINITY,
    }
}

/// A prediction of size `i` from the sizes not judged spikes (see the module documentation).
fn predict(ns: &[usize], ms: &[f64], spike: &[bool], i: usize) -> Option<f64> {
    let n = ns[i];
    let kept = |j: usize| !spike[j] && j != i;
    let index = |m: usize| ns.binary_search(&m).ok().filter(|&j| kept(j));
    let line = |a: usize, b: usize| {
        ms[a] + (ms[b] - ms[a]) * (n as f64 - ns[a] as f64) / (ns[b] as f64 - ns[a] as f64)
    };
    // Along a line through the two nearest other sizes of its step; not at a multiple of the
    // period, whose dip the line through the rest of its step misses.
    if !n.is_multiple_of(PERIOD) {
        let mut same: Vec<usize> = (0..ns.len())
            .filter(|&j| kept(j) && step_of(ns[j]) == step_of(n) && !ns[j].is_multiple_of(PERIOD))
            .collect();
        same.sort_by_key(|&j| ns[j].abs_diff(n));
        if let [a, b, ..] = same[..] {
            return Some(line(a, b));
        }
    }
    // A neighbour plus the difference between the same two sizes one or more periods away
    // (nearer periods first, smaller sizes first: their jitter is smaller in ms).
    let neighbours = [i.checked_sub(1), (i + 1 < ns.len()).then_some(i + 1)];
    for k in 1..=4usize {
        for down in [true, false] {
            for m in neighbours.iter().flatten().copied().filter(|&j| kept(j)) {
                let shifted = |x: usize| if down { x.checked_sub(k * PERIOD) } else { Some(x + k * PERIOD) };
                let pair = shifted(n).zip(shifted(ns[m])).and_then(|(a, b)| index(a).zip(index(b)));
                if let Some((a, b)) = pair {
                    return Some(ms[m] + ms[a] - ms[b]);
                }
            }
        }
    }
    // Between the nearest kept sizes on either side (or the nearest one).
    let before = (0..i).rev().find(|&j| kept(j));
    let after = (i + 1..ns.len()).find(|&j| kept(j));
    match (before, after) {
        (Some(a), Some(b)) => Some(line(a, b)),
        (Some(a), None) | (None, Some(a)) => Some(ms[a]),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The sizes the engine's start-up profile times (`treespec_engine::measure::profile::PROFILE_SIZES`).
    const SIZES: &[usize] = &[
        1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 27, 28, 31,
        32, 33, 35, 36, 39, 40, 43, 44, 47, 48, 49, 51, 52, 55, 56, 59, 60, 63, 64,
    ];

    /// The repacked kernels' shape: `base` + `block` per 4 rows + `row` per remainder row, and
    /// multiples of 16 `dip` lower.
    fn kernel(base: f64, block: f64, row: f64, dip: f64) -> impl Fn(usize) -> f64 {
        move |n| {
            base + block * (n / 4) as f64 + row * (n % 4) as f64
                - if n.is_multiple_of(16) { dip } else { 0.0 }
        }
    }

    fn assert_close(fitted: &Fitted, clean: &dyn Fn(usize) -> f64, tol: f64) {
        for &(n, ms) in &fitted.points {
            let c = clean(n);
            assert!((ms / c - 1.0).abs() <= tol, "T({n}) fitted {ms:.2}, clean {c:.2}: {fitted:?}");
        }
    }

    #[test]
    fn a_clean_kernel_curve_is_kept_exactly_with_its_drops() {
        let k = kernel(12.0, 46.0, 16.0, 20.0);
        let pts: Vec<(usize, f64)> = SIZES.iter().map(|&n| (n, k(n))).collect();
        let f = fit(&pts);
        assert_eq!(f.points, pts);
        assert!(f.spikes.is_empty(), "{:?}", f.spikes);
        // The drops survive: 15 → 16 and 31 → 32.
        let at = |n: usize| f.points.iter().find(|p| p.0 == n).unwrap().1;
        assert!(at(16) < at(15) && at(32) < at(31));
    }

    #[test]
    fn the_issue_s_spikes_are_removed_and_predicted_from_the_shape() {
        // The busy machine's T(11), T(13) and T(35) (ms) dropped into a clean curve.
        let k = kernel(40.0, 90.0, 30.0, 40.0);
        let mut pts: Vec<(usize, f64)> = SIZES.iter().map(|&n| (n, k(n))).collect();
        for (n, ms) in [(11, 1215.0), (13, 2388.0), (35, 1745.0), (64, 5000.0), (16, 2000.0)] {
            pts.iter_mut().find(|p| p.0 == n).unwrap().1 = ms;
        }
        let f = fit(&pts);
        assert_eq!(f.spikes, vec![11, 13, 16, 35, 64]);
        assert_close(&f, &k, 1e-9);
    }

    #[test]
    fn a_smooth_curve_without_steps_is_left_alone() {
        // SmolLM2-135M (Q4_1) on 2 cores: no 4-row steps, 16 ms plus 3.5 ms a row.
        let pts: Vec<(usize, f64)> = SIZES.iter().map(|&n| (n, 16.0 + 3.5 * n as f64)).collect();
        let f = fit(&pts);
        assert_eq!(f.points, pts);
        assert!(f.spikes.is_empty());
    }

    #[test]
    fn small_inputs_fit_without_panicking() {
        assert!(fit(&[]).points.is_empty());
        assert_eq!(fit(&[(1, 10.0)]).points, vec![(1, 10.0)]);
        // Two sizes of one step: the earlier is capped by the later.
        let f = fit(&[(1, 30.0), (2, 12.0)]);
        assert_eq!(f.points, vec![(1, 12.0), (2, 12.0)]);
        assert_eq!(f.spikes, vec![1]);
        let f = fit(&[(1, 10.0), (4, 1000.0)]);
        assert_eq!(f.spikes, vec![4]);
        assert!(f.points[1].1 <= 1000.0);
    }

    #[test]
    fn repeats_reduce_to_their_fastest_confirmed_time() {
        assert_eq!(robust_ms(&[30.0, 10.0, 11.0]), Some(10.0));
        assert_eq!(robust_ms(&[f64::NAN, -1.0]), None);
        assert!(agree(&[10.0, 10.3, 40.0], 0.05));
        assert!(!agree(&[10.0, 12.0, 40.0], 0.05), "the fastest is not confirmed");
        assert!(!agree(&[10.0], 0.05));
        assert!((spread(&[10.0, 15.0, 12.0]) - 0.5).abs() < 1e-12);
        assert_eq!(spread(&[10.0]), 0.0);
        let f = fit_samples(&[(1, vec![12.0, 10.0]), (2, vec![f64::NAN]), (3, vec![14.0, 30.0])]);
        assert_eq!(f.points, vec![(1, 10.0), (3, 14.0)]);
    }

    /// A clean kernel curve, timed 3 times a size with up to 0.5% jitter, where any repeat may
    /// be slowed by any factor but one repeat of each size stays clean, and a few isolated
    /// sizes (4 or more sizes apart) are slowed in every repeat by 2.2× or more.
    /// Kernel parameters (base, block, row, dip) and each size's repeats.
    type NoisyProfile = ((f64, f64, f64, f64), Vec<(usize, Vec<f64>)>);

    fn noisy_profile() -> impl Strategy<Value = NoisyProfile> {
        let params = (2.0..60.0f64, 10.0..120.0f64, 0.26..0.4f64, 0.0..0.45f64)
            .prop_map(|(base, block, row, dip)| (base, block, row * block, dip * block));
        let per_size = proptest::collection::vec(
            (0..3usize, proptest::collection::vec((0.0..0.005f64, 0.0..1.0f64, 1.05..30.0f64), 3)),
            SIZES.len(),
        );
        let whole = proptest::collection::vec((0..SIZES.len(), 2.2..30.0f64), 0..5);
        (params, per_size, whole).prop_map(|(p, per_size, whole)| {
            let k = kernel(p.0, p.1, p.2, p.3);
            let mut slowed = vec![1.0; SIZES.len()];
            let mut taken: Vec<usize> = Vec::new();
            for (i, factor) in whole {
                if taken.iter().all(|&t| t.abs_diff(i) >= 4) {
                    taken.push(i);
                    slowed[i] = factor;
                }
            }
            let samples = SIZES
                .iter()
                .zip(per_size)
                .zip(&slowed)
                .map(|((&n, (clean_one, reps)), &s)| {
                    let times = reps
                        .iter()
                        .enumerate()
                        .map(|(r, &(jitter, u, spike))| {
                            let spike = if r != clean_one && u < 0.4 { spike } else { 1.0 };
                            k(n) * (1.0 + jitter) * spike * s
                        })
                        .collect();
                    (n, times)
                })
                .collect();
            (p, samples)
        })
    }

    proptest! {
        #[test]
        fn the_fit_of_a_noisy_profile_is_monotone_in_steps_and_within_five_percent_of_clean(
            (p, samples) in noisy_profile()
        ) {
            let k = kernel(p.0, p.1, p.2, p.3);
            let f = fit_samples(&samples);
            prop_assert_eq!(f.points.len(), SIZES.len());
            for w in f.points.windows(2) {
                if step_of(w[0].0) == step_of(w[1].0) {
                    prop_assert!(w[0].1 <= w[1].1, "step not monotone: {:?}", w);
                }
            }
            for &(n, ms) in &f.points {
                prop_assert!(ms <= k(n) * 1.05, "T({}) = {} above clean {}", n, ms, k(n));
                prop_assert!(ms >= k(n) * 0.95, "T({}) = {} below clean {}", n, ms, k(n));
            }
        }
    }
}
