//! `treespec serve`: an OpenAI-compatible HTTP server (see the treespec-server crate). The flags
//! and what they set up are in `args.rs`, the histories and the default method in `methods.rs`;
//! here the models load and the server runs until it is told to stop.

mod args;
mod methods;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use treespec_server::lifecycle::{self, Drain, Serving, Stops};
use treespec_server::{
    router, ApiKeys, BatchPool, GenerationBackend, Lifecycle, LlamaConfig, Metrics, ServerConfig,
};

pub use args::ServeArgs;

use super::models::load_runtime;
use args::{alias, api_keys, scheduler_config, ShareHistory};
use methods::{default_methods, load_histories};

/// Run `serve` until Ctrl-C or SIGTERM. With `--suffix-history`, every tenant's history is
/// loaded at start (its file checked for writing), saved every `--history-save-every` seconds
/// when a request added to it, and at shutdown, so that the next start drafts from it.
pub fn run(args: ServeArgs) -> Result<()> {
    let scheduler = scheduler_config(&args)?;
    let keys = api_keys(&args)?;
    let sampling = args.sampling.defaults()?;
    let alias = alias(&args)?;
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
    let config = LlamaConfig { runtime, methods: methods.clone(), cache_ram, alias };
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
