//! What request preparation reads off a model: nothing that needs tensors.

use std::sync::OnceLock;

use treespec_core::TokenId;
use treespec_grammar::Vocabulary;

use crate::error::PrepareError;
use crate::prompt::Prompt;
use crate::token_table::TokenTable;

/// A model as request preparation sees it. llama.cpp's runtime implements it, and so do the toy
/// models of the tests; a new backend does too, and gets the same preparation as every other.
pub trait PromptModel {
    /// The prompt as tokens: raw text as the tokenizer says (BOS included where its config
    /// asks), chat prompts through the model's chat template. A template refusing the messages
    /// is an [`EngineError::InvalidRequest`](treespec_engine::EngineError::InvalidRequest).
    fn prompt_tokens(&self, prompt: Prompt<'_>) -> treespec_engine::Result<Vec<TokenId>>;
    /// `text` as tokens with no BOS and no special tokens parsed (an opening a call grammar
    /// watches for).
    fn text_tokens(&self, text: &str) -> Vec<TokenId>;
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
