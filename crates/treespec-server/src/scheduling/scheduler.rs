//! The continuous-batching scheduler: one thread owns a [`BatchedLm`] with up to `parallel`
//! lanes, and every step is ONE forward holding every active request's rows (see
//! `treespec_engine::batched`).
//!
//! Between steps, requests join (admitted from the queue while a lane is free and the context
//! can hold their prompt and `max_tokens`) and leave (finished, failed, or cancelled: a client
//! that went away is noticed at the next step and its lane freed). A long prompt is prefilled in
//! chunks so it does not stall the others. Beyond the queue's bound a request gets a 503 with
//! `Retry-After`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use treespec_core::TokenId;
use treespec_engine::batched::{Batch, LaneStep, StepLimits};
use treespec_engine::measure::serving_gate;
use treespec_engine::BatchedLm;
use treespec_engine::SharedDraft;
use treespec_engine::{Generation, Prepared};
use treespec_engine::{TokenBytes, TokenLogprob};
use treespec_request::PromptModel;

use crate::api::{LogprobEntry, TextSpan, TopLogprob};
use crate::error::ApiError;
use crate::intake::model_text::ServedModel;
use crate::intake::ready::ready_job;
use crate::intake::validate::{CheckedBody, Limits};
use crate::metrics::Metrics;
use crate::scheduling::job::{engine_error, finished, Event, GenerationBackend, Job, RunError, SHUTDOWN};
use crate::scheduling::methods::ServerMethods;
use crate::scheduling::queue::JobQueue;
use crate::tenant::Tenant;

/// A request made ready for a lane (by the one preparation, `request/prepare.rs`, on the
/// adapter's [`LaneModels::prompt_model`]): the prepared request, with what the scheduler
/// reports and scopes it by.
pub struct ForLane<'m> {
    /// What the engine runs: the request (prompt tokens, most new tokens as the lane's context
    /// allows, sampling, seed, stops), its drafter and its grammar state.
    pub prepared: Prepared<'m>,
    /// The method's name (for events and metrics).
    pub method: String,
    /// Its tenant's prefix scope: it reuses cached KV prefixes of its own tenant only.
    pub scope: u64,
}

/// The models behind a scheduler: the batched target, the target as request preparation sees
/// it, and the draft model the requests share. The scheduler prepares each request itself on
/// them; an adapter only supplies them.
pub trait LaneModels<'m> {
    /// The batched target.
    fn lm(&mut self) -> &mut dyn BatchedLm;
    /// The target as request preparation sees it (prompt tokens, end tokens, vocabulary).
    fn prompt_model(&self) -> &dyn PromptModel;
    /// Positions a lane's request may fill (prompt and answer).
    fn context(&self) -> usize;
    /// The draft model the requests share (their draft forwards batch), if any: a request whose
    /// method drafts with it gets a lane of it.
    fn draft(&self) -> Option<&SharedDraft<'m>>;
    /// Token bytes, for text and stop strings.
    fn bytes(&self) -> &dyn TokenBytes;
    /// What a step needs at once: the batched target, the token bytes, and the draft model the
    /// requests share (their draft forwards batch), if any.
    fn split(&mut self) -> (&mut dyn BatchedLm, &dyn TokenBytes, Option<&SharedDraft<'m>>);
}

/// Scheduler knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most requests decoded at once (lanes).
    pub parallel: usize,
    /// Most requests waiting for a lane; beyond it a 503.
    pub queue: usize,
    /// Chunked prefill and tree size limits per step.
    pub limits: StepLimits,
    /// Most new tokens of any request (llama-server's `-n`): the default of a request that sets
    /// none, and a cap on one that asks for more.
    pub n_predict: Option<usize>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self { parallel: 8, queue: 64, limits: StepLimits::default(), n_predict: None }
    }
}

/// Where a pool reads its target's plain decoding rate (tokens a second) from, when known.
pub type PlainRate = Arc<dyn Fn() -> Option<f64> + Send + Sync>;

