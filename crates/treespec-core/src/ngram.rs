//! N-gram machinery for model-free drafting (prompt lookup) and for the second stage of staged
//! speculative decoding, with no model involved.
//!
//! * [`ContextIndex`] — the n-grams of a growing token history (prompt + generated), keyed by the
//!   n-gram itself, so "what followed the last n tokens before?" is a hash lookup that stays cheap
//!   however long the history grows; updated one token at a time as tokens are emitted.
//! * [`NgramTable`] — a static trigram table with Katz back-off, built once from token sequences
//!   (for staged decoding: text sampled from the draft model) and stored in a small binary file
//!   tied to the tokenizer it was built with, since its ids mean nothing under another tokenizer.
//!
//! Nothing here draws random numbers: n-gram proposals are deterministic candidates, verified with
//! family 3 (ALGORITHMS.md §2), which is exact whatever chose them.

mod context;
mod katz;

pub use context::{ContextIndex, Continuation};
pub use katz::{NgramTable, TokenizerId, NGRAM_FILE_MAGIC, NGRAM_FILE_VERSION};
