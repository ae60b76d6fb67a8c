//! The real SmolLM2-135M vocabulary (49152 byte-level BPE tokens): masks and forced tokens of a
//! one-key schema, and schema-valid random walks. Needs `models/SmolLM2-135M-Instruct.Q4_1.gguf`
//! (scripts/fetch-models.sh); set TREESPEC_SKIP_MODEL_TESTS=1 to skip when it is missing.

mod common;
#[path = "common/llama.rs"]
mod llama;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use serde_json::{json, Value};
use treespec_grammar::{GrammarSpec, Vocabulary};
use treespec_llama::LlamaModel;

fn model() -> Option<&'static (Arc<LlamaModel>, Vocabulary)> {
    static MODEL: OnceLock<Option<(Arc<LlamaModel>, Vocabulary)>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
            if !p.exists() {
                if std::env::var("TREESPEC_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
                    eprintln!("skipping: {} is missing and TREESPEC_SKIP_MODEL_TESTS=1", p.display());
                    return None;
                }
                panic!(
                    "{} is missing: run scripts/fetch-models.sh (or set TREESPEC_SKIP_MODEL_TESTS=1)",
                    p.display()
                );
            }
            let model = llama::load_model(&p);
            let vocab = llama::llama_vocabulary(&model);
            Some((Arc::new(model), vocab))
        })
        .as_ref()
}

fn name_schema() -> GrammarSpec {
    GrammarSpec::JsonSchema(json!({
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"]
    }))
}

#[test]
fn start_mask_allows_only_brace_tokens_and_forces_the_key() {
    let Some((model, vocab)) = model() else { return };
    assert_eq!(vocab.size(), 49152);
    for vocab in [vocab.clone(), llama::with_model_tokenizer(vocab, model.clone())] {
        let mut c = name_schema().compile(&vocab).unwrap().constraint();
        let allowed: Vec<u32> = c.mask().unwrap().iter().collect();
        assert!(!allowed.is_empty());
        for &t in &allowed {
            assert!(vocab.token_bytes(t).starts_with(b"{"), "token {t} {:?}", vocab.decode(&[t]));
        }
        // The whole start `{"name": "` is fixed; the forced tokens spell at least `{"name"`.
        let forced = c.forced_tokens(32).unwrap();
        let text = vocab.decode(&forced);
        assert!(text.starts_with("{\"name\"") && "{\"name\": \"".starts_with(&text), "forced {text:?}");
        // After the brace alone (byte-level vocabulary view: no forcing) the key is forced too.
        let free = vocab.without_forcing().unwrap();
        let mut c = name_schema().compile(&free).unwrap().constraint();
        let brace = model.tokenize("{", false, false).unwrap();
        assert_eq!(brace.len(), 1);
        assert!(c.is_allowed(brace[0]).unwrap() && c.mask().unwrap().count() > 1);
        c.advance(brace[0]).unwrap();
        let quote = model.tokenize("\"", false, false).unwrap()[0];
        assert!(c.is_allowed(quote).unwrap());
        for t in c.mask().unwrap().iter() {
            let b = vocab.token_bytes(t);
            assert!(
                b"\"name\": \"".starts_with(b) || b.starts_with(b"\"name\": \""),
                "{:?}",
                vocab.decode(&[t])
            );
        }
    }
}

#[test]
fn random_walks_on_the_real_vocabulary_give_valid_json() {
    let Some((_, vocab)) = model() else { return };
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "n": {"type": "integer", "minimum": -1000, "maximum": 1000},
            "kind": {"enum": ["cat", "dog"]}
        },
        "required": ["name", "n", "kind"],
        "additionalProperties": false
    });
    let grammar = GrammarSpec::JsonSchema(schema).compile(vocab).unwrap();
    for seed in 0..8 {
        let mut c = grammar.constraint();
        let path = common::random_walk(&mut c, seed, 300);
        assert!(vocab.is_eos(*path.last().unwrap()));
        let text = vocab.decode(&path);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(v["name"].as_str().is_some_and(|s| s.chars().count() <= 12), "{text}");
        assert!(v["n"].as_i64().is_some_and(|n| (-1000..=1000).contains(&n)), "{text}");
        assert!(["cat", "dog"].contains(&v["kind"].as_str().unwrap()), "{text}");
        assert_eq!(v.as_object().unwrap().len(), 3, "{text}");
    }
}
