//! The batching scheduler on toy models (no files, deterministic): the toy batched target has
//! one toy sequence per lane, and the requests draft on lanes of one shared toy draft (their
//! draft forwards batched, as on llama.cpp). For tests — above all the
//! χ² test that a request's samples keep the target distribution while other requests share
//! its steps.

use std::sync::Arc;

use treespec_core::TokenId;
use treespec_engine::batched::BatchedLm;
use treespec_engine::toy::{ToyBatchLm, ToyDraftLanes, ToyLm, ToyModel};
use treespec_engine::{SharedDraft, TokenBytes};

use crate::engine_thread::{Letters, ToyConfig, ToyWorker};
use crate::error::ApiError;
use crate::llama_api::{ModelInfo, ModelText};
use crate::methods::ServerMethods;
use crate::metrics::Metrics;
use crate::scheduler::{BatchPool, LaneModels, Prepared, Scheduler, SchedulerConfig};
use crate::tenant::Tenant;
use crate::validate::{JobSpec, Limits};

/// Toy target lanes and toy drafts.
pub struct ToyLanes {
    lm: ToyBatchLm,
    draft: SharedDraft<'static>,
    config: ToyConfig,
    methods: Arc<ServerMethods>,
}

impl ToyLanes {
    /// The toy target (and a noisy draft) of `config`, in `parallel` lanes.
    pub fn new(config: ToyConfig, parallel: usize) -> Self {
        let m = ToyModel::new(config.vocab.min(26), 1, 7);
        let draft = m.draft(0.5, 3);
        let methods = ToyWorker::methods(config.method.clone());
        let draft = SharedDraft::new(ToyDraftLanes::new(draft, config.context, parallel + 1));
        let mut lm = ToyBatchLm::new(m, config.context, parallel);
        if let Some(cells) = config.shared_cells {
            lm = lm.with_capacity(cells);
        }
        Self { lm, draft, config, methods }
    }
}

impl LaneModels<'static> for ToyLanes {
    fn lm(&mut self) -> &mut dyn BatchedLm {
        &mut self.lm
    }

    fn prepare(&mut self, spec: &JobSpec, tenant: Tenant) -> Result<Prepared<'static>, ApiError> {
        let prompt = ToyWorker::prompt(&self.config, spec)?;
        let method = self.methods.for_request(spec.method.as_ref(), tenant)?;
        let invalid = |e: treespec_engine::EngineError| ApiError::invalid("treespec", e.to_string());
        let drafter = if method.uses_draft() {
            let lane = self.draft.lane().map_err(|e| ApiError::internal(format!("draft lane: {e}")))?;
            method.build(Some(lane)).map_err(invalid)?
        } else {
            method.build::<ToyLm>(None).map_err(invalid)?
        };
        Ok(Prepared {
            prompt,
            eos: Vec::new(),
            method: method.name().to_string(),
            drafter,
            constraint: None,
            scope: tenant.scope(),
        })
    }

    fn bytes(&self) -> &dyn TokenBytes {
        &Letters
    }

    /// Called once per step: the toy's `step_delay` is slept here (to test queueing and
    /// cancellation against a slow model).
    fn split(&mut self) -> (&mut dyn BatchedLm, &dyn TokenBytes, Option<&SharedDraft<'static>>) {
        if !self.config.step_delay.is_zero() {
            std::thread::sleep(self.config.step_delay);
        }
        (&mut self.lm, &Letters, Some(&self.draft))
    }
}

impl BatchPool {
    /// A batching scheduler on toy models, for tests and demos.
    pub fn toy(config: ToyConfig, scheduler: SchedulerConfig, metrics: Arc<Metrics>) -> Self {
        let limits = Limits { context: config.context, has_draft: true, ..Limits::default() };
        let text = Arc::new(ToyText { vocab: config.vocab });
        let (pool, inbox) = BatchPool::new(scheduler, "toy".into(), limits, text);
        let models = ToyLanes::new(config, scheduler.parallel);
        std::thread::spawn(move || Scheduler::new(models, scheduler, metrics).run(inbox));
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
