//! `treespec serve`: an OpenAI-compatible HTTP server (see the treespec-server crate).

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use treespec_engine::batched::StepLimits;
use treespec_server::{
    router, BatchPool, EnginePool, GenerationBackend, LlamaConfig, Metrics, SchedulerConfig, ServerConfig,
};

use super::args::{MethodArgs, ModelArgs};
use super::models::{load_runtime, resolve};

/// How requests share the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SchedulerKind {
    /// Continuous batching.
    Batch,
    /// One request at a time per worker.
    Fifo,
}

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
    /// How requests share the model: `batch` decodes up to --parallel requests together, ONE
    /// forward per step holding all their rows (continuous batching); `fifo` runs them one at a
    /// time per worker thread (--max-concurrent workers, each with its own contexts).
    #[arg(long, value_enum, default_value_t = SchedulerKind::Batch)]
    pub scheduler: SchedulerKind,
    /// Requests decoded at once by the batch scheduler. They share one KV cache of -c cells
    /// (as llama-server's slots share its -c), and a request may use all of it.
    #[arg(long, visible_alias = "np", default_value_t = 8)]
    pub parallel: usize,
    /// Most prompt tokens one batched step prefills (chunked prefill: a long prompt does not
    /// stall the requests already decoding).
    #[arg(long = "prefill-chunk", default_value_t = 256)]
    pub prefill_chunk: usize,
    /// Batch scheduler: who sizes the suffix drafts (`suffix`, `auto`) of a step: one budget
    /// for the whole batch, or each request on its own.
    #[arg(long = "batch-budget", value_enum, default_value_t = BatchBudget::Batch)]
    pub batch_budget: BatchBudget,
    /// Batch scheduler: whether the requests that run the draft model (`--md`) batch their draft
    /// forwards across requests, as their target rows are.
    #[arg(long = "draft-batching", value_enum, default_value_t = DraftBatching::Batch)]
    pub draft_batching: DraftBatching,
    /// FIFO scheduler: generations run at once (each worker thread has its own model contexts).
    #[arg(long = "max-concurrent", default_value_t = 1)]
    pub max_concurrent: usize,
    /// Requests that may wait for a worker; beyond that a 503 with Retry-After.
    #[arg(long, default_value_t = 16)]
    pub queue: usize,
    /// Require `Authorization: Bearer KEY` on /v1/* (or env TREESPEC_API_KEY).
    #[arg(long = "api-key", env = "TREESPEC_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Largest request body in bytes.
    #[arg(long = "max-body", default_value_t = 1 << 20)]
    pub max_body: usize,
}

/// Run `serve` until Ctrl-C or SIGTERM; then, with `--suffix-history`, save the global history
/// every request added to, so that the next start (server or CLI) drafts from it.
pub fn run(args: ServeArgs) -> Result<()> {
    // One runtime: the fingerprint, the cost curves and every worker use the same loaded files.
    let runtime = Arc::new(load_runtime(&args.models)?);
    let method = resolve(&runtime, &args.method.spec(), args.method.reprofile)?;
    let history = args.method.knobs.suffix_history.clone().zip(method.suffix_shared().cloned());
    // Known already when a history file was loaded (the file is tagged with it).
    let tokenizer = history.as_ref().map(|_| runtime.tokenizer_id()).transpose()?;
    let metrics = Arc::new(Metrics::default());
    let runtime_ctx = runtime.options().ctx_size;
    let config = LlamaConfig { runtime, method };
    let pool: Arc<dyn GenerationBackend> = match args.scheduler {
        SchedulerKind::Fifo => {
            Arc::new(EnginePool::llama(config, args.max_concurrent, args.queue, metrics.clone())?)
        }
        SchedulerKind::Batch => {
            if args.parallel == 0 || args.prefill_chunk == 0 {
                anyhow::bail!("--parallel and --prefill-chunk must be at least 1");
            }
            let limits = StepLimits {
                prefill_chunk: args.prefill_chunk,
                batch_budget: args.batch_budget == BatchBudget::Batch,
                batch_draft: args.draft_batching == DraftBatching::Batch,
                ..StepLimits::default()
            };
            let scheduler = SchedulerConfig { parallel: args.parallel, queue: args.queue, limits };
            let ctx = runtime_ctx;
            Arc::new(BatchPool::llama(config, scheduler, ctx, metrics.clone())?)
        }
    };
    eprintln!("treespec serve: {} model file(s) loaded", treespec_llama::models_loaded());
    let app = router(pool, metrics, ServerConfig { api_key: args.api_key, max_body_bytes: args.max_body });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener =
            tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("binding {addr}"))?;
        eprintln!("treespec serve: listening on http://{}", listener.local_addr()?);
        treespec_server::serve(listener, app, stop_signal()).await?;
        anyhow::Ok(())
    })?;
    if let (Some((path, shared)), Some(tokenizer)) = (history, tokenizer) {
        let history = shared.history();
        history
            .save(&path, tokenizer)
            .with_context(|| format!("saving the suffix history {}", path.display()))?;
        eprintln!(
            "treespec serve: saved the suffix history ({} tokens) to {}",
            history.tokens(),
            path.display()
        );
    }
    Ok(())
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
