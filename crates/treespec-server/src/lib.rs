//! treespec-server: an OpenAI-compatible HTTP server that decodes speculatively.
//!
//! Layers, outside in: [`routes`] (axum handlers, SSE) → [`validate`] (every request check, no
//! model; [`sampling`] for the sampling fields) → [`engine_thread`] (the [`GenerationBackend`] seam: a bounded FIFO queue in front of
//! model-owning worker threads; toy and llama.cpp workers). [`api`] holds the wire types,
//! [`metrics`] the Prometheus text, [`error`] the OpenAI error objects.

pub mod api;
pub mod engine_thread;
pub mod error;
pub mod llama;
pub mod methods;
pub mod metrics;
pub mod routes;
pub mod sampling;
pub mod serve;
pub mod validate;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::{middleware, Router};

pub use engine_thread::{EnginePool, Event, GenerationBackend, Job, ToyConfig};
pub use error::ApiError;
pub use llama::LlamaConfig;
pub use metrics::Metrics;
pub use routes::AppState;
pub use serve::serve;

/// HTTP-side settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Require `Authorization: Bearer KEY` on `/v1/*`.
    pub api_key: Option<String>,
    /// Largest accepted request body in bytes (413 beyond).
    pub max_body_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self { api_key: None, max_body_bytes: 1 << 20 }
    }
}

/// The whole application. `/health` and `/metrics` are open; `/v1/*` needs the API key if set.
pub fn router(backend: Arc<dyn GenerationBackend>, metrics: Arc<Metrics>, config: ServerConfig) -> Router {
    let state = AppState { backend, metrics, api_key: config.api_key, started: routes::unix_now() };
    let v1 = Router::new()
        .route("/v1/chat/completions", post(routes::chat_completions))
        .route("/v1/completions", post(routes::completions))
        .route("/v1/models", get(routes::models))
        .route_layer(middleware::from_fn_with_state(state.clone(), routes::auth));
    Router::new()
        .merge(v1)
        .route("/health", get(routes::health))
        .route("/metrics", get(routes::metrics))
        .fallback(routes::not_found)
        // After every route: a known path with the wrong method gets an OpenAI error body too.
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), routes::track))
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .with_state(state)
}
