//! One streamed chat completion against any OpenAI-compatible server, timed from the client
//! (time to first token, decode time), with what the server reports about its prompt cache and
//! its forwards: OpenAI's `usage.prompt_tokens_details.cached_tokens`, llama-server's `timings`
//! (`cache_n`, `predicted_n`, `draft_n`, `draft_n_accepted`) and treespec's `treespec` stats.

use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// A tool call the model made.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id (what the tool message answers).
    pub id: String,
    /// The function.
    pub name: String,
    /// Its JSON arguments, as text.
    pub arguments: String,
}

/// One answer and how it was produced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// The text.
    pub text: String,
    /// The tool calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: String,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV the server reused (None: it did not say).
    pub cached_tokens: Option<usize>,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Target forwards that generated them (None: the server did not say).
    pub target_forwards: Option<u64>,
    /// Seconds from sending the request to the first generated text.
    pub ttft_s: f64,
    /// Seconds from the first generated text to the last.
    pub decode_s: f64,
    /// Seconds from sending to the end of the stream.
    pub total_s: f64,
    /// Times the request was sent again after a failure ([`RETRIES`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retries: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Reply {
    /// Client-side decode rate: tokens after the first over the time after the first.
    pub fn decode_tokens_per_s(&self) -> Option<f64> {
        (self.completion_tokens > 1 && self.decode_s > 0.0)
            .then(|| (self.completion_tokens - 1) as f64 / self.decode_s)
    }

    /// Tokens per target forward.
    pub fn tokens_per_forward(&self) -> Option<f64> {
        self.target_forwards.filter(|&f| f > 0).map(|f| self.completion_tokens as f64 / f as f64)
    }

    /// The assistant message to append to the conversation.
    pub fn message(&self) -> Value {
        if self.tool_calls.is_empty() {
            return json!({ "role": "assistant", "content": self.text });
        }
        let calls: Vec<Value> = self
            .tool_calls
            .iter()
            .map(|c| json!({ "id": c.id, "type": "function", "function": { "name": c.name, "arguments": c.arguments } }))
            .collect();
        json!({ "role": "assistant", "content": self.text, "tool_calls": calls })
    }
}

/// What one chunk adds to the reply.
#[derive(Default)]
struct Accumulated {
    reply: Reply,
    first_text: Option<Instant>,
    last_text: Option<Instant>,
    usage: Option<Value>,
    timings: Option<Value>,
    treespec: Option<Value>,
}

impl Accumulated {
    fn chunk(&mut self, chunk: &Value, now: Instant) {
        for key in ["usage", "timings", "treespec"] {
            if let Some(v) = chunk.get(key).filter(|v| !v.is_null()) {
                let slot = match key {
                    "usage" => &mut self.usage,
                    "timings" => &mut self.timings,
                    _ => &mut self.treespec,
                };
                *slot = Some(v.clone());
            }
        }
        let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) else { return };
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.reply.finish_reason = reason.to_string();
        }
        let Some(delta) = choice.get("delta") else { return };
        let mut produced = false;
        if let Some(text) = delta.get("content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
            self.reply.text.push_str(text);
            produced = true;
        }
        for call in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let index = call.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
            while self.reply.tool_calls.len() <= index {
                self.reply.tool_calls.push(ToolCall::default());
            }
            let slot = &mut self.reply.tool_calls[index];
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                slot.id = id.to_string();
            }
            let function = call.get("function");
            if let Some(name) = function.and_then(|f| f.get("name")).and_then(Value::as_str) {
                slot.name.push_str(name);
            }
            if let Some(args) = function.and_then(|f| f.get("arguments")).and_then(Value::as_str) {
                slot.arguments.push_str(args);
            }
            produced = true;
        }
        if produced {
            self.first_text.get_or_insert(now);
            self.last_text = Some(now);
        }
    }

    /// The reply, with the counts the server reported.
    fn finish(mut self, sent: Instant, ended: Instant) -> Reply {
        let num = |v: &Option<Value>, path: &[&str]| {
            let mut cur = v.as_ref()?;
            for p in path {
                cur = cur.get(p)?;
            }
            cur.as_u64()
        };
        let r = &mut self.reply;
        r.prompt_tokens =
            num(&self.usage, &["prompt_tokens"]).or(num(&self.timings, &["prompt_n"])).unwrap_or(0) as usize;
        r.completion_tokens = num(&self.usage, &["completion_tokens"])
            .or(num(&self.timings, &["predicted_n"]))
            .unwrap_or(0) as usize;
        r.cached_tokens = num(&self.usage, &["prompt_tokens_details", "cached_tokens"])
            .or(num(&self.timings, &["cache_n"]))
            .map(|n| n as usize);
        // treespec counts its forwards; llama-server's forwards are its tokens less the drafted
        // tokens it accepted (each forward emits its accepted drafts and one token of its own);
        // a llama-server that reports timings without draft counts did not speculate.
        r.target_forwards = num(&self.treespec, &["target_forwards"]).or_else(|| {
            let predicted = num(&self.timings, &["predicted_n"])?;
            Some(predicted.saturating_sub(num(&self.timings, &["draft_n_accepted"]).unwrap_or(0)))
        });
        r.ttft_s = self.first_text.map_or(0.0, |t| (t - sent).as_secs_f64());
        r.decode_s = match (self.first_text, self.last_text) {
            (Some(a), Some(b)) => (b - a).as_secs_f64(),
            _ => 0.0,
        };
        // A reply that arrived whole, or in one burst (a tool call a server holds back until it
        // is complete, then streams in a few pieces), has no client-side decode time worth the
        // name: its generation fell in the time to first token. Take the server's own
        // (`timings.predicted_ms`, the time it spent generating all the tokens), scaled to the
        // tokens after the first, whenever the client saw less than half of it.
        let predicted_ms = self.timings.as_ref().and_then(|t| t.get("predicted_ms")).and_then(Value::as_f64);
        if let (Some(ms), n @ 2..) = (predicted_ms, r.completion_tokens) {
            let server_s = ms / 1e3 * (n - 1) as f64 / n as f64;
            if r.decode_s < server_s / 2.0 {
                r.decode_s = server_s;
            }
        }
        r.total_s = (ended - sent).as_secs_f64();
        self.reply
    }
}

