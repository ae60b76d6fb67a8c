//! The result set and its files: `results.json`, `summary.md`, `speedup.svg`, `acceptance.svg`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use treespec_core::stats::DecodeStats;
use treespec_engine::{ExtraStats, METHOD_NAMES};

use crate::machine::MachineInfo;
use crate::prompts::Prompt;
use crate::summary::{run_categories, SummaryRow, ALL};

/// Schema tag written into every results.json.
pub const SCHEMA: &str = "treespec-bench/1";

/// One measured generation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Method name.
    pub method: String,
    /// Prompt id.
    pub prompt_id: String,
    /// Prompt category.
    pub category: String,
    /// Repeat index (0-based).
    pub repeat: usize,
    /// Seed of the draft and verifier streams.
    pub seed: u64,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Tokens emitted.
    pub new_tokens: u64,
    /// "length", "eos" or "stop".
    pub finish_reason: String,
    /// Whole generation wall time, prefill included.
    pub wall_s: f64,
    /// Prompt processing time.
    pub prefill_s: f64,
    /// New tokens per second of wall time after prefill.
    pub tokens_per_s: f64,
    /// Target forwards (decode steps).
    pub target_forwards: u64,
    /// Draft model forwards.
    pub draft_forwards: u64,
    /// Drafted nodes sent for verification.
    pub drafted: u64,
    /// Drafted nodes accepted.
    pub accepted: u64,
    /// Tokens emitted by the verifier (accepted + bonus) before truncation.
    pub emitted: u64,
    /// Emitted tokens per target forward, bonus included.
    pub mean_accepted: f64,
    /// Acceptance rate at depth 1, 2, …
    pub accept_rate_by_depth: Vec<f64>,
    /// Walks that reached depth 1, 2, … with a candidate.
    pub depth_reached: Vec<u64>,
    /// Walks that accepted at depth 1, 2, …
    pub depth_accepted: Vec<u64>,
    /// Drafting time.
    pub draft_s: f64,
    /// Target forward time.
    pub target_s: f64,
    /// Accept/reject walk time.
    pub verify_s: f64,
    /// Commit, drafter bookkeeping, stop checks.
    pub overhead_s: f64,
    /// Same tokens as plain's run of this prompt and repeat (temperature 0 only, else null).
    pub identical_to_plain: Option<bool>,
    /// First token index where the output differs from plain's (null when identical or unchecked).
    pub first_divergence: Option<usize>,
    /// Method-specific statistics (`Drafter::extra_stats`); non-finite values are null.
    pub extra: BTreeMap<String, Value>,
}

impl RunRecord {
    /// A record from a generation's statistics.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        method: &str,
        prompt: &Prompt,
        repeat: usize,
        seed: u64,
        prompt_tokens: usize,
        finish_reason: &str,
        s: &DecodeStats,
        extra: &ExtraStats,
    ) -> Self {
        Self {
            method: method.to_string(),
            prompt_id: prompt.id.clone(),
            category: prompt.category.clone(),
            repeat,
            seed,
            prompt_tokens,
            new_tokens: s.new_tokens,
            finish_reason: finish_reason.to_string(),
            wall_s: s.wall.as_secs_f64(),
            prefill_s: s.times.prefill.as_secs_f64(),
            tokens_per_s: s.tokens_per_s(),
            target_forwards: s.target_forwards,
            draft_forwards: s.draft_forwards,
            drafted: s.drafted,
            accepted: s.accepted,
            emitted: s.emitted,
            mean_accepted: s.mean_accepted(),
            accept_rate_by_depth: s.depth_rates(),
            depth_reached: s.per_depth.iter().map(|d| d.reached).collect(),
            depth_accepted: s.per_depth.iter().map(|d| d.accepted).collect(),
            draft_s: s.times.draft.as_secs_f64(),
            target_s: s.times.target.as_secs_f64(),
            verify_s: s.times.verify.as_secs_f64(),
            overhead_s: s.times.overhead.as_secs_f64(),
            identical_to_plain: None,
            first_divergence: None,
            extra: extra.to_map().into_iter().collect(),
        }
    }
}

