//! Every request check in one place: body → validated [`CheckedBody`], or an [`ApiError`] (4xx).
//! Nothing here touches a model: the only check that needs the tokenizer (prompt length against
//! the context) is [`check_lengths`], which the engine thread calls after tokenizing.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderMap, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;
use treespec_core::sampling::SamplingParams;
use treespec_engine::MethodSpec;
use treespec_request::{room, PrepareError};

use crate::api::{ChatCompletionRequest, CommonParams, CompletionRequest};
use crate::error::ApiError;
pub use crate::intake::prompt::{Message, PromptInput};
use crate::intake::sampling;
use crate::intake::structured::{self, Output};

/// A completion request's body after every check that needs no model: what a `Job` carries to
/// the scheduler, which makes it ready on the model.
#[derive(Debug, Clone)]
pub struct CheckedBody {
    /// The prompt.
    pub prompt: PromptInput,
    /// Most new tokens (None: fill the context).
    pub max_tokens: Option<usize>,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// Seed.
    pub seed: u64,
    /// Stop strings.
    pub stop: Vec<String>,
    /// The method and its knobs, checked (None: the server's default).
    pub method: Option<MethodSpec>,
    /// Stream the answer.
    pub stream: bool,
    /// Send a usage chunk before `[DONE]`.
    pub include_usage: bool,
    /// Free text, grammar-constrained text or a tool call (see [`crate::intake::structured`]).
    pub output: Output,
    /// Chat `logprobs: true`: report each token's log-probability and this many alternatives
    /// (`top_logprobs`).
    pub logprobs: Option<usize>,
    /// With `tool_choice: "auto"`: the tools, for a chat template that describes tools itself,
    /// else their description as a system note (see [`ToolsPrompt::messages`]).
    pub tools: Option<ToolsPrompt>,
}

/// How the tools of a `tool_choice: "auto"` request reach the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolsPrompt {
    /// The OpenAI `tools` declarations, for a template that reads `tools`.
    pub declared: Value,
    /// Their description for a template that does not.
    pub note: String,
}

impl ToolsPrompt {
    /// `messages` with the note in front, for a template that renders no tools.
    pub fn messages(&self, messages: &[Message]) -> Vec<Message> {
        let mut m = messages.to_vec();
        structured::add_system_note(&mut m, self.note.clone());
        m
    }
}

/// Limits known to the HTTP layer.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The model's context size in tokens.
    pub context: usize,
    /// Whether a draft model is loaded.
    pub has_draft: bool,
    /// Most stop strings.
    pub max_stop: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { context: 4096, has_draft: false, max_stop: 4 }
    }
}

/// The request's `Content-Type` (empty when absent) and its media type, lower case.
fn media_type(headers: &HeaderMap) -> (&str, String) {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    (ct, ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
}

fn is_json(mime: &str) -> bool {
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

fn unsupported_media_type(message: String) -> ApiError {
    ApiError::invalid(None, message)
        .with_status(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        .with_code("unsupported_media_type")
}

/// `Content-Type` must be JSON (the OpenAI routes, `/v1/*`: every OpenAI client sends it).
pub fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let (ct, mime) = media_type(headers);
    if is_json(&mime) {
        Ok(())
    } else {
        Err(unsupported_media_type(format!("expected `Content-Type: application/json`, got `{ct}`")))
    }
}

/// llama-server's routes read every body as JSON whatever its type, and their clients rely on it
/// (`curl -d '{…}'` sends `application/x-www-form-urlencoded`, some clients no type at all). Here
/// a JSON type, no type, `application/x-www-form-urlencoded` or `text/plain` is read as JSON;
/// other types are a 415. From a browser (an `Origin` header, which browsers send with every
/// cross-origin request and every POST) only a JSON type: the other three are what a page on any
/// site may send to this server without a CORS preflight, and this server answers no preflight,
/// so requiring JSON there keeps other sites' pages from making a browser submit requests to it
/// (a keyless server on localhost, for one).
pub fn check_llama_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let (ct, mime) = media_type(headers);
    if is_json(&mime) {
        return Ok(());
    }
    let lenient = matches!(mime.as_str(), "" | "application/x-www-form-urlencoded" | "text/plain");
    if lenient && !headers.contains_key(header::ORIGIN) {
        return Ok(());
    }
    let shown = if ct.is_empty() { "none".to_string() } else { format!("`{ct}`") };
    Err(unsupported_media_type(if lenient {
        format!("a request from a browser page must be sent as `Content-Type: application/json`, got {shown}")
    } else {
        format!("expected a JSON body (`Content-Type: application/json`), got {shown}")
    }))
}

/// The body as bytes, with the size limit's and the connection's errors in OpenAI form.
pub fn read_body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        let status = r.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::invalid(None, "the request body is too large")
                .with_status(status)
                .with_code("body_too_large")
        } else if crate::error::timed_out(&r) {
            ApiError::invalid(None, format!("could not read the request body: {r}"))
                .with_status(StatusCode::REQUEST_TIMEOUT)
                .with_code("body_timeout")
        } else {
            ApiError::invalid(None, format!("could not read the request body: {r}")).with_status(status)
        }
    })
}

