//! What both llama.cpp backends share — the FIFO workers (`llama_worker.rs`) and the batch
//! scheduler's lanes (`llama_lanes.rs`): the loaded models and methods ([`LlamaConfig`]), a job
//! made ready through the runtime's one request preparation ([`prepare`], on
//! [`ModelRuntime::prepare`]) with its errors as the client should read them, the served model's
//! id, and the tokenizer and chat template behind llama-server's endpoints ([`LlamaText`]).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use treespec_core::TokenId;
use treespec_engine::{CausalLm, EngineError, Method};
use treespec_llama::runtime::{PrepareError, Prepared, Prompt, RequestPrompt, RequestSpec};
use treespec_llama::ModelRuntime;
use treespec_text::ChatMessage;

use crate::error::ApiError;
use crate::request::validate::{length_error, JobSpec, PromptInput, ToolsPrompt};
use crate::scheduling::job::{ModelInfo, ModelText};
use crate::scheduling::methods::ServerMethods;

/// What the backends run on: the models, loaded once by the caller (who may also have read the
/// tokenizer fingerprint and the cost curves from the same runtime to build `method`), shared by
/// every worker thread.
#[derive(Debug, Clone)]
pub struct LlamaConfig {
    /// The loaded target and draft.
    pub runtime: Arc<ModelRuntime>,
    /// The default method, and what resolves each request's (with each tenant's suffix state).
    pub methods: Arc<ServerMethods>,
    /// Host memory the batch scheduler keeps finished requests' prefixes in, in bytes
    /// (`--cache-ram`; see `treespec_llama::SAVED_PREFIX_BYTES`).
    pub cache_ram: usize,
}

impl LlamaConfig {
    /// `method` by default on `runtime`, every tenant's suffix state in memory only.
    pub fn new(runtime: Arc<ModelRuntime>, method: Method) -> Self {
        let methods = Arc::new(ServerMethods::new(method, runtime.clone()));
        Self { runtime, methods, cache_ram: treespec_llama::SAVED_PREFIX_BYTES }
    }

    /// The default method.
    pub fn method(&self) -> Method {
        self.methods.default_method()
    }

    /// What every backend checks before it answers anything: the default method can run on these
    /// models (a method that needs a draft model has one), and the chat template compiles (every
    /// chat request needs it).
    pub fn check(&self) -> anyhow::Result<()> {
        let method = self.methods.default_method();
        self.runtime.check_method(&method).map_err(|e| anyhow::anyhow!("{e}"))?;
        self.runtime.chat_template().context("compiling the model's chat template")?;
        Ok(())
    }
}

/// Make `spec` ready to decode with `method` in a sequence of `context` positions, the drafter
/// on `draft` when the method runs a draft model.
pub fn prepare<'d, D: CausalLm + 'd>(
    runtime: &ModelRuntime,
    spec: &JobSpec,
    method: &Method,
    context: usize,
    draft: Option<D>,
) -> Result<Prepared<'d>, ApiError> {
    with_request_prompt(runtime, &spec.prompt, spec.tools.as_ref(), |prompt| {
        let request = RequestSpec {
            prompt,
            method,
            max_new_tokens: spec.max_tokens,
            context,
            sampling: spec.sampling.clone(),
            seed: spec.seed,
            stop: &spec.stop,
            grammar: spec.output.grammar(),
            tool_calls: spec.output.auto_tools(),
        };
        runtime.prepare(&request, draft)
    })
    .map_err(|e| prepare_error(e, spec.output.param()))
}

/// Tokenize a request's prompt: chat messages through the model's template (only the template's
/// markup yields special tokens, as in `treespec generate --chat`), raw text as is. The tools of
/// a `tool_choice: "auto"` request go to a template that describes tools itself (Qwen2.5's),
/// else in front as a system note.
pub fn prompt_tokens(
    runtime: &ModelRuntime,
    prompt: &PromptInput,
    tools: Option<&ToolsPrompt>,
) -> Result<Vec<TokenId>, ApiError> {
    with_request_prompt(runtime, prompt, tools, |p| runtime.request_tokens(p))
        .map_err(|e| prepare_error(e, None))
}

