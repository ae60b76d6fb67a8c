//! OpenAI's API, as llama_server/ holds llama-server's: its wire types ([`types`], the crate's
//! public `api`) and how an answer is written in them ([`wire`]). The routes are in
//! [`crate::http::routes`].

pub mod types;
pub(crate) mod wire;