/// How many levels of arrays and objects a request body may nest, itself the first: what
/// serde_json's recursion limit (128) lets through.
pub const MAX_BODY_DEPTH: usize = 127;

/// Parse a JSON body into `T`, with an OpenAI-style error for malformed JSON or wrong types.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        // serde_json's own words for its recursion limit (it has no public error code for it).
        if e.to_string().starts_with("recursion limit exceeded") {
            return ApiError::invalid(
                None,
                format!("the request body is nested too deeply (more than {MAX_BODY_DEPTH} levels)"),
            )
            .with_code("nested_too_deeply");
        }
        ApiError::invalid(None, format!("malformed JSON body: {e}")).with_code("invalid_json")
    })?;
    if !value.is_object() {
        return Err(ApiError::invalid(None, "the request body must be a JSON object"));
    }
    // The field a type error is about goes into `param`, as the range checks' errors do: a
    // client's SDK shows it beside the message.
    serde_path_to_error::deserialize(&value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        // Fields of a flattened struct (the parameters both routes share) reach serde without
        // their path: the culprit is then found by reading each top-level field alone.
        let field = if path == "." { culprit::<T>(&value) } else { Some(path) };
        match field {
            None => ApiError::invalid(None, format!("invalid request: {inner}")),
            Some(field) => {
                let mut error = ApiError::invalid(None, format!("invalid request: `{field}`: {inner}"));
                error.param = Some(field);
                error
            }
        }
    })
}

/// The top-level field of `body` that `T` cannot read on its own (a missing field is not one:
/// only the fields present are tried, each alone), if exactly that is what fails.
fn culprit<T: DeserializeOwned>(body: &Value) -> Option<String> {
    let fields = body.as_object()?;
    fields.iter().find_map(|(name, value)| {
        let alone = Value::Object(serde_json::Map::from_iter([(name.clone(), value.clone())]));
        match serde_json::from_value::<T>(alone) {
            Err(e) if !e.to_string().starts_with("missing field") => Some(name.clone()),
            _ => None,
        }
    })
}

/// The sampling parameters `c` asks for, checked as a request's are (the server's defaults are
/// checked with it at start).
pub fn sampling_params(c: &CommonParams) -> Result<treespec_core::sampling::SamplingParams, ApiError> {
    sampling::params(c)
}

/// Validate a chat completion request.
pub fn chat(req: ChatCompletionRequest, limits: &Limits) -> Result<CheckedBody, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::invalid("messages", "`messages` must hold at least one message"));
    }
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            // A tool's result: the template's own `tool` role (Qwen2.5's wraps it in
            // <tool_response>; a template that knows no such role may refuse it: a 400).
            "tool" | "function" => "tool",
            "" => return Err(ApiError::invalid("messages", format!("messages[{i}]: missing `role`"))),
            other => {
                return Err(ApiError::invalid(
                    "messages",
                    format!("messages[{i}]: unknown role '{other}' (system, user, assistant, tool)"),
                ))
            }
        };
        let content = content_text(&m.content).ok_or_else(|| {
            ApiError::invalid(
                "messages",
                format!("messages[{i}]: `content` must be a string or a list of text parts"),
            )
        })?;
        // An assistant's earlier calls, in the fence the model answers a call with (and a call
        // opened so is decoded under the call grammar, in the same layout).
        let content = match m.tool_calls.as_ref().filter(|v| !v.is_null()) {
            Some(calls) if role == "assistant" => {
                let calls = history_calls(calls)
                    .map_err(|e| ApiError::invalid("messages", format!("messages[{i}].tool_calls: {e}")))?;
                [content].into_iter().chain(calls).filter(|c| !c.is_empty()).collect::<Vec<_>>().join("\n")
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    "messages",
                    format!("messages[{i}]: only assistant messages carry tool_calls"),
                ))
            }
            None => content,
        };
        messages.push(Message { role: role.to_string(), content });
    }
    common(PromptInput::Chat(messages), req.common, limits)
}

/// Validate a text completion request.
pub fn completion(req: CompletionRequest, limits: &Limits) -> Result<CheckedBody, ApiError> {
    let prompt = match &req.prompt {
        Value::String(s) => s.clone(),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => a[0].as_str().unwrap_or_default().to_string(),
        Value::Array(a) if a.len() > 1 => {
            return Err(ApiError::invalid("prompt", "only one prompt per request is supported"))
        }
        Value::Null => return Err(ApiError::invalid("prompt", "`prompt` is required")),
        _ => return Err(ApiError::invalid("prompt", "`prompt` must be a string")),
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid("prompt", "`prompt` must not be empty"));
    }
    common(PromptInput::Text(prompt), req.common, limits)
}

