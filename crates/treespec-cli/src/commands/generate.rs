//! `treespec generate`: one prompt, streamed to stdout, statistics to stderr (or one JSON object).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use treespec_core::suffix::HistoryFile;
use treespec_core::TokenId;
use treespec_engine::{
    generate_constrained, ExtraStats, GenerateOutput, GenerateRequest, StopConditions, TextStream,
    TokenBytes, TokenConstraint,
};

use treespec_llama::runtime::Prompt;
use treespec_llama::ModelBytes;

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
    #[command(flatten)]
    pub structured: StructuredArgs,
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
    let method = resolve(&models, &args.method.spec(), args.method.reprofile)?;
    // Where the suffix history is saved after the run, checked now (a missing or read-only
    // directory fails before generating, not after).
    let history_file = match (&args.method.knobs.suffix_history, method.suffix_shared()) {
        (Some(path), Some(_)) => Some(HistoryFile::open(path)?),
        _ => None,
    };
    let prompt = models.prompt_tokens(Prompt::text_or_user(&text, args.chat))?;
    let ctx = models.options().ctx_size;
    if prompt.len() >= ctx {
        bail!("the prompt is {} tokens long but the context holds {ctx} (raise --ctx)", prompt.len());
    }

    let mut target = models.target().new_lm()?;
    let draft = match (method.uses_draft(), models.draft()) {
        (true, Some(d)) => Some(d.new_lm()?),
        _ => None,
    };
    let mut drafter = method.build(draft)?;
    let mut constraint = args.structured.constraint(&models)?;
    let request = GenerateRequest {
        prompt,
        max_new_tokens: args.n,
        sampling,
        seed: args.sampling.seed,
        stop: StopConditions { eos: models.eos_tokens().to_vec(), stop_strings: args.stop.clone() },
    };
    let bytes = SeenBytes { inner: models.token_bytes(), seen: RefCell::default() };
    // The same text stream as the server: whole characters only, stop strings cut and held back.
    let mut stream = TextStream::new(&args.stop);
    let mut full = String::new();
    let json = args.json;
    let grammar = constraint.as_mut().map(|c| c as &mut dyn TokenConstraint);
    let out = generate_constrained(
        &mut target,
        drafter.as_mut(),
        &request,
        grammar,
        Some(&bytes),
        &mut |tokens| {
            for &t in tokens {
                stream.push(&bytes.take(t));
            }
            let ready = stream.take();
            if !json && !ready.is_empty() {
                let mut lock = std::io::stdout().lock();
                let _ = lock.write_all(ready.as_bytes());
                let _ = lock.flush();
            }
            full.push_str(&ready);
            true
        },
    )?;

    if let (Some(file), Some(shared)) = (&history_file, method.suffix_shared()) {
        file.save(&shared.history(), models.tokenizer_id()?)?;
    }
    let rest = stream.finish();
    full.push_str(&rest);
    if json {
        println!("{}", json_result(&full, &out, method.name(), &drafter.extra_stats()));
    } else {
        // Whatever was held back and is still part of the final text.
        print!("{rest}");
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

/// Token bytes that `generate` looked up (it does so for stop strings only), kept for the text
/// stream so that no token is detokenized twice.
struct SeenBytes<'a> {
    inner: ModelBytes<'a>,
    seen: RefCell<VecDeque<(TokenId, Vec<u8>)>>,
}

impl SeenBytes<'_> {
    /// `token`'s bytes: the ones `generate` already looked up, else a fresh lookup.
    fn take(&self, token: TokenId) -> Vec<u8> {
        let mut seen = self.seen.borrow_mut();
        match seen.pop_front() {
            Some((t, b)) if t == token => b,
            _ => {
                seen.clear();
                self.inner.token_bytes(token)
            }
        }
    }
}

impl TokenBytes for SeenBytes<'_> {
    fn token_bytes(&self, token: TokenId) -> Vec<u8> {
        let b = self.inner.token_bytes(token);
        self.seen.borrow_mut().push_back((token, b.clone()));
        b
    }
}
