//! The continuous-batching scheduler: one thread owns a [`BatchedLm`] with up to `parallel`
//! lanes, and every step is ONE forward holding every active request's rows (see
//! `treespec_engine::batched`).
//!
//! Between steps, requests join (admitted from the queue while a lane is free and the context
//! can hold their prompt and `max_tokens`) and leave (finished, failed, or cancelled: a client
//! that went away is noticed at the next step and its lane freed). A long prompt is prefilled in
//! chunks so it does not stall the others. Beyond the queue's bound a request gets a 503 with
//! `Retry-After`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use treespec_core::TokenId;
use treespec_engine::batched::{step, BatchedLm, Lane, LaneStep, StepLimits};
use treespec_engine::SharedDraft;
use treespec_engine::{Drafter, GenerateRequest, Generation, StopConditions};
use treespec_engine::{Provenance, TextStream, TokenBytes, TokenConstraint, TokenLogprob};

use crate::api::{LogprobEntry, TextSpan, TopLogprob};
use crate::engine_thread::{engine_error, finished, Event, GenerationBackend, Job, RunError};
use crate::error::ApiError;
use crate::llama_api::ModelText;
use crate::metrics::Metrics;
use crate::tenant::Tenant;
use crate::validate::{check_lengths, JobSpec, Limits};

/// A request made ready for a lane by [`LaneModels::prepare`].
pub struct Prepared<'m> {
    /// Prompt tokens.
    pub prompt: Vec<TokenId>,
    /// End-of-generation tokens.
    pub eos: Vec<TokenId>,
    /// The method's name (for events and metrics).
    pub method: String,
    /// Its drafter.
    pub drafter: Box<dyn Drafter + 'm>,
    /// Its grammar state, for structured output.
    pub constraint: Option<Box<dyn TokenConstraint + 'm>>,
    /// Its tenant's prefix scope: it reuses cached KV prefixes of its own tenant only.
    pub scope: u64,
}

/// The models behind a scheduler: the batched target and what turns a request into a lane.
pub trait LaneModels<'m> {
    /// The batched target.
    fn lm(&mut self) -> &mut dyn BatchedLm;
    /// Tokenize the prompt, resolve the method for `tenant` and build its drafter (and grammar).
    fn prepare(&mut self, spec: &JobSpec, tenant: Tenant) -> Result<Prepared<'m>, ApiError>;
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
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self { parallel: 8, queue: 64, limits: StepLimits::default() }
    }
}

/// Where a pool reads its target's plain decoding rate (tokens a second) from, when known.
pub type PlainRate = Arc<dyn Fn() -> Option<f64> + Send + Sync>;

/// The HTTP layer's handle on a scheduler thread.
pub struct BatchPool {
    tx: Sender<Job>,
    depth: Arc<AtomicUsize>,
    capacity: usize,
    model_id: String,
    limits: Limits,
    plain_rate: Option<PlainRate>,
    text: Arc<dyn ModelText>,
    parallel: usize,
}

impl BatchPool {
    /// A pool whose scheduler will read from the returned receiver (run it with [`Scheduler`]),
    /// on the model `text` tokenizes.
    pub fn new(
        config: SchedulerConfig,
        model_id: String,
        limits: Limits,
        text: Arc<dyn ModelText>,
    ) -> (Self, Inbox) {
        let (tx, rx) = channel();
        let depth = Arc::new(AtomicUsize::new(0));
        let (capacity, parallel) = (config.queue, config.parallel);
        let pool =
            Self { tx, depth: depth.clone(), capacity, model_id, limits, plain_rate: None, text, parallel };
        (pool, Inbox { rx, depth })
    }

    /// The target's plain decoding rate (tokens a second), for traced responses: asked at the end
    /// of each, so a curve measured after the start counts.
    pub fn with_plain_rate(mut self, rate: PlainRate) -> Self {
        self.plain_rate = Some(rate);
        self
    }
}

