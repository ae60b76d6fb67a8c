//! What the HTTP layer and the generation backends say to each other: a [`Job`] goes in through
//! a [`GenerationBackend`], its [`Event`]s come out. The batch scheduler (`scheduler.rs`) speaks
//! these types; the HTTP side knows nothing else of it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;
use treespec_core::stats::DecodeStats;
use treespec_engine::{EngineError, GenerateOutput};

use crate::api::Timings;
use crate::error::ApiError;
use crate::intake::model_text::ServedModel;
use crate::intake::validate::{check_lengths, CheckedBody, Limits};
use crate::tenant::Tenant;

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
        /// An answer that opens with a ```` ```json ```` fence is decoded under the call grammar
        /// to its end, so it is one call of a declared tool: a stream may send it as `tool_calls`
        /// pieces from the fence on (`tool_choice: "auto"`) instead of holding it back whole.
        fenced_calls: bool,
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

/// The finish reason of a request the server ended because it stops (its drain deadline passed,
/// or it was told to stop twice): what was decoded so far, then this.
pub const SHUTDOWN: &str = "shutdown";

/// The end of a generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// `stop` (end-of-generation token or stop string), `length`, or [`SHUTDOWN`].
    pub finish_reason: &'static str,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Leading prompt tokens whose KV came from a cached or live prefix (a tenant's earlier
    /// request) instead of being prefilled: OpenAI's `prompt_tokens_details.cached_tokens`,
    /// llama-server's `timings.cache_n`.
    pub cached_tokens: usize,
    /// Generated tokens, the end-of-generation token that ended the answer included: llama-server
    /// and vLLM count it (it took a forward like any other), so usage, `predicted_n` and the
    /// rates built on them compare one to one with theirs.
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
    pub spec: CheckedBody,
    /// Whose request it is (what it teaches the server stays the tenant's).
    pub tenant: Tenant,
    /// Report how each step's text was produced ([`Event::Trace`]): only a client that asked
    /// for it pays for the runs.
    pub trace: bool,
    /// Where its events go.
    pub events: UnboundedSender<Event>,
    /// Set when its client closed the connection while it waited (`routes::first_event`): it
    /// may have only half-closed, so it keeps its place, but it no longer counts toward the
    /// queue's bound (a live request is not refused for it).
    pub peer_left: Arc<AtomicBool>,
}

impl Job {
    /// A job whose client is there.
    pub fn new(spec: CheckedBody, tenant: Tenant, trace: bool, events: UnboundedSender<Event>) -> Self {
        Self { spec, tenant, trace, events, peer_left: Arc::default() }
    }

    /// Whether its client closed the connection while it waited.
    pub fn peer_left(&self) -> bool {
        self.peer_left.load(Ordering::Relaxed)
    }
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
    /// Jobs of `tenant` waiting for a worker (what that tenant may see of the queue).
    fn queue_depth_of(&self, tenant: Tenant) -> usize;
    /// The served model (its tokenizer, chat template and file), for llama-server's
    /// `/tokenize`, `/detokenize`, `/apply-template` and `/props` (llama-server's routes,
    /// `llama_api.rs`; `intake/model_text.rs`).
    fn model(&self) -> ServedModel;
    /// Requests decoded at once (llama-server's slots).
    fn slots(&self) -> usize;
    /// The server stops now: the requests decoding end at their next step with what they have
    /// (finish reason [`SHUTDOWN`]), the waiting ones are refused retryably, new ones fail.
    fn stop(&self);
    /// Where the models run, in words (`CPU`, or a GPU and its layers; `/health`, `/props`).
    fn device(&self) -> String {
        "CPU".to_string()
    }
    /// The plain decoding rate of this server's target (1000 / T(1) on the measured cost curve),
    /// when known.
    fn plain_tokens_per_second(&self) -> Option<f64> {
        None
    }
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

/// The `Done` event of a finished generation, `cached_tokens` of whose prompt were reused from
/// a cached prefix.
pub fn finished(out: &GenerateOutput, method: &str, prompt_tokens: usize, cached_tokens: usize) -> Finished {
    let finish_reason = match out.finish_reason {
        treespec_engine::FinishReason::Length => "length",
        _ => "stop",
    };
    Finished {
        finish_reason,
        prompt_tokens,
        cached_tokens,
        completion_tokens: out.tokens.len() + usize::from(out.end_token),
        method: method.to_string(),
        stats: out.stats.clone(),
        stopping_word: out.stopped_by.clone(),
    }
}

impl Finished {
    /// llama-server's timings from the engine's: prompt time is the prefill, the rest generation;
    /// the prompt tokens served from the prefix cache are `cache_n`, the others `prompt_n`.
    pub fn timings(&self) -> Timings {
        let f = self;
        let prefill = f.stats.times.prefill;
        let rate = |n: usize, ms: f64| {
            (if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 }, if n > 0 { ms / n as f64 } else { 0.0 })
        };
        let prompt_ms = prefill.as_secs_f64() * 1e3;
        let predicted_ms = f.stats.wall.saturating_sub(prefill).as_secs_f64() * 1e3;
        let cache_n = f.cached_tokens.min(f.prompt_tokens);
        let prompt_n = f.prompt_tokens - cache_n;
        let (prompt_per_second, prompt_per_token_ms) = rate(prompt_n, prompt_ms);
        let (predicted_per_second, predicted_per_token_ms) = rate(f.completion_tokens, predicted_ms);
        Timings {
            cache_n,
            prompt_n,
            prompt_ms,
            prompt_per_token_ms,
            prompt_per_second,
            predicted_n: f.completion_tokens,
            predicted_ms,
            predicted_per_token_ms,
            predicted_per_second,
            draft_n: f.stats.drafted,
            draft_n_accepted: f.stats.accepted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use treespec_engine::FinishReason;

    fn output(tokens: usize, finish_reason: FinishReason, end_token: bool) -> GenerateOutput {
        GenerateOutput {
            tokens: vec![7; tokens],
            finish_reason,
            end_token,
            text_cut: None,
            text: String::new(),
            tail: String::new(),
            stopped_by: None,
            stats: DecodeStats::default(),
        }
    }

    /// The end-of-generation token the model generated counts, as llama-server counts it; a
    /// complete grammar (reported as `eos`, no token generated) and a length cut do not add one.
    #[test]
    fn completion_tokens_count_a_generated_end_token() {
        let count = |o: &GenerateOutput| finished(o, "plain", 10, 0).completion_tokens;
        assert_eq!(count(&output(5, FinishReason::Eos, true)), 6);
        assert_eq!(count(&output(5, FinishReason::Eos, false)), 5);
        assert_eq!(count(&output(5, FinishReason::Length, false)), 5);
        let done = finished(&output(5, FinishReason::Eos, true), "plain", 10, 0);
        assert_eq!(done.timings().predicted_n, 6);
    }
}
