//! Tokenizer helpers on [`LlamaModel`]: text to ids, ids to bytes, special tokens.
//!
//! Ids are the core's `TokenId` (u32); llama.cpp uses i32 with -1 for "none", which becomes
//! `None` here. Out-of-range ids are checked before reaching llama.cpp, whose vocabulary lookups
//! throw (and so abort) on them.

use llama_cpp_2::token::LlamaToken;
use treespec_core::TokenId;
use treespec_engine::{EngineError, Result};

use crate::load::LlamaModel;

fn opt_token(t: LlamaToken) -> Option<TokenId> {
    u32::try_from(t.0).ok()
}

impl LlamaModel {
    /// Number of tokens in the vocabulary (the logits row length).
    pub fn vocab_size(&self) -> usize {
        self.inner.n_vocab().max(0) as usize
    }

    /// Tokenize `text`. `add_special` adds BOS/EOS as the model's tokenizer config asks (see
    /// [`add_bos`](Self::add_bos)); `parse_special` turns special-token text such as
    /// `<|im_start|>` into its single id instead of tokenizing it as plain text.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<TokenId>> {
        if text.len() > i32::MAX as usize / 2 {
            return Err(EngineError::InvalidRequest(format!(
                "text of {} bytes is too long to tokenize",
                text.len()
            )));
        }
        self.inner
            .vocab()
            .tokenize(text.as_bytes(), add_special, parse_special)
            .into_iter()
            .map(|t| {
                opt_token(t).ok_or_else(|| {
                    EngineError::Backend(format!("llama.cpp tokenizer returned invalid id {}", t.0))
                })
            })
            .collect()
    }

    fn check_id(&self, token: TokenId) -> Result<LlamaToken> {
        if (token as usize) < self.vocab_size() {
            Ok(LlamaToken(token as i32))
        } else {
            Err(EngineError::State(format!(
                "token {token} is outside the vocabulary of {} tokens",
                self.vocab_size()
            )))
        }
    }

    /// The bytes a token stands for when generated (its "piece"). Control tokens (BOS, EOS,
    /// `<|im_end|>`...) render as their text only when `special` is true, else as nothing.
    /// Bytes, not a string: byte-level BPE pieces can be partial UTF-8 sequences.
    pub fn token_to_bytes(&self, token: TokenId, special: bool) -> Result<Vec<u8>> {
        let t = self.check_id(token)?;
        Ok(self.inner.vocab().token_to_piece(t, special, None))
    }

    /// The token's text as stored in the vocabulary (e.g. `Ġthe` for byte-level BPE).
    pub fn token_text(&self, token: TokenId) -> Result<String> {
        let t = self.check_id(token)?;
        Ok(self.inner.vocab().text(t).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default())
    }

    /// Beginning-of-sequence token, if the model has one.
    pub fn bos(&self) -> Option<TokenId> {
        opt_token(self.inner.vocab().bos())
    }

    /// End-of-sequence token, if the model has one.
    pub fn eos(&self) -> Option<TokenId> {
        opt_token(self.inner.vocab().eos())
    }

    /// End-of-turn token (e.g. `<|im_end|>`), if the model defines one.
    pub fn eot(&self) -> Option<TokenId> {
        opt_token(self.inner.vocab().eot())
    }

    /// Whether generation should stop at `token` (EOS, EOT and any other end-of-generation
    /// token the tokenizer config lists). False for out-of-range ids.
    pub fn is_eog(&self, token: TokenId) -> bool {
        self.check_id(token).is_ok_and(|t| self.inner.vocab().is_eog(t))
    }

    /// Whether prompts should start with BOS (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.inner.vocab().should_add_bos()
    }

    /// Whether prompts should end with EOS (`tokenizer.ggml.add_eos_token`).
    pub fn add_eos(&self) -> bool {
        self.inner.vocab().should_add_eos()
    }

    /// llama.cpp's `enum llama_vocab_type` value.
    pub(crate) fn vocab_type_id(&self) -> u32 {
        // SAFETY: the vocab pointer is live for `self`. (llama-cpp-2's `vocab_type()` panics on
        // types it does not list, e.g. PLaMo-2, hence the raw call.)
        unsafe { llama_cpp_sys_2::llama_vocab_type(self.raw_vocab()) as u32 }
    }

    /// Tokenizer family (SentencePiece, byte-level BPE...), as llama.cpp names it.
    pub fn vocab_type(&self) -> String {
        match self.vocab_type_id() {
            llama_cpp_sys_2::LLAMA_VOCAB_TYPE_NONE => "none".into(),
            llama_cpp_sys_2::LLAMA_VOCAB_TYPE_SPM => "spm (SentencePiece)".into(),
            llama_cpp_sys_2::LLAMA_VOCAB_TYPE_BPE => "bpe (byte-level BPE)".into(),
            llama_cpp_sys_2::LLAMA_VOCAB_TYPE_WPM => "wpm (WordPiece)".into(),
            llama_cpp_sys_2::LLAMA_VOCAB_TYPE_UGM => "ugm (Unigram)".into(),
            llama_cpp_sys_2::LLAMA_VOCAB_TYPE_RWKV => "rwkv".into(),
            llama_cpp_sys_2::LLAMA_VOCAB_TYPE_PLAMO2 => "plamo2".into(),
            other => format!("type {other}"),
        }
    }
}
