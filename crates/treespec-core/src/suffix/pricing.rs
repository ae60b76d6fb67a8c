//! Pricing free drafts: P(target accepts a suffix-drafted node | its parent was accepted), learned
//! online per (context, vote share, source) and priced *pessimistically*.
//!
//! A free draft costs nothing to propose but each verified row costs target time, and on a CPU a
//! node must be accepted well over half the time to pay for its row. Weak matches are common and
//! usually wrong, long exact copies are rare and almost always right; one number per depth (the
//! prompt-lookup calibration) mixes them and ends up verifying the weak ones and cutting the copies
//! short. Here each cell of the feature grid is a Beta posterior (prior centred on a guess from the
//! context and vote share, worth two trials), and a node is priced at its posterior mean minus `z`
//! standard deviations: a cell seen a few times is not trusted, a cell seen hundreds of times is
//! priced at what it did. A node's context is the match it continues (the root's match length
//! plus the drafted tokens above it), so the deep nodes of a short match and the shallow nodes of
//! a long one share what they learn. A negative `z` prices optimistically — the drafter does that
//! on explicit exploration steps so that cells the pessimistic price keeps out still get tried.
//! Old trials are slowly forgotten, so the prices follow the text being written.

use serde::{Deserialize, Serialize};

use super::trie::NodeFeatures;

/// Context buckets: upper bounds (inclusive) of each bucket; longer contexts share the last. A
/// node's context is the match it continues: the root's match length plus the drafted tokens above
/// it. Once its parent is accepted, a node at depth d under an m-token match is in exactly the
/// situation of a depth-1 node under an (m + d − 1)-token match, so both share a cell: the deep
/// nodes of a copy learn from the shallow ones and the other way round.
const CONTEXT_EDGES: [usize; 13] = [2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64];
/// Buckets per feature.
const CONTEXT_BUCKETS: usize = CONTEXT_EDGES.len() + 1;
const SHARE_BUCKETS: usize = 4;
const CELLS: usize = CONTEXT_BUCKETS * SHARE_BUCKETS * 2;
/// Pseudo-trials of the prior in every cell.
const PRIOR_TRIALS: f64 = 2.0;
/// Per-trial decay of past counts (an effective memory of about 4,000 trials).
const DECAY: f64 = 0.99975;
/// A cell with fewer (decayed) trials than this is priced optimistically on exploration steps.
const EXPLORE_TRIALS: f64 = 16.0;

fn bucket(edges: &[usize], v: usize) -> usize {
    edges.iter().position(|&e| v <= e).unwrap_or(edges.len())
}

/// Vote share bucket: a split vote, a majority, one unanimous occurrence, a repeated unanimous one.
fn share_bucket(f: &NodeFeatures) -> usize {
    match (f.share, f.support) {
        (s, _) if s < 0.5 => 0,
        (s, _) if s < 0.999 => 1,
        (_, 1) => 2,
        _ => 3,
    }
}

/// The match a node continues, in tokens (see [`CONTEXT_EDGES`]).
fn context(f: &NodeFeatures) -> usize {
    f.match_len + f.depth.saturating_sub(1)
}

fn cell(f: &NodeFeatures) -> usize {
    (bucket(&CONTEXT_EDGES, context(f)) * SHARE_BUCKETS + share_bucket(f)) * 2 + f.global as usize
}

/// The prior guess: a match of m tokens followed d − 1 tokens deep is a context of m + d − 1
/// tokens; longer contexts predict better (m'/(m' + 2)), scaled by the node's vote share, and
/// other requests' text predicts less than the request's own.
pub fn prior_acceptance(f: &NodeFeatures) -> f64 {
    let context = context(f) as f64;
    let source = if f.global { 0.8 } else { 1.0 };
    (context / (context + 2.0) * f.share.clamp(0.0, 1.0) * source).clamp(0.01, 0.99)
}

/// Acceptance statistics per feature cell (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuffixPricing {
    accepted: Vec<f64>,
    trials: Vec<f64>,
    total: u64,
}

impl Default for SuffixPricing {
    fn default() -> Self {
        Self { accepted: vec![0.0; CELLS], trials: vec![0.0; CELLS], total: 0 }
    }
}

