//! Measured forward-cost curves T(n): milliseconds for one model forward of n new tokens.
//!
//! On a CPU, verification is not free and the curve is neither flat nor linear: it has steps
//! where the matmul kernels change with the batch size (a 4-token batch can cost no more than a
//! 3-token one). Tree budgeting must read the curve, never assume its shape, so a [`CostCurve`]
//! holds one measured value per batch size, starts from a start-up profile (cached per model file
//! and thread count by the caller) and is refined online from every timed forward.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Weight of a new online observation in the running estimate of T(n). Small enough that one
/// noisy forward (a page fault, another process) barely moves the curve, large enough that a
/// machine that got slower is followed within a few dozen steps.
const ONLINE_WEIGHT: f64 = 0.05;

/// T(n) in milliseconds for n = 1..=`max_n`, beyond which it is extrapolated linearly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostCurve {
    /// `ms[n - 1]` = T(n).
    ms: Vec<f64>,
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
        Ok(Self { ms })
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

    /// The most any batch of at most `n` tokens costs: T read as non-decreasing. A measured
    /// curve can dip (T(16) below T(14) where the kernels change), and a price read off a dip
    /// would make rows look free or even negative; a batch budget prices rows on this envelope.
    pub fn ms_envelope(&self, n: usize) -> f64 {
        let measured = n.min(self.ms.len());
        let peak = self.ms[..measured].iter().copied().fold(0.0, f64::max);
        peak.max(self.ms(n))
    }

    /// Fold one timed forward of `n` tokens into the estimate (exponentially weighted). Sizes
    /// beyond the measured range are ignored: one observation is not a curve.
    pub fn observe(&mut self, n: usize, ms: f64) {
        if n == 0 || n > self.ms.len() || !(ms.is_finite() && ms > 0.0) {
            return;
        }
        let t = &mut self.ms[n - 1];
        *t += ONLINE_WEIGHT * (ms - *t);
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
    fn round_trips_through_json() {
        let c = CostCurve::from_points(&[(1, 40.0), (3, 90.0)]).unwrap();
        let back: CostCurve = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }
}
