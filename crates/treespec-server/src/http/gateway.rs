//! What a gateway in front of several replicas needs from one (issue #42; docs/SERVING.md,
//! "Many machines"): to know when to stop sending, how loaded the replica is, and which
//! conversation a request belongs to.
//!
//! - **Draining.** On SIGTERM the server does not vanish with requests in flight: it turns
//!   unready first ([`Draining::drain`](super::draining::Draining::drain)): `/health` answers 503 `draining`, new generation
//!   requests are refused with a retryable 503 (a gateway such as SMG retries them on another
//!   replica), and the requests already queued or running finish; then it exits.
//! - **Load.** `GET /v1/loads` answers in the shape SMG reads from a worker that is neither
//!   SGLang nor vLLM (`{"timestamp", "dp_rank_count", "loads": [{…}]}`: running and waiting
//!   requests, KV cells in use, their share), so `power_of_two` and `least_load` routing and its
//!   overload protection see this replica; `/metrics` carries the same gauges under vLLM's
//!   names (`vllm:num_requests_running`, …).
//! - **Sessions.** A conversation's turns are kept on one replica by the gateway, keyed by a
//!   session key; the replica reads it from OpenAI's `prompt_cache_key` request field, SMG's
//!   `X-SMG-Routing-Key` header or a plain `X-Session-Id` ([`session_key`]), checks it, and
//!   keeps it per tenant (a key names a conversation of its tenant only).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::http::state::AppState;
use crate::metrics::View;

/// Longest session key accepted (bytes).
pub const MAX_SESSION_KEY: usize = 256;

/// Headers that carry a session key, in the order they are read: SMG's routing key, then the
/// plain one. OpenAI's `prompt_cache_key` body field comes first of all.
pub const SESSION_HEADERS: [&str; 2] = ["x-smg-routing-key", "x-session-id"];

/// The request's session key, if it names one: the body's `prompt_cache_key`, else the first
/// session header present. An empty, overlong or non-text key is a 400 naming where it came
/// from.
pub fn session_key(body_key: Option<&str>, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let check = |from: &'static str, key: &str| -> Result<String, ApiError> {
        if key.is_empty() || key.len() > MAX_SESSION_KEY || key.chars().any(char::is_control) {
            let message = format!("{from}: a session key is 1 to {MAX_SESSION_KEY} bytes of printable text");
            return Err(ApiError::invalid(from, message));
        }
        Ok(key.to_string())
    };
    if let Some(key) = body_key {
        return check("prompt_cache_key", key).map(Some);
    }
    for name in SESSION_HEADERS {
        if let Some(v) = headers.get(name) {
            let key =
                v.to_str().map_err(|_| ApiError::invalid(name, format!("{name}: not printable text")))?;
            return check(name, key.trim()).map(Some);
        }
    }
    Ok(None)
}

/// One data-parallel rank's load, as SMG reads it from a generic worker.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RankLoad {
    /// Always 0: one replica is one rank.
    pub dp_rank: u32,
    /// Requests decoding now.
    pub num_running_reqs: usize,
    /// Requests waiting for a lane.
    pub num_waiting_reqs: usize,
    /// Running and waiting.
    pub num_total_reqs: usize,
    /// KV cells the live requests hold.
    pub num_used_tokens: usize,
    /// KV cells in all.
    pub max_total_num_tokens: usize,
    /// `num_used_tokens / max_total_num_tokens`.
    pub token_usage: f64,
    /// Most requests decoded at once.
    pub max_running_requests: usize,
}

/// `GET /v1/loads`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Loads {
    /// Unix seconds.
    pub timestamp: u64,
    /// 1.
    pub dp_rank_count: u32,
    /// One entry.
    pub loads: Vec<RankLoad>,
}

/// `GET /v1/loads`: this replica's load in SMG's generic-worker shape (read under the same rules
/// as `/metrics`: a tenant's key reads its own requests only, and no cells).
pub async fn loads(State(s): State<AppState>, axum::Extension(view): axum::Extension<View>) -> Json<Loads> {
    let (waiting, (used, total)) = match view {
        View::Server => (s.backend.queue_depth(), s.metrics.kv_cells()),
        View::Tenant(t) => (s.backend.queue_depth_of(t), (0, 0)),
    };
    let running = s.metrics.generations_in_flight(view);
    let usage = if total > 0 { used as f64 / total as f64 } else { 0.0 };
    Json(Loads {
        timestamp: crate::http::openai::wire::now(),
        dp_rank_count: 1,
        loads: vec![RankLoad {
            dp_rank: 0,
            num_running_reqs: running,
            num_waiting_reqs: waiting,
            num_total_reqs: running + waiting,
            num_used_tokens: used,
            max_total_num_tokens: total,
            token_usage: usage,
            max_running_requests: s.backend.slots(),
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn the_session_key_comes_from_the_body_then_the_headers() {
        let mut h = HeaderMap::new();
        assert_eq!(session_key(None, &h).unwrap(), None);
        h.insert("x-session-id", HeaderValue::from_static("plain"));
        assert_eq!(session_key(None, &h).unwrap().as_deref(), Some("plain"));
        h.insert("x-smg-routing-key", HeaderValue::from_static("smg"));
        assert_eq!(session_key(None, &h).unwrap().as_deref(), Some("smg"));
        assert_eq!(session_key(Some("body"), &h).unwrap().as_deref(), Some("body"));
    }

    #[test]
    fn a_bad_session_key_is_a_400_naming_where_it_came_from() {
        let h = HeaderMap::new();
        let e = session_key(Some(""), &h).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(e.message.contains("prompt_cache_key"), "{}", e.message);
        let long = "k".repeat(MAX_SESSION_KEY + 1);
        assert!(session_key(Some(&long), &h).is_err());
        let mut h = HeaderMap::new();
        h.insert("x-session-id", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        let e = session_key(None, &h).unwrap_err();
        assert!(e.message.contains("x-session-id"), "{}", e.message);
    }
}
