//! Every method, on the real SmolLM2 model with itself as draft, emits exactly plain decoding's
//! tokens at temperature 0 (SmolLM2's Q4_1 has no batch-dependent kernels, and the backend keeps
//! tree logits bit-identical to chain logits, so no near-tie excuse is needed here).

mod common;

#[test]
fn every_method_matches_plain_greedy_on_smollm2() {
    if common::skip_model_tests("every_method_matches_plain_greedy_on_smollm2") {
        return;
    }
    let model = common::model();
    let requests: Vec<_> = (common::CHAT_PROMPTS.iter().enumerate())
        .map(|(i, text)| common::greedy_chat_request(model, text, 40, i as u64))
        .collect();
    let checked = common::assert_every_method_matches_plain(model, &requests, true);
    assert_eq!(checked, common::CHAT_PROMPTS.len() * common::speculative_methods().len());
}
