//! A server started from its configuration and run until it stops ([`Server`]): every tenant's
//! suffix history loaded (its file checked for writing), the backend on its models (on llama.cpp,
//! the default method stood in for while the cost curves are measured: [`super::curves`]), the
//! application and its drain; then served until stopped ([`super::run`]: the drain, the saves).
//! `treespec serve` parses its flags into a [`Start`] and a [`LlamaStart`] and calls
//! [`Server::llama`] and [`Server::serve`]; the tests start toy servers the same way
//! ([`Server::toy`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::net::TcpListener;
use treespec_core::ngram::TokenizerId;
use treespec_engine::MethodSpec;
use treespec_llama::ModelRuntime;

use super::{curves, Drain, Serving, Stops};
use crate::histories::TenantHistories;
use crate::job::GenerationBackend;
use crate::methods::ServerMethods;
use crate::metrics::Metrics;
use crate::scheduler::{BatchPool, SchedulerConfig};
use crate::tenant::{ApiKeys, Tenant};
use crate::toy::{toy_tokenizer, ToyConfig};
use crate::{router, LlamaConfig, ServerConfig, TlsFiles};
use tokio_rustls::TlsAcceptor;

/// What every server starts from, whatever its models.
pub struct Start {
    /// The HTTP side; its `draining` switch is the one the drain turns unready.
    pub http: ServerConfig,
    /// Longest drain once a stop is asked for (`--drain`; zero: stop at the first request).
    pub drain: Duration,
    /// Where the tenants' suffix histories are kept (None: in memory only).
    pub histories: Option<HistoryFiles>,
    /// Serve HTTPS with this certificate and key (None: plain HTTP).
    pub tls: Option<TlsFiles>,
}

/// The tenants' suffix history files (`--suffix-history`).
pub struct HistoryFiles {
    /// The shared tenant's file; every other tenant's is named after it.
    pub path: PathBuf,
    /// Most tokens a history keeps.
    pub cap: usize,
    /// How often the histories that changed are saved while serving (None: only at the stop).
    pub save_every: Option<Duration>,
}

/// A llama.cpp server's models and default method.
pub struct LlamaStart {
    /// The loaded target and draft.
    pub runtime: Arc<ModelRuntime>,
    /// The default method (a suffix history file it names is not its own: the tenants' files
    /// are [`Start::histories`]).
    pub spec: MethodSpec,
    /// Measure the cost curves again rather than read them from the cache.
    pub reprofile: bool,
    /// The batch scheduler's settings.
    pub scheduler: SchedulerConfig,
    /// Host memory for finished requests' prefixes, in bytes (`--cache-ram`).
    pub cache_ram: usize,
    /// The model's name on the API (`-a`).
    pub alias: Option<String>,
}

/// A server ready to serve: its application, drain and histories.
pub struct Server {
    serving: Serving,
    methods: Option<Arc<ServerMethods>>,
}

/// How a server ended.
#[derive(Debug, Clone, Copy)]
pub struct Stopped {
    /// The cost curves were still being measured, on a thread inside llama.cpp: returning from
    /// `main` would run llama.cpp's static destructors under it, so the process should leave at
    /// once (everything of the server's is saved; the half-measured curve was never cached).
    pub measuring: bool,
}

impl Server {
    /// A server on llama.cpp's models: the histories loaded, the default method (measured in the
    /// background when its curves are not in yet), the batch scheduler on the runtime.
    pub fn llama(start: Start, models: LlamaStart) -> Result<Self> {
        let LlamaStart { runtime, spec, reprofile, scheduler, cache_ram, alias } = models;
        let tls = tls_acceptor(&start)?;
        let histories = match &start.histories {
            Some(files) => load_histories(files, runtime.tokenizer_id()?, &start.http.api_keys)?,
            None => TenantHistories::in_memory(),
        };
        let metrics = Arc::new(Metrics::default());
        let methods = curves::default_methods(&runtime, &spec, reprofile, histories.clone(), &metrics)?;
        let ctx_size = runtime.options().ctx_size;
        let config = LlamaConfig { runtime, methods: methods.clone(), cache_ram, alias };
        let pool: Arc<dyn GenerationBackend> =
            Arc::new(BatchPool::llama(config, scheduler, ctx_size, metrics.clone())?);
        eprintln!("treespec serve: {} model file(s) loaded", treespec_llama::models_loaded());
        Ok(Self::on(start, pool, metrics, histories, Some(methods), tls))
    }

