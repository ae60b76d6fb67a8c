//! What every handler reads: the server's shared state and when a request arrived. Apart from
//! the routes so that the response lifecycle ([`super::respond`]), the gateway's handlers and
//! llama-server's routes can read it without importing the routes that import them.

use std::sync::Arc;
use std::time::Instant;

use crate::http::draining::Draining;
use crate::intake::sampling::SamplingDefaults;
use crate::metrics::{Metrics, View};
use crate::scheduling::job::GenerationBackend;
use crate::tenant::{ApiKeys, Tenant};

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    /// The model side.
    pub backend: Arc<dyn GenerationBackend>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The accepted API keys (none: open), each a tenant.
    pub keys: Arc<ApiKeys>,
    /// The operator's key for the server-wide `/metrics` (`--metrics-key`).
    pub metrics_key: Option<Arc<str>>,
    /// Server-wide figures for anybody (`--metrics-open`).
    pub metrics_open: bool,
    /// Server start (Unix seconds), the models' `created`.
    pub started: u64,
    /// Whether new requests are still taken (draining on SIGTERM: `gateway.rs`).
    pub draining: Draining,
    /// Longest time a request's body may take to arrive (`deadline.rs`).
    pub body_timeout: std::time::Duration,
    /// The server's sampling defaults for fields a request leaves unset (every route).
    pub sampling: SamplingDefaults,
}

impl AppState {
    /// Whether the server-wide figures (queue, activity) are anybody's to read: opened on
    /// purpose, or a server without keys or operator key, where everybody is one tenant.
    pub fn figures_public(&self) -> bool {
        self.metrics_open || (!self.keys.required() && self.metrics_key.is_none())
    }

    /// What a scrape carrying `given` may read of the metrics (None: refused).
    pub fn viewer(&self, given: Option<&str>) -> Option<View> {
        if self.figures_public() {
            return Some(View::Server);
        }
        let operator = self.metrics_key.as_deref().zip(given).is_some_and(|(k, g)| ApiKeys::same_key(k, g));
        if operator {
            return Some(View::Server);
        }
        // Without tenant keys only the operator's key opens the metrics.
        self.keys.required().then(|| self.keys.tenant(given)).flatten().map(View::Tenant)
    }

    /// What a request of `tenant` may see of the server's activity (`/slots`).
    pub fn view_of(&self, tenant: Tenant) -> View {
        if self.figures_public() {
            View::Server
        } else {
            View::Tenant(tenant)
        }
    }
}

/// When a request arrived (set by [`super::routes::track`]), for time to first token and latency.
#[derive(Debug, Clone, Copy)]
pub struct Arrived(pub Instant);