/// The HTTP layer's handle on a scheduler thread (dropping it lets the scheduler finish what
/// waits and stop).
pub struct BatchPool {
    queue: Arc<JobQueue>,
    model_id: String,
    /// Where the models run (see [`GenerationBackend::device`]).
    device: String,
    limits: Limits,
    plain_rate: Option<PlainRate>,
    model: ServedModel,
    parallel: usize,
    n_predict: Option<usize>,
}

impl BatchPool {
    /// A pool whose scheduler will take jobs from the returned queue (run it with
    /// [`Scheduler`]), on `model`.
    pub fn new(
        config: SchedulerConfig,
        model_id: String,
        limits: Limits,
        model: ServedModel,
        metrics: Arc<Metrics>,
    ) -> (Self, Arc<JobQueue>) {
        let queue = JobQueue::new(config.queue, metrics);
        let parallel = config.parallel;
        let device = "CPU".to_string();
        let n_predict = config.n_predict;
        let pool = Self {
            queue: queue.clone(),
            model_id,
            device,
            limits,
            plain_rate: None,
            model,
            parallel,
            n_predict,
        };
        (pool, queue)
    }

    /// Models that run on `device` (in words).
    pub fn with_device(mut self, device: String) -> Self {
        self.device = device;
        self
    }

    /// The target's plain decoding rate (tokens a second), for traced responses: asked at the end
    /// of each, so a curve measured after the start counts.
    pub fn with_plain_rate(mut self, rate: PlainRate) -> Self {
        self.plain_rate = Some(rate);
        self
    }
}

impl Drop for BatchPool {
    fn drop(&mut self) {
        self.queue.close();
    }
}

impl GenerationBackend for BatchPool {
    fn model_id(&self) -> String {
        self.model_id.clone()
    }
    fn limits(&self) -> Limits {
        self.limits.clone()
    }
    fn submit(&self, mut job: Job) -> Result<(), ApiError> {
        if let Some(cap) = self.n_predict {
            job.spec.max_tokens = Some(job.spec.max_tokens.map_or(cap, |n| n.min(cap)));
        }
        self.queue.push(job)
    }
    fn queue_depth(&self) -> usize {
        self.queue.len()
    }
    fn queue_depth_of(&self, tenant: Tenant) -> usize {
        self.queue.len_of(tenant)
    }
    fn plain_tokens_per_second(&self) -> Option<f64> {
        self.plain_rate.as_ref().and_then(|r| r()).filter(|r| r.is_finite() && *r > 0.0)
    }
    fn model(&self) -> ServedModel {
        self.model.clone()
    }
    fn device(&self) -> String {
        self.device.clone()
    }
    fn slots(&self) -> usize {
        self.parallel
    }
    fn stop(&self) {
        for job in self.queue.stop() {
            let _ = job.events.send(Event::Error(ApiError::draining()));
        }
    }
}

/// What the scheduler keeps beside a request's lane.
struct Served {
    events: tokio::sync::mpsc::UnboundedSender<Event>,
    tenant: Tenant,
    /// Holds a background cost measurement off while the request decodes (released when the
    /// request leaves, or when the scheduler unwinds).
    _serving: serving_gate::Serving,
    method: String,
    prompt_tokens: usize,
    /// Prompt tokens its lane reused from a cached or live prefix (not prefilled).
    cached: usize,
    /// Context the request reserved (prompt + most new tokens).
    reserved: usize,
    /// The client asked how each step's text was produced.
    trace: bool,
}

/// The scheduler loop over `models`.
pub struct Scheduler<'m, M: LaneModels<'m>> {
    models: M,
    /// What resolves each request's method (with its tenant's suffix state).
    methods: Arc<ServerMethods>,
    config: SchedulerConfig,
    metrics: Arc<Metrics>,
    /// Active requests, each in its lane with what it reports to.
    batch: Batch<'m, Served>,
    /// The first waiting job, prepared, when it waits for room.
    ready: Option<Ready<'m>>,
}

