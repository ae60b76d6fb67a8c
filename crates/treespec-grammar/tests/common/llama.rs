//! A [`Vocabulary`] from a GGUF model through treespec-llama (shared by the SmolLM2 test and the
//! `mask_cost` example, which includes this file by path).

use std::path::Path;
use std::sync::Arc;

use treespec_grammar::{TokenId, Vocabulary};
use treespec_llama::{LlamaModel, LoadOptions};

/// Load `path` with one thread and a small context: only the vocabulary is needed.
pub fn load_model(path: &Path) -> LlamaModel {
    let options = LoadOptions { threads: 1, ctx_size: 256, n_seq_max: 1, ..LoadOptions::default() };
    LlamaModel::load(path, options).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every token's bytes as generated; control tokens (empty unless rendered as special) become
/// special tokens under their text, end-of-generation tokens the EOS set.
pub fn llama_vocabulary(model: &LlamaModel) -> Vocabulary {
    let n = model.vocab_size() as TokenId;
    let mut tokens = Vec::with_capacity(n as usize);
    let mut special = Vec::new();
    for t in 0..n {
        let plain = model.token_to_bytes(t, false).expect("token in range");
        if plain.is_empty() {
            let text = model.token_to_bytes(t, true).expect("token in range");
            if !text.is_empty() {
                special.push(t);
            }
            tokens.push(text);
        } else {
            tokens.push(plain);
        }
    }
    let eos: Vec<TokenId> = (0..n).filter(|&t| model.is_eog(t)).collect();
    Vocabulary::new(&tokens, &eos, &special).expect("a GGUF vocabulary")
}

/// `vocab` with forced text tokenized by the model's own tokenizer (greedy for non-UTF-8 text).
pub fn with_model_tokenizer(vocab: &Vocabulary, model: Arc<LlamaModel>) -> Vocabulary {
    let greedy = vocab.clone();
    vocab
        .with_tokenizer(Arc::new(move |bytes: &[u8]| match std::str::from_utf8(bytes) {
            Ok(text) => model.tokenize(text, false, false).expect("tokenize"),
            Err(_) => greedy.greedy_tokenize(bytes),
        }))
        .expect("vocabulary")
}