/// Sampling settings of a result set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingConfig {
    /// Temperature (0 = greedy).
    pub temperature: f32,
    /// Top-k, if any.
    pub top_k: Option<usize>,
    /// Top-p.
    pub top_p: f32,
    /// Min-p.
    pub min_p: f32,
    /// Repetition penalty.
    pub repetition_penalty: f32,
}

/// A benchmarked method and its knobs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MethodConfig {
    /// Name.
    pub name: String,
    /// The method's knobs as the engine sees them (Rust debug form).
    pub spec: String,
}

/// How a result set was produced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchConfig {
    /// "llama" or "toy".
    pub backend: String,
    /// Prompt file.
    pub prompts_file: String,
    /// `--categories` (null = all).
    pub categories: Option<Vec<String>>,
    /// `--per-category`.
    pub per_category: Option<usize>,
    /// `--limit`.
    pub limit: Option<usize>,
    /// Prompts run.
    pub n_prompts: usize,
    /// Prompts formatted with the chat template.
    pub chat: bool,
    /// Most new tokens per generation (-n).
    pub max_new_tokens: usize,
    /// Sampling.
    pub sampling: SamplingConfig,
    /// Base seed (repeat r uses seed + r).
    pub seed: u64,
    /// Runs per (method, prompt).
    pub repeat: usize,
    /// Whether a warm-up pass ran first.
    pub warmup: bool,
    /// Methods in run order.
    pub methods: Vec<MethodConfig>,
    /// Backend-specific settings (context size, exact mode, method knobs as given, …).
    pub options: Value,
    /// Start time, seconds since the Unix epoch.
    pub started_unix_s: u64,
    /// Whole benchmark wall time, warm-up included.
    pub elapsed_s: f64,
    /// Warm-up wall time.
    pub warmup_s: f64,
}

/// Everything a benchmark produced: what `results.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// [`SCHEMA`].
    pub schema: String,
    /// Machine, build and models.
    pub machine: MachineInfo,
    /// Settings.
    pub config: BenchConfig,
    /// Every measured generation.
    pub runs: Vec<RunRecord>,
    /// Aggregates (see `summary.rs` for the definitions).
    pub summary: Vec<SummaryRow>,
}

impl Results {
    /// Read `DIR/results.json` (or a results.json path).
    pub fn load(path: &Path) -> Result<Self> {
        let file = if path.is_dir() { path.join("results.json") } else { path.to_path_buf() };
        let text =
            std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        let r: Results = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a treespec bench result file", file.display()))?;
        if r.schema != SCHEMA {
            bail!("{}: schema '{}', expected '{SCHEMA}'", file.display(), r.schema);
        }
        Ok(r)
    }

    /// The row of `method` in `category`.
    pub fn row(&self, method: &str, category: &str) -> Option<&SummaryRow> {
        self.summary.iter().find(|r| r.method == method && r.category == category)
    }

    /// Methods in summary order.
    pub fn methods(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in &self.summary {
            if !out.contains(&r.method) {
                out.push(r.method.clone());
            }
        }
        out
    }

    /// "all" then the categories in run order.
    pub fn categories(&self) -> Vec<String> {
        let mut out = vec![ALL.to_string()];
        out.extend(run_categories(&self.runs));
        out
    }
}

