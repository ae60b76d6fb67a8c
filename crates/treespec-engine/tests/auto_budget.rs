//! Cost-aware budgeting (`--budget auto`, `--method auto`) on toy models: greedy output equal to
//! plain decoding, the sampled joint distribution equal to the target's (χ²), and the decisions
//! the cost model must make — draft where verification is cheap, fall back to plain decoding
//! where it is not.
//!
//! The cost curves are given and frozen (`refine: false`): toy forwards take microseconds, and
//! the decisions should follow the curves under test, not this machine's timings.

#[path = "../../treespec-core/tests/common/mod.rs"]
mod common;

use std::sync::{Arc, Mutex};

use common::{chi_square, FAMILY_ALPHA};
use treespec_core::cost::CostCurve;
use treespec_core::sampling::{Sampler, SamplingParams};
use treespec_core::TokenId;
use treespec_engine::auto_budget::{CostModel, SharedCosts};
use treespec_engine::drafters::{
    AutoConfig, AutoDrafter, DySpecConfig, DySpecDrafter, SuffixConfig, SuffixDrafter, SuffixShared,
};
use treespec_engine::toy::{Support, ToyLm, ToyModel, Watch, WatchedLm};
use treespec_engine::{generate, Drafter, GenerateOutput, GenerateRequest, PlainDrafter, StopConditions};

const CTX: usize = 512;

/// A CPU-like curve with a cheap batch: T(n) = 30 + 2n ms, and a draft at 3 ms per forward.
fn cheap_verify() -> Arc<SharedCosts> {
    SharedCosts::new(CostModel {
        target: CostCurve::linear(30.0, 2.0, 32).unwrap(),
        draft: Some(CostCurve::linear(2.0, 1.0, 32).unwrap()),
        refine: false,
        elsewhere: false,
    })
}

/// Verification as expensive per token as decoding (T(n) = 30n): no tree can pay.
fn linear_verify() -> Arc<SharedCosts> {
    SharedCosts::new(CostModel {
        target: CostCurve::linear(0.0, 30.0, 32).unwrap(),
        draft: Some(CostCurve::linear(2.0, 1.0, 32).unwrap()),
        refine: false,
        elsewhere: false,
    })
}

fn dyspec(draft: &ToyModel, costs: Arc<SharedCosts>) -> DySpecDrafter<ToyLm> {
    let cfg = DySpecConfig { budget: 12, max_depth: 6, costs: Some(costs), ..Default::default() };
    DySpecDrafter::new(ToyLm::new(draft.clone(), CTX), cfg).unwrap()
}

fn auto(draft: Option<&ToyModel>, costs: Arc<SharedCosts>) -> AutoDrafter<ToyLm> {
    auto_sharing(draft, costs, SuffixShared::empty())
}

/// [`auto`] with the suffix drafter's history and prices in `shared`.
fn auto_sharing(
    draft: Option<&ToyModel>,
    costs: Arc<SharedCosts>,
    shared: Arc<SuffixShared>,
) -> AutoDrafter<ToyLm> {
    let config = AutoConfig {
        costs,
        suffix: SuffixConfig { max_depth: 6, shared, ..Default::default() },
        dyspec: DySpecConfig { budget: 12, max_depth: 6, ..Default::default() },
        trace: None,
    };
    AutoDrafter::new(draft.map(|d| ToyLm::new(d.clone(), CTX)), config).unwrap()
}

/// The suffix drafter alone: cost-aware on `costs`, or (None) verifying every node it finds.
fn suffix(costs: Option<Arc<SharedCosts>>) -> SuffixDrafter {
    let min_value = if costs.is_some() { 0.3 } else { 0.0 };
    SuffixDrafter::new(SuffixConfig { max_depth: 8, costs, min_value, ..Default::default() }).unwrap()
}

fn run(
    target: &ToyModel,
    drafter: &mut dyn Drafter,
    prompt: &[TokenId],
    n: usize,
    sampling: &SamplingParams,
    seed: u64,
) -> GenerateOutput {
    let mut lm = ToyLm::new(target.clone(), CTX);
    let req = GenerateRequest {
        prompt: prompt.to_vec(),
        max_new_tokens: n,
        sampling: sampling.clone(),
        seed,
        stop: StopConditions::default(),
    };
    generate(&mut lm, drafter, &req, None, &mut |_| true).unwrap()
}

