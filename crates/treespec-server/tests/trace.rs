//! The trace extension of streamed chat chunks (`X-Treespec-Trace: 1`): each content chunk says
//! how its text was produced, in runs whose texts make up the chunk exactly, and the finish
//! chunk carries the request's statistics; without the header nothing changes.

mod common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;
use treespec_engine::drafters::SuffixConfig;
use treespec_engine::Method;
use treespec_server::{router, BatchPool, Metrics, SchedulerConfig, ServerConfig, ToyConfig};

fn app(method: Method) -> Router {
    let metrics = Arc::new(Metrics::default());
    let config = ToyConfig { method, context: 512, ..Default::default() };
    let pool = Arc::new(BatchPool::toy(config, SchedulerConfig::default(), metrics.clone()));
    router(pool, metrics, ServerConfig::default())
}

async fn stream(app: &Router, trace: bool) -> Vec<Value> {
    let body = json!({
        "messages": [{"role": "user", "content": "repeat after me: abcabcabc"}],
        "max_tokens": 60, "temperature": 0, "stream": true,
    });
    let mut req = Request::post("/v1/chat/completions")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    if trace {
        req.headers_mut().insert("x-treespec-trace", "1".parse().unwrap());
    }
    let r = app.clone().oneshot(req).await.unwrap();
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    common::sse_chunks(std::str::from_utf8(&bytes).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traced_chunks_say_how_their_text_was_produced() {
    let app = app(Method::Suffix(SuffixConfig::default()));
    let chunks = stream(&app, true).await;
    let mut by = std::collections::BTreeMap::<String, usize>::new();
    let mut text = String::new();
    for c in &chunks {
        let Some(content) = c["choices"][0]["delta"]["content"].as_str().filter(|t| !t.is_empty()) else {
            continue;
        };
        text.push_str(content);
        let spans = c["treespec"]["spans"].as_array().unwrap_or_else(|| panic!("no spans: {c}"));
        let joined: String = spans.iter().map(|s| s["text"].as_str().unwrap()).collect();
        assert_eq!(joined, content, "spans make up the chunk: {c}");
        for s in spans {
            let kind = s["by"].as_str().unwrap();
            assert!(["copied", "drafted", "forced", "target"].contains(&kind), "{s}");
            *by.entry(kind.to_string()).or_default() += s["text"].as_str().unwrap().len();
        }
        // A step ends with the target's own token.
        assert_eq!(spans.last().unwrap()["by"], "target", "{c}");
    }
    assert_eq!(text.len(), 60, "one letter a token");
    // The toy's answer repeats itself: the suffix drafter copies most of it.
    assert!(by.get("copied").copied().unwrap_or(0) > 0, "{by:?}");
    assert!(by.get("target").copied().unwrap_or(0) > 0, "{by:?}");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
    let stats = &last["treespec"]["stats"];
    assert_eq!(stats["method"], "suffix", "{last}");
    let forwards = stats["target_forwards"].as_u64().unwrap();
    // Every forward ends in exactly one target token; the rest were copied.
    assert_eq!(by["target"], forwards as usize, "{by:?} in {forwards} forwards");
    assert_eq!(by["copied"] + by["target"], 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_decoding_is_all_target_and_untraced_chunks_are_unchanged() {
    let app = app(Method::Plain);
    for c in stream(&app, true).await {
        for s in c["treespec"]["spans"].as_array().into_iter().flatten() {
            assert_eq!(s["by"], "target", "{c}");
        }
    }
    for c in stream(&app, false).await {
        assert!(c.get("treespec").is_none(), "{c}");
    }
}
