//! The FIFO worker pool, the fallback backend (`--scheduler fifo`): worker OS threads (one by
//! default) that each own a model stack and pull jobs from one bounded FIFO channel, one request
//! at a time. Each job's events go back over a tokio channel, and a dropped receiver (the client
//! went away) cancels the generation at its next step. [`Worker`] is what a thread runs per job:
//! the toy worker (`toy.rs`, for tests) or the llama.cpp worker (`llama_worker.rs`). The default
//! backend, the batch scheduler, sits beside this one in `scheduler.rs`; they share only the job
//! types of `job.rs`.

use std::sync::Arc;

use treespec_engine::measure::serving_gate;
use treespec_engine::{
    generate_constrained, CausalLm, Drafter, GenerateRequest, TokenBytes, TokenConstraint,
};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::request::validate::{JobSpec, Limits};
use crate::scheduling::job::ModelText;
use crate::scheduling::job::{engine_error, finished, Event, GenerationBackend, Job, RunError, RunSummary};
use crate::scheduling::queue::JobQueue;
use crate::tenant::Tenant;

/// One model stack on one thread: runs a job, reporting through `emit` (false = stop, the
/// client is gone).
pub trait Worker {
    /// Run `spec` for `tenant`. Returns what the metrics record, or an error (Cancelled
    /// included).
    fn run(
        &mut self,
        spec: &JobSpec,
        tenant: Tenant,
        emit: &mut dyn FnMut(Event) -> bool,
    ) -> Result<RunSummary, RunError>;
}

/// The workers' end of the queue, shared by them (FIFO).
#[derive(Clone)]
pub struct WorkerQueue {
    queue: Arc<JobQueue>,
    metrics: Arc<Metrics>,
}

impl WorkerQueue {
    /// Serve jobs with `worker` until the pool is dropped.
    pub fn serve(&self, worker: &mut dyn Worker) {
        while let Some(job) = self.queue.take() {
            let tenant = job.tenant;
            if job.events.is_closed() {
                self.metrics.cancelled(tenant, "queued");
                continue;
            }
            if let Some(e) = refused(&job.spec) {
                self.metrics.error(Some(tenant), "request");
                let _ = job.events.send(Event::Error(e));
                continue;
            }
            self.metrics.in_flight(tenant, 1);
            let serving = serving_gate::Serving::begin();
            let events = job.events.clone();
            // The `Done` event waits until the metrics hold the run (as the batch scheduler
            // does): a client that reads `/metrics` after its answer finds its request there.
            let mut done = None;
            let result = {
                let mut emit = |e: Event| match e {
                    Event::Done(f) => {
                        done = Some(f);
                        true
                    }
                    e => events.send(e).is_ok(),
                };
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    worker.run(&job.spec, job.tenant, &mut emit)
                }))
            };
            self.metrics.in_flight(tenant, -1);
            drop(serving);
            match result {
                Ok(Ok(run)) => {
                    self.metrics.generation(tenant, &run.method, (run.prompt_tokens, 0), &run.stats);
                    if let Some(f) = done {
                        let _ = job.events.send(Event::Done(f));
                    }
                }
                Ok(Err(RunError::Cancelled(method))) => self.metrics.cancelled(tenant, &method),
                Ok(Err(RunError::Api(e))) => {
                    let kind = if e.status.is_server_error() { "engine" } else { "request" };
                    self.metrics.error(Some(tenant), kind);
                    let _ = job.events.send(Event::Error(e));
                }
                Err(_) => {
                    self.metrics.error(Some(tenant), "panic");
                    let _ = job.events.send(Event::Error(ApiError::internal("the generation panicked")));
                }
            }
        }
    }
}

/// Worker threads fed by one bounded FIFO queue (dropping the pool lets them finish what waits
/// and stop).
pub struct EnginePool {
    queue: Arc<JobQueue>,
    model_id: String,
    /// Where the models run (see [`GenerationBackend::device`]).
    device: String,
    limits: Limits,
    text: Arc<dyn ModelText>,
    workers: usize,
}

