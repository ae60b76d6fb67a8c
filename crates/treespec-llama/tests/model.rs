//! Tokenizer, metadata and compatibility helpers on the real SmolLM2 model.

mod common;

use common::*;
use treespec_engine::EngineError;
use treespec_llama::check_compatible;

#[test]
fn tokenizer_round_trip_and_special_tokens() {
    if skip_model_tests("tokenizer_round_trip_and_special_tokens") {
        return;
    }
    let m = model();
    let text = "Hello world! 12345 naïve café";
    let ids = m.tokenize(text, false, false).unwrap();
    assert!(!ids.is_empty());
    let bytes: Vec<u8> = ids.iter().flat_map(|&t| m.token_to_bytes(t, false).unwrap()).collect();
    assert_eq!(String::from_utf8(bytes).unwrap(), text);
    // SmolLM2 splits digits one by one.
    let digits = m.tokenize("12345", false, false).unwrap();
    assert_eq!(digits.len(), 5);

    assert_eq!(m.vocab_size(), 49152);
    assert_eq!(m.bos(), Some(1));
    assert_eq!(m.eos(), Some(2));
    assert!(!m.add_bos());
    assert!(m.is_eog(2));
    assert!(!m.is_eog(ids[0]));
    assert!(!m.is_eog(u32::MAX));
    // Special-token text becomes one id only when asked.
    let im = m.tokenize("<|im_end|>", false, true).unwrap();
    assert_eq!(im.len(), 1);
    assert!(m.is_eog(im[0]), "<|im_end|> ends a turn");
    assert!(m.tokenize("<|im_end|>", false, false).unwrap().len() > 1);
    assert_eq!(m.token_to_bytes(im[0], true).unwrap(), b"<|im_end|>");
    assert!(m.token_to_bytes(im[0], false).unwrap().is_empty());
    assert!(matches!(m.token_to_bytes(49152, false), Err(EngineError::State(_))));
    assert!(m.token_text(im[0]).unwrap() == "<|im_end|>");
}

#[test]
fn metadata() {
    if skip_model_tests("metadata") {
        return;
    }
    let m = model();
    let info = m.info();
    eprintln!("{info:#?}");
    assert_eq!(info.architecture.as_deref(), Some("llama"));
    assert!(info.file_type.contains("Q4_1"), "{}", info.file_type);
    assert_eq!(info.n_layer, 30);
    assert_eq!(info.n_embd, 576);
    assert_eq!((info.n_head, info.n_head_kv), (9, 3));
    assert!((130_000_000..140_000_000).contains(&info.n_params), "{}", info.n_params);
    assert_eq!(info.file_bytes, 98_362_432);
    assert!(info.vocab_type.starts_with("bpe"));
    assert!(m.chat_template().unwrap().contains("<|im_start|>"));
    assert!(m.metadata().iter().any(|(k, v)| k == "general.architecture" && v == "llama"));
    assert_eq!(m.gguf_facts().architecture.as_deref(), Some("llama"));
    assert!(m.meta("no.such.key").is_none());
}

#[test]
fn a_model_is_compatible_with_itself() {
    if skip_model_tests("a_model_is_compatible_with_itself") {
        return;
    }
    check_compatible(model(), model()).unwrap();
}

/// `--rope-*` overrides reach llama.cpp's contexts: the model file's own base frequency gives the
/// same logits as no override, another one different logits.
#[test]
fn rope_overrides_reach_the_context() {
    if skip_model_tests("rope_overrides_reach_the_context") {
        return;
    }
    use treespec_engine::{CausalLm, TreeBatch};
    use treespec_llama::{LlamaModel, LoadOptions, RopeOptions};
    let logits = |rope: RopeOptions| {
        let m = LlamaModel::load(model_path(), LoadOptions { rope, ..test_options() }).unwrap();
        let mut lm = m.new_lm().unwrap();
        lm.prefill(&prompt(&m)).unwrap();
        lm.forward(&TreeBatch::chain(&[1000], None, 0, false)).unwrap().row(0).to_vec()
    };
    let own = logits(RopeOptions::default());
    // SmolLM2-135M's rope.freq_base.
    let same =
        logits(RopeOptions { freq_base: Some(100_000.0), freq_scale: Some(1.0), ..Default::default() });
    assert!(max_abs_diff(&own, &same) < 1e-4, "the file's own settings changed the logits");
    let other = logits(RopeOptions { freq_base: Some(10_000.0), ..Default::default() });
    assert!(max_abs_diff(&own, &other) > 1e-2, "another base frequency left the logits unchanged");
}

/// `--override-kv` reaches the load: SmolLM2's file says not to add BOS, the override says to.
#[test]
fn metadata_overrides_reach_the_load() {
    if skip_model_tests("metadata_overrides_reach_the_load") {
        return;
    }
    use treespec_llama::{KvOverride, LlamaModel, LoadOptions};
    let add_bos = KvOverride::parse("tokenizer.ggml.add_bos_token=bool:true").unwrap();
    let options = LoadOptions { kv_overrides: vec![add_bos], ..test_options() };
    let m = LlamaModel::load(model_path(), options).unwrap();
    assert!(m.add_bos(), "the override did not reach llama.cpp");
    assert!(!model().add_bos(), "the file itself says no BOS");
}