/// An assistant message's `tool_calls` as `{"name", "arguments"}` JSON texts in a ```json
/// fence, one per call.
fn history_calls(calls: &Value) -> Result<Vec<String>, String> {
    let list = calls.as_array().ok_or("must be a list")?;
    list.iter()
        .enumerate()
        .map(|(k, c)| {
            let f = c.get("function").ok_or(format!("[{k}] has no `function`"))?;
            let name =
                f.get("name").and_then(Value::as_str).ok_or(format!("[{k}].function has no `name`"))?;
            let arguments = match f.get("arguments") {
                Some(Value::String(a)) => serde_json::from_str::<Value>(a)
                    .map_err(|e| format!("[{k}].function.arguments is not JSON: {e}"))?,
                Some(a @ Value::Object(_)) => a.clone(),
                None | Some(Value::Null) => Value::Object(Default::default()),
                Some(_) => return Err(format!("[{k}].function.arguments must be a JSON object or its text")),
            };
            Ok(treespec_grammar::fenced_call_text(name, &arguments))
        })
        .collect()
}

fn content_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Null => Some(String::new()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                if p.get("type").and_then(Value::as_str) != Some("text") {
                    return None;
                }
                out.push_str(p.get("text")?.as_str()?);
            }
            Some(out)
        }
        _ => None,
    }
}

fn unsupported(v: &Option<Value>, ok: impl Fn(&Value) -> bool) -> bool {
    v.as_ref().is_some_and(|v| !v.is_null() && !ok(v))
}

/// Most `top_logprobs` (as OpenAI).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Chat `logprobs` (a bool) and `top_logprobs` (0..=20, only with `logprobs: true`).
fn logprobs(c: &CommonParams) -> Result<Option<usize>, ApiError> {
    let on = match &c.logprobs {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid("logprobs", "`logprobs` must be true or false")),
    };
    let top = match &c.top_logprobs {
        None | Some(Value::Null) => 0,
        Some(v) => match v.as_u64() {
            Some(n) if n as usize <= MAX_TOP_LOGPROBS => n as usize,
            _ => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    format!("`top_logprobs` must be an integer from 0 to {MAX_TOP_LOGPROBS}"),
                ))
            }
        },
    };
    if top > 0 && !on {
        return Err(ApiError::invalid("top_logprobs", "`top_logprobs` needs `logprobs: true`"));
    }
    Ok(on.then_some(top))
}

fn common(mut prompt: PromptInput, c: CommonParams, limits: &Limits) -> Result<CheckedBody, ApiError> {
    let chat = matches!(prompt, PromptInput::Chat(_));
    refuse_unsupported(&c, chat)?;
    if c.stream_options.is_some() && !c.stream {
        // As OpenAI: the options are about a stream.
        return Err(ApiError::invalid(
            "stream_options",
            "`stream_options` is only allowed with `stream: true`",
        ));
    }
    let logprobs = if chat { logprobs(&c)? } else { None };
    let (output, note) = structured::output(&c, matches!(prompt, PromptInput::Chat(_)))?;
    // A forced call's note always goes in (it names the function to call); an optional call's
    // tools go to the template when it describes tools itself (decided where the model is).
    let mut tools = None;
    match (&mut prompt, note) {
        (PromptInput::Chat(_), Some(note)) if output.auto_tools().is_some() => {
            tools = Some(ToolsPrompt { declared: c.tools.clone().unwrap_or_default(), note })
        }
        (PromptInput::Chat(messages), Some(note)) => structured::add_system_note(messages, note),
        _ => {}
    }
    let max_tokens = max_tokens(&c, limits)?;
    let sampling = sampling::params(&c)?;
    let seed = c.seed.unwrap_or(0) as u64;
    let stop = stop_strings(c.stop, limits)?;
    let method = match c.treespec {
        None | Some(Value::Null) => None,
        Some(v) => method_from_json(v, limits.has_draft)?,
    };
    Ok(CheckedBody {
        prompt,
        max_tokens,
        sampling,
        seed,
        stop,
        method,
        stream: c.stream,
        include_usage: c.stream_options.is_some_and(|o| o.include_usage),
        output,
        logprobs,
        tools,
    })
}

