//! `treespec bench`: every method on a prompt set, interleaved, with medians, identity checks
//! against plain decoding, and a report (results.json, summary.md, speedup.svg, acceptance.svg).
//! The harness itself lives in the `treespec-bench` crate; this file maps arguments onto it and
//! puts the llama.cpp models behind its `Backend` seam.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

mod llama_backend;
mod sessions;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde_json::json;
use treespec_bench::{
    check_method_names, compare_text, load_average, load_prompts, run_bench, select, summarize, write_all,
    BenchConfig, BenchMethod, MachineInfo, MethodConfig, ModelFile, ProgressMode, Prompt, Results, RunConfig,
    RunOutput, SamplingConfig, Selection, ToyBackend, SCHEMA,
};
use treespec_core::sampling::SamplingParams;
use treespec_engine::registry::{FixedContext, MethodContext};
use treespec_engine::toy::toy_costs;
use treespec_engine::{MethodKind, MethodSpec, METHOD_NAMES};

use super::args::{MethodArgs, ModelArgs, RuntimeArgs, SamplingArgs};
use super::models::load_runtime;
use llama_backend::{dump_prompts, LlamaBackend};
use treespec_bench::runner::PlainText;
use treespec_llama::ModelRuntime;

/// The prompt set used when `--prompts` is not given (relative to the repository root).
pub const DEFAULT_PROMPTS: &str = "../shared/data/spec-bench/question.jsonl";
/// The `--quick` model (target and draft).
pub const QUICK_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The `--quick` methods.
const QUICK_METHODS: &[&str] = &["plain", "chain", "lookup"];
/// The `--quick` prompts: one from each Spec-Bench task (MT-Bench represented by `writing`).
const QUICK_CATEGORIES: &[&str] = &["writing", "translation", "summarization", "qa", "math_reasoning", "rag"];
/// The `--quick` generation length.
const QUICK_N: usize = 64;
/// Generation length otherwise.
const DEFAULT_N: usize = 128;

