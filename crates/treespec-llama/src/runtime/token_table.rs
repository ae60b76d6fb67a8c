//! Every token's bytes, for grammar engines (structured output): what a token spells as
//! generated text, which tokens are control tokens, and which end generation.

use treespec_core::TokenId;

use crate::load::LlamaModel;

/// The target's vocabulary as bytes.
#[derive(Debug, Clone)]
pub struct TokenTable {
    /// Token id → the bytes it spells (control tokens: their special text).
    pub tokens: Vec<Vec<u8>>,
    /// End-of-generation tokens.
    pub eos: Vec<TokenId>,
    /// Control tokens (empty as text, non-empty as special text): never matched by grammar text.
    pub special: Vec<TokenId>,
}

impl TokenTable {
    /// Read the table off a loaded model (≈0.1 s for 50k tokens; the runtime keeps it).
    pub fn read(model: &LlamaModel) -> treespec_engine::Result<Self> {
        let n = model.vocab_size() as TokenId;
        let mut tokens = Vec::with_capacity(n as usize);
        let mut special = Vec::new();
        for t in 0..n {
            let plain = model.token_to_bytes(t, false)?;
            if plain.is_empty() {
                let text = model.token_to_bytes(t, true)?;
                if !text.is_empty() {
                    special.push(t);
                }
                tokens.push(text);
            } else {
                tokens.push(plain);
            }
        }
        let eos = (0..n).filter(|&t| model.is_eog(t)).collect();
        Ok(Self { tokens, eos, special })
    }
}
