//! A model file without a chat template (a base model) is served (issue #66): its completions
//! routes answer, a chat request gets a 400 naming the flags that give a template, and with a
//! template given by name (llama-server's `--chat-template chatml`) chats render exactly as the
//! model's own ChatML template renders them.
//!
//! The template-less file is SmolLM2 with its `tokenizer.chat_template` key renamed (same length,
//! so the file stays valid GGUF). Needs `models/SmolLM2-135M-Instruct.Q4_1.gguf`.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::http::StatusCode;
use common::{model_path, send};
use serde_json::json;
use treespec_engine::Method;
use treespec_llama::{LoadOptions, ModelPaths, ModelRuntime};
use treespec_server::ready::prompt_tokens;
use treespec_server::validate::{Message, PromptInput};
use treespec_server::{router, BatchPool, LlamaConfig, Metrics, SchedulerConfig, ServerConfig};

/// A copy of `model` in `dir` whose chat template key no reader knows.
fn without_template(model: &Path, dir: &Path) -> PathBuf {
    let mut bytes = std::fs::read(model).unwrap();
    let key = b"tokenizer.chat_template";
    let mut prefixed = (key.len() as u64).to_le_bytes().to_vec();
    prefixed.extend_from_slice(key);
    let at = bytes.windows(prefixed.len()).position(|w| w == prefixed).expect("the file has a chat template");
    bytes[at + prefixed.len() - 1] = b'_';
    let out = dir.join("smollm2-base.gguf");
    std::fs::write(&out, bytes).unwrap();
    out
}

fn runtime(path: &Path) -> ModelRuntime {
    let options = LoadOptions { threads: 1, ctx_size: 512, ..LoadOptions::default() };
    ModelRuntime::load(ModelPaths::new(path.to_path_buf(), None), options).unwrap()
}

fn app(runtime: ModelRuntime) -> axum::Router {
    let config = LlamaConfig::new(Arc::new(runtime), Method::Plain);
    config.check().expect("a model without a chat template is served");
    let metrics = Arc::new(Metrics::default());
    let scheduler = SchedulerConfig { parallel: 1, queue: 4, ..Default::default() };
    let pool = Arc::new(BatchPool::llama(config, scheduler, 512, metrics.clone()).unwrap());
    router(pool, metrics, ServerConfig::default())
}

fn chat() -> PromptInput {
    PromptInput::Chat(vec![
        Message { role: "system".into(), content: "You are terse.".into() },
        Message { role: "user".into(), content: "Name a colour.".into() },
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_a_chat_template_serves_completions_and_refuses_chats_clearly() {
    let Some(model) = model_path() else { return };
    let dir = tempfile::tempdir().unwrap();
    let base = without_template(&model, dir.path());
    let app = app(runtime(&base));
    let completion = json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0});
    let (status, body) = send(&app, None, "/v1/completions", Some(completion)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(!body["choices"][0]["text"].as_str().unwrap().is_empty(), "{body}");
    let (status, body) =
        send(&app, None, "/completion", Some(json!({"prompt": "Once", "n_predict": 3}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    let (status, body) = send(&app, None, "/v1/chat/completions", Some(chat)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("--chat-template") && message.contains("--chat-template-file"), "{message}");
    assert!(!message.contains("instead of --chat"), "names only flags that exist: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_given_by_name_renders_as_the_models_own() {
    let Some(model) = model_path() else { return };
    let dir = tempfile::tempdir().unwrap();
    let base = without_template(&model, dir.path());
    // SmolLM2's own template is ChatML (with a default system turn when none is given).
    let chatml = treespec_text::template_source("chatml").unwrap();
    let given = runtime(&base).with_chat_template(chatml);
    let own = runtime(&model);
    assert_eq!(prompt_tokens(&given, &chat(), None).unwrap(), prompt_tokens(&own, &chat(), None).unwrap());
    let app = app(given);
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0});
    let (status, body) = send(&app, None, "/v1/chat/completions", Some(chat)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, props) = send(&app, None, "/props", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(props["chat_template"].as_str().unwrap().contains("<|im_start|>"), "{props}");
}
