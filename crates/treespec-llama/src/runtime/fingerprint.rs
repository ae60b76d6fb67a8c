//! The tokenizer fingerprint: which tokenizer an n-gram table or a saved suffix history was built
//! with, so that a file made for another vocabulary is refused instead of drafting garbage.

use treespec_core::ngram::TokenizerId;
use treespec_engine::Result;

use crate::load::LlamaModel;

/// A fingerprint of a model's tokenizer: every token's text, hashed (FNV-1a), and the vocab size.
/// Reads the whole vocabulary (tens of milliseconds on a 150k vocabulary), so
/// [`crate::ModelRuntime::tokenizer_id`] computes it once per runtime.
pub fn tokenizer_id(model: &LlamaModel) -> Result<TokenizerId> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let n = model.vocab_size();
    for t in 0..n as u32 {
        for b in model.token_text(t)?.bytes().chain(std::iter::once(0xff)) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(TokenizerId { fingerprint: h, vocab: n as u32 })
}
