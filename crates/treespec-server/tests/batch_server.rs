//! The continuous-batching scheduler through HTTP, on toy models: many concurrent requests of
//! different methods share steps, and each answer is exactly the answer it gets alone (sampled,
//! with its seed); admission beyond the queue is a 503; a client that leaves frees its lane.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use serde_json::{json, Value};
use treespec_server::{
    router, BatchPool, GenerationBackend, Metrics, SchedulerConfig, ServerConfig, ToyConfig,
};

fn app(
    parallel: usize,
    queue: usize,
    config: ToyConfig,
) -> (Router, Arc<dyn GenerationBackend>, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let scheduler = SchedulerConfig { parallel, queue, ..Default::default() };
    let pool: Arc<dyn GenerationBackend> = Arc::new(BatchPool::toy(config, scheduler, metrics.clone()));
    (router(pool.clone(), metrics.clone(), ServerConfig::default()), pool, metrics)
}

/// Request `i`, sampled with its seed: a named seed decides the text under every method
/// (reproducible sampling), also `suffix` (a history shared across requests) and cost-aware
/// `dyspec` (shared learned costs), which draft differently beside other requests.
fn request(i: usize) -> Value {
    let methods = ["plain", "chain", "lookup", "suffix", "dyspec"];
    json!({
        "messages": [{"role": "user", "content": format!("request {i}: {}", "abc ".repeat(i % 4))}],
        "max_tokens": 12 + i % 9,
        "temperature": 0.9,
        "seed": 1000 + i,
        "treespec": {"method": methods[i % methods.len()]},
    })
}