/// Fields that would change the result and are not implemented: a 400 naming the field (their
/// neutral values are accepted, as clients often send them). Chat requests' `logprobs` are
/// supported (see [`logprobs`]); the completions API's integer `logprobs` is not.
fn refuse_unsupported(c: &CommonParams, chat: bool) -> Result<(), ApiError> {
    let checks: [(&'static str, bool, &str); 16] = [
        ("n", unsupported(&c.n, |v| v.as_i64() == Some(1)), "only n = 1 is supported"),
        ("best_of", unsupported(&c.best_of, |v| v.as_i64() == Some(1)), "only best_of = 1 is supported"),
        (
            "logprobs",
            !chat && unsupported(&c.logprobs, |v| v == &Value::Bool(false) || v.as_i64() == Some(0)),
            "logprobs are supported in chat completions only",
        ),
        (
            "top_logprobs",
            !chat && unsupported(&c.top_logprobs, |v| v.as_i64() == Some(0)),
            "top_logprobs are supported in chat completions only",
        ),
        ("functions", unsupported(&c.functions, |_| false), "functions are not supported"),
        (
            "logit_bias",
            unsupported(&c.logit_bias, |v| v.as_object().is_some_and(|o| o.is_empty())),
            "logit_bias is not supported",
        ),
        ("echo", unsupported(&c.echo, |v| v == &Value::Bool(false)), "echo is not supported"),
        ("suffix", unsupported(&c.suffix, |v| v.as_str() == Some("")), "suffix is not supported"),
        (
            "typical_p",
            unsupported(&c.typical_p, |v| v.as_f64() == Some(1.0)),
            "typical_p is not supported (only 1)",
        ),
        (
            "mirostat",
            unsupported(&c.mirostat, |v| v.as_i64() == Some(0)),
            "mirostat is not supported (only 0)",
        ),
        (
            "dry_multiplier",
            unsupported(&c.dry_multiplier, |v| v.as_f64() == Some(0.0)),
            "dry_multiplier is not supported (only 0)",
        ),
        (
            "xtc_probability",
            unsupported(&c.xtc_probability, |v| v.as_f64() == Some(0.0)),
            "xtc_probability is not supported (only 0)",
        ),
        (
            "ignore_eos",
            unsupported(&c.ignore_eos, |v| v == &Value::Bool(false)),
            "ignore_eos is not supported",
        ),
        ("grammar", unsupported(&c.grammar, |v| v.as_str() == Some("")), "grammar is not supported"),
        ("json_schema", unsupported(&c.json_schema, |_| false), "json_schema is not supported"),
        ("n_probs", unsupported(&c.n_probs, |v| v.as_i64() == Some(0)), "n_probs is not supported (only 0)"),
    ];
    match checks.iter().find(|(_, bad, _)| *bad) {
        Some((param, _, msg)) => Err(ApiError::invalid(*param, *msg).with_code("unsupported_parameter")),
        None => Ok(()),
    }
}

/// `max_completion_tokens` (or the older `max_tokens`): ≥ 1 and within the context; an error
/// names the field the request set.
fn max_tokens(c: &CommonParams, limits: &Limits) -> Result<Option<usize>, ApiError> {
    let Some(n) = c.max_completion_tokens.or(c.max_tokens) else { return Ok(None) };
    let field = openai_length_field(c);
    if n <= 0 {
        return Err(ApiError::invalid(field, format!("{field} must be ≥ 1, got {n}")));
    }
    if n as u64 >= limits.context as u64 {
        return Err(ApiError::invalid(
            field,
            format!("{field} = {n} does not fit the context of {} tokens", limits.context),
        )
        .with_code("context_length_exceeded"));
    }
    Ok(Some(n as usize))
}

/// Stop strings: at most `limits.max_stop`, none empty.
fn stop_strings(stop: Option<crate::api::Stop>, limits: &Limits) -> Result<Vec<String>, ApiError> {
    let stop = stop.map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > limits.max_stop {
        return Err(ApiError::invalid("stop", format!("at most {} stop strings", limits.max_stop)));
    }
    if stop.iter().any(|s| s.is_empty()) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty"));
    }
    Ok(stop)
}

/// The method named by a `treespec` extension object, through the engine's registry: the same
/// names and knobs as the CLI's flags, with the same defaults (`dyspec` without a numeric budget
/// is cost-aware here too). None: no method named and no knobs, use the server's default.
pub fn method_from_json(value: Value, has_draft: bool) -> Result<Option<MethodSpec>, ApiError> {
    let bad = |m: String| ApiError::invalid("treespec", m);
    let Some(spec) = MethodSpec::from_json(value).map_err(|e| bad(engine_message(e)))? else {
        return Ok(None);
    };
    if let Some(knob) = spec.knobs.process_wide().first() {
        return Err(bad(format!(
            "`{knob}` is set when the server starts (`treespec serve --{}`), not per request",
            knob.replace('_', "-")
        )));
    }
    if spec.method.needs_draft() && !has_draft {
        return Err(ApiError::invalid(
            "treespec.method",
            format!(
                "method '{}' needs a draft model and the server runs without one (start it with --md)",
                spec.method
            ),
        ));
    }
    spec.validate().map_err(|e| bad(engine_message(e)))?;
    Ok(Some(spec))
}

