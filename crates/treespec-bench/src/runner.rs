//! The runner: every method on every prompt, interleaved, on any backend.
//!
//! Order: one warm-up generation per method on the first prompt (not recorded), then for each
//! prompt and each repeat, every method once in the order given, `plain` first (plain, A, B, …,
//! plain, A, B, … for prompt 1, then prompt 2 …), so slow drift of the machine (thermal state,
//! other load) hits all methods alike. At temperature 0 each run's tokens are compared with plain's
//! run of the same prompt and repeat.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use treespec_core::sampling::SamplingParams;
use treespec_core::TokenId;
use treespec_engine::toy::{ToyLm, ToyModel};
use treespec_engine::{
    generate_constrained, CausalLm, Method, Prepared, TokenConstraint, WithoutForcing, METHOD_NAMES,
};
use treespec_grammar::GrammarSpec;
use treespec_request::{prepare, GenerationAsk, RequestPrompt, ToyPromptModel};

use crate::prompts::Prompt;
use crate::record::RunRecord;

/// One run made ready: the target it runs on and the request as the one request preparation
/// made it (prompt tokens, room, stops, drafter, grammar).
pub struct Session<'a> {
    /// The target model (a fresh context, or a reused one: `generate` truncates it first).
    pub target: Box<dyn CausalLm + 'a>,
    /// The request, its drafter (on the backend's draft model when the method runs one) and its
    /// grammar state.
    pub prepared: Prepared<'a>,
}

/// What the runner needs from a model backend (llama.cpp in the CLI, toy models in tests).
pub trait Backend {
    /// Tokens of a prompt, as the backend formats it (chat template or raw).
    fn prompt_tokens(&mut self, prompt: &Prompt) -> Result<Vec<TokenId>>;
    /// The target's context size (prompt + new tokens + draft tree must fit).
    fn context_size(&self) -> usize;
    /// `spec` made ready by treespec-request's `prepare` on the backend's model, the drafter on
    /// its draft model, and the target it runs on. A backend with no vocabulary for grammars
    /// refuses a schema there.
    fn session(&mut self, spec: &GenerationAsk<'_>) -> Result<Session<'_>>;
}

/// Toy models behind the [`Backend`] seam: the harness end to end with no model files. Prompt
/// text maps to tokens byte by byte (modulo the vocabulary), at most `max_prompt` of them.
#[derive(Debug, Clone)]
pub struct ToyBackend {
    target: ToyLm,
    draft: ToyLm,
    max_prompt: usize,
}

impl ToyBackend {
    /// A toy target of `vocab` tokens and `order` context tokens, and a draft whose logits stray
    /// by `noise` from the target's.
    pub fn new(vocab: usize, order: usize, noise: f32, seed: u64, context: usize) -> Self {
        let target = ToyModel::new(vocab, order, seed);
        let draft = target.draft(noise, seed.wrapping_add(1));
        Self { target: ToyLm::new(target, context), draft: ToyLm::new(draft, context), max_prompt: 32 }
    }