#[test]
fn greedy_output_equals_plain_decoding() {
    let greedy = SamplingParams::greedy();
    for seed in 0..8u64 {
        let vocab = [8, 16, 64, 5][seed as usize % 4];
        let target = ToyModel::new(vocab, 1 + seed as usize % 2, seed);
        // Repetitive prompts give the lookup something to find.
        let prompt: Vec<TokenId> = (0..12).map(|i| ((seed + i % 4) % vocab as u64) as TokenId).collect();
        let plain = run(&target, &mut PlainDrafter, &prompt, 48, &greedy, 0).tokens;
        for noise in [0.0, 1.0, 3.0] {
            let draft = target.draft(noise, seed + 100);
            for costs in [cheap_verify(), linear_verify()] {
                let mut drafters: Vec<Box<dyn Drafter>> = vec![
                    Box::new(dyspec(&draft, costs.clone())),
                    Box::new(auto(Some(&draft), costs.clone())),
                    Box::new(auto(None, costs.clone())),
                    Box::new(suffix(Some(costs.clone()))),
                    Box::new(suffix(None)),
                ];
                for d in drafters.iter_mut() {
                    // Twice: the second generation starts from the first one's calibration.
                    for round in 0..2 {
                        let out = run(&target, d.as_mut(), &prompt, 48, &greedy, round);
                        assert_eq!(out.tokens, plain, "seed {seed} noise {noise} {} round {round}", d.name());
                    }
                }
            }
        }
    }
}

#[test]
fn drafts_where_verification_is_cheap_and_never_where_it_is_not() {
    let greedy = SamplingParams::greedy();
    let target = ToyModel::new(16, 1, 7);
    let draft = target.draft(0.0, 7);
    let prompt: Vec<TokenId> = vec![1, 2, 3];

    let mut cheap = dyspec(&draft, cheap_verify());
    let out = run(&target, &mut cheap, &prompt, 64, &greedy, 0);
    assert!(out.stats.mean_accepted() > 2.0, "identical draft, cheap verify: {}", out.stats.mean_accepted());

    // T(n) = 30n: verifying n nodes costs exactly what decoding them would, so every step is
    // plain decoding; the draft model runs only for the periodic probes (and their trees are cut).
    let mut dear = dyspec(&draft, linear_verify());
    let out = run(&target, &mut dear, &prompt, 64, &greedy, 0);
    assert_eq!(out.stats.drafted, 0);
    assert_eq!(out.stats.target_forwards, 64);
    assert!(dear.draft_forwards() <= 64 / 16 + 1, "draft forwards {}", dear.draft_forwards());

    let mut lookup_only = auto(None, linear_verify());
    let out = run(&target, &mut lookup_only, &prompt, 64, &greedy, 0);
    assert_eq!(out.stats.drafted, 0);

    // With a cheap verify and a perfect draft, `auto` drafts with the model; with no draft model
    // it still takes suffix matches in a repetitive context.
    let mut both = auto(Some(&draft), cheap_verify());
    let out = run(&target, &mut both, &prompt, 64, &greedy, 0);
    let model_steps = both.extra_stats().auto.unwrap().model_steps as f64;
    assert!(model_steps > 0.0 && out.stats.mean_accepted() > 2.0, "{:?}", both.extra_stats());
    let repetitive: Vec<TokenId> = (0..40).map(|i| [3, 1, 4, 1, 5][i % 5]).collect();
    let cyclic = ToyModel::new(8, 2, 3);
    let mut lookup = auto(None, cheap_verify());
    let out = run(&cyclic, &mut lookup, &repetitive, 64, &greedy, 0);
    let suffix_steps = lookup.extra_stats().auto.unwrap().suffix_steps as f64;
    assert!(suffix_steps > 0.0, "{:?}", lookup.extra_stats());
    assert!(out.stats.drafted > 0);
}

