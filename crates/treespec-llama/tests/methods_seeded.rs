//! Reproducible sampling on the real SmolLM2 model (issue #66): a request that names its seed,
//! at temperature 1, gets exactly plain decoding's tokens under every method, with SmolLM2 as its
//! own draft. Its tree logits equal its chain logits bit for bit (see methods_greedy.rs), so the
//! target's noisy choice at every position is the same in a tree as alone.

mod common;

use treespec_core::sampling::SamplingParams;

#[test]
fn every_method_matches_plain_seeded_sampling_on_smollm2() {
    if common::skip_model_tests("every_method_matches_plain_seeded_sampling_on_smollm2") {
        return;
    }
    let model = common::model();
    let sampling = SamplingParams { temperature: 1.0, reproducible: true, ..Default::default() };
    let requests: Vec<_> = (common::CHAT_PROMPTS.iter().take(3).enumerate())
        .map(|(i, text)| common::chat_request(model, text, 32, sampling.clone(), 42 + i as u64))
        .collect();
    let checked = common::assert_every_method_matches_plain(model, &requests, false);
    assert_eq!(checked, 3 * common::speculative_methods().len());
}