    fn model(&self) -> ToyPromptModel {
        ToyPromptModel { vocab: self.target.vocab_size(), has_draft: true, json: false }
    }
}

impl Backend for ToyBackend {
    fn prompt_tokens(&mut self, prompt: &Prompt) -> Result<Vec<TokenId>> {
        let mut tokens = self.model().tokens(&prompt.text);
        tokens.truncate(self.max_prompt);
        Ok(tokens)
    }
    fn context_size(&self) -> usize {
        self.target.context_size()
    }
    fn session(&mut self, spec: &GenerationAsk<'_>) -> Result<Session<'_>> {
        let prepared = prepare(&self.model(), spec, Some(&mut self.draft))?;
        Ok(Session { target: Box::new(&mut self.target), prepared })
    }
}

/// A method to benchmark.
#[derive(Debug, Clone)]
pub struct BenchMethod {
    /// Its name (as in `--methods`).
    pub name: String,
    /// The method and its knobs.
    pub method: Method,
    /// Constrain the output to each prompt's `schema` (structured output). An unconstrained
    /// run of the same prompts is the cost-of-constraints reference.
    pub constrained: bool,
    /// Under a constraint, verify the grammar's forced tokens as free drafts (off: one target
    /// forward per token, strict constrained plain decoding).
    pub forced_drafts: bool,
}

impl BenchMethod {
    /// Wrap a method under its own name.
    pub fn new(method: Method) -> Self {
        Self { name: method.name().to_string(), method, constrained: false, forced_drafts: true }
    }
}

/// Check a `--methods` list: known names, no duplicates, at least one. Returns the names with
/// `plain` first (added when missing: it is the reference for speed-up and identity).
pub fn check_method_names(names: &[String]) -> Result<Vec<String>> {
    let mut out = vec!["plain".to_string()];
    for n in names {
        let n = n.trim();
        if n.is_empty() {
            continue;
        }
        if !METHOD_NAMES.contains(&n) {
            bail!("unknown method '{n}' (one of {})", METHOD_NAMES.join(", "));
        }
        if n != "plain" && out.iter().any(|o| o == n) {
            bail!("method '{n}' is listed twice in --methods");
        }
        if n != "plain" {
            out.push(n.to_string());
        }
    }
    Ok(out)
}

/// How to run the benchmark.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Methods in run order; the first must be `plain`.
    pub methods: Vec<BenchMethod>,
    /// Most new tokens per generation.
    pub max_new_tokens: usize,
    /// Sampling parameters (temperature 0 = greedy, where outputs are checked against plain).
    pub sampling: SamplingParams,
    /// Seed of repeat r is `seed + r`.
    pub seed: u64,
    /// Generations per (method, prompt); summaries take medians.
    pub repeat: usize,
    /// Run each method once on the first prompt before measuring.
    pub warmup: bool,
    /// How to report progress.
    pub progress: ProgressMode,
}

/// Progress reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// A progress bar with ETA when stderr is a terminal, one log line per run otherwise.
    Auto,
    /// One log line per run on stderr.
    Log,
    /// Nothing.
    Quiet,
}

/// What the runner produced.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// One record per measured generation, in run order.
    pub runs: Vec<RunRecord>,
    /// The first method's (plain decoding's) prompt and output tokens per prompt and repeat: what
    /// offline analyses of the text need (how much of each answer any draft could have copied).
    pub plain_texts: Vec<PlainText>,
    /// Wall time of the whole benchmark, warm-up included.
    pub elapsed: Duration,
    /// Wall time of the warm-up.
    pub warmup: Duration,
}

/// One plain-decoding generation's tokens (a line of `plain-tokens.jsonl`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlainText {
    /// Prompt id.
    pub prompt_id: String,
    /// Prompt category.
    pub category: String,
    /// Repeat index (0-based).
    pub repeat: usize,
    /// Prompt tokens (chat-formatted, as the target saw them).
    pub prompt: Vec<TokenId>,
    /// Emitted tokens.
    pub output: Vec<TokenId>,
}

/// Index of the first token where two outputs differ (`None` when identical). When one is a
/// prefix of the other, the shorter length.
pub fn first_divergence(a: &[TokenId], b: &[TokenId]) -> Option<usize> {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => Some(i),
        None if a.len() != b.len() => Some(a.len().min(b.len())),
        None => None,
    }
}

/// A progress bar with an ETA over `total` `unit`s on stderr, when it is a terminal and `mode`
/// is `Auto` (None otherwise: the caller logs lines instead).
pub(crate) fn progress_bar(mode: ProgressMode, total: usize, unit: &str) -> Option<ProgressBar> {
    (mode == ProgressMode::Auto && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
        let template = format!(
            "{{elapsed_precise}} [{{bar:30.cyan/blue}}] {{pos}}/{{len}} {unit}, ETA {{eta}} {{wide_msg}}"
        );
        let style = ProgressStyle::with_template(&template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        b.set_style(style);
        b
    })
}

struct Reporter {
    bar: Option<ProgressBar>,
    log: bool,
    total: usize,
    done: usize,
}

