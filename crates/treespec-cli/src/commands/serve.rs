//! `treespec serve`: an OpenAI-compatible HTTP server (see the treespec-server crate).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use treespec_engine::batched::StepLimits;
use treespec_engine::measure::serving_gate;
use treespec_engine::MethodSpec;
use treespec_server::histories::TenantHistories;
use treespec_server::lifecycle::{self, Drain, Serving, Stops};
use treespec_server::methods::ServerMethods;
use treespec_server::{
    router, ApiKeys, BatchPool, GenerationBackend, Lifecycle, LlamaConfig, Metrics, SamplingDefaults,
    SchedulerConfig, ServerConfig, Tenant,
};

use super::args::{MethodArgs, ModelArgs};
use super::models::{load_runtime, resolve};

/// Who sizes the free (suffix) drafts of a batched step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BatchBudget {
    /// One value-ordered budget over every request's draft nodes, cut where the next node no
    /// longer pays on the merged forward.
    Batch,
    /// Each request prices its own tree on the rows proposed before it.
    Request,
}

/// How the requests of a batched step run the shared draft model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DraftBatching {
    /// The requests propose together and their draft forwards meet in one forward each round.
    Batch,
    /// Each request drafts on its own, one after another (its own draft forwards).
    Request,
}

/// Who learns from whose requests (the suffix history, learned prices, cached KV prefixes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ShareHistory {
    /// Each API key is a tenant that learns only from its own requests (the default).
    Tenant,
    /// Every key learns from every request: faster for a team that trusts itself, but a client
    /// can tell from its own speed what others sent (docs/SECURITY.md).
    All,
}

/// Options of `treespec serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub models: ModelArgs,
    /// The default method (a request may pick another with its `treespec` object).
    #[command(flatten)]
    pub method: MethodArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 = any free port).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Requests decoded at once, ONE forward per step holding all their rows (continuous
    /// batching; 1: one request at a time). They share one KV cache of -c cells (as
    /// llama-server's slots share its -c), and a request may use all of it.
    #[arg(long, visible_alias = "np", default_value_t = 8)]
    pub parallel: usize,
    /// Host memory, in MiB, for finished requests' KV prefixes moved out of the cache (a later
    /// turn of the conversation restores its prefix from there instead of reading it again;
    /// llama-server's `--cache-ram`). 0 keeps none.
    #[arg(long = "cache-ram", visible_alias = "cram", default_value_t = (treespec_llama::SAVED_PREFIX_BYTES >> 20) as u64)]
    pub cache_ram: u64,
    /// Most prompt tokens one batched step prefills (chunked prefill: a long prompt does not
    /// stall the requests already decoding).
    #[arg(long = "prefill-chunk", default_value_t = 256)]
    pub prefill_chunk: usize,
    /// Most prompt tokens one batched step reads while another request is decoding (default and
    /// at most: --prefill-chunk). The decoding requests wait for the whole step for their next
    /// token, so a smaller chunk streams them more evenly; on a CPU it reads the prompt slower.
    #[arg(long = "decode-chunk")]
    pub decode_chunk: Option<usize>,
    /// Who sizes the suffix drafts (`suffix`, `auto`) of a step: one budget
    /// for the whole batch, or each request on its own.
    #[arg(long = "batch-budget", value_enum, default_value_t = BatchBudget::Batch)]
    pub batch_budget: BatchBudget,
    /// Whether the requests that run the draft model (`--md`) batch their draft
    /// forwards across requests, as their target rows are.
    #[arg(long = "draft-batching", value_enum, default_value_t = DraftBatching::Batch)]
    pub draft_batching: DraftBatching,
    /// Requests that may wait for a lane; beyond that a 503 with Retry-After.
    #[arg(long, default_value_t = 16)]
    pub queue: usize,
    /// Require `Authorization: Bearer KEY` on /v1/* and llama-server's routes with one of these
    /// comma-separated keys (or env TREESPEC_API_KEY). Each key is a tenant (see
    /// --share-history) and reads only its own figures on /metrics.
    #[arg(long = "api-key", env = "TREESPEC_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// A file of API keys, one a line (blank lines and `#` comments skipped), added to --api-key.
    #[arg(long = "api-key-file")]
    pub api_key_file: Option<PathBuf>,
    /// Whether what one key's requests teach the server (suffix history, learned prices, cached
    /// prefixes) speeds up the other keys' requests too; with `all` a client can learn from its
    /// own speed what others sent.
    #[arg(long = "share-history", value_enum, default_value_t = ShareHistory::Tenant)]
    pub share_history: ShareHistory,
    /// Serve the server-wide /metrics and /openapi.json without a key (a trusted network only:
    /// two scrapes around a request tell its acceptance).
    #[arg(long = "metrics-open")]
    pub metrics_open: bool,
    /// The operator's key (or env TREESPEC_METRICS_KEY): it alone reads the server-wide /metrics
    /// (every tenant's requests, the queue, the batched steps); a tenant's key reads its own.
    #[arg(long = "metrics-key", env = "TREESPEC_METRICS_KEY", hide_env_values = true)]
    pub metrics_key: Option<String>,
    /// With --suffix-history: save the histories that changed this often (seconds; 0 = only at
    /// shutdown), so that a crash or a kill loses minutes, not everything.
    #[arg(long = "history-save-every", default_value_t = 60)]
    pub history_save_every: u64,
    /// Largest request body in bytes.
    #[arg(long = "max-body", default_value_t = 1 << 20)]
    pub max_body: usize,
    /// On SIGTERM or Ctrl-C, drain for up to this many seconds before stopping: `/health`
    /// answers 503 and new requests are refused with a retryable 503 (a gateway sends them to
    /// another replica) while the requests queued and running finish. A second signal stops at
    /// once; 0 stops at once.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub drain: u64,
    /// Longest time, in seconds, a request's body may take to arrive after its headers
    /// (llama-server's `-to`; a client trickling bytes gets a 408). Headers have 30 s.
    #[arg(long = "timeout", visible_alias = "to", value_name = "SECONDS",
          default_value_t = treespec_server::DEFAULT_TIMEOUT_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// The model's name on /v1/models, /props and in every response (llama-server's `-a`;
    /// default: the model file's stem). Clients send it back as `model`.
    #[arg(short = 'a', long = "alias")]
    pub alias: Option<String>,
    /// Most new tokens of any request (llama-server's `-n`): the default of a request that sets
    /// none, and a cap on one that asks for more (-1: no cap).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// llama-server's `--spec-default`: the speculative method chosen for you, here `auto` (as
    /// `--method auto`).
    #[arg(long = "spec-default")]
    pub spec_default: bool,
    /// Do not serve the chat page at `GET /` (llama-server's `--no-webui`).
    #[arg(long = "no-webui")]
    pub no_webui: bool,
    #[command(flatten)]
    pub sampling: ServerSampling,
    /// llama-server's switches for what is always on here: continuous batching (`-cb`), the
    /// `/metrics`, `/slots` and `/props` routes. Accepted, nothing to do.
    #[arg(long = "cont-batching", alias = "metrics", alias = "slots", alias = "props", action = clap::ArgAction::Count)]
    pub always_on: u8,
}

