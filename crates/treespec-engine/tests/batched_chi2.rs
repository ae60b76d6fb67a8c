//! Losslessness under continuous batching (issue #13): a request decoded in a lane beside other
//! requests — joining and leaving at other steps, with other methods, prompts chunked over
//! several steps — keeps exactly the target's distribution (χ² on an enumerable toy target,
//! ALGORITHMS.md §4), and with the same seed emits exactly what it emits alone; also when the
//! requests draft on lanes of one shared draft model whose forwards batch them.

#[path = "../../treespec-core/tests/common/mod.rs"]
mod common;

use common::{gof_failure, FAMILY_ALPHA};
use std::sync::Arc;
use treespec_core::sampling::{Sampler, SamplingParams};
use treespec_core::TokenId;

use treespec_core::cost::CostCurve;
use treespec_engine::auto_budget::{CostModel, SharedCosts};
use treespec_engine::batched::{run_batched, StepLimits};
use treespec_engine::drafters::{
    ChainDrafter, SampleMode, SuffixConfig, SuffixDrafter, SuffixShared, TreeDrafter,
};
use treespec_engine::toy::{ToyBatchLm, ToyDraftLanes, ToyLm, ToyModel};
use treespec_engine::Prepared;
use treespec_engine::{generate, CausalLm, Drafter, GenerateRequest, PlainDrafter, SharedDraft};

const CTX: usize = 64;
const VOCAB: usize = 5;
const LEN: usize = 3;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Plain,
    Chain(usize),
    Tree(&'static [usize]),
    TreeIid(&'static [usize]),
    /// Suffix drafts over a history every request of the run shares, cut by the batch budget.
    Suffix,
}

/// What the suffix drafters of one run share: the global history and prices, and a target
/// curve on which a lone request's drafts pay and a full batch's weak ones do not.
struct SuffixEnv {
    shared: Arc<SuffixShared>,
    costs: Arc<SharedCosts>,
}

impl SuffixEnv {
    fn new() -> Self {
        let target = CostCurve::linear(1.0, 0.1, 64).unwrap();
        let costs = CostModel { target, draft: None, refine: false, elsewhere: false };
        Self { shared: SuffixShared::empty(), costs: SharedCosts::new(costs) }
    }

    fn drafter(&self) -> SuffixDrafter {
        let config = SuffixConfig {
            max_depth: 4,
            costs: Some(self.costs.clone()),
            shared: self.shared.clone(),
            ..Default::default()
        };
        SuffixDrafter::new(config).unwrap()
    }
}

fn target() -> ToyModel {
    ToyModel::new(VOCAB, 2, 31)
}

fn draft_model() -> ToyModel {
    target().draft(1.0, 77)
}

fn drafter(kind: Kind, env: &SuffixEnv) -> Box<dyn Drafter> {
    drafter_on(kind, env, ToyLm::new(draft_model(), CTX))
}

/// A drafter of `kind` whose draft model (if it runs one) is `lm`.
fn drafter_on<M: CausalLm + 'static>(kind: Kind, env: &SuffixEnv, lm: M) -> Box<dyn Drafter> {
    match kind {
        Kind::Suffix => Box::new(env.drafter()),
        Kind::Plain => Box::new(PlainDrafter),
        Kind::Chain(k) => Box::new(ChainDrafter::new(lm, k).unwrap()),
        Kind::Tree(w) => Box::new(TreeDrafter::new(lm, w.to_vec()).unwrap()),
        Kind::TreeIid(w) => Box::new(TreeDrafter::with_mode(lm, w.to_vec(), SampleMode::Iid).unwrap()),
    }
}

fn request(prompt: &[TokenId], len: usize, temperature: f32, seed: u64) -> GenerateRequest {
    GenerateRequest::new(prompt.to_vec(), len, SamplingParams::with_temperature(temperature), seed)
}

const PROBE_PROMPT: &[TokenId] = &[1, 3, 0, 2];

/// `probes` probe requests (the tested one), each among noise requests of other prompts,
/// lengths and methods, decoded 4 lanes at a time with prompts prefilled 2 tokens per step; with
/// `shared`, every request drafts on a lane of one shared draft model. Returns the probes'
/// outputs in order.
fn batched_probes(kind: Kind, probes: u64, seed0: u64, shared: bool) -> Vec<Vec<TokenId>> {
    let noise_kinds =
        [Kind::Chain(2), Kind::Plain, Kind::Tree(&[2, 1]), Kind::TreeIid(&[2, 2]), Kind::Suffix];
    let env = SuffixEnv::new();
    let draft = SharedDraft::new(ToyDraftLanes::new(draft_model(), CTX, 4 * probes as usize));
    let drafter = |kind: Kind, env: &SuffixEnv| match shared {
        true => drafter_on(kind, env, draft.lane().unwrap()),
        false => drafter(kind, env),
    };
    let mut jobs = Vec::new();
    let mut is_probe = Vec::new();
    for p in 0..probes {
        for n in 0..(1 + p % 3) {
            let prompt: Vec<TokenId> =
                (0..(2 + (p + n) % 5)).map(|i| ((p + n + i) % VOCAB as u64) as TokenId).collect();
            let len = 1 + ((p * 7 + n) % 6) as usize;
            let kind = noise_kinds[((p + n) % 5) as usize];
            jobs.push(Prepared::free(request(&prompt, len, 0.8, !p ^ n), drafter(kind, &env)));
            is_probe.push(false);
        }
        jobs.push(Prepared::free(request(PROBE_PROMPT, LEN, 1.0, seed0 + p), drafter(kind, &env)));
        is_probe.push(true);
    }
    let mut lm = ToyBatchLm::new(target(), CTX, 4);
    let limits = StepLimits { prefill_chunk: 2, max_tree: 16, ..StepLimits::default() };
    let outputs = run_batched(&mut lm, jobs, 4, limits, None, shared.then_some(&draft));
    assert!(lm.widest > 4, "requests shared forwards (widest forward: {} rows)", lm.widest);
    let d = draft.counters();
    assert!(!shared || d.feeds > d.forwards, "draft forwards held several requests: {d:?}");
    outputs
        .into_iter()
        .zip(is_probe)
        .filter(|(_, p)| *p)
        .map(|(o, _)| {
            let o = o.unwrap();
            assert_eq!(o.tokens.len(), LEN);
            o.tokens
        })
        .collect()
}