    /// A server on the toy models (tests): `config`'s histories are the ones loaded here.
    pub fn toy(start: Start, mut config: ToyConfig, scheduler: SchedulerConfig) -> Result<Self> {
        let tls = tls_acceptor(&start)?;
        let histories = match &start.histories {
            Some(files) => load_histories(files, toy_tokenizer(config.vocab), &start.http.api_keys)?,
            None => TenantHistories::in_memory(),
        };
        config.histories = Some(histories.clone());
        let metrics = Arc::new(Metrics::default());
        let pool = Arc::new(BatchPool::toy(config, scheduler, metrics.clone()));
        Ok(Self::on(start, pool, metrics, histories, None, tls))
    }

    /// The application on `backend`, drained within `start.drain`, its histories saved.
    fn on(
        start: Start,
        backend: Arc<dyn GenerationBackend>,
        metrics: Arc<Metrics>,
        histories: Arc<TenantHistories>,
        methods: Option<Arc<ServerMethods>>,
        tls: Option<TlsAcceptor>,
    ) -> Self {
        let Start { http, drain, histories: files, tls: _ } = start;
        let most = drain;
        let drain = Drain {
            draining: http.draining.clone(),
            backend: backend.clone(),
            metrics: metrics.clone(),
            most,
        };
        let save_every = files.and_then(|f| f.save_every);
        let serving = Serving { app: router(backend, metrics, http), drain, histories, save_every, tls };
        Self { serving, methods }
    }

    /// Serve on `listener` until `stops` asks twice or the drain ends, then save the histories
    /// ([`super::run`]).
    pub async fn run(self, listener: TcpListener, stops: Stops) -> Result<Stopped> {
        super::run(listener, self.serving, stops).await?;
        Ok(Stopped { measuring: self.methods.is_some_and(|m| m.is_measuring()) })
    }

    /// Listen on `host:port` and serve until the OS asks to stop (SIGTERM, Ctrl-C), on a runtime
    /// of this call's own.
    pub fn serve(self, host: &str, port: u16) -> Result<Stopped> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let addr = format!("{host}:{port}");
        let served = rt.block_on(async move {
            let listener = TcpListener::bind(&addr).await.with_context(|| format!("binding {addr}"))?;
            let scheme = if self.serving.tls.is_some() { "https" } else { "http" };
            eprintln!("treespec serve: listening on {scheme}://{}", listener.local_addr()?);
            self.run(listener, Stops::os_signals()).await
        });
        // A connection past CLOSE_WAIT is dropped with the runtime, not waited for.
        rt.shutdown_timeout(Duration::from_millis(200));
        served
    }
}

/// Every tenant's suffix history from the files named after `files.path`, each loaded now (its
/// file checked for writing).
fn load_histories(
    files: &HistoryFiles,
    tokenizer: TokenizerId,
    keys: &ApiKeys,
) -> Result<Arc<TenantHistories>> {
    let tenants: Vec<Tenant> = keys.tenants().collect();
    let histories = TenantHistories::in_files(&files.path, tokenizer, files.cap, tenants)?;
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

/// The TLS acceptor `start` asks for, read before any model loads so a bad file fails at once.
fn tls_acceptor(start: &Start) -> Result<Option<TlsAcceptor>> {
    start.tls.as_ref().map(TlsFiles::acceptor).transpose()
}
