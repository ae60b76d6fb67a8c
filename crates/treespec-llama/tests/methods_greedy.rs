//! Every method, on the real SmolLM2 model with itself as draft, emits exactly plain decoding's
//! tokens at temperature 0 (SmolLM2's Q4_1 has no batch-dependent kernels, and the backend keeps
//! tree logits bit-identical to chain logits, so no near-tie excuse is needed here).

mod common;

use treespec_engine::{generate, Method};

#[test]
fn every_method_matches_plain_greedy_on_smollm2() {
    if common::skip_model_tests("every_method_matches_plain_greedy_on_smollm2") {
        return;
    }
    let model = common::model();
    let methods = common::speculative_methods();
    let mut checked = 0;
    for (i, text) in common::CHAT_PROMPTS.iter().enumerate() {
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
    assert_eq!(checked, common::CHAT_PROMPTS.len() * methods.len());
}
