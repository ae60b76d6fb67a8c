//! llama-server's own endpoints, so that clients written for llama.cpp's server work unchanged:
//! `POST /completion` (also `/completions`), `POST /tokenize`, `POST /detokenize`,
//! `POST /apply-template`, `GET /props` and `GET /slots`, with llama-server's field names and
//! shapes (its `tools/server/README.md`). Errors are OpenAI error objects, as llama-server's are.
//!
//! `/completion` is translated onto the `/v1/completions` checks ([`validate::completion`]), so
//! sampling, stop strings and limits are validated exactly as there; what differs is
//! llama-server's: its sampling defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05),
//! `n_predict` (-1: until the context is full), a random seed unless one is given, `top_k: 0`
//! for "off", and the prompt, which is tokenized here as llama-server does it (a string, token
//! ids, or both mixed; special-token text parsed, BOS as the tokenizer config says). The answer
//! carries llama-server's fields and treespec's statistics under `treespec`, as the OpenAI routes
//! do; errors name llama-server's fields (`n_predict`, `prompt`). What these routes read off
//! the model beyond generation is its `PromptModel` (`request/model_text.rs`).
//!
//! As llama-server does, these routes read a body as JSON whatever its type: a JSON type, none,
//! or curl's default `application/x-www-form-urlencoded` or `text/plain`, except from browsers
//! (see [`validate::check_llama_content_type`]).

use std::collections::hash_map::RandomState;
use std::convert::Infallible;
use std::hash::{BuildHasher, Hasher};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use futures_util::stream;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use treespec_core::TokenId;
use utoipa::ToSchema;

use crate::api::{
    ChatCompletionRequest, ChoiceLogprobs, CommonParams, CompletionRequest, Timings, TreespecStats,
};
use crate::error::ApiError;
use crate::http::gateway;
use crate::http::respond::{respond, to_json, Submitted, Wire};
use crate::http::serve::PeerClosed;
use crate::http::state::{AppState, Arrived};
use crate::request::model_text::{self, ServedModel};
use crate::request::sampling;
use crate::request::validate::{self, check_lengths, JobSpec, Limits, PromptInput};
use crate::scheduling::job::{Finished, SHUTDOWN};
use crate::tenant::Tenant;

/// The routes (behind the same API keys as `/v1/*`).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/completion", post(completion))
        .route("/completions", post(completion))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/apply-template", post(apply_template))
        .route("/props", get(props))
        .route("/slots", get(slots))
}

// ---------------------------------------------------------------- wire types

/// `POST /completion`: llama-server's native completion. Sampling fields (`temperature`,
/// `top_k`, `top_p`, `min_p`, `repeat_penalty`, `seed`, `stop`, `stream`, `treespec`, …) are
/// those of `/v1/completions`, with llama-server's defaults.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub struct LlamaCompletionRequest {
    /// A string, a list of token ids, or a list mixing strings and ids (one prompt).
    pub prompt: Value,
    /// Most new tokens: -1 (default) until the context is full; 0 only tokenizes the prompt.
    pub n_predict: Option<Value>,
    /// Accepted: a tenant's cached prefixes are always reused.
    pub cache_prompt: Option<Value>,
    /// -1 (any) or a slot below `total_slots`; requests take whichever slot is free.
    pub id_slot: Option<Value>,
    /// Dynamic temperature (only 0).
    pub dynatemp_range: Option<Value>,
    /// Top-n-sigma sampling (only off: -1).
    pub top_n_sigma: Option<Value>,
    /// Raw token ids in the answer (only false).
    pub return_tokens: Option<Value>,
    /// Per-request LoRA adapters (none loaded: only an empty list).
    pub lora: Option<Value>,
    /// Everything else, as in `/v1/completions`.
    #[serde(flatten)]
    pub common: CommonParams,
}

