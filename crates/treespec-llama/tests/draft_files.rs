//! Cheaper drafts written by llama.cpp's quantizer (`treespec draft quantize / from-target`) on the
//! real SmolLM2 model: the files load, keep the tokenizer (so they pass the draft/target check),
//! lose exactly the dropped layers, and bad requests are errors.

mod common;

use common::*;
use treespec_engine::{generate, EngineError, GenerateRequest, Method, StopConditions};
use treespec_llama::{check_compatible, write_draft, DraftType, LlamaModel};

#[test]
fn layer_dropped_self_draft_drafts_for_its_target() {
    if skip_model_tests("layer_dropped_self_draft_drafts_for_its_target") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("treespec-draft-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("self-draft.gguf");
    let target = model();
    let layers = target.info().n_layer;
    let dropped: Vec<u32> = (layers as u32 / 2..layers as u32).collect();
    write_draft(&model_path(), &out, DraftType::Q4_0, &dropped, 1).unwrap();

    let draft = LlamaModel::load(&out, test_options()).unwrap();
    assert_eq!(draft.info().n_layer, layers - dropped.len());
    assert!(std::fs::metadata(&out).unwrap().len() < std::fs::metadata(model_path()).unwrap().len());
    check_compatible(&draft, target).expect("same tokenizer: a valid draft");

    // It drafts, and greedy output still equals plain decoding (the backend is exact on SmolLM2's
    // Q4_1 target; the draft's own kernels do not matter to the output).
    let prompt = prompt(target);
    let req = GenerateRequest {
        prompt,
        max_new_tokens: 24,
        sampling: Default::default(),
        seed: 0,
        stop: StopConditions::default(),
    };
    let mut plain_lm = target.new_lm().unwrap();
    let mut plain = Method::Plain.build::<treespec_llama::LlamaLm>(None).unwrap();
    let reference = generate(&mut plain_lm, plain.as_mut(), &req, None, &mut |_| true).unwrap();
    let mut lm = target.new_lm().unwrap();
    let mut chain = Method::Chain { k: 3 }.build(Some(draft.new_lm().unwrap())).unwrap();
    let out_chain = generate(&mut lm, chain.as_mut(), &req, None, &mut |_| true).unwrap();
    assert_eq!(out_chain.tokens, reference.tokens);
    assert!(out_chain.stats.draft_forwards > 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_draft_requests_are_errors() {
    if skip_model_tests("bad_draft_requests_are_errors") {
        return;
    }
    let missing = std::path::Path::new("/nonexistent/model.gguf");
    let tmp = std::env::temp_dir().join("treespec-never-written.gguf");
    assert!(write_draft(missing, &tmp, DraftType::Q4_0, &[], 1).is_err());
    let e =
        write_draft(&model_path(), std::path::Path::new("/nonexistent/dir/x.gguf"), DraftType::Q4_0, &[], 1)
            .unwrap_err();
    assert!(matches!(e, EngineError::InvalidRequest(ref m) if m.contains("no such directory")), "{e}");
    let e = write_draft(&model_path(), &model_path(), DraftType::Copy, &[], 1).unwrap_err();
    assert!(e.to_string().contains("new file"), "{e}");
    assert!(DraftType::parse("q3_x").is_err());
    assert_eq!(DraftType::parse("Q4_0").unwrap(), DraftType::Q4_0);
}
