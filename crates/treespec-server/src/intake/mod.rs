//! A request's intake: its body checked without a model, every field of a completion request
//! ([`validate`], into a [`validate::CheckedBody`]), its sampling fields ([`sampling`]),
//! structured output and tools ([`structured`]), and the prompt as messages or text
//! ([`prompt`]); then a job made ready for a lane on any model ([`ready`]), and what
//! llama-server's routes read off the model ([`model_text`]).

pub mod model_text;
pub mod prompt;
pub mod ready;
pub(crate) mod sampling;
pub(crate) mod structured;
pub mod validate;
