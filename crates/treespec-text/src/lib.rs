//! treespec-text: the text side of generation that is not the tokenizer itself (which is the
//! model's own, through the backend): chat templates from GGUF metadata, rendered so that message
//! text can never become special tokens. (Streaming the generated text is the engine's
//! `TextStream`, next to the stop strings it must respect.)

// Tests are exempt from the 80-line limit (clippy.toml): a test reads top to bottom as one story.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod builtin;
pub mod chat;
pub mod guard;
mod sentinel;
mod tojson;

pub use builtin::{builtin_names, template_source};
pub use chat::{ChatMessage, ChatTemplate, TemplateError};
pub use guard::Piece;
