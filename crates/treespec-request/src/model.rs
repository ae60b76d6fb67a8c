//! What request preparation reads off a model: nothing that needs tensors.

use std::sync::OnceLock;

use treespec_core::TokenId;
use treespec_grammar::Vocabulary;

use crate::error::PrepareError;
use crate::prompt::Prompt;
use crate::token_table::TokenTable;

/// A model as request preparation sees it, and the one model trait the server reads (its
/// llama-server routes: tokenizer, pieces, chat template, model file). llama.cpp's runtime
/// implements it, and so do the toy models of the tests; a new backend does too, and gets the
/// same preparation as every other.
pub trait PromptModel {
    /// The prompt as tokens: raw text as the tokenizer says (BOS included where its config
    /// asks), chat prompts through the model's chat template. A template refusing the messages
    /// is an [`EngineError::InvalidRequest`](treespec_engine::EngineError::InvalidRequest).
    fn prompt_tokens(&self, prompt: Prompt<'_>) -> treespec_engine::Result<Vec<TokenId>>;
    /// `text` as tokens with no BOS and no special tokens parsed (an opening a call grammar
    /// watches for).
    fn text_tokens(&self, text: &str) -> Vec<TokenId> {
        self.tokenize(text, false, false).unwrap_or_default()
    }
    /// `text` as tokens: `add_special` adds BOS (as the tokenizer config asks), `parse_special`
    /// turns special-token text (`<|im_start|>`) into its token (llama-server's `/tokenize`).
    /// A text the tokenizer refuses is an
    /// [`EngineError::InvalidRequest`](treespec_engine::EngineError::InvalidRequest).
    fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> treespec_engine::Result<Vec<TokenId>>;
    /// A token of the vocabulary as bytes, special tokens as their text (`/detokenize`).
    fn token_piece(&self, token: TokenId) -> treespec_engine::Result<Vec<u8>>;
    /// The prompt as text, ending where the reply starts: chat prompts through the chat
    /// template (the text [`Self::prompt_tokens`] tokenizes; `/apply-template`), raw text as it
    /// is. No template, or one refusing the messages, is a [`PrepareError::Template`].
    fn prompt_text(&self, prompt: Prompt<'_>) -> Result<String, PrepareError>;
    /// The model file (`/props`).
    fn model_path(&self) -> String;
    /// The chat template's source, if the model has one.
    fn chat_template_source(&self) -> Option<String> {
        None
    }
    /// Whether the chat template describes tools itself (else their description goes in front
    /// as a system note).
    fn renders_tools(&self) -> bool {
        false
    }
    /// Tokens in the target's vocabulary.
    fn vocab_size(&self) -> usize;
    /// The target's end-of-generation tokens.
    fn eos_tokens(&self) -> &[TokenId];
    /// Whether a draft model is loaded (for the methods that run one).
    fn has_draft(&self) -> bool;
    /// Every token's bytes, for grammars; [`PrepareError::NoGrammar`] (saying why) where the
    /// model has none to compile a grammar against.
    fn token_table(&self) -> Result<&TokenTable, PrepareError>;
    /// Where the grammar vocabulary built from [`Self::token_table`] is kept between requests.
    fn vocabulary_cache(&self) -> &VocabularyCache;
}

/// The vocabulary grammars compile against, built from the token table on first use and kept
/// (≈0.1 s for 150k tokens).
#[derive(Debug, Default)]
pub struct VocabularyCache(OnceLock<Vocabulary>);

impl VocabularyCache {
    /// An empty cache (a `static` one for models without a vocabulary).
    pub const fn new() -> Self {
        Self(OnceLock::new())
    }

    /// The vocabulary of `model`, built on first use.
    pub fn get<M: PromptModel + ?Sized>(model: &M) -> Result<&Vocabulary, PrepareError> {
        let cache = model.vocabulary_cache();
        if let Some(v) = cache.0.get() {
            return Ok(v);
        }
        let table = model.token_table()?;
        let vocab = Vocabulary::new(&table.tokens, &table.eos, &table.special)
            .map_err(|e| PrepareError::Internal(format!("grammar vocabulary: {e}")))?;
        Ok(cache.0.get_or_init(|| vocab))
    }
}
