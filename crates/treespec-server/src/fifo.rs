//! The seam between HTTP and the model: "request in, stream of events out".
//!
//! [`GenerationBackend`] is all the HTTP layer sees. [`EnginePool`] implements it with worker OS
//! threads (one by default) that own the models and pull jobs from one bounded FIFO channel;
//! each job's events go back over a tokio channel, and a dropped receiver (the client went away)
//! cancels the generation at its next step. [`Worker`] is what a thread runs per job:
//! [`ToyWorker`] (pure-Rust toy models, for tests) here, the llama.cpp worker in `llama.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use treespec_core::stats::DecodeStats;
use treespec_core::TokenId;
use treespec_engine::toy::{toy_costs, ToyLm, ToyModel};
use treespec_engine::{
    generate_constrained, CausalLm, Drafter, EngineError, GenerateOutput, GenerateRequest, Method,
    StopConditions, TextStream, TokenBytes, TokenConstraint,
};

use treespec_engine::registry::FixedContext;

use crate::error::ApiError;
use crate::llama_api::ModelText;
use crate::methods::ServerMethods;
use crate::metrics::Metrics;
use crate::tenant::Tenant;
use crate::toy_lanes::ToyText;
use crate::validate::{check_lengths, JobSpec, Limits, PromptInput};

/// What a job reports, in order: `Started` or `Error` first; then `Text`…; then `Done` (or
/// `Error`).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The prompt was accepted.
    Started {
        /// Prompt length in tokens.
        prompt_tokens: usize,
        /// The method decoding it.
        method: String,
    },
    /// New text (stop strings already cut away, possible stop-string prefixes held back).
    Text(String),
    /// Log-probabilities of the tokens of one step (only when the request asked for them; sent
    /// before that step's text).
    Logprobs(Vec<crate::api::LogprobEntry>),
    /// How the text of the step's coming `Text` was produced, in runs (batch scheduler only; sent
    /// just before that text).
    Trace(Vec<crate::api::TextSpan>),
    /// Finished.
    Done(Finished),
    /// Failed; nothing more follows.
    Error(ApiError),
}

/// The end of a generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// `stop` (end-of-generation token or stop string) or `length`.
    pub finish_reason: &'static str,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Leading prompt tokens whose KV came from a cached or live prefix (a tenant's earlier
    /// request) instead of being prefilled: OpenAI's `prompt_tokens_details.cached_tokens`,
    /// llama-server's `timings.cache_n`. Always 0 on the FIFO workers, which prefill every prompt
    /// whole.
    pub cached_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// The method.
    pub method: String,
    /// The engine's statistics of the generation (forwards, acceptance, timings).
    pub stats: DecodeStats,
    /// The stop string that ended it, if one did (llama-server's `stopping_word`).
    pub stopping_word: Option<String>,
}

/// What a finished run reports to the metrics.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// The method that decoded it.
    pub method: String,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// The engine's statistics.
    pub stats: DecodeStats,
}

/// One queued request.
#[derive(Debug)]
pub struct Job {
    /// The validated request.
    pub spec: JobSpec,
    /// Whose request it is (what it teaches the server stays the tenant's).
    pub tenant: Tenant,
    /// Report how each step's text was produced ([`Event::Trace`]): only a client that asked
    /// for it pays for the runs.
    pub trace: bool,
    /// Where its events go.
    pub events: UnboundedSender<Event>,
}

/// What the HTTP layer depends on.
pub trait GenerationBackend: Send + Sync + 'static {
    /// The served model's id.
    fn model_id(&self) -> String;
    /// Request limits (context size, whether a draft is loaded).
    fn limits(&self) -> Limits;
    /// Queue a job; a full queue is a 503.
    fn submit(&self, job: Job) -> Result<(), ApiError>;
    /// Jobs waiting for a worker.
    fn queue_depth(&self) -> usize;
    /// The model's tokenizer and chat template, for llama-server's `/tokenize`, `/detokenize`,
    /// `/apply-template` and `/props` (see [`crate::llama_api`]).
    fn model_text(&self) -> Arc<dyn ModelText>;
    /// Requests decoded at once (llama-server's slots).
    fn slots(&self) -> usize;
    /// The plain decoding rate of this server's target (1000 / T(1) on the measured cost curve),
    /// when known.
    fn plain_tokens_per_second(&self) -> Option<f64> {
        None
    }
}

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

