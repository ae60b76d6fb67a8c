//! GSD (graph-structured drafts), prompt lookup, and staged drafting: lossless under greedy
//! (token-exact equality with plain decoding) and under sampling (χ² of the joint distribution of
//! the first three emitted tokens), the draft KV cache always holding the true history, and each
//! method's saving actually happening (merges, lookup hits, second-stage acceptance).

#[path = "../../treespec-core/tests/common/mod.rs"]
mod common;

use std::sync::{Arc, Mutex};

use common::{chi_square, FAMILY_ALPHA};
use treespec_core::ngram::{NgramTable, TokenizerId};
use treespec_core::rng::{Stream, StreamRng};
use treespec_core::sampling::{Sampler, SamplingParams};
use treespec_core::tree::TokenTree;
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;
use treespec_engine::drafters::{
    ChainDrafter, GsdConfig, GsdDrafter, LookupConfig, LookupDrafter, StagedConfig, StagedDrafter,
};
use treespec_engine::toy::{Support, ToyLm, ToyModel, Watch, WatchedLm};
use treespec_engine::{
    generate, Drafter, EngineError, GenerateOutput, GenerateRequest, PlainDrafter, ProposeContext,
};

const CTX: usize = 256;
/// A context window that never limits the tree.
const BIG: usize = 2048;

fn run(target: &ToyModel, d: &mut dyn Drafter, req: &GenerateRequest, ctx: usize) -> GenerateOutput {
    generate(&mut ToyLm::new(target.clone(), ctx), d, req, None, &mut |_| true).unwrap()
}

fn toy_tokenizer(vocab: usize) -> TokenizerId {
    TokenizerId { fingerprint: 0x7e57_0000 + vocab as u64, vocab: vocab as u32 }
}

/// Text sampled from the draft (temperature 1), as the staged paper builds its Katz table.
fn draft_samples(draft: &ToyModel, sequences: usize, len: usize, seed: u64) -> Vec<Vec<TokenId>> {
    let sampler = Sampler::new(SamplingParams::with_temperature(1.0)).unwrap();
    let mut rng = StreamRng::new(seed, Stream::Aux);
    (0..sequences)
        .map(|i| {
            let mut s = vec![(i % draft.vocab) as TokenId];
            for _ in 0..len {
                let d = sampler.distribution(&draft.logits(&s), &s).unwrap();
                s.push(d.sample(&mut rng));
            }
            s
        })
        .collect()
}

fn table_for(draft: &ToyModel) -> Arc<NgramTable> {
    Arc::new(NgramTable::build(draft_samples(draft, 40, 60, 5), toy_tokenizer(draft.vocab)).unwrap())
}

fn gsd(draft: &ToyModel, ctx: usize, config: GsdConfig) -> GsdDrafter<ToyLm> {
    GsdDrafter::new(ToyLm::new(draft.clone(), ctx), config).unwrap()
}

fn staged(draft: &ToyModel, ctx: usize, config: StagedConfig) -> StagedDrafter<ToyLm> {
    StagedDrafter::new(ToyLm::new(draft.clone(), ctx), config).unwrap()
}

/// GSD with every filter open: many candidates, hence many merges.
fn gsd_wide() -> GsdConfig {
    GsdConfig { top_n: 3, ratio: 0.0, parent_min: 0.0, budget: 64, ..GsdConfig::default() }
}

