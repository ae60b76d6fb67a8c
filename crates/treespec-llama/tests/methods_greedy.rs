//! Every method, on the real SmolLM2 model with itself as draft, emits exactly plain decoding's
//! tokens at temperature 0 (SmolLM2's Q4_1 has no batch-dependent kernels, and the backend keeps
//! tree logits bit-identical to chain logits, so no near-tie excuse is needed here).

mod common;

use treespec_core::cost::CostCurve;
use treespec_engine::auto_budget::{CostModel, SharedCosts};
use treespec_engine::drafters::{
    AutoConfig, DiscoConfig, DySpecConfig, DySpecMode, Eagle2Config, GsdConfig, LookupConfig, SequoiaConfig,
    StagedConfig, SuffixConfig,
};
use treespec_engine::{generate, Method};

const PROMPTS: &[&str] = &[
    "Write a haiku about autumn leaves.",
    "What is the capital of France? Answer in one sentence.",
    "List three uses of a paperclip.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Explain why the sky is blue to a child.",
    "Repeat this list exactly, twice: apples, pears, plums, cherries, figs, dates, limes.",
];

/// A cost curve on which verifying is cheap, so the cost-aware free drafters do draft.
fn cheap_costs() -> std::sync::Arc<SharedCosts> {
    SharedCosts::new(CostModel {
        target: CostCurve::linear(10.0, 0.5, 64).unwrap(),
        draft: None,
        refine: false,
    })
}

#[test]
fn every_method_matches_plain_greedy_on_smollm2() {
    if common::skip_model_tests("every_method_matches_plain_greedy_on_smollm2") {
        return;
    }
    let model = common::model();
    let methods = [
        Method::Chain { k: 4 },
        Method::Tree { widths: vec![2, 2, 1] },
        Method::SpecInfer { expand: vec![2, 1, 1] },
        Method::Sequoia(SequoiaConfig { budget: 8, max_depth: None, acceptance: vec![0.7, 0.15, 0.05] }),
        Method::DySpec(DySpecConfig { budget: 10, ..Default::default() }),
        Method::DySpec(DySpecConfig { budget: 6, mode: DySpecMode::Heap, ..Default::default() }),
        Method::Eagle2(Eagle2Config { top_k: 3, depth: 4, total: 10 }),
        Method::Gsd(GsdConfig { budget: 12, ..Default::default() }),
        Method::Staged(StagedConfig::default()),
        Method::Lookup { config: LookupConfig::default(), table: None },
        Method::Disco(DiscoConfig::default()),
        // Every node it finds, verified (the global history carries across the prompts). Trees
        // of up to 12 nodes, as above: larger batches take other kernels outside exact mode
        // (tests/suffix_exact.rs checks 64-node suffix trees in exact mode).
        Method::Suffix(SuffixConfig { min_value: 0.0, max_nodes: 12, ..Default::default() }),
        Method::Suffix(SuffixConfig { costs: Some(cheap_costs()), max_nodes: 12, ..Default::default() }),
        Method::Auto(AutoConfig {
            costs: cheap_costs(),
            suffix: SuffixConfig { max_nodes: 12, ..Default::default() },
            dyspec: DySpecConfig::default(),
        }),
    ];
    let mut checked = 0;
    for (i, text) in PROMPTS.iter().enumerate() {
        let request = common::greedy_chat_request(model, text, 40, i as u64);
        let mut target = model.new_lm().unwrap();
        let mut plain = Method::Plain.build::<treespec_llama::LlamaLm>(None).unwrap();
        let reference = generate(&mut target, plain.as_mut(), &request, None, &mut |_| true).unwrap();
        for method in &methods {
            let mut target = model.new_lm().unwrap();
            let draft = method.needs_draft().then(|| model.new_lm().unwrap());
            let mut drafter = method.build(draft).unwrap();
            let out = generate(&mut target, drafter.as_mut(), &request, None, &mut |_| true).unwrap();
            assert_eq!(out.tokens, reference.tokens, "prompt {i} method {}", method.name());
            assert_eq!(out.finish_reason, reference.finish_reason);
            if method.needs_draft() {
                // The draft is the target: nearly everything drafted must be accepted.
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
    assert_eq!(checked, PROMPTS.len() * methods.len());
}
