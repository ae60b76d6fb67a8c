//! llama-server's endpoints (issue 27) through HTTP, with the request shapes of llama-server's
//! README: `/completion` whole and streamed (its answer against `/v1/completions`' on the same
//! prompt), prompts as text, ids and both mixed, stop strings, `n_predict: 0`; `/tokenize` and
//! `/detokenize`; `/apply-template` (its prompt completes as the chat request does); `/props` and
//! `/slots`; the API keys and tenants; and the vLLM / llama-server speculative-decoding counters
//! in `/metrics` against a known request. On toy models, and once on SmolLM2-135M for the real
//! tokenizer and chat template.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use common::send;
use serde_json::{json, Value};
use treespec_engine::drafters::SuffixConfig;
use treespec_engine::Method;
use treespec_server::{router, ApiKeys, BatchPool, Metrics, SchedulerConfig, ServerConfig, ToyConfig};

/// A batching toy server: `parallel` lanes, `keys` as `--api-key`.
fn server(config: ToyConfig, parallel: usize, keys: &[&str]) -> (Router, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let scheduler = SchedulerConfig { parallel, ..Default::default() };
    let pool = Arc::new(BatchPool::toy(config, scheduler, metrics.clone()));
    let api_keys = ApiKeys::new(keys.iter().map(|k| k.to_string()), false);
    (router(pool, metrics.clone(), ServerConfig { api_keys, ..Default::default() }), metrics)
}

fn toy() -> (Router, Arc<Metrics>) {
    server(ToyConfig::default(), 2, &[])
}

async fn post(app: &Router, path: &str, body: Value) -> Value {
    let (s, v) = send(app, None, path, Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{path}: {v}");
    v
}

/// The `data:` events of a `/completion` stream, which ends without `[DONE]`.
fn llama_chunks(body: &str) -> Vec<Value> {
    let data: Vec<&str> = body.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).collect();
    assert!(!data.is_empty() && !data.contains(&"[DONE]"), "{body}");
    data.iter().map(|d| serde_json::from_str(d).unwrap()).collect()
}

