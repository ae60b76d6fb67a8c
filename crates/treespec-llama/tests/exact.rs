//! Exact mode (no repacked or tiled kernels). Its own test binary: exact mode changes a
//! process-wide ggml setting that must be made before any decode.

mod common;

use common::*;
use treespec_engine::{CausalLm, TreeBatch};
use treespec_llama::{LlamaModel, LoadOptions};

#[test]
fn exact_mode_loads_and_trees_match_chains() {
    if skip_model_tests("exact_mode_loads_and_trees_match_chains") {
        return;
    }
    let model = LlamaModel::load(model_path(), LoadOptions { exact: true, ..test_options() }).unwrap();
    assert_eq!(std::env::var("GGML_CPU_TILED_MM").as_deref(), Ok("0"));
    let mut lm = model.new_lm().unwrap();
    lm.prefill(&prompt(&model)).unwrap();
    // A {B, C under A}, D beside A.
    let tree = TreeBatch {
        tokens: vec![1000, 2000, 3000, 4000],
        parents: vec![None, Some(0), Some(0), None],
        logits: vec![true; 4],
    };
    let t = lm.forward(&tree).unwrap().into_owned();
    lm.commit(&[]).unwrap();
    let c = lm.forward(&TreeBatch::chain(&[1000, 3000], None, 0, false)).unwrap().into_owned();
    let d = max_abs_diff(t.row(2), c.row(1));
    eprintln!("exact mode, SmolLM2: |tree - chain| = {d:e}");
    assert!(d < 1e-3);
}

/// A single-row batch over a long cache (≥ 512 cells) with two threads is where ggml's flash
/// attention splits the KV across threads; exact mode must still give the same logits as the same
/// token scored inside a tree.
#[test]
fn exact_mode_single_row_equals_tree_row_over_a_long_cache() {
    if skip_model_tests("exact_mode_single_row_equals_tree_row_over_a_long_cache") {
        return;
    }
    let opts = LoadOptions { exact: true, threads: 2, ctx_size: 1024, ..test_options() };
    let model = LlamaModel::load(model_path(), opts).unwrap();
    let mut lm = model.new_lm().unwrap();
    let long: Vec<u32> = (0..700u32).map(|i| 300 + (i * 37) % 5000).collect();
    lm.prefill(&long).unwrap();
    let single = lm.forward(&TreeBatch::chain(&[1000], None, 0, false)).unwrap().into_owned();
    lm.commit(&[]).unwrap();
    let tree = TreeBatch {
        tokens: vec![1000, 2000, 3000],
        parents: vec![None, Some(0), Some(0)],
        logits: vec![true; 3],
    };
    let t = lm.forward(&tree).unwrap().into_owned();
    let d = max_abs_diff(single.row(0), t.row(0));
    eprintln!("exact mode, 700-token cache, 2 threads: |single - tree row| = {d:e}");
    assert_eq!(d, 0.0);
}
