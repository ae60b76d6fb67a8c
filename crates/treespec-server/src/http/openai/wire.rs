//! The OpenAI routes' wire format (`/v1/chat/completions`, `/v1/completions`): chunks, whole
//! answers, tool calls read out of the text. The response's lifecycle is [`crate::http::respond`]'s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::response::sse::Event as SseEvent;

use crate::api::*;
use crate::error::ApiError;
use crate::http::respond::{to_json, Wire};
use crate::http::tool_calls::ToolCallText;
use crate::intake::structured;
use crate::scheduling::job::Finished;
use treespec_grammar::FENCED_CALL;

/// Which OpenAI object the answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Chat,
    Completion,
}

/// Seconds since the Unix epoch.
pub(crate) fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A new response id (`PREFIX-…`).
pub(crate) fn new_id(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{prefix}-{n:x}{nanos:08x}")
}

/// What every chunk and the whole answer of one request repeat.
pub(crate) struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub kind: Kind,
    pub include_usage: bool,
    /// The answer is a forced tool call (chat only).
    pub tool_call: bool,
    /// The answer may be a call of these tools (`tool_choice: "auto"`).
    pub auto_tools: Option<Vec<String>>,
    /// An answer opening with a ```` ```json ```` fence is decoded under the call grammar to its
    /// end (one call): it streams as `tool_calls` pieces from the call's name on.
    pub fenced_calls: bool,
    /// Stream each chunk's provenance and the statistics (`X-Treespec-Trace: 1`, chat only).
    pub trace: bool,
    /// The server's plain decoding rate, for the trace's finish chunk.
    pub plain_rate: Option<f64>,
}

/// The tool-call reader of a response whose answer is a call.
fn call_text(tool_call: bool) -> Option<ToolCallText> {
    tool_call.then(|| ToolCallText::new(call_id()))
}

/// A new tool call id (`call_…`).
fn call_id() -> String {
    format!("call_{}", &new_id("c")[2..])
}

/// The finish reason of a tool call: `tool_calls`, or why it was cut (`length`, `shutdown`).
fn call_finish(f: &Finished) -> &'static str {
    if f.finish_reason == "stop" {
        "tool_calls"
    } else {
        f.finish_reason
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
    fn full(&self, text: String, f: &Finished, logprobs: Option<ChoiceLogprobs>) -> String {
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
        SseEvent::default().data(value)
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
        SseEvent::default().data(value)
    }
}

/// A text delta.
fn text_delta(text: String) -> Delta {
    Delta { content: Some(text), ..Delta::default() }
}

/// The OpenAI routes' wire format: a role chunk (chat), text chunks (or tool-call pieces), a
/// finish chunk, the usage chunk if asked, `[DONE]`; whole answers as `chat.completion` or
/// `text_completion` objects.
pub(crate) struct OpenAiWire {
    meta: Meta,
    /// The answer held back while it may still be a tool call (`tool_choice: auto`).
    held: Option<String>,
    /// The provenance of the coming text (traced requests).
    spans: Vec<TextSpan>,
    /// Turns a forced tool call's JSON into `tool_calls` pieces.
    call: Option<ToolCallText>,
}

impl OpenAiWire {
    pub(crate) fn new(meta: Meta) -> Self {
        let call = call_text(meta.tool_call);
        // A free answer that may be a call is held back while it still may be (`tool_choice: auto`).
        let held = meta.auto_tools.as_ref().map(|_| String::new());
        Self { meta, held, spans: Vec::new(), call }
    }
}

impl Wire for OpenAiWire {
    fn opening(&mut self) -> Vec<SseEvent> {
        if self.meta.kind != Kind::Chat {
            return Vec::new();
        }
        let content = (!self.meta.tool_call).then(String::new);
        let role = Delta { role: Some("assistant"), content, ..Delta::default() };
        vec![self.meta.chunk(role, None, None)]
    }

    fn text(&mut self, text: String) -> Vec<SseEvent> {
        self.on_text(text).unwrap_or_default()
    }

    fn logprobs(&mut self, entries: Vec<LogprobEntry>) -> Vec<SseEvent> {
        vec![self.meta.logprobs_chunk(entries)]
    }

    fn trace(&mut self, spans: Vec<TextSpan>) {
        if self.meta.trace {
            self.spans = spans;
        }
    }

    fn started(&mut self, fenced_calls: bool) {
        self.meta.fenced_calls = fenced_calls;
    }

    fn done(&mut self, f: &Finished) -> Vec<SseEvent> {
        self.on_done(f)
    }

    fn error(&mut self, e: &ApiError) -> Vec<SseEvent> {
        vec![SseEvent::default().data(e.body().to_string()), SseEvent::default().data("[DONE]")]
    }

    fn whole(&self, text: String, logprobs: Option<ChoiceLogprobs>, f: &Finished) -> String {
        self.meta.full(text, f, logprobs)
    }
}

impl OpenAiWire {
    /// New text: a text chunk (traced when asked), a tool call's pieces, or nothing yet (held
    /// back as a possible call, or a call piece still incomplete).
    fn on_text(&mut self, t: String) -> Option<Vec<SseEvent>> {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::response::sse::Sse;
    use axum::response::IntoResponse;
    use futures_util::stream::{self, StreamExt};
    use treespec_core::stats::DecodeStats;

    use super::*;
    use crate::http::respond::sse_events;
    use crate::metrics::{Metrics, RequestTimer};
    use crate::scheduling::job::Event;
    use crate::tenant::Tenant;

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
        let out: Vec<_> = sse_events(rx, OpenAiWire::new(meta), timer).collect().await;
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
