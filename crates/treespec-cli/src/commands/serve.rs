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
use treespec_server::methods::ServerMethods;
use treespec_server::metrics::View;
use treespec_server::{
    router, ApiKeys, BatchPool, GenerationBackend, Lifecycle, LlamaConfig, Metrics, SchedulerConfig,
    ServerConfig, Tenant,
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
#[allow(clippy::too_many_lines)] // #67: shrinks when the server owns its lifecycle
pub fn run(args: ServeArgs) -> Result<()> {
    let decode_chunk = args.decode_chunk.unwrap_or(args.prefill_chunk);
    if args.parallel == 0 || args.prefill_chunk == 0 || decode_chunk == 0 || args.queue == 0 {
        anyhow::bail!("--parallel, --prefill-chunk, --decode-chunk and --queue must be at least 1");
    }
    let keys = api_keys(&args)?;
    // One runtime: the fingerprint, the cost curves and every worker use the same loaded files.
    let runtime = Arc::new(load_runtime(&args.models)?);
    // The history files are the tenants' ([`TenantHistories`]), not the default method's.
    let mut spec = args.method.spec();
    let history_path = spec.knobs.suffix_history.take();
    let histories = match &history_path {
        Some(path) => {
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
            histories
        }
        None => TenantHistories::in_memory(),
    };
    let metrics = Arc::new(Metrics::default());
    let methods = default_methods(&runtime, &spec, args.method.reprofile, histories.clone(), &metrics)?;
    let runtime_ctx = runtime.options().ctx_size;
    let cache_ram = usize::try_from(args.cache_ram.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
    let config = LlamaConfig { runtime, methods: methods.clone(), cache_ram };
    let limits = StepLimits {
        prefill_chunk: args.prefill_chunk,
        decode_chunk,
        batch_budget: args.batch_budget == BatchBudget::Batch,
        batch_draft: args.draft_batching == DraftBatching::Batch,
        ..StepLimits::default()
    };
    let scheduler = SchedulerConfig { parallel: args.parallel, queue: args.queue, limits };
    let pool: Arc<dyn GenerationBackend> =
        Arc::new(BatchPool::llama(config, scheduler, runtime_ctx, metrics.clone())?);
    eprintln!("treespec serve: {} model file(s) loaded", treespec_llama::models_loaded());
    if keys.required() {
        let sharing = match args.share_history {
            ShareHistory::Tenant => "each key learns only from its own requests",
            ShareHistory::All => "every key learns from every request (--share-history all)",
        };
        eprintln!("treespec serve: {} API key(s); {sharing}", keys.len());
    }
    let lifecycle = Lifecycle::default();
    let server = ServerConfig {
        api_keys: keys,
        metrics_key: args.metrics_key.clone(),
        metrics_open: args.metrics_open,
        max_body_bytes: args.max_body,
        lifecycle: lifecycle.clone(),
    };
    let drain = Drain {
        lifecycle,
        backend: pool.clone(),
        metrics: metrics.clone(),
        most: Duration::from_secs(args.drain),
    };
    let app = router(pool, metrics, server);
    let saver = (history_path.is_some() && args.history_save_every > 0)
        .then(|| PeriodicSave::start(histories.clone(), Duration::from_secs(args.history_save_every)));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener =
            tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("binding {addr}"))?;
        eprintln!("treespec serve: listening on http://{}", listener.local_addr()?);
        treespec_server::serve(listener, app, drain.after_signal()).await?;
        anyhow::Ok(())
    })?;
    drop(saver);
    report_saves(histories.save_changed())?;
    if methods.is_measuring() {
        // The curves are being measured on a thread of their own, inside llama.cpp: returning
        // would run llama.cpp's static destructors under it (a crash at exit). Everything of ours
        // is saved and the half-measured curve was never cached: leave at once.
        eprintln!(
            "treespec serve: stopped while measuring the cost curves (measured again at the next start)"
        );
        use std::io::Write;
        let _ = std::io::stderr().flush();
        // SAFETY: `_exit` ends the process without running destructors or atexit handlers; no
        // state of ours is left unwritten (the histories were saved above, stdout is unused).
        unsafe { libc::_exit(0) }
    }
    Ok(())
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

/// Print what a save wrote; the error (with every history tried) is the caller's.
fn report_saves(saved: Result<Vec<treespec_server::histories::Saved>>) -> Result<()> {
    for s in saved? {
        let Some(path) = &s.history else { continue };
        let merged = match s.merged {
            0 => String::new(),
            n => format!(", {n} document(s) another server saved merged in"),
        };
        eprintln!(
            "treespec serve: saved the suffix history ({} tokens{merged}) to {}",
            s.tokens,
            path.display()
        );
        if let Some(why) = &s.replaced {
            eprintln!(
                "treespec serve: warning: {} could not be merged ({why}); it was replaced",
                path.display()
            );
        }
        if s.prices_kept {
            eprintln!(
                "treespec serve: the learned prices beside {} hold more trials than ours: kept",
                path.display()
            );
        }
    }
    Ok(())
}

/// A thread that saves the changed histories every period, until dropped.
struct PeriodicSave {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeriodicSave {
    fn start(histories: Arc<TenantHistories>, every: Duration) -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                if let Err(e) = report_saves(histories.save_changed()) {
                    eprintln!("treespec serve: warning: {e:#} (will try again)");
                }
            }
        });
        Self { stop: Some(stop), thread: Some(thread) }
    }
}

impl Drop for PeriodicSave {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the server does between the stop signal and stopping (`--drain`).
struct Drain {
    lifecycle: Lifecycle,
    backend: Arc<dyn GenerationBackend>,
    metrics: Arc<Metrics>,
    most: Duration,
}

impl Drain {
    /// Resolves when the server should stop accepting connections: at a stop signal, after the
    /// server has drained — unready, refusing new requests, until nothing is queued or running
    /// (or `most` has passed, or a second signal came).
    async fn after_signal(self) {
        stop_signal().await;
        if self.most.is_zero() {
            return;
        }
        self.lifecycle.drain();
        eprintln!(
            "treespec serve: draining: unready, new requests refused; up to {} s for the requests in flight (signal again to stop now)",
            self.most.as_secs()
        );
        let busy = || self.backend.queue_depth() + self.metrics.generations_in_flight(View::Server);
        let deadline = tokio::time::Instant::now() + self.most;
        let mut second = std::pin::pin!(stop_signal());
        while busy() > 0 && tokio::time::Instant::now() < deadline {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = &mut second => break,
            }
        }
        match busy() {
            0 => eprintln!("treespec serve: drained"),
            n => eprintln!("treespec serve: stopping with {n} request(s) unfinished"),
        }
    }
}

/// Resolves on Ctrl-C (SIGINT) or, on Unix, SIGTERM (what service managers and `kill` send).
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
