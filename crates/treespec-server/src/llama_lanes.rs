//! The batching scheduler on llama.cpp: the target's lanes share one context
//! ([`LlamaBatchLm`]); a request whose method runs the draft model gets a draft context of its
//! own from a pool (returned when the request ends), so draft and target state never mix
//! between requests.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use treespec_core::TokenId;
use treespec_engine::batched::BatchedLm;
use treespec_engine::{CausalLm, Logits, Method, TokenBytes, TokenConstraint, TreeBatch};
use treespec_grammar::Vocabulary;
use treespec_llama::{LlamaBatchLm, LlamaLm, ModelBytes, ModelRuntime};

use crate::error::ApiError;
use crate::llama::{constraint, model_id, prompt_tokens, LlamaConfig};
use crate::methods::ServerMethods;
use crate::metrics::Metrics;
use crate::scheduler::{BatchPool, LaneModels, Prepared, Scheduler, SchedulerConfig};
use crate::validate::{JobSpec, Limits};

type DraftPool<'m> = Rc<RefCell<Vec<LlamaLm<'m>>>>;

/// A draft context lent to one request; back to the pool when its drafter is dropped.
struct PooledDraft<'m> {
    lm: Option<LlamaLm<'m>>,
    pool: DraftPool<'m>,
}

impl<'m> PooledDraft<'m> {
    fn lm(&self) -> &LlamaLm<'m> {
        self.lm.as_ref().expect("present until dropped")
    }
    fn lm_mut(&mut self) -> &mut LlamaLm<'m> {
        self.lm.as_mut().expect("present until dropped")
    }
}

impl Drop for PooledDraft<'_> {
    fn drop(&mut self) {
        if let Some(lm) = self.lm.take() {
            self.pool.borrow_mut().push(lm);
        }
    }
}

impl CausalLm for PooledDraft<'_> {
    fn vocab_size(&self) -> usize {
        self.lm().vocab_size()
    }
    fn context_size(&self) -> usize {
        self.lm().context_size()
    }
    fn committed_len(&self) -> usize {
        self.lm().committed_len()
    }
    fn pending_len(&self) -> usize {
        self.lm().pending_len()
    }
    fn prefill(&mut self, tokens: &[TokenId]) -> treespec_engine::Result<()> {
        self.lm_mut().prefill(tokens)
    }
    fn forward(&mut self, batch: &TreeBatch) -> treespec_engine::Result<Logits<'_>> {
        self.lm_mut().forward(batch)
    }
    fn commit(&mut self, path: &[usize]) -> treespec_engine::Result<()> {
        self.lm_mut().commit(path)
    }
    fn truncate(&mut self, len: usize) -> treespec_engine::Result<()> {
        self.lm_mut().truncate(len)
    }
}

/// The target's lanes, the draft pool and what requests are resolved with.
pub struct LlamaLanes<'m> {
    runtime: &'m ModelRuntime,
    lm: LlamaBatchLm<'m>,
    bytes: ModelBytes<'m>,
    drafts: DraftPool<'m>,
    methods: Arc<ServerMethods>,
    vocab: Arc<OnceLock<Vocabulary>>,
}

impl<'m> LlamaLanes<'m> {
    /// A batched context of `ctx_size` cells in `parallel` lanes; checks that the default method
    /// builds (a request without a `treespec` object uses it).
    pub fn new(
        runtime: &'m ModelRuntime,
        methods: Arc<ServerMethods>,
        ctx_size: usize,
        parallel: usize,
    ) -> anyhow::Result<Self> {
        let lm = runtime.target().new_batch_lm(ctx_size, parallel)?;
        let mut lanes = Self {
            runtime,
            lm,
            bytes: runtime.token_bytes(),
            drafts: Rc::new(RefCell::new(Vec::new())),
            methods,
            vocab: Arc::new(OnceLock::new()),
        };
        let default = lanes.methods.default_method().clone();
        // When the default method runs the draft model, every lane will want a draft context:
        // make them now, so memory is taken at start (and a shortage shows there), not under load.
        if let Some(draft) = runtime.draft().filter(|_| default.uses_draft()) {
            let made = (0..parallel).map(|_| draft.new_lm()).collect::<treespec_engine::Result<Vec<_>>>()?;
            lanes.drafts.borrow_mut().extend(made);
        }
        lanes
            .drafter(&default)
            .map_err(|e| anyhow::anyhow!(e.message))
            .with_context(|| format!("the server's default method '{}' is invalid", default.name()))?;
        Ok(lanes)
    }

