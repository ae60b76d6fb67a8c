//! Prompts as tokens: raw text, or chat messages through the model's own template. The CLI's
//! `--chat` and the server both come here, so a message means the same tokens everywhere.
//!
//! Chat messages are rendered with [`ChatTemplate::render_guarded`]: the template's markup is
//! tokenized with special tokens parsed, and any control-token text inside a message as plain
//! text, so no message can open or close a turn of its own (see `treespec_text::guard`).

use treespec_core::TokenId;
use treespec_engine::{EngineError, Result};
use treespec_text::{ChatMessage, ChatTemplate, Piece};

use crate::load::LlamaModel;

impl LlamaModel {
    /// Tokenize raw text as a prompt: BOS as the tokenizer config says, no special tokens parsed.
    pub fn text_prompt(&self, text: &str) -> Result<Vec<TokenId>> {
        self.tokenize(text, self.add_bos(), false)
    }

    /// The chat template stored in the file, compiled with the model's BOS/EOS texts.
    pub fn compiled_chat_template(&self) -> Result<ChatTemplate> {
        self.compile_chat_template(self.chat_template().as_deref())
    }

    /// The Jinja `source` compiled with the model's BOS/EOS texts (None: the model has no
    /// template, an error that says how to give one).
    pub fn compile_chat_template(&self, source: Option<&str>) -> Result<ChatTemplate> {
        let text =
            |t: Option<TokenId>| t.map(|t| self.token_text(t)).transpose().map(Option::unwrap_or_default);
        ChatTemplate::new(source, &text(self.bos())?, &text(self.eos())?)
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))
    }

    /// Tokenize `messages` rendered by `template` (with the assistant's turn opened), so that only
    /// the template's own markup yields special tokens. A template refusing the messages (its
    /// `raise_exception`) is an [`EngineError::InvalidRequest`].
    pub fn chat_prompt(
        &self,
        template: &ChatTemplate,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
    ) -> Result<Vec<TokenId>> {
        let pieces = template
            .render_guarded_with_tools(messages, true, self.control_texts(), tools)
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        // Templates that print the BOS text themselves must not get a second BOS.
        let bos_text = self.bos().map(|t| self.token_text(t)).transpose()?.unwrap_or_default();
        let starts_with_bos = matches!(pieces.first(), Some(Piece::Template(t)) if t.starts_with(&bos_text));
        let mut tokens = Vec::new();
        if self.add_bos() && (bos_text.is_empty() || !starts_with_bos) {
            tokens.extend(self.bos());
        }
        for piece in &pieces {
            match piece {
                Piece::Template(t) => tokens.extend(self.tokenize(t, false, true)?),
                Piece::Plain(t) => tokens.extend(self.tokenize(t, false, false)?),
            }
        }
        Ok(tokens)
    }

    /// Texts of the control and unknown tokens, read once per model.
    pub fn control_texts(&self) -> &[String] {
        self.control_texts.get_or_init(|| {
            let vocab = self.raw_vocab();
            let special =
                llama_cpp_sys_2::LLAMA_TOKEN_ATTR_CONTROL | llama_cpp_sys_2::LLAMA_TOKEN_ATTR_UNKNOWN;
            (0..self.vocab_size() as i32)
                .filter(|&id| {
                    // SAFETY: live vocabulary, id below its size.
                    let attr = unsafe { llama_cpp_sys_2::llama_vocab_get_attr(vocab, id) };
                    attr & special != 0
                })
                .filter_map(|id| self.token_text(id as TokenId).ok())
                .filter(|t| !t.is_empty())
                .collect()
        })
    }
}
