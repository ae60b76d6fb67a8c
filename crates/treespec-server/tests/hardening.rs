//! Hostile requests against the server (issue #15), on the toy backend: llama-server sampling
//! fields, wrong methods, half-closed connections, and text cut inside a character; and the
//! security/compatibility review's rows 7–9 (content types and the `Bearer` scheme on
//! llama-server's routes, errors naming the fields sent, `samplers`, deep nesting, the chat
//! page's headers).

// Tests are exempt from the 80-line limit (clippy.toml): a test reads top to bottom as one story.
#![allow(clippy::too_many_lines)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method as HttpMethod, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;
use treespec_core::TokenId;
use treespec_engine::toy::{ToyLm, ToyModel};
use treespec_engine::{generate_constrained, GenerateRequest, Method, TokenBytes};
use treespec_server::{router, BatchPool, Metrics, SchedulerConfig, ServerConfig, ToyConfig};

fn app() -> Router {
    let metrics = Arc::new(Metrics::default());
    let pool = Arc::new(BatchPool::toy(
        ToyConfig::default(),
        SchedulerConfig { parallel: 1, queue: 8, ..Default::default() },
        metrics.clone(),
    ));
    router(pool, metrics, ServerConfig::default())
}

async fn call(app: &Router, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, Value) {
    let r = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = r.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let v = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON ({e}): {text:?}", parts.status));
    (parts.status, parts.headers, v)
}

fn chat(extra: Value) -> Request<Body> {
    let mut v = json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, "seed": 3});
    v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    Request::post("/v1/chat/completions")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(v.to_string()))
        .unwrap()
}

async fn content(app: &Router, extra: Value) -> String {
    let (s, _, v) = call(app, chat(extra)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

/// Row 7: top_k, min_p and repeat_penalty change the result (they were silently ignored), and
/// bad values or types are 400s naming the field.
#[tokio::test]
async fn llama_server_sampling_fields_are_honoured_or_refused() {
    let app = app();
    let greedy = content(&app, json!({"temperature": 0})).await;
    // Sampling at temperature 2 keeps only the top token with top_k 1 or min_p 1: greedy again.
    let hot = content(&app, json!({"temperature": 2})).await;
    assert_ne!(hot, greedy, "temperature 2 should wander off the greedy path on the toy model");
    assert_eq!(content(&app, json!({"temperature": 2, "top_k": 1})).await, greedy);
    assert_eq!(content(&app, json!({"temperature": 2, "min_p": 1.0})).await, greedy);
    // A strong repetition penalty changes the greedy text.
    assert_ne!(content(&app, json!({"temperature": 0, "repeat_penalty": 50.0})).await, greedy);
    assert_ne!(content(&app, json!({"temperature": 0, "repetition_penalty": 50.0})).await, greedy);
    // llama.cpp's `top_k: 0` is no top-k; OpenAI clients' `top_p: 0` is greedy (issue #66).
    assert_eq!(content(&app, json!({"temperature": 2, "top_k": 0})).await, hot);
    assert_eq!(content(&app, json!({"temperature": 2, "top_p": 0})).await, greedy);
    for (field, bad) in [
        ("top_k", json!(-1)),
        ("top_k", json!("40")),
        ("top_k", json!(1.5)),
        ("min_p", json!(2)),
        ("min_p", json!({})),
        ("repeat_penalty", json!(0)),
        ("repeat_penalty", json!("1.1")),
        ("repeat_last_n", json!(-7)),
    ] {
        let (s, _, v) = call(&app, chat(json!({ field: bad }))).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{field}={bad}: {v}");
        assert_eq!(v["error"]["param"], field, "{v}");
    }
    for (field, bad) in
        [("typical_p", json!(0.5)), ("mirostat", json!(2)), ("grammar", json!("root ::= \"a\""))]
    {
        let (s, _, v) = call(&app, chat(json!({ field: bad }))).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{field}={bad}: {v}");
        assert_eq!(v["error"]["code"], "unsupported_parameter", "{v}");
    }
}

/// Row 8: a known route with the wrong method gets an OpenAI-shaped 405 (it was an empty body).
#[tokio::test]
async fn wrong_methods_get_openai_errors() {
    let app = app();
    for (method, path, allowed) in [
        (HttpMethod::GET, "/v1/chat/completions", "POST"),
        (HttpMethod::PUT, "/v1/completions", "POST"),
        (HttpMethod::POST, "/health", "GET"),
        (HttpMethod::DELETE, "/v1/models", "GET"),
        (HttpMethod::OPTIONS, "/v1/chat/completions", "POST"),
    ] {
        let req = Request::builder().method(method.clone()).uri(path).body(Body::empty()).unwrap();
        let (s, h, v) = call(&app, req).await;
        assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_eq!(v["error"]["code"], "method_not_allowed", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(path), "{v}");
        assert!(h[header::ALLOW].to_str().unwrap().contains(allowed), "{h:?}");
    }
}

/// Row 9: a client that half-closes its write side after a complete request is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_closed_connections_are_answered() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(treespec_server::serve(listener, app(), async move {
        let _ = stop_rx.await;
    }));
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    let response = tokio::task::spawn_blocking(move || common::half_closed_chat(addr, &body)).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response:?}");
    assert!(response.contains("\"chat.completion\""), "{response}");
    // Graceful shutdown still ends the server.
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), server).await.unwrap().unwrap().unwrap();
}

