//! Sequoia (DP-optimal fixed trees) and DISCO (dynamic chain lookahead) on toy models:
//! greedy token-exactness, sampling losslessness (joint χ² of the first three tokens), the DP's
//! predicted τ against measurement, the threshold re-fit, the classifier, and bad configs.
//!
//! Numbers worth reading are printed; run with `--nocapture` to see them.

#[path = "../../treespec-core/tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{chi_square, FAMILY_ALPHA};
use treespec_core::disco::{ConfidenceThreshold, DiscoModel, Features};
use treespec_core::sampling::{Sampler, SamplingParams};
use treespec_core::sequoia::optimal_tree;
use treespec_engine::drafters::{
    ChainDrafter, DiscoConfig, DiscoDrafter, DiscoMode, SequoiaConfig, SequoiaDrafter,
};
use treespec_engine::measure::offline::{collect_training_data, measure_acceptance, AcceptanceVector};
use treespec_engine::toy::{Support, ToyLm, ToyModel};
use treespec_engine::{
    generate, Drafter, EngineError, GenerateOutput, GenerateRequest, PlainDrafter, StopConditions,
};

const CTX: usize = 512;

fn lm(m: &ToyModel) -> ToyLm {
    ToyLm::new(m.clone(), CTX)
}

fn run(
    target: &ToyModel,
    d: &mut dyn Drafter,
    prompt: &[u32],
    n: usize,
    s: &SamplingParams,
    seed: u64,
) -> GenerateOutput {
    let req = GenerateRequest {
        prompt: prompt.to_vec(),
        max_new_tokens: n,
        sampling: s.clone(),
        seed,
        stop: StopConditions::default(),
    };
    generate(&mut lm(target), d, &req, None, &mut |_| true).unwrap()
}

fn prompts(vocab: usize, count: usize, len: usize, seed: u64) -> Vec<Vec<u32>> {
    (0..count as u64)
        .map(|i| {
            (0..len as u64).map(|j| ((seed * 7919 + i * 31 + j * 17 + i * j) % vocab as u64) as u32).collect()
        })
        .collect()
}

/// A DISCO classifier trained on greedy oracle data of a toy pair.
fn trained_classifier(
    target: &ToyModel,
    draft: &ToyModel,
    prompt_seed: u64,
) -> (DiscoModel, Vec<(Features, bool)>) {
    let ps = prompts(target.vocab, 12, 4, prompt_seed);
    let data = collect_training_data(&mut lm(target), &mut lm(draft), &ps, 80, 10).unwrap();
    let (x, y): (Vec<Features>, Vec<bool>) = data.iter().cloned().unzip();
    (DiscoModel::train(&x, &y).unwrap(), data)
}

fn sequoia(
    draft: &ToyModel,
    acceptance: &[f32],
    budget: usize,
    max_depth: Option<usize>,
) -> SequoiaDrafter<ToyLm> {
    SequoiaDrafter::new(lm(draft), SequoiaConfig { budget, max_depth, acceptance: acceptance.to_vec() })
        .unwrap()
}

fn disco(draft: &ToyModel, mode: DiscoMode, stop_prob: f32) -> DiscoDrafter<ToyLm> {
    DiscoDrafter::new(lm(draft), DiscoConfig { mode, stop_prob, ..Default::default() }).unwrap()
}

