//! treespec-server: an OpenAI-compatible HTTP server that decodes speculatively.
//!
//! Layers, outside in: [`routes`] (axum handlers, SSE; [`tool_calls`] turns a forced tool call's
//! JSON into `tool_calls`, whole or in deltas) → [`validate`] (every request check, no model;
//! [`sampling`] for the sampling fields, [`structured`] for `response_format`, `tools` and
//! `tool_choice`) → the [`GenerationBackend`] seam, implemented by [`scheduler`] (continuous
//! batching, the default: every active request's rows in one forward per step;
//! [`llama_lanes`] and [`toy_lanes`] are its models) and beside it by [`fifo`] (`--scheduler
//! fifo`: a bounded FIFO queue in front of model-owning worker threads; [`llama_worker`] and
//! [`toy`] are its workers). The two share only the job types of [`job`]; [`llama`] holds what
//! both llama.cpp backends share, above all the one request preparation. [`api`] holds the wire
//! types ([`openapi`] their OpenAPI description), [`metrics`] the Prometheus text, [`error`] the OpenAI error objects.
//! [`llama_api`] answers llama-server's own routes (`/completion`, `/tokenize`, `/props`, …) on
//! the same seam; `GET /` is a chat page (`chat.html`, embedded) that reads the trace extension
//! of streamed chunks (each token's provenance).
//!
//! Sharing (issue #29, docs/SECURITY.md): each API key is a [`tenant`]; what a request teaches
//! the server (the suffix history and prices in [`histories`], the methods' learned state in
//! [`methods`], cached KV prefixes) stays its tenant's. [`serve`] is the accept loop; it lets a
//! request see when its client has gone ([`serve::PeerClosed`]).
//!
//! Structured output (issue #14): `response_format` `json_object` / `json_schema` and forced
//! tool calls (`tool_choice` `required` or a named function) decode under a grammar
//! (treespec-grammar, compiled per request against the model's vocabulary, built once per
//! server) with `generate_constrained`: speculative and lossless against constrained plain
//! decoding. With `tool_choice: "auto"` a free answer that is exactly one declared call comes
//! back as `tool_calls`; tool results and earlier calls in the history are rendered for the model. Chat `logprobs`/`top_logprobs` are served by the
//! batch scheduler (a 400 under `--scheduler fifo`).

pub mod api;
pub mod error;
pub mod fifo;
pub mod gateway;
pub mod histories;
pub mod job;
pub mod llama;
pub mod llama_api;
pub mod llama_lanes;
pub mod llama_worker;
pub mod methods;
pub mod metrics;
pub mod openai_wire;
pub mod openapi;
pub mod prompt;
pub mod queue;
pub mod respond;
pub mod routes;
pub mod sampling;
pub mod scheduler;
pub mod serve;
pub mod structured;
pub mod tenant;
pub mod tool_calls;
pub mod toy;
pub mod toy_lanes;
pub mod validate;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::{middleware, Router};

pub use error::ApiError;
pub use fifo::EnginePool;
pub use gateway::Lifecycle;
pub use job::{Event, GenerationBackend, Job};
pub use llama::LlamaConfig;
pub use metrics::Metrics;
pub use routes::AppState;
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
    pub lifecycle: Lifecycle,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            api_keys: ApiKeys::default(),
            metrics_key: None,
            metrics_open: false,
            max_body_bytes: 1 << 20,
            lifecycle: Lifecycle::default(),
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
        started: routes::unix_now(),
        lifecycle: config.lifecycle,
    };
    let auth = || middleware::from_fn_with_state(state.clone(), routes::auth);
    let v1 = Router::new()
        .route("/v1/chat/completions", post(routes::chat_completions))
        .route("/v1/completions", post(routes::completions))
        .route("/v1/models", get(routes::models))
        .merge(llama_api::routes())
        .route_layer(auth());
    let watch = Router::new()
        .route("/metrics", get(routes::metrics))
        .route("/v1/loads", get(gateway::loads))
        .route("/openapi.json", get(openapi::openapi))
        .route_layer(middleware::from_fn_with_state(state.clone(), routes::watch_auth));
    Router::new()
        .merge(v1)
        .merge(watch)
        .route("/health", get(routes::health))
        .route("/", get(routes::chat_page))
        .fallback(routes::not_found)
        // After every route: a known path with the wrong method gets an OpenAI error body too.
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), routes::track))
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .with_state(state)
}
