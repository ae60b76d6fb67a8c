//! [`Vocabulary`]: the target model's token table as llguidance needs it.
//!
//! llguidance works on bytes: a token trie ([`TokTrie`]) maps every token id to the bytes it
//! stands for, and the mask for a grammar state is the set of tokens whose bytes the grammar can
//! take next. We build that trie from plain byte strings (not from a `tokenizer.json`) so that
//! treespec-llama can feed it `LlamaModel::token_to_bytes` for every id of a GGUF vocabulary,
//! and tests can build toy vocabularies by hand.

use std::fmt;
use std::sync::Arc;

use llguidance::ParserFactory;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::GrammarError;

/// Turns bytes into the model's own token ids. Used only for forced text (see
/// [`Vocabulary::with_tokenizer`]).
pub type TokenizeFn = Arc<dyn Fn(&[u8]) -> Vec<TokenId> + Send + Sync>;

/// How forced text (text the grammar fixes, e.g. a required key) is split into tokens.
#[derive(Clone)]
enum Forcing {
    /// Longest-match tokenization through the trie.
    Greedy,
    /// The model's own tokenizer.
    Custom(TokenizeFn),
    /// No forcing: masks allow every tokenization of forced text, no fast-forward tokens.
    Off,
}

/// The [`TokenizerEnv`] llguidance asks for: the trie plus a tokenizer for forced bytes.
struct Env {
    trie: TokTrie,
    forcing: Forcing,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match &self.forcing {
            Forcing::Custom(f) => f(s),
            Forcing::Greedy | Forcing::Off => self.trie.greedy_tokenize(s),
        }
    }

    /// llguidance computes fast-forward tokens (and narrows the mask to the first of them) only
    /// for tokenizers it may call canonical.
    fn tokenize_is_canonical(&self) -> bool {
        !matches!(self.forcing, Forcing::Off)
    }
}

/// A target model's token table, compiled once per model and shared by every request
/// (cloning is cheap: two `Arc`s).
///
/// Token bytes are what the token stands for when generated: raw bytes for byte-level BPE
/// (possibly partial UTF-8), the decoded piece for SentencePiece. Special tokens (BOS, EOS,
/// `<|im_end|>`...) are stored behind llguidance's `0xFF` marker so that grammar text can never
/// match them; a grammar only ever allows them as EOS (or by explicit `<|name|>` in Lark).
/// Tokens with empty bytes are never allowed, except EOS.
///
/// **Forcing.** When the grammar fixes the next bytes (the `"name":` after `{` in a schema with
/// one required key), llguidance splits them into tokens and the mask then allows only the
/// first of those tokens, keeping the model on one tokenization of the fixed text. Those are
/// the [`Constraint::forced_tokens`](crate::Constraint::forced_tokens), free drafts with
/// acceptance 1. The split is greedy longest-match by default;
/// [`with_tokenizer`](Self::with_tokenizer) plugs in the model's tokenizer and
/// [`without_forcing`](Self::without_forcing) turns forcing off (pure byte-level masks, no
/// forced tokens). The choice is part of the constrained target distribution: speculative
/// decoding is lossless against plain constrained decoding with the same `Vocabulary`.
#[derive(Clone)]
pub struct Vocabulary {
    env: TokEnv,
    factory: Arc<ParserFactory>,
    eos: Vec<TokenId>,
}

impl fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vocabulary").field("size", &self.size()).field("eos", &self.eos).finish()
    }
}

impl Vocabulary {
    /// Build from the bytes of every token (`tokens[id]`), the end-of-generation ids (EOS, EOT,
    /// `<|im_end|>`...; at least one) and the ids of special tokens (EOS ids are special
    /// whether listed or not). Special tokens' bytes are their text (`<|im_end|>`), used only
    /// for debugging output.
    pub fn new(tokens: &[Vec<u8>], eos: &[TokenId], special: &[TokenId]) -> Result<Self, GrammarError> {
        Self::build(tokens, eos, special, Forcing::Greedy)
    }