/// The scheduler's end of the queue.
pub struct Inbox {
    rx: Receiver<Job>,
    depth: Arc<AtomicUsize>,
}

impl GenerationBackend for BatchPool {
    fn model_id(&self) -> String {
        self.model_id.clone()
    }
    fn limits(&self) -> Limits {
        self.limits.clone()
    }
    fn submit(&self, job: Job) -> Result<(), ApiError> {
        if self.depth.fetch_add(1, Ordering::SeqCst) >= self.capacity {
            self.depth.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::overloaded(self.capacity));
        }
        self.tx.send(job).map_err(|_| {
            self.depth.fetch_sub(1, Ordering::SeqCst);
            ApiError::internal("the model thread has stopped")
        })
    }
    fn queue_depth(&self) -> usize {
        self.depth.load(Ordering::SeqCst)
    }
    fn plain_tokens_per_second(&self) -> Option<f64> {
        self.plain_rate.as_ref().and_then(|r| r()).filter(|r| r.is_finite() && *r > 0.0)
    }
    fn model_text(&self) -> Arc<dyn ModelText> {
        self.text.clone()
    }
    fn slots(&self) -> usize {
        self.parallel
    }
}

/// What the scheduler keeps beside a request's lane.
struct Served {
    events: tokio::sync::mpsc::UnboundedSender<Event>,
    text: TextStream,
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
    config: SchedulerConfig,
    metrics: Arc<Metrics>,
    /// Active requests' lanes, and beside each (same index) what it reports to.
    lanes: Vec<Lane<'m>>,
    served: Vec<Served>,
    waiting: VecDeque<Job>,
    /// The first waiting job, prepared, when it waits for room.
    ready: Option<Ready<'m>>,
}

/// A prepared job and what it reserves of the shared context.
struct Ready<'m> {
    prepared: Prepared<'m>,
    max_new: usize,
    reserve: usize,
}

/// Context a request without `max_tokens` reserves for its answer.
const DEFAULT_RESERVE: usize = 512;

