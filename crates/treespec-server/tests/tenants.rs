//! Sharing a server safely (issue #29), on toy models through HTTP:
//! - the cross-tenant trial: client A sends a sentence with a secret; client B sends the same
//!   sentence with each of four candidates and picks the one answered in fewest target forwards.
//!   With two keys B's statistics on every candidate are exactly those of a server nobody else
//!   used (B learns nothing: its pick is chance); with `--share-history all` B finds the secret
//!   every time (so the trial can fail);
//! - `/metrics` and `/openapi.json` follow the keys unless opened;
//! - a non-streamed request whose client goes away lets go of its generation, and a client
//!   that only half-closed still gets its answer;
//! - `stream_options` without `stream` is a 400.

mod common;

use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::Router;
use common::send;
use serde_json::{json, Value};
use treespec_engine::drafters::SuffixConfig;
use treespec_engine::Method;
use treespec_server::{router, ApiKeys, BatchPool, Metrics, SchedulerConfig, ServerConfig, ToyConfig};

const KEYS: [&str; 2] = ["key-of-a", "key-of-b"];
const CANDIDATES: [&str; 4] = ["heron", "quokka", "marmot", "ibis"];

/// A batching toy server whose default method drafts from the suffix history; `keys` as
/// `--api-key`, `share` as `--share-history all`.
fn server(keys: &[&str], share: bool, metrics_open: bool) -> (Router, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let config =
        ToyConfig { method: Method::Suffix(SuffixConfig::default()), context: 512, ..Default::default() };
    let pool = Arc::new(BatchPool::toy(config, SchedulerConfig::default(), metrics.clone()));
    let api_keys = ApiKeys::new(keys.iter().map(|k| k.to_string()), share);
    let app = router(pool, metrics.clone(), ServerConfig { api_keys, metrics_open, ..Default::default() });
    (app, metrics)
}

/// The sentence with a codename, as a completion prompt that ends in it (the toy target's next
/// token depends on the last one, so each codename has its own answer).
fn motto(codename: &str) -> Value {
    json!({
        "prompt": format!("a one line motto for my company whose secret codename is {codename}"),
        "max_tokens": 48,
        "temperature": 0,
    })
}

