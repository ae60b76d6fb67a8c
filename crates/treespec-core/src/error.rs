//! The one error type of the core. Every bad input is reported here, never by a panic.

use thiserror::Error;

/// Errors raised by the core.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    /// A vocabulary of size zero cannot hold a distribution.
    #[error("empty vocabulary: logits/distribution has no entries")]
    EmptyVocab,
    /// Logits must be finite (−inf is allowed as a mask, NaN and +inf are not).
    #[error("invalid logit {value} at token {token}: logits must be finite (−inf masks a token)")]
    InvalidLogit { token: usize, value: f32 },
    /// Every token was masked out or had zero probability.
    #[error("distribution has no mass: every token is masked")]
    NoMass,
    /// A sampling parameter outside its domain.
    #[error("invalid sampling parameter: {0}")]
    InvalidSampling(String),
    /// A tree node names a parent that does not exist (or comes after it).
    #[error("tree node {node} names parent {parent}, which does not exist before it")]
    BadParent { node: usize, parent: usize },
    /// A token id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary of size {vocab}")]
    TokenOutOfRange { token: u32, vocab: usize },
    /// A sampled draft node carries no draft distribution, or one of the wrong size.
    #[error("tree node {node}: {reason}")]
    BadDraftNode { node: usize, reason: String },
    /// A verify batch whose distribution rows do not match the tree.
    #[error("verification input mismatch: {0}")]
    VerifyMismatch(String),
    /// A DAG edge that would create a cycle or point to a missing node.
    #[error("invalid DAG edge {from} -> {to}: {reason}")]
    BadDagEdge { from: usize, to: usize, reason: String },
    /// Invalid argument to a core routine.
    #[error("{0}")]
    Invalid(String),
}

/// Result alias for the core.
pub type Result<T> = std::result::Result<T, Error>;
