//! `summary.md`: the headline tables (methods × categories) and per-method details.

use std::fmt::Write as _;

use crate::record::{Results, RunRecord, SummaryRow, ALL};

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".to_string(), |x| format!("{x:.digits$}"))
}

/// About three significant digits (tokens/s and milliseconds span 0.001 to 10^6).
fn fmt_tps(x: f64) -> String {
    if x == 0.0 || x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else if x >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// The markdown report: headline table (methods × categories) and per-method details.
pub fn summary_markdown(r: &Results) -> String {
    let mut s = String::new();
    header(&mut s, r);
    let cats = r.categories();
    speedup_table(&mut s, r, &cats);
    tokens_per_s_table(&mut s, r, &cats);
    per_method_table(&mut s, r);
    divergences(&mut s, r);
    s
}

/// Title, models, machine, load, build and run settings.
fn header(s: &mut String, r: &Results) {
    let c = &r.config;
    let m = &r.machine;
    let _ = writeln!(s, "# treespec bench\n");
    let models: Vec<String> = m
        .models
        .iter()
        .map(|f| format!("{} `{}` ({:.0} MiB)", f.role, f.name, f.size_bytes as f64 / 1048576.0))
        .collect();
    if !models.is_empty() {
        let _ = writeln!(s, "- models: {}", models.join(", "));
    }
    let _ = writeln!(
        s,
        "- machine: {}{} ({} logical CPUs, {} threads used, {} GiB, {}), {}",
        m.cpu,
        m.cpu_id.as_deref().map_or(String::new(), |id| format!(" [{id}]")),
        m.logical_cpus,
        m.threads,
        m.memory_gib,
        if m.simd.is_empty() { "no SIMD flags found".to_string() } else { m.simd.join(" ") },
        m.os
    );
    if let Some(d) = &m.device {
        let _ = writeln!(s, "- device: {d}");
    }
    if let Some(a) = m.load_average_start {
        // The end value includes this benchmark's own threads; the start value is other work.
        let busy =
            if a > m.logical_cpus as f64 * 0.5 { " — other work was running: expect noise" } else { "" };
        let end = m
            .load_average_end
            .map_or(String::new(), |b| format!(" ({b:.2} at the end, this benchmark included)"));
        let _ = writeln!(s, "- load average (1 min) {a:.2} at the start{end}{busy}");
    }
    let commit = m.git_commit.as_deref().map_or("unknown".to_string(), |h| {
        format!("{}{}", &h[..h.len().min(12)], if m.git_dirty == Some(true) { " (dirty)" } else { "" })
    });
    let _ = writeln!(s, "- treespec {} ({} backend), commit {commit}", m.treespec_version, c.backend);
    let _ = writeln!(
        s,
        "- {} prompts from `{}` × {} methods × {} repeat(s){}; -n {}; temperature {}; seed {}; took {:.1} s",
        c.n_prompts,
        c.prompts_file,
        c.methods.len(),
        c.repeat,
        if c.warmup { ", after a warm-up pass" } else { "" },
        c.max_new_tokens,
        c.sampling.temperature,
        c.seed,
        c.elapsed_s
    );
}

/// A methods × categories table under `title`, one cell per (method, category) row.
fn method_category_table(
    s: &mut String,
    r: &Results,
    cats: &[String],
    title: &str,
    cell: impl Fn(&SummaryRow) -> String,
) {
    let _ = writeln!(s, "\n## {title}\n");
    let _ = writeln!(s, "| method | {} |", cats.join(" | "));
    let _ = writeln!(s, "|---|{}", "---:|".repeat(cats.len()));
    for method in r.methods() {
        let cells: Vec<String> =
            cats.iter().map(|cat| r.row(&method, cat).map_or_else(|| "–".into(), &cell)).collect();
        let _ = writeln!(s, "| {method} | {} |", cells.join(" | "));
    }
}

fn speedup_table(s: &mut String, r: &Results, cats: &[String]) {
    method_category_table(s, r, cats, "Speed-up over plain (mean accepted length)", |row| {
        format!("{}× ({:.2})", fmt_opt(row.speedup_vs_plain, 2), row.mean_accepted)
    });
    let _ = writeln!(
        s,
        "\nSpeed-up = median tokens/s of the method ÷ median tokens/s of plain over the same prompts and \
         repeats (tokens/s excludes prompt processing). Mean accepted length = emitted tokens per target \
         forward, bonus token included (plain = 1)."
    );
}

fn tokens_per_s_table(s: &mut String, r: &Results, cats: &[String]) {
    method_category_table(s, r, cats, "Tokens/s: median [min–max] (runs)", |x| {
        format!(
            "{} [{}–{}] ({})",
            fmt_tps(x.tokens_per_s),
            fmt_tps(x.tokens_per_s_min),
            fmt_tps(x.tokens_per_s_max),
            x.n_runs
        )
    });
    if r.summary.iter().any(|x| x.n_runs < 3) {
        let _ = writeln!(
            s,
            "\nCells with fewer than 3 runs are single samples of a noisy quantity: use more prompts or \
             --repeat before reading much into them."
        );
    }
}

fn per_method_table(s: &mut String, r: &Results) {
    let _ = writeln!(s, "\n## Per method, all prompts\n");
    let _ = writeln!(
        s,
        "| method | runs | tok/s median [min–max] | speed-up [min–max] | mean accepted | accept rate by depth | draft ms/step | verify ms/step | identical to plain |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---|---:|---:|---:|");
    for method in r.methods() {
        let Some(row) = r.row(&method, ALL) else { continue };
        let rates: Vec<String> = row.accept_rate_by_depth.iter().take(6).map(|x| format!("{x:.2}")).collect();
        let ident = match row.identical_runs {
            Some(n) => format!("{n}/{}", row.n_runs),
            None if r.config.sampling.temperature > 0.0 => "unchecked (temp > 0)".into(),
            None => "– (unconstrained)".into(),
        };
        let _ = writeln!(
            s,
            "| {method} | {} | {} [{}–{}] | {}× [{}–{}] | {:.2} | {} | {} | {} | {ident} |",
            row.n_runs,
            fmt_tps(row.tokens_per_s),
            fmt_tps(row.tokens_per_s_min),
            fmt_tps(row.tokens_per_s_max),
            fmt_opt(row.speedup_vs_plain, 2),
            fmt_opt(row.speedup_min, 2),
            fmt_opt(row.speedup_max, 2),
            row.mean_accepted,
            if rates.is_empty() { "–".into() } else { rates.join(" ") },
            fmt_tps(row.draft_ms_per_step),
            fmt_tps(row.verify_ms_per_step),
        );
    }
    let _ = writeln!(
        s,
        "\nruns = prompts × repeats aggregated. [min–max]: the slowest and fastest run; for the speed-up, the \
         smallest and largest ratio of a run to plain's run of the same prompt and repeat. Acceptance rate \
         at depth d = walks that accepted a token at depth d ÷ walks that reached depth d. verify ms/step = \
         target forward over the tree + accept/reject walk."
    );
}

fn divergences(s: &mut String, r: &Results) {
    let diverged: Vec<&RunRecord> = r.runs.iter().filter(|x| x.identical_to_plain == Some(false)).collect();
    if diverged.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n## Outputs that differ from plain\n");
    for x in diverged {
        let _ = writeln!(
            s,
            "- {} on prompt {} ({}), repeat {}: first different token at index {}",
            x.method,
            x.prompt_id,
            x.category,
            x.repeat,
            x.first_divergence.map_or("?".into(), |i| i.to_string())
        );
    }
}
