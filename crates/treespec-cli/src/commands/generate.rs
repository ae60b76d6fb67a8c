//! `treespec generate`: one prompt, streamed to stdout, statistics to stderr (or one JSON object).
//!
//! **Learned prices.** A method that drafts from suffix matches (`suffix`, `auto`) starts from
//! the prices the earlier runs learned rather than from the prior (the calibration shipped in
//! the binary, `SuffixPricing::new`), and leaves what this run learned for the next
//! ([`LearnedPrices`]): read from the file beside `--suffix-history` when
//! that has prices, else from the learned-prices cache `<cache>/prices/<tokenizer>.json` (the
//! cost curves' cache folder: `$TREESPEC_CACHE_DIR`, else `$XDG_CACHE_HOME/treespec`, else
//! `~/.cache/treespec`; one file per tokenizer fingerprint and vocabulary size); written back to
//! both after the run, atomically. `--no-learned-prices` (or `TREESPEC_NO_LEARNED_PRICES=1`)
//! reads and writes no prices at all. A cache file that cannot be read or written is a warning
//! (the run starts from the prior); prices beside `--suffix-history` are the history's, so a
//! broken one is an error, as a broken history is.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use treespec_core::ngram::TokenizerId;
use treespec_core::suffix::history_file::PricesFile;
use treespec_core::suffix::{HistoryFile, SuffixPricing};
use treespec_engine::drafters::{DecisionTrace, SuffixShared};
use treespec_engine::{generate_constrained, ExtraStats, GenerateOutput, Method, TokenConstraint};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use treespec_llama::runtime::{default_cache_dir, PrepareError, Prompt, RequestPrompt, RequestSpec};
use treespec_llama::{ModelRuntime, PrefillProgress};

use super::args::{MethodArgs, ModelArgs, SamplingArgs};
use super::models::{load_runtime, resolve};
use super::structured::StructuredArgs;

/// Options of `treespec generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub models: ModelArgs,
    #[command(flatten)]
    pub method: MethodArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Prompt text.
    #[arg(short = 'p', long, conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Format the prompt as a user turn with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Most new tokens.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    pub n: usize,
    /// Stop when this string appears (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Start the suffix drafter's prices from the shipped prior and keep nothing it learns:
    /// neither the learned-prices cache nor the prices beside `--suffix-history` are read or
    /// written.
    #[arg(
        long,
        env = "TREESPEC_NO_LEARNED_PRICES",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub no_learned_prices: bool,
    /// `--method auto`: write one JSON line per step to FILE — each policy's offer, what the
    /// curve and the prices predicted, how the measured books corrected it, the choice and what
    /// the step really brought (docs/METHODS.md, "The decision trace").
    #[arg(long, value_name = "FILE")]
    pub decision_trace: Option<PathBuf>,
    #[command(flatten)]
    pub structured: StructuredArgs,
}

/// `--decision-trace FILE` on an `auto` method; refused on any other (nothing would be traced).
fn attach_trace(method: &mut Method, path: Option<&Path>) -> Result<()> {
    let Some(path) = path else { return Ok(()) };
    match method {
        Method::Auto(config) => {
            config.trace = Some(DecisionTrace::to_file(path)?);
            Ok(())
        }
        other => bail!("--decision-trace traces `auto`'s decisions; --method {} makes none", other.name()),
    }
}

