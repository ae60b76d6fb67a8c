//! Whole-loop losslessness (ALGORITHMS.md §4.2): the first L tokens that `generate` emits with a
//! speculative drafter must have exactly the joint distribution of sampling from the target
//! alone. The toy target is enumerable, so the exact joint over all V^L sequences is the product
//! of the target's processed conditionals (`ToyModel::logits` + `Sampler::distribution`, the
//! same processing the loop applies); the empirical counts of many seeded runs are chi-square
//! tested against it (Bonferroni across the configurations of this file). This catches wrong
//! residuals, wrong sibling handling and KV/commit off-by-ones that single-position tests miss.
//!
//! Also checked: every step emits at most depth + 1 tokens along a chain of accepted nodes; an
//! identical draft is always accepted; the same seed gives the same output; temperature → 0 gives
//! the greedy output.

#[path = "../../treespec-core/tests/common/mod.rs"]
mod common;

use common::{chi_square, FAMILY_ALPHA};
use treespec_core::cost::shapes::ShapeBuckets;
use treespec_core::sampling::{Sampler, SamplingParams};
use treespec_core::tree::{TokenTree, ROOT};
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;
use treespec_engine::drafters::{ChainDrafter, SampleMode, TreeDrafter};
use treespec_engine::toy::{Support, ToyLm, ToyModel};
use treespec_engine::{
    generate, CausalLm, Drafter, GenerateOutput, GenerateRequest, PlainDrafter, ProposeContext,
};

/// Context window of the toy models (never the limit here).
const CTX: usize = 64;

// ---------------------------------------------------------------------------------------------
// A drafter wrapper that checks every step's outcome.

/// Forwards to the wrapped drafter and asserts, at every step, that the outcome is a chain of
/// accepted tree nodes plus one bonus token, and that τ = emitted tokens ≤ depth + 1.
struct Checked {
    inner: Box<dyn Drafter>,
    steps: u64,
}

impl Checked {
    fn new(inner: Box<dyn Drafter>) -> Self {
        Self { inner, steps: 0 }
    }
}

impl Drafter for Checked {
    fn kind(&self) -> treespec_engine::MethodKind {
        self.inner.kind()
    }
    fn begin(&mut self, prompt: &[TokenId], sampler: &Sampler, seed: u64) -> treespec_engine::Result<()> {
        self.inner.begin(prompt, sampler, seed)
    }
    fn propose(&mut self, ctx: &ProposeContext) -> treespec_engine::Result<TokenTree> {
        self.inner.propose(ctx)
    }
    fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) -> treespec_engine::Result<()> {
        self.steps += 1;
        let tau = outcome.tokens.len();
        assert_eq!(tau, outcome.accepted.len() + 1, "accepted tokens plus exactly one bonus");
        assert!(tau <= tree.max_depth() + 1, "τ = {tau} > depth {} + 1", tree.max_depth());
        let mut parent = ROOT;
        for (i, &n) in outcome.accepted.iter().enumerate() {
            assert_eq!(tree.node(n).parent, Some(parent), "accepted nodes must form a root path");
            assert_eq!(outcome.tokens[i], tree.node(n).token);
            parent = n;
        }
        self.inner.observe(tree, outcome)
    }
    fn draft_forwards(&self) -> u64 {
        self.inner.draft_forwards()
    }
}

// ---------------------------------------------------------------------------------------------
// Configurations.