/// Why a run ended without finishing.
#[derive(Debug)]
pub enum RunError {
    /// The client disconnected.
    Cancelled(String),
    /// Report this to the client.
    Api(ApiError),
}

impl From<ApiError> for RunError {
    fn from(e: ApiError) -> Self {
        RunError::Api(e)
    }
}

/// The job queue's receiving end, shared by the workers (FIFO).
#[derive(Clone)]
pub struct JobQueue {
    rx: Arc<Mutex<Receiver<Job>>>,
    depth: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
}

impl JobQueue {
    /// Serve jobs with `worker` until the pool is dropped.
    pub fn serve(&self, worker: &mut dyn Worker) {
        loop {
            let job = {
                let rx = self.rx.lock().unwrap_or_else(|p| p.into_inner());
                match rx.recv() {
                    Ok(j) => j,
                    Err(_) => return,
                }
            };
            self.depth.fetch_sub(1, Ordering::SeqCst);
            if job.events.is_closed() {
                self.metrics.cancelled("queued");
                continue;
            }
            self.metrics.in_flight(1);
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
            self.metrics.in_flight(-1);
            match result {
                Ok(Ok(run)) => {
                    self.metrics.generation(&run.method, run.prompt_tokens, &run.stats);
                    if let Some(f) = done {
                        let _ = job.events.send(Event::Done(f));
                    }
                }
                Ok(Err(RunError::Cancelled(method))) => self.metrics.cancelled(&method),
                Ok(Err(RunError::Api(e))) => {
                    self.metrics.error(if e.status.is_server_error() { "engine" } else { "request" });
                    let _ = job.events.send(Event::Error(e));
                }
                Err(_) => {
                    self.metrics.error("panic");
                    let _ = job.events.send(Event::Error(ApiError::internal("the generation panicked")));
                }
            }
        }
    }
}

/// Worker threads fed by one bounded FIFO channel.
pub struct EnginePool {
    tx: SyncSender<Job>,
    depth: Arc<AtomicUsize>,
    capacity: usize,
    model_id: String,
    limits: Limits,
    text: Arc<dyn ModelText>,
    workers: usize,
}

impl EnginePool {
    /// A pool whose queue holds at most `queue` waiting jobs for `workers` workers on the model
    /// `text` tokenizes; returns the receiving end for the worker threads to [`JobQueue::serve`].
    pub fn new(
        queue: usize,
        model_id: String,
        limits: Limits,
        text: Arc<dyn ModelText>,
        workers: usize,
        metrics: Arc<Metrics>,
    ) -> (Self, JobQueue) {
        let (tx, rx) = sync_channel(queue);
        let depth = Arc::new(AtomicUsize::new(0));
        let q = JobQueue { rx: Arc::new(Mutex::new(rx)), depth: depth.clone(), metrics };
        (Self { tx, depth, capacity: queue, model_id, limits, text, workers }, q)
    }

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

impl GenerationBackend for EnginePool {
    fn model_id(&self) -> String {
        self.model_id.clone()
    }
    fn limits(&self) -> Limits {
        self.limits.clone()
    }
    fn submit(&self, job: Job) -> Result<(), ApiError> {
        // Count first so a worker that picks the job up at once never sees the depth below 0.
        self.depth.fetch_add(1, Ordering::SeqCst);
        match self.tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.depth.fetch_sub(1, Ordering::SeqCst);
                Err(ApiError::overloaded(self.capacity))
            }
            Err(TrySendError::Disconnected(_)) => {
                self.depth.fetch_sub(1, Ordering::SeqCst);
                Err(ApiError::internal("the model thread has stopped"))
            }
        }
    }
    fn queue_depth(&self) -> usize {
        self.depth.load(Ordering::SeqCst)
    }
    fn model_text(&self) -> Arc<dyn ModelText> {
        self.text.clone()
    }
    fn slots(&self) -> usize {
        self.workers
    }
}