/// Every configuration of the three drafters the greedy tests run.
fn all_drafters(draft: &ToyModel, ctx: usize) -> Vec<Box<dyn Drafter>> {
    let table = table_for(draft);
    vec![
        Box::new(LookupDrafter::new(LookupConfig::default()).unwrap()),
        Box::new(
            LookupDrafter::new(LookupConfig { branches: 3, max_tokens: 5, ..Default::default() }).unwrap(),
        ),
        Box::new(
            LookupDrafter::with_table(
                LookupConfig { branches: 2, min_ngram: 2, ..Default::default() },
                table.clone(),
            )
            .unwrap(),
        ),
        Box::new(gsd(draft, ctx, GsdConfig::default())),
        Box::new(gsd(draft, ctx, GsdConfig { r: 0, ..gsd_wide() })),
        Box::new(gsd(draft, ctx, gsd_wide())),
        Box::new(gsd(draft, ctx, GsdConfig { merge: false, ..gsd_wide() })),
        Box::new(gsd(draft, ctx, GsdConfig { unroll_cap: 7, max_depth: 9, ..gsd_wide() })),
        Box::new(staged(draft, ctx, StagedConfig::default())),
        Box::new(staged(
            draft,
            ctx,
            StagedConfig { table: Some(table), branch_depths: 3, ..Default::default() },
        )),
        Box::new(staged(draft, ctx, StagedConfig { lookahead: 0, branch_width: 3, ..Default::default() })),
        Box::new(staged(draft, ctx, StagedConfig { depth: 1, ..Default::default() })),
    ]
}

#[test]
fn greedy_output_equals_plain_decoding() {
    for seed in 0..10u64 {
        let vocab = [4, 8, 16, 64][seed as usize % 4];
        let target = ToyModel::new(vocab, 1 + seed as usize % 3, seed);
        let prompt: Vec<TokenId> = (0..6).map(|i| ((seed + i % 3) % vocab as u64) as TokenId).collect();
        let req = GenerateRequest::new(prompt.to_vec(), 48, SamplingParams::greedy(), seed);
        let plain = run(&target, &mut PlainDrafter, &req, CTX).tokens;
        assert_eq!(plain.len(), 48);
        for (noise, support) in
            [(0.0, Support::All), (1.0, Support::All), (3.0, Support::All), (0.0, Support::Odd)]
        {
            let draft = target.draft(noise, seed + 100).with_support(support);
            for (i, d) in all_drafters(&draft, CTX).iter_mut().enumerate() {
                let out = run(&target, d.as_mut(), &req, CTX);
                assert_eq!(
                    out.tokens,
                    plain,
                    "seed {seed} noise {noise} {support:?} drafter #{i} {}",
                    d.name()
                );
                if noise == 0.0 && support == Support::All && !d.name().starts_with("lookup") {
                    assert!(
                        out.stats.mean_accepted() > 1.5,
                        "{} with an exact draft: {:?}",
                        d.name(),
                        out.stats
                    );
                }
            }
        }
    }
}

/// Near the end of the context window the loop offers little room: every drafter must stay
/// inside it (the loop rejects trees that do not) and still match plain decoding.
#[test]
fn greedy_at_a_tight_context_window() {
    for seed in 0..6u64 {
        let target = ToyModel::new(6, 1 + seed as usize % 2, seed + 50);
        let prompt = [1, 2, 3, 1, 2];
        for ctx in [7, 9, 14] {
            let req = GenerateRequest::new(prompt.to_vec(), 40, SamplingParams::greedy(), seed);
            let plain = run(&target, &mut PlainDrafter, &req, ctx).tokens;
            for d in all_drafters(&target.draft(1.0, seed), ctx).iter_mut() {
                assert_eq!(run(&target, d.as_mut(), &req, ctx).tokens, plain, "ctx {ctx} {}", d.name());
            }
        }
    }
}

#[test]
fn greedy_with_repetition_penalty_equals_plain_decoding() {
    let sampling = SamplingParams { repetition_penalty: 1.5, penalty_last_n: 8, ..SamplingParams::greedy() };
    for seed in 0..4u64 {
        let target = ToyModel::new(8, 2, seed + 7);
        let req = GenerateRequest::new([1, 2, 1, 2, 3].to_vec(), 40, sampling.clone(), seed);
        let plain = run(&target, &mut PlainDrafter, &req, CTX).tokens;
        for d in all_drafters(&target.draft(0.5, seed), CTX).iter_mut() {
            assert_eq!(run(&target, d.as_mut(), &req, CTX).tokens, plain, "{}", d.name());
        }
    }
}

