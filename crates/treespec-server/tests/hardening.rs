//! Hostile requests against the server (issue #15), on the toy backend: llama-server sampling
//! fields, wrong methods, half-closed connections, and text cut inside a character.

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
use treespec_engine::{Method, TokenBytes};
use treespec_server::fifo::{run_generation, Structure};
use treespec_server::validate::{JobSpec, PromptInput};
use treespec_server::{router, EnginePool, Event, Metrics, ServerConfig, ToyConfig};

fn app() -> Router {
    let metrics = Arc::new(Metrics::default());
    let pool = Arc::new(EnginePool::toy(ToyConfig::default(), 1, 8, metrics.clone()));
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
    for (field, bad) in [
        ("top_k", json!(0)),
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

/// Every token is the first three bytes of the four-byte "😀".
struct PartialEmoji;

impl TokenBytes for PartialEmoji {
    fn token_bytes(&self, _: TokenId) -> Vec<u8> {
        "😀".as_bytes()[..3].to_vec()
    }
}

fn text_of_one_token() -> String {
    let mut target = ToyLm::new(ToyModel::new(8, 1, 7), 64);
    let mut drafter = Method::Plain.build::<ToyLm>(None).unwrap();
    let spec = JobSpec {
        prompt: PromptInput::Text("ab".into()),
        max_tokens: Some(1),
        sampling: Default::default(),
        seed: 0,
        stop: Vec::new(),
        method: None,
        stream: false,
        include_usage: false,
        output: Default::default(),
        logprobs: None,
        tools: None,
    };
    let mut text = String::new();
    let mut done = false;
    run_generation(
        &mut target,
        drafter.as_mut(),
        "plain",
        spec.generate_request(vec![0, 1], 1, Vec::new()),
        &PartialEmoji,
        Structure::default(),
        &mut |e| {
            match e {
                Event::Text(t) => text.push_str(&t),
                Event::Done(f) => done = f.finish_reason == "length",
                _ => {}
            }
            true
        },
    )
    .unwrap();
    assert!(done);
    text
}

/// Row 10: max_tokens ending inside a multi-byte character drops the incomplete bytes instead of
/// sending U+FFFD. Streamed responses send these text events as chunks, non-streamed ones join
/// them, so both are covered by this one event stream.
#[test]
fn output_cut_inside_a_character_has_no_replacement_character() {
    assert_eq!(text_of_one_token(), "");
}
