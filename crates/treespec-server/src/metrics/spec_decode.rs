//! Speculative-decoding counters under the names dashboards already scrape: vLLM v1's
//! (`vllm:spec_decode_*`, labelled `model_name` and `engine`) and llama-server's
//! (`llamacpp:spec_decode_*`), beside treespec's own.
//!
//! Their meaning on a draft tree: a *draft* is a decode step that verified at least one drafted
//! node; *draft tokens* are the nodes verified (a tree's every node, a chain's every token);
//! *accepted tokens* are the drafted nodes accepted (the accepted path, bonus token excluded);
//! position `p` (from 0) counts the drafts whose accepted path reached depth `p + 1`. The
//! verifier stops at the first rejection, so the positions add up to the accepted tokens, and
//! `1 + accepted / drafts` is vLLM's mean acceptance length.

use std::fmt::Write;

use treespec_core::stats::DecodeStats;

/// The counters, summed over every finished generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecDecode {
    drafts: u64,
    draft_tokens: u64,
    accepted: u64,
    /// Drafts whose accepted path reached depth `p + 1`, by `p`.
    per_position: Vec<u64>,
}

impl SpecDecode {
    /// Fold in one generation's statistics.
    pub fn record(&mut self, stats: &DecodeStats) {
        // A step reached depth 1 with a candidate exactly when it verified a draft.
        self.drafts += stats.per_depth.first().map_or(0, |d| d.reached);
        self.draft_tokens += stats.drafted;
        self.accepted += stats.accepted;
        if self.per_position.len() < stats.per_depth.len() {
            self.per_position.resize(stats.per_depth.len(), 0);
        }
        for (n, d) in self.per_position.iter_mut().zip(&stats.per_depth) {
            *n += d.accepted;
        }
    }

    /// Both families, vLLM's labelled with the served `model`.
    pub fn render(&self, s: &mut String, model: &str) {
        let labels = format!("engine=\"0\",model_name=\"{}\"", escape(model));
        let totals = [
            ("num_drafts", "Number of spec decoding drafts.", self.drafts),
            ("num_draft_tokens", "Number of draft tokens.", self.draft_tokens),
            ("num_accepted_tokens", "Number of accepted tokens.", self.accepted),
        ];
        // vLLM (prometheus_client): the family is named without `_total`, its sample with it.
        for (name, help, v) in totals {
            let _ = writeln!(s, "# HELP vllm:spec_decode_{name} {help}");
            let _ = writeln!(s, "# TYPE vllm:spec_decode_{name} counter");
            let _ = writeln!(s, "vllm:spec_decode_{name}_total{{{labels}}} {v}");
        }
        let per_pos = "spec_decode_num_accepted_tokens_per_pos";
        let _ = writeln!(s, "# HELP vllm:{per_pos} Accepted tokens per draft position.");
        let _ = writeln!(s, "# TYPE vllm:{per_pos} counter");
        for (p, v) in self.per_position.iter().enumerate() {
            let _ = writeln!(s, "vllm:{per_pos}_total{{{labels},position=\"{p}\"}} {v}");
        }
        // llama-server: the family is named with `_total`, no model label.
        for (name, help, v) in totals {
            let _ = writeln!(s, "# HELP llamacpp:spec_decode_{name}_total {help}");
            let _ = writeln!(s, "# TYPE llamacpp:spec_decode_{name}_total counter");
            let _ = writeln!(s, "llamacpp:spec_decode_{name}_total {v}");
        }
        let _ = writeln!(s, "# HELP llamacpp:{per_pos}_total Accepted tokens per draft position.");
        let _ = writeln!(s, "# TYPE llamacpp:{per_pos}_total counter");
        for (p, v) in self.per_position.iter().enumerate() {
            let _ = writeln!(s, "llamacpp:{per_pos}_total{{position=\"{p}\"}} {v}");
        }
    }
}

/// A Prometheus label value: backslash, double quote and newline escaped.
pub(super) fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use treespec_core::stats::DepthCounts;

    #[test]
    fn positions_sum_to_the_accepted_tokens() {
        let mut c = SpecDecode::default();
        // Three steps with drafts (accepted paths of 2, 1 and 0 nodes) and one without.
        let stats = DecodeStats {
            target_forwards: 4,
            drafted: 9,
            accepted: 3,
            per_depth: vec![DepthCounts { reached: 3, accepted: 2 }, DepthCounts { reached: 2, accepted: 1 }],
            ..Default::default()
        };
        c.record(&stats);
        c.record(&DecodeStats { target_forwards: 2, ..Default::default() });
        let mut s = String::new();
        c.render(&mut s, "m\"x");
        for line in [
            "vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"m\\\"x\"} 3",
            "vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"m\\\"x\"} 9",
            "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"m\\\"x\"} 3",
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",model_name=\"m\\\"x\",position=\"0\"} 2",
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",model_name=\"m\\\"x\",position=\"1\"} 1",
            "llamacpp:spec_decode_num_drafts_total 3",
            "llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 1",
        ] {
            assert!(s.lines().any(|l| l == line), "missing {line} in\n{s}");
        }
    }
}
