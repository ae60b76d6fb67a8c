//! Toy models behind the server (no files, deterministic, for tests and demos): token `t` is the
//! letter `'a' + t` and prompts map byte by byte onto the vocabulary (requests are prepared as on
//! any model, on [`ToyPromptModel`]); their lanes are in `toy_lanes.rs`.

use std::sync::Arc;
use std::time::Duration;

use treespec_core::ngram::TokenizerId;
use treespec_engine::registry::FixedContext;
use treespec_engine::toy::toy_costs;
use treespec_engine::Method;
use treespec_request::ToyPromptModel;

use crate::scheduling::histories::TenantHistories;
use crate::scheduling::methods::ServerMethods;

/// Toy models: token `t` is the letter `'a' + t`, prompts map byte by byte onto the vocabulary.
#[derive(Debug, Clone)]
pub struct ToyConfig {
    /// Vocabulary size (≤ 26).
    pub vocab: usize,
    /// Context window.
    pub context: usize,
    /// The default method.
    pub method: Method,
    /// Sleep per decode step (to test queueing and cancellation).
    pub step_delay: Duration,
    /// Batch scheduler: positions all lanes together may hold (default: every lane's whole
    /// context), to test requests waiting for room.
    pub shared_cells: Option<usize>,
    /// Batch scheduler: reuse a finished request's text as the prefix of a later one of the
    /// same tenant, as llama.cpp's lanes do (reported in `cached_tokens`).
    pub prefix_cache: bool,
    /// Every tenant's suffix state (default: in memory), to test saving it.
    pub histories: Option<Arc<TenantHistories>>,
    /// The JSON toy (`treespec_request::JSON_ALPHABET`, with `vocab` 26): tokens spell JSON and
    /// the last ends a generation, so structured output and tool calls decode on toys.
    pub json: bool,
}

impl Default for ToyConfig {
    fn default() -> Self {
        Self {
            vocab: 26,
            context: 256,
            method: Method::Chain { k: 3 },
            step_delay: Duration::ZERO,
            shared_cells: None,
            prefix_cache: false,
            histories: None,
            json: false,
        }
    }
}

impl ToyConfig {
    /// The toys as request preparation, llama-server's routes and the lanes' text see them: a
    /// byte maps onto the vocabulary (byte mod its size), token `t` reads as the letter
    /// `'a' + t`, or on the JSON toy as its byte of the JSON alphabet.
    pub fn prompt_model(&self) -> ToyPromptModel {
        ToyPromptModel { vocab: self.vocab.clamp(1, 26), has_draft: true, json: self.json }
    }
}

/// The toys' tokenizer fingerprint over `vocab` tokens, which their saved histories carry.
pub fn toy_tokenizer(vocab: usize) -> TokenizerId {
    TokenizerId { fingerprint: 0x5eed, vocab: vocab as u32 }
}

/// The toys' methods: cost curves with a verify that grows slowly with the batch; the tenants'
/// suffix state in `histories` (None: in memory).
pub fn toy_methods(default: Method, histories: Option<Arc<TenantHistories>>) -> Arc<ServerMethods> {
    let context = Arc::new(FixedContext { costs: Some(toy_costs()), ..Default::default() });
    let histories = histories.unwrap_or_else(TenantHistories::in_memory);
    Arc::new(ServerMethods::with_histories(default, context, histories))
}
