//! `treespec generate`: one prompt, streamed to stdout, statistics to stderr (or one JSON object).
//!
//! **Learned prices.** A method that drafts from suffix matches (`suffix`, `auto`) starts from
//! the prices the earlier runs learned rather than from the prior (the calibration shipped in
//! the binary, `SuffixPricing::new`), and leaves what this run learned for the next
//! (a `SuffixStore`, [`open_store`]): read from the file beside `--suffix-history` when
//! that has prices, else from the learned-prices cache `<cache>/prices/<tokenizer>.json` (the
//! cost curves' cache folder: `$TREESPEC_CACHE_DIR`, else `$XDG_CACHE_HOME/treespec`, else
//! `~/.cache/treespec`; one file per tokenizer fingerprint and vocabulary size); written back to
//! both after the run, atomically. `--no-learned-prices` (or `TREESPEC_NO_LEARNED_PRICES=1`)
//! reads and writes no prices at all. A cache file that cannot be read or written is a warning
//! (the run starts from the prior); prices beside `--suffix-history` are the history's, so a
//! broken one is an error, as a broken history is.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use treespec_core::sampling::SamplingParams;
use treespec_core::suffix::DEFAULT_CAP_TOKENS;
use treespec_engine::drafters::{DecisionTrace, HistoryFile, StorePlaces, StoreSave, SuffixStore};
use treespec_engine::{
    generate_constrained, CausalLm, Drafter, ExtraStats, GenerateOutput, Method, MethodSpec, Prepared,
    TokenConstraint,
};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use treespec_llama::runtime::default_cache_dir;
use treespec_llama::{LlamaLm, ModelRuntime, PrefillProgress};
use treespec_request::{prepare, GenerationAsk, PrepareError, Prompt, RequestPrompt};

use super::args::{MethodArgs, ModelArgs, SamplingArgs};
use super::models::{load_runtime, resolve_with_suffix};
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
    /// Most new tokens; -1 (llama.cpp's "infinite") or -2 ("until the context is full"): until
    /// the end of generation or of the context.
    #[arg(
        short = 'n',
        long = "n-predict",
        alias = "predict",
        default_value_t = 256,
        allow_negative_numbers = true
    )]
    pub n: i64,
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
    let text = prompt_text(&args)?;
    let most_new = most_new_tokens(&args)?;
    let sampling = args.sampling.params()?;
    let models = load_runtime(&args.models)?;
    let mut spec = args.method.spec();
    let mut store = open_store(&mut spec, &models, args.no_learned_prices)?;
    let suffix = store.as_ref().map(|s| s.shared().clone());
    let mut method = resolve_with_suffix(&models, &spec, args.method.reprofile, suffix)?;
    attach_trace(&mut method, args.decision_trace.as_deref())?;
    let loaded = store.as_ref().and_then(|s| s.loaded().cloned());
    if let (Some((path, trials)), false) = (&loaded, args.json) {
        eprintln!("learned prices: loaded {trials} trials from {}", path.display());
    }
    let mut target = models.target().new_lm()?;
    if let Some(buckets) = models.shape_padding() {
        target.pad_shapes(Some(&buckets));
    }
    let mut draft = match (method.uses_draft(), models.draft()) {
        (true, Some(d)) => Some(d.new_lm()?),
        _ => None,
    };
    let mut prepared = prepare_request(&args, &text, &models, &method, sampling, draft.as_mut())?;
    // `-n` is a most, not a demand: a prompt that leaves less room stops at the context's end.
    prepared.request.max_new_tokens = most_new;
    let prompt_tokens = prepared.request.prompt.len();
    target.set_prefill_progress(prefill_bar(prompt_tokens));
    let out = stream_answer(&mut target, &mut prepared, &models, args.json)?;
    let ran = Ran { method: &method, out: &out, prompt_tokens, drafter: prepared.drafter.as_ref() };
    finish(&args, store.as_mut(), loaded.as_ref(), ran)
}

/// `-n` as a number of tokens: -1 or -2 (llama.cpp's "until the end") is the context's size,
/// which stops it first.
fn most_new_tokens(args: &GenerateArgs) -> Result<usize> {
    match args.n {
        -2 | -1 => Ok(args.models.runtime.ctx),
        n if n >= 1 => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        n => bail!("-n must be at least 1, or -1 (until the end of generation or of the context), got {n}"),
    }
}

/// What a run produced, for [`finish`].
struct Ran<'a> {
    method: &'a Method,
    out: &'a GenerateOutput,
    /// The prompt's length as the target read it.
    prompt_tokens: usize,
    drafter: &'a dyn Drafter,
}

/// The prompt: `-p TEXT`, or the file `-f FILE` names.
fn prompt_text(args: &GenerateArgs) -> Result<String> {
    match (&args.prompt, &args.file) {
        (Some(p), _) => Ok(p.clone()),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("reading prompt file {}", f.display()))
        }
        (None, None) => bail!("give a prompt with -p TEXT or -f FILE"),
    }
}

