//! Replicas behind a real gateway (issue #42): two toy-model replicas on loopback and the SMG
//! gateway in front of them (`scripts/replicas.sh install` puts it in
//! `~/.cache/treespec/smg-1.13.0`; `TREESPEC_SMG=/path/to/smg` names another; without it the
//! gateway test says it is skipped and passes). Both turns of a conversation with a session key
//! reach the same replica and the second reuses the first's prefix there (the replica's counters
//! say so); a draining replica gets no new request while its neighbour answers them all. The
//! worker side alone (draining, `/v1/loads`, vLLM's gauges, `/v1/models`) is tested without SMG.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use treespec_server::{router, BatchPool, Draining, Metrics, SchedulerConfig, ServerConfig, ToyConfig};

/// One toy replica serving on loopback.
struct Replica {
    addr: SocketAddr,
    draining: Draining,
}

impl Replica {
    async fn start() -> Self {
        let metrics = Arc::new(Metrics::default());
        let config = ToyConfig { context: 1024, prefix_cache: true, ..Default::default() };
        let pool = Arc::new(BatchPool::toy(config, SchedulerConfig::default(), metrics.clone()));
        let draining = Draining::default();
        let app = router(pool, metrics, ServerConfig { draining: draining.clone(), ..Default::default() });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(treespec_server::serve(listener, app, std::future::pending()));
        Self { addr, draining }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A chat request straight to this replica (with SMG's routing header when `key` is given).
    async fn chat(&self, client: &reqwest::Client, body: &Value, key: Option<&str>) -> Value {
        let mut request = client.post(format!("{}/v1/chat/completions", self.url()));
        if let Some(key) = key {
            request = request.header("x-smg-routing-key", key);
        }
        request.json(body).send().await.unwrap().json().await.unwrap()
    }

    async fn metrics(&self, client: &reqwest::Client) -> String {
        client.get(format!("{}/metrics", self.url())).send().await.unwrap().text().await.unwrap()
    }
}

/// A sample's value in Prometheus text (0 when absent).
fn sample(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

fn chat(messages: Value) -> Value {
    json!({"model": "toy", "messages": messages, "max_tokens": 12, "temperature": 0.0})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_tells_a_gateway_its_load_and_drains_before_it_stops() {
    let r = Replica::start().await;
    let client = reqwest::Client::new();
    let models: Value =
        client.get(format!("{}/v1/models", r.url())).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["max_model_len"], 1024, "{models}");
    // Two turns of one conversation, the session key in the body, then in SMG's header.
    let first = json!([{"role": "user", "content": "abc def abc"}]);
    let mut body = chat(first.clone());
    body["prompt_cache_key"] = json!("conv-1");
    let a = r.chat(&client, &body, None).await;
    let answer = a["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let second = json!([{"role": "user", "content": "abc def abc"}, {"role": "assistant", "content": answer},
                        {"role": "user", "content": "ghi"}]);
    let b = r.chat(&client, &chat(second), Some("conv-1")).await;
    assert!(b["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0, "{b}");
    let text = r.metrics(&client).await;
    assert_eq!(sample(&text, "treespec_session_turns_total{seen=\"new\"}"), 1.0, "{text}");
    assert_eq!(sample(&text, "treespec_session_turns_total{seen=\"known\"}"), 1.0);
    let labels = "{engine=\"0\",model_name=\"toy\"}";
    let hits = sample(&text, &format!("vllm:prefix_cache_hits_total{labels}"));
    let queries = sample(&text, &format!("vllm:prefix_cache_queries_total{labels}"));
    assert!(hits > 0.0 && hits < queries, "hits {hits} of {queries}");
    assert!(text.contains(&format!("vllm:num_requests_running{labels} 0")));
    assert!(text.contains(&format!("vllm:kv_cache_usage_perc{labels}")));
    let loads: Value =
        client.get(format!("{}/v1/loads", r.url())).send().await.unwrap().json().await.unwrap();
    assert_eq!(loads["dp_rank_count"], 1, "{loads}");
    assert_eq!(loads["loads"][0]["num_running_reqs"], 0);
    assert!(loads["loads"][0]["max_total_num_tokens"].as_u64().unwrap() > 0, "{loads}");
    // A bad session key is refused and names where it came from.
    let mut bad = chat(first.clone());
    bad["prompt_cache_key"] = json!("");
    let e = client.post(format!("{}/v1/chat/completions", r.url())).json(&bad).send().await.unwrap();
    assert_eq!(e.status(), 400);
    assert!(e.text().await.unwrap().contains("prompt_cache_key"));
    // Draining: unready, and new requests refused retryably.
    r.draining.drain();
    let h = client.get(format!("{}/health", r.url())).send().await.unwrap();
    assert_eq!(h.status(), 503);
    let e = client.post(format!("{}/v1/chat/completions", r.url())).json(&chat(first)).send().await.unwrap();
    assert_eq!(e.status(), 503);
    assert!(e.headers().contains_key("retry-after"));
    let e: Value = e.json().await.unwrap();
    assert_eq!(e["error"]["code"], "draining", "{e}");
}

/// The SMG gateway, if installed.
fn smg() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TREESPEC_SMG") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let p = cache.join("treespec/smg-1.13.0/bin/smg");
    p.exists().then_some(p)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Kills the gateway when the test ends, however it ends.
struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_keeps_its_replica_behind_smg_and_a_draining_replica_gets_nothing() {
    let Some(smg) = smg() else {
        eprintln!(
            "skipped: the SMG gateway is not installed (scripts/replicas.sh install, or TREESPEC_SMG=PATH)"
        );
        return;
    };
    let replicas = [Replica::start().await, Replica::start().await];
    let port = free_port();
    let child = Command::new(&smg)
        .args(["launch", "--host", "127.0.0.1", "--port", &port.to_string(), "--worker-urls"])
        .args(replicas.iter().map(|r| r.url()))
        .args(["--policy", "consistent_hashing", "--health-check-interval-secs", "1"])
        .args(["--prometheus-port", &free_port().to_string(), "--log-level", "warn"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting smg");
    let _gateway = Gateway(child);
    let gw = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let ready = client.get(format!("{gw}/readiness")).send().await.ok();
        let ready: Option<Value> = match ready {
            Some(r) => r.json().await.ok(),
            None => None,
        };
        if ready.as_ref().is_some_and(|r| r["healthy_workers"] == 2) {
            break;
        }
        assert!(Instant::now() < deadline, "SMG never routed to both replicas: {ready:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Which replica answered: SMG says so in a response header (the worker's URL).
    let send = |body: Value, key: String| {
        let client = client.clone();
        let url = format!("{gw}/v1/chat/completions");
        async move {
            let r = client.post(url).header("x-smg-routing-key", key).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let worker =
                r.headers()["x-smg-routed-worker-id"].to_str().unwrap().trim_end_matches('/').to_string();
            (worker, r.json::<Value>().await.unwrap())
        }
    };
    let first = json!([{"role": "user", "content": "abc def abc"}]);
    let (w1, a) = send(chat(first), "conv-1".into()).await;
    let answer = a["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let second = json!([{"role": "user", "content": "abc def abc"}, {"role": "assistant", "content": answer},
                        {"role": "user", "content": "ghi"}]);
    let (w2, b) = send(chat(second), "conv-1".into()).await;
    assert_eq!(w1, w2, "the second turn went to another replica");
    assert!(b["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0, "{b}");
    let home = replicas.iter().find(|r| r.url() == w1).expect("the answering replica is one of ours");
    let text = home.metrics(&client).await;
    assert_eq!(sample(&text, "treespec_session_turns_total{seen=\"known\"}"), 1.0, "{text}");
    // Drain that replica: every new conversation, whichever replica its key hashes to, is
    // answered by the other.
    home.draining.drain();
    // The gateway sees it unready at its next health checks (every second here).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let workers: Value = client.get(format!("{gw}/workers")).send().await.unwrap().json().await.unwrap();
        let list = workers.get("workers").unwrap_or(&workers).as_array().cloned().unwrap_or_default();
        let drained = list.iter().any(|w| {
            w["url"].as_str().is_some_and(|u| u.trim_end_matches('/') == w1) && w["is_healthy"] == false
        });
        if drained {
            break;
        }
        assert!(Instant::now() < deadline, "SMG never saw the draining replica unready: {workers}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let before = sample(&home.metrics(&client).await, "treespec_generations_total{method=\"chain\"}");
    for i in 0..6 {
        let (w, _) =
            send(chat(json!([{"role": "user", "content": format!("new {i}")}])), format!("conv-new-{i}"))
                .await;
        assert_ne!(w, w1, "a request reached the draining replica");
    }
    let after = sample(&home.metrics(&client).await, "treespec_generations_total{method=\"chain\"}");
    assert_eq!(before, after, "the draining replica decoded a new request");
}
