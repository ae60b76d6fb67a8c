//! treespec-server: an OpenAI-compatible HTTP server that decodes speculatively.
//!
//! Rooms, outside in:
//! - [`http`]: axum handlers and SSE — the OpenAI routes and llama-server's own routes
//!   (`/completion`, `/tokenize`, `/props`, …) answered through one response lifecycle
//!   (`http/respond.rs`) in their wire formats; what a gateway needs of a replica; the chat page
//!   (`GET /`, `chat.html`, embedded) that reads the trace extension of streamed chunks; the
//!   accept loop ([`serve`], which lets a request see when its client has gone).
//! - [`intake`]: a request body checked without a model ([`validate`] into a `CheckedBody`;
//!   sampling, `response_format`/`tools`/`tool_choice`, prompts), then a job made ready.
//! - [`scheduling`]: the [`GenerationBackend`] seam and the batch scheduler behind it
//!   (continuous batching: every active request's rows in one forward per step; with
//!   `--parallel 1`, one request at a time); the methods a request may name ([`methods`]) and
//!   each tenant's suffix state ([`histories`]).
//! - [`adapters`]: the models behind it — llama.cpp's ([`llama_cpp`]) and the toy models of the
//!   tests, each a `LaneModels`.
//! - [`lifecycle`]: serving until told to stop, the bounded drain, the histories' saves.
//!
//! Beside them, what every room uses: the wire types ([`api`]), the OpenAI error objects
//! ([`error`]), tenants ([`tenant`]) and the Prometheus text ([`metrics`]).
//!
//! Sharing (issue #29, docs/SECURITY.md): each API key is a tenant; what a request teaches
//! the server (the suffix history and prices, the methods' learned state, cached KV prefixes)
//! stays its tenant's.
//!
//! Structured output (issue #14): `response_format` `json_object` / `json_schema` and forced
//! tool calls (`tool_choice` `required` or a named function) decode under a grammar
//! (treespec-grammar, compiled per request against the model's vocabulary, built once per
//! server) with `generate_constrained`: speculative and lossless against constrained plain
//! decoding. With `tool_choice: "auto"` a free answer that is exactly one declared call comes
//! back as `tool_calls`; tool results and earlier calls in the history are rendered for the
//! model. Chat `logprobs`/`top_logprobs` come with each token.

// Tests are exempt from the 80-line limit (clippy.toml): a test reads top to bottom as one story.
#![cfg_attr(test, allow(clippy::too_many_lines))]

mod adapters;
pub mod error;
mod http;
mod intake;
pub mod lifecycle;
pub mod metrics;
mod scheduling;
pub mod tenant;

pub use adapters::{llama_cpp, toy};
/// OpenAI's wire types (kept in `http/openai/types.rs`, beside the format written in them).
pub use http::openai::types as api;
pub use http::serve;
pub use intake::sampling::SamplingDefaults;
pub use intake::{prompt, ready, validate};
pub use scheduling::{histories, job, methods, scheduler};

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::{middleware, Router};

use http::{deadline, gateway, llama_server, openapi, routes};

pub use error::ApiError;
pub use http::draining::Draining;
pub use http::state::AppState;
pub use http::tls::TlsFiles;
pub use job::{Event, GenerationBackend, Job};
pub use llama_cpp::LlamaConfig;
pub use metrics::Metrics;
pub use scheduler::{BatchPool, SchedulerConfig};
pub use serve::serve;
pub use tenant::{ApiKeys, Tenant};
pub use toy::ToyConfig;

/// HTTP-side settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Require `Authorization: Bearer KEY` with one of these keys on `/v1/*` and llama-server's
    /// routes; each key is a tenant, and reads only its own figures on `/metrics`.
    pub api_keys: ApiKeys,
    /// The operator's key: it alone reads the server-wide `/metrics` (`--metrics-key`).
    pub metrics_key: Option<String>,
    /// Serve the server-wide `/metrics` and `/openapi.json` without a key (`--metrics-open`,
    /// for a trusted network).
    pub metrics_open: bool,
    /// Largest accepted request body in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// The handle that turns the server unready before it stops (`gateway.rs`).
    pub draining: Draining,
    /// Longest time a request's headers, and then its whole body, may take to arrive
    /// (`--timeout`, llama-server's `-to`): a client trickling bytes is cut off with a 408.
    pub timeout: std::time::Duration,
    /// Serve the chat page at `GET /` (llama-server's web UI; `--no-webui` turns it off).
    pub webui: bool,
    /// Sampling defaults for the fields a request leaves unset (llama-server's `--temp`, …).
    pub sampling: SamplingDefaults,
}

/// llama-server's default `--timeout`, in seconds.
pub const DEFAULT_TIMEOUT_SECS: u64 = 600;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            api_keys: ApiKeys::default(),
            metrics_key: None,
            metrics_open: false,
            max_body_bytes: 1 << 20,
            draining: Draining::default(),
            timeout: std::time::Duration::from_secs(DEFAULT_TIMEOUT_SECS),
            webui: true,
            sampling: Default::default(),
        }
    }
}

/// The whole application. `/health` is open; `/v1/*` needs an API key if there are keys.
/// `/metrics` and `/openapi.json`: the server-wide figures for the operator's key (or for anybody
/// with `metrics_open`, or on a server without any key), a tenant's own figures for its key —
/// two scrapes around another tenant's request would otherwise tell that request's acceptance,
/// which tells what it sent (docs/SECURITY.md).
pub fn router(backend: Arc<dyn GenerationBackend>, metrics: Arc<Metrics>, config: ServerConfig) -> Router {
    let keys = Arc::new(config.api_keys);
    metrics.set_model_name(&backend.model_id());
    let state = AppState {
        backend,
        metrics,
        keys,
        metrics_key: config.metrics_key.filter(|k| !k.trim().is_empty()).map(|k| Arc::from(k.trim())),
        metrics_open: config.metrics_open,
        started: http::openai::wire::now(),
        draining: config.draining,
        body_timeout: config.timeout,
        sampling: config.sampling,
    };
    let auth = || middleware::from_fn_with_state(state.clone(), routes::auth);
    let v1 = Router::new()
        .route("/v1/chat/completions", post(routes::chat_completions))
        .route("/v1/completions", post(routes::completions))
        .route("/v1/models", get(routes::models))
        .merge(llama_server::routes())
        .route_layer(auth());
    let watch = Router::new()
        .route("/metrics", get(routes::metrics))
        .route("/v1/loads", get(gateway::loads))
        .route("/openapi.json", get(openapi::openapi))
        .route_layer(middleware::from_fn_with_state(state.clone(), routes::watch_auth));
    let page = Router::new();
    let page = if config.webui { page.route("/", get(routes::chat_page)) } else { page };
    Router::new()
        .merge(v1)
        .merge(watch)
        .merge(page)
        .route("/health", get(routes::health))
        .fallback(routes::not_found)
        // After every route: a known path with the wrong method gets an OpenAI error body too.
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), routes::track))
        .layer(middleware::from_fn_with_state(state.clone(), deadline::body_deadline))
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .with_state(state)
}
