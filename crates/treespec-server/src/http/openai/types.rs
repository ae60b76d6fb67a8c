//! OpenAI wire types, written by hand. Requests ignore unknown fields (`serde` default); the few
//! known fields that would change results but are not supported are captured as raw JSON so that
//! validation can reject them with a clear message instead of silently ignoring them.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// One chat message as sent by a client. `content` is a string or an array of text parts.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub struct RequestMessage {
    /// `system`, `user`, `assistant` (or `developer`, treated as `system`).
    pub role: String,
    /// String or `[{"type":"text","text":...}]`.
    pub content: Value,
    /// Tool calls in an assistant message (unsupported: rejected).
    pub tool_calls: Option<Value>,
}

/// `stop`: a string or a list of strings.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several stop strings.
    Many(Vec<String>),
}

impl Stop {
    /// As a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub struct StreamOptions {
    /// Send a last chunk with the token usage before `[DONE]`.
    pub include_usage: bool,
}

/// Fields shared by both endpoints.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub struct CommonParams {
    /// Model name (informational: the server serves one model).
    pub model: Option<String>,
    /// Most new tokens (`max_completion_tokens` is the newer spelling).
    pub max_tokens: Option<i64>,
    /// Newer spelling of `max_tokens`.
    pub max_completion_tokens: Option<i64>,
    /// Sampling temperature (0 = greedy). Default 1 as in the OpenAI API.
    pub temperature: Option<f64>,
    /// Nucleus threshold in (0, 1].
    pub top_p: Option<f64>,
    // llama-server's sampling fields, as raw JSON so a wrong type names its field (`sampling.rs`).
    /// Keep the k most likely tokens (≥ 1).
    pub top_k: Option<Value>,
    /// Drop tokens below min_p × the top probability, in [0, 1].
    pub min_p: Option<Value>,
    /// Repetition penalty (> 0, 1 = off); `repetition_penalty` is vLLM's spelling.
    #[serde(alias = "repetition_penalty")]
    pub repeat_penalty: Option<Value>,
    /// Tokens the repetition penalty looks back over (-1: all); `penalty_last_n` also accepted.
    #[serde(alias = "penalty_last_n")]
    pub repeat_last_n: Option<Value>,
    /// Seed for the draft and verifier streams.
    pub seed: Option<i64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Stream with server-sent events.
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// The treespec extension.
    pub treespec: Option<Value>,
    /// OpenAI's session key: the conversation this request continues. A gateway keeps a
    /// conversation's turns on one replica by it (also read from `X-SMG-Routing-Key` and
    /// `X-Session-Id`: `gateway.rs`).
    pub prompt_cache_key: Option<String>,
    // Fields that change results and are not supported: rejected when set to a non-default.
    /// Number of choices (only 1).
    pub n: Option<Value>,
    /// Log probabilities (unsupported).
    pub logprobs: Option<Value>,
    /// Top log probabilities (unsupported).
    pub top_logprobs: Option<Value>,
    /// Function tools (`structured.rs`).
    pub tools: Option<Value>,
    /// `auto`, `none`, `required` or a named function (`structured.rs`).
    pub tool_choice: Option<Value>,
    /// Functions (deprecated, unsupported).
    pub functions: Option<Value>,
    /// `text`, `json_object` or `json_schema` (`structured.rs`).
    pub response_format: Option<Value>,
    /// Logit bias (unsupported).
    pub logit_bias: Option<Value>,
    /// Presence penalty (only 0).
    pub presence_penalty: Option<Value>,
    /// Frequency penalty (only 0).
    pub frequency_penalty: Option<Value>,
    /// best_of (completions; only 1).
    pub best_of: Option<Value>,
    /// echo (completions; unsupported).
    pub echo: Option<Value>,
    /// suffix (completions; unsupported).
    pub suffix: Option<Value>,
    /// llama-server: locally typical sampling (only 1).
    pub typical_p: Option<Value>,
    /// llama-server: Mirostat (only 0).
    pub mirostat: Option<Value>,
    /// llama-server: DRY repetition penalty (only 0).
    pub dry_multiplier: Option<Value>,
    /// llama-server: XTC sampling (only 0).
    pub xtc_probability: Option<Value>,
    /// llama-server: generate past end-of-generation tokens (only false).
    pub ignore_eos: Option<Value>,
    /// llama-server: constrained decoding (unsupported).
    pub grammar: Option<Value>,
    /// llama-server: constrained decoding (unsupported).
    pub json_schema: Option<Value>,
    /// llama-server: token probabilities (only 0).
    pub n_probs: Option<Value>,
    /// llama-server: the samplers' order, as names or letters (`sampling.rs`: the orders the
    /// pipeline runs and llama-server's default; a sampler left out is off).
    pub samplers: Option<Value>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub struct ChatCompletionRequest {
    /// The conversation.
    pub messages: Vec<RequestMessage>,
    /// Everything else.
    #[serde(flatten)]
    pub common: CommonParams,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub struct CompletionRequest {
    /// A string (or a list holding exactly one string).
    pub prompt: Value,
    /// Everything else.
    #[serde(flatten)]
    pub common: CommonParams,
}

/// Token usage.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq, ToSchema)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Sum.
    pub total_tokens: usize,
    /// How the prompt tokens were served (always present).
    pub prompt_tokens_details: PromptTokensDetails,
}

