//! Sharing safely, second pass (issue #40), on toy models through HTTP:
//! - the cross-tenant metrics trial: tenant B scrapes `/metrics` with its own key around tenant
//!   A's request and reads nothing of it (the operator's key reads it: the trial can fail);
//! - `/slots` shows a tenant only its own requests, `/health` no queue behind keys;
//! - a queued request whose client has gone leaves the queue at once (no 503 for the live ones),
//!   while a client that only half-closed in the queue still gets its answer.

mod common;

use std::io::Read;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::Router;
use common::send;
use serde_json::{json, Value};
use treespec_engine::drafters::SuffixConfig;
use treespec_engine::Method;
use treespec_server::{
    router, ApiKeys, BatchPool, GenerationBackend, Metrics, SchedulerConfig, ServerConfig, ToyConfig,
};

const KEYS: [&str; 2] = ["key-of-a", "key-of-b"];
const OPERATOR: &str = "operator-key";

/// A batching toy server drafting from the suffix history, with two tenant keys and an
/// operator key; `step_delay` slows each step.
fn server(step_delay: Duration) -> (Router, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let config = ToyConfig {
        method: Method::Suffix(SuffixConfig::default()),
        context: 1024,
        step_delay,
        ..Default::default()
    };
    let pool = Arc::new(BatchPool::toy(config, SchedulerConfig::default(), metrics.clone()));
    let api_keys = ApiKeys::new(KEYS.iter().map(|k| k.to_string()), false);
    let server = ServerConfig { api_keys, metrics_key: Some(OPERATOR.into()), ..Default::default() };
    (router(pool, metrics.clone(), server), metrics)
}

fn motto(codename: &str) -> Value {
    json!({
        "prompt": format!("a one line motto for my company whose secret codename is {codename}"),
        "max_tokens": 48,
        "temperature": 0,
    })
}

