//! What llama-server's endpoints ask of the served model besides generation, on its
//! [`PromptModel`] (the one model trait every adapter implements): tokens, token pieces, the chat
//! template's text, with their errors as the client should read them. Tokenizing may take a
//! while on a long text: callers run these off the async threads.

use std::sync::Arc;

use treespec_core::TokenId;
use treespec_engine::EngineError;
use treespec_request::{check_tokens, Prompt, PromptModel};

use crate::error::ApiError;
use crate::intake::prompt::PromptInput;
use crate::intake::ready::{chat_input, prepare_error};
use crate::intake::validate::CheckedBody;

/// The served model as the HTTP layer holds it.
pub type ServedModel = Arc<dyn PromptModel + Send + Sync>;

/// Tokenize `text`: `add_special` adds BOS (as the tokenizer config asks), `parse_special`
/// turns special-token text (`<|im_start|>`) into its token.
pub fn tokenize(
    model: &dyn PromptModel,
    text: &str,
    add_special: bool,
    parse_special: bool,
) -> Result<Vec<TokenId>, ApiError> {
    model.tokenize(text, add_special, parse_special).map_err(|e| match e {
        EngineError::InvalidRequest(m) => ApiError::invalid("content", m),
        e => ApiError::internal(format!("tokenizing: {e}")),
    })
}

/// A token's bytes, special tokens as their text; a token outside the vocabulary is a 400
/// naming `tokens`.
pub fn piece(model: &dyn PromptModel, token: TokenId) -> Result<Vec<u8>, ApiError> {
    check_tokens(model, &[token]).map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    model.token_piece(token).map_err(|e| ApiError::internal(e.to_string()))
}

/// A validated chat request's messages (and tools) through the chat template, ending where the
/// reply starts: the text a chat request's prompt is.
pub fn apply_template(model: &dyn PromptModel, spec: &CheckedBody) -> Result<String, ApiError> {
    let PromptInput::Chat(msgs) = &spec.prompt else {
        return Err(ApiError::invalid("messages", "a chat template renders messages"));
    };
    // The messages and tools as `prompt_tokens` hands them to the template.
    let (chat, declared) = chat_input(model.renders_tools(), msgs, spec.tools.as_ref());
    let prompt = match declared {
        Some(tools) => Prompt::MessagesWithTools(&chat, tools),
        None => Prompt::Messages(&chat),
    };
    model.prompt_text(prompt).map_err(|e| prepare_error(e, None))
}
