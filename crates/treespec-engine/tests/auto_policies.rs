//! `auto`'s policies and its measured books (issue #43): the long-match chain (llama.cpp's
//! ngram-mod kind) drafts long copies and stays exact — greedy output equal to plain decoding,
//! alone and in a continuous batch, and the sampled joint distribution equal to the target's
//! (χ²) with the chains and the books carried from run to run — and where the cost curve lies,
//! the time steps really take overrules it.

#[path = "../../treespec-core/tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{chi_square, FAMILY_ALPHA};
use treespec_core::cost::CostCurve;
use treespec_core::sampling::{Sampler, SamplingParams};
use treespec_core::TokenId;
use treespec_engine::auto_budget::{CostModel, SharedCosts};
use treespec_engine::batched::{run_batched, StepLimits};
use treespec_engine::drafters::{
    AutoConfig, AutoDrafter, DecisionTrace, DySpecConfig, SuffixConfig, SuffixShared,
};
use treespec_engine::toy::{ToyBatchLm, ToyLm, ToyModel};
use treespec_engine::Prepared;
use treespec_engine::{
    generate, CausalLm, Drafter, GenerateOutput, GenerateRequest, PlainDrafter, StopConditions,
};

const CTX: usize = 1024;

fn costs(base: f64, row: f64) -> Arc<SharedCosts> {
    SharedCosts::new(CostModel {
        target: CostCurve::linear(base, row, 128).unwrap(),
        draft: None,
        refine: false,
        elsewhere: false,
    })
}

/// A trace written to memory, and the handle to read it.
fn memory_trace() -> (DecisionTrace, Arc<Mutex<Vec<u8>>>) {
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Arc::new(Mutex::new(Vec::new()));
    (DecisionTrace::to_writer(Sink(buf.clone())), buf)
}

