//! treespec-request: one request made ready to generate, the same way for every front end (the
//! CLI's `generate`, the benchmark, the server's scheduler) and every backend (llama.cpp's
//! models, the toy models of the tests).
//!
//! A front end says what it was asked for ([`GenerationAsk`]); [`prepare`] turns it into what the
//! engine runs ([`treespec_engine::Prepared`]): the prompt as tokens (through the chat template
//! when it is a chat), the grammar compiled against the target's vocabulary (or, for calls the
//! model may open itself, the call grammar from each opening to its close), the method's drafter
//! (on the caller's draft model when the method runs one), the stop strings with the target's
//! end tokens, and the most new tokens the context leaves room for.
//!
//! All it reads off a model is small and needs no tensors ([`PromptModel`]: prompt tokens, end
//! tokens, vocabulary size, the token table, whether a draft is loaded), so a new backend
//! implements that trait and gets the same preparation, checks and errors as every other (the
//! toy models of the tests: [`ToyPromptModel`]). It is the one trait a model implements to be
//! served: the server's llama-server routes read its tokenizer, token pieces, chat template text
//! and model file through it too.
//! Errors say which part of the request is at fault ([`PrepareError`]), so the server can answer
//! a 400 naming the field and the CLI a sentence.

// Tests are exempt from the 80-line limit (clippy.toml): a test reads top to bottom as one story.
#![cfg_attr(test, allow(clippy::too_many_lines))]

mod error;
mod model;
mod prepare;
mod prompt;
mod token_table;
mod toy;

pub use error::{room, PrepareError};
pub use model::{PromptModel, VocabularyCache};
pub use prepare::{check_method, check_tokens, compile_grammar, prepare, request_tokens, tagged_calls};
pub use prompt::{GenerationAsk, Prompt, RequestPrompt};
pub use token_table::TokenTable;
pub use toy::{ToyPromptModel, JSON_ALPHABET, JSON_VOCAB};