    /// A drafter for `method`, on a pooled draft context when the method runs the draft model.
    fn drafter(&mut self, method: &Method) -> Result<Box<dyn treespec_engine::Drafter + 'm>, ApiError> {
        let invalid = |e: treespec_engine::EngineError| ApiError::invalid("treespec", e.to_string());
        let Some(draft) = self.runtime.draft().filter(|_| method.uses_draft()) else {
            return method.build::<LlamaLm>(None).map_err(invalid);
        };
        let lm = match self.drafts.borrow_mut().pop() {
            Some(lm) => lm,
            None => draft.new_lm().map_err(|e| ApiError::internal(format!("draft context: {e}")))?,
        };
        method.build(Some(PooledDraft { lm: Some(lm), pool: self.drafts.clone() })).map_err(invalid)
    }
}

impl<'m> LaneModels<'m> for LlamaLanes<'m> {
    fn lm(&mut self) -> &mut dyn BatchedLm {
        &mut self.lm
    }

    fn prepare(&mut self, spec: &JobSpec) -> Result<Prepared<'m>, ApiError> {
        let prompt = prompt_tokens(self.runtime, &spec.prompt, spec.tools.as_ref())?;
        let constraint = constraint(self.runtime, &self.vocab, spec)?;
        let method = self.methods.for_request(spec.method.as_ref())?;
        let drafter = self.drafter(&method)?;
        Ok(Prepared {
            prompt,
            eos: self.runtime.eos_tokens().to_vec(),
            method: method.name().to_string(),
            drafter,
            constraint: constraint.map(|c| Box::new(c) as Box<dyn TokenConstraint + 'm>),
        })
    }

    fn bytes(&self) -> &dyn TokenBytes {
        &self.bytes
    }

    fn split(&mut self) -> (&mut dyn BatchedLm, &dyn TokenBytes) {
        (&mut self.lm, &self.bytes)
    }
}

impl BatchPool {
    /// Start the batching scheduler on the loaded models: `ctx_size` KV cells shared by up to
    /// `scheduler.parallel` requests at once. Loads nothing: the runtime's weights are shared.
    pub fn llama(
        config: LlamaConfig,
        scheduler: SchedulerConfig,
        ctx_size: usize,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let LlamaConfig { runtime, method } = config;
        if method.needs_draft() && !runtime.has_draft() {
            anyhow::bail!("method '{}' needs a draft model (--md DRAFT.gguf)", method.name());
        }
        runtime.chat_template().context("compiling the model's chat template")?;
        let limits = Limits { context: ctx_size, has_draft: runtime.has_draft(), ..Limits::default() };
        let (pool, inbox) = BatchPool::new(scheduler, model_id(&runtime.paths().model), limits);
        let methods = Arc::new(ServerMethods::new(method, runtime.clone()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new().name("treespec-scheduler".into()).spawn(
            move || match LlamaLanes::new(&runtime, methods, ctx_size, scheduler.parallel) {
                Ok(lanes) => {
                    let _ = ready_tx.send(Ok(()));
                    Scheduler::new(lanes, scheduler, metrics).run(inbox);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            },
        )?;
        ready_rx.recv().context("the scheduler thread died while starting")??;
        Ok(pool)
    }
}