/// OpenAI's `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq, ToSchema)]
pub struct PromptTokensDetails {
    /// Leading prompt tokens whose KV was reused from a cached or live prefix of the same
    /// tenant's earlier requests instead of being prefilled; 0 on a fresh prompt. Same number as llama-server's
    /// `timings.cache_n`.
    pub cached_tokens: usize,
}

impl Usage {
    /// From the counts: prompt tokens (`cached` of them from the prefix cache) and generated ones.
    pub fn new(prompt: usize, completion: usize, cached: usize) -> Self {
        Self {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: cached },
        }
    }
}

/// An assistant message in a response.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResponseMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// The generated text (null for a tool call).
    pub content: Option<String>,
    /// The tool call of a forced call (`tool_choice` `required` or named).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// One tool call in a response.
#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct ToolCall {
    /// `call_…`.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// The function of a tool call.
#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// Its arguments: a JSON object, encoded as a string.
    pub arguments: String,
}

/// A streamed piece of a tool call: the first holds id, type and name (arguments empty), the
/// next ones only argument text.
#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct ToolCallDelta {
    /// Always 0 (one call per response).
    pub index: u32,
    /// Only in the first piece.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, only in the first piece.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// Name (first piece) and/or argument text.
    pub function: FunctionCallDelta,
}

/// The function part of a [`ToolCallDelta`].
#[derive(Debug, Clone, Serialize, PartialEq, ToSchema)]
pub struct FunctionCallDelta {
    /// Only in the first piece.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// More argument text.
    pub arguments: String,
}

/// A choice's log-probabilities (OpenAI `choices[].logprobs`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema)]
pub struct ChoiceLogprobs {
    /// One entry per generated token, in order.
    pub content: Vec<LogprobEntry>,
}

/// A generated token's log-probability under the distribution it was drawn from (the target's,
/// after the request's sampling processing and grammar; for greedy requests the penalised,
/// masked logits at temperature 1), with the most likely alternatives there.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct LogprobEntry {
    /// The token.
    #[serde(flatten)]
    pub token: TopLogprob,
    /// The `top_logprobs` most likely tokens, best first.
    pub top_logprobs: Vec<TopLogprob>,
}

/// A token and its log-probability.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TopLogprob {
    /// The token's text (lossy UTF-8 of its bytes).
    pub token: String,
    /// Its natural log-probability.
    pub logprob: f32,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// One choice of a non-streaming chat completion.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChoice {
    /// Always 0.
    pub index: u32,
    /// The reply.
    pub message: ResponseMessage,
    /// The tokens' log-probabilities, when asked for (`logprobs: true`).
    pub logprobs: Option<ChoiceLogprobs>,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: &'static str,
}

/// Non-streaming chat completion.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletionResponse {
    /// `chatcmpl-…`.
    pub id: String,
    /// `chat.completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model id.
    pub model: String,
    /// One choice.
    pub choices: Vec<ChatChoice>,
    /// Token usage.
    pub usage: Usage,
    /// Prompt and generation timings and draft counts, in llama-server's shape (its `timings`).
    pub timings: Timings,
    /// Decoding statistics (extension).
    pub treespec: TreespecStats,
}

/// A streamed delta.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct Delta {
    /// Only in the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Pieces of a tool call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// One choice of a chat completion chunk.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChunkChoice {
    /// Always 0.
    pub index: u32,
    /// New text.
    pub delta: Delta,
    /// Log-probabilities of the tokens generated since the last chunk, when asked for.
    pub logprobs: Option<ChoiceLogprobs>,
    /// Set in the last content chunk.
    pub finish_reason: Option<&'static str>,
}

/// A streamed chat completion chunk.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletionChunk {
    /// Same for every chunk of one response.
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model id.
    pub model: String,
    /// Zero (usage chunk) or one choice.
    pub choices: Vec<ChunkChoice>,
    /// Only in the usage chunk (`stream_options.include_usage`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Only in the last chunk before `[DONE]` (the usage chunk when asked for, else the finish
    /// chunk), as llama-server sends it: the request's timings and draft counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
    /// treespec's extension: with the header `X-Treespec-Trace: 1`, how each piece of the chunk's
    /// text was produced and, in the finish chunk, the request's statistics ([`ChunkTrace`]);
    /// in the usage chunk, the request's statistics as non-streamed responses carry them
    /// ([`TreespecStats`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub treespec: Option<ChunkTreespec>,
}