/// Run one tokenized job on a target/drafter pair, streaming text with stop-string hold-back.
/// Shared by every worker. `constraint`: the request's grammar state, when it asked for
/// structured output (every target distribution masked; generation ends when it is complete).
#[allow(clippy::too_many_arguments)] // the model-side inputs of one job, each distinct
pub fn run_generation(
    target: &mut dyn CausalLm,
    drafter: &mut dyn Drafter,
    method: &str,
    prompt: Vec<TokenId>,
    spec: &JobSpec,
    eos: Vec<TokenId>,
    bytes: &dyn TokenBytes,
    constraint: Option<&mut dyn TokenConstraint>,
    emit: &mut dyn FnMut(Event) -> bool,
) -> Result<RunSummary, RunError> {
    if spec.logprobs.is_some() {
        return Err(ApiError::invalid(
            "logprobs",
            "logprobs are served by the batch scheduler (`treespec serve --scheduler batch`, the default)",
        )
        .into());
    }
    let prompt_tokens = prompt.len();
    let max_new = check_lengths(prompt_tokens, spec.max_tokens, target.context_size())?;
    if !emit(Event::Started { prompt_tokens, method: method.to_string() }) {
        return Err(RunError::Cancelled(method.to_string()));
    }
    let request = GenerateRequest {
        prompt,
        max_new_tokens: max_new,
        sampling: spec.sampling.clone(),
        seed: spec.seed,
        stop: StopConditions { eos, stop_strings: spec.stop.clone() },
    };
    // Text goes out as soon as it is final: whole characters, never the start of a stop string.
    let mut text = TextStream::new(&spec.stop);
    let result = generate_constrained(target, drafter, &request, constraint, Some(bytes), &mut |tokens| {
        for &t in tokens {
            text.push(&bytes.token_bytes(t));
        }
        let chunk = text.take();
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
    let rest = text.finish();
    if !rest.is_empty() && !emit(Event::Text(rest)) {
        return Err(RunError::Cancelled(method.to_string()));
    }
    // The target is truncated to nothing and the whole prompt prefilled: no prefix is reused.
    emit(Event::Done(finished(&out, method, prompt_tokens, 0, &text)));
    Ok(RunSummary { method: method.to_string(), prompt_tokens, stats: out.stats })
}

/// What a failed generation tells the client: its own mistakes are 400s, the rest 500s.
pub fn engine_error(e: EngineError) -> RunError {
    match e {
        EngineError::Cancelled => RunError::Cancelled(String::new()),
        EngineError::InvalidRequest(m) | EngineError::Incompatible(m) => ApiError::invalid(None, m).into(),
        EngineError::PromptTooLong { prompt, context } => check_lengths(prompt, None, context)
            .err()
            .unwrap_or_else(|| ApiError::internal("prompt too long"))
            .into(),
        e => ApiError::internal(format!("generation failed: {e}")).into(),
    }
}

/// The `Done` event of a finished generation whose text went through `text`, `cached_tokens` of
/// whose prompt were reused from a cached prefix.
pub fn finished(
    out: &GenerateOutput,
    method: &str,
    prompt_tokens: usize,
    cached_tokens: usize,
    text: &TextStream,
) -> Finished {
    let finish_reason = match out.finish_reason {
        treespec_engine::FinishReason::Length => "length",
        _ => "stop",
    };
    Finished {
        finish_reason,
        prompt_tokens,
        cached_tokens,
        completion_tokens: out.tokens.len(),
        method: method.to_string(),
        stats: out.stats.clone(),
        stopping_word: text.stopped_by().map(String::from),
    }
}

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
}

impl Default for ToyConfig {
    fn default() -> Self {
        Self {
            vocab: 26,
            context: 256,
            method: Method::Chain { k: 3 },
            step_delay: Duration::ZERO,
            shared_cells: None,
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
}

impl Worker for ToyWorker {
    fn run(
        &mut self,
        spec: &JobSpec,
        tenant: Tenant,
        emit: &mut dyn FnMut(Event) -> bool,
    ) -> Result<RunSummary, RunError> {
        let prompt = Self::prompt(&self.config, spec)?;
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
            prompt,
            spec,
            Vec::new(),
            &Letters,
            None,
            &mut slow_emit,
        )
    }
}
