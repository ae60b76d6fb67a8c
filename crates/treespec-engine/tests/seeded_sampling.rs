//! Reproducible sampling (issue #66): a request that names its seed is decoded with noise fixed
//! per (seed, position, token) (`treespec_core::noise`), and verification follows the target's
//! own noisy choice through the tree as greedy verification follows its argmax. Checked here on
//! enumerable toy models:
//!
//! * over many seeds the emitted sequences still have exactly the target's joint distribution
//!   (χ², ALGORITHMS.md §4.2), plain and speculative;
//! * for one seed, every method of the registry emits exactly plain decoding's tokens, alone and
//!   in a batch beside other requests — which the default (rejection-sampling) verifier does not.

#[path = "../../treespec-core/tests/common/mod.rs"]
mod common;

use std::sync::Arc;

use common::{gof_failure, FAMILY_ALPHA};
use treespec_core::cost::CostCurve;
use treespec_core::sampling::{Sampler, SamplingParams};
use treespec_core::TokenId;
use treespec_engine::auto_budget::{CostModel, SharedCosts};
use treespec_engine::batched::{run_batched, StepLimits};
use treespec_engine::drafters::DySpecConfig;
use treespec_engine::toy::{ToyBatchLm, ToyLm, ToyModel};
use treespec_engine::{generate, Drafter, GenerateRequest, Method, Prepared};

/// Context of the toy models.
const CTX: usize = 96;

fn sampling(temperature: f32, reproducible: bool) -> SamplingParams {
    SamplingParams { temperature, reproducible, ..Default::default() }
}

/// A cost curve on which verifying is cheap, so the cost-aware drafters (suffix, auto) draft.
fn cheap_costs() -> Arc<SharedCosts> {
    let target = CostCurve::linear(10.0, 0.5, 64).unwrap();
    SharedCosts::new(CostModel { target, draft: None, refine: false, elsewhere: false })
}

/// Every speculative method of the registry.
fn methods() -> Vec<Method> {
    treespec_engine::every_method::speculative_methods(&cheap_costs())
}

fn target() -> ToyModel {
    ToyModel::new(8, 2, 66)
}

/// The draft: the target with some noise, so drafts are often but not always right.
fn draft_model() -> ToyModel {
    target().draft(0.7, 67)
}

fn drafter(method: &Method) -> Box<dyn Drafter> {
    let lm = method.needs_draft().then(|| ToyLm::new(draft_model(), CTX));
    method.build(lm).unwrap()
}

/// A prompt with repeats in it, so the lookup and suffix drafters find matches.
fn prompt(i: u64) -> Vec<TokenId> {
    (0..12).map(|j| ((i + j % 4 * 3) % 8) as TokenId).collect()
}

fn request(i: u64, len: usize, sampling: &SamplingParams, seed: u64) -> GenerateRequest {
    GenerateRequest::new(prompt(i), len, sampling.clone(), seed)
}

fn alone(method: &Method, req: &GenerateRequest) -> Vec<TokenId> {
    let mut lm = ToyLm::new(target(), CTX);
    generate(&mut lm, drafter(method).as_mut(), req, None, &mut |_| true).unwrap().tokens
}

/// Seeded requests, each decoded by every method: the first method whose tokens differ from
/// plain decoding's, as (seed, method, plain, method's), if any. Also how many tokens the
/// speculative methods emitted per target forward, to show they did speculate.
fn first_difference(sampling: &SamplingParams) -> (Option<(u64, String)>, f64) {
    let (mut emitted, mut forwards) = (0u64, 0u64);
    for seed in 0..16u64 {
        let req = request(seed, 40, sampling, seed);
        let plain = alone(&Method::Plain, &req);
        assert_eq!(plain.len(), 40);
        for method in methods() {
            let mut lm = ToyLm::new(target(), CTX);
            let out = generate(&mut lm, drafter(&method).as_mut(), &req, None, &mut |_| true).unwrap();
            emitted += out.stats.emitted;
            forwards += out.stats.target_forwards;
            if out.tokens != plain {
                return (Some((seed, method.name().to_string())), 0.0);
            }
        }
    }
    (None, emitted as f64 / forwards as f64)
}

#[test]
fn a_seed_gives_plain_decodings_tokens_under_every_method() {
    for t in [1.0, 0.6] {
        let (diff, tau) = first_difference(&sampling(t, true));
        assert_eq!(diff, None, "temperature {t}: a method left plain decoding's tokens");
        eprintln!("temperature {t}: every method emits plain's tokens; {tau:.2} tokens per target forward");
        assert!(tau > 1.2, "the methods must have speculated (τ = {tau:.2})");
    }
}