impl Reporter {
    fn new(mode: ProgressMode, total: usize) -> Self {
        let bar = progress_bar(mode, total, "runs");
        let log = match mode {
            ProgressMode::Auto => bar.is_none(),
            ProgressMode::Log => true,
            ProgressMode::Quiet => false,
        };
        Self { bar, log, total, done: 0 }
    }

    fn message(&self, msg: String) {
        if let Some(b) = &self.bar {
            b.set_message(msg);
        }
    }

    fn line(&self, line: String) {
        match &self.bar {
            Some(b) => b.println(line),
            None if self.log => eprintln!("{line}"),
            None => {}
        }
    }

    fn run_done(&mut self, r: &RunRecord) {
        self.done += 1;
        if let Some(b) = &self.bar {
            b.inc(1);
        }
        if self.log {
            let same = match (r.identical_to_plain, r.first_divergence) {
                (Some(true), _) => " | identical to plain".to_string(),
                (Some(false), Some(i)) => format!(" | DIFFERS from plain at token {i}"),
                (Some(false), None) => " | DIFFERS from plain".to_string(),
                (None, _) => String::new(),
            };
            eprintln!(
                "[bench {}/{}] {} prompt {} ({}) repeat {}: {} tokens, {:.1} tok/s, mean accepted {:.2}{}",
                self.done,
                self.total,
                r.method,
                r.prompt_id,
                r.category,
                r.repeat,
                r.new_tokens,
                r.tokens_per_s,
                r.mean_accepted,
                same
            );
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// One generation; returns the tokens and the record (identity fields unset).
fn run_one(
    backend: &mut dyn Backend,
    spec: &BenchMethod,
    prompt: &Prompt,
    tokens: &[TokenId],
    cfg: &RunConfig,
    repeat: usize,
) -> Result<(Vec<TokenId>, RunRecord)> {
    let seed = cfg.seed.wrapping_add(repeat as u64);
    let grammar = prompt.schema.clone().filter(|_| spec.constrained).map(GrammarSpec::JsonSchema);
    let request = GenerationAsk {
        prompt: RequestPrompt::Tokens(tokens),
        method: &spec.method,
        max_new_tokens: Some(cfg.max_new_tokens),
        context: backend.context_size(),
        sampling: cfg.sampling.clone(),
        seed,
        stop: &[],
        grammar: grammar.as_ref(),
        tool_calls: None,
    };
    let mut session = backend.session(&request).with_context(|| format!("preparing prompt {}", prompt.id))?;
    let Prepared { request, drafter, constraint, .. } = &mut session.prepared;
    if !spec.forced_drafts {
        // The grammar's forced tokens verified as ordinary draft rows: the lever's ablation.
        *constraint = constraint.take().map(|c| Box::new(WithoutForcing(c)) as Box<dyn TokenConstraint>);
    }
    let grammar = constraint.as_deref_mut().map(|c| c as &mut dyn TokenConstraint);
    let out =
        generate_constrained(session.target.as_mut(), drafter.as_mut(), request, grammar, None, &mut |_| {
            true
        })?;
    let record = RunRecord::new(
        &spec.name,
        prompt,
        repeat,
        seed,
        tokens.len(),
        out.finish_reason.as_str(),
        &out.stats,
        &drafter.extra_stats(),
    );
    Ok((out.tokens, record))
}

/// Tokenize every prompt first: one that does not fit fails now, not an hour in.
fn tokenize_all(backend: &mut dyn Backend, prompts: &[Prompt], max_new: usize) -> Result<Vec<Vec<TokenId>>> {
    let ctx = backend.context_size();
    let mut tokenized = Vec::with_capacity(prompts.len());
    for p in prompts {
        let t = backend
            .prompt_tokens(p)
            .with_context(|| format!("tokenizing prompt {} ({})", p.id, p.category))?;
        if t.is_empty() {
            bail!("prompt {} ({}) has no tokens", p.id, p.category);
        }
        if t.len() + max_new >= ctx {
            bail!(
                "prompt {} ({}) is {} tokens; with -n {max_new} it does not fit the context of {ctx} (raise --ctx, \
                 lower -n, or leave the prompt out)",
                p.id,
                p.category,
                t.len(),
            );
        }
        tokenized.push(t);
    }
    Ok(tokenized)
}

/// Run the benchmark: every method of `cfg` on every prompt, `cfg.repeat` times, interleaved.
pub fn run_bench(backend: &mut dyn Backend, prompts: &[Prompt], cfg: &RunConfig) -> Result<RunOutput> {
    let start = Instant::now();
    if cfg.methods.first().map(|m| m.name.as_str()) != Some("plain") {
        bail!("the first method must be plain (the reference for speed-up and identity)");
    }
    if prompts.is_empty() {
        bail!("no prompts to run");
    }
    if cfg.max_new_tokens == 0 {
        bail!("the number of new tokens (-n) must be at least 1");
    }
    if cfg.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    let tokenized = tokenize_all(backend, prompts, cfg.max_new_tokens)?;

    let measured = cfg.methods.len() * prompts.len() * cfg.repeat;
    let warm = if cfg.warmup { cfg.methods.len() } else { 0 };
    let mut rep = Reporter::new(cfg.progress, measured);

    let t = Instant::now();
    if cfg.warmup {
        rep.message("warm-up".into());
        rep.line(format!("[bench] warm-up: {warm} generations on prompt {}", prompts[0].id));
        for spec in &cfg.methods {
            run_one(backend, spec, &prompts[0], &tokenized[0], cfg, 0)
                .with_context(|| format!("warm-up run of {} on prompt {}", spec.name, prompts[0].id))?;
        }
    }
    let warmup = t.elapsed();

    let greedy = cfg.sampling.temperature == 0.0;
    let mut runs = Vec::with_capacity(measured);
    let mut plain_texts = Vec::with_capacity(prompts.len() * cfg.repeat);
    for (p, tokens) in prompts.iter().zip(&tokenized) {
        for r in 0..cfg.repeat {
            let mut plain: Option<Vec<TokenId>> = None;
            for (m, spec) in cfg.methods.iter().enumerate() {
                rep.message(format!("{} on prompt {} ({})", spec.name, p.id, p.category));
                let (out, mut record) = run_one(backend, spec, p, tokens, cfg, r).with_context(|| {
                    format!("{} on prompt {} ({}), repeat {r}", spec.name, p.id, p.category)
                })?;
                if m == 0 {
                    plain_texts.push(PlainText {
                        prompt_id: p.id.clone(),
                        category: p.category.clone(),
                        repeat: r,
                        prompt: tokens.clone(),
                        output: out.clone(),
                    });
                }
                // An unconstrained reference row is not expected to match constrained plain.
                let comparable = spec.constrained == cfg.methods[0].constrained;
                if greedy && comparable {
                    match &plain {
                        None => {
                            record.identical_to_plain = Some(true);
                            plain = Some(out);
                        }
                        Some(reference) => {
                            let d = first_divergence(reference, &out);
                            record.identical_to_plain = Some(d.is_none());
                            record.first_divergence = d;
                            if let Some(i) = d {
                                rep.line(format!(
                                    "[bench] warning: {} differs from plain on prompt {} (repeat {r}) at token {i}",
                                    spec.name, p.id
                                ));
                            }
                        }
                    }
                }
                rep.run_done(&record);
                runs.push(record);
            }
        }
    }
    rep.finish();
    Ok(RunOutput { runs, plain_texts, elapsed: start.elapsed(), warmup })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divergence_index() {
        assert_eq!(first_divergence(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(first_divergence(&[1, 2, 3], &[1, 5, 3]), Some(1));
        assert_eq!(first_divergence(&[1, 2], &[1, 2, 3]), Some(2));
    }

    #[test]
    fn method_names_are_checked_and_plain_goes_first() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            check_method_names(&v(&["chain", "plain", "lookup"])).unwrap(),
            ["plain", "chain", "lookup"]
        );
        assert_eq!(check_method_names(&v(&["lookup"])).unwrap(), ["plain", "lookup"]);
        let e = check_method_names(&v(&["chain", "nope"])).unwrap_err().to_string();
        assert!(e.contains("unknown method 'nope'"), "{e}");
        assert!(check_method_names(&v(&["chain", "chain"])).is_err());
    }
}