/// An engine error's message without its "invalid request:" prefix.
fn engine_message(e: treespec_engine::EngineError) -> String {
    match e {
        treespec_engine::EngineError::InvalidRequest(m) => m,
        e => e.to_string(),
    }
}

/// Most new tokens for a prompt of `prompt_tokens` in `context` positions: `max_tokens` when it
/// fits, else the rest of the context (the rules are the runtime's, [`room`]); a prompt that does
/// not fit is a 400 naming the field at fault.
pub fn check_lengths(
    prompt_tokens: usize,
    max_tokens: Option<usize>,
    context: usize,
) -> Result<usize, ApiError> {
    room(prompt_tokens, max_tokens, context).map_err(length_error)
}

/// An error in the names of the fields the client sent: the checks and the engine say
/// `messages` for the prompt and `max_tokens` (or `max_completion_tokens`) for the length; a
/// `/v1/completions` request sent `prompt`, llama-server's `n_predict`, a newer OpenAI client
/// `max_completion_tokens`.
pub fn in_request_names(e: ApiError, prompt: &'static str, length: &'static str) -> ApiError {
    match e.param.as_deref() {
        Some("max_tokens" | "max_completion_tokens") => {
            let message = e.message.replace("max_completion_tokens", length).replace("max_tokens", length);
            ApiError { param: Some(length.into()), message, ..e }
        }
        Some("messages") => ApiError { param: Some(prompt.into()), ..e },
        _ => e,
    }
}

/// The length field an OpenAI request sent: `max_completion_tokens` when it did, else
/// `max_tokens`.
pub fn openai_length_field(c: &crate::api::CommonParams) -> &'static str {
    if c.max_completion_tokens.is_some() {
        "max_completion_tokens"
    } else {
        "max_tokens"
    }
}

