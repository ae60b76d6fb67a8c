//! The batching scheduler on llama.cpp: the target's lanes share one context
//! ([`LlamaBatchLm`]); the requests whose method runs the draft model draft on lanes of one
//! shared draft context ([`LlamaDraftLanes`] behind a [`SharedDraft`]), so their draft forwards
//! batch as their target rows do, and draft and target state never mix between requests.

use std::sync::{Arc, OnceLock};

use anyhow::Context;
use treespec_engine::{BatchedLm, SharedDraft, TokenBytes};
use treespec_llama::{LlamaBatchLm, ModelBytes, ModelRuntime};
use treespec_request::PromptModel;

use crate::adapters::llama_cpp::{check_default_method, model_id, runs_on, LlamaConfig};
use crate::intake::validate::Limits;
use crate::metrics::Metrics;
use crate::scheduling::methods::ServerMethods;
use crate::scheduling::scheduler::{BatchPool, LaneModels, Scheduler, SchedulerConfig};

/// Draft cells kept beside the target's context for each lane's pending draft tree.
const DRAFT_TREE_CELLS: usize = 80;

/// The target's lanes and the shared draft, on the runtime requests are prepared on.
pub struct LlamaLanes<'m> {
    runtime: &'m ModelRuntime,
    lm: LlamaBatchLm<'m>,
    bytes: ModelBytes<'m>,
    draft: Option<SharedDraft<'m>>,
}

impl<'m> LlamaLanes<'m> {
    /// A batched context of `ctx_size` cells in `parallel` lanes, and with a draft model one
    /// draft context of as many cells (plus room for the lanes' draft trees); checks that the
    /// default method builds (a request without a `treespec` object uses it). Memory is taken at
    /// start, so a shortage shows there, not under load; finished prefixes kept in host memory
    /// take at most `cache_ram` bytes.
    pub fn new(
        runtime: &'m ModelRuntime,
        methods: &ServerMethods,
        ctx_size: usize,
        parallel: usize,
        cache_ram: usize,
    ) -> anyhow::Result<Self> {
        let mut lm = runtime.target().new_batch_lm(ctx_size, parallel)?;
        lm.set_saved_prefix_bytes(cache_ram);
        // Decided from the curve cached at start: a curve measured in the background later
        // prices this run unpadded (the next start reads it).
        if let Some(buckets) = runtime.shape_padding() {
            lm.pad_shapes(Some(&buckets));
        }
        let draft = match runtime.draft() {
            Some(d) => {
                let cells = ctx_size + parallel * DRAFT_TREE_CELLS;
                let lanes = d.new_draft_lanes(cells, lm.context_size(), parallel + 1)?;
                Some(SharedDraft::new(lanes))
            }
            None => None,
        };
        let default = methods.default_method();
        let lane = match (&draft, default.uses_draft()) {
            (Some(d), true) => Some(d.lane().context("a draft lane")?),
            _ => None,
        };
        check_default_method(&default, lane)?;
        Ok(Self { runtime, lm, bytes: runtime.token_bytes(), draft })
    }
}

impl<'m> LaneModels<'m> for LlamaLanes<'m> {
    fn lm(&mut self) -> &mut dyn BatchedLm {
        &mut self.lm
    }

    fn prompt_model(&self) -> &dyn PromptModel {
        self.runtime
    }

    fn context(&self) -> usize {
        self.lm.context_size()
    }

    fn draft(&self) -> Option<&SharedDraft<'m>> {
        self.draft.as_ref()
    }

    fn bytes(&self) -> &dyn TokenBytes {
        &self.bytes
    }

    fn split(&mut self) -> (&mut dyn BatchedLm, &dyn TokenBytes, Option<&SharedDraft<'m>>) {
        (&mut self.lm, &self.bytes, self.draft.as_ref())
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
        config.check()?;
        let LlamaConfig { runtime, methods, cache_ram, alias } = config;
        let limits = Limits { context: ctx_size, has_draft: runtime.has_draft(), ..Limits::default() };
        let model = alias.unwrap_or_else(|| model_id(&runtime.paths().model));
        let (pool, inbox) = BatchPool::new(scheduler, model, limits, runtime.clone(), metrics.clone());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let runtime_for_rate = runtime.clone();
        let runtime_for_device = runtime.clone();
        std::thread::Builder::new().name("treespec-scheduler".into()).spawn(
            move || match LlamaLanes::new(&runtime, &methods, ctx_size, scheduler.parallel, cache_ram) {
                Ok(lanes) => {
                    let _ = ready_tx.send(Ok(()));
                    Scheduler::new(lanes, methods, scheduler, metrics).run(inbox);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            },
        )?;
        ready_rx.recv().context("the scheduler thread died while starting")??;
        // 1000 / T(1) once the target's curve is known (read once, then kept); never measured
        // here, and never waited for while it is being measured.
        let known = Arc::new(OnceLock::new());
        let rate = move || {
            if let Some(r) = known.get() {
                return Some(*r);
            }
            let curve =
                runtime_for_rate.has_cost_curves(false).then(|| runtime_for_rate.cost_model(false, false));
            let rate = 1000.0 / curve?.ok()?.target.ms(1);
            Some(*known.get_or_init(|| rate))
        };
        Ok(pool.with_plain_rate(Arc::new(rate)).with_device(runs_on(&runtime_for_device)))
    }
}
