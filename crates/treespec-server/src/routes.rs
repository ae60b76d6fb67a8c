//! HTTP handlers: parse → validate → queue → answer (JSON, or server-sent events ending with
//! `data: [DONE]`). No tensors here: everything model-side is behind [`GenerationBackend`].

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::stream::{self, Stream, StreamExt};
use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::api::Timings;
use crate::api::*;
use crate::error::ApiError;
use crate::gateway::{self, Lifecycle};
use crate::job::{Event, Finished, GenerationBackend, Job};
use crate::metrics::{Metrics, RequestTimer, View};
use crate::serve::PeerClosed;
use crate::structured;
use crate::tenant::{ApiKeys, Tenant};
use crate::tool_calls::ToolCallText;
use crate::validate::{self, JobSpec};
use treespec_grammar::FENCED_CALL;

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
    pub lifecycle: Lifecycle,
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

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Server start time for [`AppState::started`].
pub fn unix_now() -> u64 {
    now()
}

fn new_id(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{prefix}-{n:x}{nanos:08x}")
}

/// `GET /health`: ready at once; while this machine's cost curves are measured in the background it says so,
/// and which method serves meanwhile. Open to all, so the queue's depth only where the
/// server-wide figures are public (others' activity is not a key holder's to read).
pub async fn health(State(s): State<AppState>) -> Response {
    if s.lifecycle.is_draining() {
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

mod chat;

/// `GET /`: a chat page (one self-contained file in the binary: no build, no network) that
/// streams each answer coloured by how every token was produced (the trace extension), under a
/// Content-Security-Policy that lets only its own inline script and style run (see [`chat`]).
pub async fn chat_page() -> Response {
    chat::response()
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

/// When a request arrived (set by [`track`]), for time to first token and latency.
#[derive(Debug, Clone, Copy)]
pub struct Arrived(pub Instant);

/// Counts every answered request by route and status; stamps its arrival.
pub async fn track(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(Arrived(Instant::now()));
    let endpoint = req.extensions().get::<MatchedPath>().map_or("other", |p| p.as_str()).to_string();
    let r = next.run(req).await;
    s.metrics.request(r.extensions().get::<Tenant>().copied(), &endpoint, r.status().as_u16());
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
    let req: ChatCompletionRequest = validate::parse_json(&bytes)?;
    let session = gateway::session_key(req.common.prompt_cache_key.as_deref(), &headers)?;
    let length = validate::openai_length_field(&req.common);
    let named = |e| validate::in_request_names(e, "messages", length);
    let spec = validate::chat(req, &s.backend.limits()).map_err(named)?;
    let submitted =
        Submitted { spec, tenant, peer: peer.map(|p| p.0), trace: wants_trace(&headers), session };
    respond(s, submitted, Kind::Chat, arrived).await.map_err(named)
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
    let req: CompletionRequest = validate::parse_json(&bytes)?;
    let session = gateway::session_key(req.common.prompt_cache_key.as_deref(), &headers)?;
    let length = validate::openai_length_field(&req.common);
    let named = |e| validate::in_request_names(e, "prompt", length);
    let spec = validate::completion(req, &s.backend.limits()).map_err(named)?;
    let submitted = Submitted { spec, tenant, peer: peer.map(|p| p.0), trace: false, session };
    respond(s, submitted, Kind::Completion, arrived).await.map_err(named)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

/// A validated request, whose it is, and how to tell that its client left.
struct Submitted {
    spec: JobSpec,
    tenant: Tenant,
    peer: Option<PeerClosed>,
    /// `X-Treespec-Trace: 1`: stream provenance and statistics.
    trace: bool,
    /// The conversation it continues, if it names one (`gateway::session_key`).
    session: Option<String>,
}

/// Whether the request asks for the trace extension of streamed chunks.
fn wants_trace(headers: &HeaderMap) -> bool {
    headers.get("x-treespec-trace").is_some_and(|v| v.as_bytes() == b"1")
}

async fn respond(s: AppState, job: Submitted, kind: Kind, arrived: Arrived) -> Result<Response, ApiError> {
    let Submitted { spec, tenant, peer, trace, session } = job;
    let (stream, include_usage, tool_call) = (spec.stream, spec.include_usage, spec.output.is_tool_call());
    let auto_tools: Option<Vec<String>> =
        spec.output.auto_tools().map(|tools| tools.iter().map(|f| f.name.clone()).collect());
    // The trace extension is a chat chunk's.
    let trace = trace && kind == Kind::Chat;
    // The first event tells whether the prompt was accepted: errors before any output are
    // plain HTTP errors, also for streaming requests.
    let (rx, started) = submit(&s, spec, tenant, trace, peer.as_ref(), session.as_deref()).await?;
    let id = new_id(if kind == Kind::Chat { "chatcmpl" } else { "cmpl" });
    let timer = RequestTimer::new(s.metrics.clone(), tenant, arrived.0);
    let meta = Meta {
        id,
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
    if stream {
        return Ok(sse(sse_events(rx, meta, timer), started.is_some()));
    }
    let mut whole = Whole { rx, meta, timer, text: String::new(), logprobs: None };
    let Some(peer) = peer else { return whole.finish().await };
    if started.is_none() {
        return Ok(whole.probe_while_waiting());
    }
    tokio::select! {
        answer = whole.next() => answer.map(|v| Json(v).into_response()),
        // The client closed its side: it half-closed and still reads, or it is gone. Only
        // writing tells them apart, so the answer becomes a streamed body that sends a space
        // (JSON allows leading whitespace) while it waits: a client still there reads the answer
        // after them; to a client gone the second write fails, hyper drops the body, and the
        // dropped receiver cancels the generation at its next step.
        _ = peer.closed() => Ok(whole.probe_while_waiting()),
    }
}

/// A queued request that started: what its `Started` event said.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start {
    /// See [`Event::Started`].
    pub fenced_calls: bool,
}

/// Queue a request and wait for its first event (see [`first_event`]): its events, and what its
/// start said (None: its client closed while it waited). The first event tells whether the
/// prompt was accepted: errors before any output are plain HTTP errors, also for streams.
pub(crate) async fn submit(
    s: &AppState,
    spec: JobSpec,
    tenant: Tenant,
    trace: bool,
    peer: Option<&PeerClosed>,
    session: Option<&str>,
) -> Result<(UnboundedReceiver<Event>, Option<Start>), ApiError> {
    s.lifecycle.check()?;
    s.metrics.session_turn(tenant, session);
    let (tx, mut rx) = unbounded_channel();
    let job = Job::new(spec, tenant, trace, tx);
    let peer_left = job.peer_left.clone();
    s.backend.submit(job)?;
    let started = first_event(&mut rx, peer, &peer_left).await?;
    Ok((rx, started))
}

/// A streamed answer. One that begins while its request still waits (its client closed:
/// `started` false) sends comments while nothing else goes out, so a client gone is told apart
/// from one that only half-closed by whether these writes fail.
pub(crate) fn sse<S>(events: S, started: bool) -> Response
where
    S: Stream<Item = Result<SseEvent, Infallible>> + Send + 'static,
{
    let events = Sse::new(events);
    if started {
        events.into_response()
    } else {
        events.keep_alive(KeepAlive::new().interval(PROBE_EVERY).text("")).into_response()
    }
}

/// Wait for a queued request's first event: `Some` once it started, an error if it was refused
/// before any output (a plain HTTP error), or `None` when its client closed its side while it
/// waited. Hyper does not read a connection while its request is in flight, so only the socket
/// tells (see [`PeerClosed`]): the request stops counting toward the queue's bound at once
/// (`peer_left`), and the caller answers with a body that probes (spaces, SSE comments) while it
/// waits: to a client gone the writes fail, the body and its receiver are dropped, and the queue
/// drops the request (`queue.rs`) instead of keeping its place until a lane frees.
async fn first_event(
    rx: &mut UnboundedReceiver<Event>,
    peer: Option<&PeerClosed>,
    peer_left: &AtomicBool,
) -> Result<Option<Start>, ApiError> {
    let event = match peer {
        None => rx.recv().await,
        Some(peer) => tokio::select! {
            event = rx.recv() => event,
            _ = peer.closed() => {
                peer_left.store(true, Ordering::Relaxed);
                return Ok(None);
            }
        },
    };
    match event {
        Some(Event::Started { fenced_calls, .. }) => Ok(Some(Start { fenced_calls })),
        Some(Event::Error(e)) => Err(e),
        _ => Err(ApiError::internal("the model thread stopped")),
    }
}

/// A non-streamed answer being gathered.
struct Whole {
    rx: UnboundedReceiver<Event>,
    meta: Meta,
    timer: RequestTimer,
    text: String,
    logprobs: Option<ChoiceLogprobs>,
}

/// How often a non-streamed answer to a closed connection writes a space.
pub(crate) const PROBE_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

impl Whole {
    /// Take the next event: `Some` with the response when the generation ended.
    fn take(&mut self, event: Option<Event>) -> Option<Result<serde_json::Value, ApiError>> {
        match event {
            Some(Event::Logprobs(l)) => {
                self.logprobs.get_or_insert_with(ChoiceLogprobs::default).content.extend(l)
            }
            Some(Event::Text(t)) => {
                if !t.is_empty() {
                    self.timer.text();
                }
                self.text.push_str(&t)
            }
            Some(Event::Done(f)) => {
                self.timer.done();
                let text = std::mem::take(&mut self.text);
                return Some(Ok(self.meta.full(text, &f, self.logprobs.take())));
            }
            Some(Event::Error(e)) => return Some(Err(e)),
            Some(Event::Started { .. }) | Some(Event::Trace(_)) => {}
            None => return Some(Err(ApiError::internal("the generation ended without a result"))),
        }
        None
    }

    /// The whole answer (cancel-safe: everything taken so far stays in `self`).
    async fn next(&mut self) -> Result<serde_json::Value, ApiError> {
        loop {
            let event = self.rx.recv().await;
            if let Some(answer) = self.take(event) {
                return answer;
            }
        }
    }

    /// The whole answer as a JSON response.
    async fn finish(mut self) -> Result<Response, ApiError> {
        self.next().await.map(|v| Json(v).into_response())
    }

    /// A 200 whose body is a space every [`PROBE_EVERY`] until the answer, then the answer (an
    /// error that comes now is an error object in that body: the status is gone).
    fn probe_while_waiting(self) -> Response {
        let body = stream::unfold(Some(self), |whole| async move {
            let mut whole = whole?;
            let chunk = match tokio::time::timeout(PROBE_EVERY, whole.next()).await {
                Err(_) => return Some((Ok::<_, Infallible>(Bytes::from_static(b" ")), Some(whole))),
                Ok(Ok(v)) => v.to_string(),
                Ok(Err(e)) => e.body().to_string(),
            };
            Some((Ok(Bytes::from(chunk)), None))
        });
        ([(header::CONTENT_TYPE, "application/json")], axum::body::Body::from_stream(body)).into_response()
    }
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    include_usage: bool,
    /// The answer is a forced tool call (chat only).
    tool_call: bool,
    /// The answer may be a call of these tools (`tool_choice: "auto"`).
    auto_tools: Option<Vec<String>>,
    /// An answer opening with a ```` ```json ```` fence is decoded under the call grammar to its
    /// end (one call): it streams as `tool_calls` pieces from the call's name on.
    fenced_calls: bool,
    /// Stream each chunk's provenance and the statistics (`X-Treespec-Trace: 1`, chat only).
    trace: bool,
    /// The server's plain decoding rate, for the trace's finish chunk.
    plain_rate: Option<f64>,
}

/// The tool-call reader of a response whose answer is a call.
fn call_text(tool_call: bool) -> Option<ToolCallText> {
    tool_call.then(|| ToolCallText::new(call_id()))
}

/// A new tool call id (`call_…`).
fn call_id() -> String {
    format!("call_{}", &new_id("c")[2..])
}

/// The finish reason of a tool call: `tool_calls`, or `length` when it was cut.
fn call_finish(f: &Finished) -> &'static str {
    if f.finish_reason == "length" {
        "length"
    } else {
        "tool_calls"
    }
}

/// The reply message and finish reason: text, or the tool call parsed out of it (text again
/// when it was cut before the call's arguments began). With `tool_choice: "auto"`, a text that
/// is exactly one call of a declared tool is that call.
fn chat_message(
    text: String,
    f: &Finished,
    tool_call: bool,
    auto: Option<&[String]>,
) -> (ResponseMessage, &'static str) {
    let auto_call = auto.and_then(|names| structured::auto_call(&text, names));
    if let Some(mut call) = call_text(tool_call || auto_call.is_some()) {
        call.push(auto_call.as_deref().unwrap_or(&text));
        if let Some((_, call)) = call.finish() {
            let message = ResponseMessage { role: "assistant", content: None, tool_calls: Some(vec![call]) };
            return (message, call_finish(f));
        }
    }
    (ResponseMessage { role: "assistant", content: Some(text), tool_calls: None }, f.finish_reason)
}

impl Meta {
    fn full(&self, text: String, f: &Finished, logprobs: Option<ChoiceLogprobs>) -> serde_json::Value {
        let usage = usage(f);
        let stats = TreespecStats::of(f);
        match self.kind {
            Kind::Chat => {
                let (message, finish_reason) =
                    chat_message(text, f, self.tool_call, self.auto_tools.as_deref());
                to_json(&ChatCompletionResponse {
                    id: self.id.clone(),
                    object: "chat.completion",
                    created: self.created,
                    model: self.model.clone(),
                    choices: vec![ChatChoice { index: 0, message, logprobs, finish_reason }],
                    usage,
                    timings: f.timings(),
                    treespec: stats,
                })
            }
            Kind::Completion => to_json(&CompletionResponse {
                id: self.id.clone(),
                object: "text_completion",
                created: self.created,
                model: self.model.clone(),
                choices: vec![CompletionChoice {
                    index: 0,
                    text,
                    logprobs: None,
                    finish_reason: Some(f.finish_reason),
                }],
                usage: Some(usage),
                timings: Some(f.timings()),
                treespec: Some(stats),
            }),
        }
    }

    /// A chunk carrying only log-probabilities (chat), sent just before the step's text.
    fn logprobs_chunk(&self, content: Vec<LogprobEntry>) -> SseEvent {
        let value = to_json(&ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices: vec![ChunkChoice {
                index: 0,
                delta: text_delta(String::new()),
                logprobs: Some(ChoiceLogprobs { content }),
                finish_reason: None,
            }],
            usage: None,
            timings: None,
            treespec: None,
        });
        SseEvent::default().data(value.to_string())
    }

    /// One streamed chunk: a delta and/or finish reason, or (with `usage`) the usage chunk.
    fn chunk(&self, delta: Delta, finish: Option<&'static str>, usage: Option<Usage>) -> SseEvent {
        self.traced(delta, finish, usage, None)
    }

    /// [`Meta::chunk`] with the trace extension (chat chunks only carry it).
    fn traced(
        &self,
        delta: Delta,
        finish: Option<&'static str>,
        usage: Option<Usage>,
        trace: Option<ChunkTrace>,
    ) -> SseEvent {
        self.last(delta, finish, usage, trace.map(ChunkTreespec::Trace), None)
    }

    /// [`Meta::traced`] with what the last chunks add: the request's `timings` (the last chunk
    /// before `[DONE]`) and, in the usage chunk, its statistics as `treespec`.
    fn last(
        &self,
        delta: Delta,
        finish: Option<&'static str>,
        usage: Option<Usage>,
        treespec: Option<ChunkTreespec>,
        timings: Option<Timings>,
    ) -> SseEvent {
        let value = match self.kind {
            Kind::Chat => to_json(&ChatCompletionChunk {
                id: self.id.clone(),
                object: "chat.completion.chunk",
                created: self.created,
                model: self.model.clone(),
                choices: if usage.is_some() {
                    vec![]
                } else {
                    vec![ChunkChoice { index: 0, delta, logprobs: None, finish_reason: finish }]
                },
                usage,
                timings,
                treespec,
            }),
            Kind::Completion => to_json(&CompletionResponse {
                id: self.id.clone(),
                object: "text_completion",
                created: self.created,
                model: self.model.clone(),
                choices: if usage.is_some() {
                    vec![]
                } else {
                    vec![CompletionChoice {
                        index: 0,
                        text: delta.content.unwrap_or_default(),
                        logprobs: None,
                        finish_reason: finish,
                    }]
                },
                usage,
                timings,
                treespec: match treespec {
                    Some(ChunkTreespec::Stats(s)) => Some(s),
                    _ => None,
                },
            }),
        };
        SseEvent::default().data(value.to_string())
    }
}

impl TreespecStats {
    fn of(f: &Finished) -> Self {
        TreespecStats {
            method: f.method.clone(),
            target_forwards: f.stats.target_forwards,
            // The engine's own figure: tokens emitted per target forward (stop-string trimming
            // and end-of-text tokens do not change what each forward produced).
            mean_accepted: f.stats.mean_accepted(),
        }
    }
}

fn to_json<T: Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_default()
}

enum Phase {
    First,
    Streaming,
    Finished,
}

/// A text delta.
fn text_delta(text: String) -> Delta {
    Delta { content: Some(text), ..Delta::default() }
}

/// The SSE body: a role chunk (chat), text chunks (or tool-call pieces), a finish chunk, the
/// usage chunk if asked, `[DONE]`. Dropping this stream (client gone) drops the receiver, which
/// cancels the job.
fn sse_events(
    rx: UnboundedReceiver<Event>,
    meta: Meta,
    timer: RequestTimer,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let call = call_text(meta.tool_call);
    // A free answer that may be a call is held back while it still may be (`tool_choice: auto`).
    let held = meta.auto_tools.as_ref().map(|_| String::new());
    let state = SseState { rx, meta, timer, held, spans: Vec::new(), call, phase: Phase::First };
    stream::unfold(state, |mut state| async move {
        let events = state.next().await?;
        Some((events, state))
    })
    .flat_map(|events| stream::iter(events.into_iter().map(Ok)))
}

/// What the SSE body keeps between the job's events.
struct SseState {
    rx: UnboundedReceiver<Event>,
    meta: Meta,
    timer: RequestTimer,
    /// The answer held back while it may still be a tool call (`tool_choice: auto`).
    held: Option<String>,
    /// The provenance of the coming text (traced requests).
    spans: Vec<TextSpan>,
    /// Turns a forced tool call's JSON into `tool_calls` pieces.
    call: Option<ToolCallText>,
    phase: Phase,
}

impl SseState {
    /// The next events to send; `None` once the stream is over.
    async fn next(&mut self) -> Option<Vec<SseEvent>> {
        match self.phase {
            Phase::First if self.meta.kind == Kind::Chat => {
                self.phase = Phase::Streaming;
                let content = (!self.meta.tool_call).then(String::new);
                let role = Delta { role: Some("assistant"), content, ..Delta::default() };
                Some(vec![self.meta.chunk(role, None, None)])
            }
            Phase::First | Phase::Streaming => {
                let out = loop {
                    let event = self.rx.recv().await;
                    if let Some(out) = self.on_event(event) {
                        break out;
                    }
                };
                // Only the end (finish or error, then `[DONE]`) comes as more than one event.
                self.phase = if out.len() > 1 { Phase::Finished } else { Phase::Streaming };
                Some(out)
            }
            Phase::Finished => None,
        }
    }

    /// The chunks one job event makes, if any (`None` event: the job ended without a result).
    fn on_event(&mut self, event: Option<Event>) -> Option<Vec<SseEvent>> {
        match event {
            Some(Event::Text(t)) if t.is_empty() => None,
            Some(Event::Logprobs(l)) => Some(vec![self.meta.logprobs_chunk(l)]),
            Some(Event::Trace(s)) => {
                if self.meta.trace {
                    self.spans = s;
                }
                None
            }
            Some(Event::Text(t)) => self.on_text(t),
            Some(Event::Started { fenced_calls, .. }) => {
                self.meta.fenced_calls = fenced_calls;
                None
            }
            Some(Event::Done(f)) => Some(self.on_done(&f)),
            Some(Event::Error(e)) => Some(error_chunks(&e)),
            None => Some(error_chunks(&ApiError::internal("the generation ended without a result"))),
        }
    }

    /// New text: a text chunk (traced when asked), a tool call's pieces, or nothing yet (held
    /// back as a possible call, or a call piece still incomplete).
    fn on_text(&mut self, t: String) -> Option<Vec<SseEvent>> {
        self.timer.text();
        let t = match self.held.as_mut() {
            Some(h) => {
                h.push_str(&t);
                if let Some(first) = self.fenced_call_begins() {
                    return Some(first);
                }
                if structured::may_be_call(self.held.as_deref().unwrap_or_default()) {
                    return None;
                }
                self.held.take().unwrap_or_default()
            }
            None => t,
        };
        let meta = &self.meta;
        match self.call.as_mut() {
            // Spans describe the step's text as it came (a held answer's text is not a step's).
            None if meta.trace && meta.auto_tools.is_none() => {
                let trace = ChunkTrace { spans: std::mem::take(&mut self.spans), ..Default::default() };
                Some(vec![meta.traced(text_delta(t), None, None, Some(trace))])
            }
            None => Some(vec![meta.chunk(text_delta(t), None, None)]),
            Some(c) => {
                let pieces = c.push(&t);
                (!pieces.is_empty()).then(|| {
                    vec![meta.chunk(Delta { tool_calls: Some(pieces), ..Delta::default() }, None, None)]
                })
            }
        }
    }

    /// A held answer that opened with the call fence, once its header names a declared tool:
    /// the call grammar decodes the rest of it (`fenced_calls`), so it is that call, and it
    /// streams from here as `tool_calls` pieces (the first: id and name) instead of waiting for
    /// its end. `Some` once it began: its first chunk (the header, and any arguments so far).
    fn fenced_call_begins(&mut self) -> Option<Vec<SseEvent>> {
        let meta = &self.meta;
        let body = self.held.as_deref()?.strip_prefix(FENCED_CALL.0).filter(|_| meta.fenced_calls)?;
        let mut call = ToolCallText::fenced(call_id());
        let pieces = call.push(body);
        let names = meta.auto_tools.as_deref().unwrap_or_default();
        if !call.name().is_some_and(|n| names.iter().any(|d| d == n)) {
            return None; // the header is not whole yet (or names no declared tool: held)
        }
        self.held = None;
        self.call = Some(call);
        Some(vec![meta.chunk(Delta { tool_calls: Some(pieces), ..Delta::default() }, None, None)])
    }

    /// The end: a held answer resolved (one call of a declared tool, or text after all), then
    /// the finish chunks.
    fn on_done(&mut self, f: &Finished) -> Vec<SseEvent> {
        self.timer.done();
        let meta = &self.meta;
        let Some(h) = self.held.take().filter(|h| !h.is_empty()) else {
            return finish_chunks(meta, self.call.as_mut(), f);
        };
        let names = meta.auto_tools.as_deref().unwrap_or_default();
        let Some(canonical) = structured::auto_call(&h, names) else {
            let mut out = vec![meta.chunk(text_delta(h), None, None)];
            out.extend(finish_chunks(meta, None, f));
            return out;
        };
        let mut c = call_text(true).expect("a call reader");
        let pieces = c.push(&canonical);
        let mut out = vec![meta.chunk(Delta { tool_calls: Some(pieces), ..Delta::default() }, None, None)];
        out.extend(finish_chunks(meta, Some(&mut c), f));
        out
    }
}

/// The last chunks: the tool call's last piece (or its text, if it never became a call), the
/// finish reason, the usage if asked, `[DONE]`.
fn finish_chunks(meta: &Meta, call: Option<&mut ToolCallText>, f: &Finished) -> Vec<SseEvent> {
    let mut out = Vec::new();
    let mut finish = f.finish_reason;
    if let Some(call) = call {
        match call.finish() {
            Some((last, _)) => {
                finish = call_finish(f);
                if let Some(last) = last {
                    out.push(meta.chunk(
                        Delta { tool_calls: Some(vec![last]), ..Delta::default() },
                        None,
                        None,
                    ));
                }
            }
            None if !call.text().is_empty() => {
                out.push(meta.chunk(text_delta(call.text().into()), None, None))
            }
            None => {}
        }
    }
    let trace = meta.trace.then(|| ChunkTrace {
        spans: Vec::new(),
        stats: Some(TreespecStats::of(f)),
        plain_tokens_per_second: meta.plain_rate,
    });
    // As llama-server does, the last chunk before `[DONE]` (the usage chunk when asked for, else
    // the finish chunk) carries the timings; the usage chunk also the statistics (a finish chunk
    // gets none: its `treespec` is the trace's, or absent as in OpenAI's).
    let finish_timings = (!meta.include_usage).then(|| f.timings());
    out.push(meta.last(
        Delta::default(),
        Some(finish),
        None,
        trace.map(ChunkTreespec::Trace),
        finish_timings,
    ));
    if meta.include_usage {
        let stats = Some(ChunkTreespec::Stats(TreespecStats::of(f)));
        out.push(meta.last(Delta::default(), None, Some(usage(f)), stats, Some(f.timings())));
    }
    out.push(SseEvent::default().data("[DONE]"));
    out
}

/// A finished request's token usage.
fn usage(f: &Finished) -> Usage {
    Usage::new(f.prompt_tokens, f.completion_tokens, f.cached_tokens)
}

/// An error in the stream, then `[DONE]`.
fn error_chunks(e: &ApiError) -> Vec<SseEvent> {
    vec![SseEvent::default().data(e.body().to_string()), SseEvent::default().data("[DONE]")]
}

#[cfg(test)]
mod tests {
    use super::*;
    use treespec_core::stats::DecodeStats;

    fn meta(auto: bool) -> Meta {
        Meta {
            id: "chatcmpl-x".into(),
            created: 0,
            model: "m".into(),
            kind: Kind::Chat,
            include_usage: false,
            tool_call: false,
            auto_tools: auto.then(|| vec!["get_weather".to_string()]),
            fenced_calls: auto,
            trace: false,
            plain_rate: None,
        }
    }

    fn done() -> Event {
        Event::Done(Finished {
            finish_reason: "stop",
            prompt_tokens: 3,
            cached_tokens: 0,
            completion_tokens: 5,
            method: "plain".into(),
            stats: DecodeStats::default(),
            stopping_word: None,
        })
    }

    /// The `data:` JSON chunks a stream sends for `events` (the role chunk first, `[DONE]` last
    /// dropped).
    async fn chunks(meta: Meta, events: Vec<Event>) -> Vec<serde_json::Value> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for e in events {
            tx.send(e).unwrap();
        }
        drop(tx);
        let timer =
            RequestTimer::new(Arc::new(Metrics::default()), Tenant::SHARED, std::time::Instant::now());
        let out: Vec<_> = sse_events(rx, meta, timer).collect().await;
        // An axum SSE event renders as "data: …\n\n".
        out.into_iter()
            .map(|e| axum::body::to_bytes(Sse::new(stream::iter([e])).into_response().into_body(), 1 << 20))
            .collect::<futures_util::stream::FuturesOrdered<_>>()
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .filter_map(|b| {
                let text = String::from_utf8(b.ok()?.to_vec()).ok()?;
                serde_json::from_str(text.trim().strip_prefix("data: ")?).ok()
            })
            .collect()
    }

    #[tokio::test]
    async fn an_auto_answer_that_is_a_call_streams_as_tool_calls() {
        let events = vec![
            Event::Text("{\"name\": \"get_weather\", ".into()),
            Event::Text("\"arguments\": {\"city\": \"Paris\"}}".into()),
            done(),
        ];
        let c = chunks(meta(true), events).await;
        let contents: String =
            c.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(contents, "", "nothing of the call leaks as text: {c:?}");
        let call = c.iter().find_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned()).unwrap();
        assert_eq!(call[0]["function"]["name"], "get_weather");
        let last = &c[c.len() - 1];
        assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
    }

    #[tokio::test]
    async fn a_fenced_auto_call_streams_from_its_name_on() {
        let events = vec![
            Event::Text("```json\n{\"name\": \"get_".into()),
            Event::Text("weather\", \"arguments\": {".into()),
            Event::Text("\"city\": \"Paris\"".into()),
            Event::Text(", \"days\": 2}}\n```".into()),
            done(),
        ];
        let c = chunks(meta(true), events).await;
        let calls: Vec<&serde_json::Value> =
            c.iter().filter(|c| c["choices"][0]["delta"]["tool_calls"].is_array()).collect();
        // The name went out with the second piece of text, the arguments as they came.
        assert!(calls.len() >= 3, "streamed in pieces, not whole at the end: {c:?}");
        assert_eq!(calls[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "get_weather");
        let args: String = calls
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
            .collect();
        assert_eq!(args, r#"{"city": "Paris", "days": 2}"#);
        let contents: String =
            c.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(contents, "", "nothing of the call leaks as text");
        assert_eq!(c[c.len() - 1]["choices"][0]["finish_reason"], "tool_calls");
        // Without the call grammar behind the fence, the answer is held to its end as before.
        let mut unconstrained = meta(true);
        unconstrained.fenced_calls = false;
        let events = vec![Event::Text("```json\n{\"name\": \"get_weather\", \"arguments\": {}}".into())];
        let c =
            chunks(unconstrained, events.into_iter().chain([Event::Text("\n```".into()), done()]).collect())
                .await;
        let calls = c.iter().filter(|c| c["choices"][0]["delta"]["tool_calls"].is_array()).count();
        assert_eq!(calls, 1, "held to its end, then sent whole: {c:?}");
    }

    #[tokio::test]
    async fn an_auto_answer_that_is_text_streams_as_text() {
        for (events, want) in [
            (vec![Event::Text("Hel".into()), Event::Text("lo".into()), done()], "Hello"),
            // Looked like a call at first, but was not one.
            (
                vec![Event::Text("{not json".into()), Event::Text(" at all".into()), done()],
                "{not json at all",
            ),
        ] {
            let c = chunks(meta(true), events).await;
            let contents: String =
                c.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
            assert_eq!(contents, want);
            assert_eq!(c[c.len() - 1]["choices"][0]["finish_reason"], "stop");
        }
    }

    #[test]
    fn a_whole_auto_answer_that_is_a_call_becomes_tool_calls() {
        let Event::Done(f) = done() else { unreachable!() };
        let names = ["get_weather".to_string()];
        let text = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>";
        let (m, finish) = chat_message(text.into(), &f, false, Some(&names));
        assert_eq!((m.content, finish), (None, "tool_calls"));
        assert_eq!(m.tool_calls.unwrap()[0].function.name, "get_weather");
        let (m, finish) = chat_message("It is sunny.".into(), &f, false, Some(&names));
        assert_eq!((m.content.as_deref(), finish), (Some("It is sunny."), "stop"));
    }
}
