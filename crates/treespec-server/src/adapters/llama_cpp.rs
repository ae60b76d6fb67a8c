//! What the batch scheduler's llama.cpp lanes (`llama_cpp_lanes.rs`) stand on: the loaded models
//! and methods ([`LlamaConfig`]), the served model's id and device. The runtime is the model's
//! one trait (`PromptModel`): the scheduler prepares requests on it by the one preparation every
//! model shares (`request/prepare.rs`), and llama-server's endpoints read its tokenizer and chat
//! template through it (`intake/model_text.rs`).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use treespec_engine::{CausalLm, Method};
use treespec_llama::ModelRuntime;
use treespec_request::check_method;

use crate::scheduling::methods::ServerMethods;

/// What the lanes run on: the models, loaded once by the caller (who may also have read the
/// tokenizer fingerprint and the cost curves from the same runtime to build `method`).
#[derive(Debug, Clone)]
pub struct LlamaConfig {
    /// The loaded target and draft.
    pub runtime: Arc<ModelRuntime>,
    /// The default method, and what resolves each request's (with each tenant's suffix state).
    pub methods: Arc<ServerMethods>,
    /// Host memory the batch scheduler keeps finished requests' prefixes in, in bytes
    /// (`--cache-ram`; see `treespec_llama::SAVED_PREFIX_BYTES`).
    pub cache_ram: usize,
    /// The model's name on `/v1/models`, `/props` and every response (llama-server's `-a`;
    /// default: the file's stem).
    pub alias: Option<String>,
}

impl LlamaConfig {
    /// `method` by default on `runtime`, every tenant's suffix state in memory only.
    pub fn new(runtime: Arc<ModelRuntime>, method: Method) -> Self {
        let methods = Arc::new(ServerMethods::new(method, runtime.clone()));
        Self { runtime, methods, cache_ram: treespec_llama::SAVED_PREFIX_BYTES, alias: None }
    }

    /// The default method.
    pub fn method(&self) -> Method {
        self.methods.default_method()
    }

    /// What the server checks before it answers anything: the default method can run on these
    /// models (a method that needs a draft model has one), and the chat template compiles (every
    /// chat request needs it). A model without any template (a base model) is served: its
    /// completions routes answer, its chat requests get a 400 saying how to give a template.
    pub fn check(&self) -> anyhow::Result<()> {
        let method = self.methods.default_method();
        check_method(&*self.runtime, &method).map_err(|e| anyhow::anyhow!("{e}"))?;
        if self.runtime.chat_template_source().is_none() {
            eprintln!(
                "treespec serve: warning: this model has no chat template: /v1/completions and /completion \
                 serve it, chat requests are refused (give one with --chat-template NAME|JINJA or \
                 --chat-template-file FILE)"
            );
            return Ok(());
        }
        self.runtime.chat_template().context("compiling the chat template")?;
        Ok(())
    }
}

/// Where the runtime's models run, in words: the target's device, and the draft's where it differs.
pub fn runs_on(runtime: &ModelRuntime) -> String {
    let target = runtime.target().runs_on();
    match runtime.draft().map(|d| d.runs_on()) {
        Some(draft) if draft != target => format!("{target}; draft: {draft}"),
        _ => target.to_string(),
    }
}

/// The id served for a model file: its file stem.
pub fn model_id(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
}

/// Build the default method's drafter once, on `draft` when it runs one: a request without a
/// `treespec` object uses it, so a bad one (`--budget 0`) must stop the server at start, not
/// fail every such request with a 400.
pub fn check_default_method<'d, D: CausalLm + 'd>(method: &Method, draft: Option<D>) -> anyhow::Result<()> {
    method
        .build(draft.filter(|_| method.uses_draft()))
        .map(drop)
        .with_context(|| format!("the server's default method '{}' is invalid", method.name()))
}
