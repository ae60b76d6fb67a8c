//! The batching scheduler on toy models (no files, deterministic): the toy batched target has
//! one toy sequence per lane, and the requests draft on lanes of one shared toy draft (their
//! draft forwards batched, as on llama.cpp). For tests — above all the
//! χ² test that a request's samples keep the target distribution while other requests share
//! its steps.

use std::sync::Arc;

use treespec_engine::toy::{ToyBatchLm, ToyDraftLanes, ToyModel};
use treespec_engine::{BatchedLm, SharedDraft, TokenBytes};
use treespec_request::{PromptModel, ToyPromptModel};

use crate::adapters::toy::{toy_methods, ToyConfig};
use crate::intake::validate::Limits;
use crate::metrics::Metrics;
use crate::scheduling::scheduler::{BatchPool, LaneModels, Scheduler, SchedulerConfig};

/// Toy target lanes and toy drafts.
pub struct ToyLanes {
    lm: ToyBatchLm,
    draft: SharedDraft<'static>,
    model: ToyPromptModel,
    config: ToyConfig,
}

impl ToyLanes {
    /// The toy target (and a noisy draft) of `config`, in `parallel` lanes.
    pub fn new(config: ToyConfig, parallel: usize) -> Self {
        let m = ToyModel::new(config.vocab.min(26), 1, 7);
        let draft = m.draft(0.5, 3);
        let draft = SharedDraft::new(ToyDraftLanes::new(draft, config.context, parallel + 1));
        let mut lm = ToyBatchLm::new(m, config.context, parallel);
        if let Some(cells) = config.shared_cells {
            lm = lm.with_capacity(cells);
        }
        if config.prefix_cache {
            lm = lm.with_prefix_cache();
        }
        Self { lm, draft, model: config.prompt_model(), config }
    }
}

impl LaneModels<'static> for ToyLanes {
    fn lm(&mut self) -> &mut dyn BatchedLm {
        &mut self.lm
    }

    fn prompt_model(&self) -> &dyn PromptModel {
        &self.model
    }

    fn context(&self) -> usize {
        self.config.context
    }

    fn draft(&self) -> Option<&SharedDraft<'static>> {
        Some(&self.draft)
    }

    fn bytes(&self) -> &dyn TokenBytes {
        &self.model
    }

    /// Called once per step: the toy's `step_delay` is slept here (to test queueing and
    /// cancellation against a slow model).
    fn split(&mut self) -> (&mut dyn BatchedLm, &dyn TokenBytes, Option<&SharedDraft<'static>>) {
        if !self.config.step_delay.is_zero() {
            std::thread::sleep(self.config.step_delay);
        }
        (&mut self.lm, &self.model, Some(&self.draft))
    }
}

impl BatchPool {
    /// A batching scheduler on toy models, for tests and demos.
    pub fn toy(config: ToyConfig, scheduler: SchedulerConfig, metrics: Arc<Metrics>) -> Self {
        let limits = Limits { context: config.context, has_draft: true, ..Limits::default() };
        let model = Arc::new(config.prompt_model());
        let (pool, inbox) = BatchPool::new(scheduler, "toy".into(), limits, model, metrics.clone());
        let methods = toy_methods(config.method.clone(), config.histories.clone());
        let models = ToyLanes::new(config, scheduler.parallel);
        std::thread::spawn(move || Scheduler::new(models, methods, scheduler, metrics).run(inbox));
        pool
    }
}
