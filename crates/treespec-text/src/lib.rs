//! treespec-text: the text side of generation that is not the tokenizer itself (which is the
//! model's own, through the backend): chat templates from GGUF metadata, rendered so that message
//! text can never become special tokens, and streaming detokenization that never splits a UTF-8
//! character.

pub mod chat;
pub mod guard;
pub mod utf8;

pub use chat::{ChatMessage, ChatTemplate, TemplateError};
pub use guard::Piece;
pub use utf8::Utf8Stream;