    /// The same vocabulary with forced text tokenized by `tokenize` (e.g. llama.cpp's
    /// tokenizer without special-token parsing) instead of greedy longest match.
    pub fn with_tokenizer(&self, tokenize: TokenizeFn) -> Result<Self, GrammarError> {
        self.rebuild(Forcing::Custom(tokenize))
    }

    /// The same vocabulary with forcing off: masks allow every tokenization of forced text and
    /// there are no forced tokens.
    pub fn without_forcing(&self) -> Result<Self, GrammarError> {
        self.rebuild(Forcing::Off)
    }

    fn rebuild(&self, forcing: Forcing) -> Result<Self, GrammarError> {
        let trie = self.env.tok_trie().clone();
        Self::from_trie(trie, self.eos.clone(), forcing)
    }

    fn build(
        tokens: &[Vec<u8>],
        eos: &[TokenId],
        special: &[TokenId],
        forcing: Forcing,
    ) -> Result<Self, GrammarError> {
        let n = u32::try_from(tokens.len())
            .ok()
            .filter(|&n| n > 0 && n < (1 << 24))
            .ok_or_else(|| GrammarError::BadVocabulary(format!("{} tokens (want 1..2^24)", tokens.len())))?;
        let Some(&first_eos) = eos.first() else {
            return Err(GrammarError::BadVocabulary("no end-of-generation token".into()));
        };
        if let Some(bad) = eos.iter().chain(special).find(|&&t| t >= n) {
            return Err(GrammarError::BadVocabulary(format!("token {bad} is outside the {n} tokens")));
        }
        let mut words: Vec<Vec<u8>> = tokens.to_vec();
        for &t in eos.iter().chain(special) {
            mark_special(&mut words[t as usize], t);
        }
        let info = TokRxInfo::new(n, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        Self::from_trie(trie, eos.to_vec(), forcing)
    }

    fn from_trie(trie: TokTrie, eos: Vec<TokenId>, forcing: Forcing) -> Result<Self, GrammarError> {
        let env: TokEnv = Arc::new(Env { trie, forcing });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::BadVocabulary(e.to_string()))?;
        // Warnings and errors come back through `Result`s; nothing goes to stderr. Errors carry
        // no parser state (a client may see them). The other limits stay llguidance's: they
        // bound the compiled size, the lexer's work and each mask's Earley items.
        factory.quiet();
        factory.limits_mut().verbose_errors = false;
        Ok(Self { env, factory: Arc::new(factory), eos })
    }

    /// Number of token ids (the logits row length).
    pub fn size(&self) -> usize {
        self.env.tok_trie().vocab_size()
    }

    /// End-of-generation ids; the grammar allows them exactly where it can end.
    pub fn eos(&self) -> &[TokenId] {
        &self.eos
    }

    /// Whether `token` ends generation.
    pub fn is_eos(&self, token: TokenId) -> bool {
        self.eos.contains(&token)
    }

    /// The bytes `token` stands for (special tokens: their text behind the `0xFF` marker).
    pub fn token_bytes(&self, token: TokenId) -> &[u8] {
        self.env.tok_trie().token(token)
    }

    /// The text of `tokens` with special tokens left out (lossy UTF-8).
    pub fn decode(&self, tokens: &[TokenId]) -> String {
        String::from_utf8_lossy(&self.env.tok_trie().decode_ext(tokens, false)).into_owned()
    }

    /// Longest-match tokenization of `bytes` through the trie (the default split of forced
    /// text; also a fallback for a custom tokenizer on bytes it cannot take).
    pub fn greedy_tokenize(&self, bytes: &[u8]) -> Vec<TokenId> {
        self.env.tok_trie().greedy_tokenize(bytes)
    }

    pub(crate) fn factory(&self) -> &ParserFactory {
        &self.factory
    }

    pub(crate) fn trie(&self) -> &TokTrie {
        self.env.tok_trie()
    }
}

/// Put llguidance's special-token marker in front of a special token's bytes. Nameless special
/// tokens get `<[id]>` so that they stay distinct in the trie.
fn mark_special(word: &mut Vec<u8>, id: TokenId) {
    if word.first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER) {
        return;
    }
    if word.is_empty() {
        word.extend_from_slice(format!("<[{id}]>").as_bytes());
    }
    word.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
}
