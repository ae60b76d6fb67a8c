//! Forwards padded to fixed shapes (`pad_shapes`), on the real SmolLM2 model in exact mode (its own
//! test binary: exact mode is a process-wide ggml setting made before any decode):
//! - llama.cpp's own counter (`n_reused`) shows that a padded forward reuses the graph of the one
//!   before when both land in one bucket, and not when the bucket changes or nothing pads;
//! - filler rows change no returned row and leave no cell behind: every method emits plain
//!   decoding's tokens with the target padded, alone and batched beside other requests.

mod common;

use std::sync::OnceLock;

use rand::SeedableRng;
use treespec_core::cost::shapes::ShapeBuckets;
use treespec_engine::batched::{run_batched, StepLimits};
use treespec_engine::{generate, BatchedLm, CausalLm, Method, Prepared, TreeBatch};
use treespec_llama::{LlamaLm, LlamaModel, LoadOptions};

fn model() -> &'static LlamaModel {
    static MODEL: OnceLock<LlamaModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        let options = LoadOptions { exact: true, ctx_size: 1024, ..common::test_options() };
        LlamaModel::load(common::model_path(), options).expect("load test model")
    })
}

fn buckets() -> ShapeBuckets {
    ShapeBuckets::new(&[8, 16, 32]).unwrap()
}

/// Feed a random tree of `n` nodes, check its rows against the same tree unpadded (`reference`,
/// when given), commit its first root-to-leaf path, and return llama.cpp's reuse count after it.
fn step(lm: &mut LlamaLm<'_>, rng: &mut rand::rngs::StdRng, n: usize) -> (u64, Vec<Vec<f32>>) {
    let parents = common::random_tree(rng, 3, 6, n);
    assert_eq!(parents.len(), n);
    let tokens = common::random_tokens(rng, n, model().vocab_size());
    let batch = TreeBatch { tokens, parents: parents.clone(), logits: vec![true; n] };
    let rows = lm.forward(&batch).unwrap();
    let rows: Vec<Vec<f32>> = (0..n).map(|i| rows.row(i).to_vec()).collect();
    let leaf = common::leaves(&parents)[0];
    lm.commit(&common::path_to(&parents, leaf)).unwrap();
    (lm.graph_reuses().unwrap(), rows)
}

#[test]
fn padded_forwards_of_one_bucket_reuse_the_graph_and_a_changed_shape_does_not() {
    if common::skip_model_tests("padded_forwards_of_one_bucket_reuse_the_graph_and_a_changed_shape_does_not")
    {
        return;
    }
    let prompt = common::prompt(model());
    let run = |pad: bool, sizes: &[usize]| {
        let mut lm = model().new_lm().unwrap();
        assert!(lm.pad_shapes(pad.then(buckets).as_ref()));
        lm.prefill(&prompt).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut counts = vec![lm.graph_reuses().unwrap()];
        let mut rows = Vec::new();
        for &n in sizes {
            let (count, r) = step(&mut lm, &mut rng, n);
            counts.push(count);
            rows.push(r);
        }
        // The cache holds exactly the committed tokens: no filler cell was left behind.
        assert_eq!(lm.pending_len(), 0);
        (counts.windows(2).map(|w| w[1] - w[0]).collect::<Vec<u64>>(), rows)
    };
    // 5, 3, 7 rows pad to 8; 9 and 12 to 16; 4 back to 8.
    let sizes = [5, 3, 7, 9, 12, 4];
    let (padded, padded_rows) = run(true, &sizes);
    eprintln!("graph reuses per forward, padded: {padded:?}");
    assert_eq!(padded, [0, 1, 1, 0, 1, 0], "reuse exactly where the bucket repeats");
    let (unpadded, rows) = run(false, &sizes);
    eprintln!("graph reuses per forward, unpadded: {unpadded:?}");
    assert_eq!(unpadded, [0; 6], "trees of changing size never reuse");
    // Filler rows change no real row, bit for bit.
    assert_eq!(padded_rows, rows);
    // Two one-row forwards in a row reuse too (plain decoding's own shape), padded or not.
    let mut lm = model().new_lm().unwrap();
    lm.pad_shapes(Some(&buckets()));
    lm.prefill(&prompt).unwrap();
    for t in [1000, 2000, 3000] {
        lm.forward(&TreeBatch::chain(&[t], None, 0, false)).unwrap();
        lm.commit(&[0]).unwrap();
    }
    assert_eq!(lm.graph_reuses(), Some(2));
}

fn requests() -> Vec<treespec_engine::GenerateRequest> {
    (common::CHAT_PROMPTS.iter().enumerate())
        .map(|(i, text)| common::greedy_chat_request(model(), text, 40, i as u64))
        .collect()
}

fn plain(request: &treespec_engine::GenerateRequest) -> Vec<u32> {
    let mut target = model().new_lm().unwrap();
    let mut plain = Method::Plain.build::<LlamaLm>(None).unwrap();
    generate(&mut target, plain.as_mut(), request, None, &mut |_| true).unwrap().tokens
}

#[test]
fn every_method_with_a_padded_target_emits_plain_decodings_tokens() {
    if common::skip_model_tests("every_method_with_a_padded_target_emits_plain_decodings_tokens") {
        return;
    }
    for (i, request) in requests().iter().enumerate() {
        let reference = plain(request);
        for method in &common::speculative_methods() {
            let mut target = model().new_lm().unwrap();
            target.pad_shapes(Some(&buckets()));
            let draft = method.needs_draft().then(|| model().new_lm().unwrap());
            let mut drafter = method.build(draft).unwrap();
            let out = generate(&mut target, drafter.as_mut(), request, None, &mut |_| true).unwrap();
            assert_eq!(out.tokens, reference, "request {i}, {} padded", method.name());
        }
    }
}

#[test]
fn padded_batches_emit_what_each_request_emits_alone() {
    if common::skip_model_tests("padded_batches_emit_what_each_request_emits_alone") {
        return;
    }
    let requests = requests();
    let methods = common::speculative_methods();
    let jobs: Vec<Prepared<'static>> = (requests.iter().enumerate())
        .map(|(i, r)| {
            let method = &methods[i % methods.len()];
            let draft = method.needs_draft().then(|| model().new_lm().unwrap());
            Prepared::free(r.clone(), method.build(draft).unwrap())
        })
        .collect();
    let mut lm = model().new_batch_lm(2048, 4).unwrap();
    assert!(lm.pad_shapes(Some(&buckets())));
    let outputs = run_batched(&mut lm, jobs, 4, StepLimits::default(), None, None);
    for (i, (out, request)) in outputs.into_iter().zip(&requests).enumerate() {
        let out = out.unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(
            out.tokens,
            plain(request),
            "request {i} ({}) in a padded batch",
            methods[i % methods.len()].name()
        );
    }
    let reuses = lm.graph_reuses().unwrap();
    eprintln!("padded batches: {} forwards, {reuses} reused the graph before", lm.counters.forwards);
}