async fn answer(app: &Router, body: Value) -> (StatusCode, String) {
    let (status, body) = common::post_chat(app, body).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let text =
        v["choices"][0]["message"]["content"].as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
    (status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_get_what_they_get_alone() {
    const N: usize = 16;
    let (alone_app, _, _) = app(1, N, ToyConfig::default());
    let mut alone = Vec::new();
    for i in 0..N {
        let (s, text) = answer(&alone_app, request(i)).await;
        assert_eq!(s, StatusCode::OK, "{text}");
        alone.push(text);
    }
    let (app, _, metrics) = app(4, N, ToyConfig::default());
    let handles: Vec<_> = (0..N)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move { answer(&app, request(i)).await })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let (s, text) = h.await.unwrap();
        assert_eq!(s, StatusCode::OK, "{text}");
        assert_eq!(text, alone[i], "request {i}");
    }
    let text = metrics.render_server(0);
    let steps = metric(&text, "treespec_batch_size_count");
    let lanes = metric(&text, "treespec_batch_size_sum");
    assert!(lanes > steps * 1.5, "requests shared steps: {lanes} lane-steps in {steps} steps\n{text}");
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("{name} missing"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_a_503_and_every_admitted_request_finishes() {
    let config = ToyConfig { step_delay: Duration::from_millis(5), ..Default::default() };
    let (app, pool, _) = app(2, 3, config);
    let handles: Vec<_> = (0..12)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move { answer(&app, request(i)).await })
        })
        .collect();
    let mut ok = 0;
    let mut busy = 0;
    for h in handles {
        match h.await.unwrap() {
            (StatusCode::OK, _) => ok += 1,
            (StatusCode::SERVICE_UNAVAILABLE, text) => {
                assert!(text.contains("queue_full"), "{text}");
                busy += 1
            }
            (s, text) => panic!("{s}: {text}"),
        }
    }
    assert!(ok >= 2 && busy >= 1, "ok {ok}, busy {busy}");
    assert_eq!(ok + busy, 12);
    assert_eq!(pool.queue_depth(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_come_with_every_token_streaming_or_not() {
    let (app, _, _) = app(2, 8, ToyConfig::default());
    let body = json!({
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 9,
        "temperature": 0,
        "logprobs": true,
        "top_logprobs": 3,
        "treespec": {"method": "chain"},
    });
    let (s, whole) = common::post_chat(&app, body.clone()).await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_str(&whole).unwrap();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(content.len() as u64, v["usage"]["completion_tokens"].as_u64().unwrap());
    let text: String = content.iter().map(|e| e["token"].as_str().unwrap()).collect();
    assert_eq!(text, v["choices"][0]["message"]["content"].as_str().unwrap());
    for e in &content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the emitted token is the most likely one.
        assert_eq!(top[0]["token"], e["token"]);
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
    }
    // Streaming: the same entries, spread over the chunks.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, sse) = common::post_chat(&app, streamed).await;
    let entries: Vec<Value> = common::sse_chunks(&sse)
        .into_iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(entries, content);
}

/// A request that waits for room keeps its preparation (prompt, drafter) for when it fits; if its
/// client leaves first, the next request must be served with its own prompt, not the one kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_behind_one_that_left_while_waiting_for_room_gets_its_own_answer() {
    let config = ToyConfig {
        context: 160,
        shared_cells: Some(200),
        step_delay: Duration::from_millis(20),
        ..Default::default()
    };
    let long = |who: &str| {
        json!({
            "messages": [{"role": "user", "content": format!("{who} wants a long answer")}],
            "max_tokens": 85,
            "temperature": 0.0,
        })
    };
    let small = json!({
        "messages": [{"role": "user", "content": "small"}],
        "max_tokens": 6,
        "temperature": 0.0,
    });
    let (alone_app, _, _) = app(1, 4, config.clone());
    let (s, want) = answer(&alone_app, small.clone()).await;
    assert_eq!(s, StatusCode::OK, "{want}");
    let (app, _, _) = app(2, 4, config);
    // A decodes; B's reservation does not fit beside A's (2 × (38 + 85) > 200 shared cells), so B
    // waits with its preparation kept; then B's client leaves, and C arrives.
    let a = tokio::spawn({
        let app = app.clone();
        async move { answer(&app, long("a")).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let b = tokio::spawn({
        let app = app.clone();
        async move { answer(&app, long("b")).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.abort();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (s, got) = answer(&app, small).await;
    assert_eq!(s, StatusCode::OK, "{got}");
    assert_eq!(got, want, "the small request was served with its own prompt");
    let (s, text) = a.await.unwrap();
    assert_eq!(s, StatusCode::OK, "{text}");
}

/// Three identical requests at temperature 1 under each of plain, suffix, auto and dyspec,
/// decoded side by side: with a seed every answer is plain decoding's; without one the
/// speculative methods sample with rejection steps, and their answers part from plain's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_requests_give_plain_decodings_text_under_every_method() {
    let body = |method: &str, seed: Option<u64>| {
        let mut b = json!({
            "messages": [{"role": "user", "content": "tell me abc abc abc"}],
            "max_tokens": 40,
            "temperature": 1.0,
            "treespec": {"method": method},
        });
        if let Some(seed) = seed {
            b["seed"] = json!(seed);
        }
        b
    };
    let methods = ["plain", "suffix", "auto", "dyspec"];
    for seed in [Some(42), None] {
        let (app, _, _) = app(4, 16, ToyConfig::default());
        let handles: Vec<_> = (methods.iter().flat_map(|m| [m; 3]))
            .map(|m| {
                let (app, body) = (app.clone(), body(m, seed));
                tokio::spawn(async move { answer(&app, body).await })
            })
            .collect();
        let mut texts = Vec::new();
        for h in handles {
            let (s, text) = h.await.unwrap();
            assert_eq!(s, StatusCode::OK, "{text}");
            texts.push(text);
        }
        let same = texts.iter().all(|t| *t == texts[0]);
        match seed {
            Some(_) => assert!(same, "seeded answers differ: {texts:?}"),
            None => assert!(!same, "unseeded answers all equal plain's: {texts:?}"),
        }
    }
}