/// The request made ready on the loaded models (its tokens, grammar, drafter on `draft`, stops);
/// a prompt too long for the context says which flag to raise.
fn prepare_request<'d>(
    args: &GenerateArgs,
    text: &str,
    models: &ModelRuntime,
    method: &Method,
    sampling: SamplingParams,
    draft: Option<&'d mut LlamaLm<'_>>,
) -> Result<Prepared<'d>> {
    let grammar = args.structured.spec()?;
    let spec = GenerationAsk {
        prompt: RequestPrompt::Formatted(Prompt::text_or_user(text, args.chat)),
        method,
        max_new_tokens: None,
        context: models.options().ctx_size,
        sampling,
        seed: args.sampling.seed(),
        stop: &args.stop,
        grammar: grammar.as_ref(),
        tool_calls: None,
    };
    prepare(models, &spec, draft).map_err(|e| match e {
        PrepareError::PromptTooLong { .. } => anyhow::anyhow!("{e} (raise --ctx)"),
        PrepareError::Grammar(g) => anyhow::Error::new(g).context("compiling the output grammar"),
        e => e.into(),
    })
}

/// Decode the request, its text streamed to stdout as it comes (with `--json`, nothing until
/// the end).
fn stream_answer(
    target: &mut LlamaLm<'_>,
    prepared: &mut Prepared<'_>,
    models: &ModelRuntime,
    json: bool,
) -> Result<GenerateOutput> {
    let bytes = models.token_bytes();
    let grammar = prepared.constraint.as_deref_mut().map(|c| c as &mut dyn TokenConstraint);
    let out = generate_constrained(
        target,
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
    Ok(out)
}

/// The run's end: the suffix state saved for the next run, then one JSON object (`--json`) or
/// the rest of the text and the statistics line on stderr.
fn finish(
    args: &GenerateArgs,
    mut store: Option<&mut SuffixStore>,
    loaded: Option<&(PathBuf, u64)>,
    ran: Ran<'_>,
) -> Result<()> {
    let Ran { method, out, prompt_tokens, drafter } = ran;
    let saved = match store.as_mut() {
        Some(store) => store.save_changed()?,
        None => None,
    };
    for warning in saved.iter().flat_map(|s| &s.warnings) {
        eprintln!("treespec: warning: {warning}");
    }
    if args.json {
        let mut result = json_result(&out.text, out, prompt_tokens, method.name(), &drafter.extra_stats());
        result["learned_prices"] = match &store {
            Some(store) if !args.no_learned_prices => prices_json(store, loaded, saved.as_ref()),
            _ => serde_json::Value::Null,
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

/// The suffix state a suffix method drafts from, kept between runs (see the module docs): the
/// file `--suffix-history` names (the store's, taken from the method's knobs) and the
/// learned-prices cache. None for a method without suffix state, or when nothing would be kept.
fn open_store(spec: &mut MethodSpec, models: &ModelRuntime, no_prices: bool) -> Result<Option<SuffixStore>> {
    if !spec.method.keeps_suffix_state() || (no_prices && spec.knobs.suffix_history.is_none()) {
        return Ok(None);
    }
    // Checked now: a missing or read-only directory fails before generating, not after.
    let history = spec.knobs.suffix_history.take().map(HistoryFile::open).transpose()?;
    let tokenizer = models.tokenizer_id()?;
    let cache = match default_cache_dir().filter(|_| !no_prices) {
        Some(dir) => {
            match SuffixStore::cache_file(&dir.join("prices"), tokenizer) {
                Ok(f) => Some(f),
                Err(e) => {
                    eprintln!("treespec: warning: the learned-prices cache: {e:#}; what this run learns is not kept");
                    None
                }
            }
        }
        None => None,
    };
    let places = StorePlaces { history, cache, prices: !no_prices };
    let cap = spec.knobs.suffix_cap.unwrap_or(DEFAULT_CAP_TOKENS);
    let mut store = SuffixStore::open(places, tokenizer, cap)?;
    for warning in store.take_warnings() {
        eprintln!("treespec: warning: {warning}");
    }
    Ok(Some(store))
}

/// `--json`'s `learned_prices`: where they came from and went to.
fn prices_json(
    store: &SuffixStore,
    loaded: Option<&(PathBuf, u64)>,
    saved: Option<&StoreSave>,
) -> serde_json::Value {
    let saved_to: Vec<String> =
        saved.iter().flat_map(|s| &s.prices).map(|p| p.display().to_string()).collect();
    json!({
        "loaded_from": loaded.map(|(p, _)| p.display().to_string()),
        "loaded_trials": loaded.map_or(0, |(_, n)| *n),
        "trials": store.shared().pricing().total_trials(),
        "saved_to": saved_to,
    })
}

/// `--json`: the text, the tokens and the statistics as one object. `prompt_tokens` is the
/// prompt's length as the target read it (chat-formatted with `--chat`): what a side-by-side run
/// checks llama.cpp's tools read as well.
fn json_result(
    text: &str,
    out: &GenerateOutput,
    prompt_tokens: usize,
    method: &str,
    extra: &ExtraStats,
) -> serde_json::Value {
    let s = &out.stats;
    json!({
        "text": text,
        "token_ids": out.tokens,
        "finish_reason": out.finish_reason.as_str(),
        "method": method,
        "stats": {
            "prompt_tokens": prompt_tokens,
            "new_tokens": s.new_tokens,
            "target_forwards": s.target_forwards,
            "graph_reuses": s.graph_reuses,
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
