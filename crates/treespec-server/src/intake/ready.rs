//! A validated job made ready for a lane on any model (`ready_job`; "prepare" is only
//! treespec-request's one preparation, which it calls) ([`PromptModel`]: llama.cpp's runtime, the
//! toys): its prompt as the model's chat template takes it (tools described by the template
//! itself or as a note in front), then treespec-request's one preparation, with its errors as
//! the client should read them (the field at fault in a 400).

use treespec_core::TokenId;
use treespec_engine::{CausalLm, Method, Prepared};
use treespec_request::{GenerationAsk, PrepareError, Prompt, PromptModel, RequestPrompt};
use treespec_text::ChatMessage;

use crate::error::ApiError;
use crate::intake::prompt::{Message, PromptInput};
use crate::intake::validate::{length_error, CheckedBody, ToolsPrompt};

/// Make `spec` ready to decode with `method` in a sequence of `context` positions of `model`,
/// the drafter on `draft` when the method runs a draft model.
pub fn ready_job<'d, M: PromptModel + ?Sized, D: CausalLm + 'd>(
    model: &M,
    spec: &CheckedBody,
    method: &Method,
    context: usize,
    draft: Option<D>,
) -> Result<Prepared<'d>, ApiError> {
    with_request_prompt(model, &spec.prompt, spec.tools.as_ref(), |prompt| {
        let request = GenerationAsk {
            prompt,
            method,
            max_new_tokens: spec.max_tokens,
            context,
            sampling: spec.sampling.clone(),
            seed: spec.seed,
            stop: &spec.stop,
            grammar: spec.output.grammar(),
            tool_calls: spec.output.auto_tools(),
        };
        treespec_request::prepare(model, &request, draft)
    })
    .map_err(|e| prepare_error(e, spec.output.param()))
}

/// Tokenize a request's prompt: chat messages through the model's template (only the template's
/// markup yields special tokens, as in `treespec generate --chat`), raw text as is. The tools of
/// a `tool_choice: "auto"` request go to a template that describes tools itself (Qwen2.5's),
/// else in front as a system note.
pub fn prompt_tokens<M: PromptModel + ?Sized>(
    model: &M,
    prompt: &PromptInput,
    tools: Option<&ToolsPrompt>,
) -> Result<Vec<TokenId>, ApiError> {
    with_request_prompt(model, prompt, tools, |p| treespec_request::request_tokens(model, p))
        .map_err(|e| prepare_error(e, None))
}

/// `f` on the prompt as the preparation takes it (the chat messages, with the tools as
/// [`chat_input`] hands them to the template, live only for the call).
fn with_request_prompt<M: PromptModel + ?Sized, R>(
    model: &M,
    prompt: &PromptInput,
    tools: Option<&ToolsPrompt>,
    f: impl FnOnce(RequestPrompt<'_>) -> R,
) -> R {
    match prompt {
        PromptInput::Tokens(t) => f(RequestPrompt::Tokens(t)),
        PromptInput::Text(t) => f(RequestPrompt::Formatted(Prompt::Text(t))),
        PromptInput::Chat(msgs) => {
            let (chat, declared) = chat_input(model.renders_tools(), msgs, tools);
            f(RequestPrompt::Formatted(match declared {
                Some(tools) => Prompt::MessagesWithTools(&chat, tools),
                None => Prompt::Messages(&chat),
            }))
        }
    }
}

/// The messages as the chat template takes them, and the tools' declarations when the template
/// renders tools itself (`renders_tools`; else their note is a system message in front).
pub fn chat_input<'t>(
    renders_tools: bool,
    msgs: &[Message],
    tools: Option<&'t ToolsPrompt>,
) -> (Vec<ChatMessage>, Option<&'t serde_json::Value>) {
    match tools {
        None => (chat_messages(msgs), None),
        Some(t) if renders_tools => (chat_messages(msgs), Some(&t.declared)),
        Some(t) => (chat_messages(&t.messages(msgs)), None),
    }
}

/// Validated messages as the chat template takes them.
fn chat_messages(msgs: &[Message]) -> Vec<ChatMessage> {
    msgs.iter().map(|x| ChatMessage::new(&x.role, &x.content)).collect()
}

/// What the client reads when its request cannot be prepared: the field at fault in a 400
/// (`grammar_param` names the request's structured-output field), or a 500 when the server is.
pub fn prepare_error(e: PrepareError, grammar_param: Option<&'static str>) -> ApiError {
    match e {
        PrepareError::Template(_) => ApiError::invalid("messages", e.to_string()),
        PrepareError::TokenOutOfVocabulary { .. } => ApiError::invalid("prompt", e.to_string()),
        PrepareError::EmptyPrompt
        | PrepareError::PromptTooLong { .. }
        | PrepareError::TooManyTokens { .. } => length_error(e),
        PrepareError::Grammar(g) => ApiError::invalid(grammar_param, g.to_string()),
        PrepareError::NoGrammar(m) => ApiError::invalid(grammar_param, m),
        PrepareError::Method(m) => ApiError::invalid("treespec", m),
        PrepareError::Internal(m) => ApiError::internal(m),
    }
}