impl SuffixPricing {
    /// Pricing that knows nothing yet (answers from the prior).
    pub fn new() -> Self {
        Self::default()
    }

    /// Trials recorded so far.
    pub fn total_trials(&self) -> u64 {
        self.total
    }

    /// The posterior mean and standard deviation of a node's acceptance.
    pub fn posterior(&self, f: &NodeFeatures) -> (f64, f64) {
        let c = cell(f);
        let p0 = prior_acceptance(f);
        let a = self.accepted[c] + PRIOR_TRIALS * p0;
        let b = (self.trials[c] - self.accepted[c]).max(0.0) + PRIOR_TRIALS * (1.0 - p0);
        let n = a + b;
        (a / n, (a * b / (n * n * (n + 1.0))).sqrt())
    }

    /// The price of a node: posterior mean − `z` standard deviations, in [0, 1].
    pub fn price(&self, f: &NodeFeatures, z: f64) -> f64 {
        let (mean, sd) = self.posterior(f);
        (mean - z * sd).clamp(0.0, 1.0)
    }

    /// The price on an exploration step: optimistic (mean + `z` sd) for a cell tried fewer than
    /// `EXPLORE_TRIALS` times, the usual pessimistic price for the others.
    pub fn exploration_price(&self, f: &NodeFeatures, z: f64) -> f64 {
        if self.trials[cell(f)] < EXPLORE_TRIALS {
            self.price(f, -z)
        } else {
            self.price(f, z)
        }
    }

    /// Record one trial: a node whose parent was accepted, and whether it was.
    pub fn record(&mut self, f: &NodeFeatures, accepted: bool) {
        for (a, t) in self.accepted.iter_mut().zip(self.trials.iter_mut()) {
            *a *= DECAY;
            *t *= DECAY;
        }
        let c = cell(f);
        self.trials[c] += 1.0;
        self.accepted[c] += accepted as u8 as f64;
        self.total += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(match_len: usize, depth: usize) -> NodeFeatures {
        NodeFeatures { match_len, depth, share: 1.0, support: 1, global: false }
    }

    #[test]
    fn an_untried_cell_answers_a_pessimistic_prior() {
        let p = SuffixPricing::new();
        let long = node(40, 1);
        let weak = node(2, 1);
        assert!(p.posterior(&long).0 > 0.9 && p.posterior(&weak).0 < 0.6);
        // Pessimism lowers, optimism raises, z = 0 is the mean.
        assert!(p.price(&long, 1.0) < p.posterior(&long).0);
        assert!(p.price(&weak, -1.0) > p.posterior(&weak).0);
        assert_eq!(p.price(&long, 0.0), p.posterior(&long).0);
        assert_eq!(p.exploration_price(&long, 1.0), p.price(&long, -1.0));
        // Split votes and other requests' text start lower.
        let split = NodeFeatures { share: 0.3, ..long };
        let global = NodeFeatures { global: true, ..long };
        assert!(p.posterior(&split).0 < p.posterior(&long).0);
        assert!(p.posterior(&global).0 < p.posterior(&long).0);
    }

    #[test]
    fn learns_per_cell_and_trusts_what_it_saw_often() {
        let mut p = SuffixPricing::new();
        // Weak matches at depth 1: accepted 20%; long copies at depth 10: 98%.
        for i in 0..500 {
            p.record(&node(2, 1), i % 5 == 0);
            p.record(&node(30, 10), i % 50 != 0);
        }
        let weak = p.price(&node(2, 1), 1.0);
        let copy = p.price(&node(30, 10), 1.0);
        assert!((weak - 0.2).abs() < 0.05, "{weak}");
        assert!((copy - 0.98).abs() < 0.02, "{copy}");
        // A cell never tried still answers its prior.
        let untouched = node(6, 3);
        assert_eq!(p.posterior(&untouched).0, SuffixPricing::new().posterior(&untouched).0);
        // Well-tried cells keep their pessimistic price on exploration steps.
        assert_eq!(p.exploration_price(&node(2, 1), 1.0), weak);
        // A depth-1 node under a 39-token match continues the same context as the depth-10 node
        // under a 30-token one: it learned from those trials.
        assert_eq!(p.price(&node(39, 1), 1.0), copy);
        assert!(p.price(&node(3, 1), 1.0) < copy);
    }
}