/// Times a failed request is sent again, as OpenAI's SDKs do by default: a request that could not
/// reach a server, lost its connection, or was answered 408, 409, 429 or 5xx (a gateway whose
/// replica died, a draining replica's retryable 503) is retried twice, after 0.5 s and 1 s. A
/// stream that broke before its answer finished (cut, or ended by an error event, which is how a
/// gateway reports a replica lost mid-answer) is sent again too, as an agent re-asks a cut-off
/// answer. Each [`Reply`] counts its retries, so a run that needed them says so.
pub const RETRIES: u32 = 2;

/// Why an attempt failed, and whether a client would send the request again.
enum Failed {
    /// Worth another try (see [`RETRIES`]).
    Again(anyhow::Error),
    /// The server answered, and the answer was an error.
    For(anyhow::Error),
}

/// Whether a status is one OpenAI's clients retry.
fn retryable(status: reqwest::StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 409 | 429) || status.is_server_error()
}

/// Send `body` (a chat completion request; `stream` and `stream_options` are set here) to
/// `base_url` and read the streamed answer to its end, retrying as OpenAI's clients do
/// ([`RETRIES`]; the times count from the first try). `session` names the conversation, in the
/// headers a gateway keeps conversations on one replica by (SMG's `X-SMG-Routing-Key` and a plain
/// `X-Session-Id`).
pub async fn chat(client: &reqwest::Client, base_url: &str, mut body: Value, session: &str) -> Result<Reply> {
    body["stream"] = json!(true);
    body["stream_options"] = json!({ "include_usage": true });
    let url = format!("{}/v1/chat/completions", base_url.trim_end_matches('/'));
    let sent = Instant::now();
    let mut retries = 0;
    loop {
        match attempt(client, &url, &body, session, sent).await {
            Ok(mut reply) => {
                reply.retries = retries;
                return Ok(reply);
            }
            Err(Failed::Again(_)) if retries < RETRIES => {
                retries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(500 << (retries - 1))).await;
            }
            Err(Failed::Again(e) | Failed::For(e)) => {
                return Err(if retries > 0 { e.context(format!("after {retries} retries")) } else { e })
            }
        }
    }
}

/// One try of [`chat`].
async fn attempt(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    session: &str,
    sent: Instant,
) -> std::result::Result<Reply, Failed> {
    let request = client.post(url).header("x-smg-routing-key", session).header("x-session-id", session);
    let response = request
        .json(body)
        .send()
        .await
        .map_err(|e| Failed::Again(anyhow!(e).context(format!("POST {url}"))))?;
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        let e = anyhow!("POST {url}: HTTP {status}: {}", text.chars().take(400).collect::<String>());
        return Err(if retryable(status) { Failed::Again(e) } else { Failed::For(e) });
    }
    let mut acc = Accumulated::default();
    let mut events = response.bytes_stream().eventsource();
    let mut done = false;
    while let Some(event) = events.next().await {
        let event = event.map_err(|e| Failed::Again(anyhow!("POST {url}: reading the stream: {e}")))?;
        if event.data.trim() == "[DONE]" {
            done = true;
            break;
        }
        let chunk: Value = serde_json::from_str(&event.data).map_err(|e| {
            Failed::For(anyhow!(e).context(format!("POST {url}: a chunk is not JSON: {}", event.data)))
        })?;
        // A gateway reports a replica lost mid-answer this way (SMG: `stream_error`).
        if let Some(err) = chunk.get("error") {
            return Err(Failed::Again(anyhow!("POST {url}: the server failed mid-stream: {err}")));
        }
        acc.chunk(&chunk, Instant::now());
    }
    if !done && acc.reply.finish_reason.is_empty() {
        return Err(Failed::Again(anyhow!("POST {url}: the stream ended before the answer finished")));
    }
    Ok(acc.finish(sent, Instant::now()))
}