const PROMPT: &str = "the quick brown fox jumps over the lazy dog";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_answers_as_v1_completions_does_with_llama_servers_fields() {
    let (app, _) = toy();
    let v1 =
        post(&app, "/v1/completions", json!({"prompt": PROMPT, "max_tokens": 12, "temperature": 0})).await;
    let text = v1["choices"][0]["text"].as_str().unwrap();
    let c =
        post(&app, "/completion", json!({"prompt": PROMPT, "n_predict": 12, "temperature": 0, "seed": 3}))
            .await;
    assert_eq!(c["content"], text, "{c}");
    assert_eq!(c["stop"], true);
    assert_eq!(c["tokens_predicted"], v1["usage"]["completion_tokens"]);
    assert_eq!(c["tokens_evaluated"], v1["usage"]["prompt_tokens"]);
    assert_eq!(c["tokens_predicted"], 12);
    // The toys have no end token: the limit ended it, well inside the context.
    assert_eq!((c["stop_type"].as_str(), c["stopping_word"].as_str()), (Some("limit"), Some("")));
    assert_eq!(c["truncated"], false);
    assert_eq!(c["model"], "toy");
    let g = &c["generation_settings"];
    assert_eq!(
        (g["n_predict"].as_i64(), g["seed"].as_u64(), g["n_ctx"].as_u64()),
        (Some(12), Some(3), Some(256))
    );
    assert_eq!((g["temperature"].as_f64(), g["top_k"].as_u64()), (Some(0.0), Some(40)));
    let t = &c["timings"];
    assert_eq!((t["prompt_n"].as_u64(), t["predicted_n"].as_u64()), (Some(PROMPT.len() as u64), Some(12)));
    for f in ["prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_ms", "predicted_per_second"]
    {
        assert!(t[f].as_f64().is_some_and(|x| x >= 0.0), "{f}: {t}");
    }
    assert_eq!(c["treespec"]["target_forwards"], v1["treespec"]["target_forwards"]);
    assert_eq!(c["treespec"]["method"], v1["treespec"]["method"]);

    // The prompt as the ids /tokenize gives, and mixed: the same tokens, the same answer.
    let ids =
        post(&app, "/tokenize", json!({"content": PROMPT, "add_special": true})).await["tokens"].clone();
    assert_eq!(ids.as_array().unwrap().len(), PROMPT.len());
    let by_ids = post(&app, "/completion", json!({"prompt": ids, "n_predict": 12, "temperature": 0})).await;
    assert_eq!(by_ids["content"], text);
    let head: Vec<Value> = ids.as_array().unwrap()[..4].to_vec();
    let mixed = json!([head[0], head[1], head[2], head[3], &PROMPT[4..]]);
    let by_mixed =
        post(&app, "/completion", json!({"prompt": mixed, "n_predict": 12, "temperature": 0})).await;
    assert_eq!(
        (&by_mixed["content"], &by_mixed["tokens_evaluated"]),
        (&c["content"], &c["tokens_evaluated"])
    );

    // n_predict 0: the prompt is only tokenized.
    let zero = post(&app, "/completion", json!({"prompt": PROMPT, "n_predict": 0})).await;
    assert_eq!((zero["content"].as_str(), zero["tokens_predicted"].as_u64()), (Some(""), Some(0)));
    assert_eq!(zero["tokens_evaluated"], c["tokens_evaluated"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_completion_sends_content_chunks_then_the_whole_answer() {
    let (app, _) = toy();
    let body = json!({"prompt": PROMPT, "n_predict": 20, "temperature": 0, "seed": 1});
    let whole = post(&app, "/completion", body.clone()).await;
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let (s, raw) = send(&app, None, "/completion", Some(streamed)).await;
    assert_eq!(s, StatusCode::OK);
    let chunks = llama_chunks(raw.as_str().unwrap());
    let (last, text) = chunks.split_last().unwrap();
    assert!(text.len() > 1, "{raw}");
    assert!(text.iter().all(|c| c["stop"] == false && c["content"].is_string()), "{raw}");
    let content: String = text.iter().map(|c| c["content"].as_str().unwrap()).collect();
    assert_eq!(content, whole["content"].as_str().unwrap());
    assert_eq!(last["stop"], true);
    for f in ["tokens_predicted", "tokens_evaluated", "stop_type", "truncated", "treespec"] {
        assert_eq!(last[f], whole[f], "{f}");
    }
    let mut settings = whole["generation_settings"].clone();
    settings["stream"] = json!(true);
    assert_eq!(last["generation_settings"], settings);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_string_is_named_and_cut() {
    let (app, _) = toy();
    let body = |stop: Value| json!({"prompt": PROMPT, "n_predict": 24, "temperature": 0, "stop": stop});
    let full = post(&app, "/completion", body(json!([]))).await["content"].as_str().unwrap().to_string();
    let word = full[6..8].to_string();
    let cut = &full[..full.find(&word).unwrap()];
    let c = post(&app, "/completion", body(json!(["never seen", word]))).await;
    assert_eq!(c["content"], cut);
    assert_eq!((c["stop_type"].as_str(), c["stopping_word"].as_str()), (Some("word"), Some(word.as_str())));
    // Streamed, the last chunk says the same.
    let mut streamed = body(json!([word]));
    streamed["stream"] = json!(true);
    let raw = send(&app, None, "/completion", Some(streamed)).await.1;
    let last = llama_chunks(raw.as_str().unwrap()).pop().unwrap();
    assert_eq!(
        (last["stop_type"].as_str(), last["stopping_word"].as_str()),
        (Some("word"), Some(word.as_str()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_requests_are_checked() {
    let (app, _) = toy();
    for (body, param) in [
        (json!({"prompt": ["a", "b"]}), "prompt"),
        (json!({"prompt": [1, 99]}), "prompt"),
        (json!({"prompt": ""}), "prompt"),
        (json!({}), "prompt"),
        (json!({"prompt": "a", "n_predict": 1000}), "n_predict"),
        (json!({"prompt": "a", "max_tokens": 1000}), "max_tokens"),
        (json!({"prompt": "a".repeat(200), "n_predict": 100}), "n_predict"),
        (json!({"prompt": "a", "temperature": -1}), "temperature"),
        (json!({"prompt": "a", "id_slot": 5}), "id_slot"),
        (json!({"prompt": "a", "mirostat": 2}), "mirostat"),
        (json!({"prompt": "a".repeat(300)}), "prompt"),
        (json!({"prompt": "a".repeat(300), "n_predict": 0}), "prompt"),
        (json!({"prompt": "a", "samplers": ["top_p", "top_k"]}), "samplers"),
    ] {
        let (s, v) = send(&app, None, "/completion", Some(body.clone())).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
        // llama-server's names for what the request sent (the OpenAI checks say `max_tokens`,
        // `messages`).
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
    }
    let (s, v) =
        send(&app, None, "/completion", Some(json!({"prompt": "a", "n_predict": 2, "id_slot": 1}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize() {
    let (app, _) = toy();
    // Toy tokens: a byte maps to byte mod 26, token t reads as the letter 'a' + t.
    let want: Vec<u64> = "hello".bytes().map(|b| (b % 26) as u64).collect();
    let t = post(&app, "/tokenize", json!({"content": "hello"})).await;
    assert_eq!(t, json!({"tokens": want}));
    let letters: String = want.iter().map(|&t| char::from(b'a' + t as u8)).collect();
    let d = post(&app, "/detokenize", json!({"tokens": want})).await;
    assert_eq!(d, json!({"content": letters}));
    let p = post(&app, "/tokenize", json!({"content": "hello", "with_pieces": true})).await;
    let pieces: Vec<Value> =
        want.iter().map(|&t| json!({"id": t, "piece": char::from(b'a' + t as u8).to_string()})).collect();
    assert_eq!(p, json!({"tokens": pieces}));
    assert_eq!(post(&app, "/detokenize", json!({"tokens": []})).await, json!({"content": ""}));
    for (path, body, param) in [
        ("/tokenize", json!({}), "content"),
        ("/detokenize", json!({"tokens": [26]}), "tokens"),
        ("/detokenize", json!({"tokens": [-1]}), "tokens"),
        ("/detokenize", json!({"tokens": "ab"}), "tokens"),
    ] {
        let (s, v) = send(&app, None, path, Some(body.clone())).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(v["error"]["param"].as_str().unwrap_or_default(), param, "{body}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_template_completes_as_the_chat_request_does() {
    let (app, _) = toy();
    let messages =
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]);
    let p = post(&app, "/apply-template", json!({"messages": messages})).await;
    assert_eq!(p, json!({"prompt": "system: be brief\nuser: hi there\nassistant:"}));
    let chat =
        post(&app, "/v1/chat/completions", json!({"messages": messages, "max_tokens": 10, "temperature": 0}))
            .await;
    let c =
        post(&app, "/completion", json!({"prompt": p["prompt"], "n_predict": 10, "temperature": 0})).await;
    assert_eq!(c["content"], chat["choices"][0]["message"]["content"]);
    assert_eq!(c["tokens_evaluated"], chat["usage"]["prompt_tokens"]);
    let (s, v) =
        send(&app, None, "/apply-template", Some(json!({"messages": [{"role": "wizard", "content": "x"}]})))
            .await;
    assert_eq!((s, v["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("messages")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn props_and_slots_describe_the_server() {
    let config = ToyConfig { step_delay: Duration::from_millis(20), ..Default::default() };
    let (app, _) = server(config, 3, &[]);
    let (_, props) = send(&app, None, "/props", None).await;
    assert_eq!(props["total_slots"], 3);
    assert_eq!(props["model_path"], "toy");
    assert_eq!(props["chat_template"], "");
    assert!(props["build_info"].as_str().unwrap().starts_with("treespec "));
    let d = &props["default_generation_settings"];
    assert_eq!((d["n_ctx"].as_u64(), d["is_processing"].as_bool()), (Some(256), Some(false)));
    let params = &d["params"];
    assert_eq!(params["temperature"].as_f64().map(|t| (t * 100.0).round()), Some(80.0));
    assert_eq!((params["top_k"].as_u64(), params["n_predict"].as_i64()), (Some(40), Some(-1)));
    assert_eq!(params["seed"], 4294967295u64);

    let (_, idle) = send(&app, None, "/slots", None).await;
    let idle = idle.as_array().unwrap().clone();
    assert_eq!(idle.len(), 3);
    for (i, slot) in idle.iter().enumerate() {
        assert_eq!((slot["id"].as_u64(), slot["n_ctx"].as_u64()), (Some(i as u64), Some(256)));
        assert_eq!(slot["is_processing"], false);
    }
    // While a slow request decodes, one slot is busy.
    let running = {
        let app = app.clone();
        tokio::spawn(
            async move { post(&app, "/completion", json!({"prompt": "abc", "n_predict": 40})).await },
        )
    };
    let mut busy = 0;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let (_, slots) = send(&app, None, "/slots", None).await;
        busy = slots.as_array().unwrap().iter().filter(|s| s["is_processing"] == true).count();
        if busy > 0 {
            break;
        }
    }
    assert_eq!(busy, 1);
    running.await.unwrap();
    let (_, after) = send(&app, None, "/slots", None).await;
    assert!(after.as_array().unwrap().iter().all(|s| s["is_processing"] == false), "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_needs_a_key_when_the_server_has_keys() {
    let (app, _) = server(ToyConfig::default(), 2, &["k1"]);
    let calls: [(&str, Option<Value>); 7] = [
        ("/completion", Some(json!({"prompt": "ab", "n_predict": 2}))),
        ("/completions", Some(json!({"prompt": "ab", "n_predict": 2}))),
        ("/tokenize", Some(json!({"content": "ab"}))),
        ("/detokenize", Some(json!({"tokens": [1]}))),
        ("/apply-template", Some(json!({"messages": [{"role": "user", "content": "x"}]}))),
        ("/props", None),
        ("/slots", None),
    ];
    for (path, body) in calls {
        for (key, want) in [
            (None, StatusCode::UNAUTHORIZED),
            (Some("nope"), StatusCode::UNAUTHORIZED),
            (Some("k1"), StatusCode::OK),
        ] {
            let (s, v) = send(&app, key, path, body.clone()).await;
            assert_eq!(s, want, "{path} with {key:?}: {v}");
        }
    }
    // /health stays open, in llama-server's shape (plus treespec's fields).
    let (s, v) = send(&app, None, "/health", None).await;
    assert_eq!((s, v["status"].as_str()), (StatusCode::OK, Some("ok")));
}

/// Target forwards B's `/completion` of `text` took on a server whose default method drafts
/// from each tenant's suffix history, after A sent it (`share`: one history for both keys).
async fn b_forwards_after_a(share: bool, a_sends: bool) -> u64 {
    let metrics = Arc::new(Metrics::default());
    let config =
        ToyConfig { method: Method::Suffix(SuffixConfig::default()), context: 512, ..Default::default() };
    let pool = Arc::new(BatchPool::toy(config, SchedulerConfig::default(), metrics.clone()));
    let api_keys = ApiKeys::new(["key-a".to_string(), "key-b".to_string()], share);
    let app = router(pool, metrics, ServerConfig { api_keys, ..Default::default() });
    let body = json!({"prompt": "a motto for the company whose codename is marmot", "n_predict": 48, "temperature": 0});
    if a_sends {
        let (s, v) = send(&app, Some("key-a"), "/completion", Some(body.clone())).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    let (s, v) = send(&app, Some("key-b"), "/completion", Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v["treespec"]["target_forwards"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_learns_only_for_its_own_tenant() {
    let fresh = b_forwards_after_a(false, false).await;
    // Two keys: what A taught the server does not speed B up.
    assert_eq!(b_forwards_after_a(false, true).await, fresh);
    // One shared history: it does (so the check above can fail).
    assert!(b_forwards_after_a(true, true).await < fresh);
}

/// The value of the sample line `series` (name and labels, as written).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.parse().ok()))
        .unwrap_or_else(|| panic!("{series} missing in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_carry_vllm_and_llama_server_spec_decode_counters() {
    let (app, metrics) = toy();
    let labels = "engine=\"0\",model_name=\"toy\"";
    let drafts = format!("vllm:spec_decode_num_drafts_total{{{labels}}}");
    // Plain decoding verifies no drafts.
    let plain = json!({"prompt": PROMPT, "n_predict": 16, "temperature": 0, "treespec": {"method": "plain"}});
    post(&app, "/completion", plain).await;
    assert_eq!(sample(&metrics.render_server(0), &drafts), 0.0);

    let c = post(
        &app,
        "/completion",
        json!({"prompt": PROMPT, "n_predict": 40, "temperature": 0, "treespec": {"method": "chain", "k": 3}}),
    )
    .await;
    let forwards = c["treespec"]["target_forwards"].as_f64().unwrap();
    let emitted = (c["treespec"]["mean_accepted"].as_f64().unwrap() * forwards).round();
    let (_, text) = send(&app, None, "/metrics", None).await;
    let text = text.as_str().unwrap();
    // A chain drafts at every step but perhaps the last (one token left: nothing to draft); each
    // step emits its accepted drafts and one token more.
    let n_drafts = sample(text, &drafts);
    assert!(n_drafts == forwards || n_drafts == forwards - 1.0, "{n_drafts} drafts in {forwards} forwards");
    let accepted = sample(text, &format!("vllm:spec_decode_num_accepted_tokens_total{{{labels}}}"));
    assert_eq!(accepted, emitted - forwards);
    assert!(accepted > 0.0, "the toy draft agrees with the target at times");
    let draft_tokens = sample(text, &format!("vllm:spec_decode_num_draft_tokens_total{{{labels}}}"));
    assert!(draft_tokens >= accepted && draft_tokens <= 3.0 * forwards, "{draft_tokens}");
    let per_pos: Vec<f64> = (0..3)
        .map(|p| {
            sample(
                text,
                &format!("vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position=\"{p}\"}}"),
            )
        })
        .collect();
    assert!(per_pos.windows(2).all(|w| w[0] >= w[1]), "{per_pos:?}");
    assert_eq!(per_pos.iter().sum::<f64>(), accepted);
    // llama-server's names carry the same counts.
    assert_eq!(sample(text, "llamacpp:spec_decode_num_drafts_total"), n_drafts);
    assert_eq!(sample(text, "llamacpp:spec_decode_num_accepted_tokens_total"), accepted);
    assert_eq!(
        sample(text, "llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"}"),
        per_pos[0]
    );
    for family in ["vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens_per_pos"] {
        assert!(text.contains(&format!("# TYPE {family} counter\n")), "{family}");
    }
    // The route is counted as any other.
    assert!(text.contains("treespec_requests_total{endpoint=\"/completion\",status=\"200\"} 2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_tokenizer_and_chat_template() {
    let Some(path) = common::model_path() else { return };
    use treespec_llama::{LoadOptions, ModelPaths, ModelRuntime};
    use treespec_server::LlamaConfig;
    // One thread: llama.cpp's OpenMP workers spin-wait, and tests run in parallel.
    let options = LoadOptions { threads: 1, ctx_size: 1024, ..LoadOptions::default() };
    let runtime = ModelRuntime::load(ModelPaths::new(path, None), options).unwrap();
    let config = LlamaConfig::new(Arc::new(runtime), Method::Plain);
    let metrics = Arc::new(Metrics::default());
    let scheduler = SchedulerConfig { parallel: 2, ..Default::default() };
    let pool = Arc::new(BatchPool::llama(config, scheduler, 1024, metrics.clone()).unwrap());
    let app = router(pool, metrics, ServerConfig::default());

    // Round trip, a character split across tokens included.
    let text = "Hello, world! Ünïcödé 🙂 costs 3.50€.";
    let ids = post(&app, "/tokenize", json!({"content": text})).await["tokens"].clone();
    assert!(ids.as_array().unwrap().len() > 5, "{ids}");
    assert_eq!(post(&app, "/detokenize", json!({"tokens": ids})).await["content"], text);
    // The pieces are the text, as strings or (a partial character) as bytes.
    let pieces =
        post(&app, "/tokenize", json!({"content": text, "with_pieces": true})).await["tokens"].clone();
    let mut bytes = Vec::new();
    for (p, id) in pieces.as_array().unwrap().iter().zip(ids.as_array().unwrap()) {
        assert_eq!(&p["id"], id);
        match &p["piece"] {
            Value::String(s) => bytes.extend(s.as_bytes()),
            Value::Array(b) => bytes.extend(b.iter().map(|x| x.as_u64().unwrap() as u8)),
            other => panic!("piece {other}"),
        }
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), text);
    // Special-token text: one token when parsed (the default), several when not.
    let special = |parse: bool| {
        let app = app.clone();
        async move {
            let v = post(&app, "/tokenize", json!({"content": "<|im_start|>", "parse_special": parse})).await;
            v["tokens"].as_array().unwrap().len()
        }
    };
    assert_eq!(special(true).await, 1);
    assert!(special(false).await > 1);
    let (s, v) = send(&app, None, "/detokenize", Some(json!({"tokens": [1_000_000]}))).await;
    assert_eq!((s, v["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("tokens")));

    // The template, then its prompt through /completion: the chat request's tokens and answer.
    let messages = json!([{"role": "user", "content": "Name a primary color."}]);
    let prompt = post(&app, "/apply-template", json!({"messages": messages})).await["prompt"].clone();
    let p = prompt.as_str().unwrap();
    assert!(p.contains("<|im_start|>user\nName a primary color.<|im_end|>"), "{p}");
    assert!(p.ends_with("<|im_start|>assistant\n"), "{p}");
    let chat =
        post(&app, "/v1/chat/completions", json!({"messages": messages, "max_tokens": 8, "temperature": 0}))
            .await;
    let c = post(&app, "/completion", json!({"prompt": prompt, "n_predict": 8, "temperature": 0})).await;
    assert_eq!(c["tokens_evaluated"], chat["usage"]["prompt_tokens"]);
    assert_eq!(c["content"], chat["choices"][0]["message"]["content"]);
    let (_, props) = send(&app, None, "/props", None).await;
    assert!(props["chat_template"].as_str().unwrap().contains("im_start"));
    assert!(props["model_path"].as_str().unwrap().ends_with("SmolLM2-135M-Instruct.Q4_1.gguf"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_describes_the_llama_server_routes() {
    let (app, _) = toy();
    let (s, v) = send(&app, None, "/openapi.json", None).await;
    assert_eq!(s, StatusCode::OK);
    for (path, method) in [
        ("/completion", "post"),
        ("/tokenize", "post"),
        ("/detokenize", "post"),
        ("/apply-template", "post"),
        ("/props", "get"),
        ("/slots", "get"),
    ] {
        assert!(v["paths"][path][method]["responses"]["200"].is_object(), "{method} {path}");
    }
    for schema in
        ["LlamaCompletionRequest", "LlamaCompletion", "GenerationSettings", "Timings", "Tokenized", "Props"]
    {
        assert!(v["components"]["schemas"][schema].is_object(), "missing schema {schema}");
    }
}