/// The server's sampling defaults (llama-server's flags): what a request that sets a field not
/// gets instead of its route's default (OpenAI's temperature 1 on `/v1/*`, llama-server's 0.8 on
/// `/completion`).
#[derive(Debug, Args)]
pub struct ServerSampling {
    /// Temperature of requests that set none.
    #[arg(long = "temp", alias = "temperature")]
    pub temp: Option<f64>,
    /// Top-k of requests that set none (0: off).
    #[arg(long = "top-k")]
    pub top_k: Option<i64>,
    /// Top-p of requests that set none.
    #[arg(long = "top-p")]
    pub top_p: Option<f64>,
    /// Min-p of requests that set none.
    #[arg(long = "min-p")]
    pub min_p: Option<f64>,
    /// Seed of requests that set none (-1: a random one each).
    #[arg(short = 's', long = "seed", allow_negative_numbers = true)]
    pub seed: Option<i64>,
    /// Repetition penalty of requests that set none.
    #[arg(long = "repeat-penalty")]
    pub repeat_penalty: Option<f64>,
    /// Tokens the repetition penalty looks back over, for requests that set none (-1: all).
    #[arg(long = "repeat-last-n", allow_negative_numbers = true)]
    pub repeat_last_n: Option<i64>,
}

impl ServerSampling {
    /// The defaults, each checked now as a request's field would be (a bad one stops the start).
    fn defaults(&self) -> Result<SamplingDefaults> {
        let d = SamplingDefaults {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
        };
        let mut probe = treespec_server::api::CommonParams::default();
        d.fill(&mut probe);
        treespec_server::validate::sampling_params(&probe).map_err(|e| {
            anyhow::anyhow!("--{}: {}", e.param.unwrap_or_default().replace('_', "-"), e.message)
        })?;
        Ok(d)
    }
}