/// The sampling settings a completion ran with (llama-server's `generation_settings`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct GenerationSettings {
    /// The context size.
    pub n_ctx: usize,
    /// The model id.
    pub model: String,
    /// Most new tokens (-1: until the context is full).
    pub n_predict: i64,
    /// The seed used (drawn at random when the request gave none or -1).
    pub seed: u64,
    /// Temperature (0: greedy).
    pub temperature: f32,
    /// Top-k (0: off).
    pub top_k: usize,
    /// Nucleus threshold.
    pub top_p: f32,
    /// Min-p threshold.
    pub min_p: f32,
    /// Repetition penalty (1: off).
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over (-1: all).
    pub repeat_last_n: i64,
    /// Presence penalty.
    pub presence_penalty: f32,
    /// Frequency penalty.
    pub frequency_penalty: f32,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Same as `n_predict`.
    pub max_tokens: i64,
    /// Streamed.
    pub stream: bool,
    /// Always 0 (token probabilities are not served here).
    pub n_probs: u32,
    /// Always false.
    pub ignore_eos: bool,
    /// The treespec method asked for (null: the server's default).
    #[serde(rename = "treespec.method")]
    pub method: Option<String>,
}

/// The answer of `/completion`, and the last chunk of a streamed one (`stop: true`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LlamaCompletion {
    /// Always 0.
    pub index: u32,
    /// The text (empty in the last streamed chunk: the text came before it).
    pub content: String,
    /// True: the completion is over.
    pub stop: bool,
    /// The model id.
    pub model: String,
    /// Tokens generated.
    pub tokens_predicted: usize,
    /// Prompt tokens.
    pub tokens_evaluated: usize,
    /// What it ran with.
    pub generation_settings: GenerationSettings,
    /// The generation reached the end of the context.
    pub truncated: bool,
    /// `eos` (end-of-generation token), `word` (a stop string) or `limit` (`n_predict` or the
    /// context).
    pub stop_type: &'static str,
    /// The stop string that ended it, or "".
    pub stopping_word: String,
    /// Timings.
    pub timings: Timings,
    /// treespec's decoding statistics (absent when nothing was generated: `n_predict: 0`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub treespec: Option<TreespecStats>,
}

/// A streamed chunk of text (`data: {"index": 0, "content": …, "stop": false}`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LlamaChunk {
    /// Always 0.
    pub index: u32,
    /// New text.
    pub content: String,
    /// Always false (the last chunk is a [`LlamaCompletion`]).
    pub stop: bool,
}

/// `POST /tokenize`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub struct TokenizeRequest {
    /// The text.
    pub content: Option<String>,
    /// Add BOS as the tokenizer config says (default false).
    pub add_special: bool,
    /// Read special-token text as the special token (default true).
    pub parse_special: bool,
    /// Answer `{"id", "piece"}` objects instead of ids (default false).
    pub with_pieces: bool,
}

impl Default for TokenizeRequest {
    fn default() -> Self {
        Self { content: None, add_special: false, parse_special: true, with_pieces: false }
    }
}

/// A token's piece: its text, or its bytes when they are not valid UTF-8 on their own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Piece {
    /// Valid UTF-8.
    Text(String),
    /// A partial character.
    Bytes(Vec<u8>),
}

/// One token of a `/tokenize` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum TokenizedToken {
    /// The id (without `with_pieces`).
    Id(TokenId),
    /// The id and its piece (`with_pieces: true`).
    WithPiece {
        /// The id.
        id: TokenId,
        /// Its text or bytes.
        piece: Piece,
    },
}

/// The answer of `/tokenize`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Tokenized {
    /// The tokens.
    pub tokens: Vec<TokenizedToken>,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub struct DetokenizeRequest {
    /// Token ids.
    pub tokens: Vec<Value>,
}

/// The answer of `/detokenize`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Detokenized {
    /// The tokens' pieces, concatenated (special tokens as their text).
    pub content: String,
}

/// The answer of `/apply-template`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AppliedTemplate {
    /// The messages as the chat template renders them, up to where the reply starts.
    pub prompt: String,
}

/// One slot (a request decoded at once) in `/slots` and `/props`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Slot {
    /// Its number.
    pub id: usize,
    /// Always -1 (tasks are not numbered).
    pub id_task: i64,
    /// Context a request may use (every slot shares the server's cells).
    pub n_ctx: usize,
    /// Always true: every request decodes speculatively.
    pub speculative: bool,
    /// Busy: the first `n` slots are, while `n` requests decode (slots are interchangeable).
    pub is_processing: bool,
}

