//! llama-server's request and answer bodies, with its field names and shapes (its
//! `tools/server/README.md`).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use treespec_core::TokenId;
use utoipa::ToSchema;

use crate::api::{CommonParams, Timings, TreespecStats};

/// `POST /completion`: llama-server's native completion. Sampling fields (`temperature`,
/// `top_k`, `top_p`, `min_p`, `repeat_penalty`, `seed`, `stop`, `stream`, `treespec`, …) are
/// those of `/v1/completions`, with llama-server's defaults.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub struct LlamaCompletionRequest {
    /// A string, a list of token ids, or a list mixing strings and ids (one prompt).
    pub prompt: Value,
    /// Most new tokens: -1 (default) until the context is full; 0 only tokenizes the prompt.
    pub n_predict: Option<Value>,
    /// Accepted: a tenant's cached prefixes are always reused.
    pub cache_prompt: Option<Value>,
    /// -1 (any) or a slot below `total_slots`; requests take whichever slot is free.
    pub id_slot: Option<Value>,
    /// Dynamic temperature (only 0).
    pub dynatemp_range: Option<Value>,
    /// Top-n-sigma sampling (only off: -1).
    pub top_n_sigma: Option<Value>,
    /// Raw token ids in the answer (only false).
    pub return_tokens: Option<Value>,
    /// Per-request LoRA adapters (none loaded: only an empty list).
    pub lora: Option<Value>,
    /// Everything else, as in `/v1/completions`.
    #[serde(flatten)]
    pub common: CommonParams,
}

/// The sampling settings a completion ran with (llama-server's `generation_settings`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct GenerationSettings {
    /// The context size.
    pub n_ctx: usize,
    /// The model id.
    pub model: String,
    /// Most new tokens (-1: until the context is full).
    pub n_predict: i64,
    /// The seed used (drawn at random when the request gave none or -1).
    pub seed: u64,
    /// Temperature (0: greedy).
    pub temperature: f32,
    /// Top-k (0: off).
    pub top_k: usize,
    /// Nucleus threshold.
    pub top_p: f32,
    /// Min-p threshold.
    pub min_p: f32,
    /// Repetition penalty (1: off).
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over (-1: all).
    pub repeat_last_n: i64,
    /// Presence penalty.
    pub presence_penalty: f32,
    /// Frequency penalty.
    pub frequency_penalty: f32,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Same as `n_predict`.
    pub max_tokens: i64,
    /// Streamed.
    pub stream: bool,
    /// Always 0 (token probabilities are not served here).
    pub n_probs: u32,
    /// Always false.
    pub ignore_eos: bool,
    /// The treespec method asked for (null: the server's default).
    #[serde(rename = "treespec.method")]
    pub method: Option<String>,
}

/// The answer of `/completion`, and the last chunk of a streamed one (`stop: true`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LlamaCompletion {
    /// Always 0.
    pub index: u32,
    /// The text (empty in the last streamed chunk: the text came before it).
    pub content: String,
    /// True: the completion is over.
    pub stop: bool,
    /// The model id.
    pub model: String,
    /// Tokens generated.
    pub tokens_predicted: usize,
    /// Prompt tokens.
    pub tokens_evaluated: usize,
    /// What it ran with.
    pub generation_settings: GenerationSettings,
    /// The generation reached the end of the context.
    pub truncated: bool,
    /// `eos` (end-of-generation token), `word` (a stop string) or `limit` (`n_predict` or the
    /// context).
    pub stop_type: &'static str,
    /// The stop string that ended it, or "".
    pub stopping_word: String,
    /// Timings.
    pub timings: Timings,
    /// treespec's decoding statistics (absent when nothing was generated: `n_predict: 0`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub treespec: Option<TreespecStats>,
}

/// A streamed chunk of text (`data: {"index": 0, "content": …, "stop": false}`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LlamaChunk {
    /// Always 0.
    pub index: u32,
    /// New text.
    pub content: String,
    /// Always false (the last chunk is a [`LlamaCompletion`]).
    pub stop: bool,
}

/// `POST /tokenize`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub struct TokenizeRequest {
    /// The text.
    pub content: Option<String>,
    /// Add BOS as the tokenizer config says (default false).
    pub add_special: bool,
    /// Read special-token text as the special token (default true).
    pub parse_special: bool,
    /// Answer `{"id", "piece"}` objects instead of ids (default false).
    pub with_pieces: bool,
}

impl Default for TokenizeRequest {
    fn default() -> Self {
        Self { content: None, add_special: false, parse_special: true, with_pieces: false }
    }
}

/// A token's piece: its text, or its bytes when they are not valid UTF-8 on their own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Piece {
    /// Valid UTF-8.
    Text(String),
    /// A partial character.
    Bytes(Vec<u8>),
}

/// One token of a `/tokenize` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum TokenizedToken {
    /// The id (without `with_pieces`).
    Id(TokenId),
    /// The id and its piece (`with_pieces: true`).
    WithPiece {
        /// The id.
        id: TokenId,
        /// Its text or bytes.
        piece: Piece,
    },
}

/// The answer of `/tokenize`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Tokenized {
    /// The tokens.
    pub tokens: Vec<TokenizedToken>,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub struct DetokenizeRequest {
    /// Token ids.
    pub tokens: Vec<Value>,
}

/// The answer of `/detokenize`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Detokenized {
    /// The tokens' pieces, concatenated (special tokens as their text).
    pub content: String,
}

/// The answer of `/apply-template`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AppliedTemplate {
    /// The messages as the chat template renders them, up to where the reply starts.
    pub prompt: String,
}

/// One slot (a request decoded at once) in `/slots` and `/props`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Slot {
    /// Its number.
    pub id: usize,
    /// Always -1 (tasks are not numbered).
    pub id_task: i64,
    /// Context a request may use (every slot shares the server's cells).
    pub n_ctx: usize,
    /// Always true: every request decodes speculatively.
    pub speculative: bool,
    /// Busy: the first `n` slots are, while `n` requests decode (slots are interchangeable).
    pub is_processing: bool,
}

/// `default_generation_settings` of `/props`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DefaultSettings {
    /// A slot's fields.
    #[serde(flatten)]
    pub slot: Slot,
    /// What `/completion` runs with when a request sets nothing (the seed shown is llama-server's
    /// "random", 4294967295).
    pub params: GenerationSettings,
}

/// Modalities the model takes.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Modalities {
    /// Always false.
    pub vision: bool,
    /// Always false.
    pub audio: bool,
}

/// The answer of `GET /props`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Props {
    /// `/completion`'s defaults.
    pub default_generation_settings: DefaultSettings,
    /// Requests decoded at once (`--parallel`).
    pub total_slots: usize,
    /// The model file.
    pub model_path: String,
    /// The model's chat template ("" without one).
    pub chat_template: String,
    /// Text only.
    pub modalities: Modalities,
    /// `treespec <version>`.
    pub build_info: String,
    /// Where the models run: `CPU`, or a GPU and its layers (treespec's own field).
    pub device: String,
    /// Always false.
    pub is_sleeping: bool,
}
