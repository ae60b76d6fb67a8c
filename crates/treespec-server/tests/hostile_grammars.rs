//! Hostile grammars are the client's fault, said clearly (issue #29): schemas whose `$ref`s
//! recurse without end, ref chains deep enough to overflow the grammar compiler, schemas wide
//! enough to take seconds, in `response_format` and in tools, streamed or not, get a 400
//! `invalid_request_error` naming the field, quickly, with one sentence and none of the
//! parser's internals: they are compiled during validation, before any response starts. Also
//! `stream_options` without `stream: true`. On the toy backend (validation needs no model).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::Router;
use serde_json::{json, Map, Value};
use treespec_server::{router, BatchPool, Metrics, SchedulerConfig, ServerConfig, ToyConfig};
/// One lane: one request at a time, `queue` waiting.
fn one_lane(queue: usize) -> SchedulerConfig {
    SchedulerConfig { parallel: 1, queue, ..Default::default() }
}

fn app() -> Router {
    let metrics = Arc::new(Metrics::default());
    let pool = Arc::new(BatchPool::toy(ToyConfig::default(), one_lane(16), metrics.clone()));
    router(pool, metrics, ServerConfig::default())
}

async fn post(app: &Router, body: &Value) -> (StatusCode, String) {
    common::post_chat(app, body.clone()).await
}

fn chat(extra: Value) -> Value {
    let mut v = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8});
    v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    v
}

fn schema(schema: Value) -> Value {
    json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
}

fn tool(parameters: Value, choice: Value) -> Value {
    json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}},
        {"type": "function", "function": {"name": "g"}}], "tool_choice": choice})
}

fn defs_cycle() -> Value {
    json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}})
}

/// `$defs` chaining `n` levels deep: a flat body that would overflow the compiler's stack.
fn ref_chain(n: usize) -> Value {
    let mut defs = Map::new();
    for i in 0..n {
        defs.insert(
            format!("a{i}"),
            json!({"type": "array", "items": {"$ref": format!("#/$defs/a{}", i + 1)}}),
        );
    }
    defs.insert(format!("a{n}"), json!({"type": "integer"}));
    json!({"$ref": "#/$defs/a0", "$defs": defs})
}

/// A 400 naming `param`, streamed or not, within a second; the message says `needle`.
async fn refused(app: &Router, body: Value, param: &str, needle: &str) {
    for stream in [false, true] {
        let mut body = body.clone();
        body["stream"] = json!(stream);
        let t = Instant::now();
        let (s, text) = post(app, &body).await;
        assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
        assert_eq!(s, StatusCode::BAD_REQUEST, "stream {stream}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        assert_eq!(v["error"]["type"], "invalid_request_error", "{text}");
        assert_eq!(v["error"]["param"], param, "{text}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains(needle), "{needle:?} not in {m:?}");
        for internal in ["NoExtensionBias", "<state>", "Parser", "Tokens:", "\n", "Too many items"] {
            assert!(!m.contains(internal), "{internal:?} in {m:?}");
        }
        assert!(m.len() < 320, "{m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_refs_are_400s_naming_the_field() {
    let app = app();
    refused(&app, chat(schema(json!({"$ref": "#"}))), "response_format", "recurses without end").await;
    refused(&app, chat(schema(defs_cycle())), "response_format", "#/$defs/a").await;
    let required = json!({"type": "object", "properties": {"k": {"$ref": "#"}}, "required": ["k"]});
    refused(&app, chat(schema(required)), "response_format", "recurses without end").await;
    // In a tool, `#` is the tool's parameters (not the call wrapper around them).
    for choice in [json!("required"), json!({"type": "function", "function": {"name": "f"}}), json!("auto")] {
        let body = chat(tool(json!({"$ref": "#"}), choice));
        refused(&app, body, "tools[0].function.parameters", "recurses without end").await;
    }
    refused(&app, chat(tool(defs_cycle(), json!("required"))), "tools[0].function.parameters", "#/$defs/a")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_and_huge_schemas_are_400s_not_crashes_or_hangs() {
    let app = app();
    refused(&app, chat(schema(ref_chain(2000))), "response_format", "levels deep").await;
    refused(
        &app,
        chat(tool(ref_chain(2000), json!("required"))),
        "tools[0].function.parameters",
        "levels deep",
    )
    .await;
    let props: Map<String, Value> = (0..5000).map(|i| (format!("p{i}"), json!({"type": "string"}))).collect();
    let wide = json!({"type": "object", "properties": props});
    refused(&app, chat(schema(wide.clone())), "response_format", "properties").await;
    refused(&app, chat(tool(wide, json!("auto"))), "tools[0].function.parameters", "properties").await;
    // Within its depth limit alone, but not inside the call wrapper: the combined grammar.
    let nest =
        |n: usize| (0..n).fold(json!({"type": "integer"}), |s, _| json!({"type": "array", "items": s}));
    assert!(treespec_grammar::GrammarSpec::JsonSchema(nest(63)).check().is_ok());
    refused(&app, chat(tool(nest(63), json!("required"))), "tools", "levels deep").await;
    // The server is still up.
    assert_eq!(post(&app, &chat(json!({}))).await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn good_schemas_pass_validation() {
    // The toy backend cannot decode under a grammar: its 400 says so (past validation).
    let app = app();
    let city = json!({"type": "object", "properties": {"city": {"$ref": "#/$defs/city"}}, "required": ["city"],
        "$defs": {"city": {"type": "string"}}});
    for body in [chat(schema(city.clone())), chat(tool(city, json!("required")))] {
        let (s, text) = post(&app, &body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{text}");
        assert!(text.contains("toy backend"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_options_need_stream_true() {
    let app = app();
    for stream in [json!(false), Value::Null] {
        let mut body = chat(json!({"stream_options": {"include_usage": true}}));
        if !stream.is_null() {
            body["stream"] = stream;
        }
        let (s, text) = post(&app, &body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["param"], "stream_options", "{text}");
    }
    let (s, text) =
        post(&app, &chat(json!({"stream": true, "stream_options": {"include_usage": true}}))).await;
    assert_eq!(s, StatusCode::OK, "{text}");
    assert!(text.contains("\"usage\":{"), "{text}");
}