#[test]
fn greedy_auto_grafts_suffix_drafts_onto_the_model_tree_and_stays_exact() {
    let greedy = SamplingParams::greedy();
    // A perfect draft model beside a prompt whose repetition the target does not follow: the
    // model's tree wins, and the suffix draft's own guesses ride along while rows are cheap.
    // Grafts happen in the first steps, while the answer's tail still matches the prompt: the
    // prompt is short, so that catching the model up on it pays from the first tokens.
    // The suffix prices start from the formula prior: the shipped calibration has learned that
    // a 40-token match goes on, and would bet on this one rather than the model.
    let target = ToyModel::new(16, 1, 7);
    let draft = target.draft(0.0, 7);
    let prompt: Vec<TokenId> = (0..10).map(|i| [3, 1, 4, 1, 5][i % 5]).collect();
    let plain = run(&target, &mut PlainDrafter, &prompt, 64, &greedy, 0).tokens;
    let auto = |draft: Option<&ToyModel>, costs: Arc<SharedCosts>| {
        let cap = treespec_core::suffix::DEFAULT_CAP_TOKENS;
        let history = treespec_core::suffix::GlobalHistory::new(cap).unwrap();
        let pricing = treespec_core::suffix::SuffixPricing::uninformed();
        auto_sharing(draft, costs, SuffixShared::with_pricing(history, pricing))
    };
    let mut both = auto(Some(&draft), cheap_verify());
    let out = run(&target, &mut both, &prompt, 64, &greedy, 0);
    assert_eq!(out.tokens, plain);
    let choices = both.extra_stats().auto.unwrap();
    assert!(choices.combined_steps > 0 && choices.combined_steps <= choices.model_steps, "{choices:?}");
    // Where verification is as dear as decoding, nothing extra is grafted on.
    let mut dear = auto(Some(&draft), linear_verify());
    let out = run(&target, &mut dear, &prompt, 64, &greedy, 0);
    assert_eq!(out.tokens, plain);
    assert_eq!(dear.extra_stats().auto.unwrap().combined_steps, 0);
}

/// `auto` with `draft` as its model, watched (what it was given to prefill), its DySpec tree up
/// to `depth` deep.
fn watched_auto(
    draft: &ToyModel,
    costs: Arc<SharedCosts>,
    depth: usize,
) -> (AutoDrafter<WatchedLm>, Arc<Mutex<Watch>>) {
    let (lm, watch) = WatchedLm::new(ToyLm::new(draft.clone(), CTX));
    let config = AutoConfig {
        costs,
        suffix: SuffixConfig { max_depth: 6, ..Default::default() },
        dyspec: DySpecConfig { budget: 12, max_depth: depth, ..Default::default() },
        trace: None,
    };
    (AutoDrafter::new(Some(lm), config).unwrap(), watch)
}

#[test]
fn a_draft_model_that_could_not_pay_even_when_perfect_never_takes_the_prompt() {
    // T(n) = 30n and a perfect draft at 3 ms a token: every chain costs more per token than
    // plain decoding, whatever is accepted. `auto` gives the draft model the prompt only when
    // a step finds that drafting pays (the prefill included): here never.
    let greedy = SamplingParams::greedy();
    let target = ToyModel::new(16, 1, 7);
    let perfect = target.draft(0.0, 7);
    let prompt: Vec<TokenId> = (0..40).map(|i| (i * 7 % 16) as TokenId).collect();
    let plain = run(&target, &mut PlainDrafter, &prompt, 200, &greedy, 0).tokens;
    let counted = |costs: Arc<SharedCosts>| {
        let (mut d, watch) = watched_auto(&perfect, costs, 6);
        let out = run(&target, &mut d, &prompt, 200, &greedy, 0);
        let prefilled = watch.lock().unwrap().prefilled;
        (out.tokens, d, prefilled)
    };
    let (tokens, hopeless, prefilled) = counted(linear_verify());
    assert_eq!(tokens, plain);
    assert_eq!(prefilled, 0, "the prompt was given to a draft model that cannot pay");
    assert_eq!((hopeless.draft_forwards(), hopeless.extra_stats().auto.unwrap().model_steps), (0, 0));
    // The same model where a perfect draft pays takes the prompt and drafts.
    let (tokens, cheap, prefilled) = counted(cheap_verify());
    assert_eq!(tokens, plain);
    assert!(prefilled >= prompt.len() - 1, "{prefilled}");
    assert!(cheap.draft_forwards() > 0 && cheap.extra_stats().auto.unwrap().model_steps > 0);
}

