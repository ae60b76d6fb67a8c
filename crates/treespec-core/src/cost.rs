//! Measured forward-cost curves T(n): milliseconds for one model forward of n new tokens.
//!
//! On a CPU, verification is not free and the curve is neither flat nor linear: it has steps
//! where the matmul kernels change with the batch size (a 4-token batch can cost no more than a
//! 3-token one). Tree budgeting must read the curve, never assume its shape, so a [`CostCurve`]
//! holds one measured value per batch size, starts from a start-up profile (cached per model file
//! and thread count by the caller) and is refined online from every timed forward.
//!
//! The profile is taken on a short cache, but every row of a forward attends to every committed
//! token, so a row costs more the longer the context: on the 1.5B target on 2 AMD cores, about
//! 3 µs per row per committed token (T(16) is 136 ms on 64 committed tokens and 207 ms on 1,536).
//! Read off the short-cache curve, a long prompt's draft rows look cheaper than they are and
//! the drafters over-draft. So a curve also carries that slope: [`CostCurve::ms_at`] adds
//! `n · slope · (context − profiled context)` to T(n), and online observations are folded in
//! with the same term taken out, so a long request's timings do not skew a short one's prices.
//!
//! Timings on a busy machine are fitted by [`fit`]; online refinement trusts a forward that ran
//! faster than the estimate more than one that ran slower (interference only adds time), so a
//! profile taken while the machine was busy washes out within a few forwards of each size used.
//! A [`CurveTap`] collects the refinement of a curve and all its clones, for its owner to write
//! back to the disk cache.

pub mod fit;
pub mod shapes;

use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use shapes::ShapeTimes;

/// Weight of a new online observation slower than the estimate in the running estimate of
/// T(n). Small enough that one noisy forward (a page fault, another process) barely moves the
/// curve, large enough that a machine that got slower is followed within a few dozen steps.
const ONLINE_WEIGHT: f64 = 0.05;

/// Weight of an observation faster than the estimate. A machine cannot run a forward faster
/// than it can, so a fast forward is evidence that the estimate was too high (a profile taken
/// while the machine was busy), and it is followed quickly: a 3× too high T(n) is within 10%
/// after a dozen forwards of n rows. Well above the median of the timings, the estimate
/// settles near their low quantile, like the profile's minimum of repeats.
const FASTER_WEIGHT: f64 = 0.3;

/// Weight of one timed forward in the running mean of its kind's excess over the curve (see
/// [`CostCurve::expected_ms`]): a memory of about ten forwards of each kind.
const EXCESS_WEIGHT: f64 = 0.1;

/// A forward's ratio to the curve is clamped to this range before it joins the excess: one
/// forward behind a page fault or another process must not price every later bet. Its top also
/// caps the timing that refines T(n) and the context slope (see [`CostCurve::observe_at`]).
const EXCESS_RANGE: (f64, f64) = (0.5, 2.0);

/// Committed tokens beyond the profiled context up to which a timed forward refines T(n) alone;
/// a forward on a longer cache refines the context slope first (see [`CostCurve::observe_at`]).
/// Within it a slope off by half moves T(16) by a few percent.
const NEAR_CONTEXT: usize = 128;

/// Rows × committed tokens beyond the profiled context from which a forward's time weighs in
/// full on the context slope; a forward with less is weighted down in proportion.
const SLOPE_LEVERAGE: f64 = 1024.0;

/// No excess over the curve: what a curve starts with, and what one saved before it was learned reads.
fn no_excess() -> [f64; 2] {
    [1.0; 2]
}

/// Which excess a forward of `rows` rows has: one row's, or more rows'.
fn excess_kind(rows: usize) -> usize {
    (rows > 1) as usize
}

/// T(n) in milliseconds for n = 1..=`max_n`, beyond which it is extrapolated linearly.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CostCurve {
    /// `ms[n - 1]` = T(n) on a cache of `profiled_context` committed tokens.
    ms: Vec<f64>,
    /// Extra ms per row for each committed token beyond `profiled_context` (0: not measured).
    #[serde(default)]
    row_ms_per_context_token: f64,
    /// Committed tokens under the profiled forwards.
    #[serde(default)]
    profiled_context: usize,
    /// How much longer forwards really take, on average, than the curve says: `[one row, two
    /// or more rows]` (see [`CostCurve::expected_ms`]). 1 until forwards are timed.
    #[serde(default = "no_excess")]
    excess: [f64; 2],
    /// The padded shapes' times, where they were measured (see [`shapes`]); None on curves
    /// measured before them, which never pad on their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shapes: Option<ShapeTimes>,
    /// Where observations are also folded (see [`CostCurve::tapped`]); shared by clones.
    #[serde(skip)]
    tap: Option<Arc<CurveTap>>,
}

