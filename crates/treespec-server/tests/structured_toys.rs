//! Structured output through the server on the JSON toy (`ToyConfig::json`: tokens that spell
//! JSON and an end token), so the grammar path — compiled against the model's vocabulary,
//! masks, forced tokens, the end of the object — runs with no model file (it moved here from
//! `structured.rs`, which runs on SmolLM2).

mod common;

use std::sync::Arc;

use axum::http::StatusCode;
use axum::Router;
use serde_json::{json, Value};
use treespec_server::{router, BatchPool, Metrics, SchedulerConfig, ServerConfig, ToyConfig};

fn app() -> Router {
    let metrics = Arc::new(Metrics::default());
    let config = ToyConfig { json: true, context: 1024, ..Default::default() };
    let scheduler = SchedulerConfig { parallel: 1, queue: 16, ..Default::default() };
    let pool = Arc::new(BatchPool::toy(config, scheduler, metrics.clone()));
    router(pool, metrics, ServerConfig::default())
}

/// A tool whose parameters use a local `$ref` (`#/$defs/city`) works as it does in
/// `response_format`: the call follows the parameters schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_parameters_with_local_refs_work() {
    let app = app();
    let params = json!({"type": "object", "properties": {"city": {"$ref": "#/$defs/city"}}, "required": ["city"],
        "additionalProperties": false, "$defs": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}});
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": params}}]);
    for stream in [false, true] {
        let body = common::weather_request(json!({"tools": tools, "stream": stream}));
        let (s, text) = common::post_chat(&app, body).await;
        assert_eq!(s, StatusCode::OK, "{text}");
        let arguments: String = if stream {
            let chunks = common::sse_chunks(&text);
            chunks
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
                .flatten()
                .filter_map(|p| p["function"]["arguments"].as_str())
                .collect()
        } else {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(
                v["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather",
                "{text}"
            );
            v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].as_str().unwrap().to_string()
        };
        let args: Value =
            serde_json::from_str(&arguments).unwrap_or_else(|e| panic!("{e}: {arguments}: {text}"));
        assert_eq!(args.as_object().unwrap().len(), 1, "{args}");
        assert!(["Paris", "Oslo"].contains(&args["city"].as_str().unwrap()), "{args}");
    }
}