impl EnginePool {
    /// A pool whose queue holds at most `queue` waiting jobs for `workers` workers on the model
    /// `text` tokenizes; returns the workers' end for the worker threads to
    /// [`WorkerQueue::serve`].
    pub fn new(
        queue: usize,
        model_id: String,
        limits: Limits,
        text: Arc<dyn ModelText>,
        workers: usize,
        metrics: Arc<Metrics>,
    ) -> (Self, WorkerQueue) {
        let queue = JobQueue::new(queue, metrics.clone());
        let q = WorkerQueue { queue: queue.clone(), metrics };
        (Self { queue, model_id, device: "CPU".to_string(), limits, text, workers }, q)
    }

    /// Models that run on `device` (in words).
    pub fn with_device(mut self, device: String) -> Self {
        self.device = device;
        self
    }
}

impl Drop for EnginePool {
    fn drop(&mut self) {
        self.queue.close();
    }
}

impl GenerationBackend for EnginePool {
    fn model_id(&self) -> String {
        self.model_id.clone()
    }
    fn limits(&self) -> Limits {
        self.limits.clone()
    }
    fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.queue.push(job)
    }
    fn queue_depth(&self) -> usize {
        self.queue.len()
    }
    fn queue_depth_of(&self, tenant: Tenant) -> usize {
        self.queue.len_of(tenant)
    }
    fn model_text(&self) -> Arc<dyn ModelText> {
        self.text.clone()
    }
    fn device(&self) -> String {
        self.device.clone()
    }
    fn slots(&self) -> usize {
        self.workers
    }
}

/// Requests the FIFO workers cannot serve, refused before any work.
fn refused(spec: &JobSpec) -> Option<ApiError> {
    spec.logprobs.map(|_| {
        ApiError::invalid(
            "logprobs",
            "logprobs are served by the batch scheduler (`treespec serve --scheduler batch`, the default)",
        )
    })
}

/// How a request's output is constrained.
#[derive(Default)]
pub struct Structure<'c> {
    /// Its grammar state, when it asked for structured output or may call tools (every target
    /// distribution masked; generation ends when it is complete).
    pub constraint: Option<&'c mut dyn TokenConstraint>,
    /// An answer opening with the call fence is one call ([`Event::Started`]).
    pub fenced_calls: bool,
}

/// Run one prepared request on a target/drafter pair, each step's text streamed as the engine
/// releases it. Shared by every worker.
pub fn run_generation(
    target: &mut dyn CausalLm,
    drafter: &mut dyn Drafter,
    method: &str,
    request: GenerateRequest,
    bytes: &dyn TokenBytes,
    structure: Structure<'_>,
    emit: &mut dyn FnMut(Event) -> bool,
) -> Result<RunSummary, RunError> {
    let Structure { constraint, fenced_calls } = structure;
    let prompt_tokens = request.prompt.len();
    if !emit(Event::Started { prompt_tokens, method: method.to_string(), fenced_calls }) {
        return Err(RunError::Cancelled(method.to_string()));
    }
    let result = generate_constrained(target, drafter, &request, constraint, Some(bytes), &mut |step| {
        let chunk = step.text();
        if !chunk.is_empty() && !emit(Event::Text(chunk)) {
            return false;
        }
        // An empty step still checks whether the client is there.
        emit(Event::Text(String::new()))
    });
    let out = result.map_err(|e| match engine_error(e) {
        RunError::Cancelled(_) => RunError::Cancelled(method.to_string()),
        e => e,
    })?;
    if !out.tail.is_empty() && !emit(Event::Text(out.tail.clone())) {
        return Err(RunError::Cancelled(method.to_string()));
    }
    // The target is truncated to nothing and the whole prompt prefilled: no prefix is reused.
    emit(Event::Done(finished(&out, method, prompt_tokens, 0)));
    Ok(RunSummary { method: method.to_string(), prompt_tokens, stats: out.stats })
}
