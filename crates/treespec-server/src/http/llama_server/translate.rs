//! `/completion` onto the OpenAI routes' checks: llama-server's defaults, its refused fields,
//! its prompt forms (text, token ids, both mixed) tokenized as llama-server does, and the
//! settings and answer a request reports.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use serde_json::Value;
use treespec_core::TokenId;

use crate::api::{CompletionRequest, TreespecStats};
use crate::error::ApiError;
use crate::intake::model_text::{self, ServedModel};
use crate::intake::sampling;
use crate::intake::validate::{self, CheckedBody, Limits};
use crate::scheduling::job::{Finished, SHUTDOWN};

use super::wire::*;

/// The seed llama-server shows for "random".
pub(super) const RANDOM_SEED: u64 = u32::MAX as u64;

/// A random seed in llama-server's range (below its "random" marker).
pub(super) fn random_seed() -> u64 {
    RandomState::new().build_hasher().finish() % RANDOM_SEED
}

/// llama-server's fields that would change the result: only their neutral values.
pub(super) fn refuse_unsupported(req: &LlamaCompletionRequest) -> Result<(), ApiError> {
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
pub(super) fn length_field(req: &LlamaCompletionRequest) -> &'static str {
    let set = req.n_predict.as_ref().is_some_and(|v| !v.is_null());
    if !set && req.common.max_tokens.is_some() {
        "max_tokens"
    } else {
        "n_predict"
    }
}

/// An error of the `/v1/completions` checks or of the engine in the request's own names: the
/// length in `length` (see [`length_field`]), the prompt `prompt`.
pub(super) fn llama_names(e: ApiError, length: &'static str) -> ApiError {
    validate::in_request_names(e, "prompt", length)
}

/// A `/completion` request as the `/v1/completions` checks take it: llama-server's defaults
/// and spellings translated. Returns the validated request (its prompt still to be tokenized),
/// `n_predict` as asked (0: tokenize only) and the seed.
pub(super) fn translate(
    req: LlamaCompletionRequest,
    limits: &Limits,
    slots: usize,
) -> Result<(CheckedBody, i64), ApiError> {
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
pub(super) enum PromptPiece {
    Text(String),
    Token(TokenId),
}

/// llama-server's prompt shapes for ONE prompt: a string, token ids, or both mixed (a list of
/// several strings, nested lists and multimodal objects are several prompts or media: refused).
pub(super) fn prompt_pieces(prompt: &Value) -> Result<Vec<PromptPiece>, ApiError> {
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
pub(super) async fn prompt_tokens(
    model: ServedModel,
    pieces: Vec<PromptPiece>,
) -> Result<Vec<TokenId>, ApiError> {
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
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|_| Err(ApiError::internal("the tokenizer panicked")))
}

/// What every answer of one request repeats.
pub(super) struct Answer {
    pub(super) model: String,
    pub(super) settings: GenerationSettings,
    pub(super) n_ctx: usize,
}

impl Answer {
    /// The whole answer (or the last streamed chunk) of a finished generation.
    pub(super) fn full(
        &self,
        content: String,
        f: &Finished,
        stats: Option<TreespecStats>,
    ) -> LlamaCompletion {
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
pub(super) fn settings(spec: &CheckedBody, n_predict: i64, model: &str, n_ctx: usize) -> GenerationSettings {
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