#[test]
fn greedy_output_equals_plain_decoding() {
    let greedy = SamplingParams::greedy();
    let mut checked = 0;
    for seed in 0..8u64 {
        let vocab = [4, 8, 16, 64][seed as usize % 4];
        let target = ToyModel::new(vocab, 1 + seed as usize % 3, seed);
        let prompt: Vec<u32> = (0..3).map(|i| ((seed + i) % vocab as u64) as u32).collect();
        let plain = run(&target, &mut PlainDrafter, &prompt, 48, &greedy, 1).tokens;
        let (model, _) = trained_classifier(&target, &target.draft(1.0, seed + 50), seed);
        let model = Arc::new(model);
        for (noise, support) in
            [(0.0, Support::All), (1.0, Support::All), (3.0, Support::All), (0.0, Support::Odd)]
        {
            let draft = target.draft(noise, seed + 100).with_support(support);
            let mut drafters: Vec<Box<dyn Drafter>> = vec![
                Box::new(sequoia(&draft, &[0.6, 0.2, 0.1], 16, None)),
                Box::new(sequoia(&draft, &[0.8], 5, None)),
                Box::new(sequoia(&draft, &[0.3, 0.3, 0.2, 0.1], 12, Some(3))),
                Box::new(disco(&draft, DiscoMode::Threshold, 0.5)),
                Box::new(disco(&draft, DiscoMode::Classifier(model.clone()), 0.5)),
                Box::new(disco(&draft, DiscoMode::Classifier(model.clone()), 0.05)),
            ];
            for d in drafters.iter_mut() {
                // Twice with the same drafter: DISCO's threshold carries over between generations.
                for _ in 0..2 {
                    let out = run(&target, d.as_mut(), &prompt, 48, &greedy, 1);
                    assert_eq!(
                        out.tokens,
                        plain,
                        "seed {seed} noise {noise} {support:?} drafter {}",
                        d.name()
                    );
                    if noise == 0.0 && support == Support::All && d.name() == "sequoia" {
                        assert!(
                            out.stats.mean_accepted() > 1.5,
                            "identical draft: {}",
                            out.stats.mean_accepted()
                        );
                    }
                    checked += 1;
                }
            }
        }
    }
    println!("greedy equality: {checked} generations of 48 tokens equal plain decoding");
}

#[test]
fn context_window_and_short_requests_are_respected() {
    let target = ToyModel::new(8, 2, 3);
    let draft = target.draft(0.5, 4);
    let greedy = SamplingParams::greedy();
    let prompt = vec![1, 2, 3];
    let plain = {
        let req = GenerateRequest {
            prompt: prompt.clone(),
            max_new_tokens: 100,
            sampling: greedy.clone(),
            seed: 0,
            stop: StopConditions::default(),
        };
        generate(&mut ToyLm::new(target.clone(), 12), &mut PlainDrafter, &req, None, &mut |_| true)
            .unwrap()
            .tokens
    };
    let mut drafters: Vec<Box<dyn Drafter>> = vec![
        Box::new(
            SequoiaDrafter::new(
                ToyLm::new(draft.clone(), 12),
                SequoiaConfig { budget: 32, acceptance: vec![0.5, 0.3], ..Default::default() },
            )
            .unwrap(),
        ),
        Box::new(DiscoDrafter::new(ToyLm::new(draft.clone(), 12), DiscoConfig::default()).unwrap()),
    ];
    for d in drafters.iter_mut() {
        let req = GenerateRequest {
            prompt: prompt.clone(),
            max_new_tokens: 100,
            sampling: greedy.clone(),
            seed: 0,
            stop: StopConditions::default(),
        };
        let out =
            generate(&mut ToyLm::new(target.clone(), 12), d.as_mut(), &req, None, &mut |_| true).unwrap();
        assert_eq!(out.tokens, plain, "{}", d.name());
        for n in 1..4 {
            assert_eq!(run(&target, d.as_mut(), &prompt, n, &greedy, 0).tokens.len(), n);
        }
    }
}

