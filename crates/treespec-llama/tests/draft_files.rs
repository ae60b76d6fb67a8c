//! Cheaper drafts written by llama.cpp's quantizer (`treespec draft quantize / from-target`) on the
//! real SmolLM2 model: the files load, keep the tokenizer (so they pass the draft/target check),
//! lose exactly the dropped layers, and bad requests (missing layers, every layer, an existing
//! output without `force`) are errors that leave no file behind.

mod common;

use common::*;
use treespec_engine::{generate, EngineError, GenerateRequest, Method, StopConditions};
use treespec_llama::{check_compatible, write_draft, DraftOptions, DraftType, LlamaModel};

fn opts(kind: DraftType, drop_layers: &[u32]) -> DraftOptions {
    DraftOptions { kind, drop_layers: drop_layers.to_vec(), threads: 1, force: false }
}

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
    write_draft(&model_path(), &out, &opts(DraftType::Q4_0, &dropped)).unwrap();

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
    assert!(write_draft(missing, &tmp, &opts(DraftType::Q4_0, &[])).is_err());
    let e = write_draft(
        &model_path(),
        std::path::Path::new("/nonexistent/dir/x.gguf"),
        &opts(DraftType::Q4_0, &[]),
    )
    .unwrap_err();
    assert!(matches!(e, EngineError::InvalidRequest(ref m) if m.contains("no such directory")), "{e}");
    let e = write_draft(&model_path(), &model_path(), &opts(DraftType::Copy, &[])).unwrap_err();
    assert!(e.to_string().contains("new file"), "{e}");
    assert!(DraftType::parse("q3_x").is_err());
    assert_eq!(DraftType::parse("Q4_0").unwrap(), DraftType::Q4_0);
}

/// Issue #15 rows 1 and 4: dropping every layer (a 0-layer file that aborted whatever loaded it)
/// or layers the model does not have (silently a full copy) is refused, naming the valid range.
#[test]
fn dropped_layers_must_exist_and_leave_a_model() {
    if skip_model_tests("dropped_layers_must_exist_and_leave_a_model") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("treespec-draft-layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("draft.gguf");
    let n = model().info().n_layer as u32;
    let every: Vec<u32> = (0..n).collect();
    let e = write_draft(&model_path(), &out, &opts(DraftType::Copy, &every)).unwrap_err().to_string();
    assert!(e.contains(&format!("all {n} layers")) && e.contains(&format!("0-{}", n - 1)), "{e}");
    let e =
        write_draft(&model_path(), &out, &opts(DraftType::Copy, &[100, 150, 200])).unwrap_err().to_string();
    assert!(e.contains("layer 100") && e.contains(&format!("0-{}", n - 1)), "{e}");
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no partial file left behind");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue #15 row 3: an existing output is never overwritten without `force`.
#[test]
fn existing_outputs_are_kept_unless_forced() {
    if skip_model_tests("existing_outputs_are_kept_unless_forced") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("treespec-draft-force-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("existing.txt");
    std::fs::write(&out, "precious").unwrap();
    let n = model().info().n_layer as u32;
    let e = write_draft(&model_path(), &out, &opts(DraftType::Copy, &[n - 1])).unwrap_err().to_string();
    assert!(e.contains("already exists") && e.contains("--force"), "{e}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "precious");
    let forced = DraftOptions { force: true, ..opts(DraftType::Copy, &[n - 1]) };
    write_draft(&model_path(), &out, &forced).unwrap();
    assert_eq!(LlamaModel::load(&out, test_options()).unwrap().info().n_layer, n as usize - 1);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no partial file left behind");
    std::fs::remove_dir_all(&dir).unwrap();
}