/// Issue #66 row 9: a body trickled a byte at a time past `--timeout` is cut off with a 408
/// naming the flag (the connection stayed open for as long as the client liked), while a body
/// that arrives in time is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_trickled_past_the_timeout_is_cut_off() {
    use std::io::{Read, Write};
    let metrics = Arc::new(Metrics::default());
    let pool = Arc::new(BatchPool::toy(ToyConfig::default(), SchedulerConfig::default(), metrics.clone()));
    let config = ServerConfig { timeout: Duration::from_millis(600), ..Default::default() };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(treespec_server::serve(listener, router(pool, metrics, config), std::future::pending()));
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string();
    let send = move |pause: Duration| {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        let started = std::time::Instant::now();
        for byte in body.as_bytes() {
            // Stop sending once the answer is there: bytes the server will not read would make
            // its close a reset, which can discard the answer on this side.
            s.set_nonblocking(true).unwrap();
            let answered = s.peek(&mut [0u8; 1]).is_ok_and(|n| n > 0);
            s.set_nonblocking(false).unwrap();
            if answered || s.write_all(&[*byte]).is_err() {
                break;
            }
            std::thread::sleep(pause);
        }
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        (answer, started.elapsed())
    };
    let again = send.clone();
    let (trickled, took) =
        tokio::task::spawn_blocking(move || send(Duration::from_millis(50))).await.unwrap();
    assert!(trickled.starts_with("HTTP/1.1 408"), "{trickled}");
    assert!(trickled.contains("body_timeout") && trickled.contains("--timeout"), "{trickled}");
    assert!(took < Duration::from_secs(10), "cut off after {took:?}");
    let (in_time, _) = tokio::task::spawn_blocking(move || again(Duration::ZERO)).await.unwrap();
    assert!(in_time.starts_with("HTTP/1.1 200"), "{in_time}");
}

/// Every token is the first three bytes of the four-byte "😀".
struct PartialEmoji;

impl TokenBytes for PartialEmoji {
    fn token_bytes(&self, _: TokenId) -> Vec<u8> {
        "😀".as_bytes()[..3].to_vec()
    }
}

/// The text one generated token makes when the answer is cut after it: what every step releases
/// and the tail at the end, as the scheduler streams them (`Generation` owns the text).
fn text_of_one_token() -> String {
    let mut target = ToyLm::new(ToyModel::new(8, 1, 7), 64);
    let mut drafter = Method::Plain.build::<ToyLm>(None).unwrap();
    let request = GenerateRequest {
        prompt: vec![0, 1],
        max_new_tokens: 1,
        sampling: Default::default(),
        seed: 0,
        stop: Default::default(),
    };
    let mut text = String::new();
    let out = generate_constrained(
        &mut target,
        drafter.as_mut(),
        &request,
        None,
        Some(&PartialEmoji),
        &mut |step| {
            text.push_str(&step.text());
            true
        },
    )
    .unwrap();
    assert_eq!(out.finish_reason.as_str(), "length");
    text + &out.tail
}

