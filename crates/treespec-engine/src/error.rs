//! Errors of the engine and of model backends.

use thiserror::Error;

/// Engine errors. Backends map their failures into [`EngineError::Backend`] or a more specific
/// variant; nothing in the decode loop panics on bad input.
#[derive(Debug, Error)]
pub enum EngineError {
    /// An error from the pure core (sampling parameters, logits, trees, verification).
    #[error(transparent)]
    Core(#[from] treespec_core::Error),
    /// The prompt (plus what must be generated) does not fit the context window.
    #[error("prompt of {prompt} tokens does not fit the context of {context} tokens (need room for at least one new token)")]
    PromptTooLong { prompt: usize, context: usize },
    /// An empty prompt: there is no token to condition on.
    #[error("empty prompt: at least one token is needed")]
    EmptyPrompt,
    /// A request parameter outside its domain.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// Misuse of the model seam (pending nodes, bad parent index, out-of-range token...).
    #[error("model state error: {0}")]
    State(String),
    /// Draft and target cannot be paired.
    #[error("draft/target mismatch: {0}")]
    Incompatible(String),
    /// A backend failure (llama.cpp decode error, file problems...).
    #[error("backend error: {0}")]
    Backend(String),
    /// Generation was cancelled by the caller.
    #[error("generation cancelled")]
    Cancelled,
}

/// Result alias for the engine.
pub type Result<T> = std::result::Result<T, EngineError>;