/// Options of `treespec bench`.
#[derive(Debug, Args)]
#[command(mut_arg("method", |a| a.hide(true)))]
pub struct BenchArgs {
    /// Target model (GGUF). Not needed with --quick, --toy or --compare.
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub method: MethodArgs,
    /// Methods to compare, comma-separated (plain is always run, first, as the reference). Default:
    /// with --quick plain,chain,lookup; with a draft model every method but tree (and sequoia unless
    /// --acceptance/--calibration is given); without one plain,lookup. The method knobs
    /// (--draft-max, --budget, --depth, …) apply to every method listed.
    #[arg(long, value_delimiter = ',')]
    pub methods: Option<Vec<String>>,
    /// Prompt file: JSON lines with question_id, category, turns (Spec-Bench / MT-Bench; the first
    /// turn is used) or plain {"prompt": ...} lines. Default: ../shared/data/spec-bench/question.jsonl.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Only these categories (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub categories: Option<Vec<String>>,
    /// At most N prompts in all, taken round-robin over the categories.
    #[arg(long)]
    pub limit: Option<usize>,
    /// At most N prompts per category.
    #[arg(long = "per-category")]
    pub per_category: Option<usize>,
    /// Most new tokens per generation [default: 128; 64 with --quick].
    #[arg(short = 'n', long = "n-predict")]
    pub n: Option<usize>,
    /// Generations per (method, prompt); summaries take medians.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Skip the warm-up pass (one generation per method before measuring).
    #[arg(long = "no-warmup")]
    pub no_warmup: bool,
    /// Tokenize prompts as raw text instead of a user turn of the model's chat template.
    #[arg(long = "no-chat")]
    pub no_chat: bool,
    /// Output directory [default: bench-out/latest; bench-out/quick with --quick].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Small default run: SmolLM2-135M as target and draft, plain/chain/lookup, 6 prompts, -n 64.
    #[arg(long)]
    pub quick: bool,
    /// Toy models instead of GGUF files: the harness end to end without model files.
    #[arg(long, conflicts_with_all = ["model", "draft"])]
    pub toy: bool,
    /// One log line per run even on a terminal (instead of the progress bar).
    #[arg(long)]
    pub log: bool,
    /// Write the selected prompts, chat-formatted exactly as the benchmark feeds them (special
    /// tokens spelled out), as JSON lines {id, category, text} to FILE, then exit: the input of
    /// `scripts/peer-bench.sh run`, which runs llama.cpp's own tools on the same prompts.
    #[arg(long = "dump-prompts", value_name = "FILE")]
    pub dump_prompts: Option<PathBuf>,
    /// Structured output: constrain every method to each prompt's `schema` (prompt files with a
    /// `schema` field, e.g. `scripts/structured-set.sh`). `plain` is then strict constrained plain
    /// decoding (one forward per token); `plain+forced` (forced tokens as free drafts) and
    /// `plain-free` (no constraint, what the constraints cost) are added.
    #[arg(long)]
    pub structured: bool,
    /// Sessions instead of prompts: play the multi-turn sessions of these files (JSON lines,
    /// e.g. bench/inputs/sessions/*.jsonl) against running servers (--server), every answer generated
    /// live and fed back. --categories then names workloads, --per-category and --limit count
    /// sessions, --repeat plays each again.
    #[arg(long, value_delimiter = ',', value_name = "FILE", requires = "servers")]
    pub sessions: Option<Vec<PathBuf>>,
    /// With --sessions: a server to play them on, NAME=URL (repeat the flag; NAME as
    /// family:config, e.g. treespec:auto=http://127.0.0.1:8080; a family's `:plain` server is
    /// what its other configurations are divided by).
    #[arg(long = "server", value_name = "NAME=URL", requires = "sessions")]
    pub servers: Vec<String>,
    /// With --sessions: the server whose whole-session speed the others are divided by
    /// [default: the first].
    #[arg(long, requires = "sessions")]
    pub baseline: Option<String>,
    /// With --sessions: sessions played at once on a server.
    #[arg(long, default_value_t = 1, requires = "sessions")]
    pub concurrency: usize,
    /// Print the per-method change between two result directories, then exit.
    #[arg(long, num_args = 2, value_names = ["DIR1", "DIR2"])]
    pub compare: Option<Vec<PathBuf>>,
}

/// A path as given if it exists, else relative to the repository this binary was built from.
fn find(path: &str) -> PathBuf {
    let p = PathBuf::from(path);
    if p.exists() {
        return p;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path);
    if repo.exists() {
        repo.canonicalize().unwrap_or(repo)
    } else {
        p
    }
}

/// Run `bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    if let Some(dirs) = &args.compare {
        let (a, b) = (&dirs[0], &dirs[1]);
        let (ra, rb) = (Results::load(a)?, Results::load(b)?);
        print!("{}", compare_text(&ra, &rb, &a.display().to_string(), &b.display().to_string()));
        return Ok(());
    }
    if let Some(files) = &args.sessions {
        return sessions::run(&args, files);
    }
    let plan = Plan::new(&args)?;
    let started_unix_s = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    eprintln!(
        "[bench] {} prompts × {} methods ({}) × {} repeat(s), -n {}, temperature {}",
        plan.prompts.len(),
        plan.kinds.len(),
        plan.kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", "),
        args.repeat,
        plan.n,
        args.sampling.temp
    );
    let Some(mut measured) = measure(&args, &plan)? else { return Ok(()) };
    let texts = std::mem::take(&mut measured.output.plain_texts);
    let answers = std::mem::take(&mut measured.answers);
    let results = results(&args, &plan, measured, started_unix_s);
    report(&results, &plan.out_dir)?;
    let path = treespec_bench::report::write_plain_texts(&plan.out_dir, &texts)?;
    eprintln!("  {} (plain decoding's tokens, for scripts/copy-bound.py)", path.display());
    if !answers.is_empty() {
        let path = plan.out_dir.join("plain-answers.jsonl");
        let text: String = answers.iter().map(|a| format!("{a}\n")).collect();
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("  {} (plain decoding's answers, for scripts/side-by-side.py)", path.display());
    }
    Ok(())
}