/// `default_generation_settings` of `/props`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DefaultSettings {
    /// A slot's fields.
    #[serde(flatten)]
    pub slot: Slot,
    /// What `/completion` runs with when a request sets nothing (the seed shown is llama-server's
    /// "random", 4294967295).
    pub params: GenerationSettings,
}

/// Modalities the model takes.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Modalities {
    /// Always false.
    pub vision: bool,
    /// Always false.
    pub audio: bool,
}

/// The answer of `GET /props`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Props {
    /// `/completion`'s defaults.
    pub default_generation_settings: DefaultSettings,
    /// Requests decoded at once (`--parallel`).
    pub total_slots: usize,
    /// The model file.
    pub model_path: String,
    /// The model's chat template ("" without one).
    pub chat_template: String,
    /// Text only.
    pub modalities: Modalities,
    /// `treespec <version>`.
    pub build_info: String,
    /// Where the models run: `CPU`, or a GPU and its layers (treespec's own field).
    pub device: String,
    /// Always false.
    pub is_sleeping: bool,
}

// ---------------------------------------------------------------- /completion

/// The seed llama-server shows for "random".
const RANDOM_SEED: u64 = u32::MAX as u64;

/// A random seed in llama-server's range (below its "random" marker).
fn random_seed() -> u64 {
    RandomState::new().build_hasher().finish() % RANDOM_SEED
}

/// llama-server's fields that would change the result: only their neutral values.
fn refuse_unsupported(req: &LlamaCompletionRequest) -> Result<(), ApiError> {
    let set = |v: &Option<Value>, neutral: &dyn Fn(&Value) -> bool| {
        v.as_ref().is_some_and(|v| !v.is_null() && !neutral(v))
    };
    let checks: [(&'static str, bool, &str); 4] = [
        ("dynatemp_range", set(&req.dynatemp_range, &|v| v.as_f64() == Some(0.0)), "only 0"),
        ("top_n_sigma", set(&req.top_n_sigma, &|v| v.as_f64().is_some_and(|x| x <= 0.0)), "only -1 (off)"),
        ("return_tokens", set(&req.return_tokens, &|v| v == &Value::Bool(false)), "only false"),
        ("lora", set(&req.lora, &|v| v.as_array().is_some_and(Vec::is_empty)), "no adapters are loaded"),
    ];
    match checks.iter().find(|(_, bad, _)| *bad) {
        Some((param, _, why)) => {
            Err(ApiError::invalid(*param, format!("`{param}` is not supported ({why})"))
                .with_code("unsupported_parameter"))
        }
        None => Ok(()),
    }
}

/// The field a request gave its length in: `n_predict`, or `max_tokens` when it set only that.
fn length_field(req: &LlamaCompletionRequest) -> &'static str {
    let set = req.n_predict.as_ref().is_some_and(|v| !v.is_null());
    if !set && req.common.max_tokens.is_some() {
        "max_tokens"
    } else {
        "n_predict"
    }
}

/// An error of the `/v1/completions` checks or of the engine in the request's own names: the
/// length in `length` (see [`length_field`]), the prompt `prompt`.
fn llama_names(e: ApiError, length: &'static str) -> ApiError {
    validate::in_request_names(e, "prompt", length)
}

