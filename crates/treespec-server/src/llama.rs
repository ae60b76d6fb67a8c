//! The llama.cpp worker: owns one target context (and one draft context) on its thread, reused
//! by every request (the generation loop starts each request from an empty cache).

use std::path::Path;
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};
use treespec_core::TokenId;
use treespec_engine::{Drafter, EngineError, Method, TokenConstraint};
use treespec_grammar::{DecodingConstraint, Vocabulary};
use treespec_llama::runtime::Prompt;
use treespec_llama::{LlamaLm, ModelRuntime};
use treespec_text::ChatMessage;

use crate::engine_thread::{run_generation, EnginePool, Event, RunError, RunSummary, Worker};
use crate::error::ApiError;
use crate::llama_api::{ModelInfo, ModelText};
use crate::methods::ServerMethods;
use crate::metrics::Metrics;
use crate::tenant::Tenant;
use crate::validate::{JobSpec, Limits, PromptInput, ToolsPrompt};

/// What the workers run on: the models, loaded once by the caller (who may also have read the
/// tokenizer fingerprint and the cost curves from the same runtime to build `method`), shared by
/// every worker thread.
#[derive(Debug, Clone)]
pub struct LlamaConfig {
    /// The loaded target and draft.
    pub runtime: Arc<ModelRuntime>,
    /// The default method, and what resolves each request's (with each tenant's suffix state).
    pub methods: Arc<ServerMethods>,
}

impl LlamaConfig {
    /// `method` by default on `runtime`, every tenant's suffix state in memory only.
    pub fn new(runtime: Arc<ModelRuntime>, method: Method) -> Self {
        let methods = Arc::new(ServerMethods::new(method, runtime.clone()));
        Self { runtime, methods }
    }

    /// The default method.
    pub fn method(&self) -> Method {
        self.methods.default_method()
    }
}

/// Tokenize a request's prompt: chat messages through the model's template (only the template's
/// markup yields special tokens, as in `treespec generate --chat`), raw text as is. The tools of
/// a `tool_choice: "auto"` request go to a template that describes tools itself (Qwen2.5's),
/// else in front as a system note.
pub fn prompt_tokens(
    runtime: &ModelRuntime,
    prompt: &PromptInput,
    tools: Option<&ToolsPrompt>,
) -> std::result::Result<Vec<TokenId>, ApiError> {
    let chat = chat_messages;
    let tokens = match (prompt, tools) {
        (PromptInput::Tokens(t), _) => return check_tokens(runtime, t).map(|()| t.clone()),
        (PromptInput::Text(t), _) => runtime.prompt_tokens(Prompt::Text(t)),
        (PromptInput::Chat(msgs), None) => runtime.prompt_tokens(Prompt::Messages(&chat(msgs))),
        (PromptInput::Chat(msgs), Some(tools)) => {
            let own = runtime.chat_template().map(|t| t.renders_tools()).unwrap_or(false);
            if own {
                runtime.prompt_tokens(Prompt::MessagesWithTools(&chat(msgs), &tools.declared))
            } else {
                runtime.prompt_tokens(Prompt::Messages(&chat(&tools.messages(msgs))))
            }
        }
    };
    tokens.map_err(|e| match (e, prompt) {
        (EngineError::InvalidRequest(e), PromptInput::Chat(_)) => {
            ApiError::invalid("messages", format!("the chat template refused the messages: {e}"))
        }
        (e, _) => ApiError::internal(e.to_string()),
    })
}

/// Validated messages as the chat template takes them.
fn chat_messages(msgs: &[crate::validate::Message]) -> Vec<ChatMessage> {
    msgs.iter().map(|x| ChatMessage::new(&x.role, &x.content)).collect()
}

/// Tokens a client sent must be in the vocabulary (llama.cpp aborts on any other id).
pub fn check_tokens(runtime: &ModelRuntime, tokens: &[TokenId]) -> std::result::Result<(), ApiError> {
    let vocab = runtime.target().vocab_size();
    match tokens.iter().find(|&&t| t as usize >= vocab) {
        Some(t) => {
            Err(ApiError::invalid("prompt", format!("token {t} is outside the vocabulary of {vocab} tokens")))
        }
        None => Ok(()),
    }
}

/// One worker's contexts.
pub struct LlamaWorker<'m> {
    runtime: &'m ModelRuntime,
    target: LlamaLm<'m>,
    draft: Option<LlamaLm<'m>>,
    methods: Arc<ServerMethods>,
    vocab: Arc<OnceLock<Vocabulary>>,
}

/// The target's vocabulary for grammars, built on the first structured request and shared by
/// every worker (greedy forcing, as the CLI's `--json-schema`).
fn vocabulary<'v>(
    runtime: &ModelRuntime,
    cell: &'v OnceLock<Vocabulary>,
) -> std::result::Result<&'v Vocabulary, ApiError> {
    if let Some(v) = cell.get() {
        return Ok(v);
    }
    let table = runtime.token_table().map_err(|e| ApiError::internal(format!("token table: {e}")))?;
    let vocab = Vocabulary::new(&table.tokens, &table.eos, &table.special)
        .map_err(|e| ApiError::internal(format!("grammar vocabulary: {e}")))?;
    Ok(cell.get_or_init(|| vocab))
}