/// What to run, checked before any model loads: a bad prompt file, selection, method name or
/// knob fails in milliseconds.
struct Plan {
    n: usize,
    sampling: SamplingParams,
    prompts_file: PathBuf,
    selection: Selection,
    prompts: Vec<Prompt>,
    models: Option<ModelArgs>,
    kinds: Vec<MethodKind>,
    base: MethodSpec,
    out_dir: PathBuf,
}

impl Plan {
    fn new(args: &BenchArgs) -> Result<Self> {
        if args.method.method != MethodKind::Plain {
            bail!("bench takes --methods a,b,c (plain is always run as the reference), not --method");
        }
        let n = args.n.unwrap_or(if args.quick { QUICK_N } else { DEFAULT_N });
        if n == 0 {
            bail!("-n must be at least 1");
        }
        if args.repeat == 0 {
            bail!("--repeat must be at least 1");
        }
        let sampling = args.sampling.params()?;
        let prompts_file = args.prompts.clone().unwrap_or_else(|| find(DEFAULT_PROMPTS));
        let selection = selection(args);
        let prompts = select(&load_prompts(&prompts_file)?, &selection)?;
        let models = model_args(args)?;
        let has_draft = args.toy || models.as_ref().is_some_and(|m| m.runtime.draft.is_some());
        let kinds = method_kinds(args, has_draft)?;
        let base = args.method.spec();
        for &k in &kinds {
            base.with_method(k).validate().with_context(|| format!("method {k}"))?;
        }
        let out_dir = args.out.clone().unwrap_or_else(|| {
            PathBuf::from(if args.quick { "bench-out/quick" } else { "bench-out/latest" })
        });
        Ok(Self { n, sampling, prompts_file, selection, prompts, models, kinds, base, out_dir })
    }

    fn run_config(&self, args: &BenchArgs, methods: Vec<BenchMethod>) -> RunConfig {
        RunConfig {
            methods: if args.structured { structured(methods) } else { methods },
            max_new_tokens: self.n,
            sampling: self.sampling.clone(),
            seed: args.sampling.seed(),
            repeat: args.repeat,
            warmup: !args.no_warmup,
            progress: if args.log { ProgressMode::Log } else { ProgressMode::Auto },
        }
    }
}

/// The prompts to run: `--quick`'s one per Spec-Bench task, or the selection flags.
fn selection(args: &BenchArgs) -> Selection {
    let quick_selection = args.quick
        && args.prompts.is_none()
        && args.categories.is_none()
        && args.limit.is_none()
        && args.per_category.is_none();
    if quick_selection {
        return Selection {
            categories: Some(QUICK_CATEGORIES.iter().map(|s| s.to_string()).collect()),
            per_category: Some(1),
            limit: None,
        };
    }
    Selection {
        categories: args.categories.clone(),
        per_category: args.per_category,
        limit: args.limit.or(if args.quick { Some(6) } else { None }),
    }
}

/// The model files (None: toy models).
fn model_args(args: &BenchArgs) -> Result<Option<ModelArgs>> {
    if args.toy {
        return Ok(None);
    }
    let model = match (&args.model, args.quick) {
        (Some(m), _) => m.clone(),
        (None, true) => {
            let m = find(QUICK_MODEL);
            if !m.exists() {
                bail!(
                    "--quick runs {QUICK_MODEL}, which is missing: fetch it with \
                     `bash scripts/fetch-models.sh smollm2`, or give -m MODEL.gguf"
                );
            }
            m
        }
        (None, false) => bail!("give a target model with -m MODEL.gguf (or use --quick or --toy)"),
    };
    let draft = args.runtime.draft.clone().or_else(|| args.quick.then(|| model.clone()));
    Ok(Some(ModelArgs { model, runtime: RuntimeArgs { draft, ..args.runtime.clone() } }))
}

