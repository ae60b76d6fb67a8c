//! Checks on the Qwen2.5-Coder pair (1.1 GB + 0.5 GB, fetched with
//! `scripts/fetch-models.sh qwen`). Ignored by default (slow to load); run with
//! `cargo test -p treespec-llama --release --test qwen -- --ignored --nocapture`.
//! Exact mode changes a process-wide ggml setting, so the inexact measurement has its own test
//! binary run: pass `TREESPEC_QWEN_EXACT=0` to measure the default mode instead.

mod common;

use std::path::PathBuf;

use common::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use treespec_engine::{CausalLm, EngineError, TreeBatch};
use treespec_llama::{check_compatible, LlamaModel, LoadOptions};

fn qwen(file: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models").join(file);
    assert!(p.is_file(), "{} is missing: run `bash scripts/fetch-models.sh qwen`", p.display());
    p
}

const TARGET: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
const DRAFT: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

#[test]
#[ignore = "needs the Qwen models (scripts/fetch-models.sh qwen)"]
fn qwen_pair_is_compatible_and_smollm2_is_not() {
    let opts = LoadOptions { threads: 1, ctx_size: 256, ..LoadOptions::default() };
    let target = LlamaModel::load(qwen(TARGET), opts.clone()).unwrap();
    let draft = LlamaModel::load(qwen(DRAFT), opts.clone()).unwrap();
    check_compatible(&draft, &target).unwrap();
    eprintln!("target: {:#?}", target.info());
    if skip_model_tests("smollm2 half of qwen_pair_is_compatible") {
        return;
    }
    let smol = LlamaModel::load(model_path(), opts).unwrap();
    let e = check_compatible(&smol, &target).unwrap_err();
    eprintln!("smollm2 vs qwen: {e}");
    assert!(matches!(e, EngineError::Incompatible(_)));
}

/// Random trees on the 1.5B target: every node against its path fed as a chain.
#[test]
#[ignore = "needs the Qwen models (scripts/fetch-models.sh qwen)"]
fn qwen_tree_vs_chain() {
    let exact = std::env::var("TREESPEC_QWEN_EXACT").map_or(true, |v| v != "0");
    let opts = LoadOptions { threads: 2, ctx_size: 512, exact, ..LoadOptions::default() };
    let model = LlamaModel::load(qwen(TARGET), opts).unwrap();
    let mut lm = model.new_lm().unwrap();
    let prompt =
        model.tokenize("<|im_start|>user\nWrite quicksort in Rust.<|im_end|>\n", false, true).unwrap();
    lm.prefill(&prompt).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (mut worst, mut flips, mut nodes) = (0.0f32, 0, 0);
    for _ in 0..3 {
        let parents = random_tree(&mut rng, 3, 4, 16);
        let tokens = random_tokens(&mut rng, parents.len(), 150_000);
        let tree = lm
            .forward(&TreeBatch {
                tokens: tokens.clone(),
                parents: parents.clone(),
                logits: vec![true; tokens.len()],
            })
            .unwrap()
            .into_owned();
        lm.commit(&[]).unwrap();
        for leaf in leaves(&parents) {
            let path = path_to(&parents, leaf);
            let toks: Vec<u32> = path.iter().map(|&i| tokens[i]).collect();
            let chain = lm.forward(&TreeBatch::chain(&toks, None, 0, false)).unwrap().into_owned();
            lm.commit(&[]).unwrap();
            for (k, &node) in path.iter().enumerate() {
                worst = worst.max(max_abs_diff(tree.row(node), chain.row(k)));
                flips += usize::from(argmax(tree.row(node)) != argmax(chain.row(k)));
            }
        }
        nodes += parents.len();
    }
    eprintln!("qwen 1.5B exact={exact}: {nodes} nodes, max |tree - chain| = {worst:e}, argmax flips (counted per path) = {flips}");
    if exact {
        assert!(worst < 1e-3, "exact mode should make trees and chains agree, max diff {worst}");
    }
}
