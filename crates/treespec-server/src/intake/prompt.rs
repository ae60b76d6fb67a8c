//! A validated request's prompt: chat messages, raw text or tokens. Its own module because both
//! the request checks (`validate.rs`) and structured output (`structured.rs`, which adds system
//! notes to the messages) read it.

use treespec_core::TokenId;

/// A chat message after validation (role normalised).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// Text content.
    pub content: String,
}

/// What to generate from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptInput {
    /// A conversation, rendered with the model's chat template.
    Chat(Vec<Message>),
    /// Raw text.
    Text(String),
    /// Tokens, as they are (llama-server's `/completion`, which tokenizes its prompts itself).
    Tokens(Vec<TokenId>),
}
