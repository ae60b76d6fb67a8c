//! The llama.cpp FIFO worker: owns one target context (and one draft context) on its thread,
//! reused by every request (the generation loop starts each request from an empty cache).

use std::sync::Arc;

use anyhow::{Context, Result};
use treespec_engine::{CausalLm, TokenConstraint};
use treespec_llama::{LlamaLm, ModelRuntime};

use crate::adapters::llama_cpp::{check_default_method, model_id, prepare, runs_on, LlamaConfig, LlamaText};
use crate::metrics::Metrics;
use crate::request::validate::{JobSpec, Limits};
use crate::scheduling::fifo::{run_generation, EnginePool, Structure, Worker};
use crate::scheduling::job::{Event, RunError, RunSummary};
use crate::scheduling::methods::ServerMethods;
use crate::tenant::Tenant;

/// One worker's contexts.
pub struct LlamaWorker<'m> {
    runtime: &'m ModelRuntime,
    target: LlamaLm<'m>,
    draft: Option<LlamaLm<'m>>,
    methods: Arc<ServerMethods>,
}

impl<'m> LlamaWorker<'m> {
    /// Make the contexts, and check that the default method builds on them.
    pub fn new(runtime: &'m ModelRuntime, methods: Arc<ServerMethods>) -> Result<Self> {
        let target = runtime.target().new_lm()?;
        let mut draft = runtime.draft().map(|d| d.new_lm()).transpose()?;
        check_default_method(&methods.default_method(), draft.as_mut())?;
        Ok(Self { runtime, target, draft, methods })
    }
}

impl Worker for LlamaWorker<'_> {
    fn run(
        &mut self,
        spec: &JobSpec,
        tenant: Tenant,
        emit: &mut dyn FnMut(Event) -> bool,
    ) -> Result<RunSummary, RunError> {
        let method = self.methods.for_request(spec.method.as_ref(), tenant)?;
        let Self { runtime, target, draft, .. } = self;
        let mut prepared = prepare(runtime, spec, &method, target.context_size(), draft.as_mut())?;
        let bytes = runtime.token_bytes();
        run_generation(
            target,
            prepared.drafter.as_mut(),
            method.name(),
            prepared.request,
            &bytes,
            Structure {
                constraint: prepared.constraint.as_deref_mut().map(|c| c as &mut dyn TokenConstraint),
                fenced_calls: prepared.fenced_calls,
            },
            emit,
        )
    }
}

impl EnginePool {
    /// Start `workers` threads on the loaded models (each with its own contexts) behind a queue of
    /// `queue` waiting jobs. Loads nothing: the runtime's weights are shared.
    pub fn llama(config: LlamaConfig, workers: usize, queue: usize, metrics: Arc<Metrics>) -> Result<Self> {
        config.check()?;
        let LlamaConfig { runtime: models, methods, .. } = config;
        let limits =
            Limits { context: models.options().ctx_size, has_draft: models.has_draft(), ..Limits::default() };
        let id = model_id(&models.paths().model);
        let text = Arc::new(LlamaText(models.clone()));
        let (pool, q) = EnginePool::new(queue, id, limits, text, workers.max(1), metrics);
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
        Ok(pool.with_device(runs_on(&models)))
    }
}
