//! HTTP handlers: parse → validate → queue → answer (JSON, or server-sent events ending with
//! `data: [DONE]`). No tensors here: everything model-side is behind
//! [`GenerationBackend`](crate::scheduling::job::GenerationBackend).

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::json;

use crate::api::*;
use crate::error::ApiError;
use crate::http::gateway;
use crate::http::openai::wire::{new_id, now, Kind, Meta, OpenAiWire};
use crate::http::respond::{respond, ClientClosed, Submitted};
use crate::http::serve::PeerClosed;
use crate::http::state::{AppState, Arrived};
use crate::intake::validate;
use crate::metrics::{View, CLIENT_CLOSED};
use crate::tenant::Tenant;

/// `GET /health`: ready at once; while this machine's cost curves are measured in the background it says so,
/// and which method serves meanwhile. Open to all, so the queue's depth only where the
/// server-wide figures are public (others' activity is not a key holder's to read).
pub async fn health(State(s): State<AppState>) -> Response {
    if s.draining.is_draining() {
        // Unready, so a gateway stops sending here; the requests in flight still finish.
        let v = json!({"status": "draining", "model": s.backend.model_id()});
        return (StatusCode::SERVICE_UNAVAILABLE, Json(v)).into_response();
    }
    let mut v = json!({"status": "ok", "model": s.backend.model_id(), "device": s.backend.device()});
    if s.figures_public() {
        v["queue_depth"] = json!(s.backend.queue_depth());
    }
    v["cost_curve"] = match s.metrics.stand_in() {
        Some(method) => {
            v["serving_method"] = json!(method);
            json!("measuring")
        }
        None if s.metrics.provisional() => json!("provisional"),
        None => json!("ready"),
    };
    Json(v).into_response()
}

/// `GET /`: a chat page (one self-contained file in the binary: no build, no network) that
/// streams each answer coloured by how every token was produced (the trace extension), under a
/// Content-Security-Policy that lets only its own inline script and style run (see [`super::chat`]).
pub async fn chat_page() -> Response {
    super::chat::response()
}

/// `GET /metrics`: the server-wide figures for the operator, a tenant's own for its key.
pub async fn metrics(State(s): State<AppState>, Extension(view): Extension<View>) -> Response {
    let depth = match view {
        View::Server => s.backend.queue_depth(),
        View::Tenant(t) => s.backend.queue_depth_of(t),
    };
    let text = s.metrics.render(view, depth);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// `GET /v1/models`.
pub async fn models(State(s): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: s.backend.model_id(),
            object: "model",
            created: s.started,
            owned_by: "treespec",
            max_model_len: s.backend.limits().context,
        }],
    })
}

/// Unknown routes.
pub async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(req.uri().path())
}

/// A known route with a method it does not serve (axum adds the `Allow` header).
pub async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::method_not_allowed(req.method().as_str(), req.uri().path())
}

/// Counts every answered request by route and status; stamps its arrival.
pub async fn track(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(Arrived(Instant::now()));
    let endpoint = req.extensions().get::<MatchedPath>().map_or("other", |p| p.as_str()).to_string();
    let r = next.run(req).await;
    let status = match r.extensions().get::<ClientClosed>() {
        Some(_) => CLIENT_CLOSED,
        None => r.status().as_u16(),
    };
    s.metrics.request(r.extensions().get::<Tenant>().copied(), &endpoint, status);
    r
}

/// The key a request carries: `Authorization: Bearer KEY`, the scheme in any case (RFC 9110
/// §11.1) and any whitespace before the key.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim_start();
    let (scheme, key) = value.split_once([' ', '\t'])?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

/// With API keys: `Authorization: Bearer KEY` (one of them) or 401. The request carries its
/// key's [`Tenant`] on (the shared tenant without keys), and so does its response, for
/// [`track`] to count it in that tenant's metrics.
pub async fn auth(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    let Some(tenant) = s.keys.tenant(bearer(req.headers())) else {
        return ApiError::unauthorized().into_response();
    };
    req.extensions_mut().insert(tenant);
    let mut r = next.run(req).await;
    r.extensions_mut().insert(tenant);
    r
}

/// Who may read `/metrics` and `/openapi.json`, and what: the operator's key (`--metrics-key`)
/// reads the server-wide figures, a tenant's key its own (see [`AppState::viewer`]).
pub async fn watch_auth(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    let Some(view) = s.viewer(bearer(req.headers())) else {
        return ApiError::unauthorized().into_response();
    };
    req.extensions_mut().insert(view);
    next.run(req).await
}

/// The body as bytes, with limit and content-type errors in OpenAI form.
pub(crate) fn body_bytes(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    validate::check_content_type(headers)?;
    validate::read_body(body)
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(s): State<AppState>,
    Extension(arrived): Extension<Arrived>,
    Extension(tenant): Extension<Tenant>,
    peer: Option<Extension<PeerClosed>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body_bytes(&headers, body)?;
    let mut req: ChatCompletionRequest = validate::parse_json(&bytes)?;
    s.sampling.fill(&mut req.common);
    let session = gateway::session_key(req.common.prompt_cache_key.as_deref(), &headers)?;
    let length = validate::openai_length_field(&req.common);
    let named = |e| validate::in_request_names(e, "messages", length);
    let spec = validate::chat(req, &s.backend.limits()).map_err(named)?;
    // The trace extension is a chat chunk's.
    let submitted =
        Submitted { spec, tenant, peer: peer.map(|p| p.0), trace: wants_trace(&headers), session };
    openai(s, submitted, Kind::Chat, arrived).await.map_err(named)
}

/// `POST /v1/completions`.
pub async fn completions(
    State(s): State<AppState>,
    Extension(arrived): Extension<Arrived>,
    Extension(tenant): Extension<Tenant>,
    peer: Option<Extension<PeerClosed>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body_bytes(&headers, body)?;
    let mut req: CompletionRequest = validate::parse_json(&bytes)?;
    s.sampling.fill(&mut req.common);
    let session = gateway::session_key(req.common.prompt_cache_key.as_deref(), &headers)?;
    let length = validate::openai_length_field(&req.common);
    let named = |e| validate::in_request_names(e, "prompt", length);
    let spec = validate::completion(req, &s.backend.limits()).map_err(named)?;
    let submitted = Submitted { spec, tenant, peer: peer.map(|p| p.0), trace: false, session };
    openai(s, submitted, Kind::Completion, arrived).await.map_err(named)
}

/// Whether the request asks for the trace extension of streamed chunks.
fn wants_trace(headers: &HeaderMap) -> bool {
    headers.get("x-treespec-trace").is_some_and(|v| v.as_bytes() == b"1")
}

/// An OpenAI route's answer: the one response lifecycle in the OpenAI wire format.
async fn openai(s: AppState, job: Submitted, kind: Kind, arrived: Arrived) -> Result<Response, ApiError> {
    let (include_usage, tool_call) = (job.spec.include_usage, job.spec.output.is_tool_call());
    let auto_tools: Option<Vec<String>> =
        job.spec.output.auto_tools().map(|tools| tools.iter().map(|f| f.name.clone()).collect());
    let trace = job.trace;
    let meta = |started: Option<crate::http::respond::Start>| Meta {
        id: new_id(if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }),
        created: now(),
        model: s.backend.model_id(),
        kind,
        include_usage,
        tool_call,
        auto_tools,
        // Known once started; a stream that begins while queued reads it from `Started`.
        fenced_calls: started.is_some_and(|s| s.fenced_calls),
        trace,
        plain_rate: s.backend.plain_tokens_per_second(),
    };
    respond(&s, job, arrived, |started| OpenAiWire::new(meta(started))).await
}