/// Run `generate`.
pub fn run(args: GenerateArgs) -> Result<()> {
    let text = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("reading prompt file {}", f.display()))?
        }
        (None, None) => bail!("give a prompt with -p TEXT or -f FILE"),
    };
    if args.n == 0 {
        bail!("-n must be at least 1");
    }
    let sampling = args.sampling.params()?;
    let models = load_runtime(&args.models)?;
    let mut method = resolve(&models, &args.method.spec(), args.method.reprofile)?;
    attach_trace(&mut method, args.decision_trace.as_deref())?;
    // Where the suffix history is saved after the run, checked now (a missing or read-only
    // directory fails before generating, not after).
    let history_file = match (&args.method.knobs.suffix_history, method.suffix_shared()) {
        (Some(path), Some(_)) => Some(HistoryFile::open(path)?),
        _ => None,
    };
    let prices = match method.suffix_shared() {
        Some(shared) if !args.no_learned_prices => {
            Some(LearnedPrices::start(shared, history_file.as_ref(), &models)?)
        }
        _ => None,
    };
    if let (Some((path, trials)), false) = (prices.as_ref().and_then(|p| p.loaded.as_ref()), args.json) {
        eprintln!("learned prices: loaded {trials} trials from {}", path.display());
    }
    let mut target = models.target().new_lm()?;
    let mut draft = match (method.uses_draft(), models.draft()) {
        (true, Some(d)) => Some(d.new_lm()?),
        _ => None,
    };
    let grammar = args.structured.spec()?;
    let spec = RequestSpec {
        prompt: RequestPrompt::Formatted(Prompt::text_or_user(&text, args.chat)),
        method: &method,
        max_new_tokens: None,
        context: models.options().ctx_size,
        sampling,
        seed: args.sampling.seed,
        stop: &args.stop,
        grammar: grammar.as_ref(),
        tool_calls: None,
    };
    let mut prepared = models.prepare(&spec, draft.as_mut()).map_err(|e| match e {
        PrepareError::PromptTooLong { .. } => anyhow::anyhow!("{e} (raise --ctx)"),
        PrepareError::Grammar(g) => anyhow::Error::new(g).context("compiling the output grammar"),
        e => e.into(),
    })?;
    // `-n` is a most, not a demand: a prompt that leaves less room stops at the context's end.
    prepared.request.max_new_tokens = args.n;
    target.set_prefill_progress(prefill_bar(prepared.request.prompt.len()));
    let bytes = models.token_bytes();
    let json = args.json;
    let grammar = prepared.constraint.as_deref_mut().map(|c| c as &mut dyn TokenConstraint);
    let out = generate_constrained(
        &mut target,
        prepared.drafter.as_mut(),
        &prepared.request,
        grammar,
        Some(&bytes),
        &mut |step| {
            let ready = step.text();
            if !json && !ready.is_empty() {
                let mut lock = std::io::stdout().lock();
                let _ = lock.write_all(ready.as_bytes());
                let _ = lock.flush();
            }
            true
        },
    )?;
    let drafter = prepared.drafter;

    let saved_prices = match &prices {
        Some(p) => p.finish(history_file.as_ref())?,
        None => {
            if let (Some(file), Some(shared)) = (&history_file, method.suffix_shared()) {
                file.save(&shared.history(), models.tokenizer_id()?)?;
            }
            Vec::new()
        }
    };
    if json {
        let mut result = json_result(&out.text, &out, method.name(), &drafter.extra_stats());
        result["learned_prices"] = match &prices {
            Some(p) => p.json(&saved_prices),
            None => serde_json::Value::Null,
        };
        println!("{result}");
    } else {
        // Whatever was held back and is still part of the final text.
        print!("{}", out.tail);
        println!();
        eprintln!(
            "[{}] finish: {} | {}",
            method.name(),
            out.finish_reason.as_str(),
            out.stats.summary_line()
        );
    }
    Ok(())
}

/// Prompts at least this long show a progress bar while the target reads them (seconds on a
/// small CPU).
const PREFILL_BAR_TOKENS: usize = 1024;

/// A progress bar on a terminal's stderr while the target reads a long prompt, with an ETA.
fn prefill_bar(prompt: usize) -> Option<PrefillProgress> {
    if prompt < PREFILL_BAR_TOKENS || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::with_draw_target(Some(prompt as u64), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "[treespec] reading the prompt, {pos}/{len} tokens, ~{eta} left {wide_bar}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    Some(Box::new(move |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        if done >= total {
            bar.finish_and_clear();
        }
    }))
}

/// The suffix drafter's learned prices over one run (see the module docs).
struct LearnedPrices {
    shared: Arc<SuffixShared>,
    tokenizer: TokenizerId,
    /// The cache file, when there is a cache folder that can hold it.
    cache: Option<PricesFile>,
    /// Where the prices were loaded from, with the trials they had recorded.
    loaded: Option<(PathBuf, u64)>,
    /// Trials recorded when the run started.
    start_trials: u64,
}