fn trace_lines(buf: &Arc<Mutex<Vec<u8>>>) -> Vec<serde_json::Value> {
    let bytes = buf.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn auto(
    costs: Arc<SharedCosts>,
    shared: Arc<SuffixShared>,
    trace: Option<DecisionTrace>,
) -> AutoDrafter<ToyLm> {
    let config = AutoConfig {
        costs,
        suffix: SuffixConfig { max_depth: 6, shared, ..Default::default() },
        dyspec: DySpecConfig::default(),
        trace,
    };
    AutoDrafter::new(None, config).unwrap()
}

fn run_on(lm: &mut dyn CausalLm, drafter: &mut dyn Drafter, req: &GenerateRequest) -> GenerateOutput {
    generate(lm, drafter, req, None, &mut |_| true).unwrap()
}

/// A prompt that holds the target's own greedy continuation of its end: `head`, what the
/// target says after it, then `head` again — the answer re-emits the middle, a long exact copy.
fn copying_prompt(target: &ToyModel, head: &[TokenId], copy: usize) -> Vec<TokenId> {
    let mut lm = ToyLm::new(target.clone(), CTX);
    let middle = run_on(
        &mut lm,
        &mut PlainDrafter,
        &GenerateRequest::new(head.to_vec(), copy, SamplingParams::greedy(), 0),
    )
    .tokens;
    [head, &middle[..], head].concat()
}

/// Seed `seed`'s toy target and a greedy request of 120 tokens whose answer re-emits a
/// 150-token stretch of its prompt.
fn copy_case(seed: u64) -> (ToyModel, GenerateRequest) {
    let target = ToyModel::new(64, 1 + seed as usize % 2, seed);
    let head: Vec<TokenId> = (0..20).map(|i| ((i * 7 + seed) % 64) as TokenId).collect();
    let prompt = copying_prompt(&target, &head, 150);
    (target, GenerateRequest::new(prompt, 120, SamplingParams::greedy(), 0))
}

#[test]
fn long_copies_are_drafted_as_chains_and_greedy_output_equals_plain_decoding() {
    for seed in 0..4u64 {
        let (target, req) = copy_case(seed);
        let plain = run_on(&mut ToyLm::new(target.clone(), CTX), &mut PlainDrafter, &req).tokens;
        // Rows nearly free: long chains pay.
        let (trace, buf) = memory_trace();
        let mut d = auto(costs(30.0, 0.5), SuffixShared::empty(), Some(trace));
        for round in 0..2 {
            let out = run_on(&mut ToyLm::new(target.clone(), CTX), &mut d, &req);
            assert_eq!(out.tokens, plain, "seed {seed} round {round}");
            let choices = d.extra_stats().auto.unwrap();
            assert!(choices.long_match_steps > 0, "seed {seed}: no long-match step: {choices:?}");
            assert!(out.stats.accepted as f64 > 0.5 * plain.len() as f64, "seed {seed}: {:?}", out.stats);
        }
        let lines = trace_lines(&buf);
        let long: Vec<_> = lines.iter().filter(|l| l["chosen"] == "long-match").collect();
        assert!(!long.is_empty());
        assert!(long.iter().any(|l| l["verified_nodes"].as_u64().unwrap() >= 16), "chains stayed short");
        for l in &lines {
            let offers = l["offers"].as_array().unwrap();
            assert_eq!(offers[0]["policy"], "plain", "plain decoding is always on offer");
            assert!(offers.iter().any(|o| o["policy"] == l["chosen"]), "{l}");
        }
    }
}

/// A step is compared with the curve at its own context, as it was priced: on a curve whose rows
/// cost more the more tokens they attend to, the trace's `curve_ms` for each forward is T(n) plus
/// n rows' surcharge at the step's context (it was T(n) on the profiled short cache, so every
/// long prompt's forwards read as the curve running late — and a batch booked them so).
#[test]
fn each_forward_is_compared_with_the_curve_at_its_context() {
    let curve = CostCurve::linear(30.0, 0.5, 128).unwrap().with_context_cost(0.01, 64).unwrap();
    let costs =
        SharedCosts::new(CostModel { target: curve.clone(), draft: None, refine: false, elsewhere: false });
    let (target, req) = copy_case(1);
    let (trace, buf) = memory_trace();
    let mut d = auto(costs, SuffixShared::empty(), Some(trace));
    run_on(&mut ToyLm::new(target, CTX), &mut d, &req);
    let lines = trace_lines(&buf);
    let mut drafted = 0;
    for l in &lines {
        let rows = l["forward_rows"].as_u64().unwrap() as usize;
        let context = l["context"].as_u64().unwrap() as usize;
        assert!(context > 150, "the prompt is long: {l}");
        let expected = curve.ms_at(rows.max(1), context);
        let traced = l["curve_ms"].as_f64().unwrap();
        assert!(
            (traced - expected).abs() < 1e-6,
            "curve_ms {traced} for {rows} rows at {context}: {expected}"
        );
        drafted += usize::from(rows > 1);
    }
    assert!(drafted > 0, "no step drafted: nothing to compare");
}

/// The free policies' first bets in a request are probes of at most 4 nodes, whatever their
/// prices say; a drafted step that brought what it was predicted to lets the bets of both grow
/// to twice the drafted tokens it accepted, once two in a row did to 4 times, and from the third
/// in a row on a step taken whole doubles the cap; nothing else moves it. The trace's `bet_cap`
/// says so at every step. On a long exact copy the first long-match step is a probe, it is
/// fully accepted, and the chains after it grow to 16 nodes and more; every cut bet is traced as
/// a probe.
#[test]
fn bets_start_as_probes_and_grow_with_what_paid() {
    for seed in 0..4u64 {
        let (target, req) = copy_case(seed);
        let (trace, buf) = memory_trace();
        let mut d = auto(costs(30.0, 0.5), SuffixShared::empty(), Some(trace));
        run_on(&mut ToyLm::new(target.clone(), CTX), &mut d, &req);
        let lines = trace_lines(&buf);
        let chosen = |l: &serde_json::Value| {
            let offers = l["offers"].as_array().unwrap();
            offers.iter().find(|o| o["policy"] == l["chosen"]).unwrap().clone()
        };
        let cap_of = |l: &serde_json::Value| l["bet_cap"].as_u64().unwrap() as usize;
        assert_eq!(cap_of(&lines[0]), 4, "seed {seed}: the first bets are not probes");
        // One cap for both free policies, grown by either one's step that paid.
        let mut paid_in_a_row = 0;
        for (l, next) in lines.iter().zip(&lines[1..]) {
            let (cap, next_cap) = (cap_of(l), cap_of(next));
            let o = chosen(l);
            let nodes = o["nodes"].as_u64().unwrap() as usize;
            if l["chosen"] == "long-match" || l["chosen"] == "suffix" {
                assert!(nodes <= cap, "seed {seed}: a bet of {nodes} nodes over its cap {cap}: {l}");
            }
            if l["verified_nodes"].as_u64().unwrap() == 0 {
                assert_eq!(next_cap, cap, "seed {seed}: a plain step moved the cap: {l}");
                continue;
            }
            let accepted = l["emitted"].as_u64().unwrap() as usize - 1;
            let paid = accepted as f64 + 1.0 >= o["predicted"]["tokens"].as_f64().unwrap();
            paid_in_a_row = if paid { paid_in_a_row + 1 } else { 0 };
            let mut expected = match paid_in_a_row {
                0 => cap,
                1 => cap.max(2 * accepted),
                _ => cap.max(4 * accepted),
            };
            // Taken whole: a chain's every node accepted (long-match steps are chains).
            if paid_in_a_row > 2 && l["chosen"] == "long-match" && accepted == nodes {
                expected = expected.max((2 * expected).min(128));
            }
            if l["chosen"] == "long-match" || paid_in_a_row <= 2 {
                assert_eq!(next_cap, expected, "seed {seed}: the cap after {l}");
            } else {
                // A suffix trie's depth is not traced: taken whole or not, the cap lies between.
                assert!(
                    (expected..=expected.max((2 * expected).min(128))).contains(&next_cap),
                    "seed {seed}: the cap after {l} is {next_cap}"
                );
            }
        }
        let long: Vec<_> = lines.iter().filter(|l| l["chosen"] == "long-match").collect();
        assert!(long.len() >= 2, "seed {seed}: the copy was not drafted");
        assert!(chosen(long[0])["probe"] == true, "seed {seed}: the first chain was not a probe");
        assert!(
            long.iter().any(|l| l["verified_nodes"].as_u64().unwrap() >= 16),
            "seed {seed}: chains stayed probes"
        );
    }
}

/// A draft model's trees taken whole do not grow the free policies' cap: they say the text is
/// predictable, not that it copies. With a perfect draft on text that never repeats, every
/// model step is accepted whole and the cap stays at the probe size (under the rule that grew
/// it from any drafted step, the first such step doubled it).
#[test]
fn a_draft_models_steps_leave_the_free_bets_cap_alone() {
    for seed in 0..3u64 {
        let target = ToyModel::new(64, 1, seed);
        let costs = SharedCosts::new(CostModel {
            target: CostCurve::linear(30.0, 0.5, 128).unwrap(),
            draft: Some(CostCurve::linear(2.0, 1.0, 128).unwrap()),
            refine: false,
            elsewhere: false,
        });
        let (trace, buf) = memory_trace();
        let config = AutoConfig {
            costs,
            suffix: SuffixConfig { max_depth: 6, shared: SuffixShared::empty(), ..Default::default() },
            dyspec: DySpecConfig { budget: 12, max_depth: 6, ..Default::default() },
            trace: Some(trace),
        };
        let mut d = AutoDrafter::new(Some(ToyLm::new(target.draft(0.0, seed), CTX)), config).unwrap();
        let prompt: Vec<TokenId> = (0..12).map(|i| ((i * 7 + seed) % 64) as TokenId).collect();
        let req = GenerateRequest::new(prompt, 60, SamplingParams::greedy(), 0);
        let out = run_on(&mut ToyLm::new(target.clone(), CTX), &mut d, &req);
        let plain = run_on(&mut ToyLm::new(target, CTX), &mut PlainDrafter, &req).tokens;
        assert_eq!(out.tokens, plain, "seed {seed}");
        let lines = trace_lines(&buf);
        let whole_model_steps =
            lines.iter().filter(|l| l["chosen"] == "model" && l["emitted"].as_u64().unwrap() >= 3).count();
        assert!(whole_model_steps > 0, "seed {seed}: the draft model never won a long step");
        for l in lines.iter().take_while(|l| l["chosen"] == "model" || l["chosen"] == "plain") {
            assert_eq!(l["bet_cap"], 4, "seed {seed}: a model step moved the cap: {l}");
        }
    }
}

/// A long-match chain ends at a token that ends generation: drafted past it, it would bet rows
/// the answer can never emit. The answer re-emits a stretch of its prompt until it emits the
/// request's end token, which that stretch holds; no step's chain runs past it.
#[test]
fn a_chain_ends_at_the_requests_end_token() {
    let mut checked = 0;
    for seed in 0..12u64 {
        let (target, mut req) = copy_case(seed);
        // The copied stretch starts after the first 20-token head; the end token is the first
        // token of it whose first appearance there is 24 or more tokens in.
        let middle = &req.prompt[20..170];
        let Some(k) = (24..middle.len())
            .find(|&k| !middle[..k].contains(&middle[k]) && !req.prompt[..20].contains(&middle[k]))
        else {
            continue;
        };
        let end = middle[k];
        req.stop = StopConditions { eos: vec![end], ..Default::default() };
        let (trace, buf) = memory_trace();
        let mut d = auto(costs(30.0, 0.5), SuffixShared::empty(), Some(trace));
        let out = run_on(&mut ToyLm::new(target.clone(), CTX), &mut d, &req);
        let plain = run_on(&mut ToyLm::new(target, CTX), &mut PlainDrafter, &req).tokens;
        assert_eq!(out.tokens, plain, "seed {seed}");
        assert_eq!(plain.len(), k, "seed {seed}: the answer did not end at its end token");
        let lines = trace_lines(&buf);
        for l in &lines {
            // The root is answer token `emitted_so_far - 1`; the chain drafts from the next one,
            // and may draft the end token itself (at answer position k).
            let so_far = l["context"].as_u64().unwrap() as usize - req.prompt.len();
            let chain = l["long_match_chain"].as_u64().unwrap() as usize;
            assert!(chain <= k + 1 - so_far, "seed {seed}: a chain of {chain} past the end token: {l}");
        }
        assert!(lines.iter().any(|l| l["long_match_chain"].as_u64().unwrap() > 0), "seed {seed}");
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} seeds had an end token to test");
}

/// 240 sampled tokens of `auto` priced on `costs`, on a "machine" where a forward of n rows
/// takes 1.5 n + 0.3 n² ms, from a periodic prompt that offers imperfect copies at every step;
/// the decision trace's lines.
fn run_on_a_slow_machine(costs: Arc<SharedCosts>) -> Vec<serde_json::Value> {
    let target = ToyModel::new(8, 1, 5).with_sharpness(1.5);
    let head: Vec<TokenId> = (0..24).map(|i| (i % 8) as TokenId).collect();
    let prompt = [&head[..], &head[..], &head[..], &head[..]].concat();
    let (trace, buf) = memory_trace();
    let mut d = auto(costs, SuffixShared::empty(), Some(trace));
    let slow = |n: usize| Duration::from_micros(1500 * n as u64 + 300 * (n * n) as u64);
    let mut lm = ToyLm::new(target, CTX).with_forward_time(slow);
    let req = GenerateRequest::new(prompt, 240, SamplingParams::with_temperature(1.0), 1);
    let out = run_on(&mut lm, &mut d, &req);
    assert_eq!(out.tokens.len(), 240);
    trace_lines(&buf)
}

/// The curve says rows are nearly free (T(n) = 30 + 0.1 n ms), so every copy looks worth
/// verifying far out; on this "machine" a forward of n rows takes 1.5 n + 0.3 n² ms, so plain
/// decoding (1.8 ms a token) beats even a fully accepted 8-token chain (9 rows: 38 ms, 4.2 ms a
/// token). The copies are imperfect (a sampled target leaves them often). `auto`'s books must
/// overrule the curve: after a few steps it decodes plainly, while the curve alone would draft on.
#[test]
fn a_curve_that_lies_gives_way_to_the_time_steps_really_take() {
    let lines = run_on_a_slow_machine(costs(30.0, 0.1));
    let offered_draft = |l: &serde_json::Value| l["offers"].as_array().unwrap().len() > 1;
    // The curve's own verdict on every step that had a draft on offer: draft (its prediction
    // beats plain decoding's).
    let curve_drafts = lines
        .iter()
        .filter(|l| offered_draft(l))
        .filter(|l| {
            let offers = l["offers"].as_array().unwrap();
            let rate = l["rate"].as_f64().unwrap();
            let gain = |o: &serde_json::Value| {
                o["predicted"]["tokens"].as_f64().unwrap() - rate * o["predicted"]["ms"].as_f64().unwrap()
            };
            offers[1..].iter().any(|o| gain(o) > gain(&offers[0]))
        })
        .count();
    let offered = lines.iter().filter(|l| offered_draft(l)).count();
    assert!(offered >= 40 && curve_drafts as f64 >= 0.9 * offered as f64, "{curve_drafts} of {offered}");
    // What auto did on the second half of those steps.
    let late: Vec<_> = lines.iter().filter(|l| offered_draft(l)).skip(offered / 2).collect();
    let drafted = late.iter().filter(|l| l["chosen"] != "plain").count();
    assert!(
        (drafted as f64) <= 0.25 * late.len() as f64,
        "auto still drafted on {drafted} of the last {} steps with a draft on offer",
        late.len()
    );
    // The books say why: the drafts' time ran far above the curve.
    let last = late.last().unwrap();
    let corrected = last["offers"].as_array().unwrap()[1..]
        .iter()
        .map(|o| o["correction"]["ms"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min);
    assert!(corrected > 1.5, "time corrections stayed near the curve: {last}");
}

/// The same lying curve, given as another machine's (`elsewhere`, what `TREESPEC_COSTS=file:`
/// sets for a GPU's curve replayed on a CPU): this machine's slow forwards say nothing about
/// that machine, so the books time each step on the curve and `auto` keeps drafting as the
/// curve says it pays — the choices that machine would make, recorded here.
#[test]
fn another_machines_curve_is_trusted_over_this_machines_clock() {
    let lines = run_on_a_slow_machine(SharedCosts::new(CostModel {
        target: CostCurve::linear(30.0, 0.1, 128).unwrap(),
        draft: None,
        refine: false,
        elsewhere: true,
    }));
    let late: Vec<_> = lines.iter().filter(|l| l["offers"].as_array().unwrap().len() > 1).skip(20).collect();
    assert!(late.len() >= 20, "too few steps with a draft on offer: {}", late.len());
    let drafted = late.iter().filter(|l| l["chosen"] != "plain").count();
    assert!(
        drafted as f64 >= 0.75 * late.len() as f64,
        "auto gave way to this machine's clock ({drafted} of {} steps drafted)",
        late.len()
    );
    for l in &late {
        for o in &l["offers"].as_array().unwrap()[1..] {
            let ms = o["correction"]["ms"].as_f64().unwrap();
            assert!((ms - 1.0).abs() < 0.05, "a time correction away from the curve: {l}");
        }
    }
}

const RUNS: u64 = 20_000;

/// χ² on an enumerable target with the long-match chain on offer at every run's start (a
/// periodic prompt whose end occurs earlier), the chain's acceptance and the tenant's books
/// carried from run to run through one shared state.
#[test]
fn sampled_joint_distribution_with_long_match_chains_is_the_targets() {
    let prompt: Vec<TokenId> = (0..40).map(|i| (i % 4) as TokenId).collect();
    let settings = [
        ("T=1", SamplingParams::with_temperature(1.0)),
        ("top-p 0.9", SamplingParams { temperature: 1.0, top_p: 0.9, ..Default::default() }),
    ];
    let targets =
        [("v4 sharp", ToyModel::new(4, 1, 61).with_sharpness(3.0)), ("v5", ToyModel::new(5, 2, 62))];
    let alpha = FAMILY_ALPHA / (settings.len() * targets.len()) as f64;
    let mut failures = Vec::new();
    let mut total_long = 0;
    for (tname, target) in &targets {
        for (sname, params) in &settings {
            let exact = target.exact_joint(&Sampler::new(params.clone()).unwrap(), &prompt, 3).unwrap();
            // The suffix drafter prices every node out (it drafts the same copies), so the
            // steps that draft are the long-match chain's.
            let suffix = SuffixConfig { max_depth: 6, pessimism: 5.0, min_value: 1.0, ..Default::default() };
            let config =
                AutoConfig { costs: costs(30.0, 0.01), suffix, dyspec: DySpecConfig::default(), trace: None };
            let mut d = AutoDrafter::<ToyLm>::new(None, config).unwrap();
            let v = target.vocab;
            let mut counts = vec![0u64; v * v * v];
            let mut long_steps = 0;
            for r in 0..RUNS {
                let out = run_on(
                    &mut ToyLm::new(target.clone(), CTX),
                    &mut d,
                    &GenerateRequest::new(prompt.clone(), 3, params.clone(), r),
                );
                let t = &out.tokens;
                counts[(t[0] as usize * v + t[1] as usize) * v + t[2] as usize] += 1;
                long_steps += d.extra_stats().auto.unwrap().long_match_steps;
            }
            let what = format!("{tname} {sname}");
            let gof = chi_square(&counts, &exact).unwrap_or_else(|e| panic!("{what}: {e}"));
            println!("χ² {what:>16}: p = {:.4}, df {} (long-match steps {long_steps})", gof.p_value, gof.df);
            // Where the target leaves the copy at once (v5), the books soon stop verifying the
            // chain: what stays exact then is the choice carried from run to run.
            assert!(long_steps > 0, "{what}: the long-match chain was never verified");
            total_long += long_steps;
            if gof.p_value <= alpha {
                failures.push(format!("{what}: p = {:.3e} ≤ {alpha:.1e}", gof.p_value));
            }
        }
    }
    assert!(total_long > RUNS, "the long-match chain was rarely verified ({total_long})");
    assert!(failures.is_empty(), "joint distribution differs from the target's:\n{}", failures.join("\n"));
}

/// Per lane in a continuous batch: each request's chains are its own, cut by the batch budget
/// where they do not pay on the merged forward, and every request emits what it emits alone.
#[test]
fn in_a_batch_each_lane_drafts_its_own_chains_and_stays_exact() {
    let greedy = SamplingParams::greedy();
    let target = ToyModel::new(64, 1, 9);
    let (trace, buf) = memory_trace();
    let shared = SuffixShared::empty();
    let mut jobs = Vec::new();
    let mut alone = Vec::new();
    for j in 0..4u64 {
        let head: Vec<TokenId> = (0..20).map(|i| ((i * 5 + j * 11) % 64) as TokenId).collect();
        let prompt = copying_prompt(&target, &head, 100);
        let req = GenerateRequest::new(prompt.clone(), 80, greedy.clone(), j);
        alone.push(run_on(&mut ToyLm::new(target.clone(), CTX), &mut PlainDrafter, &req).tokens);
        let drafter = auto(costs(30.0, 0.5), shared.clone(), Some(trace.clone()));
        jobs.push(Prepared::free(req, Box::new(drafter)));
    }
    let mut lm = ToyBatchLm::new(target.clone(), CTX, 4).with_capacity(4 * CTX);
    let limits = StepLimits { prefill_chunk: 64, max_tree: 64, ..StepLimits::default() };
    let outputs = run_batched(&mut lm, jobs, 4, limits, None, None);
    for (j, (out, plain)) in outputs.into_iter().zip(&alone).enumerate() {
        assert_eq!(&out.unwrap().tokens, plain, "job {j}");
    }
    let lines = trace_lines(&buf);
    let batched_long =
        lines.iter().filter(|l| l["chosen"] == "long-match" && l["batch_rows"].as_u64().unwrap() > 0).count();
    assert!(batched_long > 0, "no lane drafted a long-match chain beside others");
    assert!(lines.iter().all(|l| l["step_ms"].as_f64().unwrap() >= 0.0));
}
