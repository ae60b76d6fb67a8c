//! Prometheus text exposition, by hand: counters behind one mutex (updates are a few per request
//! and per generation, never per token).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use treespec_core::stats::DecodeStats;

/// Per-method generation totals.
#[derive(Debug, Clone, Default)]
struct MethodTotals {
    generations: u64,
    cancelled: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    seconds: f64,
    target_forwards: u64,
    /// (reached, accepted) per depth.
    depth: Vec<(u64, u64)>,
}

#[derive(Debug, Default)]
struct Inner {
    /// (endpoint, status) → count.
    requests: BTreeMap<(String, u16), u64>,
    /// kind → count.
    errors: BTreeMap<String, u64>,
    methods: BTreeMap<String, MethodTotals>,
    in_flight: i64,
}

/// The server's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// One answered HTTP request.
    pub fn request(&self, endpoint: &str, status: u16) {
        self.with(|m| *m.requests.entry((endpoint.to_string(), status)).or_default() += 1);
        if status >= 400 {
            self.error(if status >= 500 { "server" } else { "client" });
        }
    }

    /// One error of `kind`.
    pub fn error(&self, kind: &str) {
        self.with(|m| *m.errors.entry(kind.to_string()).or_default() += 1);
    }

    /// A generation started (+1) or ended (−1).
    pub fn in_flight(&self, delta: i64) {
        self.with(|m| m.in_flight += delta);
    }

    /// A finished generation.
    pub fn generation(&self, method: &str, prompt_tokens: usize, stats: &DecodeStats) {
        self.with(|m| {
            let t = m.methods.entry(method.to_string()).or_default();
            t.generations += 1;
            t.prompt_tokens += prompt_tokens as u64;
            t.completion_tokens += stats.new_tokens;
            t.seconds += stats.wall.as_secs_f64();
            t.target_forwards += stats.target_forwards;
            if t.depth.len() < stats.per_depth.len() {
                t.depth.resize(stats.per_depth.len(), (0, 0));
            }
            for (acc, d) in t.depth.iter_mut().zip(&stats.per_depth) {
                acc.0 += d.reached;
                acc.1 += d.accepted;
            }
        });
    }

    /// A generation cancelled because its client went away.
    pub fn cancelled(&self, method: &str) {
        self.with(|m| m.methods.entry(method.to_string()).or_default().cancelled += 1);
    }

    /// The Prometheus text, with the current queue depth.
    pub fn render(&self, queue_depth: usize) -> String {
        self.with(|m| {
            let mut s = String::new();
            let _ = writeln!(s, "# HELP treespec_requests_total HTTP requests by endpoint and status.");
            let _ = writeln!(s, "# TYPE treespec_requests_total counter");
            for ((e, st), n) in &m.requests {
                let _ = writeln!(s, "treespec_requests_total{{endpoint=\"{e}\",status=\"{st}\"}} {n}");
            }
            let _ = writeln!(s, "# HELP treespec_errors_total Errors by kind (client = 4xx, server = 5xx).");
            let _ = writeln!(s, "# TYPE treespec_errors_total counter");
            for (k, n) in &m.errors {
                let _ = writeln!(s, "treespec_errors_total{{kind=\"{k}\"}} {n}");
            }
            let _ = writeln!(s, "# HELP treespec_queue_depth Requests waiting for the model.");
            let _ = writeln!(s, "# TYPE treespec_queue_depth gauge");
            let _ = writeln!(s, "treespec_queue_depth {queue_depth}");
            let _ = writeln!(s, "# HELP treespec_generations_in_flight Generations running now.");
            let _ = writeln!(s, "# TYPE treespec_generations_in_flight gauge");
            let _ = writeln!(s, "treespec_generations_in_flight {}", m.in_flight);
            type Field = fn(&MethodTotals) -> String;
            let per_method: [(&str, &str, &str, Field); 8] = [
                ("treespec_generations_total", "counter", "Finished generations by method.", |t| {
                    t.generations.to_string()
                }),
                ("treespec_cancelled_total", "counter", "Generations cancelled by a disconnect.", |t| {
                    t.cancelled.to_string()
                }),
                ("treespec_prompt_tokens_total", "counter", "Prompt tokens processed.", |t| {
                    t.prompt_tokens.to_string()
                }),
                ("treespec_completion_tokens_total", "counter", "Tokens generated.", |t| {
                    t.completion_tokens.to_string()
                }),
                ("treespec_generation_seconds_total", "counter", "Wall time spent generating.", |t| {
                    format!("{:.6}", t.seconds)
                }),
                ("treespec_target_forwards_total", "counter", "Target forwards (decode steps).", |t| {
                    t.target_forwards.to_string()
                }),
                ("treespec_tokens_per_second", "gauge", "Generated tokens per generation second.", |t| {
                    format!(
                        "{:.3}",
                        if t.seconds > 0.0 { t.completion_tokens as f64 / t.seconds } else { 0.0 }
                    )
                }),
                ("treespec_mean_accepted_length", "gauge", "Mean tokens emitted per target forward.", |t| {
                    let f = t.target_forwards;
                    format!("{:.4}", if f > 0 { t.completion_tokens as f64 / f as f64 } else { 0.0 })
                }),
            ];
            for (name, kind, help, field) in per_method {
                let _ = writeln!(s, "# HELP {name} {help}");
                let _ = writeln!(s, "# TYPE {name} {kind}");
                for (method, t) in &m.methods {
                    let _ = writeln!(s, "{name}{{method=\"{method}\"}} {}", field(t));
                }
            }
            let _ = writeln!(
                s,
                "# HELP treespec_depth_acceptance_rate Conditional acceptance rate at each tree depth."
            );
            let _ = writeln!(s, "# TYPE treespec_depth_acceptance_rate gauge");
            for (method, t) in &m.methods {
                for (i, (reached, accepted)) in t.depth.iter().enumerate() {
                    let rate = if *reached > 0 { *accepted as f64 / *reached as f64 } else { 0.0 };
                    let _ = writeln!(
                        s,
                        "treespec_depth_acceptance_rate{{method=\"{method}\",depth=\"{}\"}} {rate:.4}",
                        i + 1
                    );
                }
            }
            s
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use treespec_core::stats::DepthCounts;

    #[test]
    fn renders_counters_and_rates() {
        let m = Metrics::default();
        m.request("/v1/chat/completions", 200);
        m.request("/v1/chat/completions", 400);
        let stats = DecodeStats {
            new_tokens: 10,
            target_forwards: 4,
            per_depth: vec![DepthCounts { reached: 4, accepted: 3 }, DepthCounts { reached: 3, accepted: 1 }],
            wall: std::time::Duration::from_secs(2),
            ..Default::default()
        };
        m.generation("chain", 5, &stats);
        let text = m.render(3);
        for line in [
            "treespec_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1",
            "treespec_errors_total{kind=\"client\"} 1",
            "treespec_queue_depth 3",
            "treespec_completion_tokens_total{method=\"chain\"} 10",
            "treespec_tokens_per_second{method=\"chain\"} 5.000",
            "treespec_mean_accepted_length{method=\"chain\"} 2.5000",
            "treespec_depth_acceptance_rate{method=\"chain\",depth=\"2\"} 0.3333",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }
}
