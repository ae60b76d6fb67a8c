//! The llama.cpp worker: owns one target context (and one draft context) on its thread, reused
//! by every request (the generation loop starts each request from an empty cache).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use treespec_core::TokenId;
use treespec_engine::{Drafter, EngineError, Method, TokenBytes};
use treespec_llama::{check_compatible, LlamaLm, LlamaModel, LoadOptions};
use treespec_text::{ChatMessage, ChatTemplate};

use crate::engine_thread::{run_generation, EnginePool, Event, RunError, RunSummary, Worker};
use crate::error::ApiError;
use crate::methods::{ServerMethods, SharedContext};
use crate::metrics::Metrics;
use crate::validate::{JobSpec, Limits, PromptInput};

/// What to load.
#[derive(Clone)]
pub struct LlamaConfig {
    /// Target GGUF.
    pub model: PathBuf,
    /// Draft GGUF (may be the target file: then the weights are shared).
    pub draft: Option<PathBuf>,
    /// Load options for both.
    pub options: LoadOptions,
    /// The method used when a request names none.
    pub method: Method,
    /// What resolving a request's method needs from the models (tokenizer, cost curves).
    pub context: SharedContext,
}

/// The loaded models, shared by the worker threads (each makes its own contexts).
pub struct LoadedModels {
    target: LlamaModel,
    draft: Option<LlamaModel>,
    has_draft: bool,
    template: ChatTemplate,
    eos: Vec<TokenId>,
}

impl LoadedModels {
    /// Load the target (and draft), check they are compatible, read the chat template.
    pub fn load(config: &LlamaConfig) -> Result<Self> {
        let target = LlamaModel::load(&config.model, config.options.clone())
            .with_context(|| format!("loading target model {}", config.model.display()))?;
        let mut draft = None;
        if let Some(path) = &config.draft {
            if !same_file(path, &config.model) {
                let d = LlamaModel::load(path, config.options.clone())
                    .with_context(|| format!("loading draft model {}", path.display()))?;
                check_compatible(&d, &target)?;
                draft = Some(d);
            }
        }
        let template = target.compiled_chat_template()?;
        let mut eos: Vec<TokenId> = [target.eos(), target.eot()].into_iter().flatten().collect();
        eos.dedup();
        Ok(Self { target, draft, has_draft: config.draft.is_some(), template, eos })
    }

    fn draft(&self) -> Option<&LlamaModel> {
        self.has_draft.then(|| self.draft.as_ref().unwrap_or(&self.target))
    }

    /// The target and the draft (the target itself when the draft is the same file).
    pub fn models(&self) -> (&LlamaModel, Option<&LlamaModel>) {
        (&self.target, self.draft())
    }

    /// End-of-generation tokens of the target.
    pub fn eos_tokens(&self) -> Vec<TokenId> {
        self.eos.clone()
    }

    /// Tokenize a prompt: chat messages through the model's template (only the template's markup
    /// yields special tokens, as in `treespec generate --chat`), raw text as is.
    pub fn prompt_tokens(&self, prompt: &PromptInput) -> std::result::Result<Vec<TokenId>, ApiError> {
        let m = &self.target;
        match prompt {
            PromptInput::Text(t) => m.text_prompt(t).map_err(|e| ApiError::internal(e.to_string())),
            PromptInput::Chat(msgs) => {
                let msgs: Vec<ChatMessage> =
                    msgs.iter().map(|x| ChatMessage::new(&x.role, &x.content)).collect();
                m.chat_prompt(&self.template, &msgs).map_err(|e| match e {
                    EngineError::InvalidRequest(e) => {
                        ApiError::invalid("messages", format!("the chat template refused the messages: {e}"))
                    }
                    e => ApiError::internal(e.to_string()),
                })
            }
        }
    }
}

/// Token → bytes through the model's vocabulary (special tokens render as nothing).
pub struct ModelBytes<'a>(pub &'a LlamaModel);

impl TokenBytes for ModelBytes<'_> {
    fn token_bytes(&self, token: TokenId) -> Vec<u8> {
        self.0.token_to_bytes(token, false).unwrap_or_default()
    }
}

/// One worker's contexts.
pub struct LlamaWorker<'m> {
    models: &'m LoadedModels,
    target: LlamaLm<'m>,
    draft: Option<LlamaLm<'m>>,
    methods: Arc<ServerMethods>,
}

impl<'m> LlamaWorker<'m> {
    /// Make the contexts, and check that the default method builds: a request without a
    /// `treespec` object uses it, so a bad one (`--budget 0`) must stop the server at start, not
    /// fail every such request with a 400.
    pub fn new(models: &'m LoadedModels, methods: Arc<ServerMethods>) -> Result<Self> {
        let target = models.target.new_lm()?;
        let mut draft = models.draft().map(|d| d.new_lm()).transpose()?;
        let default = methods.default_method();
        drafter(default, draft.as_mut())
            .with_context(|| format!("the server's default method '{}' is invalid", default.name()))?;
        Ok(Self { models, target, draft, methods })
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
    fn run(&mut self, spec: &JobSpec, emit: &mut dyn FnMut(Event) -> bool) -> Result<RunSummary, RunError> {
        let prompt = self.models.prompt_tokens(&spec.prompt)?;
        let method = self.methods.for_request(spec.method.as_ref())?;
        let mut drafter = drafter(&method, self.draft.as_mut())
            .map_err(|e| ApiError::invalid("treespec", e.to_string()))?;
        let bytes = ModelBytes(&self.models.target);
        let eos = self.models.eos.clone();
        run_generation(&mut self.target, drafter.as_mut(), method.name(), prompt, spec, eos, &bytes, emit)
    }
}

impl EnginePool {
    /// Load the models and start `workers` threads (each with its own contexts) behind a queue of
    /// `queue` waiting jobs.
    pub fn llama(config: LlamaConfig, workers: usize, queue: usize, metrics: Arc<Metrics>) -> Result<Self> {
        if config.method.needs_draft() && config.draft.is_none() {
            anyhow::bail!("method '{}' needs a draft model (--md DRAFT.gguf)", config.method.name());
        }
        let models = Arc::new(LoadedModels::load(&config)?);
        let limits =
            Limits { context: config.options.ctx_size, has_draft: models.has_draft, ..Limits::default() };
        let id = model_id(&config.model);
        let (pool, q) = EnginePool::new(queue, id, limits, metrics);
        let methods = Arc::new(ServerMethods::new(config.method.clone(), config.context.clone()));
        // Make every worker's contexts before answering anything, so a failure shows at start.
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        for i in 0..workers.max(1) {
            let (q, models, methods, ready) = (q.clone(), models.clone(), methods.clone(), ready_tx.clone());
            std::thread::Builder::new().name(format!("treespec-engine-{i}")).spawn(move || {
                match LlamaWorker::new(&models, methods) {
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

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}