/// The `treespec` field of a streamed chat chunk.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ChunkTreespec {
    /// The trace extension (`X-Treespec-Trace: 1`).
    Trace(ChunkTrace),
    /// The request's decoding statistics (the last chunk).
    Stats(TreespecStats),
}

/// How a streamed chunk's text was produced (the `X-Treespec-Trace: 1` extension).
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct ChunkTrace {
    /// The chunk's text in runs of one provenance, in order: their texts concatenate to the
    /// delta's `content`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub spans: Vec<TextSpan>,
    /// In the finish chunk: what decoded the request and how many tokens each forward gave.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<TreespecStats>,
    /// In the finish chunk: this server's plain decoding rate (1000 / T(1) on its measured cost
    /// curve), when the curve is known — the speed-up of the request is its rate over this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plain_tokens_per_second: Option<f64>,
}

/// A run of text whose tokens were produced the same way.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TextSpan {
    /// `copied` (a model-free draft from earlier text), `drafted` (a draft model's), `forced` (the
    /// grammar's), or `target` (the target's own token).
    #[schema(value_type = String)]
    pub by: treespec_engine::Provenance,
    /// The text.
    pub text: String,
    /// Tokens behind it (a token whose text was held back counts where its text comes out).
    pub tokens: usize,
}

impl From<treespec_engine::TextRun> for TextSpan {
    fn from(r: treespec_engine::TextRun) -> Self {
        Self { by: r.by, text: r.text, tokens: r.tokens }
    }
}

/// One choice of a text completion (streamed or not).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CompletionChoice {
    /// Always 0.
    pub index: u32,
    /// Generated text (a delta when streaming).
    pub text: String,
    /// Always null.
    pub logprobs: Option<()>,
    /// `stop` / `length`; null in streamed chunks before the last.
    pub finish_reason: Option<&'static str>,
}

/// A text completion or one streamed chunk of it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CompletionResponse {
    /// `cmpl-…`.
    pub id: String,
    /// `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model id.
    pub model: String,
    /// Zero (usage chunk) or one choice.
    pub choices: Vec<CompletionChoice>,
    /// Token usage (always when not streaming; usage chunk when streaming).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Timings and draft counts in llama-server's shape (always when not streaming; when
    /// streaming, in the last chunk before `[DONE]`: the usage chunk when asked for, else the
    /// finish chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
    /// Decoding statistics (extension; always when not streaming; in the usage chunk when
    /// streaming).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub treespec: Option<TreespecStats>,
}

/// Decoding statistics returned in the `treespec` field of non-streaming responses (and of the
/// streamed usage chunk).
#[derive(Debug, Clone, Default, Serialize, PartialEq, ToSchema)]
pub struct TreespecStats {
    /// The method that decoded.
    pub method: String,
    /// Target forwards (decode steps).
    pub target_forwards: u64,
    /// Mean tokens emitted per target forward.
    pub mean_accepted: f64,
}

/// `GET /v1/models` entry.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelCard {
    /// Model id.
    pub id: String,
    /// `model`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// `treespec`.
    pub owned_by: &'static str,
    /// The context size in tokens (vLLM's field; a gateway reads the model's context from it).
    pub max_model_len: usize,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelList {
    /// `list`.
    pub object: &'static str,
    /// The served model.
    pub data: Vec<ModelCard>,
}

/// Prompt and generation timings, in llama-server's form (its `timings`, with the same field
/// names): also in the OpenAI routes' answers (non-streamed, and the last streamed chunk).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, ToSchema)]
pub struct Timings {
    /// Prompt tokens reused from the prefix cache (not prefilled); `prompt_n + cache_n` is the
    /// whole prompt.
    pub cache_n: usize,
    /// Prompt tokens prefilled (the prompt less `cache_n`).
    pub prompt_n: usize,
    /// Milliseconds reading the prompt.
    pub prompt_ms: f64,
    /// Per prefilled prompt token.
    pub prompt_per_token_ms: f64,
    /// Prefilled prompt tokens a second.
    pub prompt_per_second: f64,
    /// Generated tokens.
    pub predicted_n: usize,
    /// Milliseconds generating.
    pub predicted_ms: f64,
    /// Per generated token.
    pub predicted_per_token_ms: f64,
    /// Generated tokens a second.
    pub predicted_per_second: f64,
    /// Drafted tokens (tree nodes) the target verified, over the whole generation (0 without
    /// drafts).
    pub draft_n: u64,
    /// Of those, accepted (never more than `draft_n`).
    pub draft_n_accepted: u64,
}