/// Row 10: max_tokens ending inside a multi-byte character drops the incomplete bytes instead of
/// sending U+FFFD. Streamed responses send these text events as chunks, non-streamed ones join
/// them, so both are covered by this one event stream.
#[test]
fn output_cut_inside_a_character_has_no_replacement_character() {
    assert_eq!(text_of_one_token(), "");
}

// ---------------------------------------------------------------- review rows 7–9

/// A POST of `body` to `path` with these headers (no `Content-Type` unless given).
fn post_with(path: &str, headers: &[(&str, &str)], body: &str) -> Request<Body> {
    let mut req = Request::post(path);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Body::from(body.to_string())).unwrap()
}

/// Review row 7: llama-server's routes read the body as JSON whatever its type, as llama-server
/// does (`curl -d` sends `application/x-www-form-urlencoded`; some clients send no type), except
/// from a browser page; the OpenAI routes keep requiring JSON. They were 415s.
#[tokio::test]
async fn llama_server_routes_take_curls_form_type_and_no_type() {
    let app = app();
    let body = r#"{"prompt": "hi", "n_predict": 4, "temperature": 0}"#;
    for ct in [None, Some("application/x-www-form-urlencoded"), Some("text/plain;charset=UTF-8")] {
        let headers: Vec<(&str, &str)> = ct.iter().map(|c| ("content-type", *c)).collect();
        for path in ["/completion", "/completions"] {
            let (s, _, v) = call(&app, post_with(path, &headers, body)).await;
            assert_eq!(s, StatusCode::OK, "{path} {ct:?}: {v}");
            assert_eq!(v["tokens_predicted"], 4, "{v}");
        }
        let (s, _, v) = call(&app, post_with("/tokenize", &headers, r#"{"content": "ab"}"#)).await;
        assert_eq!(s, StatusCode::OK, "{ct:?}: {v}");
        let (s, _, v) = call(&app, post_with("/detokenize", &headers, r#"{"tokens": [0, 1]}"#)).await;
        assert_eq!(s, StatusCode::OK, "{ct:?}: {v}");
        let chat = r#"{"messages": [{"role": "user", "content": "hi"}]}"#;
        let (s, _, v) = call(&app, post_with("/apply-template", &headers, chat)).await;
        assert_eq!(s, StatusCode::OK, "{ct:?}: {v}");
        // The OpenAI routes: JSON only, as before.
        let (s, _, v) = call(&app, post_with("/v1/completions", &headers, body)).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, Some("unsupported_media_type"))
        );
        // From a browser page (an Origin header) those types could come from any site without a
        // CORS preflight: JSON only.
        let mut from_page = headers.clone();
        from_page.push(("origin", "https://elsewhere.example"));
        let (s, _, v) = call(&app, post_with("/completion", &from_page, body)).await;
        assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct:?}: {v}");
    }
    let json_from_page = [("content-type", "application/json"), ("origin", "http://127.0.0.1:8080")];
    let (s, _, v) = call(&app, post_with("/completion", &json_from_page, body)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // Other types are not JSON bodies.
    let (s, _, _) =
        call(&app, post_with("/completion", &[("content-type", "multipart/form-data; boundary=x")], body))
            .await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);
}

/// Review row 7: the `Bearer` scheme in any case (RFC 9110 §11.1), any whitespace before the
/// key. `bearer KEY` was a 401.
#[tokio::test]
async fn the_bearer_scheme_matches_in_any_case() {
    let metrics = Arc::new(Metrics::default());
    let pool = Arc::new(BatchPool::toy(
        ToyConfig::default(),
        SchedulerConfig { parallel: 1, queue: 8, ..Default::default() },
        metrics.clone(),
    ));
    let api_keys = treespec_server::ApiKeys::new(["sesame".to_string()], false);
    let app = router(pool, metrics, ServerConfig { api_keys, ..Default::default() });
    let get = |auth: Option<&str>| {
        let mut req = Request::get("/v1/models");
        if let Some(a) = auth {
            req = req.header(header::AUTHORIZATION, a);
        }
        req.body(Body::empty()).unwrap()
    };
    for ok in [
        "Bearer sesame",
        "bearer sesame",
        "BEARER sesame",
        "bEaReR   sesame",
        "Bearer\tsesame",
        "Bearer sesame  ",
    ] {
        let (s, _, v) = call(&app, get(Some(ok))).await;
        assert_eq!(s, StatusCode::OK, "{ok:?}: {v}");
    }
    for refused in [
        None,
        Some("Bearer"),
        Some("Bearersesame"),
        Some("Basic sesame"),
        Some("bearer other"),
        Some("sesame"),
    ] {
        let (s, _, v) = call(&app, get(refused)).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("invalid_api_key")),
            "{refused:?}"
        );
    }
}