/// The 400 of a request whose lengths do not fit its context (`context_length_exceeded` when it
/// is too long); any other preparation error is the server's.
pub fn length_error(e: PrepareError) -> ApiError {
    match e {
        PrepareError::EmptyPrompt => ApiError::invalid("messages", e.to_string()),
        PrepareError::PromptTooLong { .. } => {
            ApiError::invalid("messages", e.to_string()).with_code("context_length_exceeded")
        }
        PrepareError::TooManyTokens { .. } => {
            ApiError::invalid("max_tokens", e.to_string()).with_code("context_length_exceeded")
        }
        e => ApiError::internal(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use serde_json::json;

    fn chat_json(v: Value) -> Result<CheckedBody, ApiError> {
        chat(parse_json(v.to_string().as_bytes())?, &Limits { context: 128, has_draft: true, max_stop: 4 })
    }

    fn msg() -> Value {
        json!([{"role": "user", "content": "hi"}])
    }

    #[test]
    fn a_minimal_chat_request_gets_openai_defaults() {
        let j = chat_json(json!({"model": "x", "messages": msg(), "unknown_field": {"a": 1}})).unwrap();
        assert_eq!(j.prompt, PromptInput::Chat(vec![Message { role: "user".into(), content: "hi".into() }]));
        assert_eq!(j.sampling.temperature, 1.0);
        assert_eq!(j.max_tokens, None);
        assert!(j.method.is_none() && !j.stream && !j.include_usage);
    }

    #[test]
    fn content_parts_and_developer_role() {
        let j = chat_json(json!({"messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
        ]}))
        .unwrap();
        let PromptInput::Chat(m) = j.prompt else { panic!() };
        assert_eq!(m[0].role, "system");
        assert_eq!(m[1].content, "ab");
    }

    #[test]
    fn rejects_bad_messages() {
        assert_eq!(chat_json(json!({"messages": []})).unwrap_err().param.as_deref(), Some("messages"));
        assert_eq!(chat_json(json!({})).unwrap_err().param.as_deref(), Some("messages"));
        let e = chat_json(json!({"messages": [{"role": "wizard", "content": "x"}]})).unwrap_err();
        assert!(e.message.contains("unknown role 'wizard'"), "{}", e.message);
        // A tool round trip: the assistant's call and the tool's result.
        let j = chat_json(json!({"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ]}))
        .unwrap();
        let PromptInput::Chat(m) = &j.prompt else { panic!() };
        assert_eq!(
            m[1].content,
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n```"
        );
        assert_eq!((m[2].role.as_str(), m[2].content.as_str()), ("tool", "sunny"));
        for bad in [
            json!([{"role": "user", "content": "x", "tool_calls": []}]),
            json!([{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": "{}"}}]}]),
            json!([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]),
            json!([{"role": "assistant", "content": "", "tool_calls": {"name": "f"}}]),
        ] {
            assert!(chat_json(json!({"messages": bad})).is_err(), "{bad}");
        }
        assert!(chat_json(json!({"messages": [{"role": "user", "content": 5}]})).is_err());
        assert!(
            chat_json(json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})).is_err()
        );
    }

    #[test]
    fn rejects_bad_sampling_and_lengths() {
        for (field, v) in [
            ("max_tokens", json!(0)),
            ("max_tokens", json!(-3)),
            ("max_tokens", json!(128)),
            ("max_completion_tokens", json!(0)),
            ("temperature", json!(-0.1)),
            ("temperature", json!(2.5)),
            ("top_p", json!(1.5)),
            ("top_p", json!(-1)),
        ] {
            let e = chat_json(json!({"messages": msg(), field: v})).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{field}={v}");
            assert!(e.param.as_deref().unwrap().starts_with(&field[..3]), "{field}: {e:?}");
        }
        // The field the request set is named.
        for field in ["max_tokens", "max_completion_tokens"] {
            let e = chat_json(json!({"messages": msg(), field: 1000})).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field));
            assert!(e.message.starts_with(&format!("{field} = 1000 ")), "{}", e.message);
        }
        let ok =
            chat_json(json!({"messages": msg(), "max_tokens": 127, "temperature": 0, "top_p": 1, "seed": 7}))
                .unwrap();
        assert_eq!((ok.max_tokens, ok.sampling.temperature, ok.seed), (Some(127), 0.0, 7));
        assert!(ok.sampling.reproducible, "a named seed decides the text");
        // What OpenAI clients send for greedy decoding, and llama.cpp's "no top-k".
        let greedy = chat_json(json!({"messages": msg(), "temperature": 0.8, "top_p": 0})).unwrap();
        assert_eq!((greedy.sampling.temperature, greedy.sampling.top_p), (0.0, 1.0));
        let all = chat_json(json!({"messages": msg(), "temperature": 0.8, "top_k": 0})).unwrap();
        assert_eq!((all.sampling.temperature, all.sampling.top_k), (0.8, None));
    }

    #[test]
    fn a_type_error_names_its_field() {
        for (field, v) in [("seed", json!(1.5)), ("prompt_cache_key", json!(5)), ("max_tokens", json!("9"))] {
            let e = chat_json(json!({"messages": msg(), field: v})).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (StatusCode::BAD_REQUEST, Some(field)), "{e:?}");
            assert!(e.message.contains(field) && e.message.contains("invalid type"), "{}", e.message);
        }
        let e = chat_json(json!({"messages": [{"role": "user", "content": 5}]})).unwrap_err();
        assert!(e.param.as_deref().is_some_and(|p| p.starts_with("messages")), "{e:?}");
    }

    #[test]
    fn rejects_unsupported_fields_that_change_results_but_accepts_their_defaults() {
        for (field, bad, good) in [("n", json!(2), json!(1)), ("logit_bias", json!({"5": 10}), json!({}))] {
            let e = chat_json(json!({"messages": msg(), field: bad})).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field));
            assert_eq!(e.code, Some("unsupported_parameter"));
            chat_json(json!({"messages": msg(), field: good})).unwrap();
            chat_json(json!({"messages": msg(), field: null})).unwrap();
        }
    }

    #[test]
    fn chat_logprobs_are_checked() {
        let lp = |extra: Value| {
            let mut v = json!({"messages": msg()});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            chat_json(v)
        };
        assert_eq!(lp(json!({})).unwrap().logprobs, None);
        assert_eq!(lp(json!({"logprobs": false, "top_logprobs": 0})).unwrap().logprobs, None);
        assert_eq!(lp(json!({"logprobs": true})).unwrap().logprobs, Some(0));
        assert_eq!(lp(json!({"logprobs": true, "top_logprobs": 20})).unwrap().logprobs, Some(20));
        for (bad, field) in [
            (json!({"logprobs": "yes"}), "logprobs"),
            (json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
            (json!({"logprobs": true, "top_logprobs": -1}), "top_logprobs"),
            (json!({"top_logprobs": 3}), "top_logprobs"),
        ] {
            let e = lp(bad.clone()).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (StatusCode::BAD_REQUEST, Some(field)), "{bad}");
        }
    }

    #[test]
    fn structured_output_fields() {
        use treespec_grammar::GrammarSpec;
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        let j = chat_json(json!({"messages": msg(), "response_format": {"type": "json_schema",
            "json_schema": {"name": "a", "schema": schema, "strict": true}}}))
        .unwrap();
        assert_eq!(j.output, Output::Constrained(GrammarSpec::JsonSchema(schema)));
        let e =
            chat_json(json!({"messages": msg(), "response_format": {"type": "json_schema"}})).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (StatusCode::BAD_REQUEST, Some("response_format")));
        // A forced call: a grammar, and the tools described in a leading system message.
        let tools =
            json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
        let j = chat_json(json!({"messages": msg(), "tools": tools, "tool_choice": "required"})).unwrap();
        assert!(j.output.is_tool_call());
        let PromptInput::Chat(m) = j.prompt else { panic!() };
        assert!(m[0].role == "system" && m[0].content.contains("\"f\"") && m.len() == 2);
        // auto: free text that may be a call, the tools described the same way; none: plain
        // text, the prompt unchanged.
        let j = chat_json(json!({"messages": msg(), "tools": tools, "tool_choice": "auto"})).unwrap();
        assert_eq!(j.output.auto_tools().map(|t| t[0].name.as_str()), Some("f"));
        let PromptInput::Chat(plain) = &j.prompt else { panic!() };
        assert_eq!(j.prompt, chat_json(json!({"messages": msg()})).unwrap().prompt);
        let t = j.tools.as_ref().unwrap();
        assert_eq!(t.declared, tools);
        let m = t.messages(plain);
        assert!(m[0].role == "system" && m[0].content.contains("\"f\""));
        let j = chat_json(json!({"messages": msg(), "tools": tools, "tool_choice": "none"})).unwrap();
        assert_eq!(
            (j.output, j.prompt),
            (Output::Text, chat_json(json!({"messages": msg()})).unwrap().prompt)
        );
        let e = chat_json(json!({"messages": msg(), "tools": [{"type": "function"}]})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools"));
        // response_format on completions too; tool calls only on chat.
        let l = Limits::default();
        let p = |v: Value| completion(parse_json(v.to_string().as_bytes())?, &l);
        let j = p(json!({"prompt": "a", "response_format": {"type": "json_object"}})).unwrap();
        assert_eq!(j.output, Output::Constrained(GrammarSpec::JsonObject));
        assert!(p(json!({"prompt": "a", "tools": tools, "tool_choice": "required"})).is_err());
    }

    #[test]
    fn stop_strings_and_stream_options() {
        let j = chat_json(json!({"messages": msg(), "stop": "\n", "stream": true, "stream_options": {"include_usage": true}}))
            .unwrap();
        assert_eq!(j.stop, vec!["\n"]);
        assert!(j.stream && j.include_usage);
        // Without `stream: true` (absent or false) the options are refused; null is no options.
        for stream in [json!(false), Value::Null] {
            let mut body = json!({"messages": msg(), "stream_options": {"include_usage": false}});
            if !stream.is_null() {
                body["stream"] = stream;
            }
            let e = chat_json(body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("stream_options"), "{e:?}");
        }
        assert!(!chat_json(json!({"messages": msg(), "stream_options": null})).unwrap().include_usage);
        assert_eq!(chat_json(json!({"messages": msg(), "stop": ["a", "b"]})).unwrap().stop.len(), 2);
        assert!(chat_json(json!({"messages": msg(), "stop": ["a", "b", "c", "d", "e"]})).is_err());
        assert!(chat_json(json!({"messages": msg(), "stop": [""]})).is_err());
        assert!(chat_json(json!({"messages": msg(), "stop": 3})).is_err());
    }

    #[test]
    fn treespec_extension() {
        use treespec_engine::{MethodKind, METHOD_NAMES};
        let j = chat_json(json!({"messages": msg(), "treespec": {"method": "chain", "k": 3}})).unwrap();
        let m = j.method.unwrap();
        assert_eq!((m.method, m.knobs.k), (MethodKind::Chain, Some(3)));
        let j =
            chat_json(json!({"messages": msg(), "treespec": {"method": "tree", "widths": [3, 1]}})).unwrap();
        assert_eq!(j.method.unwrap().knobs.widths, Some(vec![3, 1]));
        assert!(chat_json(json!({"messages": msg(), "treespec": {}})).unwrap().method.is_none());
        let e = chat_json(json!({"messages": msg(), "treespec": {"method": "magic"}})).unwrap_err();
        assert!(e.message.contains("unknown method 'magic'"));
        assert!(chat_json(json!({"messages": msg(), "treespec": {"method": "chain", "kk": 3}})).is_err());
        assert!(chat_json(json!({"messages": msg(), "treespec": {"k": 3}})).is_err());
        assert!(chat_json(json!({"messages": msg(), "treespec": {"method": "chain", "k": 0}})).is_err());
        // Every method, auto and suffix included, may be asked for per request.
        for name in METHOD_NAMES {
            chat_json(json!({"messages": msg(), "treespec": {"method": name}})).unwrap();
        }
        let e =
            chat_json(json!({"messages": msg(), "treespec": {"method": "lookup", "ngram": "/etc/passwd"}}))
                .unwrap_err();
        assert!(e.message.contains("set when the server starts"), "{}", e.message);
        assert!(method_from_json(json!({"method": "chain"}), false)
            .unwrap_err()
            .message
            .contains("needs a draft"));
        assert!(method_from_json(json!({"method": "lookup"}), false).is_ok());
    }

    #[test]
    fn completion_prompts() {
        let l = Limits::default();
        let p = |v: Value| completion(parse_json(v.to_string().as_bytes())?, &l);
        assert_eq!(p(json!({"prompt": "abc"})).unwrap().prompt, PromptInput::Text("abc".into()));
        assert_eq!(p(json!({"prompt": ["abc"]})).unwrap().prompt, PromptInput::Text("abc".into()));
        assert!(p(json!({"prompt": ["a", "b"]})).is_err());
        assert!(p(json!({"prompt": ""})).is_err());
        assert!(p(json!({})).is_err());
        assert!(p(json!({"prompt": [1, 2]})).is_err());
        assert!(p(json!({"prompt": "a", "echo": true})).is_err());
    }

    #[test]
    fn malformed_json_and_content_type() {
        assert_eq!(
            parse_json::<ChatCompletionRequest>(b"{\"messages\": [").unwrap_err().code,
            Some("invalid_json")
        );
        assert!(parse_json::<ChatCompletionRequest>(b"[1]").is_err());
        assert!(parse_json::<ChatCompletionRequest>(b"{\"messages\": 5}").is_err());
        let mut h = HeaderMap::new();
        assert_eq!(check_content_type(&h).unwrap_err().status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert!(check_content_type(&h).is_err());
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"));
        assert!(check_content_type(&h).is_ok());
        // The OpenAI routes keep requiring JSON: no type and curl's form type are 415s.
        for ct in [None, Some("application/x-www-form-urlencoded"), Some("text/plain")] {
            let h = headers(ct, false);
            assert_eq!(
                check_content_type(&h).unwrap_err().status,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "{ct:?}"
            );
        }
    }

    fn headers(content_type: Option<&'static str>, origin: bool) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(ct) = content_type {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
        }
        if origin {
            h.insert(header::ORIGIN, HeaderValue::from_static("https://elsewhere.example"));
        }
        h
    }

    #[test]
    fn llama_server_routes_read_json_whatever_the_type_but_not_from_browsers() {
        for ct in [
            None,
            Some("application/x-www-form-urlencoded"),
            Some("text/plain;charset=UTF-8"),
            Some("application/json"),
            Some("Application/JSON; charset=utf-8"),
            Some("application/vnd.api+json"),
        ] {
            check_llama_content_type(&headers(ct, false)).unwrap_or_else(|e| panic!("{ct:?}: {e:?}"));
        }
        // Types a cross-site page may send without a CORS preflight: JSON only from browsers.
        for ct in [None, Some("application/x-www-form-urlencoded"), Some("text/plain")] {
            let e = check_llama_content_type(&headers(ct, true)).unwrap_err();
            assert_eq!(
                (e.status, e.code),
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, Some("unsupported_media_type"))
            );
            assert!(e.message.contains("browser"), "{}", e.message);
        }
        check_llama_content_type(&headers(Some("application/json"), true)).unwrap();
        for ct in ["multipart/form-data; boundary=x", "application/xml", "image/png"] {
            let e = check_llama_content_type(&headers(Some(ct), false)).unwrap_err();
            assert_eq!(e.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct}");
        }
    }

    #[test]
    fn a_body_nested_too_deeply_says_so() {
        let nested = |n: usize| format!("{{\"messages\": {}1{}}}", "[".repeat(n), "]".repeat(n));
        // The body itself is one level: `nested(n)` is n + 1 levels.
        let e = parse_json::<ChatCompletionRequest>(nested(MAX_BODY_DEPTH).as_bytes()).unwrap_err();
        assert_eq!(
            (e.status, e.param.as_deref(), e.code),
            (StatusCode::BAD_REQUEST, None, Some("nested_too_deeply"))
        );
        assert_eq!(
            e.message,
            format!("the request body is nested too deeply (more than {MAX_BODY_DEPTH} levels)")
        );
        let e = parse_json::<ChatCompletionRequest>(nested(100_000).as_bytes()).unwrap_err();
        assert_eq!(e.code, Some("nested_too_deeply"));
        // Just within the limit it parses (and is refused for what it says).
        let e = parse_json::<ChatCompletionRequest>(nested(MAX_BODY_DEPTH - 1).as_bytes()).unwrap_err();
        assert_ne!(e.code, Some("nested_too_deeply"), "{e:?}");
    }

    #[test]
    fn lengths_against_the_context() {
        assert_eq!(check_lengths(10, None, 100).unwrap(), 90);
        assert_eq!(check_lengths(10, Some(90), 100).unwrap(), 90);
        assert_eq!(check_lengths(10, Some(91), 100).unwrap_err().code, Some("context_length_exceeded"));
        assert_eq!(check_lengths(100, None, 100).unwrap_err().code, Some("context_length_exceeded"));
        assert!(check_lengths(0, None, 100).is_err());
    }
}
