//! [`TokenBytes`]: a token's bytes, from the model's vocabulary — what the engine needs of a
//! tokenizer to release text and match stop strings.

use treespec_core::TokenId;

/// Maps tokens to their bytes (the text of a generation, and its stop strings).
pub trait TokenBytes {
    /// The raw bytes a token decodes to (may be a partial UTF-8 sequence).
    fn token_bytes(&self, token: TokenId) -> Vec<u8>;
}
