//! One response lifecycle for every completion route: submit → first event → stream | gather |
//! probe. The OpenAI routes and llama-server's `/completion` differ only in their wire format
//! (a [`Wire`]); how a request is queued, how its first event turns into a plain HTTP error,
//! how a whole answer is gathered, how a client that half-closed is kept waiting and how a
//! client gone cancels its generation are written once, here (as llama.cpp's server has one
//! `handle_completions_impl` for all its completion routes).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Bytes;
use axum::http::header;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt};
use serde::Serialize;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::api::{ChoiceLogprobs, LogprobEntry, TextSpan, TreespecStats};
use crate::error::ApiError;
use crate::http::serve::PeerClosed;
use crate::http::state::{AppState, Arrived};
use crate::intake::validate::CheckedBody;
use crate::metrics::RequestTimer;
use crate::scheduling::job::{Event, Finished, Job};
use crate::tenant::Tenant;

/// How often a response to a client that closed its side writes a probe (a space, or an SSE
/// comment) while nothing else goes out.
pub(crate) const PROBE_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// A validated request, whose it is, and how to tell that its client left.
pub(crate) struct Submitted {
    pub spec: CheckedBody,
    pub tenant: Tenant,
    pub peer: Option<PeerClosed>,
    /// `X-Treespec-Trace: 1`: stream provenance and statistics (chat only).
    pub trace: bool,
    /// The conversation it continues, if it names one (`gateway::session_key`).
    pub session: Option<String>,
}

/// A queued request that started: what its `Started` event said.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start {
    /// See [`Event::Started`].
    pub fenced_calls: bool,
}

/// An API's wire format: what its answers look like, streamed or whole. Everything else about
/// a response is [`respond`]'s.
pub(crate) trait Wire: Send + 'static {
    /// The chunks that open a stream before any event (chat: the role chunk).
    fn opening(&mut self) -> Vec<SseEvent> {
        Vec::new()
    }
    /// The chunks of new text (none yet: held back, e.g. a possible tool call).
    fn text(&mut self, text: String) -> Vec<SseEvent>;
    /// The chunks of one step's log-probabilities (sent just before that step's text).
    fn logprobs(&mut self, _entries: Vec<LogprobEntry>) -> Vec<SseEvent> {
        Vec::new()
    }
    /// The provenance of the coming text (traced requests).
    fn trace(&mut self, _spans: Vec<TextSpan>) {}
    /// The request started (a stream that began while it was queued learns it here).
    fn started(&mut self, _fenced_calls: bool) {}
    /// The last chunks of a finished generation.
    fn done(&mut self, f: &Finished) -> Vec<SseEvent>;
    /// The last chunks of a stream that failed after it began.
    fn error(&mut self, e: &ApiError) -> Vec<SseEvent>;
    /// The whole answer, as a JSON body.
    fn whole(&self, text: String, logprobs: Option<ChoiceLogprobs>, f: &Finished) -> String;
}

/// The lifecycle: queue the request, wait for its first event (an error before any output is a
/// plain HTTP error, also for streams), then stream it, or gather it whole — writing probes
/// while it is made when the client closed its side. `wire` makes the format once the start is
/// known (None: the client closed while the request waited).
pub(crate) async fn respond<W: Wire>(
    s: &AppState,
    job: Submitted,
    arrived: Arrived,
    wire: impl FnOnce(Option<Start>) -> W,
) -> Result<Response, ApiError> {
    let Submitted { spec, tenant, peer, trace, session } = job;
    let stream = spec.stream;
    let (rx, started) = submit(s, spec, tenant, trace, peer.as_ref(), session.as_deref()).await?;
    let wire = wire(started);
    let timer = RequestTimer::new(s.metrics.clone(), tenant, arrived.0);
    if stream {
        let response = sse(sse_events(rx, wire, timer), started.is_some());
        return Ok(if started.is_some() { response } else { client_closed(response) });
    }
    let mut whole: Whole = Box::pin(gather(rx, wire, timer));
    let Some(peer) = peer else { return whole.await.map(json_body) };
    if started.is_none() {
        return Ok(client_closed(probe_while_waiting(whole)));
    }
    tokio::select! {
        answer = &mut whole => answer.map(json_body),
        // The client closed its side: it half-closed and still reads, or it is gone. Only
        // writing tells them apart, so the answer becomes a streamed body that sends a space
        // (JSON allows leading whitespace) while it waits: a client still there reads the answer
        // after them; to a client gone the second write fails, hyper drops the body, and the
        // dropped receiver cancels the generation at its next step.
        _ = peer.closed() => Ok(client_closed(probe_while_waiting(whole))),
    }
}

/// Marks a response whose client had closed its side before it began (see [`ClientClosed`]).
fn client_closed(mut response: Response) -> Response {
    response.extensions_mut().insert(ClientClosed);
    response
}

/// A response begun after its client closed its side (gone, or, rarely, only half-closed and
/// still reading): `/metrics` counts it apart from the answers a client received, under
/// status 499 (nginx's "client closed request").
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientClosed;

