//! Toy models behind the server (no files, deterministic, for tests and demos): token `t` is the
//! letter `'a' + t`, prompts map byte by byte onto the vocabulary, and the FIFO pool runs
//! [`ToyWorker`]s (the batch scheduler's toys are in `toy_lanes.rs`).

use std::sync::Arc;
use std::time::Duration;

use treespec_core::TokenId;
use treespec_engine::registry::FixedContext;
use treespec_engine::toy::{toy_costs, ToyLm, ToyModel};
use treespec_engine::{GenerateRequest, Method, TokenBytes};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::request::validate::{check_lengths, JobSpec, Limits, PromptInput};
use crate::scheduling::fifo::{run_generation, EnginePool, Structure, Worker};
use crate::scheduling::job::{Event, RunError, RunSummary};
use crate::scheduling::job::{ModelInfo, ModelText};
use crate::scheduling::methods::ServerMethods;
use crate::tenant::Tenant;

/// Toy models: token `t` is the letter `'a' + t`, prompts map byte by byte onto the vocabulary.
#[derive(Debug, Clone)]
pub struct ToyConfig {
    /// Vocabulary size (≤ 26).
    pub vocab: usize,
    /// Context window.
    pub context: usize,
    /// The default method.
    pub method: Method,
    /// Sleep per decode step (to test queueing and cancellation).
    pub step_delay: Duration,
    /// Batch scheduler: positions all lanes together may hold (default: every lane's whole
    /// context), to test requests waiting for room.
    pub shared_cells: Option<usize>,
    /// Batch scheduler: reuse a finished request's text as the prefix of a later one of the
    /// same tenant, as llama.cpp's lanes do (reported in `cached_tokens`).
    pub prefix_cache: bool,
}

impl Default for ToyConfig {
    fn default() -> Self {
        Self {
            vocab: 26,
            context: 256,
            method: Method::Chain { k: 3 },
            step_delay: Duration::ZERO,
            shared_cells: None,
            prefix_cache: false,
        }
    }
}

/// Toy token bytes: token `t` is the letter `'a' + t`.
pub struct Letters;

impl TokenBytes for Letters {
    fn token_bytes(&self, token: TokenId) -> Vec<u8> {
        vec![b'a' + (token % 26) as u8]
    }
}

/// A worker on toy models (no files, deterministic).
pub struct ToyWorker {
    config: ToyConfig,
    methods: Arc<ServerMethods>,
    target: ToyLm,
    draft: ToyLm,
}

impl ToyWorker {
    /// Build the toy target and a noisy draft; `methods` resolves the requests' methods.
    pub fn new(config: ToyConfig, methods: Arc<ServerMethods>) -> Self {
        let m = ToyModel::new(config.vocab.min(26), 1, 7);
        let draft = ToyLm::new(m.draft(0.5, 3), config.context);
        Self { target: ToyLm::new(m, config.context), draft, config, methods }
    }

    /// The toys' methods: cost curves with a verify that grows slowly with the batch.
    pub fn methods(default: Method) -> Arc<ServerMethods> {
        let context = FixedContext { costs: Some(toy_costs()), ..Default::default() };
        Arc::new(ServerMethods::new(default, Arc::new(context)))
    }

    /// The toy "chat template": `role: content` lines, then `assistant:` (it renders no tools:
    /// their note goes in front). Tokens read as their letters.
    pub fn render(spec: &JobSpec) -> String {
        match &spec.prompt {
            PromptInput::Text(t) => t.clone(),
            PromptInput::Tokens(t) => t.iter().map(|&t| char::from(Letters.token_bytes(t)[0])).collect(),
            PromptInput::Chat(msgs) => {
                let msgs = match &spec.tools {
                    Some(t) => t.messages(msgs),
                    None => msgs.clone(),
                };
                let mut s: String = msgs.iter().map(|m| format!("{}: {}\n", m.role, m.content)).collect();
                s.push_str("assistant:");
                s
            }
        }
    }
}

impl ToyWorker {
    /// A request's toy prompt: its rendering, byte by byte onto the vocabulary (tokens as they
    /// are, checked against it). Structured output is refused: the toys have no vocabulary to
    /// compile a grammar against.
    pub fn prompt(config: &ToyConfig, spec: &JobSpec) -> Result<Vec<TokenId>, ApiError> {
        if spec.output.grammar().is_some() {
            return Err(ApiError::invalid(
                spec.output.param(),
                "structured output needs a model vocabulary and the toy backend has none",
            ));
        }
        match &spec.prompt {
            PromptInput::Tokens(t) => ToyText::check(config.vocab, t).map(|()| t.clone()),
            _ => Ok(ToyText::tokens(config.vocab, &Self::render(spec))),
        }
    }

