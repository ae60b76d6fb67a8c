//! How one request bends the shared prices: a moving tally of how its text bore them out.
//!
//! The drafter keeps two tallies of this kind: one of its scored nodes (does this text follow its
//! matches as often as the pooled prices expect?) and one of its verified steps (did the tokens
//! accepted live up to what the path values promised? — the bets).

/// The shared prices pool every request, but whether a match continues depends on the text: an
/// article being summarised or code being edited keeps following its matches, a worked math
/// answer quotes a few words of the question and moves on. Each request keeps a moving tally of
/// its scored nodes (verified or not) — how many were right against how many the shared prices
/// expected — and scales every price's odds by that ratio: the pooled knowledge, bent toward what
/// this text has shown.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct RequestCalibration {
    pub(super) hits: f64,
    pub(super) expected: f64,
    trials: f64,
}

/// Per scored node, the weight the older node tally keeps (a memory of about 30 nodes).
pub(super) const NODE_DECAY: f64 = 0.97;
/// Per verified step, the weight the older step tally keeps (a memory of about 10 steps).
pub(super) const STEP_DECAY: f64 = 0.9;
/// Pseudo-nodes at the shared prices' own rate, so that a request's first few nodes move its
/// ratios only a little.
const CALIBRATION_PRIOR: f64 = 3.0;
/// The ratios' range.
pub(super) const CALIBRATION_RANGE: (f64, f64) = (0.25, 4.0);

impl RequestCalibration {
    pub(super) const NEUTRAL: Self = Self { hits: 0.0, expected: 0.0, trials: 0.0 };

    /// Add `hits` successes out of `trials` against `expected`, the older tally weighted by
    /// `decay`.
    pub(super) fn record(&mut self, hits: f64, expected: f64, trials: f64, decay: f64) {
        self.hits = self.hits * decay + hits;
        self.expected = self.expected * decay + expected;
        self.trials = self.trials * decay + trials;
    }

    /// Observed over expected successes, with the prior pseudo-nodes.
    pub(super) fn ratio(&self) -> f64 {
        ((self.hits + CALIBRATION_PRIOR) / (self.expected + CALIBRATION_PRIOR))
            .clamp(CALIBRATION_RANGE.0, CALIBRATION_RANGE.1)
    }

    /// Observed over expected failures, with the prior pseudo-nodes.
    fn miss_ratio(&self) -> f64 {
        let missed = (self.trials - self.hits).max(0.0);
        let expected = (self.trials - self.expected).max(0.0);
        ((missed + CALIBRATION_PRIOR) / (expected + CALIBRATION_PRIOR))
            .clamp(CALIBRATION_RANGE.0, CALIBRATION_RANGE.1)
    }

    /// `p` bent by what the request showed. Fewer hits than priced: the price is scaled by the
    /// ratio (a request whose nodes came true a third as often gets a third of each price). More:
    /// the odds are scaled by the hits' ratio over the misses' ratio, the shift of a logistic
    /// calibration — a copy priced 0.8 a node in a request that missed a quarter as often as
    /// expected is priced about 0.94 (scaling by the hits' ratio alone could not get it past
    /// 0.8 × 1.25), while a weak match stays weak (0 stays 0).
    pub(super) fn adjust(&self, p: f64) -> f64 {
        let r = self.ratio();
        if r < 1.0 {
            return (p * r).clamp(0.0, 1.0);
        }
        let m = r / self.miss_ratio();
        let denominator = 1.0 - p + p * m;
        if denominator <= 0.0 {
            p
        } else {
            (p * m / denominator).clamp(0.0, 1.0)
        }
    }
}
