//! The HTTP side: axum handlers and what they answer with — the OpenAI routes ([`routes`], their
//! wire types and format in [`openai`]), llama-server's routes ([`llama_server`]), both answered
//! through one response lifecycle ([`respond`]), all reading one shared state ([`state`]); what a
//! gateway needs of a replica ([`gateway`]) and the switch that drains it ([`draining`]);
//! the OpenAPI description ([`openapi`]); the chat page ([`chat`]); and the accept loop that tells
//! a request when its client has gone ([`serve`]), over TLS when asked ([`tls`]), and the deadline of a request's body
//! ([`deadline`]). No model and no scheduling here: a request
//! is checked by [`crate::intake`] and handed to the [`crate::scheduling::job::GenerationBackend`].

pub(crate) mod chat;
pub(crate) mod deadline;
pub(crate) mod draining;
pub(crate) mod gateway;
pub(crate) mod llama_server;
pub(crate) mod openai;
pub(crate) mod openapi;
pub(crate) mod respond;
pub(crate) mod routes;
pub mod serve;
pub(crate) mod state;
pub mod tls;
pub(crate) mod tool_calls;
