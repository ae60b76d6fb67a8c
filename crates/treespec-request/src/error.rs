//! What is wrong with a request, by the part at fault, and the room its answer has.

use treespec_core::TokenId;

/// What is wrong with a request, by the part at fault.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The messages could not be rendered: the chat template refused them, or there is none
    /// (the text says which, and for a missing one how to give one).
    #[error("{0}")]
    Template(String),
    /// A prompt token is not in the vocabulary.
    #[error("token {token} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfVocabulary {
        /// The token.
        token: TokenId,
        /// The vocabulary size.
        vocab: usize,
    },
    /// Nothing to start from.
    #[error("the prompt is empty after tokenization")]
    EmptyPrompt,
    /// The prompt fills the context.
    #[error("the prompt is {prompt} tokens long but the context holds {context}")]
    PromptTooLong {
        /// Prompt tokens.
        prompt: usize,
        /// Context positions.
        context: usize,
    },
    /// The prompt and the asked-for tokens do not fit.
    #[error(
        "the prompt ({prompt} tokens) plus max_tokens ({max_new}) exceeds the context of {context} tokens"
    )]
    TooManyTokens {
        /// Prompt tokens.
        prompt: usize,
        /// Most new tokens asked for.
        max_new: usize,
        /// Context positions.
        context: usize,
    },
    /// The grammar does not compile (the request's schema, grammar or regex).
    #[error("{0}")]
    Grammar(treespec_grammar::GrammarError),
    /// The model cannot constrain output to a grammar (it has no vocabulary to compile one
    /// against: the toy models).
    #[error("{0}")]
    NoGrammar(String),
    /// The method cannot run: it needs a draft model none was loaded for, or its knobs are
    /// invalid.
    #[error("{0}")]
    Method(String),
    /// Not the request's fault.
    #[error("{0}")]
    Internal(String),
}

/// Most new tokens for a prompt of `prompt` tokens in `context` positions: `max_new` when it
/// fits, else the whole rest of the context.
pub fn room(prompt: usize, max_new: Option<usize>, context: usize) -> Result<usize, PrepareError> {
    if prompt == 0 {
        return Err(PrepareError::EmptyPrompt);
    }
    if prompt >= context {
        return Err(PrepareError::PromptTooLong { prompt, context });
    }
    let room = context - prompt;
    match max_new {
        None => Ok(room),
        Some(n) if n > room => Err(PrepareError::TooManyTokens { prompt, max_new: n, context }),
        Some(n) => Ok(n),
    }
}