/// Write results.json, summary.md, speedup.svg and acceptance.svg into `dir` (created if
/// needed). Returns the paths written.
pub fn write_all(dir: &Path, results: &Results) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create output directory {}", dir.display()))?;
    let files = [
        ("results.json", serde_json::to_string_pretty(results)? + "\n"),
        ("summary.md", summary_markdown(results)),
        ("speedup.svg", speedup_svg(results)?),
        ("acceptance.svg", acceptance_svg(results)?),
    ];
    let mut out = Vec::new();
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        out.push(path);
    }
    Ok(out)
}

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
    let c = &r.config;
    let m = &r.machine;
    let mut s = String::new();
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
    let cats = r.categories();
    let _ = writeln!(s, "\n## Speed-up over plain (mean accepted length)\n");
    let _ = writeln!(s, "| method | {} |", cats.join(" | "));
    let _ = writeln!(s, "|---|{}", "---:|".repeat(cats.len()));
    for method in r.methods() {
        let cells: Vec<String> = cats
            .iter()
            .map(|cat| match r.row(&method, cat) {
                Some(row) => format!("{}× ({:.2})", fmt_opt(row.speedup_vs_plain, 2), row.mean_accepted),
                None => "–".into(),
            })
            .collect();
        let _ = writeln!(s, "| {method} | {} |", cells.join(" | "));
    }
    let _ = writeln!(
        s,
        "\nSpeed-up = median tokens/s of the method ÷ median tokens/s of plain over the same prompts and \
         repeats (tokens/s excludes prompt processing). Mean accepted length = emitted tokens per target \
         forward, bonus token included (plain = 1)."
    );

    let _ = writeln!(s, "\n## Tokens/s: median [min–max] (runs)\n");
    let _ = writeln!(s, "| method | {} |", cats.join(" | "));
    let _ = writeln!(s, "|---|{}", "---:|".repeat(cats.len()));
    for method in r.methods() {
        let cells: Vec<String> = cats
            .iter()
            .map(|cat| match r.row(&method, cat) {
                Some(x) => format!(
                    "{} [{}–{}] ({})",
                    fmt_tps(x.tokens_per_s),
                    fmt_tps(x.tokens_per_s_min),
                    fmt_tps(x.tokens_per_s_max),
                    x.n_runs
                ),
                None => "–".into(),
            })
            .collect();
        let _ = writeln!(s, "| {method} | {} |", cells.join(" | "));
    }
    if r.summary.iter().any(|x| x.n_runs < 3) {
        let _ = writeln!(
            s,
            "\nCells with fewer than 3 runs are single samples of a noisy quantity: use more prompts or \
             --repeat before reading much into them."
        );
    }

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
            None => "unchecked (temp > 0)".into(),
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
    let diverged: Vec<&RunRecord> = r.runs.iter().filter(|x| x.identical_to_plain == Some(false)).collect();
    if !diverged.is_empty() {
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
    s
}

/// A stable color per method (its index among the engine's method names).
fn method_color(name: &str) -> RGBColor {
    const PALETTE: [RGBColor; 11] = [
        RGBColor(127, 127, 127),
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
        RGBColor(57, 59, 121),
    ];
    let i = METHOD_NAMES.iter().position(|m| *m == name).unwrap_or(0);
    PALETTE[i % PALETTE.len()]
}

fn chart_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a chart: {e:?}")
}

const FONT: &str = "sans-serif";