/// A `/completion` request as the `/v1/completions` checks take it: llama-server's defaults
/// and spellings translated. Returns the validated request (its prompt still to be tokenized),
/// `n_predict` as asked (0: tokenize only) and the seed.
fn translate(req: LlamaCompletionRequest, limits: &Limits, slots: usize) -> Result<(JobSpec, i64), ApiError> {
    refuse_unsupported(&req)?;
    let length = length_field(&req);
    match sampling::integer(&req.id_slot, "id_slot")? {
        None | Some(-1) => {}
        Some(k) if (0..slots as i64).contains(&k) => {}
        Some(k) => return Err(ApiError::invalid("id_slot", format!("no slot {k}: there are {slots}"))),
    }
    if req.cache_prompt.as_ref().is_some_and(|v| !v.is_null() && !v.is_boolean()) {
        return Err(ApiError::invalid("cache_prompt", "`cache_prompt` must be true or false"));
    }
    let mut c = req.common;
    // `n_predict` (or `max_tokens`, which llama-server also reads); any negative: no limit.
    let n_predict = match sampling::integer(&req.n_predict, "n_predict")? {
        Some(n) => n,
        None => c.max_tokens.unwrap_or(-1),
    };
    c.max_tokens = (n_predict > 0).then_some(n_predict);
    c.max_completion_tokens = None;
    c.temperature = c.temperature.or(Some(0.8));
    c.top_p = c.top_p.or(Some(0.95));
    c.min_p = c.min_p.or(Some(Value::from(0.05)));
    c.top_k = match sampling::integer(&c.top_k, "top_k")? {
        None => Some(Value::from(40)),
        // llama-server's 0 (or less): off.
        Some(k) if k <= 0 => None,
        Some(k) => Some(Value::from(k)),
    };
    // Only a seed the client named decides the text (reproducible sampling); a drawn one seeds
    // the streams of the default verifier.
    let named_seed = matches!(c.seed, Some(s) if s >= 0);
    let seed = match c.seed {
        None | Some(-1) => random_seed(),
        Some(s) if s < 0 => {
            return Err(ApiError::invalid("seed", format!("seed must be ≥ 0 or -1, got {s}")))
        }
        Some(s) => s as u64,
    };
    c.seed = Some(seed as i64);
    // The prompt is tokenized by the handler (llama-server's rules); the checks see a stand-in.
    let stand_in = CompletionRequest { prompt: Value::String("prompt".into()), common: c };
    let mut spec = validate::completion(stand_in, limits).map_err(|e| llama_names(e, length))?;
    spec.sampling.reproducible = named_seed;
    Ok((spec, n_predict))
}

/// One piece of a prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PromptPiece {
    Text(String),
    Token(TokenId),
}

/// llama-server's prompt shapes for ONE prompt: a string, token ids, or both mixed (a list of
/// several strings, nested lists and multimodal objects are several prompts or media: refused).
fn prompt_pieces(prompt: &Value) -> Result<Vec<PromptPiece>, ApiError> {
    let bad = |m: &str| ApiError::invalid("prompt", m.to_string());
    let pieces = match prompt {
        Value::String(s) => vec![PromptPiece::Text(s.clone())],
        Value::Array(items) if items.len() > 1 && items.iter().all(Value::is_string) => {
            return Err(bad("only one prompt per request is supported"))
        }
        Value::Array(items) => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(PromptPiece::Text(s.clone())),
                Value::Number(n) => n
                    .as_u64()
                    .and_then(|t| TokenId::try_from(t).ok())
                    .map(PromptPiece::Token)
                    .ok_or_else(|| bad("token ids must be whole numbers ≥ 0")),
                Value::Array(_) => Err(bad("only one prompt per request is supported")),
                _ => Err(bad("`prompt` items must be strings or token ids")),
            })
            .collect::<Result<_, _>>()?,
        Value::Object(_) => return Err(bad("multimodal prompts are not supported")),
        Value::Null => return Err(bad("`prompt` is required")),
        _ => return Err(bad("`prompt` must be a string or a list of token ids")),
    };
    if pieces.iter().all(|p| matches!(p, PromptPiece::Text(t) if t.is_empty())) {
        return Err(bad("`prompt` must not be empty"));
    }
    Ok(pieces)
}

/// Tokenize a prompt as llama-server does: special-token text parsed, BOS (as the tokenizer
/// config says) only when the prompt starts with text; ids checked against the vocabulary.
async fn prompt_tokens(model: ServedModel, pieces: Vec<PromptPiece>) -> Result<Vec<TokenId>, ApiError> {
    blocking(move || {
        let vocab = model.vocab_size();
        let mut tokens = Vec::new();
        for (i, piece) in pieces.iter().enumerate() {
            match piece {
                PromptPiece::Text(s) => tokens.extend(model_text::tokenize(&*model, s, i == 0, true)?),
                PromptPiece::Token(t) if (*t as usize) < vocab => tokens.push(*t),
                PromptPiece::Token(t) => {
                    return Err(ApiError::invalid(
                        "prompt",
                        format!("token {t} is outside the vocabulary of {vocab} tokens"),
                    ))
                }
            }
        }
        Ok(tokens)
    })
    .await
}

