//! Bounded load test on loopback, part of the CI run (see the numbers with
//! `cargo test --release -p treespec-server --test load -- --nocapture`):
//! 16 concurrent streaming clients on SmolLM2 (batch scheduler, 8 lanes), 4 of them disconnecting
//! midway. Prints throughput
//! and p50/p99 latency; asserts that every non-cancelling client got a complete answer and that
//! the server is still healthy afterwards.

// Tests are exempt from the 80-line limit (clippy.toml): a test reads top to bottom as one story.
#![allow(clippy::too_many_lines)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_openai::config::OpenAIConfig;
use async_openai::types::{ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequestArgs};
use async_openai::Client;
use futures_util::StreamExt;
use treespec_engine::Method;
use treespec_llama::{LoadOptions, ModelPaths, ModelRuntime};
use treespec_server::{
    router, BatchPool, GenerationBackend, LlamaConfig, Metrics, SchedulerConfig, ServerConfig,
};

const CLIENTS: usize = 16;
const CANCELLING: usize = 4;
const MAX_TOKENS: u32 = 48;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_streaming_clients() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "{} is missing: run scripts/fetch-models.sh", path.display());
    let threads = std::env::var("TREESPEC_LOAD_THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(2);
    let method = match std::env::var("TREESPEC_LOAD_METHOD").as_deref() {
        Ok("plain") => Method::Plain,
        _ => Method::Chain { k: 3 },
    };
    let options = LoadOptions { threads, ctx_size: 1024, ..LoadOptions::default() };
    let runtime = ModelRuntime::load(ModelPaths::new(path.clone(), Some(path)), options).unwrap();
    let config = LlamaConfig::new(Arc::new(runtime), method);
    let metrics = Arc::new(Metrics::default());
    // The batch scheduler: 8 lanes sharing 2048 cells.
    let pool: Arc<dyn GenerationBackend> = {
        let scheduler = SchedulerConfig { parallel: 8, queue: CLIENTS, ..Default::default() };
        Arc::new(BatchPool::llama(config, scheduler, 2048, metrics.clone()).unwrap())
    };
    let app = router(pool, metrics.clone(), ServerConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(treespec_server::serve(listener, app, std::future::pending()));
    let client = Client::with_config(OpenAIConfig::new().with_api_base(format!("http://{addr}/v1")));

    let rss_start = rss_kib();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let req = CreateChatCompletionRequestArgs::default()
                .model("m")
                .messages([ChatCompletionRequestUserMessageArgs::default()
                    .content(format!("Write a short story about robot number {i}."))
                    .build()
                    .unwrap()
                    .into()])
                .temperature(0.0)
                .max_tokens(MAX_TOKENS)
                .build()
                .unwrap();
            let t = Instant::now();
            let mut s = client.chat().create_stream(req).await.unwrap();
            let mut first = None;
            let mut chunks = 0usize;
            let mut finished = false;
            while let Some(c) = s.next().await {
                let c = c.unwrap();
                if first.is_none() {
                    first = Some(t.elapsed());
                }
                chunks += 1;
                if c.choices.iter().any(|x| x.finish_reason.is_some()) {
                    finished = true;
                }
                if i < CANCELLING && chunks == 3 {
                    break; // disconnect midway
                }
            }
            (i, t.elapsed(), first.unwrap_or_default(), finished)
        }));
    }
    let mut latencies = Vec::new();
    let mut ttft = Vec::new();
    for t in tasks {
        let (i, total, first, finished) =
            tokio::time::timeout(Duration::from_secs(300), t).await.unwrap().unwrap();
        if i >= CANCELLING {
            assert!(finished, "client {i} got no finish_reason");
            latencies.push(total);
            ttft.push(first);
        }
    }
    let wall = start.elapsed();
    let text = metrics.render_server(0);
    let tokens: f64 = text
        .lines()
        .filter(|l| l.starts_with("treespec_completion_tokens_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    latencies.sort();
    ttft.sort();
    let pct = |v: &[Duration], p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
    println!(
        "load: {CLIENTS} clients ({CANCELLING} cancelling), wall {:.2}s, {tokens} tokens from finished generations, \
         {:.1} tok/s; latency p50 {:.2}s p99 {:.2}s; time to first chunk p50 {:.2}s p99 {:.2}s",
        wall.as_secs_f64(),
        tokens / wall.as_secs_f64(),
        pct(&latencies, 0.5).as_secs_f64(),
        pct(&latencies, 0.99).as_secs_f64(),
        pct(&ttft, 0.5).as_secs_f64(),
        pct(&ttft, 0.99).as_secs_f64(),
    );
    println!("{}", text.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n"));
    assert!(text.contains("treespec_generations_total"));
    // Memory: the contexts are allocated when the worker starts; serving 16 requests (4 of them
    // cancelled) must not grow the process by more than scratch buffers.
    let rss_end = rss_kib();
    println!("load: resident memory {} MiB before, {} MiB after", rss_start / 1024, rss_end / 1024);
    assert!(rss_end < rss_start + 256 * 1024, "resident memory grew from {rss_start} KiB to {rss_end} KiB");
}

/// Resident set size of this process, from /proc (0 where unavailable).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}
