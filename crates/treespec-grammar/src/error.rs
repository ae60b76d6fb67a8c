//! Errors of this crate. The compile-time kinds ([`GrammarError::BadSchema`],
//! [`GrammarError::BadGrammar`], [`GrammarError::BadTools`]) are the user's fault and map to
//! HTTP 400 in the server; the run-time kinds are engine bugs or exhausted parser limits.

use thiserror::Error;

/// Everything that can go wrong building a vocabulary, compiling a grammar or driving a
/// [`Constraint`](crate::Constraint).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum GrammarError {
    /// The token table cannot back a grammar (empty, EOS out of range...).
    #[error("bad vocabulary: {0}")]
    BadVocabulary(String),
    /// A JSON schema llguidance cannot compile (unknown type, unsatisfiable, bad `$ref`...).
    #[error("invalid JSON schema: {0}")]
    BadSchema(String),
    /// A Lark grammar or regular expression that does not compile.
    #[error("invalid grammar: {0}")]
    BadGrammar(String),
    /// OpenAI `tools` / `tool_choice` that do not describe a callable function.
    #[error("invalid tools: {0}")]
    BadTools(String),
    /// [`Constraint::advance`](crate::Constraint::advance) got a token the mask forbids. The
    /// constraint is left unchanged, so the caller can keep going with a valid token.
    #[error("token {token} is not allowed by the grammar here")]
    Rejected {
        /// The refused token id.
        token: u32,
    },
    /// A rollback of more tokens than were advanced.
    #[error("cannot roll back {requested} tokens: only {available} were advanced")]
    Rollback {
        /// Tokens asked to undo.
        requested: usize,
        /// Tokens advanced so far.
        available: usize,
    },
    /// llguidance's parser failed (limits exhausted, internal error). The constraint is dead.
    #[error("grammar parser failed: {0}")]
    Parser(String),
}

/// The first line of an llguidance message, without its state dump (`<state>...`), at most
/// 240 characters: what a client may be told.
pub(crate) fn brief(msg: &str) -> String {
    let before_state = msg.split("<state>").next().unwrap_or("");
    let first = before_state.lines().next().unwrap_or("").trim().trim_end_matches(':');
    match first.char_indices().nth(240) {
        Some((i, _)) => format!("{}…", &first[..i]),
        None => first.to_string(),
    }
}
