//! Shared helpers: toy vocabularies and a mask-driven random walk.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use treespec_grammar::{Constraint, TokenId, Vocabulary};

/// Multi-byte tokens of the toy vocabulary (after the 256 single bytes).
pub const WORDS: &[&str] = &[
    "{\"", "name", "\": \"", "\"name\"", "age", "\", \"", "\"}", "true", "false", "null", "\": ", ", \"",
    "12", "tags", "ok", "\"a\"",
];

/// 256 single-byte tokens, then [`WORDS`], then the EOS `<|end|>` (special) and an unused
/// special `<|pad|>`. Returns the vocabulary and the EOS id.
pub fn toy_vocab() -> (Vocabulary, TokenId) {
    let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    tokens.extend(WORDS.iter().map(|w| w.as_bytes().to_vec()));
    let eos = tokens.len() as TokenId;
    tokens.push(b"<|end|>".to_vec());
    tokens.push(b"<|pad|>".to_vec());
    let vocab = Vocabulary::new(&tokens, &[eos], &[eos + 1]).unwrap();
    (vocab, eos)
}

/// Only the 256 single-byte tokens and EOS (id 256).
pub fn byte_vocab() -> (Vocabulary, TokenId) {
    let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    tokens.push(b"<|end|>".to_vec());
    (Vocabulary::new(&tokens, &[256], &[]).unwrap(), 256)
}

/// Walk the grammar by picking a random allowed token at every step until EOS. Checks on the
/// way that the mask, `is_allowed` and `could_follow` agree. Returns the tokens (EOS last).
pub fn random_walk(c: &mut Constraint, seed: u64, max_steps: usize) -> Vec<TokenId> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut path = Vec::new();
    while !c.is_finished() {
        assert!(path.len() < max_steps, "no end after {max_steps} tokens: {}", c.vocab().decode(&path));
        let allowed: Vec<TokenId> = c.mask().unwrap().iter().collect();
        assert!(!allowed.is_empty(), "empty mask after {:?}", c.vocab().decode(&path));
        let t = allowed[rng.random_range(0..allowed.len())];
        assert!(c.is_allowed(t).unwrap());
        c.advance(t).unwrap();
        path.push(t);
    }
    path
}