/// The DP's expected τ, computed from a vector measured with `measure_acceptance` on the same
/// pair, against the mean accepted length of real generations with that tree.
#[test]
fn dp_expected_tau_matches_measured_mean_accepted_length() {
    let target = ToyModel::new(12, 2, 21).with_sharpness(2.5);
    let draft = target.draft(0.8, 22);
    let mut report = Vec::new();
    for (label, params) in [
        ("greedy", SamplingParams::greedy()),
        ("T=1", SamplingParams::with_temperature(1.0)),
        ("T=1 top-p 0.9", SamplingParams { temperature: 1.0, top_p: 0.9, ..Default::default() }),
    ] {
        let sampler = Sampler::new(params.clone()).unwrap();
        let calib = prompts(12, 24, 3, 1);
        let acc = measure_acceptance(&mut lm(&target), &mut lm(&draft), &calib, 150, 4, &sampler, 5).unwrap();
        assert_eq!(acc.positions, 24 * 150);
        assert!(acc.acceptance.iter().sum::<f32>() <= 1.0 + 1e-6);
        for (budget, depth) in [(4, None), (12, None), (24, Some(5))] {
            let opt = optimal_tree(&acc.acceptance, budget, depth).unwrap();
            let mut d = sequoia(&draft, &acc.acceptance, budget, depth);
            let (mut emitted, mut steps) = (0u64, 0u64);
            for (i, p) in prompts(12, 16, 3, 2).iter().enumerate() {
                let out = run(&target, &mut d, p, 300, &params, 100 + i as u64);
                emitted += out.stats.emitted;
                steps += out.stats.target_forwards;
            }
            let measured = emitted as f64 / steps as f64;
            let rel = (measured - opt.expected_tau).abs() / opt.expected_tau;
            report.push(format!(
                "{label:>14} P={:?} budget {budget:>2} depth {depth:?}: expected τ {:.3}, measured {measured:.3} ({:+.1}%)",
                acc.acceptance.iter().map(|p| (p * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
                opt.expected_tau,
                100.0 * (measured - opt.expected_tau) / opt.expected_tau
            ));
            assert!(rel < 0.15, "{}", report.last().unwrap());
        }
    }
    println!("{}", report.join("\n"));
}

#[test]
fn threshold_refit_moves_in_the_expected_direction() {
    // Accepted tokens are confident, rejected ones are not: the threshold rises to just below the
    // least confident accepted token, cutting chains at the first doubtful token.
    let mut up = ConfidenceThreshold::default();
    for i in 0..20 {
        let a = 0.7 + 0.01 * (i % 10) as f32;
        up.record(&[a + 0.2, a, 0.1 + 0.01 * (i % 5) as f32, 0.9], 2);
    }
    assert!(up.threshold() > 0.6, "threshold {}", up.threshold());
    // Even fairly unsure tokens are accepted: the threshold falls, drafting further.
    let mut down = ConfidenceThreshold::default();
    for i in 0..20 {
        let a = 0.15 + 0.01 * (i % 10) as f32;
        down.record(&[a + 0.1, a, 0.02 + 0.001 * (i % 5) as f32], 2);
    }
    assert!(down.threshold() < 0.2, "threshold {}", down.threshold());
    // Overlap: missing an accepted token costs 3× a false alarm, so the threshold sits low.
    let mut mixed = ConfidenceThreshold::default();
    for i in 0..40 {
        let x = (i % 10) as f32 / 10.0;
        mixed.record(&[0.5 + 0.5 * x, 0.2 + 0.6 * x], if i % 3 == 0 { 1 } else { 2 });
    }
    println!(
        "threshold re-fit: confident history 0.4 → {:.3}; unsure history 0.4 → {:.3}; overlapping 0.4 → {:.3}",
        up.threshold(),
        down.threshold(),
        mixed.threshold()
    );
    assert!(mixed.threshold() < 0.4);

    // The drafter feeds the re-fit: with a noisy draft the threshold moves away from 0.4.
    let target = ToyModel::new(16, 2, 7).with_sharpness(3.0);
    let draft = target.draft(1.0, 8);
    let mut d = disco(&draft, DiscoMode::Threshold, 0.5);
    for (i, p) in prompts(16, 4, 3, 3).iter().enumerate() {
        run(&target, &mut d, p, 200, &SamplingParams::with_temperature(1.0), i as u64);
    }
    println!(
        "toy run: threshold after 800 tokens {:.3}, history {}",
        d.confidence().threshold(),
        d.confidence().history_len()
    );
    assert!(d.confidence().history_len() > 5);
    assert_ne!(d.confidence().threshold(), 0.4);
}

fn auc(scores: &[f32], labels: &[bool]) -> f64 {
    let pos: Vec<f32> = scores.iter().zip(labels).filter(|(_, &l)| l).map(|(&s, _)| s).collect();
    let neg: Vec<f32> = scores.iter().zip(labels).filter(|(_, &l)| !l).map(|(&s, _)| s).collect();
    let mut wins = 0f64;
    for &p in &pos {
        for &n in &neg {
            wins += if p > n {
                1.0
            } else if p == n {
                0.5
            } else {
                0.0
            };
        }
    }
    wins / (pos.len() * neg.len()) as f64
}

#[test]
fn classifier_beats_chance_on_held_out_prompts() {
    let target = ToyModel::new(16, 2, 11).with_sharpness(3.0);
    let draft = target.draft(1.0, 12);
    let (model, train) = trained_classifier(&target, &draft, 1);
    let held = prompts(16, 8, 4, 99);
    let test = collect_training_data(&mut lm(&target), &mut lm(&draft), &held, 60, 10).unwrap();
    let scores: Vec<f32> = test.iter().map(|(f, _)| model.predict(f)).collect();
    let labels: Vec<bool> = test.iter().map(|&(_, l)| l).collect();
    let base = labels.iter().filter(|&&l| l).count() as f64 / labels.len() as f64;
    let acc =
        scores.iter().zip(&labels).filter(|(&s, &l)| (s >= 0.5) == l).count() as f64 / labels.len() as f64;
    let ll = |p: f64, l: bool| -(if l { p } else { 1.0 - p }).clamp(1e-9, 1.0).ln();
    let model_ll =
        scores.iter().zip(&labels).map(|(&s, &l)| ll(s as f64, l)).sum::<f64>() / labels.len() as f64;
    let base_ll = labels.iter().map(|&l| ll(base, l)).sum::<f64>() / labels.len() as f64;
    let a = auc(&scores, &labels);
    println!(
        "classifier: {} train / {} held-out samples, positive rate {base:.3}; held-out AUC {a:.3}, accuracy {acc:.3} \
         (majority {:.3}), log loss {model_ll:.3} vs base rate {base_ll:.3}",
        train.len(),
        labels.len(),
        base.max(1.0 - base)
    );
    assert!(a > 0.7, "AUC {a}");
    assert!(model_ll < base_ll, "log loss {model_ll} vs {base_ll}");
    assert!(acc >= base.max(1.0 - base) - 0.01);
    // A file round trip keeps the predictions.
    let path = temp_path("disco-model.json");
    model.save(&path).unwrap();
    let back = DiscoModel::load(&path).unwrap();
    assert_eq!(back.predict(&test[0].0), model.predict(&test[0].0));
    std::fs::remove_file(&path).ok();
}

/// Speedup under a simple cost model: a step costs one target forward (1) plus `c` per draft
/// forward, so speedup over plain decoding = τ / (1 + c · draft forwards per step).
#[test]
fn disco_against_the_best_fixed_chain() {
    const CHAINS: usize = 12;
    let target = ToyModel::new(32, 3, 31).with_sharpness(3.0);
    let draft = target.draft(0.8, 32);
    let (model, train) = trained_classifier(&target, &draft, 5);
    let preds: Vec<f32> = train.iter().map(|(f, _)| model.predict(f)).collect();
    let model = Arc::new(model);
    let eval = prompts(32, 10, 4, 77);
    let mut lines = Vec::new();
    for (label, params) in
        [("greedy", SamplingParams::greedy()), ("T=1", SamplingParams::with_temperature(1.0))]
    {
        let mut rows: Vec<(String, f64, f64)> = Vec::new();
        let mut measure = |name: String, d: &mut dyn Drafter| {
            let (mut em, mut steps, mut fw) = (0u64, 0u64, 0u64);
            for (i, p) in eval.iter().enumerate() {
                let out = run(&target, d, p, 200, &params, i as u64);
                em += out.stats.emitted;
                steps += out.stats.target_forwards;
                fw += out.stats.draft_forwards;
            }
            rows.push((name, em as f64 / steps as f64, fw as f64 / steps as f64));
        };
        for k in 1..=CHAINS {
            measure(format!("chain k={k}"), &mut ChainDrafter::new(lm(&draft), k).unwrap());
        }
        let mut thr = disco(&draft, DiscoMode::Threshold, 0.5);
        measure("disco threshold".into(), &mut thr);
        let final_threshold = thr.confidence().threshold();
        measure("disco classifier 0.5".into(), &mut disco(&draft, DiscoMode::Classifier(model.clone()), 0.5));
        for stop in [0.3, 0.15] {
            measure(
                format!("disco classifier {stop}"),
                &mut disco(&draft, DiscoMode::Classifier(model.clone()), stop),
            );
        }
        let speed = |r: &(String, f64, f64), c: f64| r.1 / (1.0 + c * r.2);
        for r in &rows {
            lines.push(format!(
                "{label:>6} {:<22} τ {:.2}  draft fwd/step {:>5.2}  speedup c=0.05 {:.2}  c=0.2 {:.2}",
                r.0,
                r.1,
                r.2,
                speed(r, 0.05),
                speed(r, 0.2)
            ));
        }
        for c in [0.05, 0.2] {
            let best = |rs: &[(String, f64, f64)]| {
                rs.iter().max_by(|a, b| speed(a, c).total_cmp(&speed(b, c))).cloned().expect("rows")
            };
            let (chain, dyn_) = (best(&rows[..CHAINS]), best(&rows[CHAINS..]));
            lines.push(format!(
                "{label:>6} c={c}: best fixed {} {:.2}× vs best DISCO {} {:.2}×",
                chain.0,
                speed(&chain, c),
                dyn_.0,
                speed(&dyn_, c)
            ));
        }
        lines.push(format!("{label:>6} threshold mode ended at threshold {final_threshold:.3}"));
        for r in &rows[CHAINS..] {
            assert!(r.1 > 1.0, "{} never accepted anything", r.0);
        }
    }
    let mut sorted = preds.clone();
    sorted.sort_by(f32::total_cmp);
    lines.push(format!(
        "classifier predictions on its training data: p10 {:.2} median {:.2} p90 {:.2}",
        sorted[sorted.len() / 10],
        sorted[sorted.len() / 2],
        sorted[sorted.len() * 9 / 10]
    ));
    println!("{}", lines.join("\n"));
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("treespec-test-{}-{name}", std::process::id()))
}

fn invalid(r: Result<impl Sized, EngineError>) -> String {
    match r {
        Err(EngineError::InvalidRequest(m)) => m,
        Err(e) => panic!("expected an invalid-request error, got {e}"),
        Ok(_) => panic!("expected an error"),
    }
}

#[test]
fn bad_configs_and_files_are_errors() {
    let draft = ToyModel::new(8, 1, 1);
    let sq = |c: SequoiaConfig| SequoiaDrafter::new(lm(&draft), c).map(|_| ());
    let ok = SequoiaConfig { acceptance: vec![0.5, 0.2], ..Default::default() };
    assert!(sq(ok.clone()).is_ok());
    assert!(invalid(sq(SequoiaConfig { budget: 0, ..ok.clone() })).contains("budget"));
    assert!(invalid(sq(SequoiaConfig { max_depth: Some(0), ..ok.clone() })).contains("depth"));
    assert!(invalid(sq(SequoiaConfig::default())).contains("calibrate"));
    assert!(invalid(sq(SequoiaConfig { acceptance: vec![0.7, 0.6], ..ok.clone() })).contains("sum"));
    assert!(invalid(sq(SequoiaConfig { acceptance: vec![-0.1], ..ok.clone() })).contains("acceptance"));

    let dc = |c: DiscoConfig| DiscoDrafter::new(lm(&draft), c).map(|_| ());
    assert!(dc(DiscoConfig::default()).is_ok());
    assert!(invalid(dc(DiscoConfig { threshold: -0.1, ..Default::default() })).contains("threshold"));
    assert!(invalid(dc(DiscoConfig { threshold: f32::NAN, ..Default::default() })).contains("threshold"));
    assert!(invalid(dc(DiscoConfig { max_tokens: 0, ..Default::default() })).contains("max tokens"));
    assert!(invalid(dc(DiscoConfig { stop_prob: 1.5, ..Default::default() })).contains("stop"));

    // Calibration files: missing, malformed, wrong version; a good one round-trips.
    let missing = temp_path("no-such-calibration.json");
    assert!(invalid(AcceptanceVector::load(&missing)).contains("cannot read"));
    let bad = temp_path("bad-calibration.json");
    std::fs::write(&bad, "{\"version\": 1, \"acceptance\": [0.5").unwrap();
    assert!(invalid(AcceptanceVector::load(&bad)).contains("malformed"));
    let target = ToyModel::new(8, 1, 2);
    let sampler = Sampler::new(SamplingParams::with_temperature(1.0)).unwrap();
    let acc = measure_acceptance(&mut lm(&target), &mut lm(&draft), &prompts(8, 2, 2, 0), 20, 3, &sampler, 1)
        .unwrap()
        .with_identity("target.gguf (123 bytes)", "draft.gguf (45 bytes)");
    let good = temp_path("calibration.json");
    acc.save(&good).unwrap();
    let back = AcceptanceVector::load(&good).unwrap();
    assert_eq!(back, acc);
    back.check_matches("target.gguf (123 bytes)", "draft.gguf (45 bytes)", 1.0).unwrap();
    assert!(back.check_matches("other.gguf", "draft.gguf (45 bytes)", 1.0).is_err());
    assert!(back.check_matches("target.gguf (123 bytes)", "draft.gguf (45 bytes)", 0.7).is_err());
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&good).unwrap()).unwrap();
    v["version"] = 7.into();
    std::fs::write(&bad, v.to_string()).unwrap();
    assert!(invalid(AcceptanceVector::load(&bad)).contains("version"));
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&good).unwrap()).unwrap();
    v["acceptance"] = serde_json::json!([0.9, 0.9, 0.9]);
    std::fs::write(&bad, v.to_string()).unwrap();
    assert!(invalid(AcceptanceVector::load(&bad)).contains("sum"));
    // Malformed DISCO model files.
    std::fs::write(&bad, "not json").unwrap();
    assert!(DiscoModel::load(&bad).is_err());
    assert!(DiscoModel::load(&missing).is_err());
    std::fs::remove_file(&bad).ok();
    std::fs::remove_file(&good).ok();
    // Calibration arguments.
    assert!(measure_acceptance(&mut lm(&target), &mut lm(&draft), &prompts(8, 1, 2, 0), 5, 0, &sampler, 1)
        .is_err());
    assert!(collect_training_data(&mut lm(&target), &mut lm(&draft), &prompts(8, 1, 2, 0), 5, 0).is_err());
    let wide = ToyModel::new(9, 1, 2);
    assert!(matches!(
        measure_acceptance(&mut lm(&wide), &mut lm(&draft), &prompts(8, 1, 2, 0), 5, 2, &sampler, 1),
        Err(EngineError::Incompatible(_))
    ));
}

