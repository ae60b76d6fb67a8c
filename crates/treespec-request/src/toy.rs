//! The toy models' side of preparation ([`ToyPromptModel`]): the server's toy backend and the
//! benchmark's toy backend prepare their requests through it, as llama.cpp's models do through
//! the runtime.

use std::sync::OnceLock;

use treespec_core::TokenId;
use treespec_engine::TokenBytes;
use treespec_text::ChatMessage;

use crate::error::PrepareError;
use crate::model::{PromptModel, VocabularyCache};
use crate::prompt::Prompt;
use crate::token_table::TokenTable;

/// A toy "tokenizer": each byte of the text maps onto the vocabulary (byte mod its size); the
/// "chat template" is `role: content` lines, then `assistant:` (it renders no tools); token `t`
/// reads as the letter `'a' + t` ([`ToyPromptModel::letter`]). These toys
/// have no end token and no vocabulary a grammar compiles against: structured output is refused
/// ([`PrepareError::NoGrammar`]), tool calls stay free text.
///
/// The JSON toy (`json`, [`JSON_VOCAB`] tokens) has both: token `t` spells [`JSON_ALPHABET`]'s
/// `t`-th byte and the last token is the end token, so grammars compile against it and JSON
/// answers (small objects, tool calls) decode on it.
#[derive(Debug, Clone, Copy)]
pub struct ToyPromptModel {
    /// Vocabulary size (≥ 1; [`JSON_VOCAB`] for the JSON toy).
    pub vocab: usize,
    /// Whether a draft model is there for the methods that run one.
    pub has_draft: bool,
    /// The JSON toy: tokens spell [`JSON_ALPHABET`], then the end token.
    pub json: bool,
}

/// The JSON toy's token bytes: JSON's punctuation, a space, and the letters of small objects and
/// tool calls (`{"name": "get_weather", "arguments": {"city": "Paris"}}`).
pub const JSON_ALPHABET: &[u8; 25] = b"{}\":, aceghilmnorstuwyOP_";

/// The JSON toy's vocabulary: [`JSON_ALPHABET`] and the end token after it.
pub const JSON_VOCAB: usize = JSON_ALPHABET.len() + 1;

/// The JSON toy's end token (the last), and its text.
const JSON_END: [TokenId; 1] = [JSON_ALPHABET.len() as TokenId];
const JSON_END_TEXT: &[u8] = b"<|end|>";

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

    /// Token `t`'s bytes on this toy: a letter ([`Self::letter`]), or on the JSON toy its byte of
    /// [`JSON_ALPHABET`] (the end token: `<|end|>`).
    pub fn piece(&self, token: TokenId) -> Vec<u8> {
        if !self.json {
            return Self::letter(token);
        }
        match JSON_ALPHABET.get(token as usize) {
            Some(&b) => vec![b],
            None => JSON_END_TEXT.to_vec(),
        }
    }

    /// The JSON toy's token table (built once).
    fn json_table(&self) -> Result<&'static TokenTable, PrepareError> {
        static TABLE: OnceLock<TokenTable> = OnceLock::new();
        if self.vocab != JSON_VOCAB {
            return Err(PrepareError::NoGrammar(format!(
                "the JSON toy has {JSON_VOCAB} tokens, not {}",
                self.vocab
            )));
        }
        Ok(TABLE.get_or_init(|| TokenTable {
            tokens: (0..JSON_VOCAB as TokenId).map(|t| self.piece(t)).collect(),
            eos: JSON_END.to_vec(),
            special: JSON_END.to_vec(),
        }))
    }

    /// The toy chat template.
    pub fn render(messages: &[ChatMessage]) -> String {
        let mut s: String = messages.iter().map(|m| format!("{}: {}\n", m.role, m.content)).collect();
        s.push_str("assistant:");
        s
    }
}

/// The toys' token bytes, for their text and stop strings ([`ToyPromptModel::piece`]).
impl TokenBytes for ToyPromptModel {
    fn token_bytes(&self, token: TokenId) -> Vec<u8> {
        self.piece(token)
    }
}

/// Only the JSON toy has a vocabulary for grammars: nothing else is ever kept here.
static NO_VOCABULARY: VocabularyCache = VocabularyCache::new();
/// The JSON toy's grammar vocabulary.
static JSON_VOCABULARY: VocabularyCache = VocabularyCache::new();

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
        Ok(self.piece(token))
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
        if self.json {
            &JSON_END
        } else {
            &[]
        }
    }

    fn has_draft(&self) -> bool {
        self.has_draft
    }

    fn token_table(&self) -> Result<&TokenTable, PrepareError> {
        if self.json {
            return self.json_table();
        }
        Err(PrepareError::NoGrammar(
            "structured output needs a model vocabulary and the toy backend has none".into(),
        ))
    }

    fn vocabulary_cache(&self) -> &VocabularyCache {
        // Only a JSON toy of the right size keeps one (another one's table is refused).
        if self.json && self.vocab == JSON_VOCAB {
            &JSON_VOCABULARY
        } else {
            &NO_VOCABULARY
        }
    }
}
