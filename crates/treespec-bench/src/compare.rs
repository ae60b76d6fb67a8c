//! `bench --compare A B`: the per-method change between two result sets.

use std::fmt::Write as _;

use crate::record::{Results, SummaryRow};

/// Settings that differ between two result sets (a comparison across them is apples to oranges).
pub fn config_differences(a: &Results, b: &Results) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |what: &str, x: String, y: String| {
        if x != y {
            out.push(format!("{what}: {x} → {y}"));
        }
    };
    let models = |r: &Results| {
        r.machine.models.iter().map(|m| format!("{} {}", m.role, m.name)).collect::<Vec<_>>().join(", ")
    };
    check("models", models(a), models(b));
    check("cpu", a.machine.cpu.clone(), b.machine.cpu.clone());
    check("threads", a.machine.threads.to_string(), b.machine.threads.to_string());
    check("backend", a.config.backend.clone(), b.config.backend.clone());
    check("prompts file", a.config.prompts_file.clone(), b.config.prompts_file.clone());
    check("prompts", a.config.n_prompts.to_string(), b.config.n_prompts.to_string());
    check("-n", a.config.max_new_tokens.to_string(), b.config.max_new_tokens.to_string());
    check(
        "temperature",
        a.config.sampling.temperature.to_string(),
        b.config.sampling.temperature.to_string(),
    );
    check("repeat", a.config.repeat.to_string(), b.config.repeat.to_string());
    let commit = |r: &Results| r.machine.git_commit.clone().unwrap_or_else(|| "unknown".into());
    check("commit", commit(a), commit(b));
    out
}

fn pct(a: f64, b: f64) -> String {
    if a > 0.0 {
        format!("{:+.1}%", (b / a - 1.0) * 100.0)
    } else {
        "–".into()
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or("–".into(), |x| format!("{x:.2}×"))
}

/// Whether B's median lies inside A's min–max run spread (and A's inside B's): a change that
/// small is not distinguishable from run-to-run noise with these samples.
fn within_noise(a: &SummaryRow, b: &SummaryRow) -> bool {
    let inside = |x: f64, r: &SummaryRow| x >= r.tokens_per_s_min && x <= r.tokens_per_s_max;
    inside(b.tokens_per_s, a) && inside(a.tokens_per_s, b)
}

/// A plain-text table of the change from `a` to `b` for every (method, category) in either.
pub fn compare_text(a: &Results, b: &Results, a_name: &str, b_name: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "A = {a_name}\nB = {b_name}");
    let diffs = config_differences(a, b);
    if diffs.is_empty() {
        let _ = writeln!(s, "same models, machine, prompts and settings");
    } else {
        let _ = writeln!(s, "settings differ:");
        for d in diffs {
            let _ = writeln!(s, "  {d}");
        }
    }
    let mut cats = a.categories();
    for c in b.categories() {
        if !cats.contains(&c) {
            cats.push(c);
        }
    }
    let mut methods = a.methods();
    for m in b.methods() {
        if !methods.contains(&m) {
            methods.push(m);
        }
    }
    let _ = writeln!(
        s,
        "\n{:<12} {:<16} {:>10} {:>10} {:>8} {:>9} {:>9} {:>7} {:>7}  note",
        "method", "category", "tok/s A", "tok/s B", "change", "speedup A", "speedup B", "acc A", "acc B"
    );
    for c in &cats {
        for m in &methods {
            let (ra, rb) = (a.row(m, c), b.row(m, c));
            match (ra, rb) {
                (Some(x), Some(y)) => {
                    let note = if within_noise(x, y) { "within run spread" } else { "" };
                    let _ = writeln!(
                        s,
                        "{:<12} {:<16} {:>10.1} {:>10.1} {:>8} {:>9} {:>9} {:>7.2} {:>7.2}  {note}",
                        m,
                        c,
                        x.tokens_per_s,
                        y.tokens_per_s,
                        pct(x.tokens_per_s, y.tokens_per_s),
                        opt(x.speedup_vs_plain),
                        opt(y.speedup_vs_plain),
                        x.mean_accepted,
                        y.mean_accepted
                    );
                }
                (Some(_), None) => {
                    let _ = writeln!(s, "{m:<12} {c:<16} only in A");
                }
                (None, Some(_)) => {
                    let _ = writeln!(s, "{m:<12} {c:<16} only in B");
                }
                (None, None) => {}
            }
        }
    }
    let _ = writeln!(
        s,
        "\ntok/s: median over the runs; change = B ÷ A − 1. \"within run spread\": each median lies inside \
         the other set's min–max run range, so the change is not distinguishable from noise."
    );
    s
}
