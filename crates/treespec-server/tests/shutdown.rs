//! The stop is bounded (issue #66): a server told to stop while streams run that would take
//! minutes drains for `--drain`, then ends them with a final event saying why (`finish_reason`
//! `shutdown`), saves the tenants' histories and returns within a couple of seconds; a second
//! stop request skips the drain. Toy models, so a "long answer" is a slow step times many tokens.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use treespec_core::ngram::TokenizerId;
use treespec_engine::Method;
use treespec_server::histories::TenantHistories;
use treespec_server::lifecycle::{self, Drain, HistoryFiles, Server, Serving, Start, StopSender, Stops};
use treespec_server::toy::toy_tokenizer;
use treespec_server::{
    router, BatchPool, Draining, Metrics, SchedulerConfig, ServerConfig, Tenant, ToyConfig,
};

const TOKENIZER: TokenizerId = TokenizerId { fingerprint: 0x5eed, vocab: 26 };

/// A toy server whose answers take 10 ms a step, its histories in a scratch directory, serving
/// on loopback through [`lifecycle::run`] with `drain`.
struct Running {
    addr: std::net::SocketAddr,
    stop: StopSender,
    draining: Draining,
    run: tokio::task::JoinHandle<anyhow::Result<()>>,
    dir: std::path::PathBuf,
}

async fn start(name: &str, drain: Duration) -> Running {
    let dir = std::env::temp_dir().join(format!("treespec-shutdown-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let histories =
        TenantHistories::in_files(&dir.join("h.bin"), TOKENIZER, 1 << 16, [Tenant::SHARED]).unwrap();
    let metrics = Arc::new(Metrics::default());
    let config = ToyConfig {
        context: 200_000,
        method: Method::Plain,
        step_delay: Duration::from_millis(10),
        histories: Some(histories.clone()),
        ..Default::default()
    };
    let pool = Arc::new(BatchPool::toy(config, SchedulerConfig::default(), metrics.clone()));
    let draining = Draining::default();
    let server = ServerConfig { draining: draining.clone(), ..Default::default() };
    let drain =
        Drain { draining: draining.clone(), backend: pool.clone(), metrics: metrics.clone(), most: drain };
    let serving =
        Serving { app: router(pool, metrics, server), drain, histories, save_every: None, tls: None };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stops) = Stops::channel();
    let run = tokio::spawn(lifecycle::run(listener, serving, stops));
    Running { addr, stop, draining, run, dir }
}

/// A request for 100,000 tokens, which at 10 ms a step would run for many minutes; the suffix
/// method, so what it decodes is learned into the tenant's history.
fn long_request(stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": "tell a very long story"}],
        "max_tokens": 100_000, "temperature": 0.0, "stream": stream,
        "treespec": {"method": "suffix"},
    })
}

/// Send `body` and read the whole answer (SSE text or JSON), as a client that keeps reading.
async fn answer(addr: std::net::SocketAddr, body: Value) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.text().await.unwrap_or_default())
}

/// The finish reason of a streamed or whole answer.
fn finish_reason(body: &str) -> Value {
    if body.starts_with("data:") {
        let chunks: Vec<Value> = body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect();
        assert_eq!(body.lines().filter(|l| l.starts_with("data: [DONE]")).count(), 1, "{body}");
        return chunks
            .iter()
            .rev()
            .map(|c| c["choices"][0]["finish_reason"].clone())
            .find(|f| !f.is_null())
            .unwrap();
    }
    serde_json::from_str::<Value>(body).unwrap()["choices"][0]["finish_reason"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_drain_deadline_running_requests_end_with_a_final_event_and_the_history_is_saved() {
    let server = start("deadline", Duration::from_millis(800)).await;
    let streamed = tokio::spawn(answer(server.addr, long_request(true)));
    let whole = tokio::spawn(answer(server.addr, long_request(false)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = Instant::now();
    server.stop.stop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(server.draining.is_draining(), "unready while draining");
    let (status, refused) = answer(server.addr, long_request(false)).await;
    assert_eq!(status, 503, "a new request while draining is refused retryably: {refused}");
    // Without a bound the stream would run for many minutes: fail instead of hanging.
    tokio::time::timeout(Duration::from_secs(10), server.run)
        .await
        .expect("the server stopped")
        .unwrap()
        .unwrap();
    let took = asked.elapsed();
    assert!(took < Duration::from_millis(800) + Duration::from_secs(2), "stopped {took:?} after the request");
    for (what, got) in [("streamed", streamed), ("whole", whole)] {
        let (status, body) = got.await.unwrap();
        assert_eq!(status, 200, "{what}: {body}");
        assert_eq!(finish_reason(&body), "shutdown", "{what}: {body}");
    }
    // What the ended requests decoded was saved: a restart finds it in the tenant's history.
    let again =
        TenantHistories::in_files(&server.dir.join("h.bin"), TOKENIZER, 1 << 16, [Tenant::SHARED]).unwrap();
    assert!(again.of(Tenant::SHARED).unwrap().history().docs() >= 2, "both answers were saved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_stop_request_skips_the_drain() {
    let server = start("twice", Duration::from_secs(600)).await;
    let streamed = tokio::spawn(answer(server.addr, long_request(true)));
    tokio::time::sleep(Duration::from_millis(400)).await;
    server.stop.stop();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!server.run.is_finished(), "the first request drains (for up to 600 s)");
    let asked = Instant::now();
    server.stop.stop();
    tokio::time::timeout(Duration::from_secs(10), server.run)
        .await
        .expect("the server stopped")
        .unwrap()
        .unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "stopped {:?} after the second request",
        asked.elapsed()
    );
    let (status, body) = streamed.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(finish_reason(&body), "shutdown", "{body}");
}

/// A toy server started as `treespec serve` starts its own ([`Server::toy`]: the histories
/// loaded from their file, the drain and the saves its own), then stopped while a long answer
/// runs: `/health` says it is draining, and what the answer decoded is in the file afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_server_is_unready_while_draining_and_saves_its_history() {
    let dir = std::env::temp_dir().join(format!("treespec-shutdown-started-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let files = HistoryFiles { path: dir.join("h.bin"), cap: 1 << 16, save_every: None };
    let start = Start {
        http: ServerConfig::default(),
        drain: Duration::from_millis(800),
        histories: Some(files),
        tls: None,
    };
    let config = ToyConfig {
        context: 200_000,
        method: Method::Plain,
        step_delay: Duration::from_millis(10),
        ..Default::default()
    };
    let server = Server::toy(start, config, SchedulerConfig::default()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stops) = Stops::channel();
    let run = tokio::spawn(server.run(listener, stops));
    let health = || async move { reqwest::get(format!("http://{addr}/health")).await.unwrap() };
    assert_eq!(health().await.status().as_u16(), 200, "ready before the stop");
    let streamed = tokio::spawn(answer(addr, long_request(true)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.stop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let unready = health().await;
    assert_eq!(unready.status().as_u16(), 503, "unready while draining");
    assert_eq!(unready.json::<Value>().await.unwrap()["status"], "draining");
    let stopped = tokio::time::timeout(Duration::from_secs(10), run).await.expect("the server stopped");
    assert!(!stopped.unwrap().unwrap().measuring, "a toy server measures no curves");
    let (status, body) = streamed.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(finish_reason(&body), "shutdown", "{body}");
    let again =
        TenantHistories::in_files(&dir.join("h.bin"), toy_tokenizer(26), 1 << 16, [Tenant::SHARED]).unwrap();
    assert!(again.of(Tenant::SHARED).unwrap().history().docs() >= 1, "the answer was saved");
}