/// Grouped bars: speed-up over plain per category (groups) and method (bars), with the paired
/// min–max spread as whiskers and a line at 1×.
pub fn speedup_svg(r: &Results) -> Result<String> {
    let cats = r.categories();
    let mut methods: Vec<String> = r.methods().into_iter().filter(|m| m != "plain").collect();
    if methods.is_empty() {
        methods.push("plain".into());
    }
    let value = |m: &str, c: &str| r.row(m, c).and_then(|row| row.speedup_vs_plain);
    let shown = r.summary.iter().filter(|row| methods.contains(&row.method));
    let top_bar = shown.clone().filter_map(|row| row.speedup_vs_plain).fold(1.0f64, f64::max);
    let top_whisker = shown.filter_map(|row| row.speedup_max).fold(top_bar, f64::max);
    // One wild run must not flatten every bar: whiskers beyond 2.5× the tallest bar are cut at the
    // top and labelled with their value.
    let y_max = (top_whisker.min(2.5 * top_bar) * 1.15).max(1.2);
    let y_cut = y_max / 1.08;
    let width = (LEGEND_W as usize + 80 + 30 * cats.len() * (methods.len() + 1)).clamp(760, 2600) as u32;
    let height = 460u32;
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(chart_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Speed-up over plain decoding (ratio of median tokens/s)", (FONT, 20))
            .margin(12)
            .margin_right(LEGEND_W)
            .margin_bottom(22)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(0f64..cats.len() as f64, 0f64..y_max)
            .map_err(chart_err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .max_light_lines(1)
            .x_labels(0)
            .y_desc("speed-up (×)")
            .y_label_formatter(&|v| format!("{v:.1}"))
            .label_style((FONT, 13))
            .draw()
            .map_err(chart_err)?;
        let n = methods.len() as f64;
        let bw = 0.8 / n;
        for (j, m) in methods.iter().enumerate() {
            let color = method_color(m);
            let bars: Vec<Rectangle<(f64, f64)>> = cats
                .iter()
                .enumerate()
                .filter_map(|(i, c)| {
                    let v = value(m, c)?;
                    let x0 = i as f64 + 0.1 + j as f64 * bw;
                    Some(Rectangle::new([(x0 + bw * 0.06, 0.0), (x0 + bw * 0.94, v)], color.filled()))
                })
                .collect();
            chart.draw_series(bars).map_err(chart_err)?;
            for (i, c) in cats.iter().enumerate() {
                let Some(row) = r.row(m, c) else { continue };
                let xc = i as f64 + 0.1 + (j as f64 + 0.5) * bw;
                let mut label_y = row.speedup_vs_plain.unwrap_or(0.0);
                if let (Some(lo), Some(hi)) = (row.speedup_min, row.speedup_max) {
                    if hi > lo {
                        let cap = bw * 0.2;
                        let (lo, cut) = (lo.min(y_cut), hi > y_cut);
                        let hi = hi.min(y_cut);
                        label_y = label_y.max(hi);
                        if cut {
                            let style = (FONT, 10)
                                .into_font()
                                .color(&BLACK)
                                .pos(Pos::new(HPos::Center, VPos::Bottom));
                            let t = Text::new(
                                format!("↑{:.1}", row.speedup_max.unwrap_or(hi)),
                                (xc, y_max * 0.995),
                                style,
                            );
                            chart.draw_series(std::iter::once(t)).map_err(chart_err)?;
                        }
                        for seg in [
                            vec![(xc, lo), (xc, hi)],
                            vec![(xc - cap, lo), (xc + cap, lo)],
                            vec![(xc - cap, hi), (xc + cap, hi)],
                        ] {
                            chart
                                .draw_series(std::iter::once(PathElement::new(seg, BLACK)))
                                .map_err(chart_err)?;
                        }
                    }
                }
                if let Some(v) = row.speedup_vs_plain {
                    let y = label_y + y_max * 0.01;
                    let style =
                        (FONT, 11).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom));
                    chart
                        .draw_series(std::iter::once(Text::new(format!("{v:.2}"), (xc, y), style)))
                        .map_err(chart_err)?;
                }
            }
        }
        let base = PathElement::new(
            vec![(0.0, 1.0), (cats.len() as f64, 1.0)],
            RGBColor(90, 90, 90).stroke_width(1),
        );
        chart.draw_series(std::iter::once(base)).map_err(chart_err)?;
        // Category names under each group, placed in pixels below the axis.
        for (i, c) in cats.iter().enumerate() {
            let (px, py) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
            let style = (FONT, 13).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Top));
            root.draw(&Text::new(c.clone(), (px, py + 8), style)).map_err(chart_err)?;
        }
        let items: Vec<(String, RGBColor, bool)> =
            methods.iter().map(|m| (m.clone(), method_color(m), true)).collect();
        let foot =
            "bars: ratio of medians; whiskers: slowest and fastest run vs plain's run of the same prompt";
        draw_legend(&root, &items, width, foot)?;
        root.present().map_err(chart_err)?;
    }
    Ok(buf)
}

/// Room on the right of a chart for the legend, in pixels.
const LEGEND_W: u32 = 150;