/// A sharp bigram target: greedy decoding falls into a cycle, the case prompt lookup is for.
fn repetitive_target(seed: u64) -> ToyModel {
    ToyModel::new(8, 1, seed).with_sharpness(6.0)
}

#[test]
fn lookup_hits_on_a_repetitive_target() {
    for seed in 0..6u64 {
        let target = repetitive_target(seed);
        let req = GenerateRequest::new([3, 1, 4].to_vec(), 80, SamplingParams::greedy(), seed);
        let plain = run(&target, &mut PlainDrafter, &req, CTX).tokens;
        for config in
            [LookupConfig::default(), LookupConfig { branches: 2, max_tokens: 4, ..Default::default() }]
        {
            let mut d = LookupDrafter::new(config).unwrap();
            let out = run(&target, &mut d, &req, CTX);
            assert_eq!(out.tokens, plain);
            let s = *d.stats();
            eprintln!(
                "lookup seed {seed} {config:?}: accepted {} of {} proposed, τ {:.2}, hits {}/{} steps, draft forwards {}",
                s.accepted,
                s.proposed,
                out.stats.mean_accepted(),
                s.context_hits,
                s.steps,
                out.stats.draft_forwards
            );
            assert_eq!(out.stats.draft_forwards, 0);
            assert!(s.accepted > 20 && s.accepted == out.stats.accepted, "{s:?}");
            assert!(out.stats.mean_accepted() > 2.0, "τ {}", out.stats.mean_accepted());
        }
    }
}

#[test]
fn lookup_falls_back_to_the_static_table() {
    // A history with no repeated n-gram: only the table can propose, and it was built from text of
    // the target itself, so it predicts well.
    let target = repetitive_target(11);
    let table = Arc::new(
        NgramTable::build(draft_samples(&target.draft(0.0, 0), 30, 60, 1), toy_tokenizer(8)).unwrap(),
    );
    let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let history = [0, 5];
    let ctx = ProposeContext {
        history: &history,
        max_nodes: 100,
        max_depth: 10,
        sampler: &sampler,
        batch_rows: 0,
        batch_cut: false,
        eos: &[],
    };
    let mut bare = LookupDrafter::new(LookupConfig::default()).unwrap();
    let mut backed = LookupDrafter::with_table(LookupConfig::default(), table).unwrap();
    bare.begin(&history, &sampler, 0).unwrap();
    backed.begin(&history, &sampler, 0).unwrap();
    assert_eq!(bare.propose(&ctx).unwrap().drafted(), 0);
    assert_eq!(backed.propose(&ctx).unwrap().drafted(), 8, "a chain of max_tokens from the table");
    let req = GenerateRequest::new(history.to_vec(), 30, SamplingParams::greedy(), 0);
    let plain = run(&target, &mut PlainDrafter, &req, CTX).tokens;
    assert_eq!(run(&target, &mut bare, &req, CTX).tokens, plain);
    assert_eq!(run(&target, &mut backed, &req, CTX).tokens, plain);
    assert!(backed.stats().table_steps > 0 && backed.stats().accepted > 0, "{:?}", backed.stats());
    assert!(backed.stats().accepted > bare.stats().accepted, "{:?} vs {:?}", backed.stats(), bare.stats());
}

// ---------------------------------------------------------------------------------------------
// The draft KV cache: after every commit it must hold a prefix of the true history.

/// Every committed snapshot is a prefix of prompt + output, and the cache keeps up (it lags the
/// history by at most the last step's unfed tokens).
fn check_kv(watch: &Mutex<Watch>, prompt: &[TokenId], out: &[TokenId], what: &str) {
    let full: Vec<TokenId> = prompt.iter().chain(out).copied().collect();
    let log = &watch.lock().unwrap().commits;
    assert!(!log.is_empty(), "{what}: the draft never committed");
    for (step, s) in log.iter().enumerate() {
        assert!(
            s.len() <= full.len() && s[..] == full[..s.len()],
            "{what}: step {step} cache {s:?} vs {full:?}"
        );
    }
    let last = log.last().expect("non-empty").len();
    assert!(last + 12 >= full.len(), "{what}: cache of {last} tokens for a history of {}", full.len());
}

