//! The toy models' side of preparation ([`ToyPromptModel`]): the server's toy backend and the
//! benchmark's toy backend prepare their requests through it, as llama.cpp's models do through
//! the runtime.

use treespec_core::TokenId;
use treespec_text::ChatMessage;

use crate::error::PrepareError;
use crate::model::{PromptModel, VocabularyCache};
use crate::prompt::Prompt;
use crate::token_table::TokenTable;

/// A toy "tokenizer": each byte of the text maps onto the vocabulary (byte mod its size); the
/// "chat template" is `role: content` lines, then `assistant:` (it renders no tools); token `t`
/// reads as the letter `'a' + t` ([`ToyPromptModel::letter`]). The toys
/// have no end token and no vocabulary a grammar compiles against: structured output is refused
/// ([`PrepareError::NoGrammar`]), tool calls stay free text.
#[derive(Debug, Clone, Copy)]
pub struct ToyPromptModel {
    /// Vocabulary size (≥ 1).
    pub vocab: usize,
    /// Whether a draft model is there for the methods that run one.
    pub has_draft: bool,
}

impl ToyPromptModel {
    /// `text` byte by byte onto the vocabulary.
    pub fn tokens(&self, text: &str) -> Vec<TokenId> {
        let vocab = self.vocab.max(1) as u32;
        text.bytes().map(|b| b as u32 % vocab).collect()
    }

    /// Token `t` as text: the letter `'a' + t` (mod 26).
    pub fn letter(token: TokenId) -> Vec<u8> {
        vec![b'a' + (token % 26) as u8]
    }

    /// The toy chat template.
    pub fn render(messages: &[ChatMessage]) -> String {
        let mut s: String = messages.iter().map(|m| format!("{}: {}\n", m.role, m.content)).collect();
        s.push_str("assistant:");
        s
    }
}

/// No toy has a vocabulary for grammars: nothing is ever kept here.
static NO_VOCABULARY: VocabularyCache = VocabularyCache::new();

impl PromptModel for ToyPromptModel {
    fn prompt_tokens(&self, prompt: Prompt<'_>) -> treespec_engine::Result<Vec<TokenId>> {
        Ok(self.tokens(&self.prompt_text(prompt).unwrap_or_default()))
    }

    fn tokenize(
        &self,
        text: &str,
        _add_special: bool,
        _parse_special: bool,
    ) -> treespec_engine::Result<Vec<TokenId>> {
        // The toys have no special tokens.
        Ok(self.tokens(text))
    }

    fn token_piece(&self, token: TokenId) -> treespec_engine::Result<Vec<u8>> {
        Ok(Self::letter(token))
    }

    fn prompt_text(&self, prompt: Prompt<'_>) -> Result<String, PrepareError> {
        Ok(match prompt {
            Prompt::Text(t) => t.to_string(),
            Prompt::User(t) => Self::render(&[ChatMessage::new("user", t)]),
            Prompt::Messages(m) | Prompt::MessagesWithTools(m, _) => Self::render(m),
        })
    }

    fn model_path(&self) -> String {
        "toy".into()
    }

    fn vocab_size(&self) -> usize {
        self.vocab.max(1)
    }

    fn eos_tokens(&self) -> &[TokenId] {
        &[]
    }

    fn has_draft(&self) -> bool {
        self.has_draft
    }

    fn token_table(&self) -> Result<&TokenTable, PrepareError> {
        Err(PrepareError::NoGrammar(
            "structured output needs a model vocabulary and the toy backend has none".into(),
        ))
    }

    fn vocabulary_cache(&self) -> &VocabularyCache {
        &NO_VOCABULARY
    }
}