/// A legend in the right margin (filled boxes or lines) and a footnote along the bottom.
fn draw_legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    items: &[(String, RGBColor, bool)],
    width: u32,
    footnote: &str,
) -> Result<()> {
    let x = width as i32 - LEGEND_W as i32 + 16;
    for (i, (name, color, filled)) in items.iter().enumerate() {
        let y = 60 + 22 * i as i32;
        if *filled {
            root.draw(&Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled())).map_err(chart_err)?;
        } else {
            root.draw(&PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2)))
                .map_err(chart_err)?;
            root.draw(&Circle::new((x + 7, y), 3, color.filled())).map_err(chart_err)?;
        }
        let style = (FONT, 14).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
        root.draw(&Text::new(name.clone(), (x + 22, y), style)).map_err(chart_err)?;
    }
    let (_, h) = root.dim_in_pixel();
    let style = (FONT, 12).into_font().color(&RGBColor(80, 80, 80)).pos(Pos::new(HPos::Left, VPos::Bottom));
    root.draw(&Text::new(footnote.to_string(), (12, h as i32 - 4), style)).map_err(chart_err)?;
    Ok(())
}

/// Depths reached by fewer walks than this get hollow markers.
const FEW_WALKS: u64 = 10;

/// Lines: pooled acceptance rate at each tree depth, one line per method (over all prompts).
pub fn acceptance_svg(r: &Results) -> Result<String> {
    let rows: Vec<&SummaryRow> = r
        .summary
        .iter()
        .filter(|row| row.category == ALL && row.depth_reached.iter().any(|&n| n > 0))
        .collect();
    let depth = rows
        .iter()
        .map(|row| row.depth_reached.iter().rposition(|&n| n > 0).map_or(0, |d| d + 1))
        .max()
        .unwrap_or(0)
        .max(1);
    let mut buf = String::new();
    {
        let width = 820;
        let root = SVGBackend::with_string(&mut buf, (width, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(chart_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Acceptance rate by tree depth (all prompts)", (FONT, 20))
            .margin(12)
            .margin_right(LEGEND_W)
            .margin_bottom(24)
            .x_label_area_size(44)
            .y_label_area_size(56)
            .build_cartesian_2d(0.5f64..depth as f64 + 0.5, 0f64..1.05)
            .map_err(chart_err)?;
        chart
            .configure_mesh()
            .max_light_lines(1)
            .x_labels(depth.min(20) + 1)
            .x_label_formatter(&|v| {
                if (v - v.round()).abs() < 1e-6 && *v >= 1.0 {
                    format!("{}", v.round() as i64)
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|v| format!("{v:.1}"))
            .x_desc("depth")
            .y_desc("accepted ÷ reached")
            .label_style((FONT, 13))
            .draw()
            .map_err(chart_err)?;
        if rows.is_empty() {
            let style = (FONT, 16).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Center));
            chart
                .draw_series(std::iter::once(Text::new(
                    "no drafted tokens (plain or model-free methods only)",
                    ((depth as f64 + 1.0) / 2.0, 0.5),
                    style,
                )))
                .map_err(chart_err)?;
        }
        let mut items = Vec::new();
        for row in rows {
            let color = method_color(&row.method);
            let pts: Vec<(f64, f64, u64)> = row
                .accept_rate_by_depth
                .iter()
                .zip(&row.depth_reached)
                .enumerate()
                .filter(|(_, (_, &n))| n > 0)
                .map(|(d, (&rate, &n))| ((d + 1) as f64, rate, n))
                .collect();
            let line = pts.iter().map(|&(x, y, _)| (x, y));
            chart.draw_series(LineSeries::new(line, color.stroke_width(2))).map_err(chart_err)?;
            // Hollow markers where few walks reached the depth: the rate there is a small sample.
            let marks = pts.iter().map(|&(x, y, n)| {
                let style = if n >= FEW_WALKS { color.filled() } else { color.stroke_width(1) };
                Circle::new((x, y), 4, style)
            });
            chart.draw_series(marks).map_err(chart_err)?;
            items.push((row.method.clone(), color, false));
        }
        let foot = format!(
            "rate = walks accepted at depth d ÷ walks that reached d; hollow: fewer than {FEW_WALKS} walks reached d"
        );
        draw_legend(&root, &items, width, &foot)?;
        root.present().map_err(chart_err)?;
    }
    Ok(buf)
}