#[test]
fn draft_cache_holds_the_true_history_including_merged_paths() {
    // Per sampling mode (greedy, temperature 1).
    let mut linked_accepted = [0u64; 2];
    let mut staged_used = [0u64; 2];
    for seed in 0..8u64 {
        let target = ToyModel::new(4 + seed as usize % 3, 1, seed + 30);
        let draft = target.draft(0.3 * (seed % 3) as f32, seed);
        let prompt = [0, 1, 2, 0, 1];
        let modes = [SamplingParams::greedy(), SamplingParams::with_temperature(1.0)];
        for (mode, sampling) in modes.into_iter().enumerate() {
            let req = GenerateRequest::new(prompt.to_vec(), 60, sampling.clone(), seed);
            let (spy, log) = WatchedLm::new(ToyLm::new(draft.clone(), CTX));
            let mut d = GsdDrafter::new(spy, GsdConfig { r: 0, ..gsd_wide() }).unwrap();
            let out = run(&target, &mut d, &req, CTX);
            check_kv(&log, &prompt, &out.tokens, "gsd");
            linked_accepted[mode] += d.stats().accepted_linked;

            let (spy, log) = WatchedLm::new(ToyLm::new(draft.clone(), CTX));
            let mut d = StagedDrafter::new(spy, StagedConfig::default()).unwrap();
            let out = run(&target, &mut d, &req, CTX);
            check_kv(&log, &prompt, &out.tokens, "staged");
            staged_used[mode] += d.stats().used;
        }
    }
    eprintln!(
        "accepted tokens reached through a GSD link (greedy, T1): {linked_accepted:?}; \
         staged proposals used: {staged_used:?}"
    );
    assert!(
        linked_accepted.iter().all(|&n| n > 0),
        "a merged node must lie on the accepted path in both modes"
    );
    assert!(staged_used.iter().all(|&n| n > 0));
}

// ---------------------------------------------------------------------------------------------
// What each method saves.

#[test]
fn gsd_merges_and_saves_draft_work() {
    let mut total_merges = 0;
    for seed in 0..6u64 {
        let target = ToyModel::new(5, 1, seed + 60);
        let draft = target.draft(0.5, seed);
        let req = GenerateRequest::new([1, 2, 3].to_vec(), 60, SamplingParams::greedy(), seed);
        let plain = run(&target, &mut PlainDrafter, &req, CTX).tokens;
        for r in [0, 1] {
            // Room and budget for the whole unmerged tree (2 + 4 + … + 64 nodes), so only merging
            // can end the layers early.
            let config = GsdConfig { r, top_n: 2, budget: 200, ..gsd_wide() };
            let mut merged = gsd(&draft, BIG, config);
            let mut unmerged = gsd(&draft, BIG, GsdConfig { merge: false, ..config });
            let a = run(&target, &mut merged, &req, BIG);
            let b = run(&target, &mut unmerged, &req, BIG);
            assert_eq!(a.tokens, plain);
            assert_eq!(b.tokens, plain);
            let (sa, sb) = (*merged.stats(), *unmerged.stats());
            let per_step =
                |o: &GenerateOutput| o.stats.draft_forwards as f64 / o.stats.target_forwards as f64;
            eprintln!(
                "gsd seed {seed} r {r}: merges {} (reused tree nodes {}), DAG nodes/step {:.1} vs {:.1} unmerged, \
                 fed draft rows/step {:.1} vs {:.1}, draft forwards/step {:.2} vs {:.2}, total {} vs {}, \
                 τ {:.2} vs {:.2}",
                merged.merges(),
                sa.reused,
                sa.dag_nodes as f64 / sa.steps as f64,
                sb.dag_nodes as f64 / sb.steps as f64,
                sa.fed as f64 / sa.steps as f64,
                sb.fed as f64 / sb.steps as f64,
                per_step(&a),
                per_step(&b),
                a.stats.draft_forwards,
                b.stats.draft_forwards,
                a.stats.mean_accepted(),
                b.stats.mean_accepted(),
            );
            assert!(merged.merges() > 0 && sa.reused > 0);
            assert_eq!(unmerged.merges(), 0);
            // One batched draft forward per depth: a path can never link to its own ancestor, so the
            // deepest layer is still drafted and merging saves rows of those forwards, not calls.
            assert!(
                sa.fed * sb.steps * 2 < sb.fed * sa.steps,
                "merging should at least halve the nodes run through the draft per step"
            );
            total_merges += merged.merges();
        }
    }
    assert!(total_merges > 100);
}