#[test]
fn a_draft_model_takes_a_prompt_only_when_its_extra_tokens_repay_reading_it() {
    // T(n) = 30 + 5n and a perfect draft, priced before it is tried at 0.9 a depth. Two drafts:
    // one drafts at 5 ms a token and reads a prompt at 1 ms a token (an 8-deep chain gains 2.8
    // tokens a step at 0.9); the other drafts at 20 ms and reads at 8. `auto` starts the model without the prompt and catches it up only when the gain over the
    // tokens still to come repays that prefill: the cheap drafter takes a 400-token prompt
    // (0.4 s, twelve tokens' worth) some way into the answer; the dear one (3.2 s at 8 ms a
    // token, 92 tokens' worth) cannot repay it within 64 tokens and never reads it, where a
    // prefill at the start would have delayed the first token by all of it.
    let greedy = SamplingParams::greedy();
    let target = ToyModel::new(32, 2, 7);
    let perfect = target.draft(0.0, 7);
    let prompt: Vec<TokenId> = (0..400).map(|i| ((i * 7 + i / 16) % 16) as TokenId).collect();
    let plain = run(&target, &mut PlainDrafter, &prompt, 64, &greedy, 0).tokens;
    let reading = |draft: CostCurve| {
        let costs = SharedCosts::new(CostModel {
            target: CostCurve::linear(30.0, 5.0, 32).unwrap(),
            draft: Some(draft),
            refine: false,
            elsewhere: false,
        });
        let (mut d, watch) = watched_auto(&perfect, costs, 12);
        let out = run(&target, &mut d, &prompt, 64, &greedy, 0);
        assert_eq!(out.tokens, plain);
        let prefilled = watch.lock().unwrap().prefilled;
        (prefilled, d.extra_stats().auto.unwrap().model_steps)
    };
    let (prefilled, _) = reading(CostCurve::linear(4.0, 1.0, 32).unwrap());
    assert!(prefilled >= prompt.len() - 1, "the cheap reader read {prefilled} tokens");
    let (prefilled, model_steps) = reading(CostCurve::linear(12.0, 8.0, 32).unwrap());
    assert_eq!((prefilled, model_steps), (0, 0), "a prefill of 3.2 s that 64 tokens cannot repay");
}

const RUNS: u64 = 20_000;

#[test]
fn sampled_joint_distribution_is_the_targets() {
    type Make = Box<dyn Fn(&ToyModel) -> Box<dyn Drafter>>;
    let pairs = [
        ("v5 noisy", ToyModel::new(5, 2, 51).with_sharpness(2.0), 1.0, Support::All, vec![1u32, 3, 1, 3]),
        ("v6 disjoint", ToyModel::new(6, 1, 52).with_sharpness(1.5), 0.5, Support::Odd, vec![2u32, 4, 2]),
        ("v4 equal", ToyModel::new(4, 2, 53), 0.0, Support::All, vec![0u32, 1, 0, 1]),
    ];
    let settings = [
        ("T=1", SamplingParams::with_temperature(1.0)),
        ("top-p 0.9", SamplingParams { temperature: 1.0, top_p: 0.9, ..Default::default() }),
    ];
    let makers: Vec<(&str, Make)> = vec![
        ("dyspec-auto", Box::new(|d| Box::new(dyspec(d, cheap_verify())))),
        ("auto", Box::new(|d| Box::new(auto(Some(d), cheap_verify())))),
        ("auto-suffix", Box::new(|_| Box::new(auto(None, cheap_verify())))),
        // One drafter for all runs: its global history holds every earlier run's output (state
        // carried across requests), and it drafts from it.
        ("suffix", Box::new(|_| Box::new(suffix(Some(cheap_verify()))))),
        ("suffix-all-nodes", Box::new(|_| Box::new(suffix(None)))),
    ];
    let configs = pairs.len() * settings.len() * makers.len();
    let alpha = FAMILY_ALPHA / configs as f64;
    let mut failures = Vec::new();
    for (pname, target, noise, support, prompt) in &pairs {
        let draft = target.draft(*noise, 1000 + target.seed).with_support(*support);
        for (sname, params) in &settings {
            let exact = target.exact_joint(&Sampler::new(params.clone()).unwrap(), prompt, 3).unwrap();
            for (dname, make) in &makers {
                let mut d = make(&draft);
                let v = target.vocab;
                let mut counts = vec![0u64; v * v * v];
                let mut drafted = 0u64;
                for r in 0..RUNS {
                    let out = run(target, d.as_mut(), prompt, 3, params, r);
                    let t = &out.tokens;
                    counts[(t[0] as usize * v + t[1] as usize) * v + t[2] as usize] += 1;
                    drafted += out.stats.drafted;
                }
                let what = format!("{pname} {sname} {dname}");
                let gof = chi_square(&counts, &exact).unwrap_or_else(|e| panic!("{what}: {e}"));
                println!(
                    "χ² {what:>32}: p = {:.4}, df {} (drafted {:.2} nodes/run)",
                    gof.p_value,
                    gof.df,
                    drafted as f64 / RUNS as f64
                );
                if !dname.contains("suffix") {
                    assert!(drafted > 0, "{what}: the cheap curve should make the model draft");
                }
                if *dname == "suffix-all-nodes" {
                    assert!(drafted > RUNS, "{what}: earlier runs' outputs should be drafted from");
                }
                if gof.p_value <= alpha {
                    failures.push(format!("{what}: p = {:.3e} ≤ {alpha:.1e}", gof.p_value));
                }
            }
        }
    }
    assert!(failures.is_empty(), "joint distribution differs from the target's:\n{}", failures.join("\n"));
}
