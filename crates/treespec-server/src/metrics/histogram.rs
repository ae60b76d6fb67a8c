//! Prometheus histograms: fixed upper bounds, cumulative `_bucket{le=…}` lines, `_sum`, `_count`.

use std::fmt::Write;

/// Seconds buckets for time to first token and request latency (5 ms … 2 min).
pub const SECONDS: &[f64] =
    &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// Buckets for a request's mean accepted length (tokens per target forward, ≥ 1).
pub const ACCEPTED_LENGTH: &[f64] = &[1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0];

/// Buckets for a request's target rows per forward (1 + drafted nodes per step).
pub const ROWS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0];

/// One histogram series.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); the last one is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    /// Empty, with these upper bounds (increasing).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0 }
    }

    /// One observation (NaN is dropped).
    pub fn observe(&mut self, v: f64) {
        if v.is_nan() {
            return;
        }
        let i = self.bounds.iter().position(|b| v <= *b).unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += v;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The series' lines; `labels` is empty or `key="value",…` (no braces).
    pub fn render(&self, s: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut acc = 0;
        for (i, n) in self.counts.iter().enumerate() {
            acc += n;
            let le = self.bounds.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(s, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {acc}");
        }
        let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let _ = writeln!(s, "{name}_sum{braces} {:.6}", self.sum);
        let _ = writeln!(s, "{name}_count{braces} {acc}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_end_in_inf() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        for v in [0.5, 1.0, 1.5, 9.0, f64::NAN] {
            h.observe(v);
        }
        let mut s = String::new();
        h.render(&mut s, "x", "m=\"a\"");
        assert_eq!(
            s,
            "x_bucket{m=\"a\",le=\"1\"} 2\nx_bucket{m=\"a\",le=\"2\"} 3\nx_bucket{m=\"a\",le=\"+Inf\"} 4\n\
             x_sum{m=\"a\"} 12.000000\nx_count{m=\"a\"} 4\n"
        );
        assert_eq!(h.count(), 4);
    }
}