#[test]
fn staged_needs_fewer_draft_forwards_than_a_plain_chain() {
    for seed in 0..6u64 {
        let target = repetitive_target(seed + 20);
        let draft = target.draft(0.3, seed);
        let req = GenerateRequest::new([2, 7, 1].to_vec(), 90, SamplingParams::greedy(), seed);
        let plain = run(&target, &mut PlainDrafter, &req, CTX).tokens;
        let mut chain = ChainDrafter::new(ToyLm::new(draft.clone(), CTX), 6).unwrap();
        let c = run(&target, &mut chain, &req, CTX);
        // No branching: the same trees as the chain drafter, built with fewer forwards.
        let mut st = staged(&draft, CTX, StagedConfig { depth: 6, branch_depths: 0, ..Default::default() });
        let s = run(&target, &mut st, &req, CTX);
        assert_eq!(c.tokens, plain);
        assert_eq!(s.tokens, plain);
        assert_eq!(s.stats.accepted, c.stats.accepted, "staged drafts exactly the chain's tokens");
        eprintln!(
            "staged seed {seed}: draft forwards {} vs chain {} ({} steps), second stage {} used / {} proposed = {:.2}",
            s.stats.draft_forwards,
            c.stats.draft_forwards,
            s.stats.target_forwards,
            st.stats().used,
            st.stats().proposed,
            st.second_stage_acceptance()
        );
        assert!(s.stats.draft_forwards * 2 < c.stats.draft_forwards);
        assert!(st.second_stage_acceptance() > 0.5);
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration and file errors.

#[test]
fn bad_configs_are_errors() {
    let lm = || ToyLm::new(ToyModel::new(8, 1, 0), 64);
    let gsd_bad = [
        GsdConfig { top_n: 0, ..Default::default() },
        GsdConfig { ratio: -0.5, ..Default::default() },
        GsdConfig { parent_min: 2.0, ..Default::default() },
        GsdConfig { r: 3, ..Default::default() },
        GsdConfig { budget: 0, ..Default::default() },
        GsdConfig { max_depth: 0, ..Default::default() },
        GsdConfig { unroll_cap: 0, ..Default::default() },
    ];
    for c in gsd_bad {
        assert!(matches!(GsdDrafter::new(lm(), c), Err(EngineError::InvalidRequest(_))), "{c:?}");
    }
    let lookup_bad = [
        LookupConfig { max_tokens: 0, ..Default::default() },
        LookupConfig { branches: 0, ..Default::default() },
        LookupConfig { min_ngram: 0, ..Default::default() },
        LookupConfig { min_ngram: 3, max_ngram: 2, ..Default::default() },
    ];
    for c in lookup_bad {
        assert!(matches!(LookupDrafter::new(c), Err(EngineError::InvalidRequest(_))), "{c:?}");
    }
    let staged_bad = [
        StagedConfig { depth: 0, ..Default::default() },
        StagedConfig { branch_width: 0, ..Default::default() },
        StagedConfig { ngram_max: 0, ..Default::default() },
    ];
    for c in staged_bad {
        assert!(matches!(StagedDrafter::new(lm(), c.clone()), Err(EngineError::InvalidRequest(_))), "{c:?}");
    }
    // A table for another vocabulary than the draft's.
    let table = Arc::new(NgramTable::build([vec![1u32, 2, 3]], toy_tokenizer(16)).unwrap());
    let e =
        StagedDrafter::new(lm(), StagedConfig { table: Some(table), ..Default::default() }).err().unwrap();
    assert!(matches!(e, EngineError::Incompatible(_)), "{e}");
}

#[test]
fn ngram_file_for_another_tokenizer_is_an_error() {
    let draft = ToyModel::new(8, 2, 3);
    let table = NgramTable::build(draft_samples(&draft, 10, 40, 2), toy_tokenizer(8)).unwrap();
    let dir = std::env::temp_dir().join(format!("treespec-gsd-lookup-staged-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("draft.ngram");
    table.save(&path).unwrap();
    let loaded = NgramTable::load(&path, toy_tokenizer(8)).unwrap();
    assert_eq!(loaded, table);
    let other = TokenizerId { fingerprint: 0xdead_beef, vocab: 8 };
    let err = NgramTable::load(&path, other).unwrap_err().to_string();
    assert!(err.contains("0x000000007e570008") && err.contains("0x00000000deadbeef"), "{err}");
    assert!(err.contains("draft.ngram"), "the message names the file: {err}");
    // Truncated on disk: an error, not a panic.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
    assert!(NgramTable::load(&path, toy_tokenizer(8)).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
    // The loaded table drives a drafter.
    let target = ToyModel::new(8, 2, 3);
    let req = GenerateRequest::new([1, 2].to_vec(), 20, SamplingParams::greedy(), 0);
    let plain = run(&target, &mut PlainDrafter, &req, CTX).tokens;
    let mut d = LookupDrafter::with_table(LookupConfig::default(), Arc::new(loaded)).unwrap();
    assert_eq!(run(&target, &mut d, &req, CTX).tokens, plain);
}

// ---------------------------------------------------------------------------------------------
// Sampling: the joint distribution of the first three emitted tokens.

/// Checks every step: accepted nodes form a root path and τ = accepted + 1.
struct Checked<'a>(&'a mut dyn Drafter);

impl Drafter for Checked<'_> {
    fn kind(&self) -> treespec_engine::MethodKind {
        self.0.kind()
    }
    fn begin(&mut self, prompt: &[TokenId], sampler: &Sampler, seed: u64) -> treespec_engine::Result<()> {
        self.0.begin(prompt, sampler, seed)
    }
    fn propose(&mut self, ctx: &ProposeContext) -> treespec_engine::Result<TokenTree> {
        self.0.propose(ctx)
    }
    fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) -> treespec_engine::Result<()> {
        assert_eq!(outcome.tokens.len(), outcome.accepted.len() + 1);
        let mut parent = 0;
        for &n in &outcome.accepted {
            assert_eq!(tree.node(n).parent, Some(parent));
            parent = n;
        }
        self.0.observe(tree, outcome)
    }
    fn draft_forwards(&self) -> u64 {
        self.0.draft_forwards()
    }
}

const RUNS: u64 = 20_000;
const LEN: usize = 3;

struct Chi2Case {
    name: &'static str,
    vocab: usize,
    order: usize,
    seed: u64,
    noise: f32,
    prompt: Vec<TokenId>,
    make: fn(&ToyModel) -> Box<dyn Drafter>,
}

fn chi2_cases() -> Vec<Chi2Case> {
    vec![
        Chi2Case {
            name: "lookup branches 2",
            vocab: 4,
            order: 2,
            seed: 1,
            noise: 0.0,
            prompt: vec![0, 1, 2, 0, 1, 3, 0, 1],
            make: |_| {
                Box::new(LookupDrafter::new(LookupConfig { branches: 2, ..Default::default() }).unwrap())
            },
        },
        Chi2Case {
            name: "lookup + table",
            vocab: 5,
            order: 1,
            seed: 2,
            noise: 0.0,
            prompt: vec![4, 2],
            make: |d| {
                Box::new(
                    LookupDrafter::with_table(
                        LookupConfig { branches: 2, ..Default::default() },
                        table_for(d),
                    )
                    .unwrap(),
                )
            },
        },
        Chi2Case {
            name: "gsd r1",
            vocab: 6,
            order: 2,
            seed: 3,
            noise: 1.0,
            prompt: vec![1, 4, 2],
            make: |d| Box::new(gsd(d, 64, GsdConfig { ratio: 0.2, parent_min: 0.1, ..GsdConfig::default() })),
        },
        Chi2Case {
            name: "gsd r0 wide",
            vocab: 4,
            order: 1,
            seed: 4,
            noise: 0.5,
            prompt: vec![3, 0],
            make: |d| Box::new(gsd(d, 64, GsdConfig { r: 0, ..gsd_wide() })),
        },
        Chi2Case {
            name: "staged",
            vocab: 5,
            order: 2,
            seed: 5,
            noise: 1.0,
            prompt: vec![0, 1, 2, 0, 1],
            make: |d| Box::new(staged(d, 64, StagedConfig::default())),
        },
        Chi2Case {
            name: "staged + table",
            vocab: 6,
            order: 1,
            seed: 6,
            noise: 0.5,
            prompt: vec![5, 3],
            make: |d| {
                Box::new(staged(
                    d,
                    64,
                    StagedConfig { table: Some(table_for(d)), branch_width: 3, ..Default::default() },
                ))
            },
        },
    ]
}

#[test]
fn sampling_joint_distribution_matches_target() {
    let samplings = [
        ("T1", SamplingParams::with_temperature(1.0)),
        ("top-p 0.9", SamplingParams { temperature: 1.0, top_p: 0.9, ..Default::default() }),
    ];
    let cases = chi2_cases();
    let tests = cases.len() * samplings.len();
    let alpha = FAMILY_ALPHA / tests as f64;
    let mut failures = Vec::new();
    for (ci, case) in cases.iter().enumerate() {
        let target = ToyModel::new(case.vocab, case.order, case.seed);
        let draft = target.draft(case.noise, case.seed + 500);
        for (si, (sname, sampling)) in samplings.iter().enumerate() {
            let sampler = Sampler::new(sampling.clone()).unwrap();
            let probs = target.exact_joint(&sampler, &case.prompt, LEN).unwrap();
            assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-4);
            let mut drafter = (case.make)(&draft);
            let mut lm = ToyLm::new(target.clone(), 64);
            let mut counts = vec![0u64; probs.len()];
            let (mut accepted, mut steps) = (0u64, 0u64);
            for run in 0..RUNS {
                let seed = ((ci * 2 + si) as u64) << 32 | run;
                let req = GenerateRequest::new(case.prompt.clone(), LEN, sampling.clone(), seed);
                let out =
                    generate(&mut lm, &mut Checked(drafter.as_mut()), &req, None, &mut |_| true).unwrap();
                let cell = out.tokens.iter().fold(0usize, |acc, &t| acc * case.vocab + t as usize);
                counts[cell] += 1;
                accepted += out.stats.accepted;
                steps += out.stats.target_forwards;
            }
            match chi_square(&counts, &probs) {
                Ok(g) => {
                    eprintln!(
                        "{:<16} {sname:<10} chi2 {:>7.1} df {:>3} p {:.3e}  accepted/step {:.2}",
                        case.name,
                        g.stat,
                        g.df,
                        g.p_value,
                        accepted as f64 / steps as f64
                    );
                    if g.p_value <= alpha {
                        failures
                            .push(format!("{} {sname}: p {:.3e}, worst {:?}", case.name, g.p_value, g.worst));
                    }
                }
                Err(e) => failures.push(format!("{} {sname}: {e}", case.name)),
            }
            assert!(
                accepted > RUNS / 10,
                "{} {sname}: drafts were hardly ever accepted ({accepted})",
                case.name
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