/// `f` on the prompt as the runtime's preparation takes it (the chat messages, with the tools as
/// [`chat_input`] hands them to the template, live only for the call).
fn with_request_prompt<R>(
    runtime: &ModelRuntime,
    prompt: &PromptInput,
    tools: Option<&ToolsPrompt>,
    f: impl FnOnce(RequestPrompt<'_>) -> R,
) -> R {
    match prompt {
        PromptInput::Tokens(t) => f(RequestPrompt::Tokens(t)),
        PromptInput::Text(t) => f(RequestPrompt::Formatted(Prompt::Text(t))),
        PromptInput::Chat(msgs) => {
            let (chat, declared) = chat_input(runtime, msgs, tools);
            f(RequestPrompt::Formatted(match declared {
                Some(tools) => Prompt::MessagesWithTools(&chat, tools),
                None => Prompt::Messages(&chat),
            }))
        }
    }
}

/// The messages as the chat template takes them, and the tools' declarations when the template
/// renders tools itself (else their note is a system message in front).
fn chat_input<'t>(
    runtime: &ModelRuntime,
    msgs: &[crate::request::prompt::Message],
    tools: Option<&'t ToolsPrompt>,
) -> (Vec<ChatMessage>, Option<&'t serde_json::Value>) {
    match tools {
        None => (chat_messages(msgs), None),
        Some(t) if renders_tools(runtime) => (chat_messages(msgs), Some(&t.declared)),
        Some(t) => (chat_messages(&t.messages(msgs)), None),
    }
}

/// Whether the model's chat template describes tools itself.
fn renders_tools(runtime: &ModelRuntime) -> bool {
    runtime.chat_template().map(|t| t.renders_tools()).unwrap_or(false)
}

/// Validated messages as the chat template takes them.
fn chat_messages(msgs: &[crate::request::prompt::Message]) -> Vec<ChatMessage> {
    msgs.iter().map(|x| ChatMessage::new(&x.role, &x.content)).collect()
}

/// What the client reads when its request cannot be prepared: the field at fault in a 400
/// (`grammar_param` names the request's structured-output field), or a 500 when the server is.
fn prepare_error(e: PrepareError, grammar_param: Option<&'static str>) -> ApiError {
    match e {
        PrepareError::Template(_) => ApiError::invalid("messages", e.to_string()),
        PrepareError::TokenOutOfVocabulary { .. } => ApiError::invalid("prompt", e.to_string()),
        PrepareError::EmptyPrompt
        | PrepareError::PromptTooLong { .. }
        | PrepareError::TooManyTokens { .. } => length_error(e),
        PrepareError::Grammar(g) => ApiError::invalid(grammar_param, g.to_string()),
        PrepareError::Method(m) => ApiError::invalid("treespec", m),
        PrepareError::Internal(m) => ApiError::internal(m),
    }
}

/// The id served for a model file: its file stem.
/// Where the runtime's models run, in words: the target's device, and the draft's where it differs.
pub fn runs_on(runtime: &ModelRuntime) -> String {
    let target = runtime.target().runs_on();
    match runtime.draft().map(|d| d.runs_on()) {
        Some(draft) if draft != target => format!("{target}; draft: {draft}"),
        _ => target.to_string(),
    }
}

pub fn model_id(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
}

/// The loaded target's tokenizer and chat template, for llama-server's endpoints.
#[derive(Debug, Clone)]
pub struct LlamaText(pub Arc<ModelRuntime>);

impl ModelText for LlamaText {
    fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> std::result::Result<Vec<TokenId>, ApiError> {
        self.0.target().tokenize(text, add_special, parse_special).map_err(|e| match e {
            EngineError::InvalidRequest(m) => ApiError::invalid("content", m),
            e => ApiError::internal(format!("tokenizing: {e}")),
        })
    }

    fn piece(&self, token: TokenId) -> std::result::Result<Vec<u8>, ApiError> {
        self.0.check_tokens(&[token]).map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
        self.0.target().token_to_bytes(token, true).map_err(|e| ApiError::internal(e.to_string()))
    }

    fn apply_template(&self, spec: &JobSpec) -> std::result::Result<String, ApiError> {
        let PromptInput::Chat(msgs) = &spec.prompt else {
            return Err(ApiError::invalid("messages", "a chat template renders messages"));
        };
        let refused = |e: treespec_text::TemplateError| {
            ApiError::invalid("messages", format!("the chat template refused the messages: {e}"))
        };
        let template = self.0.chat_template().map_err(|e| ApiError::invalid("messages", e.to_string()))?;
        // The messages and tools as `prompt_tokens` hands them to the template.
        let (chat, declared) = chat_input(&self.0, msgs, spec.tools.as_ref());
        template.render_with_tools(&chat, true, declared).map_err(refused)
    }

    fn info(&self) -> ModelInfo {
        let target = self.0.target();
        ModelInfo {
            path: self.0.paths().model.display().to_string(),
            chat_template: target.chat_template(),
            vocab_size: target.vocab_size(),
        }
    }
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