/// The served model's id (`GET /v1/models`), sent back in every request.
pub async fn model_id(client: &reqwest::Client, base_url: &str) -> Result<String> {
    let url = format!("{}/v1/models", base_url.trim_end_matches('/'));
    let models: Value = client
        .get(&url)
        .send()
        .await
        .with_context(|| format!("GET {url}: is the server up?"))?
        .error_for_status()
        .with_context(|| format!("GET {url}"))?
        .json()
        .await
        .with_context(|| format!("GET {url}: not JSON"))?;
    models["data"][0]["id"].as_str().map(str::to_string).ok_or_else(|| anyhow!("GET {url}: no model listed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server on loopback that answers its n-th connection with `answers[n]` (raw HTTP) and
    /// closes it; returns its URL and how many connections it took.
    async fn scripted(
        answers: Vec<&'static str>,
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = taken.clone();
        tokio::spawn(async move {
            for answer in answers {
                let (mut socket, _) = listener.accept().await.unwrap();
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buf = vec![0u8; 1 << 16];
                let mut got = Vec::new();
                // Read the request head and its body (Content-Length) before answering.
                loop {
                    let n = socket.read(&mut buf).await.unwrap();
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got);
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap())
                            })
                            .unwrap_or(0);
                        if got.len() >= end + 4 + len {
                            break;
                        }
                    }
                    if n == 0 {
                        break;
                    }
                }
                socket.write_all(answer.as_bytes()).await.unwrap();
                socket.shutdown().await.ok();
            }
        });
        (url, taken)
    }

    const STREAM_HEAD: &str =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    const WHOLE: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
        data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n\
        data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n\
        data: [DONE]\n\n";

    #[tokio::test]
    async fn a_request_is_sent_again_after_a_retryable_failure_and_says_so() {
        let client = reqwest::Client::new();
        let body = json!({"messages": []});
        // A gateway whose replica died (502), then a stream cut before its answer finished.
        let cut: &'static str = Box::leak(
            format!("{STREAM_HEAD}data: {{\"choices\":[{{\"delta\":{{\"content\":\"h\"}}}}]}}\n\n")
                .into_boxed_str(),
        );
        let (url, taken) = scripted(vec![
            "HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            cut,
            WHOLE,
        ])
        .await;
        let reply = chat(&client, &url, body.clone(), "s").await.expect("the third try answers");
        assert_eq!((reply.text.as_str(), reply.retries), ("hi", 2));
        assert_eq!(taken.load(std::sync::atomic::Ordering::SeqCst), 3);
        // SMG's report of a replica lost mid-answer: an error event.
        let lost: &'static str = Box::leak(
            format!("{STREAM_HEAD}data: {{\"error\":{{\"message\":\"Stream error\",\"type\":\"stream_error\"}}}}\n\n").into_boxed_str(),
        );
        let (url, _) = scripted(vec![lost, WHOLE]).await;
        assert_eq!(chat(&client, &url, body.clone(), "s").await.expect("sent again").retries, 1);
        // Three failures in a row: the request fails, naming its retries.
        let busy = "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        let (url, taken) = scripted(vec![busy, busy, busy, WHOLE]).await;
        let e = chat(&client, &url, body.clone(), "s").await.expect_err("out of retries");
        assert!(format!("{e:#}").contains("after 2 retries"), "{e:#}");
        assert_eq!(taken.load(std::sync::atomic::Ordering::SeqCst), 3);
        // A request the server refuses (400) is not sent again.
        let bad = "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        let (url, taken) = scripted(vec![bad, WHOLE]).await;
        let e = chat(&client, &url, body, "s").await.expect_err("a 400 is final");
        assert!(format!("{e:#}").contains("400") && !format!("{e:#}").contains("retries"), "{e:#}");
        assert_eq!(taken.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn chunks_accumulate_text_calls_and_server_counts() {
        let t0 = Instant::now();
        let at = |ms| t0 + std::time::Duration::from_millis(ms);
        let mut acc = Accumulated::default();
        acc.chunk(&json!({"choices":[{"delta":{"role":"assistant"}}]}), at(5));
        acc.chunk(&json!({"choices":[{"delta":{"content":"Hel"}}]}), at(100));
        acc.chunk(&json!({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"ls","arguments":"{\"a\""}}]}}]}), at(150));
        acc.chunk(
            &json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}}]}),
            at(200),
        );
        acc.chunk(&json!({"choices":[{"delta":{"content":"lo"},"finish_reason":"tool_calls"}]}), at(300));
        acc.chunk(
            &json!({"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":32}},
                    "timings":{"predicted_n":9,"draft_n":10,"draft_n_accepted":6}}),
            at(310),
        );
        let r = acc.finish(t0, at(320));
        assert_eq!(r.text, "Hello");
        assert_eq!(
            r.tool_calls,
            vec![ToolCall { id: "c1".into(), name: "ls".into(), arguments: "{\"a\":1}".into() }]
        );
        assert_eq!((r.finish_reason.as_str(), r.prompt_tokens, r.completion_tokens), ("tool_calls", 50, 9));
        assert_eq!(r.cached_tokens, Some(32));
        // llama-server's forwards: 9 tokens, 6 of them accepted drafts.
        assert_eq!(r.target_forwards, Some(3));
        assert!((r.ttft_s - 0.1).abs() < 1e-9 && (r.decode_s - 0.2).abs() < 1e-9, "{r:?}");
        assert_eq!(r.decode_tokens_per_s(), Some(40.0));
        assert_eq!(r.tokens_per_forward(), Some(3.0));
        assert_eq!(r.message()["tool_calls"][0]["function"]["name"], "ls");
    }

    #[test]
    fn treespec_stats_and_timings_without_drafts() {
        let t0 = Instant::now();
        let mut acc = Accumulated::default();
        acc.chunk(&json!({"choices":[{"delta":{"content":"x"}}],"treespec":{"target_forwards":4}}), t0);
        acc.chunk(&json!({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":8}}), t0);
        let r = acc.finish(t0, t0);
        assert_eq!((r.target_forwards, r.cached_tokens), (Some(4), None));
        let mut plain = Accumulated::default();
        plain.chunk(
            &json!({"choices":[{"delta":{"content":"x"}}],"timings":{"predicted_n":8,"cache_n":3}}),
            t0,
        );
        let r = plain.finish(t0, t0);
        assert_eq!((r.target_forwards, r.cached_tokens, r.completion_tokens), (Some(8), Some(3), 8));
        assert_eq!(r.decode_tokens_per_s(), None, "one chunk and no server time: no decode rate");
    }

    #[test]
    fn a_reply_that_arrives_whole_takes_the_servers_decode_time() {
        let t0 = Instant::now();
        let mut acc = Accumulated::default();
        acc.chunk(
            &json!({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"ls","arguments":"{}"}}]}}]}),
            t0,
        );
        acc.chunk(
            &json!({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":11},"timings":{"predicted_ms":500.0}}),
            t0,
        );
        let r = acc.finish(t0, t0);
        // 11 tokens in 0.5 s: the 10 after the first in 10/11 of it, 22 tokens/s.
        assert!((r.decode_tokens_per_s().unwrap() - 22.0).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn a_held_back_call_streamed_in_a_burst_takes_the_servers_decode_time() {
        let t0 = Instant::now();
        let at = |ms| t0 + std::time::Duration::from_millis(ms);
        let call = |args: &str, ms| {
            (
                json!({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"arguments":args}}]}}]}),
                ms,
            )
        };
        let mut acc = Accumulated::default();
        for (chunk, ms) in [call("{\"a\"", 900), call(":1}", 910)] {
            acc.chunk(&chunk, at(ms));
        }
        acc.chunk(
            &json!({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":21},"timings":{"predicted_ms":700.0}}),
            at(911),
        );
        let r = acc.finish(t0, at(912));
        // The client saw 10 ms of a 700 ms generation: 20 tokens in 20/21 of 0.7 s, 30 tokens/s.
        assert!((r.decode_tokens_per_s().unwrap() - 30.0).abs() < 1e-9, "{r:?}");
        // A stream the client saw unfold keeps its own time, whatever the server says.
        let mut streamed = Accumulated::default();
        for (chunk, ms) in [call("{\"a\"", 100), call(":1}", 500)] {
            streamed.chunk(&chunk, at(ms));
        }
        streamed.chunk(
            &json!({"choices":[],"usage":{"completion_tokens":21},"timings":{"predicted_ms":700.0}}),
            at(501),
        );
        let r = streamed.finish(t0, at(502));
        assert!((r.decode_s - 0.4).abs() < 1e-9, "{r:?}");
    }
}