#[derive(Debug, Clone, Copy)]
enum Method {
    Plain,
    Chain(usize),
    /// Fixed tree drawn without replacement (family 2).
    Tree(&'static [usize]),
    /// SpecInfer expansion tree drawn i.i.d. (family 1).
    TreeIid(&'static [usize]),
}

#[derive(Debug, Clone)]
struct Config {
    vocab: usize,
    order: usize,
    seed: u64,
    sharpness: f32,
    target_support: Support,
    draft_support: Support,
    noise: f32,
    method: Method,
    sampling: SamplingParams,
    /// Tokens generated and tested per run (L).
    len: usize,
    runs: u64,
}

impl Config {
    fn target(&self) -> ToyModel {
        ToyModel::new(self.vocab, self.order, self.seed)
            .with_sharpness(self.sharpness)
            .with_support(self.target_support)
    }

    fn draft(&self) -> ToyModel {
        self.target().draft(self.noise, self.seed + 1000).with_support(self.draft_support)
    }

    fn prompt(&self) -> Vec<TokenId> {
        (0..3).map(|i| ((self.seed as usize + 2 * i + 1) % self.vocab) as TokenId).collect()
    }

    fn drafter(&self) -> Box<dyn Drafter> {
        drafter(self.method, &self.draft())
    }

    fn name(&self) -> String {
        let s = &self.sampling;
        format!(
            "{:?} V{} o{} L{} {} noise {} draft {:?}/target {:?} T{}{}{}",
            self.method,
            self.vocab,
            self.order,
            self.len,
            if self.sharpness == 2.0 { String::new() } else { format!("sharp {}", self.sharpness) },
            self.noise,
            self.draft_support,
            self.target_support,
            s.temperature,
            s.top_k.map(|k| format!(" top-k {k}")).unwrap_or_default(),
            if s.top_p < 1.0 { format!(" top-p {}", s.top_p) } else { String::new() },
        )
    }
}

fn drafter(method: Method, draft: &ToyModel) -> Box<dyn Drafter> {
    let lm = ToyLm::new(draft.clone(), CTX);
    match method {
        Method::Plain => Box::new(PlainDrafter),
        Method::Chain(k) => Box::new(ChainDrafter::new(lm, k).unwrap()),
        Method::Tree(w) => Box::new(TreeDrafter::new(lm, w.to_vec()).unwrap()),
        Method::TreeIid(w) => Box::new(TreeDrafter::with_mode(lm, w.to_vec(), SampleMode::Iid).unwrap()),
    }
}

fn temp(t: f32) -> SamplingParams {
    SamplingParams::with_temperature(t)
}

fn top_k(t: f32, k: usize) -> SamplingParams {
    SamplingParams { temperature: t, top_k: Some(k), ..Default::default() }
}

fn top_p(t: f32, p: f32) -> SamplingParams {
    SamplingParams { temperature: t, top_p: p, ..Default::default() }
}

/// Runs per configuration.
const RUNS: u64 = 50_000;

fn configs() -> Vec<Config> {
    use Method::*;
    use Support::*;
    let c = |vocab: usize,
             order: usize,
             seed: u64,
             noise: f32,
             supports: (Support, Support),
             method: Method,
             sampling: SamplingParams| Config {
        vocab,
        order,
        seed,
        sharpness: 2.0,
        target_support: supports.0,
        draft_support: supports.1,
        noise,
        method,
        sampling,
        len: if vocab == 4 { 4 } else { 3 },
        runs: RUNS,
    };
    let all = (All, All);
    let flat = |mut x: Config| {
        x.sharpness = 1.0;
        x
    };
    vec![
        // Plain decoding through the same loop: the reference itself.
        c(5, 2, 1, 0.0, all, Plain, temp(1.0)),
        c(6, 2, 2, 0.0, all, Plain, top_k(0.5, 3)),
        // Chains.
        c(6, 1, 3, 1.0, all, Chain(3), temp(1.0)),
        c(5, 2, 4, 0.0, all, Chain(3), temp(1.0)),
        c(4, 2, 5, 3.0, all, Chain(2), temp(0.5)),
        c(6, 2, 6, 0.0, (Even, Odd), Chain(3), temp(1.0)),
        c(6, 2, 7, 1.0, all, Chain(3), top_p(1.0, 0.9)),
        c(4, 1, 8, 1.0, all, Chain(3), top_k(1.0, 3)),
        flat(c(4, 2, 9, 1.0, all, Chain(4), temp(0.5))),
        // Fixed trees, without replacement.
        c(5, 2, 10, 1.0, all, Tree(&[1, 1, 1]), temp(1.0)),
        c(6, 2, 11, 1.0, all, Tree(&[3, 2, 1]), temp(1.0)),
        c(4, 2, 12, 3.0, all, Tree(&[3, 2, 1]), temp(0.5)),
        c(4, 2, 13, 1.0, all, Tree(&[2, 2, 2, 2]), temp(1.0)),
        c(5, 1, 14, 0.0, all, Tree(&[2, 2, 2, 2]), temp(1.0)),
        c(6, 2, 15, 1.0, all, Tree(&[3, 2, 1]), top_k(1.0, 3)),
        c(5, 2, 16, 3.0, all, Tree(&[2, 2, 2, 2]), top_p(1.0, 0.9)),
        c(6, 1, 17, 0.0, (Odd, Even), Tree(&[3, 2, 1]), temp(0.5)),
        // Wider than the top-k support: the drafter runs out of tokens.
        c(5, 2, 18, 3.0, all, Tree(&[4, 1]), top_k(1.0, 3)),
        flat(c(6, 2, 19, 1.0, all, Tree(&[3, 3]), temp(1.0))),
        // SpecInfer trees, i.i.d. children (duplicates allowed).
        c(6, 2, 20, 1.0, all, TreeIid(&[3, 2, 1]), temp(1.0)),
        c(4, 2, 21, 3.0, all, TreeIid(&[2, 2, 2, 2]), top_p(0.5, 0.9)),
        flat(c(5, 2, 22, 1.0, (Even, All), TreeIid(&[3, 2]), top_k(1.0, 3))),
        // Presence and frequency penalties: the target distribution depends on the path's tokens.
        c(5, 2, 23, 1.0, all, Tree(&[3, 2, 1]), penalties(1.0, 0.8, 0.5)),
        c(5, 2, 24, 1.0, all, Chain(3), penalties(0.7, -0.5, 0.7)),
    ]
}

fn penalties(t: f32, presence: f32, frequency: f32) -> SamplingParams {
    SamplingParams {
        temperature: t,
        presence_penalty: presence,
        frequency_penalty: frequency,
        penalty_last_n: 4,
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Exact joint and the chi-square run.

fn request(prompt: &[TokenId], len: usize, sampling: &SamplingParams, seed: u64) -> GenerateRequest {
    GenerateRequest::new(prompt.to_vec(), len, sampling.clone(), seed)
}

fn run_once(target: &mut ToyLm, drafter: &mut dyn Drafter, req: &GenerateRequest) -> GenerateOutput {
    generate(target, drafter, req, None, &mut |_| true).unwrap()
}

fn run_config(index: usize, c: &Config, alpha: f64) -> Option<String> {
    let target_model = c.target();
    let sampler = Sampler::new(c.sampling.clone()).unwrap();
    let prompt = c.prompt();
    let probs = target_model.exact_joint(&sampler, &prompt, c.len).unwrap();
    let total: f64 = probs.iter().sum();
    assert!((total - 1.0).abs() < 1e-4, "exact joint sums to {total}");

    let mut target = ToyLm::new(target_model, CTX);
    // Every third configuration verifies on a target padded to fixed shapes: filler rows must
    // change nothing of the distribution.
    let padded = index.is_multiple_of(3);
    if padded {
        assert!(target.pad_shapes(Some(&ShapeBuckets::new(&[4, 8, 16]).unwrap())));
    }
    let mut drafter = Checked::new(c.drafter());
    let mut counts = vec![0u64; probs.len()];
    let (mut emitted, mut forwards) = (0u64, 0u64);
    for run in 0..c.runs {
        let seed = (index as u64) << 32 | run;
        let out = run_once(&mut target, &mut drafter, &request(&prompt, c.len, &c.sampling, seed));
        assert_eq!(out.tokens.len(), c.len);
        let cell = out.tokens.iter().fold(0usize, |acc, &t| acc * c.vocab + t as usize);
        counts[cell] += 1;
        emitted += out.stats.emitted;
        forwards += out.stats.target_forwards;
    }
    let name = if padded { format!("{}, padded", c.name()) } else { c.name() };
    match chi_square(&counts, &probs) {
        Ok(g) => {
            eprintln!(
                "[{index:>2}] {name:<72} chi2 {:>7.1} df {:>3} p {:.3e}  τ {:.2}",
                g.stat,
                g.df,
                g.p_value,
                emitted as f64 / forwards as f64
            );
            (g.p_value <= alpha).then(|| {
                format!(
                    "[{index}] {name}: joint of the first {} tokens does not match the target: chi2 {:.1}, df {}, p-value {:.3e} ≤ {alpha:.1e}; worst cells (sequence index, observed, expected) {:?}",
                    c.len, g.stat, g.df, g.p_value, g.worst
                )
            })
        }
        Err(e) => Some(format!("[{index}] {name}: {e}")),
    }
}

/// Runs configurations `index % shards == shard` (the tests split the work to run in parallel).
fn run_shard(shard: usize, shards: usize) {
    let all = configs();
    let alpha = FAMILY_ALPHA / all.len() as f64;
    let failures: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| i % shards == shard)
        .filter_map(|(i, c)| run_config(i, c, alpha))
        .collect();
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn joint_distribution_matches_target_shard_0() {
    run_shard(0, 2);
}

#[test]
fn joint_distribution_matches_target_shard_1() {
    run_shard(1, 2);
}

#[test]
fn configurations_are_enumerable() {
    let all = configs();
    assert!(all.len() >= 20);
    for c in &all {
        assert!((4..=6).contains(&c.vocab) && (1..=2).contains(&c.order), "{}", c.name());
        assert!(c.len == 3 || (c.len == 4 && c.vocab == 4));
        assert!(c.runs >= 20_000);
    }
}

// ---------------------------------------------------------------------------------------------
// Invariants.

/// draft == target: every drafted token along the way is accepted, and a chain of k emits
/// nearly k + 1 tokens per target forward.
#[test]
fn identical_draft_is_always_accepted() {
    let target = ToyModel::new(6, 2, 40);
    let prompt = [1, 4, 2];
    let n = 41;
    for sampling in [temp(1.0), temp(0.5), top_k(1.0, 3), top_p(1.0, 0.9), SamplingParams::greedy()] {
        for (method, depth) in [(Method::Chain(4), 4), (Method::Tree(&[3, 2, 1]), 3), (Method::Chain(1), 1)] {
            let mut d = Checked::new(drafter(method, &target.draft(0.0, 7)));
            let mut lm = ToyLm::new(target.clone(), CTX);
            for seed in 0..20 {
                let out = run_once(&mut lm, &mut d, &request(&prompt, n, &sampling, seed));
                let s = &out.stats;
                assert_eq!(out.tokens.len(), n);
                for (i, r) in s.per_depth.iter().enumerate() {
                    assert_eq!(
                        r.accepted,
                        r.reached,
                        "{method:?} {sampling:?} seed {seed}: depth {} rejected a draft equal to the target",
                        i + 1
                    );
                }
                if let Method::Chain(_) = method {
                    assert_eq!(s.accepted, s.drafted);
                }
                let mean = s.mean_accepted();
                let ideal = (depth + 1) as f64;
                assert!(
                    mean <= ideal && mean >= 0.85 * ideal,
                    "{method:?} {sampling:?} seed {seed}: mean accepted length {mean} vs ideal {ideal}"
                );
            }
        }
    }
}

/// Same seed ⇒ same output (fresh or reused drafter); different seeds ⇒ different outputs; and
/// every step satisfies the [`Checked`] invariants (τ ≤ depth + 1 among them).
#[test]
fn same_seed_same_output() {
    let cfgs = configs();
    for c in cfgs.iter().step_by(3) {
        let prompt = c.prompt();
        let mut reused = Checked::new(c.drafter());
        let mut lm = ToyLm::new(c.target(), CTX);
        let mut distinct = std::collections::BTreeSet::new();
        for seed in 0..40u64 {
            let req = request(&prompt, 12, &c.sampling, seed);
            let a = run_once(&mut lm, &mut Checked::new(c.drafter()), &req);
            let b = run_once(&mut ToyLm::new(c.target(), CTX), &mut Checked::new(c.drafter()), &req);
            let r = run_once(&mut lm, &mut reused, &req);
            assert_eq!(a.tokens, b.tokens, "{}: seed {seed}", c.name());
            assert_eq!(a.tokens, r.tokens, "{}: seed {seed}, reused drafter", c.name());
            assert_eq!(a.stats.emitted, b.stats.emitted);
            assert_eq!(a.stats.accepted, r.stats.accepted);
            distinct.insert(a.tokens);
        }
        assert!(distinct.len() > 1, "{}: every seed gave the same output", c.name());
        assert!(reused.steps > 0);
    }
}

/// Temperature → 0 gives the greedy output, for every drafter, with sampling machinery (tiny
/// temperature) and with greedy verification (temperature 0). Sequences whose greedy path has a
/// near-tie (top-2 logit margin below 50·T) are skipped, with a bound on how many.
#[test]
fn near_zero_temperature_is_greedy() {
    let t_small = 1e-4f32;
    let mut checked = 0;
    let mut skipped = 0;
    for seed in 0..16u64 {
        let vocab = [6, 16][seed as usize % 2];
        let target = ToyModel::new(vocab, 2, 100 + seed);
        let prompt: Vec<TokenId> = vec![(seed % vocab as u64) as TokenId, 1, 3];
        let n = 24;
        let plain = run_once(
            &mut ToyLm::new(target.clone(), CTX),
            &mut PlainDrafter,
            &request(&prompt, n, &SamplingParams::greedy(), seed),
        )
        .tokens;
        // The smallest top-2 margin along the greedy path.
        let mut ctx = prompt.clone();
        let mut margin = f32::INFINITY;
        for &t in &plain {
            let mut l = target.logits(&ctx);
            l.sort_by(|a, b| b.total_cmp(a));
            margin = margin.min(l[0] - l[1]);
            ctx.push(t);
        }
        let methods = [
            (Method::Plain, 0.0, Support::All),
            (Method::Chain(3), 1.0, Support::All),
            (Method::Tree(&[3, 2, 1]), 1.0, Support::All),
            (Method::TreeIid(&[2, 2, 2]), 3.0, Support::All),
            (Method::Chain(4), 0.0, Support::Odd),
        ];
        for (method, noise, support) in methods {
            let draft = target.draft(noise, seed + 9).with_support(support);
            let greedy = run_once(
                &mut ToyLm::new(target.clone(), CTX),
                &mut Checked::new(drafter(method, &draft)),
                &request(&prompt, n, &SamplingParams::greedy(), seed),
            );
            assert_eq!(greedy.tokens, plain, "{method:?}: temperature 0");
            if margin < 50.0 * t_small {
                skipped += 1;
                continue;
            }
            let cold = run_once(
                &mut ToyLm::new(target.clone(), CTX),
                &mut Checked::new(drafter(method, &draft)),
                &request(&prompt, n, &temp(t_small), seed),
            );
            assert_eq!(cold.tokens, plain, "{method:?}: temperature {t_small}, seed {seed}");
            checked += 1;
        }
    }
    eprintln!("temperature {t_small}: {checked} runs equal to greedy, {skipped} skipped as near-ties");
    assert!(skipped <= checked / 4, "too many near-ties: {skipped} skipped, {checked} checked");
}