/// The API keys of `--api-key` and `--api-key-file`.
fn api_keys(args: &ServeArgs) -> Result<ApiKeys> {
    let mut keys = args.api_key.as_deref().map(ApiKeys::parse_list).unwrap_or_default();
    if let Some(path) = &args.api_key_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the API key file {}", path.display()))?;
        let from_file = ApiKeys::parse_file(&text);
        if from_file.is_empty() {
            anyhow::bail!("the API key file {} holds no key", path.display());
        }
        keys.extend(from_file);
    }
    let keys = ApiKeys::new(keys, args.share_history == ShareHistory::All);
    if let Some(operator) = &args.metrics_key {
        let operator = operator.trim();
        if operator.is_empty() {
            anyhow::bail!("--metrics-key is empty");
        }
        // A tenant holding the operator's key would read every tenant's figures.
        if keys.required() && keys.tenant(Some(operator)).is_some() {
            anyhow::bail!("--metrics-key must differ from every API key");
        }
    }
    Ok(keys)
}

/// Run `serve` until Ctrl-C or SIGTERM. With `--suffix-history`, every tenant's history is
/// loaded at start (its file checked for writing), saved every `--history-save-every` seconds
/// when a request added to it, and at shutdown, so that the next start drafts from it.
pub fn run(args: ServeArgs) -> Result<()> {
    let scheduler = scheduler_config(&args)?;
    let keys = api_keys(&args)?;
    let sampling = args.sampling.defaults()?;
    // One runtime: the fingerprint, the cost curves and every worker use the same loaded files.
    let runtime = Arc::new(load_runtime(&args.models)?);
    // The history files are the tenants' ([`TenantHistories`]), not the default method's.
    let mut spec = args.method.spec();
    if args.spec_default {
        spec.method = treespec_engine::MethodKind::Auto;
    }
    let history_path = spec.knobs.suffix_history.take();
    let histories = load_histories(history_path.as_deref(), &spec, &runtime, &keys)?;
    let metrics = Arc::new(Metrics::default());
    let methods = default_methods(&runtime, &spec, args.method.reprofile, histories.clone(), &metrics)?;
    let runtime_ctx = runtime.options().ctx_size;
    let cache_ram = usize::try_from(args.cache_ram.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
    let config = LlamaConfig { runtime, methods: methods.clone(), cache_ram, alias: args.alias.clone() };
    let pool: Arc<dyn GenerationBackend> =
        Arc::new(BatchPool::llama(config, scheduler, runtime_ctx, metrics.clone())?);
    eprintln!("treespec serve: {} model file(s) loaded", treespec_llama::models_loaded());
    report_keys(&args, &keys);
    let lifecycle = Lifecycle::default();
    let server = ServerConfig {
        api_keys: keys,
        metrics_key: args.metrics_key.clone(),
        metrics_open: args.metrics_open,
        max_body_bytes: args.max_body,
        lifecycle: lifecycle.clone(),
        timeout: Duration::from_secs(args.timeout),
        webui: !args.no_webui,
        sampling,
    };
    let most = Duration::from_secs(args.drain);
    let drain = Drain { lifecycle, backend: pool.clone(), metrics: metrics.clone(), most };
    let serving = Serving {
        app: router(pool, metrics, server),
        drain,
        histories,
        save_every: (history_path.is_some() && args.history_save_every > 0)
            .then(|| Duration::from_secs(args.history_save_every)),
    };
    serve_until_stopped(&args.host, args.port, serving)?;
    if methods.is_measuring() {
        exit_while_measuring();
    }
    Ok(())
}

/// The scheduler's settings from the flags, each checked before any model loads.
fn scheduler_config(args: &ServeArgs) -> Result<SchedulerConfig> {
    let decode_chunk = args.decode_chunk.unwrap_or(args.prefill_chunk);
    if args.parallel == 0 || args.prefill_chunk == 0 || decode_chunk == 0 || args.queue == 0 {
        anyhow::bail!("--parallel, --prefill-chunk, --decode-chunk and --queue must be at least 1");
    }
    let limits = StepLimits {
        prefill_chunk: args.prefill_chunk,
        decode_chunk,
        batch_budget: args.batch_budget == BatchBudget::Batch,
        batch_draft: args.draft_batching == DraftBatching::Batch,
        ..StepLimits::default()
    };
    let n_predict = match args.n_predict {
        -1 => None,
        n if n >= 1 => Some(n as usize),
        n => anyhow::bail!("-n (--n-predict) is at least 1, or -1 for no cap, got {n}"),
    };
    Ok(SchedulerConfig { parallel: args.parallel, queue: args.queue, limits, n_predict })
}

/// Every tenant's suffix history: from the files named after `path` (each loaded now, its file
/// checked for writing), or in memory only.
fn load_histories(
    path: Option<&std::path::Path>,
    spec: &MethodSpec,
    runtime: &treespec_llama::ModelRuntime,
    keys: &ApiKeys,
) -> Result<Arc<TenantHistories>> {
    let Some(path) = path else { return Ok(TenantHistories::in_memory()) };
    let cap = spec.knobs.suffix_cap.unwrap_or(treespec_core::suffix::DEFAULT_CAP_TOKENS);
    let tenants: Vec<Tenant> = keys.tenants().collect();
    let histories = TenantHistories::in_files(path, runtime.tokenizer_id()?, cap, tenants)?;
    for h in histories.held().iter().filter(|h| h.docs > 0) {
        eprintln!(
            "treespec serve: loaded the suffix history {} ({} tokens in {} documents)",
            h.path.display(),
            h.tokens,
            h.docs
        );
    }
    Ok(histories)
}

/// Say how many keys guard the server and who learns from whom.
fn report_keys(args: &ServeArgs, keys: &ApiKeys) {
    if !keys.required() {
        return;
    }
    let sharing = match args.share_history {
        ShareHistory::Tenant => "each key learns only from its own requests",
        ShareHistory::All => "every key learns from every request (--share-history all)",
    };
    eprintln!("treespec serve: {} API key(s); {sharing}", keys.len());
}

/// Listen on `host:port` and serve until stopped ([`lifecycle::run`]: the drain, the saves).
fn serve_until_stopped(host: &str, port: u16, serving: Serving) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let addr = format!("{host}:{port}");
    let served = rt.block_on(async move {
        let listener =
            tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("binding {addr}"))?;
        eprintln!("treespec serve: listening on http://{}", listener.local_addr()?);
        lifecycle::run(listener, serving, Stops::os_signals()).await
    });
    // A connection past CLOSE_WAIT is dropped with the runtime, not waited for.
    rt.shutdown_timeout(Duration::from_millis(200));
    served
}