/// The property is the reproducible verifier's: rejection sampling gives other texts per method
/// (this is what the test above would see if the seeded mode were off).
#[test]
fn the_default_verifier_does_not_have_the_property() {
    let (diff, _) = first_difference(&sampling(1.0, false));
    assert!(diff.is_some(), "rejection sampling happened to match plain decoding everywhere");
}

/// Requests of every method decoded four lanes at a time (prompts prefilled in chunks, trees
/// cut by a batch budget) emit exactly what plain decoding emits alone with their seeds.
#[test]
fn a_seed_gives_plain_decodings_tokens_in_a_batch() {
    let sampling = sampling(1.0, true);
    let methods = methods();
    let mut jobs = Vec::new();
    let mut reqs = Vec::new();
    for (i, method) in
        methods.iter().chain([&Method::Plain]).cycle().take(3 * (methods.len() + 1)).enumerate()
    {
        let req = request(i as u64 % 5, 8 + i % 23, &sampling, 1_000 + i as u64);
        jobs.push(Prepared::free(req.clone(), drafter(method)));
        reqs.push((req, method.name()));
    }
    let mut lm = ToyBatchLm::new(target(), CTX, 4);
    let limits = StepLimits { prefill_chunk: 5, max_tree: 12, ..StepLimits::default() };
    let outputs = run_batched(&mut lm, jobs, 4, limits, None, None);
    assert!(lm.widest > 4, "requests shared forwards (widest forward: {} rows)", lm.widest);
    for (out, (req, name)) in outputs.into_iter().zip(reqs) {
        let plain = alone(&Method::Plain, &req);
        assert_eq!(out.unwrap().tokens, plain, "{name}, seed {}", req.seed);
    }
}

/// Over many seeds the seeded sampler's sequences have the target's exact joint distribution,
/// for plain decoding and for speculative methods whose drafts it mostly rejects or accepts.
#[test]
fn seeded_sequences_follow_the_targets_joint_distribution() {
    let target = ToyModel::new(5, 2, 7);
    let prompt: Vec<TokenId> = vec![1, 4, 2];
    let configs: Vec<(&str, Method, SamplingParams)> = vec![
        ("plain T1", Method::Plain, sampling(1.0, true)),
        ("plain T0.5 top-k 3", Method::Plain, SamplingParams { top_k: Some(3), ..sampling(0.5, true) }),
        ("chain T1", Method::Chain { k: 3 }, sampling(1.0, true)),
        ("tree T1", Method::Tree { widths: vec![3, 2, 1] }, sampling(1.0, true)),
        ("specinfer T0.7", Method::SpecInfer { expand: vec![2, 2] }, sampling(0.7, true)),
        (
            "dyspec T1 penalties",
            Method::DySpec(DySpecConfig { budget: 8, ..Default::default() }),
            SamplingParams {
                presence_penalty: 0.8,
                frequency_penalty: 0.5,
                penalty_last_n: 4,
                ..sampling(1.0, true)
            },
        ),
    ];
    let runs = 20_000u64;
    let alpha = FAMILY_ALPHA / configs.len() as f64;
    let mut failures = Vec::new();
    for (k, (name, method, sampling)) in configs.iter().enumerate() {
        let probs = target.exact_joint(&Sampler::new(sampling.clone()).unwrap(), &prompt, 3).unwrap();
        let mut counts = vec![0u64; probs.len()];
        let (mut emitted, mut forwards) = (0u64, 0u64);
        let draft = target.draft(1.0, 8);
        for run in 0..runs {
            let mut lm = ToyLm::new(target.clone(), CTX);
            let lm_draft = method.needs_draft().then(|| ToyLm::new(draft.clone(), CTX));
            let mut d = method.build(lm_draft).unwrap();
            let seed = (k as u64) << 40 | run;
            let req = GenerateRequest::new(prompt.clone(), 3, sampling.clone(), seed);
            let out = generate(&mut lm, d.as_mut(), &req, None, &mut |_| true).unwrap();
            counts[out.tokens.iter().fold(0usize, |acc, &t| acc * 5 + t as usize)] += 1;
            emitted += out.stats.emitted;
            forwards += out.stats.target_forwards;
        }
        eprintln!("{name}: τ {:.2}", emitted as f64 / forwards as f64);
        failures.extend(gof_failure(name, &counts, &probs, alpha));
    }
    assert!(failures.is_empty(), "{failures:?}");
}