/// Queue a request and wait for its first event (see [`first_event`]): its events, and what its
/// start said (None: its client closed while it waited).
async fn submit(
    s: &AppState,
    spec: CheckedBody,
    tenant: Tenant,
    trace: bool,
    peer: Option<&PeerClosed>,
    session: Option<&str>,
) -> Result<(UnboundedReceiver<Event>, Option<Start>), ApiError> {
    s.draining.check()?;
    s.metrics.session_turn(tenant, session);
    let (tx, mut rx) = unbounded_channel();
    let job = Job::new(spec, tenant, trace, tx);
    let peer_left = job.peer_left.clone();
    s.backend.submit(job)?;
    let started = first_event(&mut rx, peer, &peer_left).await?;
    Ok((rx, started))
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

/// A streamed answer. One that begins while its request still waits (its client closed:
/// `started` false) sends comments while nothing else goes out, so a client gone is told apart
/// from one that only half-closed by whether these writes fail.
fn sse<S>(events: S, started: bool) -> Response
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

/// What the SSE body keeps between the job's events.
struct Streaming<W> {
    rx: UnboundedReceiver<Event>,
    wire: W,
    timer: RequestTimer,
    opened: bool,
    over: bool,
}

impl<W: Wire> Streaming<W> {
    /// The next chunks to send; `None` once the stream is over.
    async fn next(&mut self) -> Option<Vec<SseEvent>> {
        if self.over {
            return None;
        }
        if !self.opened {
            self.opened = true;
            let opening = self.wire.opening();
            if !opening.is_empty() {
                return Some(opening);
            }
        }
        loop {
            let event = self.rx.recv().await;
            let (out, last) = match event {
                Some(Event::Text(t)) if t.is_empty() => continue,
                Some(Event::Text(t)) => {
                    self.timer.text();
                    (self.wire.text(t), false)
                }
                Some(Event::Logprobs(l)) => (self.wire.logprobs(l), false),
                Some(Event::Trace(spans)) => {
                    self.wire.trace(spans);
                    continue;
                }
                Some(Event::Started { fenced_calls, .. }) => {
                    self.wire.started(fenced_calls);
                    continue;
                }
                Some(Event::Done(f)) => {
                    self.timer.done();
                    (self.wire.done(&f), true)
                }
                Some(Event::Error(e)) => (self.wire.error(&e), true),
                None => (self.wire.error(&ApiError::internal("the generation ended without a result")), true),
            };
            if last || !out.is_empty() {
                self.over = last;
                return Some(out);
            }
        }
    }
}

/// The SSE body of a job's events in `wire`'s format. Dropping this stream (client gone) drops
/// the receiver, which cancels the job.
pub(crate) fn sse_events<W: Wire>(
    rx: UnboundedReceiver<Event>,
    wire: W,
    timer: RequestTimer,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let state = Streaming { rx, wire, timer, opened: false, over: false };
    stream::unfold(state, |mut state| async move {
        let events = state.next().await?;
        Some((events, state))
    })
    .flat_map(|events| stream::iter(events.into_iter().map(Ok)))
}

/// A whole answer being made: its JSON body, or the error that ended it.
type Whole = Pin<Box<dyn Future<Output = Result<String, ApiError>> + Send>>;

/// Gather a job's text (and log-probabilities) to its end, in `wire`'s format (cancel-safe when
/// pinned: everything taken so far stays in the future).
async fn gather<W: Wire>(
    mut rx: UnboundedReceiver<Event>,
    wire: W,
    mut timer: RequestTimer,
) -> Result<String, ApiError> {
    let mut text = String::new();
    let mut logprobs: Option<ChoiceLogprobs> = None;
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => {
                if !t.is_empty() {
                    timer.text();
                }
                text.push_str(&t);
            }
            Some(Event::Logprobs(l)) => {
                logprobs.get_or_insert_with(ChoiceLogprobs::default).content.extend(l)
            }
            Some(Event::Done(f)) => {
                timer.done();
                return Ok(wire.whole(text, logprobs, &f));
            }
            Some(Event::Error(e)) => return Err(e),
            // Starts and traces are a stream's.
            Some(Event::Started { .. }) | Some(Event::Trace(_)) => {}
            None => return Err(ApiError::internal("the generation ended without a result")),
        }
    }
}

/// A JSON body as a response.
fn json_body(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A 200 whose body is a space every [`PROBE_EVERY`] until the answer, then the answer (an error
/// that comes now is an error object in that body: the status is gone).
fn probe_while_waiting(whole: Whole) -> Response {
    let body = stream::unfold(Some(whole), |whole| async move {
        let mut whole = whole?;
        let chunk = match tokio::time::timeout(PROBE_EVERY, &mut whole).await {
            Err(_) => return Some((Ok::<_, Infallible>(Bytes::from_static(b" ")), Some(whole))),
            Ok(Ok(body)) => body,
            Ok(Err(e)) => e.body().to_string(),
        };
        Some((Ok(Bytes::from(chunk)), None))
    });
    ([(header::CONTENT_TYPE, "application/json")], axum::body::Body::from_stream(body)).into_response()
}

/// A response value as JSON text (every wire format's).
pub(crate) fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

impl TreespecStats {
    /// treespec's statistics of a finished generation, as every route gives them.
    pub(crate) fn of(f: &Finished) -> Self {
        TreespecStats {
            method: f.method.clone(),
            target_forwards: f.stats.target_forwards,
            // The engine's own figure: tokens emitted per target forward (stop-string trimming
            // and end-of-text tokens do not change what each forward produced).
            mean_accepted: f.stats.mean_accepted(),
        }
    }
}
