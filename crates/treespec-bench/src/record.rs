//! The result set's schema: what `results.json` holds (runs, settings, summary rows).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use treespec_core::stats::DecodeStats;
use treespec_engine::ExtraStats;

use crate::machine::MachineInfo;
use crate::prompts::Prompt;

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
    /// Of them, forwards that reused the graph of the forward before (0 in results recorded
    /// before it was counted).
    #[serde(default)]
    pub graph_reuses: u64,
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
            graph_reuses: s.graph_reuses,
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
        first_seen(self.summary.iter().map(|r| &r.method))
    }

    /// "all" then the categories in run order.
    pub fn categories(&self) -> Vec<String> {
        let mut out = vec![ALL.to_string()];
        out.extend(run_categories(&self.runs));
        out
    }
}

/// The category name of the rows over all prompts.
pub const ALL: &str = "all";

/// One row of the summary: a method in a category (or [`ALL`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryRow {
    /// Method name.
    pub method: String,
    /// Category, or "all".
    pub category: String,
    /// Distinct prompts aggregated.
    pub n_prompts: usize,
    /// Runs aggregated (prompts × repeats).
    pub n_runs: usize,
    /// Median decoding speed over the runs.
    pub tokens_per_s: f64,
    /// Slowest run.
    pub tokens_per_s_min: f64,
    /// Fastest run.
    pub tokens_per_s_max: f64,
    /// Median tokens/s of plain over the same prompts and repeats.
    pub plain_tokens_per_s: f64,
    /// `tokens_per_s / plain_tokens_per_s` (null when plain's median is 0).
    pub speedup_vs_plain: Option<f64>,
    /// Smallest paired per-run ratio (method run ÷ plain's run of the same prompt and repeat).
    pub speedup_min: Option<f64>,
    /// Largest paired per-run ratio.
    pub speedup_max: Option<f64>,
    /// Pooled emitted tokens per target forward (bonus included).
    pub mean_accepted: f64,
    /// Pooled acceptance rate at depth 1, 2, …
    pub accept_rate_by_depth: Vec<f64>,
    /// Walks that reached depth 1, 2, … (the sample size behind each rate).
    pub depth_reached: Vec<u64>,
    /// Drafting milliseconds per decode step.
    pub draft_ms_per_step: f64,
    /// Target forward + verification walk milliseconds per decode step.
    pub verify_ms_per_step: f64,
    /// Target forward milliseconds per decode step.
    pub target_forward_ms_per_step: f64,
    /// New tokens over all runs.
    pub new_tokens: u64,
    /// Target forwards over all runs.
    pub target_forwards: u64,
    /// Of them, forwards that reused the graph of the forward before.
    #[serde(default)]
    pub graph_reuses: u64,
    /// Draft forwards over all runs.
    pub draft_forwards: u64,
    /// Runs identical to plain (temperature 0), else null.
    pub identical_runs: Option<usize>,
}

/// Categories in order of first appearance in the runs.
pub fn run_categories(runs: &[RunRecord]) -> Vec<String> {
    first_seen(runs.iter().map(|r| &r.category))
}

/// Methods in order of first appearance in the runs.
pub fn run_methods(runs: &[RunRecord]) -> Vec<String> {
    first_seen(runs.iter().map(|r| &r.method))
}

/// The distinct names, in order of first appearance.
fn first_seen<'a>(names: impl Iterator<Item = &'a String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in names {
        if !out.contains(n) {
            out.push(n.clone());
        }
    }
    out
}