/// Curves are equal when their times are: a tap is not part of the value.
impl PartialEq for CostCurve {
    fn eq(&self, other: &Self) -> bool {
        self.ms == other.ms
            && self.row_ms_per_context_token == other.row_ms_per_context_token
            && self.profiled_context == other.profiled_context
            && self.excess == other.excess
            && self.shapes == other.shapes
    }
}

/// The refinement of a curve by every observation folded into it or any of its clones, in one
/// place: a cost-aware drafter refines its own copy of the curve, and the copies of concurrent
/// requests and methods diverge, but the process that measured the curve wants one refined
/// curve to write back to its cache. See [`CostCurve::tapped`].
#[derive(Debug)]
pub struct CurveTap {
    state: Mutex<(CostCurve, u64)>,
}

impl CurveTap {
    /// The curve refined by every observation so far.
    pub fn curve(&self) -> CostCurve {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).0.clone()
    }

    /// Observations folded in so far.
    pub fn observations(&self) -> u64 {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).1
    }

    fn fold(&self, n: usize, ms: f64, context: usize) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.0.refine_at(n, ms, context) {
            state.1 += 1;
        }
    }
}

impl CostCurve {
    /// A curve from measured `(n, ms)` points. Point n = 1 is required; sizes between measured
    /// points are interpolated linearly. Every time must be finite and positive.
    pub fn from_points(points: &[(usize, f64)]) -> Result<Self> {
        let mut pts: Vec<(usize, f64)> = points.to_vec();
        pts.sort_by_key(|p| p.0);
        if let Some(&(n, ms)) = pts.iter().find(|p| p.0 == 0 || !(p.1.is_finite() && p.1 > 0.0)) {
            return Err(Error::Invalid(format!("cost point T({n}) = {ms} ms: n must be ≥ 1 and T > 0")));
        }
        if pts.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(Error::Invalid("cost curve has two points for the same batch size".into()));
        }
        if pts.first().map(|p| p.0) != Some(1) {
            return Err(Error::Invalid("cost curve needs the single-token point T(1)".into()));
        }
        let max_n = pts.last().map(|p| p.0).unwrap_or(1);
        let mut ms = Vec::with_capacity(max_n);
        for w in pts.windows(2) {
            let ((n0, t0), (n1, t1)) = (w[0], w[1]);
            for n in n0..n1 {
                ms.push(t0 + (t1 - t0) * (n - n0) as f64 / (n1 - n0) as f64);
            }
        }
        ms.push(pts.last().map(|p| p.1).unwrap_or(1.0));
        Ok(Self {
            ms,
            row_ms_per_context_token: 0.0,
            profiled_context: 0,
            excess: no_excess(),
            shapes: None,
            tap: None,
        })
    }

    /// This curve with a tap: every later observation of it or of any of its clones is also
    /// folded into the returned [`CurveTap`]'s own copy (which starts as this curve). Curves
    /// derived from it ([`CostCurve::at_context`]) are not tapped.
    pub fn tapped(mut self) -> (Self, Arc<CurveTap>) {
        self.tap = None;
        let tap = Arc::new(CurveTap { state: Mutex::new((self.clone(), 0)) });
        self.tap = Some(tap.clone());
        (self, tap)
    }

    /// The times `(n, T(n))` of every size 1..=[`CostCurve::max_n`] (what a cache stores).
    pub fn points(&self) -> Vec<(usize, f64)> {
        self.ms.iter().enumerate().map(|(i, t)| (i + 1, *t)).collect()
    }

    /// The profiled context (committed tokens under the profiled forwards).
    pub fn profiled_context(&self) -> usize {
        self.profiled_context
    }

    /// This curve, measured on `profiled_context` committed tokens, with the cost of context:
    /// every row costs `ms_per_row_token` more for each committed token beyond that. A slope
    /// that is not finite and ≥ 0 is refused.
    pub fn with_context_cost(mut self, ms_per_row_token: f64, profiled_context: usize) -> Result<Self> {
        if !(ms_per_row_token.is_finite() && ms_per_row_token >= 0.0) {
            return Err(Error::Invalid(format!(
                "context cost {ms_per_row_token} ms per row per token: must be finite and ≥ 0"
            )));
        }
        self.row_ms_per_context_token = ms_per_row_token;
        self.profiled_context = profiled_context;
        Ok(self)
    }

    /// Extra ms per row for each committed token beyond the profiled context.
    pub fn row_ms_per_context_token(&self) -> f64 {
        self.row_ms_per_context_token
    }

    /// What one row costs beyond T(n)'s share on a cache of `context` committed tokens (0 up to
    /// the profiled context: a shorter cache is not priced below the profile).
    pub fn row_surcharge(&self, context: usize) -> f64 {
        self.row_ms_per_context_token * context.saturating_sub(self.profiled_context) as f64
    }

    /// This curve with its padded shapes' times (see [`shapes`]).
    pub fn with_shapes(mut self, shapes: Option<ShapeTimes>) -> Self {
        self.shapes = shapes;
        self
    }

    /// The padded shapes' times, where measured.
    pub fn shapes(&self) -> Option<&ShapeTimes> {
        self.shapes.as_ref()
    }

    /// Turn padding to the measured shapes on or off for the forwards this curve prices; false
    /// (and nothing changes) when no shapes were measured.
    pub fn set_padding(&mut self, on: bool) -> bool {
        match self.shapes.as_mut() {
            Some(s) => {
                s.active = on;
                true
            }
            None => false,
        }
    }

    /// The shapes' times when forwards are padded to them now.
    pub fn padding(&self) -> Option<&ShapeTimes> {
        self.shapes.as_ref().filter(|s| s.active)
    }

    /// T(n) on a cache of `context` committed tokens.
    pub fn ms_at(&self, n: usize, context: usize) -> f64 {
        self.ms(n) + n as f64 * self.row_surcharge(context)
    }

    /// This curve as it reads on a cache of `context` committed tokens: T(n) is
    /// [`CostCurve::ms_at`]`(n, context)` (for bounds and tables that take a plain curve).
    pub fn at_context(&self, context: usize) -> CostCurve {
        let s = self.row_surcharge(context);
        let ms = self.ms.iter().enumerate().map(|(i, t)| t + (i + 1) as f64 * s).collect();
        CostCurve {
            ms,
            row_ms_per_context_token: self.row_ms_per_context_token,
            profiled_context: context.max(self.profiled_context),
            excess: self.excess,
            shapes: self.shapes.clone(),
            tap: None,
        }
    }

    /// Fold one forward of `n` rows timed on a cache of `context` committed tokens into the
    /// curve. Near the profiled context ([`NEAR_CONTEXT`]) the time refines T(n), the context's
    /// small share (read off the slope) taken out. Further out it refines the slope first, and
    /// what the slope leaves unexplained refines T(n) at the slow weight only. Before, a long
    /// cache's time refined T(n) alone, with a share read off the profile's slope taken out, and a
    /// result below T(n) was trusted as a fast forward: a profile's slope of 18 µs per row per
    /// token where rows really cost 6–14 (Zen 3, the 1.5B target) took T(1) from 55 to 43 ms and
    /// T(3) from 127 to 82 within a dozen long prompts, and short answers then bet 2-node drafts
    /// priced at 84 ms that took 110–170. A forward faster than T(n) itself still says, at any
    /// context, that T(n) is too high, and is followed at the fast weight.
    pub fn observe_at(&mut self, n: usize, ms: f64, context: usize) {
        if self.refine_at(n, ms, context) {
            if let Some(tap) = &self.tap {
                tap.fold(n, ms, context);
            }
        }
    }

    /// [`CostCurve::observe_at`] without the tap; false when the timing was not used.
    fn refine_at(&mut self, n: usize, ms: f64, context: usize) -> bool {
        if n == 0 || n > self.ms.len() || !(ms.is_finite() && ms > 0.0) {
            return false;
        }
        let over = context.saturating_sub(self.profiled_context);
        let t = self.ms[n - 1];
        let expected = t + n as f64 * self.row_surcharge(context);
        self.learn_excess(n, ms / expected);
        // A stalled forward (a page fault, a neighbour's burst) counts as twice the curve at
        // most: unclamped, one forward 50× T(n) raised T(n) 3.45× at the slow weight, and every
        // bet of that size was then declined until a dozen fast forwards brought it back. A
        // machine that really got slower is still followed, 5% a forward at first.
        let ms = ms.min(EXCESS_RANGE.1 * expected);
        let far = over > NEAR_CONTEXT;
        if far {
            // What this forward says one row costs per committed token, weighted by how much it
            // can say: a few ms of noise over a small surcharge would swing the slope.
            let leverage = ((n * over) as f64 / SLOPE_LEVERAGE).min(1.0);
            let seen = ((ms - t) / (n * over) as f64).max(0.0);
            let s = self.row_ms_per_context_token;
            let weight = if seen < s { FASTER_WEIGHT / 2.0 } else { ONLINE_WEIGHT };
            self.row_ms_per_context_token = s + leverage * weight * (seen - s);
            if ms < t {
                self.refine(n, ms);
                return true;
            }
        }
        let base = ms - n as f64 * self.row_surcharge(context);
        if base <= 0.0 {
            return far;
        }
        if far {
            // What the slope leaves for T(n) itself (a size whose kernels the profile misread),
            // followed at the slow weight either way: below T(n) it is the slope's error, not a
            // fast forward, and trusting it as one dragged T(n) down with every long prompt.
            self.ms[n - 1] = t + ONLINE_WEIGHT * (base - t);
        } else {
            self.refine(n, base);
        }
        true
    }

    /// A curve that is linear in n: `base + per_token · n` (toy models, tests).
    pub fn linear(base: f64, per_token: f64, max_n: usize) -> Result<Self> {
        let pts: Vec<(usize, f64)> = (1..=max_n.max(1)).map(|n| (n, base + per_token * n as f64)).collect();
        Self::from_points(&pts)
    }

    /// Largest batch size measured.
    pub fn max_n(&self) -> usize {
        self.ms.len()
    }

    /// T(n) in ms; T(0) = 0. Beyond the measured range, the slope of the last quarter of the
    /// curve continues it.
    pub fn ms(&self, n: usize) -> f64 {
        if n == 0 {
            return 0.0;
        }
        if n <= self.ms.len() {
            return self.ms[n - 1];
        }
        let last = self.ms.len();
        let from = (last - last / 4).max(1).min(last);
        let slope = if last > from {
            (self.ms[last - 1] - self.ms[from - 1]) / (last - from) as f64
        } else {
            self.ms[last - 1]
        };
        self.ms[last - 1] + slope.max(0.0) * (n - last) as f64
    }

    /// The least a batch of at least `n` tokens costs: T read as non-decreasing from below. The
    /// curve dips where the kernels change (T(16) = 140 ms below T(15) = 178 on the 1.5B
    /// target), so rows can be added to reach the dip; a marginal price read off the raw curve
    /// would be negative before a dip and a running maximum would make the rows after it look
    /// free. A request in a batch prices its rows as increments of this floor.
    pub fn ms_floor(&self, n: usize) -> f64 {
        // Beyond the measured range the curve is extrapolated non-decreasing.
        match n {
            0 => 0.0,
            n if n > self.ms.len() => self.ms(n),
            n => self.ms[n - 1..].iter().copied().fold(f64::INFINITY, f64::min),
        }
    }

    /// How much longer a forward of `rows` rows takes, on average, than the curve says: the
    /// running mean of timed forwards of its kind (one row, or more) over T(n) at their
    /// context, 1 before any.
    ///
    /// T(n) is the machine's speed, not the time a forward is expected to take: the profile keeps
    /// the fastest of its repeats, and online a forward faster than T(n) is followed six times
    /// faster than a slower one, so that interference washes out. That puts T(n) near the low
    /// quantile of its timings. Plain decoding times one row thousands of times and its T(1)
    /// sits about at their median; a tree's sizes are each timed a few times, and their timings
    /// spread more. Over 4,500 steps of recorded decision traces (the 1.5B target, 2 Zen 5
    /// cores) one-row forwards took a median 1.01× their T(1) and forwards of two or more rows
    /// 1.06× their T(n) (p90 1.20×), so a bet that the curve said beat plain decoding by less
    /// than about 5% was, in expectation, a loss.
    pub fn excess(&self, rows: usize) -> f64 {
        self.excess[excess_kind(rows)]
    }

    /// The time a forward of `n` rows is expected to take: T(n) times its kind's measured
    /// [`CostCurve::excess`]. What decisions pay; T(n) stays the machine's speed.
    pub fn expected_ms(&self, n: usize) -> f64 {
        self.ms(n) * self.excess(n)
    }

    /// [`CostCurve::expected_ms`] on a cache of `context` committed tokens.
    pub fn expected_ms_at(&self, n: usize, context: usize) -> f64 {
        self.ms_at(n, context) * self.excess(n)
    }

    /// Fold a forward's time over what the curve said (`ratio`) into the excess of its kind.
    fn learn_excess(&mut self, rows: usize, ratio: f64) {
        if ratio.is_finite() {
            let e = &mut self.excess[excess_kind(rows)];
            *e += EXCESS_WEIGHT * (ratio.clamp(EXCESS_RANGE.0, EXCESS_RANGE.1) - *e);
        }
    }

    /// Fold one timed forward of `n` tokens into the estimate (exponentially weighted, faster
    /// when the forward ran faster than the estimate: [`FASTER_WEIGHT`]). A lowered T(n) also
    /// caps the smaller sizes of its 4-row step ([`fit::STEP`]): within a step more rows never
    /// cost less, so an estimate above T(n) there was too high as well. Sizes beyond the
    /// measured range are ignored: one observation is not a curve.
    pub fn observe(&mut self, n: usize, ms: f64) {
        self.observe_at(n, ms, self.profiled_context);
    }

    /// [`CostCurve::observe`] without the tap.
    fn refine(&mut self, n: usize, ms: f64) {
        let t = self.ms[n - 1];
        let weight = if ms < t { FASTER_WEIGHT } else { ONLINE_WEIGHT };
        let new = t + weight * (ms - t);
        self.ms[n - 1] = new;
        if new < t {
            let start = (fit::step_of(n) * fit::STEP).max(1);
            for m in start..n {
                self.ms[m - 1] = self.ms[m - 1].min(new);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolates_between_points_and_extrapolates_linearly() {
        let c = CostCurve::from_points(&[(4, 100.0), (1, 40.0), (8, 180.0)]).unwrap();
        assert_eq!(c.max_n(), 8);
        assert_eq!(c.ms(0), 0.0);
        assert_eq!(c.ms(1), 40.0);
        assert_eq!(c.ms(2), 60.0);
        assert_eq!(c.ms(4), 100.0);
        assert_eq!(c.ms(6), 140.0);
        // Last quarter is n = 6..8: slope 20 ms/token.
        assert_eq!(c.ms(10), 220.0);
    }

    #[test]
    fn the_floor_is_the_cheapest_batch_of_at_least_n_rows() {
        // Rows 1..=3 climb, 4 dips below 3, then a climb again, extrapolated past 6.
        let c = CostCurve::from_points(&[(1, 30.0), (3, 70.0), (4, 60.0), (6, 100.0)]).unwrap();
        assert_eq!(c.ms_floor(0), 0.0);
        assert_eq!(c.ms_floor(1), 30.0);
        assert_eq!(c.ms_floor(2), 50.0);
        assert_eq!(c.ms_floor(3), 60.0, "a third row is topped up to the fourth");
        assert_eq!(c.ms_floor(4), 60.0);
        assert_eq!(c.ms_floor(5), 80.0);
        assert_eq!(c.ms_floor(8), c.ms(8));
        assert!((1..12).all(|n| c.ms_floor(n) <= c.ms_floor(n + 1) && c.ms_floor(n) <= c.ms(n)));
    }

    #[test]
    fn rejects_bad_points() {
        assert!(CostCurve::from_points(&[]).is_err());
        assert!(CostCurve::from_points(&[(2, 10.0)]).is_err(), "T(1) is required");
        assert!(CostCurve::from_points(&[(1, 10.0), (1, 11.0)]).is_err());
        assert!(CostCurve::from_points(&[(1, f64::NAN)]).is_err());
        assert!(CostCurve::from_points(&[(0, 1.0), (1, 1.0)]).is_err());
        assert!(CostCurve::from_points(&[(1, -1.0)]).is_err());
    }

    #[test]
    fn online_observations_move_the_estimate_toward_the_measurement() {
        let mut c = CostCurve::from_points(&[(1, 40.0), (2, 70.0)]).unwrap();
        for _ in 0..200 {
            c.observe(2, 50.0);
        }
        assert!((c.ms(2) - 50.0).abs() < 0.1, "{}", c.ms(2));
        assert_eq!(c.ms(1), 40.0);
        c.observe(3, 1.0);
        c.observe(1, f64::INFINITY);
        assert_eq!(c.max_n(), 2);
        assert_eq!(c.ms(1), 40.0);
    }

    #[test]
    fn a_profile_taken_on_a_busy_machine_washes_out_quickly_and_noise_does_not_lift_it() {
        // The quiet truth: 16 ms + 3.5 ms a row. The prior: measured busy, 3× too high.
        let truth = |n: usize| 16.0 + 3.5 * n as f64;
        let pts: Vec<(usize, f64)> = (1..=16).map(|n| (n, 3.0 * truth(n))).collect();
        let mut c = CostCurve::from_points(&pts).unwrap();
        for _ in 0..12 {
            c.observe(8, truth(8));
        }
        assert!(c.ms(8) < truth(8) * 1.1, "{}", c.ms(8));
        // The smaller sizes of 8's step (none: 8 starts it) and of its own step are capped.
        for _ in 0..12 {
            c.observe(11, truth(11));
        }
        assert!((9..=11).all(|n| c.ms(n) < truth(11) * 1.1), "{:?}", c.points());
        assert_eq!(c.ms(12), 3.0 * truth(12), "other steps keep their prior until timed");
        // Occasional slow forwards (another process) barely move a settled estimate: one in
        // five forwards 3× slow lifts T(8) by less than 15% of the truth.
        for i in 0..200 {
            c.observe(8, if i % 5 == 0 { 3.0 * truth(8) } else { truth(8) });
        }
        assert!(c.ms(8) < truth(8) * 1.15, "{}", c.ms(8));
    }

    #[test]
    fn a_stalled_forward_barely_moves_the_curve_and_a_machine_that_got_slower_is_followed() {
        let truth = |n: usize| 16.0 + 3.5 * n as f64;
        let pts: Vec<(usize, f64)> = (1..=16).map(|n| (n, truth(n))).collect();
        let mut c = CostCurve::from_points(&pts).unwrap();
        // One forward 50× the curve (unclamped: T(8) 3.45× up) moves it 5% at most on the
        // profiled cache; on a long one, where T(n) and the slope each take a share, 10% (the
        // slope unclamped: 5.7×, every long request's rows priced far too dear).
        c.observe(8, 50.0 * truth(8));
        assert!(c.ms(8) <= 1.05 * truth(8) + 1e-9, "{}", c.ms(8));
        let mut long = CostCurve::from_points(&pts).unwrap().with_context_cost(0.003, 64).unwrap();
        let before = long.ms_at(8, 2064);
        long.observe_at(8, 50.0 * before, 2064);
        assert!(long.ms_at(8, 2064) <= 1.1 * before, "{} from {before}", long.ms_at(8, 2064));
        assert!(long.row_ms_per_context_token() < 0.0035, "{}", long.row_ms_per_context_token());
        // A machine 3× slower from now on: within 10% after 60 forwards.
        for _ in 0..60 {
            c.observe(8, 3.0 * truth(8));
        }
        assert!(c.ms(8) > 0.9 * 3.0 * truth(8), "{}", c.ms(8));
    }

    #[test]
    fn a_tap_collects_the_observations_of_every_clone() {
        let (c, tap) = CostCurve::linear(10.0, 10.0, 8).unwrap().tapped();
        let (mut a, mut b) = (c.clone(), c.clone());
        a.observe(4, 30.0);
        b.observe_at(2, 20.0, 0);
        let far = c.at_context(100);
        let mut far2 = far.clone();
        far2.observe(3, 1.0);
        assert_eq!(tap.observations(), 2, "derived curves are not tapped");
        let mut expect = CostCurve::linear(10.0, 10.0, 8).unwrap();
        expect.observe(4, 30.0);
        expect.observe(2, 20.0);
        assert_eq!(tap.curve(), expect);
        assert_eq!(a, a.clone().tapped().0, "a tap is not part of the value");
        assert_eq!(c.points()[..2], [(1, 20.0), (2, 30.0)]);
        // A forward on a long cache refines the slope, in the clone and in the tap alike.
        let mut long = c.clone();
        long.observe_at(8, 90.0 + 8.0 * 0.01 * 2000.0, 2000);
        assert!(long.row_ms_per_context_token() > 0.0);
        assert_eq!(tap.curve().row_ms_per_context_token(), long.row_ms_per_context_token());
        assert_eq!(tap.curve().ms(8), long.ms(8));
        assert_eq!(tap.observations(), 3);
    }

    #[test]
    fn round_trips_through_json() {
        let c =
            CostCurve::from_points(&[(1, 40.0), (3, 90.0)]).unwrap().with_context_cost(0.003, 64).unwrap();
        let back: CostCurve = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        // A curve cached before the context cost existed reads as "not measured".
        let old: CostCurve = serde_json::from_str(r#"{"ms":[40.0,65.0]}"#).unwrap();
        assert_eq!((old.row_ms_per_context_token(), old.ms_at(2, 4096)), (0.0, 65.0));
    }

    #[test]
    fn a_long_context_makes_every_row_dearer_and_its_timings_refine_the_slope() {
        let mut c =
            CostCurve::from_points(&[(1, 25.0), (16, 136.0)]).unwrap().with_context_cost(0.003, 64).unwrap();
        // Up to the profiled context, the profile; beyond it, 3 ms per row per 1,000 tokens.
        assert_eq!(c.ms_at(16, 10), 136.0);
        assert!((c.ms_at(16, 1064) - (136.0 + 16.0 * 3.0)).abs() < 1e-9);
        assert!((c.ms_at(1, 2064) - 31.0).abs() < 1e-9);
        // Relative to one row, 16 rows cost more on a long cache: drafts must pay more there.
        assert!(c.ms_at(16, 2064) / c.ms_at(1, 2064) > c.ms(16) / c.ms(1));
        // A forward timed on a long cache that matches the model leaves the curve as it was …
        let before = c.clone();
        for _ in 0..100 {
            c.observe_at(16, 136.0 + 16.0 * 6.0, 2064);
        }
        assert_eq!(c, before);
        // … one that is slower there is read there, mostly as a dearer row per token …
        for _ in 0..200 {
            c.observe_at(16, 136.0 + 16.0 * 8.0, 2064);
        }
        assert!((c.ms_at(16, 2064) - (136.0 + 16.0 * 8.0)).abs() < 1.0, "{}", c.ms_at(16, 2064));
        assert!(c.row_ms_per_context_token() > 0.0035, "{}", c.row_ms_per_context_token());
        assert!(c.ms(16) < 136.0 + 16.0, "{}", c.ms(16));
        // … and near the profiled context a slower forward moves the context-free part.
        for _ in 0..200 {
            c.observe_at(16, 150.0, 100);
        }
        assert!((c.ms_at(16, 100) - 150.0).abs() < 0.1, "{}", c.ms_at(16, 100));
        let far = c.at_context(2064);
        assert!((far.ms(16) - c.ms_at(16, 2064)).abs() < 1e-9);
        assert!((far.ms_at(16, 3064) - c.ms_at(16, 3064)).abs() < 1e-9);
        assert!(CostCurve::linear(1.0, 1.0, 2).unwrap().with_context_cost(-1.0, 0).is_err());
        assert!(CostCurve::linear(1.0, 1.0, 2).unwrap().with_context_cost(f64::NAN, 0).is_err());
    }

    #[test]
    fn a_slope_profiled_too_high_is_learned_down_without_dragging_short_caches_below_the_truth() {
        // The truth: T(n) = 40 + 28 n on the profiled cache, plus 11 µs per row per token. The
        // profile's slope: 18 µs. Requests alternate short and long caches, rows 1, 3 and 16.
        let truth = |n: usize, context: usize| {
            40.0 + 28.0 * n as f64 + 0.011 * (n * context.saturating_sub(64)) as f64
        };
        let pts: Vec<(usize, f64)> = [1, 3, 16].iter().map(|&n| (n, truth(n, 64))).collect();
        let mut c = CostCurve::from_points(&pts).unwrap().with_context_cost(0.018, 64).unwrap();
        for i in 0..300 {
            let context = [100, 700, 1500][i % 3];
            for n in [1, 3, 16] {
                c.observe_at(n, truth(n, context), context);
            }
        }
        // T(n) on a short cache stays at the truth (folding long caches' times with 18 µs a row
        // taken out would have pulled T(3) to 83 ms) and the slope comes down to what rows cost.
        for n in [1, 3, 16] {
            assert!(
                (c.ms_at(n, 100) - truth(n, 100)).abs() < 0.02 * truth(n, 100),
                "T({n}) {:?}",
                c.points()
            );
            assert!((c.ms_at(n, 1500) - truth(n, 1500)).abs() < 0.03 * truth(n, 1500), "T({n}) at 1500");
        }
        assert!((c.row_ms_per_context_token() - 0.011).abs() < 0.001, "{}", c.row_ms_per_context_token());
        // A profile taken busy, 2× too high, still washes out when only long caches are timed.
        let busy: Vec<(usize, f64)> = [1, 3, 16].iter().map(|&n| (n, 2.0 * truth(n, 64))).collect();
        let mut c = CostCurve::from_points(&busy).unwrap().with_context_cost(0.011, 64).unwrap();
        for _ in 0..40 {
            for n in [1, 3, 16] {
                c.observe_at(n, truth(n, 1500), 1500);
            }
        }
        for n in [1, 3, 16] {
            assert!(c.ms_at(n, 1500) < 1.1 * truth(n, 1500), "T({n}) at 1500: {}", c.ms_at(n, 1500));
        }
    }

    #[test]
    fn expected_times_are_the_mean_of_the_timings_and_the_curve_their_fast_end() {
        // Timings spread 10% above T(n), as a busy machine's do: T(n) keeps near the fast end,
        // the expected time is their mean, one row and more rows each their own.
        let mut c = CostCurve::linear(20.0, 10.0, 8).unwrap();
        let mut rng = 7u64;
        let mut sums = [0.0; 2];
        let rounds = 2000;
        for _ in 0..rounds {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (rng >> 11) as f64 / (1u64 << 53) as f64;
            let (one, four) = (30.0 * (1.0 + 0.02 * u), 60.0 * (1.0 + 0.2 * u));
            c.observe(1, one);
            c.observe(4, four);
            sums[0] += one;
            sums[1] += four;
        }
        let mean = [sums[0] / rounds as f64, sums[1] / rounds as f64];
        assert!(c.ms(4) < 0.97 * mean[1], "T(4) {} against a mean of {}", c.ms(4), mean[1]);
        for (n, m) in [(1, mean[0]), (4, mean[1])] {
            assert!((c.expected_ms(n) - m).abs() < 0.02 * m, "E T({n}) {} against {m}", c.expected_ms(n));
        }
        // One forward behind a page fault joins the excess as at most twice the curve.
        let before = c.excess(4);
        c.observe(4, 50.0 * c.ms(4));
        assert!(
            (c.excess(4) - (before + 0.1 * (2.0 - before))).abs() < 1e-9,
            "{} after {before}",
            c.excess(4)
        );
        // Taken to another context, the curve keeps what it learned.
        assert_eq!(c.at_context(900).excess(4), c.excess(4));
    }

    #[test]
    fn a_curve_saved_before_the_excess_was_learned_reads_none() {
        let old: CostCurve =
            serde_json::from_str(r#"{"ms":[30.0,45.0],"row_ms_per_context_token":0.0}"#).unwrap();
        assert_eq!((old.excess(1), old.excess(2)), (1.0, 1.0));
        assert_eq!(old.expected_ms(2), 45.0);
        let saved = serde_json::to_string(&old).unwrap();
        assert_eq!(serde_json::from_str::<CostCurve>(&saved).unwrap(), old);
    }
}