/// The χ² failures of a probe request decoded among others with each of `kinds` (12,000 probes
/// each), drafting on a shared batched draft model or on models of their own.
fn distribution_failures(kinds: &[Kind], shared: bool) -> Vec<String> {
    let sampler = Sampler::new(SamplingParams::with_temperature(1.0)).unwrap();
    let probs = target().exact_joint(&sampler, PROBE_PROMPT, LEN).unwrap();
    let alpha = FAMILY_ALPHA / kinds.len() as f64;
    let mut failures = Vec::new();
    for (k, kind) in kinds.iter().enumerate() {
        let mut counts = vec![0u64; probs.len()];
        let seed0 = ((k as u64) << 32) ^ if shared { 0x5eed } else { 0 };
        for tokens in batched_probes(*kind, 12_000, seed0, shared) {
            counts[tokens.iter().fold(0usize, |acc, &t| acc * VOCAB + t as usize)] += 1;
        }
        failures.extend(gof_failure(&format!("{kind:?} (shared draft: {shared})"), &counts, &probs, alpha));
    }
    failures
}

#[test]
fn a_request_keeps_the_target_distribution_while_others_share_its_steps() {
    let kinds = [Kind::Chain(3), Kind::Tree(&[3, 2, 1]), Kind::TreeIid(&[2, 2]), Kind::Plain, Kind::Suffix];
    let failures = distribution_failures(&kinds, false);
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn a_request_keeps_the_target_distribution_drafting_on_a_shared_batched_draft() {
    let failures =
        distribution_failures(&[Kind::Chain(3), Kind::Tree(&[3, 2, 1]), Kind::TreeIid(&[2, 2])], true);
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn a_request_emits_what_it_emits_alone_with_the_same_seed() {
    for (kind, shared) in [
        (Kind::Chain(3), false),
        (Kind::Tree(&[3, 2, 1]), false),
        (Kind::Plain, false),
        (Kind::Chain(3), true),
        (Kind::Tree(&[3, 2, 1]), true),
        (Kind::TreeIid(&[2, 2]), true),
    ] {
        let batched = batched_probes(kind, 40, 9_000, shared);
        for (p, tokens) in batched.iter().enumerate() {
            let mut target = ToyLm::new(target(), CTX);
            let mut d = drafter(kind, &SuffixEnv::new());
            let req = request(PROBE_PROMPT, LEN, 1.0, 9_000 + p as u64);
            let alone = generate(&mut target, d.as_mut(), &req, None, &mut |_| true).unwrap();
            assert_eq!(&alone.tokens, tokens, "{kind:?} (shared draft: {shared}) probe {p}");
        }
    }
}

/// Greedy suffix requests that copy their prompts, `lanes` at a time: each one's tokens and the
/// drafted nodes verified in all.
fn copying_requests(lanes: usize, batch_budget: bool) -> (Vec<Vec<TokenId>>, u64) {
    let env = SuffixEnv::new();
    let jobs: Vec<Prepared<'_>> = (0..12u32)
        .map(|j| {
            // A period-3 pattern the toy target tends to continue, repeated: long matches.
            let prompt: Vec<TokenId> = (0..24).map(|i| ((i % 3 + j) % VOCAB as u32) as TokenId).collect();
            Prepared::free(request(&prompt, 12, 0.0, j as u64), drafter(Kind::Suffix, &env))
        })
        .collect();
    let mut lm = ToyBatchLm::new(target(), CTX, lanes);
    let limits = StepLimits { batch_budget, ..StepLimits::default() };
    let outputs: Vec<_> =
        run_batched(&mut lm, jobs, lanes, limits, None, None).into_iter().map(|o| o.unwrap()).collect();
    let drafted = outputs.iter().map(|o| o.stats.drafted).sum();
    (outputs.into_iter().map(|o| o.tokens).collect(), drafted)
}

#[test]
fn batched_requests_verify_fewer_drafts_than_alone_and_emit_the_same_tokens() {
    let (alone_on, drafted_alone_on) = copying_requests(1, true);
    let (alone_off, drafted_alone_off) = copying_requests(1, false);
    // One request at a time: exactly the per-request budget.
    assert_eq!(alone_on, alone_off);
    assert_eq!(drafted_alone_on, drafted_alone_off);
    let (batched_on, drafted_on) = copying_requests(6, true);
    let (batched_off, drafted_off) = copying_requests(6, false);
    assert_eq!(batched_on, alone_on, "greedy output is the same batched or not");
    assert_eq!(batched_off, alone_on);
    assert!(drafted_alone_on > 0, "the requests draft at all");
    // Drafts that pay alone do not all pay in a forward six requests share: speculation shrinks,
    // whether the batch cuts them together or each request prices its own.
    assert!(
        drafted_on < drafted_alone_on,
        "one budget for six requests verifies fewer drafts than they do alone ({drafted_on} vs {drafted_alone_on})"
    );
    assert!(drafted_off < drafted_alone_on, "{drafted_off} vs {drafted_alone_on}");
}