/// Run `f` on a blocking thread (tokenizers and templates), its panic a 500.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|_| Err(ApiError::internal("the tokenizer panicked")))
}

/// What every answer of one request repeats.
struct Answer {
    model: String,
    settings: GenerationSettings,
    n_ctx: usize,
}

impl Answer {
    /// The whole answer (or the last streamed chunk) of a finished generation.
    fn full(&self, content: String, f: &Finished, stats: Option<TreespecStats>) -> LlamaCompletion {
        let stop_type = match (&f.stopping_word, f.finish_reason) {
            (_, "length") => "limit",
            // Ended by the server's stop: none of llama-server's reasons, so its own "none".
            (_, SHUTDOWN) => "none",
            (Some(_), _) => "word",
            (None, _) => "eos",
        };
        LlamaCompletion {
            index: 0,
            content,
            stop: true,
            model: self.model.clone(),
            tokens_predicted: f.completion_tokens,
            tokens_evaluated: f.prompt_tokens,
            generation_settings: self.settings.clone(),
            truncated: f.finish_reason == "length" && f.prompt_tokens + f.completion_tokens >= self.n_ctx,
            stop_type,
            stopping_word: f.stopping_word.clone().unwrap_or_default(),
            timings: f.timings(),
            treespec: stats,
        }
    }
}

/// The settings of a validated `/completion` request.
fn settings(spec: &JobSpec, n_predict: i64, model: &str, n_ctx: usize) -> GenerationSettings {
    let p = &spec.sampling;
    let n_predict = n_predict.max(-1);
    GenerationSettings {
        n_ctx,
        model: model.to_string(),
        n_predict,
        seed: spec.seed,
        temperature: p.temperature,
        top_k: p.top_k.unwrap_or(0),
        top_p: p.top_p,
        min_p: p.min_p,
        repeat_penalty: p.repetition_penalty,
        repeat_last_n: i64::try_from(p.penalty_last_n).unwrap_or(-1),
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
        stop: spec.stop.clone(),
        max_tokens: n_predict,
        stream: spec.stream,
        n_probs: 0,
        ignore_eos: false,
        method: spec.method.as_ref().map(|m| m.method.to_string()),
    }
}

/// A JSON request body: llama-server's content types (see
/// [`validate::check_llama_content_type`]), then the OpenAI routes' checks (size, shape).
fn parse_body<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    validate::check_llama_content_type(headers)?;
    validate::parse_json(&validate::read_body(body)?)
}

/// `POST /completion` (and `/completions`).
pub async fn completion(
    State(s): State<AppState>,
    Extension(arrived): Extension<Arrived>,
    Extension(tenant): Extension<Tenant>,
    peer: Option<Extension<PeerClosed>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let mut req: LlamaCompletionRequest = parse_body(&headers, body)?;
    s.sampling.fill(&mut req.common);
    let session = gateway::session_key(None, &headers)?;
    let pieces = prompt_pieces(&req.prompt)?;
    let length = length_field(&req);
    let limits = s.backend.limits();
    let (mut spec, n_predict) = translate(req, &limits, s.backend.slots())?;
    let tokens = prompt_tokens(s.backend.model(), pieces).await?;
    let prompt_n = tokens.len();
    let model = s.backend.model_id();
    let answer =
        Answer { settings: settings(&spec, n_predict, &model, limits.context), model, n_ctx: limits.context };
    if n_predict == 0 {
        // llama-server reads the prompt into the cache; here the prompt is only tokenized.
        check_lengths(prompt_n, None, limits.context).map_err(|e| llama_names(e, length))?;
        let f = Finished {
            finish_reason: "length",
            prompt_tokens: prompt_n,
            cached_tokens: 0,
            completion_tokens: 0,
            method: String::new(),
            stats: Default::default(),
            stopping_word: None,
        };
        let whole = answer.full(String::new(), &f, None);
        if spec.stream {
            let event = SseEvent::default().data(to_json(&whole));
            return Ok(Sse::new(stream::iter([Ok::<_, Infallible>(event)])).into_response());
        }
        return Ok(Json(whole).into_response());
    }
    spec.prompt = PromptInput::Tokens(tokens);
    let job = Submitted { spec, tenant, peer: peer.map(|Extension(p)| p), trace: false, session };
    respond(&s, job, arrived, |_| answer).await.map_err(|e| llama_names(e, length))
}

