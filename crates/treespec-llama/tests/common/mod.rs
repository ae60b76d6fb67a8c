//! Shared helpers for the tests that run the real SmolLM2 model.
#![allow(dead_code)]

pub mod gguf;

use std::path::PathBuf;
use std::sync::OnceLock;

use rand::Rng;
use treespec_core::cost::CostCurve;
use treespec_core::sampling::SamplingParams;
use treespec_engine::auto_budget::{CostModel, SharedCosts};
use treespec_engine::{generate, GenerateRequest, Method, StopConditions};
use treespec_llama::{LlamaModel, LoadOptions};

/// Small context and ONE thread per context: test functions run in parallel, and llama.cpp's
/// OpenMP threads spin-wait, so two 2-thread contexts on a 2-core machine (or one beside a build)
/// slow each other down ~10x. One thread each keeps the files at a few seconds.
///
/// `TREESPEC_TEST_EXACT=1` loads in exact mode: needed when `TREESPEC_TEST_MODEL` points at a
/// model with repackable quantizations (Q4_0, Q4_K...), whose batched kernels otherwise change
/// logits with batch size (SmolLM2's Q4_1 has none).
pub fn test_options() -> LoadOptions {
    let exact = std::env::var("TREESPEC_TEST_EXACT").is_ok_and(|v| v == "1");
    LoadOptions { threads: 1, ctx_size: 512, n_seq_max: 64, n_ubatch: 512, exact, ..LoadOptions::default() }
}

/// Where the test model is: `TREESPEC_TEST_MODEL`, else the repository's models/ folder.
pub fn model_path() -> PathBuf {
    match std::env::var_os("TREESPEC_TEST_MODEL") {
        Some(p) => PathBuf::from(p),
        None => {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        }
    }
}

/// True (after printing a note) when model tests should be skipped: `TREESPEC_SKIP_MODEL_TESTS=1`.
/// Otherwise a missing model file fails the test with instructions.
pub fn skip_model_tests(test: &str) -> bool {
    if std::env::var("TREESPEC_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("note: skipping {test}: TREESPEC_SKIP_MODEL_TESTS=1");
        return true;
    }
    let path = model_path();
    assert!(
        path.is_file(),
        "test model {} is missing: run `bash scripts/fetch-models.sh` (or set TREESPEC_TEST_MODEL to a GGUF \
         file, or TREESPEC_SKIP_MODEL_TESTS=1 to skip the model tests)",
        path.display()
    );
    false
}

/// The test model, loaded once per test binary (contexts are per test).
pub fn model() -> &'static LlamaModel {
    static MODEL: OnceLock<LlamaModel> = OnceLock::new();
    MODEL.get_or_init(|| LlamaModel::load(model_path(), test_options()).expect("load test model"))
}

/// A prompt's tokens.
pub fn prompt(model: &LlamaModel) -> Vec<u32> {
    model.tokenize("<|im_start|>user\nA poem about the sea?<|im_end|>\n", false, true).unwrap()
}

/// A random tree as parent links (parents before children): up to `max_nodes` nodes, each with at
/// most `width` children, depth below `max_depth`. Root-attached nodes count as children of the
/// prefix (so there are at most `width` of them too).
pub fn random_tree(
    rng: &mut impl Rng,
    width: usize,
    max_depth: usize,
    max_nodes: usize,
) -> Vec<Option<usize>> {
    let mut parents: Vec<Option<usize>> = Vec::new();
    let mut depth: Vec<usize> = Vec::new();
    let mut children: Vec<usize> = Vec::new();
    let mut roots = 0;
    while parents.len() < max_nodes {
        // Candidates: the prefix (None) and every node with room for a child.
        let mut cands: Vec<Option<usize>> = Vec::new();
        if roots < width {
            cands.push(None);
        }
        cands.extend(
            (0..parents.len()).filter(|&i| depth[i] + 1 < max_depth && children[i] < width).map(Some),
        );
        if cands.is_empty() {
            break;
        }
        let p = cands[rng.random_range(0..cands.len())];
        match p {
            None => {
                roots += 1;
                depth.push(0);
            }
            Some(i) => {
                children[i] += 1;
                depth.push(depth[i] + 1);
            }
        }
        parents.push(p);
        children.push(0);
    }
    parents
}

/// Node indices from the root-attached ancestor down to `i`.
pub fn path_to(parents: &[Option<usize>], i: usize) -> Vec<usize> {
    let mut path = vec![i];
    let mut cur = parents[i];
    while let Some(p) = cur {
        path.push(p);
        cur = parents[p];
    }
    path.reverse();
    path
}

