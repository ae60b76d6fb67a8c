// Included by router.rs into one module per scheduler (`pool` is the module's own).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;
use treespec_server::{router, ApiKeys, GenerationBackend, Metrics, ServerConfig, ToyConfig};

fn app_with(
    config: ToyConfig,
    queue: usize,
    server: ServerConfig,
) -> (Router, Arc<dyn GenerationBackend>, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let pool = pool(config, queue, metrics.clone());
    (router(pool.clone(), metrics.clone(), server), pool, metrics)
}

fn app() -> Router {
    app_with(ToyConfig::default(), 8, ServerConfig { max_body_bytes: 4096, ..Default::default() }).0
}

fn post(path: &str, body: Value) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn call(app: &Router, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, String) {
    let r = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = r.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn json_call(app: &Router, req: Request<Body>) -> (StatusCode, Value) {
    let (s, _, b) = call(app, req).await;
    (s, serde_json::from_str(&b).unwrap_or_else(|e| panic!("not JSON ({e}): {b}")))
}

fn chat(extra: Value) -> Value {
    let mut v = json!({"model": "toy", "messages": [{"role": "user", "content": "hello"}], "temperature": 0, "max_tokens": 8});
    v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    v
}

/// SSE body → one normalised line per event (ids and timestamps replaced; the last chunk's
/// `timings` and `treespec` checked, then cut to what does not depend on the clock or the
/// scheduler: the token counts and the method).
fn transcript(body: &str) -> String {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let data = e.strip_prefix("data: ").unwrap_or_else(|| panic!("not an SSE data event: {e:?}"));
            match serde_json::from_str::<Value>(data) {
                Ok(mut v) => {
                    if v.get("id").is_some() {
                        v["id"] = json!("ID");
                        v["created"] = json!(0);
                    }
                    if let Some(t) = v.get("timings").cloned() {
                        check_timings(&t);
                        v["timings"] = json!({
                            "cache_n": t["cache_n"], "prompt_n": t["prompt_n"], "predicted_n": t["predicted_n"],
                        });
                    }
                    if let Some(stats) = v.get("treespec").filter(|t| t.get("target_forwards").is_some()).cloned() {
                        assert!(stats["target_forwards"].as_u64().unwrap() >= 1, "{stats}");
                        assert!(stats["mean_accepted"].as_f64().unwrap() >= 1.0, "{stats}");
                        v["treespec"] = json!({"method": stats["method"]});
                    }
                    v.to_string()
                }
                Err(_) => data.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// llama-server's `timings`: every field, times not negative, no more accepted than drafted.
fn check_timings(t: &Value) {
    for f in ["cache_n", "prompt_n", "predicted_n", "draft_n", "draft_n_accepted"] {
        assert!(t[f].is_u64(), "{f}: {t}");
    }
    for f in [
        "prompt_ms",
        "prompt_per_token_ms",
        "prompt_per_second",
        "predicted_ms",
        "predicted_per_token_ms",
        "predicted_per_second",
    ] {
        assert!(t[f].as_f64().is_some_and(|x| x >= 0.0), "{f}: {t}");
    }
    assert!(t["draft_n_accepted"].as_u64() <= t["draft_n"].as_u64(), "{t}");
}

#[tokio::test]
async fn health_models_metrics() {
    let app = app();
    let (s, v) = json_call(&app, Request::get("/health").body(Body::empty()).unwrap()).await;
    assert_eq!((s, v["status"].as_str()), (StatusCode::OK, Some("ok")));
    let (s, v) = json_call(&app, Request::get("/v1/models").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "toy");
    let _ = json_call(&app, post("/v1/chat/completions", chat(json!({})))).await;
    let (s, h, text) = call(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::OK);
    assert!(h[header::CONTENT_TYPE].to_str().unwrap().starts_with("text/plain"));
    for needle in [
        "treespec_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1",
        "treespec_requests_total{endpoint=\"/v1/models\",status=\"200\"} 1",
        "treespec_queue_depth 0",
        "treespec_completion_tokens_total{method=\"chain\"} 8",
        "treespec_mean_accepted_length{method=\"chain\"}",
        "treespec_tokens_per_second{method=\"chain\"}",
        "treespec_depth_acceptance_rate{method=\"chain\",depth=\"1\"}",
        "treespec_time_to_first_token_seconds_count 1",
        "treespec_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1",
        "treespec_request_duration_seconds_count 1",
        "treespec_request_mean_accepted_length_count{method=\"chain\"} 1",
        "treespec_request_rows_per_forward_count{method=\"chain\"} 1",
        "treespec_target_rows_total{method=\"chain\"}",
        "treespec_rows_per_forward{method=\"chain\"}",
        "# TYPE treespec_time_to_first_token_seconds histogram",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
}

#[tokio::test]
async fn chat_non_streaming() {
    let app = app();
    let (s, v) =
        json_call(&app, post("/v1/chat/completions", chat(json!({"seed": 1, "some_future_field": true}))))
            .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(text.len(), 8, "{text}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 8);
    // "user: hello\nassistant:" is 22 bytes = 22 toy tokens.
    assert_eq!(v["usage"]["prompt_tokens"], 22);
    assert_eq!(v["usage"]["total_tokens"], 30);
    // The toys reuse no prefix unless asked to (`ToyConfig::prefix_cache`).
    assert_eq!(v["usage"]["prompt_tokens_details"], json!({"cached_tokens": 0}));
    assert_eq!(v["treespec"]["method"], "chain");
    let t = &v["timings"];
    check_timings(t);
    assert_eq!(
        (t["cache_n"].as_u64(), t["prompt_n"].as_u64(), t["predicted_n"].as_u64()),
        (Some(0), Some(22), Some(8))
    );
    // Chain drafts (k = 3) every step: the draft counts are the engine's.
    assert!(t["draft_n"].as_u64().unwrap() > 0, "{t}");
    // Greedy output does not depend on the method (lossless).
    for method in
        [json!({"method": "plain"}), json!({"method": "tree", "widths": [2, 2]}), json!({"method": "dyspec"})]
    {
        let (_, w) = json_call(&app, post("/v1/chat/completions", chat(json!({"treespec": method})))).await;
        assert_eq!(w["choices"][0]["message"]["content"], text, "{method}");
        assert_eq!(w["treespec"]["method"], method["method"]);
    }
}

/// The toy backend has no vocabulary a grammar could be compiled against: structured requests
/// pass validation and get a clean 400 naming their field from the worker (never a 5xx);
/// `tool_choice: "auto"` stays plain text.
#[tokio::test]
async fn structured_output_on_the_toy_backend() {
    let app = app();
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    for (extra, param) in [
        (json!({"response_format": {"type": "json_object"}}), "response_format"),
        (json!({"response_format": {"type": "json_object"}, "stream": true}), "response_format"),
        (json!({"tools": tools, "tool_choice": "required"}), "tools"),
    ] {
        let (s, v) = json_call(&app, post("/v1/chat/completions", chat(extra.clone()))).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{extra}: {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("toy backend"), "{v}");
    }
    // Bad input is refused before the queue.
    for (extra, param) in [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format",
        ),
        (json!({"tools": [{"type": "function", "function": {}}]}), "tools"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice",
        ),
    ] {
        let (s, v) = json_call(&app, post("/v1/chat/completions", chat(extra.clone()))).await;
        assert_eq!((s, &v["error"]["param"]), (StatusCode::BAD_REQUEST, &json!(param)), "{extra}: {v}");
    }
    // tool_choice auto (the default with tools): the tools are described to the model (a prompt
    // too long for the toy's 256 positions; 1024 here), and an answer that is no call is text.
    let roomy = app_with(ToyConfig { context: 1024, ..Default::default() }, 8, ServerConfig::default()).0;
    for choice in [json!("auto"), json!("none")] {
        let body = chat(json!({"tools": tools, "tool_choice": choice}));
        let (s, v) = json_call(&roomy, post("/v1/chat/completions", body)).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap().len(), 8);
        assert!(v["choices"][0]["message"].get("tool_calls").is_none(), "{v}");
    }
}

#[tokio::test]
async fn chat_streaming_transcript() {
    let app = app();
    let body = chat(json!({"stream": true, "stream_options": {"include_usage": true}, "max_tokens": 4}));
    let (s, h, b) = call(&app, post("/v1/chat/completions", body)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h[header::CONTENT_TYPE], "text/event-stream");
    let (_, full) = json_call(&app, post("/v1/chat/completions", chat(json!({"max_tokens": 4})))).await;
    let text = full["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let t = transcript(&b);
    // Content deltas arrive per decode step; join them to compare with the non-streamed text.
    let mut streamed = String::new();
    let mut shape = Vec::new();
    for line in t.lines() {
        if line == "[DONE]" {
            shape.push("[DONE]".to_string());
            continue;
        }
        let mut v: Value = serde_json::from_str(line).unwrap();
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            if !c.is_empty() {
                streamed.push_str(c);
                v["choices"][0]["delta"]["content"] = json!("…");
            }
        }
        let s = v.to_string();
        if shape.last() != Some(&s) {
            shape.push(s);
        }
    }
    assert_eq!(streamed, text);
    let expected = r#"{"choices":[{"delta":{"content":"","role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}],"created":0,"id":"ID","model":"toy","object":"chat.completion.chunk"}
{"choices":[{"delta":{"content":"…"},"finish_reason":null,"index":0,"logprobs":null}],"created":0,"id":"ID","model":"toy","object":"chat.completion.chunk"}
{"choices":[{"delta":{},"finish_reason":"length","index":0,"logprobs":null}],"created":0,"id":"ID","model":"toy","object":"chat.completion.chunk"}
{"choices":[],"created":0,"id":"ID","model":"toy","object":"chat.completion.chunk","usage":{"completion_tokens":4,"prompt_tokens":22,"total_tokens":26,"prompt_tokens_details":{"cached_tokens":0}},"timings":{"cache_n":0,"prompt_n":22,"predicted_n":4},"treespec":{"method":"chain"}}
[DONE]"#;
    // Compared as JSON values: key order depends on serde_json's `preserve_order` feature,
    // which treespec-grammar's llguidance turns on.
    let parse = |l: &str| serde_json::from_str::<Value>(l).unwrap_or_else(|_| json!(l));
    let (got, want): (Vec<Value>, Vec<Value>) =
        (shape.iter().map(|l| parse(l)).collect(), expected.lines().map(parse).collect());
    assert_eq!(got, want, "full transcript:\n{t}");
}

#[tokio::test]
async fn completions_streaming_and_not() {
    let app = app();
    let req = json!({"prompt": "abc", "max_tokens": 3, "temperature": 0});
    let (s, v) = json_call(&app, post("/v1/completions", req.clone())).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6, "prompt_tokens_details": {"cached_tokens": 0}})
    );
    check_timings(&v["timings"]);
    assert_eq!(v["timings"]["predicted_n"], 3);
    assert!(v["treespec"]["target_forwards"].as_u64().unwrap() >= 1, "{v}");
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let (_, _, b) = call(&app, post("/v1/completions", sreq)).await;
    let t = transcript(&b);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(*lines.last().unwrap(), "[DONE]");
    let streamed: String = lines[..lines.len() - 1]
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(streamed, text);
    let last: Value = serde_json::from_str(lines[lines.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert!(last.get("usage").is_none(), "no usage chunk unless asked");
    // Without a usage chunk the finish chunk is the last, and carries the timings (as
    // llama-server's last chunk does; the statistics come with usage); no other chunk does.
    assert_eq!(last["timings"], json!({"cache_n": 0, "prompt_n": 3, "predicted_n": 3}), "{last}");
    assert!(last.get("treespec").is_none(), "{last}");
    for l in &lines[..lines.len() - 2] {
        let v: Value = serde_json::from_str(l).unwrap();
        assert!(v.get("timings").is_none() && v.get("treespec").is_none(), "{l}");
    }
}

#[tokio::test]
async fn stop_strings_cut_the_text_streaming_or_not() {
    let app = app();
    let (_, v) = json_call(&app, post("/v1/chat/completions", chat(json!({"max_tokens": 40})))).await;
    let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    // A two-letter stop string from the middle of the greedy answer: spans two tokens.
    let at = 10;
    let stop = text[at..at + 2].to_string();
    let first = text.find(&stop).unwrap();
    let (_, v) =
        json_call(&app, post("/v1/chat/completions", chat(json!({"max_tokens": 40, "stop": stop})))).await;
    assert_eq!(v["choices"][0]["message"]["content"], text[..first], "stop {stop:?} in {text:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let (_, _, b) = call(
        &app,
        post("/v1/chat/completions", chat(json!({"max_tokens": 40, "stop": [stop], "stream": true}))),
    )
    .await;
    let streamed: String = transcript(&b)
        .lines()
        .filter(|l| *l != "[DONE]")
        .filter_map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(streamed, text[..first]);
}

#[tokio::test]
async fn error_paths_are_openai_errors() {
    let app = app();
    let long = "x".repeat(300);
    let cases: Vec<(Request<Body>, StatusCode, &str)> = vec![
        (
            Request::post("/v1/chat/completions")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from("{\"messages\": ["))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "malformed JSON",
        ),
        (
            Request::post("/v1/chat/completions")
                .header(header::CONTENT_TYPE, "text/plain")
                .body(Body::from(chat(json!({})).to_string()))
                .unwrap(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type",
        ),
        (
            Request::post("/v1/chat/completions").body(Body::from(chat(json!({})).to_string())).unwrap(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type",
        ),
        (
            post("/v1/chat/completions", chat(json!({"padding": "y".repeat(5000)}))),
            StatusCode::PAYLOAD_TOO_LARGE,
            "too large",
        ),
        (
            post("/v1/chat/completions", json!({"messages": []})),
            StatusCode::BAD_REQUEST,
            "at least one message",
        ),
        (
            post("/v1/chat/completions", json!({"messages": [{"role": "robot", "content": "x"}]})),
            StatusCode::BAD_REQUEST,
            "unknown role",
        ),
        (post("/v1/chat/completions", chat(json!({"n": 2}))), StatusCode::BAD_REQUEST, "n = 1"),
        (post("/v1/chat/completions", chat(json!({"logprobs": "yes"}))), StatusCode::BAD_REQUEST, "logprobs"),
        (post("/v1/chat/completions", chat(json!({"top_logprobs": 2}))), StatusCode::BAD_REQUEST, "logprobs"),
        (post("/v1/completions", json!({"prompt": "a", "logprobs": 2})), StatusCode::BAD_REQUEST, "logprobs"),
        (
            post("/v1/chat/completions", chat(json!({"tools": [{"type": "function"}]}))),
            StatusCode::BAD_REQUEST,
            "tools",
        ),
        (post("/v1/chat/completions", chat(json!({"max_tokens": 0}))), StatusCode::BAD_REQUEST, "max_tokens"),
        (
            post("/v1/chat/completions", chat(json!({"max_tokens": 100000}))),
            StatusCode::BAD_REQUEST,
            "context",
        ),
        (
            post("/v1/chat/completions", chat(json!({"max_tokens": 250}))),
            StatusCode::BAD_REQUEST,
            "exceeds the context",
        ),
        (
            post("/v1/chat/completions", chat(json!({"temperature": -1}))),
            StatusCode::BAD_REQUEST,
            "temperature",
        ),
        (post("/v1/chat/completions", chat(json!({"top_p": -0.1}))), StatusCode::BAD_REQUEST, "top_p"),
        (post("/v1/chat/completions", chat(json!({"top_p": 1.01}))), StatusCode::BAD_REQUEST, "top_p"),
        (
            post(
                "/v1/chat/completions",
                json!({"messages": [{"role": "user", "content": long}], "stream": true}),
            ),
            StatusCode::BAD_REQUEST,
            "context holds",
        ),
        (
            post("/v1/chat/completions", chat(json!({"treespec": {"method": "warp"}}))),
            StatusCode::BAD_REQUEST,
            "unknown method",
        ),
        (
            post("/v1/chat/completions", chat(json!({"treespec": {"method": "chain", "k": 0}}))),
            StatusCode::BAD_REQUEST,
            "k must be",
        ),
        (post("/v1/completions", json!({"prompt": ""})), StatusCode::BAD_REQUEST, "prompt"),
        (post("/v1/completions", json!({"prompt": "a", "best_of": 3})), StatusCode::BAD_REQUEST, "best_of"),
        (Request::get("/v1/nothing").body(Body::empty()).unwrap(), StatusCode::NOT_FOUND, "no route"),
    ];
    for (req, status, needle) in cases {
        let what = format!("{} {}", req.method(), req.uri());
        let (s, v) = json_call(&app, req).await;
        assert_eq!(s, status, "{what}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_else(|| panic!("no error object: {v}"));
        assert!(msg.contains(needle), "{what}: {msg:?} lacks {needle:?}");
        assert!(v["error"]["type"].is_string());
    }
    // None of the bad requests affected the next good one.
    let (s, _) = json_call(&app, post("/v1/chat/completions", chat(json!({})))).await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn api_key() {
    let server = ServerConfig { api_keys: ApiKeys::new(["sekret".to_string()], false), ..Default::default() };
    let (app, _, _) = app_with(ToyConfig::default(), 4, server);
    let (s, v) = json_call(&app, post("/v1/chat/completions", chat(json!({})))).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(v["error"]["type"], "authentication_error");
    let mut req = post("/v1/chat/completions", chat(json!({})));
    req.headers_mut().insert(header::AUTHORIZATION, "Bearer wrong".parse().unwrap());
    assert_eq!(json_call(&app, req).await.0, StatusCode::UNAUTHORIZED);
    let (s, _) = json_call(&app, Request::get("/v1/models").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let mut req = post("/v1/chat/completions", chat(json!({})));
    req.headers_mut().insert(header::AUTHORIZATION, "Bearer sekret".parse().unwrap());
    assert_eq!(json_call(&app, req).await.0, StatusCode::OK);
    assert_eq!(json_call(&app, Request::get("/health").body(Body::empty()).unwrap()).await.0, StatusCode::OK);
}

/// One worker, a queue of one: a third request gets 503 + Retry-After; dropping a streaming
/// response cancels its generation and lets the queued one run; first come, first served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_full_and_cancel_on_disconnect() {
    let config = ToyConfig { step_delay: Duration::from_millis(20), ..Default::default() };
    let (app, pool, metrics) = app_with(config, 1, ServerConfig::default());
    // A: streams a long answer (≈ 200 steps × 20 ms); we hold its body unread.
    let a = app
        .clone()
        .oneshot(post(
            "/v1/chat/completions",
            chat(json!({"stream": true, "max_tokens": 200, "treespec": {"method": "plain"}})),
        ))
        .await
        .unwrap();
    assert_eq!(a.status(), StatusCode::OK);
    // B: queued behind A.
    let app_b = app.clone();
    let b = tokio::spawn(async move {
        json_call(&app_b, post("/v1/chat/completions", chat(json!({"max_tokens": 3})))).await
    });
    for _ in 0..200 {
        if pool.queue_depth() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(pool.queue_depth(), 1);
    // C: the queue is full.
    let (s, h, body) = call(&app, post("/v1/chat/completions", chat(json!({})))).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(h[header::RETRY_AFTER], "1");
    assert!(body.contains("queue_full"));
    // Read a little of A, then disconnect.
    let mut body = a.into_body().into_data_stream();
    use futures_util::StreamExt;
    let first = body.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("data: "));
    drop(body);
    let started = std::time::Instant::now();
    let (s, v) = tokio::time::timeout(Duration::from_secs(10), b).await.unwrap().unwrap();
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "A was not cancelled: B waited {:?}",
        started.elapsed()
    );
    let text = metrics.render_server(pool.queue_depth());
    assert!(text.contains("treespec_cancelled_total{method=\"plain\"} 1"), "{text}");
    assert!(text.contains("status=\"503\"} 1"), "{text}");
}

#[tokio::test]
async fn openapi_json_lists_the_paths() {
    let app = app();
    let (s, v) = json_call(&app, Request::get("/openapi.json").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::OK);
    assert!(v["openapi"].as_str().is_some_and(|o| o.starts_with("3.")), "{v}");
    for path in ["/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"] {
        assert!(v["paths"][path].is_object(), "missing {path}");
    }
    let chat = &v["paths"]["/v1/chat/completions"]["post"];
    for status in ["200", "400", "401", "413", "415", "503"] {
        assert!(chat["responses"][status].is_object(), "chat lacks {status}");
    }
    for schema in ["ChatCompletionRequest", "CompletionRequest", "CommonParams", "ErrorBody", "ModelList"] {
        assert!(v["components"]["schemas"][schema].is_object(), "missing schema {schema}");
    }
}