    /// A request ready for a toy target: its prompt, and as many new tokens as it asked for
    /// and the context holds. The toys have no end-of-generation token.
    pub fn request(config: &ToyConfig, spec: &JobSpec) -> Result<GenerateRequest, ApiError> {
        let prompt = Self::prompt(config, spec)?;
        let max_new_tokens = check_lengths(prompt.len(), spec.max_tokens, config.context)?;
        Ok(spec.generate_request(prompt, max_new_tokens, Vec::new()))
    }
}

impl Worker for ToyWorker {
    fn run(
        &mut self,
        spec: &JobSpec,
        tenant: Tenant,
        emit: &mut dyn FnMut(Event) -> bool,
    ) -> Result<RunSummary, RunError> {
        let request = Self::request(&self.config, spec)?;
        let method = self.methods.for_request(spec.method.as_ref(), tenant)?;
        let mut drafter =
            method.build(Some(&mut self.draft)).map_err(|e| ApiError::invalid("treespec", e.to_string()))?;
        let delay = self.config.step_delay;
        let mut slow_emit = |e: Event| {
            if !delay.is_zero() && matches!(e, Event::Text(ref t) if t.is_empty()) {
                std::thread::sleep(delay);
            }
            emit(e)
        };
        run_generation(
            &mut self.target,
            drafter.as_mut(),
            method.name(),
            request,
            &Letters,
            Structure::default(),
            &mut slow_emit,
        )
    }
}

impl EnginePool {
    /// A pool of `workers` toy workers, for tests and demos.
    pub fn toy(config: ToyConfig, workers: usize, queue: usize, metrics: Arc<Metrics>) -> Self {
        let limits = Limits { context: config.context, has_draft: true, ..Limits::default() };
        let text = Arc::new(ToyText { vocab: config.vocab });
        let (pool, q) = Self::new(queue, "toy".into(), limits, text, workers.max(1), metrics);
        let methods = ToyWorker::methods(config.method.clone());
        for _ in 0..workers.max(1) {
            let (q, config, methods) = (q.clone(), config.clone(), methods.clone());
            std::thread::spawn(move || q.serve(&mut ToyWorker::new(config, methods)));
        }
        pool
    }
}

/// The toys' "tokenizer": a byte maps onto the vocabulary (byte mod its size), token `t` reads
/// as the letter `'a' + t` ([`Letters`]); the chat template is [`ToyWorker::render`].
#[derive(Debug, Clone, Copy)]
pub struct ToyText {
    /// Vocabulary size (≤ 26).
    pub vocab: usize,
}

impl ToyText {
    /// `text` byte by byte onto a vocabulary of `vocab` tokens.
    pub fn tokens(vocab: usize, text: &str) -> Vec<TokenId> {
        let vocab = vocab.clamp(1, 26) as u32;
        text.bytes().map(|b| b as u32 % vocab).collect()
    }

    /// Every token must be in the vocabulary (a 400 naming `prompt` otherwise).
    pub fn check(vocab: usize, tokens: &[TokenId]) -> Result<(), ApiError> {
        let vocab = vocab.clamp(1, 26);
        match tokens.iter().find(|&&t| t as usize >= vocab) {
            Some(t) => Err(ApiError::invalid(
                "prompt",
                format!("token {t} is outside the vocabulary of {vocab} tokens"),
            )),
            None => Ok(()),
        }
    }
}

impl ModelText for ToyText {
    fn tokenize(
        &self,
        text: &str,
        _add_special: bool,
        _parse_special: bool,
    ) -> Result<Vec<TokenId>, ApiError> {
        // The toys have no special tokens.
        Ok(Self::tokens(self.vocab, text))
    }

    fn piece(&self, token: TokenId) -> Result<Vec<u8>, ApiError> {
        Self::check(self.vocab, &[token]).map_err(|e| ApiError { param: Some("tokens".into()), ..e })?;
        Ok(Letters.token_bytes(token))
    }

    fn apply_template(&self, spec: &JobSpec) -> Result<String, ApiError> {
        Ok(ToyWorker::render(spec))
    }

    fn info(&self) -> ModelInfo {
        ModelInfo { path: "toy".into(), chat_template: None, vocab_size: self.vocab.clamp(1, 26) }
    }
}