/// A prepared job and what it reserves of the shared context.
struct Ready<'m> {
    /// The queued job it was made for (it is dropped if that job left the queue).
    job: u64,
    lane: ForLane<'m>,
    reserve: usize,
}

/// Context a request without `max_tokens` reserves for its answer.
const DEFAULT_RESERVE: usize = 512;

impl<'m, M: LaneModels<'m>> Scheduler<'m, M> {
    /// A scheduler on `models`, each request's method resolved by `methods`.
    pub fn new(
        models: M,
        methods: Arc<ServerMethods>,
        config: SchedulerConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self { models, methods, config, metrics, batch: Batch::new(), ready: None }
    }

    /// Serve until the [`BatchPool`] is dropped and the work is done. Should the scheduler die
    /// (a panic in a step), the queue is closed and every waiting request answered with an
    /// error, so no client waits for a thread that is gone.
    pub fn run(mut self, queue: Arc<JobQueue>) {
        let _closes = CloseOnExit(queue.clone());
        loop {
            // Block only when idle.
            if self.batch.is_empty() && !queue.wait(Duration::from_millis(200)) {
                if queue.is_closed() && queue.is_empty() {
                    return;
                }
                continue;
            }
            // Between steps: requests whose clients left free their places in the queue too.
            queue.prune();
            if queue.is_stopping() {
                self.stop_all();
                continue;
            }
            self.admit(&queue);
            self.drop_cancelled();
            if self.batch.is_empty() {
                continue;
            }
            self.step();
        }
    }

    fn reserved(&self) -> usize {
        self.batch.iter().map(|(_, s)| s.reserved).sum()
    }

    /// Move waiting jobs into free lanes while the context can hold them, oldest first.
    fn admit(&mut self, queue: &JobQueue) {
        while self.batch.len() < self.config.parallel {
            let Some(id) = queue.front_id() else { break };
            // A preparation kept for a job that left the queue no longer matches the front. The
            // request is copied only to prepare it, not every step it waits for room.
            let ready = match self.ready.take().filter(|r| r.job == id) {
                Some(r) => Ok(r),
                None => match queue.front_request(id) {
                    Some((spec, tenant)) => self.make_ready(id, &spec, tenant),
                    None => continue,
                },
            };
            let ready = match ready {
                Ok(r) => r,
                Err(e) => {
                    if let Some(job) = queue.take_front(id) {
                        self.fail(&job.events, job.tenant, e);
                    }
                    continue;
                }
            };
            // The request waits (its preparation kept) while the requests decoding leave too
            // little of the shared context for what it reserves; alone, it always fits.
            if !self.batch.is_empty() && self.reserved() + ready.reserve > self.models.lm().capacity() {
                self.ready = Some(ready);
                break;
            }
            // Still the front: only this thread takes jobs, and a prune keeps the order.
            let Some(job) = queue.take_front(id) else { continue };
            if let Err(e) = self.start(&job, ready) {
                self.fail(&job.events, job.tenant, e);
            }
        }
    }

    /// Make queued job `id` ready for a lane and reckon what it reserves.
    fn make_ready(&mut self, id: u64, spec: &CheckedBody, tenant: Tenant) -> Result<Ready<'m>, RunError> {
        let lane = self.for_lane(spec, tenant)?;
        let request = &lane.prepared.request;
        let (prompt_tokens, max_new) = (request.prompt.len(), request.max_new_tokens);
        // Without max_tokens a request may fill the context, but reserves only a share of it
        // (if the cache runs out, the longest request ends with `length`; see `relieve`).
        let reserve =
            prompt_tokens + if spec.max_tokens.is_some() { max_new } else { max_new.min(DEFAULT_RESERVE) };
        Ok(Ready { job: id, lane, reserve })
    }

    /// `spec` made ready for a lane: its method resolved for `tenant`, a lane of the shared draft
    /// when the method drafts with the model, then the one request preparation (tokens, room in
    /// a lane's context, grammar, drafter).
    fn for_lane(&self, spec: &CheckedBody, tenant: Tenant) -> Result<ForLane<'m>, ApiError> {
        let method = self.methods.for_request(spec.method.as_ref(), tenant)?;
        let lane = match (self.models.draft(), method.uses_draft()) {
            (Some(d), true) => Some(d.lane().map_err(|e| ApiError::internal(format!("draft lane: {e}")))?),
            _ => None,
        };
        let prepared = ready_job(self.models.prompt_model(), spec, &method, self.models.context(), lane)?;
        Ok(ForLane { prepared, method: method.name().to_string(), scope: tenant.scope() })
    }

    fn start(&mut self, job: &Job, ready: Ready<'m>) -> Result<(), RunError> {
        let Ready { lane: ForLane { prepared, method, scope }, reserve, .. } = ready;
        let spec = &job.spec;
        let lm = self.models.lm();
        let context = lm.context_size();
        let prompt_tokens = prepared.request.prompt.len();
        let mut generation =
            Generation::new(prepared.request, context, lm.vocab_size(), Some(self.models.bytes()))
                .map_err(engine_error)?;
        if let Some(top) = spec.logprobs {
            generation = generation.with_logprobs(top);
        }
        let served = Served {
            events: job.events.clone(),
            tenant: job.tenant,
            _serving: serving_gate::Serving::begin(),
            method: method.clone(),
            prompt_tokens,
            cached: 0,
            reserved: reserve,
            trace: job.trace,
        };
        let lm = self.models.lm();
        let cached = self
            .batch
            .join(lm, generation, prepared.drafter, prepared.constraint, scope, served)
            .map_err(engine_error)?;
        let k = self.batch.len() - 1;
        self.batch.data_mut(k).cached = cached;
        let started =
            Event::Started { prompt_tokens, method: method.clone(), fenced_calls: prepared.fenced_calls };
        if job.events.send(started).is_err() {
            // Gone before it began: as if it never joined (its drafter learns nothing).
            self.batch.abandon(lm, k);
            return Err(RunError::Cancelled(method));
        }
        self.metrics.in_flight(job.tenant, 1);
        Ok(())
    }

    fn fail(&self, events: &tokio::sync::mpsc::UnboundedSender<Event>, tenant: Tenant, e: RunError) {
        match e {
            RunError::Cancelled(method) => self.metrics.cancelled(tenant, &method),
            RunError::Api(e) => {
                self.metrics
                    .error(Some(tenant), if e.status.is_server_error() { "engine" } else { "request" });
                let _ = events.send(Event::Error(e));
            }
        }
    }

    /// Free the lanes of clients that went away.
    fn drop_cancelled(&mut self) {
        for k in (0..self.batch.len()).rev() {
            if self.batch.data(k).events.is_closed() {
                self.retire(k, Err(RunError::Cancelled(String::new())));
            }
        }
    }

    /// The server stops now: every request decoding ends with what it has, its final event
    /// saying so ([`SHUTDOWN`]), and learns from it as from any finished request (the history
    /// saved at the stop keeps it).
    fn stop_all(&mut self) {
        self.ready = None;
        for k in (0..self.batch.len()).rev() {
            self.retire_as(k, Ok(()), Some(SHUTDOWN));
        }
    }

    /// End request `k`: free its lane, report it.
    fn retire(&mut self, k: usize, end: Result<(), RunError>) {
        self.retire_as(k, end, None);
    }

    /// End request `k` as [`Scheduler::retire`] does; a finished one reports `reason` as its
    /// finish reason when one is given.
    fn retire_as(&mut self, k: usize, end: Result<(), RunError>, reason: Option<&'static str>) {
        let (s, out) = self.batch.leave(self.models.lm(), k, end.is_ok());
        self.metrics.in_flight(s.tenant, -1);
        // A request that ended well has its output; one that did not, its error.
        if let Some(out) = out {
            if !out.tail.is_empty() && s.events.send(Event::Text(out.tail.clone())).is_err() {
                self.metrics.cancelled(s.tenant, &s.method);
                return;
            }
            self.metrics.generation(s.tenant, &s.method, (s.prompt_tokens, s.cached), &out.stats);
            let mut done = finished(&out, &s.method, s.prompt_tokens, s.cached);
            done.finish_reason = reason.unwrap_or(done.finish_reason);
            let _ = s.events.send(Event::Done(done));
        } else if let Err(e) = end {
            match e {
                RunError::Cancelled(_) => self.metrics.cancelled(s.tenant, &s.method),
                e => self.fail(&s.events, s.tenant, e),
            }
        }
    }

    /// No request could add a row: the shared cache is full (requests without `max_tokens`
    /// outgrew their reservation). The one holding the most context ends as if it reached its
    /// length limit, which frees room for the others.
    fn relieve(&mut self) {
        if let Some(k) = self.batch.longest(self.models.lm()) {
            self.retire(k, Ok(()));
        }
    }

    /// One batched step, then each request's text goes out; finished, failed and abandoned
    /// requests leave.
    fn step(&mut self) {
        let limits = self.config.limits;
        let (lm, bytes, draft) = self.models.split();
        let started = Instant::now();
        let (results, report) = self.batch.step(lm, limits, Some(bytes), draft);
        if let Some(d) = draft {
            self.metrics.draft_forwards(d.counters());
        }
        if report.rows == 0 && results.iter().all(|r| matches!(r, LaneStep::Waiting)) {
            self.relieve();
            return;
        }
        if report.rows > 0 {
            let (step_time, forward_time) = (started.elapsed(), report.forward_time);
            self.metrics.batch_step(report.decoding, report.rows, report.prefilled, step_time, forward_time);
        }
        let lm = self.models.lm();
        let used = self.batch.iter().map(|(lane, _)| lm.committed_len(lane.lane)).sum();
        self.metrics.set_context_figures(used, lm.capacity(), lm.saved_prefix_bytes(), lm.graph_reuses());
        let mut results = results;
        for k in (0..self.batch.len()).rev() {
            match std::mem::replace(&mut results[k], LaneStep::Waiting) {
                LaneStep::Waiting => {}
                LaneStep::Failed(e) => self.retire(k, Err(engine_error(e))),
                LaneStep::Stepped(o) => {
                    if !o.logprobs.is_empty() {
                        let entries = logprob_entries(&o.logprobs, self.models.bytes());
                        // A client gone shows at the next send or step.
                        let _ = self.batch.data(k).events.send(Event::Logprobs(entries));
                    }
                    let s = self.batch.data(k);
                    let chunk = o.text();
                    if s.trace && !chunk.is_empty() {
                        let spans = o.text.into_iter().map(TextSpan::from).collect();
                        let _ = s.events.send(Event::Trace(spans));
                    }
                    let gone = !chunk.is_empty() && s.events.send(Event::Text(chunk)).is_err();
                    if gone {
                        self.retire(k, Err(RunError::Cancelled(String::new())));
                    } else if o.done {
                        self.retire(k, Ok(()));
                    }
                }
            }
        }
    }
}

/// Closes a scheduler's queue when its thread ends, normally or by unwinding: new requests get
/// a 500 at once, waiting ones an error event. (The lanes' own requests see their event senders
/// dropped with the scheduler.)
struct CloseOnExit(Arc<JobQueue>);

impl Drop for CloseOnExit {
    fn drop(&mut self) {
        for job in self.0.close_and_take_all() {
            let _ = job.events.send(Event::Error(ApiError::internal("the model thread stopped")));
        }
    }
}

/// The wire form of a step's log-probabilities.
fn logprob_entries(logprobs: &[TokenLogprob], bytes: &dyn TokenBytes) -> Vec<LogprobEntry> {
    let token = |t: TokenId, logprob: f32| {
        let b = bytes.token_bytes(t);
        TopLogprob { token: String::from_utf8_lossy(&b).into_owned(), logprob, bytes: b }
    };
    logprobs
        .iter()
        .map(|l| LogprobEntry {
            token: token(l.token, l.logprob),
            top_logprobs: l.top.iter().map(|&(t, p)| token(t, p)).collect(),
        })
        .collect()
}