// ---- Sampling losslessness: joint χ² of the first three emitted tokens ------------------------

const RUNS: u64 = 20_000;

#[test]
fn sampling_joint_distribution_is_the_targets() {
    type Make = Box<dyn Fn(&ToyModel, &ToyModel) -> Box<dyn Drafter>>;
    let pairs = [
        ("v5 noisy", ToyModel::new(5, 2, 41).with_sharpness(2.0), 1.0, Support::All, vec![1u32, 3]),
        ("v6 disjoint", ToyModel::new(6, 1, 42).with_sharpness(1.5), 0.5, Support::Odd, vec![2u32]),
        ("v4 equal", ToyModel::new(4, 2, 43), 0.0, Support::All, vec![0u32, 1]),
    ];
    let settings = [
        ("T=1", SamplingParams::with_temperature(1.0)),
        ("top-p 0.9", SamplingParams { temperature: 1.0, top_p: 0.9, ..Default::default() }),
    ];
    let mut results = Vec::new();
    let configs = pairs.len() * settings.len() * 3;
    let t0 = std::time::Instant::now();
    for (pname, target, noise, support, prompt) in &pairs {
        let draft = target.draft(*noise, 1000 + target.seed).with_support(*support);
        // The classifier's stop probability sits at its median prediction so both decisions occur.
        let (model, data) = trained_classifier(target, &draft, target.seed);
        let mut preds: Vec<f32> = data.iter().map(|(f, _)| model.predict(f)).collect();
        preds.sort_by(f32::total_cmp);
        let median = preds[preds.len() / 2];
        let model = Arc::new(model);
        let makers: Vec<(&str, Make)> = vec![
            ("sequoia", Box::new(|_, d| Box::new(sequoia(d, &[0.4, 0.25, 0.15, 0.1], 10, None)))),
            ("disco-threshold", Box::new(|_, d| Box::new(disco(d, DiscoMode::Threshold, 0.5)))),
            (
                "disco-classifier",
                Box::new(move |_, d| Box::new(disco(d, DiscoMode::Classifier(model.clone()), median))),
            ),
        ];
        for (sname, params) in &settings {
            let exact = target.exact_joint(&Sampler::new(params.clone()).unwrap(), prompt, 3).unwrap();
            for (dname, make) in &makers {
                let mut d = make(target, &draft);
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
                results.push((what, gof.p_value, gof.df, drafted as f64 / RUNS as f64));
            }
        }
    }
    let alpha = FAMILY_ALPHA / configs as f64;
    for (what, p, df, drafted) in &results {
        println!("χ² {what:>38}: p = {p:.4}, df {df} (drafted {drafted:.2} nodes/run)");
    }
    println!(
        "{configs} configs × {RUNS} runs in {:.1}s; per-test α = {alpha:.1e}",
        t0.elapsed().as_secs_f64()
    );
    for (what, p, _, _) in &results {
        assert!(*p > alpha, "{what}: joint distribution differs from the target's (p = {p:.3e})");
    }
}
