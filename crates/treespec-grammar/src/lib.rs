//! treespec-grammar: grammar-constrained decoding for structured output (issue #14), on
//! [llguidance](https://github.com/guidance-ai/llguidance).
//!
//! A request's output format ([`GrammarSpec`]: any JSON object, a JSON schema, a Lark grammar,
//! a regex, or the [`tool_call_grammar`] of OpenAI `tools`) is compiled against the target
//! model's [`Vocabulary`] into a [`Grammar`]; each request then drives a [`Constraint`]:
//!
//! - [`Constraint::mask`]: the tokens allowed next. The target distribution of constrained
//!   decoding is the model's distribution restricted to this mask and renormalised, at every
//!   position; speculative decoding stays lossless by verifying against exactly that.
//! - [`Constraint::advance`] / [`Constraint::rollback`]: move along a path of a draft tree and
//!   back (cheap in llguidance), so one constraint can walk a whole tree depth-first.
//! - [`Constraint::forced_tokens`]: tokens the grammar fixes (each the only one its mask
//!   allows): free draft nodes, accepted with probability 1.
//!
//! End-of-generation tokens are allowed exactly where the grammar can end.

// Tests are exempt from the 80-line limit (clippy.toml): a test reads top to bottom as one story.
#![cfg_attr(test, allow(clippy::too_many_lines))]

mod constraint;
mod decoding;
mod error;
mod schema_check;
mod spec;
mod tools;
mod vocab;

pub use constraint::{Constraint, TokenMask};
pub use decoding::DecodingConstraint;
pub use error::GrammarError;
pub use schema_check::{MAX_BRANCHES, MAX_DEPTH, MAX_PROPERTIES, MAX_TOTAL};
pub use spec::{CompileOptions, Grammar, GrammarSpec, JsonWhitespace};
pub use toktrie::TokenId;
pub use tools::{
    fenced_call_grammar, fenced_call_text, spaced_json, tagged_call_grammar, tool_call_grammar, ToolChoice,
    ToolFunction, CALL_TAGS, FENCED_CALL,
};
pub use vocab::{TokenizeFn, Vocabulary};