impl<'m, M: LaneModels<'m>> Scheduler<'m, M> {
    /// A scheduler on `models`.
    pub fn new(models: M, config: SchedulerConfig, metrics: Arc<Metrics>) -> Self {
        Self {
            models,
            config,
            metrics,
            lanes: Vec::new(),
            served: Vec::new(),
            waiting: VecDeque::new(),
            ready: None,
        }
    }

    /// Serve until every [`BatchPool`] handle is dropped and the work is done.
    pub fn run(mut self, inbox: Inbox) {
        let mut open = true;
        while open || !self.served.is_empty() || !self.waiting.is_empty() {
            // Take new jobs: block only when idle.
            if self.served.is_empty() && self.waiting.is_empty() {
                match inbox.rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(job) => self.waiting.push_back(job),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => open = false,
                }
            }
            while let Ok(job) = inbox.rx.try_recv() {
                self.waiting.push_back(job);
            }
            self.admit(&inbox.depth);
            self.drop_cancelled();
            if self.served.is_empty() {
                continue;
            }
            self.step();
        }
    }

    fn reserved(&self) -> usize {
        self.served.iter().map(|s| s.reserved).sum()
    }

    /// Move waiting jobs into free lanes while the context can hold them, oldest first.
    fn admit(&mut self, depth: &AtomicUsize) {
        while self.served.len() < self.config.parallel {
            let Some(job) = self.waiting.front() else { break };
            if job.events.is_closed() {
                self.waiting.pop_front();
                // A preparation kept for later is always the front job's: it leaves with it.
                self.ready = None;
                depth.fetch_sub(1, Ordering::SeqCst);
                self.metrics.cancelled("queued");
                continue;
            }
            let ready = match self.ready.take() {
                Some(r) => Ok(r),
                None => {
                    let (spec, tenant) = (job.spec.clone(), job.tenant);
                    self.prepare(&spec, tenant)
                }
            };
            let ready = match ready {
                Ok(r) => r,
                Err(e) => {
                    let job = self.waiting.pop_front().expect("front exists");
                    depth.fetch_sub(1, Ordering::SeqCst);
                    self.fail(&job.events, e);
                    continue;
                }
            };
            // The request waits (its preparation kept) while the requests decoding leave too
            // little of the shared context for what it reserves; alone, it always fits.
            if !self.served.is_empty() && self.reserved() + ready.reserve > self.models.lm().capacity() {
                self.ready = Some(ready);
                break;
            }
            let job = self.waiting.pop_front().expect("front exists");
            depth.fetch_sub(1, Ordering::SeqCst);
            if let Err(e) = self.start(&job, ready) {
                self.fail(&job.events, e);
            }
        }
    }

    /// Tokenize the job, build its drafter and check its lengths.
    fn prepare(&mut self, spec: &JobSpec, tenant: Tenant) -> Result<Ready<'m>, RunError> {
        let prepared = self.models.prepare(spec, tenant)?;
        let context = self.models.lm().context_size();
        let prompt_tokens = prepared.prompt.len();
        let max_new = check_lengths(prompt_tokens, spec.max_tokens, context)?;
        // Without max_tokens a request may fill the context, but reserves only a share of it
        // (if the cache runs out, the longest request ends with `length`; see `relieve`).
        let reserve =
            prompt_tokens + if spec.max_tokens.is_some() { max_new } else { max_new.min(DEFAULT_RESERVE) };
        Ok(Ready { prepared, max_new, reserve })
    }

    fn start(&mut self, job: &Job, ready: Ready<'m>) -> Result<(), RunError> {
        let Ready { prepared, max_new, reserve } = ready;
        let spec = &job.spec;
        let lm = self.models.lm();
        let context = lm.context_size();
        let prompt_tokens = prepared.prompt.len();
        let request = GenerateRequest {
            prompt: prepared.prompt,
            max_new_tokens: max_new,
            sampling: spec.sampling.clone(),
            seed: spec.seed,
            stop: StopConditions { eos: prepared.eos, stop_strings: spec.stop.clone() },
        };
        let mut generation = Generation::new(request, context, lm.vocab_size(), Some(self.models.bytes()))
            .map_err(engine_error)?;
        if let Some(top) = spec.logprobs {
            generation = generation.with_logprobs(top);
        }
        let lm = self.models.lm();
        let (lane, cached) = lm.open(generation.prompt_head(), prepared.scope).map_err(engine_error)?;
        if job.events.send(Event::Started { prompt_tokens, method: prepared.method.clone() }).is_err() {
            lm.close(lane);
            return Err(RunError::Cancelled(prepared.method));
        }
        self.metrics.in_flight(1);
        self.lanes.push(Lane::new(lane, generation, prepared.drafter, prepared.constraint, cached));
        self.served.push(Served {
            events: job.events.clone(),
            text: TextStream::new(&spec.stop),
            method: prepared.method,
            prompt_tokens,
            cached,
            reserved: reserve,
            trace: job.trace,
        });
        Ok(())
    }

    fn fail(&self, events: &tokio::sync::mpsc::UnboundedSender<Event>, e: RunError) {
        match e {
            RunError::Cancelled(method) => self.metrics.cancelled(&method),
            RunError::Api(e) => {
                self.metrics.error(if e.status.is_server_error() { "engine" } else { "request" });
                let _ = events.send(Event::Error(e));
            }
        }
    }

    /// Free the lanes of clients that went away.
    fn drop_cancelled(&mut self) {
        for k in (0..self.served.len()).rev() {
            if self.served[k].events.is_closed() {
                self.retire(k, Err(RunError::Cancelled(String::new())));
            }
        }
    }

    /// End request `k`: free its lane, report it.
    fn retire(&mut self, k: usize, end: Result<(), RunError>) {
        let mut lane = self.lanes.remove(k);
        let mut s = self.served.remove(k);
        self.models.lm().close(lane.lane);
        self.metrics.in_flight(-1);
        match end {
            Ok(()) => {
                let out = lane.generation.finish(lane.drafter.as_mut());
                let rest = s.text.finish();
                if !rest.is_empty() && s.events.send(Event::Text(rest)).is_err() {
                    self.metrics.cancelled(&s.method);
                    return;
                }
                self.metrics.generation(&s.method, s.prompt_tokens, &out.stats);
                let _ =
                    s.events.send(Event::Done(finished(&out, &s.method, s.prompt_tokens, s.cached, &s.text)));
            }
            Err(RunError::Cancelled(_)) => {
                lane.generation.cancel(lane.drafter.as_mut());
                self.metrics.cancelled(&s.method);
            }
            Err(e) => {
                lane.generation.cancel(lane.drafter.as_mut());
                self.fail(&s.events, e);
            }
        }
    }

    /// No request could add a row: the shared cache is full (requests without `max_tokens`
    /// outgrew their reservation). The one holding the most context ends as if it reached its
    /// length limit, which frees room for the others.
    fn relieve(&mut self) {
        let lm = self.models.lm();
        let longest = (0..self.lanes.len()).max_by_key(|&k| lm.committed_len(self.lanes[k].lane));
        if let Some(k) = longest {
            self.retire(k, Ok(()));
        }
    }

    /// One batched step, then each request's text goes out; finished, failed and abandoned
    /// requests leave.
    fn step(&mut self) {
        let limits = self.config.limits;
        let (lm, bytes, draft) = self.models.split();
        let started = Instant::now();
        let (results, report) = step(lm, &mut self.lanes, limits, Some(bytes), draft);
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
        let mut results = results;
        for k in (0..self.lanes.len()).rev() {
            match std::mem::replace(&mut results[k], LaneStep::Waiting) {
                LaneStep::Waiting => {}
                LaneStep::Failed(e) => self.retire(k, Err(engine_error(e))),
                LaneStep::Stepped(o) => {
                    if !o.logprobs.is_empty() {
                        let entries = logprob_entries(&o.logprobs, self.models.bytes());
                        // A client gone shows at the next send or step.
                        let _ = self.served[k].events.send(Event::Logprobs(entries));
                    }
                    let s = &mut self.served[k];
                    let bytes = self.models.bytes();
                    let chunk = if s.trace {
                        let spans = traced_text(&mut s.text, &o.emitted, &o.provenance, bytes);
                        let chunk: String = spans.iter().map(|s| s.text.as_str()).collect();
                        if !chunk.is_empty() {
                            let _ = s.events.send(Event::Trace(spans));
                        }
                        chunk
                    } else {
                        for &t in &o.emitted {
                            s.text.push(&bytes.token_bytes(t));
                        }
                        s.text.take()
                    };
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

/// Push a step's tokens into `text` run by run of one provenance, taking out what each run
/// releases (text held back for a stop string or a split character goes out with a later run, and
/// is credited to it).
fn traced_text(
    text: &mut TextStream,
    tokens: &[TokenId],
    provenance: &[Provenance],
    bytes: &dyn TokenBytes,
) -> Vec<TextSpan> {
    let by_of = |i: usize| provenance.get(i).copied().unwrap_or(Provenance::Target);
    let mut spans: Vec<TextSpan> = Vec::new();
    let (mut i, mut unreleased) = (0, 0);
    while i < tokens.len() {
        let by = by_of(i);
        let end = (i..tokens.len()).find(|&j| by_of(j) != by).unwrap_or(tokens.len());
        for &t in &tokens[i..end] {
            text.push(&bytes.token_bytes(t));
        }
        unreleased += end - i;
        let released = text.take();
        match spans.last_mut() {
            _ if released.is_empty() => {}
            Some(last) if last.by == by => {
                last.text.push_str(&released);
                last.tokens += std::mem::take(&mut unreleased);
            }
            _ => spans.push(TextSpan { by, text: released, tokens: std::mem::take(&mut unreleased) }),
        }
        i = end;
    }
    spans
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