/// The request's grammar state, compiled against the model's vocabulary (≈1 ms); a grammar
/// llguidance refuses is the request's fault (400 naming its field).
pub fn constraint(
    runtime: &ModelRuntime,
    cell: &OnceLock<Vocabulary>,
    spec: &JobSpec,
) -> std::result::Result<Option<DecodingConstraint>, ApiError> {
    let Some(grammar) = spec.output.grammar() else { return Ok(None) };
    let vocab = vocabulary(runtime, cell)?;
    let compiled =
        grammar.compile(vocab).map_err(|e| ApiError::invalid(spec.output.param(), e.to_string()))?;
    Ok(Some(DecodingConstraint::new(compiled.constraint())))
}

impl<'m> LlamaWorker<'m> {
    /// Make the contexts, and check that the default method builds: a request without a
    /// `treespec` object uses it, so a bad one (`--budget 0`) must stop the server at start, not
    /// fail every such request with a 400.
    pub fn new(
        runtime: &'m ModelRuntime,
        methods: Arc<ServerMethods>,
        vocab: Arc<OnceLock<Vocabulary>>,
    ) -> Result<Self> {
        let target = runtime.target().new_lm()?;
        let mut draft = runtime.draft().map(|d| d.new_lm()).transpose()?;
        let default = methods.default_method();
        drafter(&default, draft.as_mut())
            .with_context(|| format!("the server's default method '{}' is invalid", default.name()))?;
        Ok(Self { runtime, target, draft, methods, vocab })
    }
}

/// A drafter for `method`, on the draft context when the method uses one.
fn drafter<'a>(
    method: &Method,
    draft: Option<&'a mut LlamaLm<'_>>,
) -> treespec_engine::Result<Box<dyn Drafter + 'a>> {
    method.build(draft.filter(|_| method.uses_draft()))
}

impl Worker for LlamaWorker<'_> {
    fn run(
        &mut self,
        spec: &JobSpec,
        tenant: Tenant,
        emit: &mut dyn FnMut(Event) -> bool,
    ) -> Result<RunSummary, RunError> {
        let prompt = prompt_tokens(self.runtime, &spec.prompt, spec.tools.as_ref())?;
        let mut constraint = constraint(self.runtime, &self.vocab, spec)?;
        let method = self.methods.for_request(spec.method.as_ref(), tenant)?;
        let mut drafter = drafter(&method, self.draft.as_mut())
            .map_err(|e| ApiError::invalid("treespec", e.to_string()))?;
        let bytes = self.runtime.token_bytes();
        let eos = self.runtime.eos_tokens().to_vec();
        run_generation(
            &mut self.target,
            drafter.as_mut(),
            method.name(),
            prompt,
            spec,
            eos,
            &bytes,
            constraint.as_mut().map(|c| c as &mut dyn TokenConstraint),
            emit,
        )
    }
}

impl EnginePool {
    /// Start `workers` threads on the loaded models (each with its own contexts) behind a queue of
    /// `queue` waiting jobs. Loads nothing: the runtime's weights are shared.
    pub fn llama(config: LlamaConfig, workers: usize, queue: usize, metrics: Arc<Metrics>) -> Result<Self> {
        let LlamaConfig { runtime: models, methods } = config;
        let method = methods.default_method();
        if method.needs_draft() && !models.has_draft() {
            anyhow::bail!("method '{}' needs a draft model (--md DRAFT.gguf)", method.name());
        }
        // Every chat request needs the template: a broken one stops the server at start.
        models.chat_template().context("compiling the model's chat template")?;
        let limits =
            Limits { context: models.options().ctx_size, has_draft: models.has_draft(), ..Limits::default() };
        let id = model_id(&models.paths().model);
        let text = Arc::new(LlamaText(models.clone()));
        let (pool, q) = EnginePool::new(queue, id, limits, text, workers.max(1), metrics);
        // Requests' methods resolve on the same runtime: fingerprint and curves on first need.
        let vocab = Arc::new(OnceLock::new());
        // Make every worker's contexts before answering anything, so a failure shows at start.
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        for i in 0..workers.max(1) {
            let (q, models, methods, ready) = (q.clone(), models.clone(), methods.clone(), ready_tx.clone());
            let vocab = vocab.clone();
            std::thread::Builder::new().name(format!("treespec-engine-{i}")).spawn(move || {
                match LlamaWorker::new(&models, methods, vocab) {
                    Ok(mut w) => {
                        let _ = ready.send(Ok(()));
                        drop(ready);
                        q.serve(&mut w);
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                    }
                }
            })?;
        }
        drop(ready_tx);
        for _ in 0..workers.max(1) {
            ready_rx.recv().context("an engine thread died while starting")??;
        }
        Ok(pool)
    }
}

/// The id served for a model file: its file stem.
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
        check_tokens(&self.0, &[token]).map_err(|e| ApiError { param: Some("tokens".into()), ..e })?;
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
        let chat = chat_messages;
        // The tools as `prompt_tokens` hands them to the template.
        match &spec.tools {
            Some(t) if template.renders_tools() => {
                template.render_with_tools(&chat(msgs), true, Some(&t.declared)).map_err(refused)
            }
            Some(t) => template.render(&chat(&t.messages(msgs)), true).map_err(refused),
            None => template.render(&chat(msgs), true).map_err(refused),
        }
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
