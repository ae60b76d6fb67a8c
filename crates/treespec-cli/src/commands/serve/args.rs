//! `treespec serve`'s flags, and the settings they make before any model loads: the scheduler's,
//! the API keys, the sampling defaults (llama-server's spellings where it has them).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use treespec_engine::batched::StepLimits;
use treespec_server::{ApiKeys, SamplingDefaults, SchedulerConfig, TlsFiles};

use crate::commands::args::{MethodArgs, ModelArgs};

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
    /// Serve HTTPS with this PEM certificate chain, the server's certificate first (with
    /// --ssl-key-file; llama-server's flag). rustls: TLS 1.2 and 1.3, no OpenSSL.
    #[arg(long = "ssl-cert-file", value_name = "FILE")]
    pub ssl_cert_file: Option<PathBuf>,
    /// The PEM private key of --ssl-cert-file's certificate (PKCS#8, PKCS#1 or SEC1).
    #[arg(long = "ssl-key-file", value_name = "FILE")]
    pub ssl_key_file: Option<PathBuf>,
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
    /// default: the model file's stem). Clients send it back as `model`. One name: llama-server's
    /// comma-separated list of several is refused.
    #[arg(short = 'a', long = "alias")]
    pub alias: Option<String>,
    /// Most new tokens of any request (llama-server's `-n`): the default of a request that sets
    /// none, and a cap on one that asks for more (-1: no cap).
    #[arg(short = 'n', long = "n-predict", alias = "predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// llama-server's `--spec-default`: the speculative method chosen for you, here `auto` (as
    /// `--method auto`).
    #[arg(long = "spec-default")]
    pub spec_default: bool,
    /// Do not serve the chat page at `GET /` (llama-server's `--no-webui`).
    #[arg(long = "no-webui", alias = "no-ui")]
    pub no_webui: bool,
    #[command(flatten)]
    pub sampling: ServerSampling,
    /// llama-server's switches for what is always on here: continuous batching (`-cb`), the
    /// `/metrics`, `/slots` and `/props` routes. Accepted, nothing to do.
    #[arg(long = "cont-batching", visible_aliases = ["metrics", "slots", "props"], action = clap::ArgAction::Count)]
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
    pub(super) fn defaults(&self) -> Result<SamplingDefaults> {
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
pub(super) fn api_keys(args: &ServeArgs) -> Result<ApiKeys> {
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

/// The certificate and key of `--ssl-cert-file` and `--ssl-key-file`, both or neither, read and
/// checked now so a bad file fails before any model loads.
pub(super) fn tls_files(args: &ServeArgs) -> Result<Option<TlsFiles>> {
    let files = match (&args.ssl_cert_file, &args.ssl_key_file) {
        (Some(cert), Some(key)) => TlsFiles { cert: cert.clone(), key: key.clone() },
        (None, None) => return Ok(None),
        (Some(_), None) => {
            anyhow::bail!("--ssl-cert-file needs --ssl-key-file (the certificate's private key)")
        }
        (None, Some(_)) => {
            anyhow::bail!("--ssl-key-file needs --ssl-cert-file (the certificate it is the key of)")
        }
    };
    files.acceptor().context("--ssl-cert-file / --ssl-key-file")?;
    Ok(Some(files))
}

/// The model's name from `-a`: one name (llama-server takes a comma-separated list of several;
/// taking the list as one name would answer to none of them).
pub(super) fn alias(args: &ServeArgs) -> Result<Option<String>> {
    match args.alias.as_deref().map(str::trim) {
        Some(a) if a.is_empty() || a.contains(',') => {
            anyhow::bail!("-a (--alias) {a:?}: one model name here, not a list")
        }
        a => Ok(a.map(str::to_owned)),
    }
}

/// The scheduler's settings from the flags, each checked before any model loads.
pub(super) fn scheduler_config(args: &ServeArgs) -> Result<SchedulerConfig> {
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