/// The `/metrics` text `key` reads.
async fn scrape(app: &Router, key: &str) -> String {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;
    let req = Request::get("/metrics").header("authorization", format!("Bearer {key}")).body(Body::empty());
    let r = app.clone().oneshot(req.unwrap()).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let bytes = axum::body::to_bytes(r.into_body(), 1 << 24).await.unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The sum of a family's samples.
fn total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

const TELLING: [&str; 5] = [
    "treespec_prompt_tokens_total",
    "treespec_completion_tokens_total",
    "treespec_target_forwards_total",
    "treespec_generations_total",
    "treespec_requests_total",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_reads_nothing_of_a_request_on_metrics() {
    let (app, _) = server(Duration::ZERO);
    // B's own request is in B's figures.
    let (s, _) = send(&app, Some(KEYS[1]), "/v1/completions", Some(motto("heron"))).await;
    assert_eq!(s, StatusCode::OK);
    let (b_before, op_before) = (scrape(&app, KEYS[1]).await, scrape(&app, OPERATOR).await);
    assert_eq!(total(&b_before, "treespec_generations_total"), 1.0, "{b_before}");
    let (s, v) = send(&app, Some(KEYS[0]), "/v1/completions", Some(motto("quokka"))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let forwards = v["treespec"]["target_forwards"].as_f64().unwrap();
    let (b_after, op_after) = (scrape(&app, KEYS[1]).await, scrape(&app, OPERATOR).await);
    // The operator reads A's request exactly (what the trial read with any key) …
    let op_delta = total(&op_after, "treespec_target_forwards_total")
        - total(&op_before, "treespec_target_forwards_total");
    assert_eq!(op_delta, forwards, "the operator's view holds every request");
    // … and B nothing at all: every line of its scrape is as before.
    assert_eq!(b_before, b_after, "B's figures moved with A's request");
    for family in TELLING {
        assert!(total(&op_after, family) > total(&b_after, family), "{family} is server-wide for B");
    }
    // A's own figures hold its request and nothing of B's.
    let a = scrape(&app, KEYS[0]).await;
    assert_eq!(total(&a, "treespec_target_forwards_total"), forwards, "{a}");
    // Server-wide families (the steps hold every tenant's rows) are the operator's only.
    assert!(
        op_after.contains("treespec_batch_steps_total") && !b_after.contains("treespec_batch_steps_total")
    );
}

#[tokio::test]
async fn the_operator_key_alone_opens_the_server_wide_metrics() {
    let (app, _) = server(Duration::ZERO);
    assert_eq!(send(&app, None, "/metrics", None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(send(&app, Some("nope"), "/metrics", None).await.0, StatusCode::UNAUTHORIZED);
    // The operator's key is not a tenant's: it opens no generation route.
    let (s, _) = send(&app, Some(OPERATOR), "/v1/completions", Some(motto("ibis"))).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    // Behind keys `/health` says nothing of the queue.
    let (s, h) = send(&app, None, "/health", None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(h.get("queue_depth").is_none(), "{h}");
}

#[tokio::test]
async fn health_says_when_the_cost_curve_is_provisional() {
    let (app, metrics) = server(Duration::ZERO);
    assert_eq!(send(&app, None, "/health", None).await.1["cost_curve"], "ready");
    metrics.measuring_costs(Some("suffix"));
    let h = send(&app, None, "/health", None).await.1;
    assert_eq!((h["cost_curve"].as_str(), h["serving_method"].as_str()), (Some("measuring"), Some("suffix")));
    metrics.measuring_costs(None);
    metrics.costs_provisional(true);
    assert_eq!(send(&app, None, "/health", None).await.1["cost_curve"], "provisional");
    assert!(scrape(&app, OPERATOR).await.contains("treespec_cost_curve_provisional 1"));
}

/// A slow toy server with one lane and room for two waiting requests, on a real socket.
async fn one_lane_server(keys: &[&str]) -> (SocketAddr, Served, tokio::sync::oneshot::Sender<()>) {
    let metrics = Arc::new(Metrics::default());
    let config = ToyConfig { step_delay: Duration::from_millis(20), context: 4096, ..Default::default() };
    let scheduler = SchedulerConfig { parallel: 1, queue: 2, ..Default::default() };
    let pool = Arc::new(BatchPool::toy(config, scheduler, metrics.clone()));
    let api_keys = ApiKeys::new(keys.iter().map(|k| k.to_string()), false);
    let app = router(pool.clone(), metrics.clone(), ServerConfig { api_keys, ..Default::default() });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(treespec_server::serve(listener, app, async move {
        let _ = stop_rx.await;
    }));
    (addr, Served { metrics, pool }, stop_tx)
}

/// What a test reads of a server: its metrics and its queue.
struct Served {
    metrics: Arc<Metrics>,
    pool: Arc<BatchPool>,
}

impl Served {
    /// The server-wide value of `series` (summed over its labels), the queue's depth included.
    fn gauge(&self, series: &str) -> f64 {
        let text = self.metrics.render_server(self.pool.queue_depth());
        text.lines()
            .filter(|l| l.starts_with(series))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    fn text(&self) -> String {
        self.metrics.render_server(self.pool.queue_depth())
    }
}

/// A raw HTTP/1.1 request on a new connection (read timeout 60 s).
fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&Value>,
) -> std::net::TcpStream {
    use std::io::Write;
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let auth = key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

fn chat(max_tokens: usize, stream: bool) -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "stream": stream})
}

fn read_all(mut s: std::net::TcpStream) -> String {
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

async fn wait_until(what: impl Fn() -> bool, limit: Duration) -> bool {
    let start = Instant::now();
    while !what() && start.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    what()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_requests_whose_clients_left_free_their_places() {
    let (addr, metrics, stop) = one_lane_server(&[]).await;
    // The lane: 2,000 tokens at 20 ms a step, about 40 s.
    let busy = tokio::task::spawn_blocking(move || {
        raw(addr, "POST", "/v1/chat/completions", None, Some(&chat(2000, true)))
    })
    .await
    .unwrap();
    assert!(
        wait_until(|| metrics.gauge("treespec_generations_in_flight") == 1.0, Duration::from_secs(10)).await
    );
    // Two clients queue (one streamed, one not) and leave while waiting.
    let queued = tokio::task::spawn_blocking(move || {
        [chat(8, true), chat(8, false)].map(|b| raw(addr, "POST", "/v1/chat/completions", None, Some(&b)))
    })
    .await
    .unwrap();
    let queue_full = || metrics.gauge("treespec_queue_depth") == 2.0;
    assert!(wait_until(queue_full, Duration::from_secs(10)).await, "{}", metrics.text());
    drop(queued);
    let left = || metrics.gauge("treespec_cancelled_total{method=\"queued\"}") == 2.0;
    assert!(wait_until(left, Duration::from_secs(5)).await, "{}", metrics.text());
    assert_eq!(metrics.gauge("treespec_queue_depth"), 0.0);
    assert_eq!(metrics.gauge("treespec_generations_in_flight"), 1.0, "the lane is still busy");
    // Their answers are counted apart from those clients received (nginx's 499), not as errors.
    let counted_apart =
        || metrics.gauge("treespec_requests_total{endpoint=\"/v1/chat/completions\",status=\"499\"}") == 2.0;
    assert!(wait_until(counted_apart, Duration::from_secs(5)).await, "{}", metrics.text());
    assert_eq!(
        metrics.gauge("treespec_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}"),
        1.0
    );
    assert_eq!(metrics.gauge("treespec_errors_total"), 0.0, "{}", metrics.text());
    // Two live requests fit the queue again while the lane is busy: no 503.
    let pool = metrics.pool.clone();
    let live = tokio::task::spawn_blocking(move || {
        let a = raw(addr, "POST", "/v1/chat/completions", None, Some(&chat(4, false)));
        let b = raw(addr, "POST", "/v1/chat/completions", None, Some(&chat(4, false)));
        let start = Instant::now();
        while pool.queue_depth() < 2 && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let c = read_all(raw(addr, "POST", "/v1/chat/completions", None, Some(&chat(4, false))));
        drop(busy); // the long stream leaves: its lane serves the two
        (read_all(a), read_all(b), c)
    })
    .await
    .unwrap();
    assert!(live.0.starts_with("HTTP/1.1 200") && live.1.starts_with("HTTP/1.1 200"), "{live:?}");
    assert!(live.2.starts_with("HTTP/1.1 503"), "a third live request finds the queue full: {:?}", live.2);
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closed_in_the_queue_still_gets_its_answer() {
    let (addr, metrics, stop) = one_lane_server(&[]).await;
    let busy = tokio::task::spawn_blocking(move || {
        // About 6 s of decoding: the two below queue behind it however slow the machine.
        raw(addr, "POST", "/v1/chat/completions", None, Some(&chat(300, false)))
    })
    .await
    .unwrap();
    assert!(
        wait_until(|| metrics.gauge("treespec_generations_in_flight") == 1.0, Duration::from_secs(10)).await
    );
    let answers = tokio::task::spawn_blocking(move || {
        [chat(12, false), chat(12, true)]
            .map(|b| {
                let s = raw(addr, "POST", "/v1/chat/completions", None, Some(&b));
                s.shutdown(std::net::Shutdown::Write).unwrap();
                s
            })
            .map(read_all)
    })
    .await
    .unwrap();
    assert!(read_all(busy).starts_with("HTTP/1.1 200"));
    let [whole, streamed] = answers;
    assert!(whole.starts_with("HTTP/1.1 200"), "{whole}");
    let v: Value =
        serde_json::from_str(&whole[whole.find("{\"").unwrap()..=whole.rfind('}').unwrap()]).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 12, "{v}");
    assert!(streamed.starts_with("HTTP/1.1 200") && streamed.contains("data: [DONE]"), "{streamed}");
    assert_eq!(metrics.gauge("treespec_cancelled_total"), 0.0);
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_show_a_tenant_only_its_own_requests() {
    let (addr, metrics, stop) = one_lane_server(&KEYS).await;
    let a = tokio::task::spawn_blocking(move || {
        raw(addr, "POST", "/v1/chat/completions", Some(KEYS[0]), Some(&chat(2000, true)))
    })
    .await
    .unwrap();
    assert!(
        wait_until(|| metrics.gauge("treespec_generations_in_flight") == 1.0, Duration::from_secs(10)).await
    );
    let busy_slots = |key: &'static str| async move {
        let text = tokio::task::spawn_blocking(move || read_all(raw(addr, "GET", "/slots", Some(key), None)))
            .await
            .unwrap();
        let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
        let slots: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text}"));
        slots.as_array().unwrap().iter().filter(|s| s["is_processing"] == true).count()
    };
    assert_eq!(busy_slots(KEYS[0]).await, 1, "A sees its own request");
    assert_eq!(busy_slots(KEYS[1]).await, 0, "B sees nothing of A's");
    drop(a);
    let _ = stop.send(());
}