/// llama-server's wire format on `/completion`: `{"content", "stop": false}` chunks, then the
/// whole answer's fields with `stop: true` (no `[DONE]`: llama-server sends none on this route);
/// an error after the start is an error object in the stream.
impl Wire for Answer {
    fn text(&mut self, text: String) -> Vec<SseEvent> {
        vec![SseEvent::default().data(to_json(&LlamaChunk { index: 0, content: text, stop: false }))]
    }

    fn done(&mut self, f: &Finished) -> Vec<SseEvent> {
        vec![SseEvent::default().data(to_json(&self.full(String::new(), f, Some(TreespecStats::of(f)))))]
    }

    fn error(&mut self, e: &ApiError) -> Vec<SseEvent> {
        vec![SseEvent::default().data(e.body().to_string())]
    }

    fn whole(&self, text: String, _logprobs: Option<ChoiceLogprobs>, f: &Finished) -> String {
        to_json(&self.full(text, f, Some(TreespecStats::of(f))))
    }
}

// ---------------------------------------------------------------- the other endpoints

/// `POST /tokenize`.
pub async fn tokenize(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Tokenized>, ApiError> {
    let req: TokenizeRequest = parse_body(&headers, body)?;
    let content = req.content.ok_or_else(|| ApiError::invalid("content", "`content` is required"))?;
    let model = s.backend.model();
    let tokens = blocking(move || {
        let ids = model_text::tokenize(&*model, &content, req.add_special, req.parse_special)?;
        if !req.with_pieces {
            return Ok(ids.into_iter().map(TokenizedToken::Id).collect());
        }
        ids.into_iter()
            .map(|id| {
                let piece = match String::from_utf8(model_text::piece(&*model, id)?) {
                    Ok(t) => Piece::Text(t),
                    Err(e) => Piece::Bytes(e.into_bytes()),
                };
                Ok(TokenizedToken::WithPiece { id, piece })
            })
            .collect::<Result<Vec<_>, ApiError>>()
    })
    .await?;
    Ok(Json(Tokenized { tokens }))
}

/// `POST /detokenize`.
pub async fn detokenize(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Detokenized>, ApiError> {
    let req: DetokenizeRequest = parse_body(&headers, body)?;
    let ids = req
        .tokens
        .iter()
        .map(|v| v.as_u64().and_then(|t| TokenId::try_from(t).ok()))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| ApiError::invalid("tokens", "`tokens` must be a list of token ids"))?;
    let model = s.backend.model();
    let content = blocking(move || {
        let mut bytes = Vec::new();
        for id in ids {
            bytes.extend(model_text::piece(&*model, id)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    })
    .await?;
    Ok(Json(Detokenized { content }))
}

/// `POST /apply-template`: `messages` (as `/v1/chat/completions` takes them, checked the same
/// way, `tools` included) through the chat template.
pub async fn apply_template(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<AppliedTemplate>, ApiError> {
    let req: ChatCompletionRequest = parse_body(&headers, body)?;
    let spec = validate::chat(req, &s.backend.limits())?;
    let model = s.backend.model();
    let prompt = blocking(move || model_text::apply_template(&*model, &spec)).await?;
    Ok(Json(AppliedTemplate { prompt }))
}

/// The slots: as many as requests decode at once, the first `busy` of them processing.
/// A tenant sees only its own requests as busy slots (others' activity is not its to read).
fn slot_list(s: &AppState, tenant: Tenant) -> Vec<Slot> {
    let n_ctx = s.backend.limits().context;
    let busy = s.metrics.generations_in_flight(s.view_of(tenant));
    (0..s.backend.slots())
        .map(|id| Slot { id, id_task: -1, n_ctx, speculative: true, is_processing: id < busy })
        .collect()
}

/// `GET /slots`.
pub async fn slots(State(s): State<AppState>, Extension(tenant): Extension<Tenant>) -> Json<Vec<Slot>> {
    Json(slot_list(&s, tenant))
}

/// The model's path as `/props` shows it: with keys, a key holder is not the operator, so the
/// file's name only (where the server keeps its files is not theirs to read).
fn shown_path(path: &str, keys: bool) -> String {
    if !keys {
        return path.to_string();
    }
    std::path::Path::new(path).file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// `GET /props`.
pub async fn props(State(s): State<AppState>) -> Result<Json<Props>, ApiError> {
    let limits = s.backend.limits();
    let (defaults, n_predict) =
        translate(LlamaCompletionRequest { prompt: Value::Null, ..Default::default() }, &limits, 1)?;
    let mut params = settings(&defaults, n_predict, &s.backend.model_id(), limits.context);
    params.seed = RANDOM_SEED;
    let slot = Slot { id: 0, id_task: -1, n_ctx: limits.context, speculative: true, is_processing: false };
    let model = s.backend.model();
    Ok(Json(Props {
        default_generation_settings: DefaultSettings { slot, params },
        total_slots: s.backend.slots(),
        model_path: shown_path(&model.model_path(), s.keys.required()),
        chat_template: model.chat_template_source().unwrap_or_default(),
        modalities: Modalities { vision: false, audio: false },
        build_info: format!("treespec {}", env!("CARGO_PKG_VERSION")),
        device: s.backend.device(),
        is_sleeping: false,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(v: Value) -> LlamaCompletionRequest {
        serde_json::from_value(v).unwrap()
    }

    fn limits() -> Limits {
        Limits { context: 128, has_draft: true, max_stop: 4 }
    }

    #[test]
    fn llama_server_defaults_and_spellings() {
        let (spec, n) = translate(req(json!({"prompt": "x"})), &limits(), 2).unwrap();
        let p = &spec.sampling;
        assert_eq!((n, spec.max_tokens), (-1, None));
        assert_eq!((p.temperature, p.top_k, p.top_p, p.min_p), (0.8, Some(40), 0.95, 0.05));
        assert!(spec.seed < RANDOM_SEED);
        assert!(!p.reproducible, "a drawn seed does not switch on reproducible sampling");
        let (spec, n) = translate(
            req(json!({"prompt": "x", "n_predict": 7, "top_k": 0, "temperature": 0, "seed": 5, "stop": ["\n"]})),
            &limits(),
            2,
        )
        .unwrap();
        assert_eq!((n, spec.max_tokens, spec.sampling.top_k, spec.seed), (7, Some(7), None, 5));
        assert!(spec.sampling.reproducible, "a named seed decides the text");
        assert_eq!(spec.stop, vec!["\n"]);
        // `max_tokens` stands in for a missing `n_predict`; `n_predict` wins when both are given.
        assert_eq!(translate(req(json!({"max_tokens": 9})), &limits(), 1).unwrap().0.max_tokens, Some(9));
        let both = json!({"max_tokens": 9, "n_predict": 3});
        assert_eq!(translate(req(both), &limits(), 1).unwrap().0.max_tokens, Some(3));
        assert_eq!(translate(req(json!({"n_predict": 0})), &limits(), 1).unwrap().1, 0);
    }

    #[test]
    fn the_v1_checks_apply() {
        for (body, param) in [
            (json!({"n_predict": 500}), "n_predict"),
            (json!({"n_predict": 1_000_000_000_000i64}), "n_predict"),
            (json!({"n_predict": 1e12}), "n_predict"),
            (json!({"max_tokens": 500}), "max_tokens"),
            (json!({"temperature": 3}), "temperature"),
            (json!({"top_p": -0.5}), "top_p"),
            (json!({"n_probs": 3}), "n_probs"),
            (json!({"id_slot": 2}), "id_slot"),
            (json!({"id_slot": "a"}), "id_slot"),
            (json!({"n_predict": 1.5}), "n_predict"),
            (json!({"seed": -2}), "seed"),
            (json!({"cache_prompt": 3}), "cache_prompt"),
            (json!({"dynatemp_range": 0.5}), "dynatemp_range"),
            (json!({"treespec": {"method": "magic"}}), "treespec"),
        ] {
            let e = translate(req(body.clone()), &limits(), 2).unwrap_err();
            assert!(e.param.as_deref().is_some_and(|p| p.starts_with(param)), "{body}: {e:?}");
        }
        for ok in [json!({"id_slot": -1}), json!({"id_slot": 1, "cache_prompt": true, "dynatemp_range": 0})] {
            translate(req(ok), &limits(), 2).unwrap();
        }
    }

    #[test]
    fn errors_name_the_fields_the_request_sent() {
        // The length: in `n_predict`'s name unless only `max_tokens` was sent.
        for (body, field) in [
            (json!({"n_predict": 1_000_000_000_000i64}), "n_predict"),
            (json!({"n_predict": 1_000_000_000_000i64, "max_tokens": 3}), "n_predict"),
            (json!({"max_tokens": 1_000_000_000_000i64}), "max_tokens"),
        ] {
            let e = translate(req(body.clone()), &limits(), 1).unwrap_err();
            assert_eq!(
                (e.param.as_deref(), e.code),
                (Some(field), Some("context_length_exceeded")),
                "{body}"
            );
            assert!(e.message.starts_with(&format!("{field} = 1000000000000 ")), "{body}: {}", e.message);
        }
        // The engine's length errors (prompt and length against the context).
        let too_long = check_lengths(200, None, 128).unwrap_err();
        assert_eq!(too_long.param.as_deref(), Some("messages"));
        assert_eq!(llama_names(too_long, "n_predict").param.as_deref(), Some("prompt"));
        let too_many = check_lengths(100, Some(50), 128).unwrap_err();
        let e = llama_names(too_many, "n_predict");
        assert_eq!(e.param.as_deref(), Some("n_predict"));
        assert!(
            e.message.contains("plus n_predict (50)") && !e.message.contains("max_tokens"),
            "{}",
            e.message
        );
        let other = ApiError::invalid("temperature", "x");
        assert_eq!(llama_names(other.clone(), "n_predict"), other);
    }

    #[test]
    fn samplers_are_honoured_or_refused() {
        let (spec, _) = translate(req(json!({"samplers": ["top_k", "temperature"]})), &limits(), 1).unwrap();
        let p = &spec.sampling;
        assert_eq!((p.top_k, p.top_p, p.min_p, p.temperature), (Some(40), 1.0, 0.0, 0.8));
        let (spec, _) = translate(req(json!({"samplers": "edskypmxt"})), &limits(), 1).unwrap();
        assert_eq!(spec.sampling, translate(req(json!({})), &limits(), 1).unwrap().0.sampling);
        let e = translate(req(json!({"samplers": ["x"]})), &limits(), 1).unwrap_err();
        assert_eq!((e.param.as_deref(), e.code), (Some("samplers"), Some("unsupported_parameter")));
    }

    #[test]
    fn props_show_a_key_holder_the_model_file_not_where_it_lives() {
        let path = "/srv/models/qwen/Qwen2.5-Coder-1.5B.Q4_K_M.gguf";
        assert_eq!(shown_path(path, false), path, "without keys the operator is the client");
        assert_eq!(shown_path(path, true), "Qwen2.5-Coder-1.5B.Q4_K_M.gguf");
    }

    #[test]
    fn prompt_shapes() {
        use PromptPiece::{Text, Token};
        assert_eq!(prompt_pieces(&json!("ab")).unwrap(), [Text("ab".into())]);
        assert_eq!(prompt_pieces(&json!([1, 2])).unwrap(), [Token(1), Token(2)]);
        assert_eq!(prompt_pieces(&json!([3, "b", 4])).unwrap(), [Token(3), Text("b".into()), Token(4)]);
        assert_eq!(prompt_pieces(&json!(["ab"])).unwrap(), [Text("ab".into())]);
        for bad in [
            json!(""),
            json!([]),
            json!(["a", "b"]),
            json!([[1, 2], [3]]),
            json!([-1]),
            json!([1.5]),
            json!({"prompt_string": "a"}),
            Value::Null,
            json!(7),
        ] {
            assert_eq!(prompt_pieces(&bad).unwrap_err().param.as_deref(), Some("prompt"), "{bad}");
        }
    }
}
