//! Decoding statistics with the definitions vLLM and llama.cpp use, so numbers compare:
//! mean accepted length = emitted tokens per verification forward, *including* the bonus token;
//! per-depth acceptance = accepted at depth d / walks that reached depth d with candidates.

use std::time::Duration;

use crate::verify::VerifyOutcome;

/// Acceptance counts at one tree depth.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DepthCounts {
    /// Verification walks that reached this depth with at least one candidate.
    pub reached: u64,
    /// Walks that accepted a candidate at this depth.
    pub accepted: u64,
}

impl DepthCounts {
    /// Conditional acceptance rate at this depth (0 when never reached).
    pub fn rate(&self) -> f64 {
        if self.reached == 0 {
            0.0
        } else {
            self.accepted as f64 / self.reached as f64
        }
    }
}

/// Wall time per phase of the decode loop.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseTimes {
    /// Prompt processing (target and draft).
    pub prefill: Duration,
    /// Drafting (draft model forwards, tree building).
    pub draft: Duration,
    /// Target forward passes over the tree.
    pub target: Duration,
    /// Verification arithmetic (sampling, accept/reject walk).
    pub verify: Duration,
    /// Commit, drafter bookkeeping, stop checks.
    pub overhead: Duration,
}

/// Statistics of one generation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DecodeStats {
    /// Tokens emitted (after stop-condition truncation).
    pub new_tokens: u64,
    /// Verification forwards of the target (one per decode step).
    pub target_forwards: u64,
    /// Of them, forwards that reused the graph of the forward before (llama.cpp's count: on a
    /// device, a replay), where the backend says.
    pub graph_reuses: u64,
    /// Forward calls of the draft model (0 for model-free drafters).
    pub draft_forwards: u64,
    /// Drafted tree nodes sent for verification.
    pub drafted: u64,
    /// Drafted nodes accepted.
    pub accepted: u64,
    /// Tokens emitted by the verifier before truncation (accepted + bonus), summed over steps.
    pub emitted: u64,
    /// Tokens a grammar forced (verified as free drafts; counted in `drafted` and `accepted` too).
    pub forced: u64,
    /// Per depth (index 0 = depth 1) acceptance counts.
    pub per_depth: Vec<DepthCounts>,
    /// Time per phase.
    pub times: PhaseTimes,
    /// Whole generation wall time.
    pub wall: Duration,
}

impl DecodeStats {
    /// Fold one verification step in.
    pub fn record_step(&mut self, drafted: usize, outcome: &VerifyOutcome) {
        self.target_forwards += 1;
        self.drafted += drafted as u64;
        self.accepted += outcome.accepted.len() as u64;
        self.emitted += outcome.tokens.len() as u64;
        for r in &outcome.depths {
            if self.per_depth.len() < r.depth {
                self.per_depth.resize(r.depth, DepthCounts::default());
            }
            let c = &mut self.per_depth[r.depth - 1];
            c.reached += 1;
            c.accepted += r.accepted as u64;
        }
    }

    /// Emitted tokens per verification forward, bonus included (1.0 = no speculation gain).
    pub fn mean_accepted(&self) -> f64 {
        if self.target_forwards == 0 {
            0.0
        } else {
            self.emitted as f64 / self.target_forwards as f64
        }
    }

    /// Fraction of drafted nodes accepted.
    pub fn draft_acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Decoding speed: new tokens per second of wall time after prompt processing (prefill is
    /// the same work for every method, so it is kept out of the rate, as llama.cpp's `eval` rate
    /// does).
    pub fn tokens_per_s(&self) -> f64 {
        let s = self.wall.saturating_sub(self.times.prefill).as_secs_f64();
        if s > 0.0 {
            self.new_tokens as f64 / s
        } else {
            0.0
        }
    }

    /// Per-depth conditional acceptance rates.
    pub fn depth_rates(&self) -> Vec<f64> {
        self.per_depth.iter().map(DepthCounts::rate).collect()
    }

    /// One human-readable line, as the CLI prints it.
    pub fn summary_line(&self) -> String {
        let rates: Vec<String> = self.depth_rates().iter().take(8).map(|r| format!("{:.2}", r)).collect();
        format!(
            "{} tokens in {:.2}s ({:.1} tok/s) | target forwards {} ({} reused the graph) | draft forwards {} | drafted {} accepted {} | mean accepted {:.2} | accept by depth [{}]",
            self.new_tokens,
            self.wall.as_secs_f64(),
            self.tokens_per_s(),
            self.target_forwards,
            self.graph_reuses,
            self.draft_forwards,
            self.drafted,
            self.accepted,
            self.mean_accepted(),
            rates.join(" ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::DepthRecord;

    #[test]
    fn mean_accepted_counts_the_bonus() {
        let mut s = DecodeStats::default();
        let out = VerifyOutcome {
            accepted: vec![1, 2],
            tokens: vec![5, 6, 7],
            depths: vec![
                DepthRecord { depth: 1, candidates: 1, tried: 1, accepted: true },
                DepthRecord { depth: 2, candidates: 1, tried: 1, accepted: true },
                DepthRecord { depth: 3, candidates: 1, tried: 1, accepted: false },
            ],
        };
        s.record_step(3, &out);
        let miss = VerifyOutcome {
            accepted: vec![],
            tokens: vec![9],
            depths: vec![DepthRecord { depth: 1, candidates: 2, tried: 2, accepted: false }],
        };
        s.record_step(2, &miss);
        assert_eq!(s.mean_accepted(), 2.0);
        assert_eq!(s.depth_rates(), vec![0.5, 1.0, 0.0]);
        assert_eq!(s.draft_acceptance(), 2.0 / 5.0);
    }
}
