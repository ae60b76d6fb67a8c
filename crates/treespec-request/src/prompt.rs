//! What a front end asks of one generation: its prompt (text, chat messages or tokens) and the
//! rest of the request.

use treespec_core::sampling::SamplingParams;
use treespec_core::TokenId;
use treespec_engine::Method;
use treespec_grammar::{GrammarSpec, ToolFunction};
use treespec_text::ChatMessage;

/// A prompt as a model formats it.
#[derive(Debug, Clone, Copy)]
pub enum Prompt<'a> {
    /// Raw text: BOS as the tokenizer config says, no special tokens parsed.
    Text(&'a str),
    /// One user turn through the target's chat template (`treespec generate --chat`).
    User(&'a str),
    /// Messages through the target's chat template (the server's chat completions).
    Messages(&'a [ChatMessage]),
    /// Messages and OpenAI `tools` declarations, both through the template (one that reads
    /// `tools`; see [`PromptModel::renders_tools`](crate::PromptModel::renders_tools)).
    MessagesWithTools(&'a [ChatMessage], &'a serde_json::Value),
}

impl<'a> Prompt<'a> {
    /// `text` as one user turn when `chat`, else as raw text: the CLI's `--chat` switch.
    pub fn text_or_user(text: &'a str, chat: bool) -> Self {
        if chat {
            Prompt::User(text)
        } else {
            Prompt::Text(text)
        }
    }
}

/// The prompt of a request: text to format, or tokens a client sent.
#[derive(Debug, Clone, Copy)]
pub enum RequestPrompt<'a> {
    /// Text or messages, tokenized by [`PromptModel::prompt_tokens`](crate::PromptModel::prompt_tokens).
    Formatted(Prompt<'a>),
    /// Tokens as they are (checked against the vocabulary: llama.cpp aborts on any other id).
    Tokens(&'a [TokenId]),
}

/// What a front end asks of one generation.
#[derive(Debug, Clone)]
pub struct GenerationAsk<'a> {
    /// The prompt.
    pub prompt: RequestPrompt<'a>,
    /// The method that decodes it.
    pub method: &'a Method,
    /// Most new tokens (None: as many as the context leaves).
    pub max_new_tokens: Option<usize>,
    /// Positions the request's sequence may hold (the target context, or a batch lane's).
    pub context: usize,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// Seed of the draft and verifier streams.
    pub seed: u64,
    /// Stop strings.
    pub stop: &'a [String],
    /// Structured output: the grammar every token must follow.
    pub grammar: Option<&'a GrammarSpec>,
    /// Free output that may call these tools (`tool_choice: "auto"`): a call the model opens
    /// itself follows the call grammar to its close (forced tokens drafted for free; see
    /// [`tagged_calls`](crate::tagged_calls)); the text around calls stays free. Ignored with
    /// `grammar`.
    pub tool_calls: Option<&'a [ToolFunction]>,
}
