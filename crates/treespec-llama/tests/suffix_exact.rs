//! Suffix drafting on the real SmolLM2 model in exact mode: trees of up to 64 drafted nodes (long
//! exact copies) and the `auto` policy emit exactly plain decoding's tokens at temperature 0, with
//! the global history of earlier prompts carried from one prompt to the next. Its own test binary:
//! exact mode changes a process-wide kernel setting.

mod common;

use std::sync::Arc;

use common::{greedy_chat_request, model_path, skip_model_tests, test_options};
use treespec_core::cost::CostCurve;
use treespec_engine::auto_budget::{CostModel, SharedCosts};
use treespec_engine::drafters::{AutoConfig, DySpecConfig, SuffixConfig};
use treespec_engine::{generate, Method};
use treespec_llama::{LlamaModel, LoadOptions};

const PROMPTS: &[&str] = &[
    "Repeat this sentence exactly three times: the quick brown fox jumps over the lazy dog.",
    "Add a docstring to this function and return it:\n\ndef area(width, height):\n    return width * height\n",
    "Write a haiku about autumn leaves.",
    "Copy this list, then sort it: banana, cherry, apple, fig, date, elderberry, grape.",
    "Repeat this sentence exactly three times: the quick brown fox jumps over the lazy dog.",
];

/// Verifying is nearly free on this curve, so the cost-aware drafters verify what they find.
fn cheap_costs() -> Arc<SharedCosts> {
    SharedCosts::new(CostModel {
        target: CostCurve::linear(10.0, 0.1, 64).unwrap(),
        draft: None,
        refine: false,
        elsewhere: false,
    })
}

#[test]
fn suffix_and_auto_match_plain_greedy_in_exact_mode() {
    if skip_model_tests("suffix_and_auto_match_plain_greedy_in_exact_mode") {
        return;
    }
    let model = LlamaModel::load(model_path(), LoadOptions { exact: true, ctx_size: 1024, ..test_options() })
        .unwrap();
    let methods = [
        Method::Suffix(SuffixConfig { min_value: 0.0, ..Default::default() }),
        Method::Suffix(SuffixConfig { costs: Some(cheap_costs()), ..Default::default() }),
        Method::Auto(AutoConfig {
            costs: cheap_costs(),
            suffix: SuffixConfig::default(),
            dyspec: DySpecConfig::default(),
            trace: None,
        }),
    ];
    let mut drafted = vec![0u64; methods.len()];
    let mut accepted = vec![0u64; methods.len()];
    for (i, text) in PROMPTS.iter().enumerate() {
        let request = greedy_chat_request(&model, text, 80, i as u64);
        let mut target = model.new_lm().unwrap();
        let mut plain = Method::Plain.build::<treespec_llama::LlamaLm>(None).unwrap();
        let reference = generate(&mut target, plain.as_mut(), &request, None, &mut |_| true).unwrap();
        for (m, method) in methods.iter().enumerate() {
            let mut target = model.new_lm().unwrap();
            let mut drafter = method.build::<treespec_llama::LlamaLm>(None).unwrap();
            let out = generate(&mut target, drafter.as_mut(), &request, None, &mut |_| true).unwrap();
            assert_eq!(out.tokens, reference.tokens, "prompt {i} method {m} ({})", method.name());
            drafted[m] += out.stats.drafted;
            accepted[m] += out.stats.accepted;
        }
    }
    // The check means something only if long trees were verified and mostly accepted.
    for m in 0..methods.len() {
        assert!(accepted[m] > 40, "method {m}: {} of {} drafted nodes accepted", accepted[m], drafted[m]);
    }
    assert!(drafted[0] > accepted[0], "verify-everything drafts more than it gets accepted");
}