/// Target forwards a request for `codename` with `key` took.
async fn forwards(app: &Router, key: Option<&str>, codename: &str) -> u64 {
    let (s, v) = send(app, key, "/v1/completions", Some(motto(codename))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v["treespec"]["target_forwards"].as_u64().unwrap()
}

/// B's forwards on `candidate` on a fresh server where A first sent `secret` (None: nobody).
async fn b_sees(secret: Option<&str>, candidate: &str, share: bool) -> u64 {
    let (app, _) = server(&KEYS, share, false);
    if let Some(secret) = secret {
        forwards(&app, Some(KEYS[0]), secret).await;
    }
    forwards(&app, Some(KEYS[1]), candidate).await
}

/// B's pick: the candidate answered in fewest forwards (the first of a tie).
fn pick(forwards: &[u64]) -> usize {
    (0..forwards.len()).min_by_key(|&i| forwards[i]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_learns_nothing_from_the_history() {
    // What B sees of each candidate when nobody else ever used the server.
    let mut alone = Vec::new();
    for c in CANDIDATES {
        alone.push(b_sees(None, c, false).await);
    }
    let (mut found_apart, mut found_shared) = (0, 0);
    for (k, secret) in CANDIDATES.iter().enumerate() {
        let (mut apart, mut shared) = (Vec::new(), Vec::new());
        for c in CANDIDATES {
            apart.push(b_sees(Some(secret), c, false).await);
            shared.push(b_sees(Some(secret), c, true).await);
        }
        assert_eq!(apart, alone, "with two tenants, B sees what a fresh server shows (secret {secret})");
        found_apart += usize::from(pick(&apart) == k);
        found_shared += usize::from(pick(&shared) == k);
        assert!(shared[k] < alone[k], "sharing, B copies A's answer: {shared:?} against {alone:?}");
    }
    eprintln!(
        "B picked A's secret {found_apart}/4 with tenants apart, {found_shared}/4 with the history shared"
    );
    assert_eq!(found_shared, CANDIDATES.len(), "sharing the history reveals the secret");
    // Apart, B's pick does not depend on the secret: the same candidate every trial.
    assert!(found_apart <= 1, "{found_apart}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_still_learns_from_its_own_requests() {
    let (app, _) = server(&KEYS, false, false);
    let first = forwards(&app, Some(KEYS[0]), "heron").await;
    let again = forwards(&app, Some(KEYS[0]), "heron").await;
    assert!(again < first, "{again} against {first}");
}

#[tokio::test]
async fn metrics_and_openapi_follow_the_keys_unless_opened() {
    let (closed, _) = server(&KEYS, false, false);
    for path in ["/metrics", "/openapi.json"] {
        assert_eq!(send(&closed, None, path, None).await.0, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(send(&closed, Some("nope"), path, None).await.0, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(send(&closed, Some(KEYS[1]), path, None).await.0, StatusCode::OK, "{path}");
    }
    assert_eq!(send(&closed, None, "/health", None).await.0, StatusCode::OK);
    let (open, _) = server(&KEYS, false, true);
    for path in ["/metrics", "/openapi.json", "/health"] {
        assert_eq!(send(&open, None, path, None).await.0, StatusCode::OK, "{path}");
    }
    // Without keys everything is open, as before.
    let (keyless, _) = server(&[], false, false);
    assert_eq!(send(&keyless, None, "/metrics", None).await.0, StatusCode::OK);
    let (s, _) = send(&keyless, None, "/v1/completions", Some(motto("ibis"))).await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn stream_options_without_stream_is_refused() {
    let (app, _) = server(&[], false, false);
    let mut body = motto("ibis");
    body["stream_options"] = json!({"include_usage": true});
    let (s, v) = send(&app, None, "/v1/completions", Some(body.clone())).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["param"], "stream_options", "{v}");
    body["stream"] = json!(true);
    assert_eq!(send(&app, None, "/v1/completions", Some(body)).await.0, StatusCode::OK);
}

/// A slow toy server on a real socket (the disconnect is seen by the connection, not by axum).
async fn slow_socket_server() -> (std::net::SocketAddr, Arc<Metrics>, tokio::sync::oneshot::Sender<()>) {
    let metrics = Arc::new(Metrics::default());
    let config = ToyConfig { step_delay: Duration::from_millis(20), context: 4096, ..Default::default() };
    let pool = Arc::new(BatchPool::toy(config, SchedulerConfig::default(), metrics.clone()));
    let app = router(pool, metrics.clone(), ServerConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(treespec_server::serve(listener, app, async move {
        let _ = stop_rx.await;
    }));
    (addr, metrics, stop_tx)
}

fn raw_request(addr: std::net::SocketAddr, max_tokens: usize) -> TcpStream {
    common::raw_chat(
        addr,
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}),
    )
}

fn gauge(metrics: &Metrics, name: &str) -> f64 {
    let text = metrics.render_server(0);
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_non_streamed_request_lets_go() {
    let (addr, metrics, stop) = slow_socket_server().await;
    // 2,000 tokens at 20 ms a step: about 40 s if nobody cancels it.
    let client = tokio::task::spawn_blocking(move || {
        let s = raw_request(addr, 2000);
        std::thread::sleep(Duration::from_millis(500));
        drop(s); // the client gives up (curl -m): its socket is closed
    });
    client.await.unwrap();
    let start = Instant::now();
    while gauge(&metrics, "treespec_cancelled_total") < 1.0 && start.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gauge(&metrics, "treespec_cancelled_total") >= 1.0, "{}", metrics.render_server(0));
    assert_eq!(gauge(&metrics, "treespec_generations_in_flight"), 0.0, "{}", metrics.render_server(0));
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_closed_client_of_a_long_answer_still_gets_it() {
    let (addr, metrics, stop) = slow_socket_server().await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40});
    let response = tokio::task::spawn_blocking(move || common::half_closed_chat(addr, &body)).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response:?}");
    // The body: spaces while it waited, then the answer (chunked: take the JSON out).
    let json_start = response.find("{\"").unwrap();
    let json_end = response.rfind('}').unwrap();
    let v: Value = serde_json::from_str(&response[json_start..=json_end]).unwrap();
    assert_eq!(v["object"], "chat.completion", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 40, "{v}");
    assert_eq!(gauge(&metrics, "treespec_cancelled_total"), 0.0);
    let _ = stop.send(());
}
