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
//! the model beyond generation is its `PromptModel` (`intake/model_text.rs`).
//!
//! As llama-server does, these routes read a body as JSON whatever its type: a JSON type, none,
//! or curl's default `application/x-www-form-urlencoded` or `text/plain`, except from browsers
//! (see [`validate::check_llama_content_type`]).

mod translate;
mod wire;

use std::convert::Infallible;

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
use serde_json::Value;
use treespec_core::TokenId;

use crate::api::{ChatCompletionRequest, ChoiceLogprobs, TreespecStats};
use crate::error::ApiError;
use crate::http::gateway;
use crate::http::respond::{respond, to_json, Submitted, Wire};
use crate::http::serve::PeerClosed;
use crate::http::state::{AppState, Arrived};
use crate::intake::model_text::{self};
use crate::intake::validate::{self, check_lengths, PromptInput};
use crate::scheduling::job::Finished;
use crate::tenant::Tenant;

use translate::*;
pub use wire::*;

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
    use crate::intake::validate::Limits;
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