impl LearnedPrices {
    /// Load the prices into `shared`: from beside `history` when that has prices, else from the
    /// cache, else the prior.
    fn start(
        shared: &Arc<SuffixShared>,
        history: Option<&HistoryFile>,
        models: &ModelRuntime,
    ) -> Result<Self> {
        let tokenizer = models.tokenizer_id()?;
        let cache = match default_cache_dir() {
            Some(dir) => match Self::cache_file(&dir.join("prices"), tokenizer) {
                Ok(f) => Some(f),
                Err(e) => {
                    eprintln!("treespec: warning: the learned-prices cache: {e:#}; what this run learns is not kept");
                    None
                }
            },
            None => None,
        };
        let mut loaded = None;
        let mut pricing = None;
        if let Some(file) = history {
            pricing = file.load_pricing(tokenizer)?;
            loaded = pricing.as_ref().map(|p| (file.prices_path(), p.total_trials()));
        }
        if let (None, Some(c)) = (&pricing, &cache) {
            match c.load(tokenizer) {
                Ok(p) => {
                    loaded = p.as_ref().map(|p| (c.path().to_path_buf(), p.total_trials()));
                    pricing = p;
                }
                Err(e) => eprintln!("treespec: warning: ignoring {e}; starting from the prior"),
            }
        }
        let pricing = pricing.unwrap_or_else(SuffixPricing::new);
        let start_trials = pricing.total_trials();
        shared.set_pricing(pricing);
        Ok(Self { shared: shared.clone(), tokenizer, cache, loaded, start_trials })
    }

    /// `<dir>/<fingerprint>-<vocabulary>.json`, the folder made if missing.
    fn cache_file(dir: &std::path::Path, tokenizer: TokenizerId) -> Result<PricesFile> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let name = format!("{:016x}-{}.json", tokenizer.fingerprint, tokenizer.vocab);
        Ok(PricesFile::open(dir.join(name))?)
    }

    /// Save the history (when there is a file for it) with the prices, and the prices to the
    /// cache when this run learned anything; returns the prices files written.
    fn finish(&self, history: Option<&HistoryFile>) -> Result<Vec<PathBuf>> {
        let pricing = self.shared.pricing_snapshot();
        let mut saved = Vec::new();
        if let Some(file) = history {
            file.save_with_pricing(&self.shared.history(), &pricing, self.tokenizer)?;
            saved.push(file.prices_path());
        }
        if let (Some(cache), true) = (&self.cache, pricing.total_trials() != self.start_trials) {
            match cache.save(&pricing, self.tokenizer) {
                Ok(()) => saved.push(cache.path().to_path_buf()),
                Err(e) => eprintln!("treespec: warning: {e}; what this run learned is not kept"),
            }
        }
        Ok(saved)
    }

    /// `--json`'s `learned_prices`: where they came from and went to.
    fn json(&self, saved: &[PathBuf]) -> serde_json::Value {
        json!({
            "loaded_from": self.loaded.as_ref().map(|(p, _)| p.display().to_string()),
            "loaded_trials": self.loaded.as_ref().map_or(0, |(_, n)| *n),
            "trials": self.shared.pricing().total_trials(),
            "saved_to": saved.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        })
    }
}

/// `--json`: the text, the tokens and the statistics as one object.
fn json_result(text: &str, out: &GenerateOutput, method: &str, extra: &ExtraStats) -> serde_json::Value {
    let s = &out.stats;
    json!({
        "text": text,
        "token_ids": out.tokens,
        "finish_reason": out.finish_reason.as_str(),
        "method": method,
        "stats": {
            "new_tokens": s.new_tokens,
            "target_forwards": s.target_forwards,
            "draft_forwards": s.draft_forwards,
            "drafted": s.drafted,
            "forced": s.forced,
            "accepted": s.accepted,
            "mean_accepted": s.mean_accepted(),
            "accept_rate_by_depth": s.depth_rates(),
            "wall_s": s.wall.as_secs_f64(),
            "tokens_per_s": s.tokens_per_s(),
            "draft_s": s.times.draft.as_secs_f64(),
            "target_s": s.times.target.as_secs_f64(),
            "verify_s": s.times.verify.as_secs_f64(),
            "prefill_s": s.times.prefill.as_secs_f64(),
            "extra": extra,
        }
    })
}
