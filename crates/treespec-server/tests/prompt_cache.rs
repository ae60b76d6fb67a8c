//! What a request reports about how it was served, in the shapes benchmark clients already read
//! from OpenAI and llama-server: `usage.prompt_tokens_details.cached_tokens` (prompt tokens whose
//! KV came from a cached prefix), llama-server's `timings` (`cache_n`, `prompt_n`, `predicted_n`,
//! `draft_n`, `draft_n_accepted`, times) and treespec's statistics, in non-streamed answers and in
//! the last streamed chunk. On the batching toy server (which never reuses a prefix) for the
//! counts, and on SmolLM2-135M behind the batching scheduler for the prefix cache.
//!
//! The SmolLM2 test needs `models/SmolLM2-135M-Instruct.Q4_1.gguf` (scripts/fetch-models.sh);
//! set TREESPEC_SKIP_MODEL_TESTS=1 to skip it.

mod common;

use std::sync::Arc;

use axum::http::StatusCode;
use axum::Router;
use common::{send, sse_chunks};
use serde_json::{json, Value};
use treespec_server::{router, BatchPool, Metrics, SchedulerConfig, ServerConfig, ToyConfig};

async fn post(app: &Router, path: &str, body: Value) -> Value {
    let (s, v) = send(app, None, path, Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{path}: {v}");
    v
}

/// The chunks of a streamed OpenAI answer to `body` (with `stream` and usage asked for).
async fn streamed(app: &Router, path: &str, mut body: Value) -> Vec<Value> {
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let v = post(app, path, body).await;
    sse_chunks(v.as_str().unwrap_or_else(|| panic!("not an event stream: {v}")))
}

/// The usage chunk of a stream: the last one, and the only one with usage, timings or statistics.
fn usage_chunk(chunks: &[Value]) -> &Value {
    let (last, rest) = chunks.split_last().expect("chunks");
    assert_eq!(last["choices"], json!([]), "{last}");
    for c in rest {
        for field in ["usage", "timings", "treespec"] {
            assert!(c.get(field).is_none(), "only the last chunk has `{field}`: {c}");
        }
    }
    last
}

/// What every answer's usage, timings and statistics must agree on; returns (cached tokens,
/// prompt tokens).
fn check(answer: &Value) -> (u64, u64) {
    let (u, t, s) = (&answer["usage"], &answer["timings"], &answer["treespec"]);
    let cached = u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or_else(|| panic!("{answer}"));
    let prompt = u["prompt_tokens"].as_u64().unwrap();
    assert_eq!(t["cache_n"].as_u64(), Some(cached), "{answer}");
    // llama-server's prompt_n counts the tokens read, not those taken from the cache.
    assert_eq!(t["prompt_n"].as_u64().unwrap() + cached, prompt, "{answer}");
    assert!(cached < prompt, "the last prompt token is always read: {answer}");
    assert_eq!(t["predicted_n"], u["completion_tokens"], "{answer}");
    let (drafted, accepted) = (t["draft_n"].as_u64().unwrap(), t["draft_n_accepted"].as_u64().unwrap());
    assert!(accepted <= drafted, "{answer}");
    let forwards = s["target_forwards"].as_u64().unwrap();
    assert!(forwards >= 1, "{answer}");
    // Every forward emits its accepted drafts and one token of the target's.
    assert!(
        u["completion_tokens"].as_u64().unwrap() <= forwards + accepted,
        "more tokens than forwards and accepted drafts: {answer}"
    );
    for f in
        ["prompt_ms", "prompt_per_second", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"]
    {
        assert!(t[f].as_f64().is_some_and(|x| x >= 0.0), "{f}: {answer}");
    }
    (cached, prompt)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_usage_carries_timings_and_statistics_on_the_toy_batch_server() {
    let metrics = Arc::new(Metrics::default());
    let scheduler = SchedulerConfig { parallel: 2, ..Default::default() };
    let pool = Arc::new(BatchPool::toy(ToyConfig::default(), scheduler, metrics.clone()));
    let app = router(pool, metrics, ServerConfig::default());
    // (Not cost-aware methods: their costs, learned as requests go, change their drafts between
    // the two requests compared.)
    for treespec in
        [json!({"method": "plain"}), json!({"method": "chain"}), json!({"method": "tree", "widths": [2, 2]})]
    {
        let method = treespec["method"].as_str().unwrap();
        let body = json!({
            "messages": [{"role": "user", "content": "count the letters please"}],
            "max_tokens": 20, "temperature": 0, "treespec": treespec,
        });
        let whole = post(&app, "/v1/chat/completions", body.clone()).await;
        assert_eq!(
            check(&whole),
            (0, whole["usage"]["prompt_tokens"].as_u64().unwrap()),
            "the toys cache nothing"
        );
        let chunks = streamed(&app, "/v1/chat/completions", body).await;
        let last = usage_chunk(&chunks);
        check(last);
        assert_eq!(last["usage"], whole["usage"], "{method}");
        assert_eq!(last["treespec"]["method"], method);
        // Greedy on the same toy: the same steps, streamed or not.
        for f in ["target_forwards", "mean_accepted"] {
            assert_eq!(last["treespec"][f], whole["treespec"][f], "{method}: {f}");
        }
        for f in ["draft_n", "draft_n_accepted", "predicted_n", "prompt_n"] {
            assert_eq!(last["timings"][f], whole["timings"][f], "{method}: {f}");
        }
        let (t, forwards) = (&last["timings"], last["treespec"]["target_forwards"].as_u64().unwrap());
        if method == "plain" {
            // Nothing drafted: one forward per token (the toys have no end token).
            assert_eq!((t["draft_n"].as_u64(), t["draft_n_accepted"].as_u64()), (Some(0), Some(0)));
            assert_eq!(t["predicted_n"].as_u64(), Some(forwards));
        } else {
            assert!(t["draft_n"].as_u64().unwrap() > 0, "{method} drafts: {t}");
        }
    }
    // Text completions: the usage chunk too.
    let body = json!({"prompt": "abcabcabc", "max_tokens": 9, "temperature": 0});
    let whole = post(&app, "/v1/completions", body.clone()).await;
    check(&whole);
    let chunks = streamed(&app, "/v1/completions", body).await;
    let last = usage_chunk(&chunks);
    check(last);
    assert_eq!(last["usage"], whole["usage"]);
    assert_eq!(last["treespec"]["method"], "chain");
}

/// Token ids of `text` through the server's tokenizer.
async fn tokens(app: &Router, text: &str) -> Vec<u64> {
    let v = post(app, "/tokenize", json!({"content": text})).await;
    v["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_prefix_is_reported_as_cached_tokens_on_smollm2() {
    let Some(path) = common::model_path() else { return };
    use treespec_engine::Method;
    use treespec_llama::{LoadOptions, ModelPaths, ModelRuntime};
    use treespec_server::LlamaConfig;
    // One thread: llama.cpp's OpenMP workers spin-wait, and tests run in parallel. The model
    // drafts for itself, so chain drafts and accepts.
    let options = LoadOptions { threads: 1, ctx_size: 2048, ..LoadOptions::default() };
    let runtime = ModelRuntime::load(ModelPaths::new(path.clone(), Some(path)), options).unwrap();
    let config = LlamaConfig::new(Arc::new(runtime), Method::Chain { k: 3 });
    let metrics = Arc::new(Metrics::default());
    let scheduler = SchedulerConfig { parallel: 2, ..Default::default() };
    let pool = Arc::new(BatchPool::llama(config, scheduler, 2048, metrics.clone()).unwrap());
    let app = router(pool, metrics, ServerConfig::default());

    let document = "The river town kept its records in a stone tower by the bridge. Every spring the \
        clerks climbed the stairs with ledgers of grain, salt and wool, and every autumn they came \
        down with the tallies of what the barges had carried south. "
        .repeat(3);
    let chat = |question: &str| {
        json!({
            "messages": [
                {"role": "system", "content": "Answer in one short sentence."},
                {"role": "user", "content": format!("{document}\n\n{question}")},
            ],
            "max_tokens": 8, "temperature": 0,
        })
    };

    // The first request: nothing is cached yet.
    let first =
        usage_chunk(&streamed(&app, "/v1/chat/completions", chat("Where were the records kept?")).await)
            .clone();
    let (cached, prompt) = check(&first);
    assert_eq!(cached, 0, "a fresh server has no prefix to reuse: {first}");
    assert!(prompt > 150, "{first}");

    // The same long prefix, another question: the document's tokens come from the cache.
    let second =
        usage_chunk(&streamed(&app, "/v1/chat/completions", chat("What did the barges carry?")).await)
            .clone();
    let (cached, prompt2) = check(&second);
    assert!(cached > prompt / 2 && cached + 1 < prompt2, "cached {cached} of {prompt2}: {second}");
    assert!(second["timings"]["draft_n"].as_u64().unwrap() > 0, "chain drafted: {second}");

    // The same request again, not streamed: everything but the last prompt token (read with the
    // first step) is cached.
    let again = post(&app, "/v1/chat/completions", chat("What did the barges carry?")).await;
    let (cached, prompt) = check(&again);
    assert_eq!((cached + 1, prompt), (prompt2, prompt2), "{again}");

    // Exactly the common prefix, through llama-server's /completion with token ids: a prompt that
    // shares nothing with the chats (no chat template in front) reuses nothing; one sharing its
    // first `keep` tokens reuses exactly those.
    let a = tokens(&app, &format!("Ledger of the tower. {document}")).await;
    let b =
        tokens(&app, "Meanwhile, far to the north, the shepherds counted their flocks twice a year.").await;
    let keep = a.len() * 2 / 3;
    assert_ne!(a[keep], b[0]);
    let completion = |prompt: Vec<u64>| json!({"prompt": prompt, "n_predict": 4, "temperature": 0});
    let c = post(&app, "/completion", completion(a.clone())).await;
    assert_eq!(
        (c["timings"]["cache_n"].as_u64(), c["timings"]["prompt_n"].as_u64()),
        (Some(0), Some(a.len() as u64)),
        "{c}"
    );
    let mixed: Vec<u64> = a[..keep].iter().chain(&b).copied().collect();
    let c = post(&app, "/completion", completion(mixed.clone())).await;
    let t = &c["timings"];
    assert_eq!(t["cache_n"].as_u64(), Some(keep as u64), "{c}");
    assert_eq!(t["prompt_n"].as_u64(), Some((mixed.len() - keep) as u64), "{c}");
    assert!(t["draft_n_accepted"].as_u64() <= t["draft_n"].as_u64(), "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_documents_the_new_fields() {
    let metrics = Arc::new(Metrics::default());
    let pool = Arc::new(BatchPool::toy(ToyConfig::default(), SchedulerConfig::default(), metrics.clone()));
    let app = router(pool, metrics, ServerConfig::default());
    let (s, v) = send(&app, None, "/openapi.json", None).await;
    assert_eq!(s, StatusCode::OK);
    let schemas = &v["components"]["schemas"];
    for (schema, fields) in [
        ("Usage", &["prompt_tokens_details"][..]),
        ("PromptTokensDetails", &["cached_tokens"]),
        ("Timings", &["cache_n", "prompt_n", "predicted_n", "draft_n", "draft_n_accepted"]),
        ("ChatCompletionResponse", &["usage", "timings", "treespec"]),
        ("CompletionResponse", &["usage", "timings", "treespec"]),
        ("ChatCompletionChunk", &["usage", "timings", "treespec"]),
        ("TreespecStats", &["method", "target_forwards", "mean_accepted"]),
    ] {
        for f in fields {
            assert!(schemas[schema]["properties"][f].is_object(), "{schema}.{f}: {}", schemas[schema]);
        }
    }
}
