//! Shared by the server tests: where SmolLM2-135M lives, and posting chat requests to a router.
#![allow(dead_code)]

use std::path::PathBuf;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

/// `models/SmolLM2-135M-Instruct.Q4_1.gguf`, or None (skip) when it is missing and
/// TREESPEC_SKIP_MODEL_TESTS=1; missing otherwise is a failure.
pub fn model_path() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        return Some(p);
    }
    if std::env::var("TREESPEC_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!("skipping: {} is missing and TREESPEC_SKIP_MODEL_TESTS=1", p.display());
        return None;
    }
    panic!("{} is missing: run scripts/fetch-models.sh (or set TREESPEC_SKIP_MODEL_TESTS=1)", p.display());
}

/// POST a chat request; the status and the body (JSON, or the raw SSE text).
pub async fn post_chat(app: &Router, body: Value) -> (StatusCode, String) {
    let req = Request::post("/v1/chat/completions")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let r = app.clone().oneshot(req).await.unwrap();
    let status = r.status();
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

/// Send `body` (POST) or nothing (GET) to `path` with `key` as the bearer token; the status and
/// the body (JSON, or the raw text as a string).
pub async fn send(app: &Router, key: Option<&str>, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let mut req = match &body {
        Some(b) => Request::post(path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(b.to_string()))
            .unwrap(),
        None => Request::get(path).body(Body::empty()).unwrap(),
    };
    if let Some(k) = key {
        req.headers_mut().insert(header::AUTHORIZATION, format!("Bearer {k}").parse().unwrap());
    }
    let r = app.clone().oneshot(req).await.unwrap();
    let status = r.status();
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// The JSON chunks of an SSE body (without `[DONE]`, which must end it).
pub fn sse_chunks(body: &str) -> Vec<Value> {
    let data: Vec<&str> = body.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{body}");
    data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect()
}

/// Send a chat request over a real socket as raw HTTP/1.1 (read timeout 60 s): for what only a
/// connection shows (half-closing, leaving).
pub fn raw_chat(addr: std::net::SocketAddr, body: &Value) -> std::net::TcpStream {
    use std::io::Write;
    let body = body.to_string();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

/// [`raw_chat`], then half-close the write side (as `curl`-like tools and some proxies do) and
/// read the whole response.
pub fn half_closed_chat(addr: std::net::SocketAddr, body: &Value) -> String {
    use std::io::Read;
    let mut s = raw_chat(addr, body);
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// A chat request that must call a tool (`get_weather` or `get_time`), greedy.
pub fn weather_request(extra: Value) -> Value {
    let mut v = json!({
        "messages": [{"role": "user", "content": "What is the weather like in Paris today?"}],
        "temperature": 0, "max_tokens": 64,
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"], "additionalProperties": false}}},
            {"type": "function", "function": {"name": "get_time"}}
        ],
        "tool_choice": "required",
    });
    v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    v
}
