//! One module per subcommand, plus the argument groups and model loading they share.

pub mod args;
pub mod bench;
pub mod bound;
pub mod calibrate;
pub mod demo;
pub mod devices;
pub mod draft;
pub mod generate;
pub mod inspect;
pub mod llama_flags;
pub mod models;
pub mod ngram;
pub mod profile;
pub mod profile_shapes;
pub mod serve;
pub mod spellings;
pub mod structured;
pub mod threads;

#[cfg(test)]
mod parity;