/// The curves are being measured on a thread of their own, inside llama.cpp: returning would run
/// llama.cpp's static destructors under it (a crash at exit). Everything of ours is saved and
/// the half-measured curve was never cached: leave at once.
fn exit_while_measuring() -> ! {
    eprintln!("treespec serve: stopped while measuring the cost curves (measured again at the next start)");
    use std::io::Write;
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` ends the process without running destructors or atexit handlers; no state
    // of ours is left unwritten (the histories were saved before, stdout is unused).
    unsafe { libc::_exit(0) }
}

/// The server's methods. A cost-aware default whose curves this machine has not measured yet
/// (or `--reprofile`) does not hold the server up: it listens at once, serving the default's
/// fixed-budget neighbour ([`MethodSpec::without_costs`]) while a background thread measures the
/// curves in the gaps between requests (it pauses while any is in flight, so serving never pays
/// for it: `treespec_engine::measure::serving_gate`), then switches (`/health` says which, and whether the
/// curve is provisional; a failed measurement keeps the stand-in and warns).
fn default_methods(
    runtime: &Arc<treespec_llama::ModelRuntime>,
    spec: &MethodSpec,
    reprofile: bool,
    histories: Arc<TenantHistories>,
    metrics: &Arc<Metrics>,
) -> Result<Arc<ServerMethods>> {
    let context = runtime.clone() as treespec_server::methods::SharedContext;
    if !spec.needs_costs() || (!reprofile && runtime.has_cost_curves(runtime.has_draft())) {
        let method = resolve(runtime, spec, reprofile)?;
        return Ok(Arc::new(ServerMethods::with_histories(method, context, histories)));
    }
    // Knobs are checked now, not when the curves are in.
    spec.validate()?;
    let stand_in = resolve(runtime, &spec.without_costs(), false)?;
    eprintln!(
        "treespec serve: measuring this machine's cost curves in the background, between requests; \
         '{}' on a fixed budget serves until then (see /health)",
        stand_in.name()
    );
    metrics.measuring_costs(Some(stand_in.name()));
    let methods = Arc::new(ServerMethods::measuring(stand_in, context, histories));
    let (runtime, spec, metrics, handle) = (runtime.clone(), spec.clone(), metrics.clone(), methods.clone());
    std::thread::Builder::new().name("treespec-costs".into()).spawn(move || {
        match serving_gate::in_background(|| resolve(&runtime, &spec, reprofile)) {
            Ok(method) => {
                let provisional = runtime.cost_curves_provisional();
                let how = if provisional {
                    " on cores that stayed busy (provisional: refined as requests run, measured again next start)"
                } else {
                    ""
                };
                eprintln!("treespec serve: cost curves measured{how}; '{}' serves from now on", method.name());
                handle.measured(method);
                metrics.costs_provisional(provisional);
                metrics.measuring_costs(None);
            }
            Err(e) => eprintln!(
                "treespec serve: warning: measuring the cost curves failed ({e:#}); the fixed budget stays"
            ),
        }
    })?;
    Ok(methods)
}