/// Review row 8: errors name the fields the client sent (`n_predict` and `prompt` on
/// llama-server's routes, not `max_tokens` and `messages`); a body nested too deeply says so; a
/// schema nested too deeply names its field; `samplers` is honoured or refused, not ignored.
#[tokio::test]
async fn errors_name_the_fields_sent_and_samplers_are_not_ignored() {
    let app = app();
    let json_post =
        |path: &str, v: Value| post_with(path, &[("content-type", "application/json")], &v.to_string());
    let long = "x".repeat(300); // the toys' context is 256 positions, one a byte
    for (path, body, param) in [
        ("/completion", json!({"prompt": "hi", "n_predict": 1_000_000_000_000i64}), "n_predict"),
        ("/completion", json!({"prompt": "hi", "n_predict": 1e12}), "n_predict"),
        ("/completion", json!({"prompt": "hi", "max_tokens": 1_000_000_000_000i64}), "max_tokens"),
        ("/completion", json!({"prompt": long, "n_predict": 4}), "prompt"),
        ("/completion", json!({"prompt": long, "n_predict": 0}), "prompt"),
        ("/completion", json!({"prompt": "x".repeat(200), "n_predict": 100}), "n_predict"),
        ("/completion", json!({"prompt": "hi", "samplers": ["x"]}), "samplers"),
        ("/completion", json!({"prompt": "hi", "samplers": ["top_p", "top_k"]}), "samplers"),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_completion_tokens": 100_000}),
            "max_completion_tokens",
        ),
        ("/v1/completions", json!({"prompt": "hi", "samplers": "kz"}), "samplers"),
        // The /v1 routes in their own names too: `prompt`, and the length field sent.
        ("/v1/completions", json!({"prompt": long, "max_tokens": 4}), "prompt"),
        (
            "/v1/completions",
            json!({"prompt": "x".repeat(200), "max_completion_tokens": 100}),
            "max_completion_tokens",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x".repeat(200)}], "max_completion_tokens": 100}),
            "max_completion_tokens",
        ),
    ] {
        let (s, _, v) = call(&app, json_post(path, body.clone())).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{path} {body}: {v}");
        assert_eq!(v["error"]["param"], param, "{path} {body}: {v}");
        if param != "max_tokens" {
            let message = v["error"]["message"].as_str().unwrap();
            assert!(!message.contains("max_tokens") && !message.contains("messages"), "{message}");
        }
    }
    // A body nested deeper than serde_json's recursion limit: no param, and says so.
    let deep = format!(r#"{{"prompt": "hi", "stop": {}"a"{}}}"#, "[".repeat(200), "]".repeat(200));
    for path in ["/completion", "/v1/completions"] {
        let (s, _, v) = call(&app, post_with(path, &[("content-type", "application/json")], &deep)).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        assert_eq!(v["error"]["code"], "nested_too_deeply", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("nested too deeply"), "{v}");
    }
    // A schema within the body's limit but beyond the grammar compiler's: its field is named.
    let schema = (0..100).fold(json!({"type": "integer"}), |s, _| json!({"type": "array", "items": s}));
    let user = json!([{"role": "user", "content": "hi"}]);
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters":
        {"type": "object", "properties": {"a": schema}}}}]);
    for (body, param) in [
        (
            json!({"messages": user, "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}),
            "response_format",
        ),
        (
            json!({"messages": user, "tools": tools, "tool_choice": "required"}),
            "tools[0].function.parameters",
        ),
    ] {
        let (s, _, v) = call(&app, json_post("/v1/chat/completions", body)).await;
        assert_eq!((s, v["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some(param)), "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("levels deep"), "{v}");
    }
    // `samplers` is honoured: at temperature 2, top-k 1 is greedy; leaving top_k out of the
    // samplers turns it off (llama-server's rule), so the text wanders again.
    let text = |extra: Value| {
        let mut body = json!({"prompt": "the quick brown fox", "n_predict": 24, "seed": 3});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let app = app.clone();
        async move {
            let (s, _, v) = call(&app, post_with("/completion", &[], &body.to_string())).await;
            assert_eq!(s, StatusCode::OK, "{body}: {v}");
            v["content"].as_str().unwrap().to_string()
        }
    };
    let greedy = text(json!({"temperature": 0})).await;
    let hot = text(json!({"temperature": 2, "top_p": 1, "min_p": 0, "top_k": 0})).await;
    assert_ne!(hot, greedy, "temperature 2 should wander off the greedy path on the toy model");
    assert_eq!(
        text(json!({"temperature": 2, "top_k": 1, "samplers": ["top_k", "temperature"]})).await,
        greedy
    );
    assert_eq!(text(json!({"temperature": 2, "top_k": 1, "samplers": "edskypmxt"})).await, greedy);
    assert_eq!(text(json!({"temperature": 2, "top_k": 1, "samplers": ["temperature"]})).await, hot);
}

/// Review row 9: the chat page comes with a strict Content-Security-Policy that still lets its
/// own inline script and style run (the hashes are recomputed here with another SHA-256), and is
/// not to be framed, sniffed or sent as a referrer.
#[tokio::test]
async fn the_chat_page_has_a_strict_policy_that_lets_its_own_code_run() {
    use base64::Engine as _;
    let r = app().oneshot(Request::get("/").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let h = r.headers().clone();
    let page = String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(h[header::CONTENT_TYPE].to_str().unwrap().starts_with("text/html"), "{h:?}");
    assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
    assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    assert_eq!(h[header::REFERRER_POLICY], "no-referrer");
    let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
    let directive = |name: &str| -> Vec<String> {
        let d = csp.split(';').map(str::trim).find(|d| d.split_whitespace().next() == Some(name));
        d.unwrap_or_else(|| panic!("no {name} in {csp}"))
            .split_whitespace()
            .skip(1)
            .map(str::to_string)
            .collect()
    };
    assert_eq!(directive("default-src"), ["'self'"]);
    assert_eq!(directive("frame-ancestors"), ["'none'"]);
    assert_eq!(directive("object-src"), ["'none'"]);
    for tag in ["script", "style"] {
        let sources = directive(&format!("{tag}-src"));
        assert!(!sources.iter().any(|s| s.contains("unsafe")), "{csp}");
        // Every inline block's hash is listed, and nothing else.
        let mut hashes = Vec::new();
        for block in page.split(&format!("<{tag}>")).skip(1) {
            let text = &block[..block.find(&format!("</{tag}>")).unwrap()];
            let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
            hashes.push(format!("'sha256-{}'", base64::engine::general_purpose::STANDARD.encode(digest)));
        }
        assert_eq!(hashes.len(), 1, "one inline <{tag}> block");
        assert_eq!(sources, hashes, "{tag}: {csp}");
    }
    // What hashes do not cover must not be in the page: attributes with code or style, or
    // `<script>`/`<style>` with attributes (their text would not be found above).
    for never in
        [" style=", " onclick=", " onload=", " onsubmit=", "javascript:", "<script ", "<style ", "<link"]
    {
        assert!(!page.contains(never), "the page uses {never:?}, which the policy blocks");
    }
    // The key: this tab's sessionStorage unless "remember" is ticked.
    assert!(page.contains("sessionStorage.setItem(KEY") && page.contains("id=\"remember\""));
    assert!(page.contains("localStorage.removeItem(KEY)"));
}