/// The methods to compare, plain first; those that need a draft model are refused without one.
fn method_kinds(args: &BenchArgs, has_draft: bool) -> Result<Vec<MethodKind>> {
    let names: Vec<String> = match &args.methods {
        Some(list) => list.clone(),
        None if args.quick => QUICK_METHODS.iter().map(|s| s.to_string()).collect(),
        None if has_draft => {
            let sequoia = args.method.knobs.acceptance.is_some() || args.method.knobs.calibration.is_some();
            METHOD_NAMES
                .iter()
                .filter(|m| **m != "tree" && (sequoia || **m != "sequoia"))
                .map(|s| s.to_string())
                .collect()
        }
        None => ["plain", "lookup", "suffix", "auto"].iter().map(|s| s.to_string()).collect(),
    };
    let kinds: Vec<MethodKind> = check_method_names(&names)?
        .iter()
        .map(|n| n.parse().map_err(|e: String| anyhow!(e)))
        .collect::<Result<_>>()?;
    let need: Vec<&str> = kinds.iter().filter(|k| k.needs_draft()).map(|k| k.as_str()).collect();
    if !has_draft && !need.is_empty() {
        bail!(
            "method(s) {} need a draft model: give --md DRAFT.gguf (it may be the target file itself)",
            need.join(", ")
        );
    }
    Ok(kinds)
}

/// The runs and where they ran.
struct Measured {
    output: RunOutput,
    machine: MachineInfo,
    options: serde_json::Value,
    /// Plain decoding's answers as text (`plain-answers.jsonl`; none on the toy models).
    answers: Vec<serde_json::Value>,
}

/// Plain decoding's answers spelled as llama.cpp's tools print theirs (special tokens not
/// written out), with the prompt's token count: what scripts/side-by-side.py checks llama.cpp
/// plain read and answered the same (scripts/lib/same_prompt.py).
fn plain_answers(models: &ModelRuntime, texts: &[PlainText]) -> Result<Vec<serde_json::Value>> {
    texts
        .iter()
        .map(|t| {
            let mut bytes = Vec::new();
            for &token in &t.output {
                bytes.extend(models.target().token_to_bytes(token, false)?);
            }
            Ok(json!({
                "prompt_id": t.prompt_id,
                "category": t.category,
                "repeat": t.repeat,
                "prompt_tokens": t.prompt.len(),
                "text": String::from_utf8_lossy(&bytes),
            }))
        })
        .collect()
}

/// Run every method on every prompt (None: `--dump-prompts` wrote its file instead).
fn measure(args: &BenchArgs, plan: &Plan) -> Result<Option<Measured>> {
    let Some(margs) = &plan.models else {
        let toy = FixedContext { costs: Some(toy_costs()), ..Default::default() };
        let methods = bench_methods(&plan.base, &plan.kinds, &toy)?;
        let mut backend = ToyBackend::new(64, 2, 1.0, args.sampling.seed(), args.runtime.ctx);
        let output = run_bench(&mut backend, &plan.prompts, &plan.run_config(args, methods))?;
        let options = json!({ "toy": { "vocab": 64, "order": 2, "noise": 1.0 }, "ctx": args.runtime.ctx });
        let machine = MachineInfo::collect(1, Vec::new());
        return Ok(Some(Measured { output, machine, options, answers: Vec::new() }));
    };
    let models = load_runtime(margs)?;
    let chat = !args.no_chat;
    if let Some(path) = &args.dump_prompts {
        dump_prompts(&models, &plan.prompts, chat, path)?;
        return Ok(None);
    }
    if args.method.reprofile && plan.kinds.iter().any(|&k| plan.base.with_method(k).needs_costs()) {
        models.cost_model(models.has_draft(), true)?;
    }
    let methods = bench_methods(&plan.base, &plan.kinds, &models)?;
    let mut files = vec![ModelFile::new("target", &margs.model)];
    if let Some(d) = &margs.runtime.draft {
        files.push(ModelFile::new("draft", d));
    }
    let threads = models.options().threads;
    let mut backend = LlamaBackend::new(&models, chat)?;
    let mut machine = MachineInfo::collect(threads, files);
    machine.device = Some(models.target().runs_on().to_string());
    let output = run_bench(&mut backend, &plan.prompts, &plan.run_config(args, methods))?;
    let options = json!({ "ctx": args.runtime.ctx, "exact": args.runtime.exact, "threads": threads });
    let answers = plain_answers(&models, &output.plain_texts)?;
    Ok(Some(Measured { output, machine, options, answers }))
}

