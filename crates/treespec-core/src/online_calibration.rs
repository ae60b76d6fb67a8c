//! Online calibration of a drafter's confidence into acceptance probabilities.
//!
//! A drafter scores every node it proposes with a raw *conditional* confidence `r` ∈ [0, 1]: its
//! draft probability given the parent (a model draft), or a match statistic (a lookup). Raw draft
//! probabilities are over-confident — a small draft is often sure of a token the target does not
//! pick — and the error grows with depth. Budgeting needs the real number: the probability that
//! the target accepts the node given that it accepted the parent. This module learns it per depth
//! and per confidence bin from every verified step (a node whose parent was accepted is one trial),
//! smoothed toward the raw value by a Beta prior so that an empty bin answers `r` itself, and
//! slowly forgetting old steps so the estimate follows the text being generated.

use serde::{Deserialize, Serialize};

/// Depths tracked separately; deeper nodes share the last depth's bins.
pub const DEPTHS: usize = 6;
/// Confidence bins over [0, 1].
pub const BINS: usize = 10;
/// Pseudo-trials of the prior (centred on the raw confidence) in every bin.
const PRIOR_TRIALS: f64 = 2.0;
/// Per-trial decay of the past counts: an effective memory of about 2,000 trials.
const DECAY: f64 = 0.9995;

/// Acceptance statistics per (depth, confidence bin).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AcceptanceCalibrator {
    accepted: Vec<f64>,
    trials: Vec<f64>,
    total: u64,
}

impl Default for AcceptanceCalibrator {
    fn default() -> Self {
        Self { accepted: vec![0.0; DEPTHS * BINS], trials: vec![0.0; DEPTHS * BINS], total: 0 }
    }
}

fn bin(r: f64) -> usize {
    let r = if r.is_finite() { r.clamp(0.0, 1.0) } else { 0.0 };
    ((r * BINS as f64) as usize).min(BINS - 1)
}

fn cell(depth: usize, r: f64) -> usize {
    (depth.clamp(1, DEPTHS) - 1) * BINS + bin(r)
}

impl AcceptanceCalibrator {
    /// A calibrator that knows nothing yet (answers the raw confidence).
    pub fn new() -> Self {
        Self::default()
    }

    /// Trials recorded so far.
    pub fn total_trials(&self) -> u64 {
        self.total
    }

    /// Estimated P(target accepts a node at `depth` with raw confidence `r` | parent accepted).
    pub fn acceptance(&self, depth: usize, r: f64) -> f64 {
        let r = if r.is_finite() { r.clamp(0.0, 1.0) } else { 0.0 };
        let c = cell(depth, r);
        (self.accepted[c] + PRIOR_TRIALS * r) / (self.trials[c] + PRIOR_TRIALS)
    }

    /// The highest acceptance any confidence reaches at `depth` (an optimistic bound for nodes not
    /// drafted yet): the calibrated value of the top bin, at least what was observed in any bin.
    pub fn best_acceptance(&self, depth: usize) -> f64 {
        (0..BINS).map(|b| self.acceptance(depth, (b as f64 + 0.999) / BINS as f64)).fold(0.0, f64::max)
    }

    /// Record one trial: a node at `depth` with raw confidence `r` whose parent was accepted.
    pub fn record(&mut self, depth: usize, r: f64, accepted: bool) {
        for (a, t) in self.accepted.iter_mut().zip(self.trials.iter_mut()) {
            *a *= DECAY;
            *t *= DECAY;
        }
        let c = cell(depth, r);
        self.trials[c] += 1.0;
        if accepted {
            self.accepted[c] += 1.0;
        }
        self.total += 1;
    }

    /// The acceptance a node at `depth` is expected to have before it is drafted, whatever its
    /// confidence: the share of that depth's trials the target accepted, read with `prior` as
    /// the prior's pseudo-trials, so a depth never tried answers `prior` and a depth tried
    /// often answers what it showed.
    pub fn expected_acceptance(&self, depth: usize, prior: f64) -> f64 {
        let (accepted, trials) = self.depth_counts(depth.clamp(1, DEPTHS) - 1);
        (accepted + PRIOR_TRIALS * prior) / (trials + PRIOR_TRIALS)
    }

    /// Accepted and tried nodes at depth index `d` (0 = depth 1) over all bins, decayed.
    fn depth_counts(&self, d: usize) -> (f64, f64) {
        let bins = d * BINS..(d + 1) * BINS;
        (self.accepted[bins.clone()].iter().sum(), self.trials[bins].iter().sum())
    }

    /// Observed acceptance rate per depth over all bins (for reports), `None` where no trial.
    pub fn per_depth(&self) -> Vec<Option<f64>> {
        (0..DEPTHS)
            .map(|d| {
                let (a, t) = self.depth_counts(d);
                (t > 0.0).then(|| a / t)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_acceptance_moves_from_the_prior_to_what_a_depth_showed() {
        let mut c = AcceptanceCalibrator::new();
        assert!((c.expected_acceptance(1, 0.9) - 0.9).abs() < 1e-12);
        for i in 0..200 {
            c.record(1, 0.95, i % 2 == 0);
        }
        let half = c.expected_acceptance(1, 0.9);
        assert!((half - 0.5).abs() < 0.01, "{half}");
        // Depth 2 was never tried: still the prior; depths past the last share its counts.
        assert!((c.expected_acceptance(2, 0.9) - 0.9).abs() < 1e-12);
        assert_eq!(c.expected_acceptance(DEPTHS + 3, 0.9), c.expected_acceptance(DEPTHS, 0.9));
    }

    #[test]
    fn an_empty_calibrator_answers_the_raw_confidence() {
        let c = AcceptanceCalibrator::new();
        for r in [0.0, 0.25, 0.9, 1.0] {
            assert!((c.acceptance(1, r) - r).abs() < 1e-12);
        }
        assert!(c.acceptance(3, f64::NAN) == 0.0);
    }

    #[test]
    fn learns_an_over_confident_draft_per_depth() {
        let mut c = AcceptanceCalibrator::new();
        // Depth 1 at r≈0.95 is accepted 60% of the time; depth 2 at the same r only 30%.
        for i in 0..1000 {
            c.record(1, 0.95, i % 10 < 6);
            c.record(2, 0.95, i % 10 < 3);
        }
        assert!((c.acceptance(1, 0.95) - 0.6).abs() < 0.02, "{}", c.acceptance(1, 0.95));
        assert!((c.acceptance(2, 0.95) - 0.3).abs() < 0.02, "{}", c.acceptance(2, 0.95));
        // Untouched bins still answer the raw value.
        assert!((c.acceptance(1, 0.15) - 0.15).abs() < 1e-9);
        // Depths past the last share its bins.
        assert_eq!(c.acceptance(DEPTHS + 3, 0.95), c.acceptance(DEPTHS, 0.95));
        let per_depth = c.per_depth();
        assert!((per_depth[0].unwrap() - 0.6).abs() < 0.02);
        assert_eq!(per_depth[3], None);
        assert!(c.best_acceptance(1) >= 0.6);
    }

    #[test]
    fn old_trials_are_forgotten() {
        let mut c = AcceptanceCalibrator::new();
        for _ in 0..3000 {
            c.record(1, 0.85, true);
        }
        for _ in 0..6000 {
            c.record(1, 0.85, false);
        }
        assert!(c.acceptance(1, 0.85) < 0.1, "{}", c.acceptance(1, 0.85));
    }
}