/// Nodes without children.
pub fn leaves(parents: &[Option<usize>]) -> Vec<usize> {
    (0..parents.len()).filter(|&i| !parents.contains(&Some(i))).collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

pub fn argmax(a: &[f32]) -> usize {
    a.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) })
        .0
}

/// Difference between the largest and second-largest logit.
pub fn top2_margin(a: &[f32]) -> f32 {
    let (mut m1, mut m2) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in a {
        if v > m1 {
            m2 = m1;
            m1 = v;
        } else if v > m2 {
            m2 = v;
        }
    }
    m1 - m2
}

/// Random ordinary tokens (skip the first ids, which are special in most vocabularies).
pub fn random_tokens(rng: &mut impl Rng, n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(100..vocab as u32)).collect()
}

/// A greedy request for `text` as one ChatML user turn (SmolLM2's template), stopping at the
/// model's end-of-generation tokens.
pub fn greedy_chat_request(
    model: &LlamaModel,
    text: &str,
    max_new_tokens: usize,
    seed: u64,
) -> GenerateRequest {
    chat_request(model, text, max_new_tokens, SamplingParams::greedy(), seed)
}

/// A request for `text` as one ChatML user turn decoded with `sampling` and `seed`, stopping at
/// the model's end-of-generation tokens.
pub fn chat_request(
    model: &LlamaModel,
    text: &str,
    max_new_tokens: usize,
    sampling: SamplingParams,
    seed: u64,
) -> GenerateRequest {
    let chat = format!("<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n");
    GenerateRequest {
        prompt: model.tokenize(&chat, false, true).unwrap(),
        max_new_tokens,
        sampling,
        seed,
        stop: StopConditions {
            eos: [model.eos(), model.eot()].into_iter().flatten().collect(),
            stop_strings: vec![],
        },
    }
}

/// Chat prompts the greedy-equality tests run every method on.
pub const CHAT_PROMPTS: &[&str] = &[
    "Write a haiku about autumn leaves.",
    "What is the capital of France? Answer in one sentence.",
    "List three uses of a paperclip.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Explain why the sky is blue to a child.",
    "Repeat this list exactly, twice: apples, pears, plums, cherries, figs, dates, limes.",
];

/// A cost curve on which verifying is cheap, so the cost-aware free drafters do draft.
pub fn cheap_costs() -> std::sync::Arc<SharedCosts> {
    SharedCosts::new(CostModel {
        target: CostCurve::linear(10.0, 0.5, 64).unwrap(),
        draft: None,
        refine: false,
        elsewhere: false,
    })
}

/// Every speculative method of the registry (plain decoding is the reference), at sizes whose
/// trees stay batch-invariant outside exact mode on SmolLM2 (trees of up to 12 nodes: larger
/// batches take other kernels outside exact mode; tests/suffix_exact.rs checks 64-node suffix
/// trees in exact mode).
pub fn speculative_methods() -> Vec<Method> {
    treespec_engine::every_method::speculative_methods(&cheap_costs())
}

/// Decode each of `requests` with plain decoding and with every speculative method (SmolLM2 as
/// its own draft) and assert that every method emits plain's tokens; with `draft_accepted`, also
/// that the draft methods accept nearly everything (the draft is the target). Returns how many
/// (request, method) pairs were checked.
pub fn assert_every_method_matches_plain(
    model: &LlamaModel,
    requests: &[GenerateRequest],
    draft_accepted: bool,
) -> usize {
    let mut checked = 0;
    for (i, request) in requests.iter().enumerate() {
        let mut target = model.new_lm().unwrap();
        let mut plain = Method::Plain.build::<treespec_llama::LlamaLm>(None).unwrap();
        let reference = generate(&mut target, plain.as_mut(), request, None, &mut |_| true).unwrap();
        for method in &speculative_methods() {
            let mut target = model.new_lm().unwrap();
            let draft = method.needs_draft().then(|| model.new_lm().unwrap());
            let mut drafter = method.build(draft).unwrap();
            let out = generate(&mut target, drafter.as_mut(), request, None, &mut |_| true).unwrap();
            assert_eq!(out.tokens, reference.tokens, "request {i} method {}", method.name());
            assert_eq!(out.finish_reason, reference.finish_reason);
            if draft_accepted && method.needs_draft() {
                assert!(
                    out.stats.mean_accepted() > 1.5,
                    "{}: mean accepted {} with draft = target",
                    method.name(),
                    out.stats.mean_accepted()
                );
            }
            checked += 1;
        }
    }
    checked
}