/// The results file's content.
fn results(args: &BenchArgs, plan: &Plan, measured: Measured, started_unix_s: u64) -> Results {
    let Measured { output, mut machine, options, .. } = measured;
    machine.load_average_end = load_average();
    let p = &plan.sampling;
    let methods = plan
        .kinds
        .iter()
        .map(|&k| MethodConfig { name: k.as_str().to_string(), spec: spec_json(&plan.base.with_method(k)) })
        .collect();
    let config = BenchConfig {
        backend: if args.toy { "toy" } else { "llama" }.into(),
        prompts_file: plan.prompts_file.display().to_string(),
        categories: plan.selection.categories.clone(),
        per_category: plan.selection.per_category,
        limit: plan.selection.limit,
        n_prompts: plan.prompts.len(),
        chat: !args.no_chat && !args.toy,
        max_new_tokens: plan.n,
        sampling: SamplingConfig {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
        },
        seed: args.sampling.seed(),
        repeat: args.repeat,
        warmup: !args.no_warmup,
        methods,
        options,
        started_unix_s,
        elapsed_s: output.elapsed.as_secs_f64(),
        warmup_s: output.warmup.as_secs_f64(),
    };
    let summary = summarize(&output.runs);
    Results { schema: SCHEMA.into(), machine, config, runs: output.runs, summary }
}

/// Write the report files and print the summary.
fn report(results: &Results, out_dir: &Path) -> Result<()> {
    let written = write_all(out_dir, results)?;
    print!("{}", treespec_bench::report::summary_markdown(results));
    eprintln!("\n[bench] done in {:.1} s; wrote:", results.config.elapsed_s);
    for f in written {
        eprintln!("  {}", f.display());
    }
    let differs = results.runs.iter().filter(|r| r.identical_to_plain == Some(false)).count();
    if differs > 0 {
        eprintln!(
            "[bench] warning: {differs} run(s) differ from plain at temperature 0 (see summary.md; without \
             --exact, llama.cpp's batch-size dependent kernels can flip near-ties)"
        );
    }
    Ok(())
}

/// The methods `kinds`, each with the shared knobs `base`, resolved through the registry.
fn bench_methods(
    base: &MethodSpec,
    kinds: &[MethodKind],
    context: &dyn MethodContext,
) -> Result<Vec<BenchMethod>> {
    kinds
        .iter()
        .map(|&k| {
            let mut method = base.with_method(k).resolve(context).with_context(|| format!("method {k}"))?;
            // A prompt's warm-up run and repeats must not draft from its own earlier answers.
            method.exclude_same_prompt();
            Ok(BenchMethod { name: k.as_str().to_string(), method, constrained: false, forced_drafts: true })
        })
        .collect()
}

/// With `--structured`: every method constrained to each prompt's schema; `plain` is strict
/// constrained plain decoding (one forward per token, the reference), `plain+forced` adds only
/// the grammar's forced tokens as free drafts, and `plain-free` is unconstrained plain decoding.
fn structured(mut methods: Vec<BenchMethod>) -> Vec<BenchMethod> {
    for m in &mut methods {
        m.constrained = true;
        m.forced_drafts = m.name != "plain";
    }
    let plain = |name: &str, constrained| BenchMethod {
        name: name.into(),
        method: treespec_engine::Method::Plain,
        constrained,
        forced_drafts: true,
    };
    methods.insert(1, plain("plain+forced", true));
    methods.push(plain("plain-free", false));
    methods
}

/// A method's name and knobs for the report: the registry spec as JSON, so `--compare` can tell
/// runs with different knobs apart.
fn spec_json(spec: &MethodSpec) -> String {
    serde_json::to_string(spec).unwrap_or_default()
}
