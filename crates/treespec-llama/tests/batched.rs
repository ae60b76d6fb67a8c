//! Continuous batching on the real SmolLM2 model, in exact mode: every request served in a
//! shared context beside other requests (each with its own method) emits exactly the tokens it
//! emits when served alone — also when lanes join and leave mid-way, when settling moves kept
//! rows, when the cache is compacted, when a prompt reuses a cached prefix, and when the requests
//! draft on one shared draft context whose forwards batch them.

mod common;

use std::sync::OnceLock;

use treespec_engine::batched::{run_batched, StepLimits};
use treespec_engine::drafters::{DySpecConfig, LookupConfig, SuffixConfig};
use treespec_engine::Prepared;
use treespec_engine::{generate, GenerateRequest, Method, SharedDraft};
use treespec_engine::{BatchedLm, LaneWork};
use treespec_llama::{LlamaLm, LlamaModel, LoadOptions};

/// Prompts beyond `common::CHAT_PROMPTS`: eight in all for the mixed-method runs, twenty for the
/// every-method run.
const MORE_PROMPTS: &[&str] = &[
    "Name the planets of the solar system in order.",
    "Translate 'good morning' into French, Spanish and German.",
    "Give me a recipe for pancakes.",
    "What is 17 times 23? Show your work.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "Write a Python function that reverses a string.",
    "Why do cats purr?",
    "Describe a sunset over the ocean.",
    "What are the three states of matter?",
    "Write a limerick about a programmer.",
    "How does a bicycle stay upright?",
    "List five fruits that are red.",
    "Explain recursion with an example.",
    "What is the tallest mountain on Earth?",
];

/// Exact mode (Q8_0 KV cache): attention is batch-invariant, so "alone" and "batched" are
/// comparable bit for bit.
fn model() -> &'static LlamaModel {
    static MODEL: OnceLock<LlamaModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        let options = LoadOptions { exact: true, ctx_size: 1024, ..common::test_options() };
        LlamaModel::load(common::model_path(), options).expect("load test model")
    })
}

fn methods() -> Vec<Method> {
    vec![
        Method::Plain,
        Method::Chain { k: 4 },
        Method::Lookup { config: LookupConfig::default(), table: None },
        Method::Suffix(SuffixConfig { min_value: 0.0, max_nodes: 12, ..Default::default() }),
        Method::DySpec(DySpecConfig { budget: 10, ..Default::default() }),
    ]
}

/// The first `n` prompts.
fn prompts(n: usize) -> Vec<&'static str> {
    common::CHAT_PROMPTS.iter().chain(MORE_PROMPTS).take(n).copied().collect()
}

const MIXED: usize = 8;

fn requests(repeat: usize) -> Vec<GenerateRequest> {
    let prompts = prompts(MIXED);
    (0..repeat)
        .flat_map(|_| prompts.iter().enumerate())
        .map(|(i, p)| common::greedy_chat_request(model(), p, 40, i as u64))
        .collect()
}

fn alone(request: &GenerateRequest) -> Vec<u32> {
    let mut target = model().new_lm().unwrap();
    let mut plain = Method::Plain.build::<LlamaLm>(None).unwrap();
    generate(&mut target, plain.as_mut(), request, None, &mut |_| true).unwrap().tokens
}

/// A draft context shared by `lanes` requests (the server's way).
fn shared_draft(lanes: usize) -> SharedDraft<'static> {
    SharedDraft::new(model().new_draft_lanes(4096, 1024, lanes).unwrap())
}

/// A job for `request` with `method`: drafting on a lane of `shared`, or on a context of its own.
fn job(
    request: &GenerateRequest,
    method: &Method,
    shared: Option<&SharedDraft<'static>>,
) -> Prepared<'static> {
    let drafter = match (method.needs_draft(), shared) {
        (false, _) => method.build::<LlamaLm>(None),
        (true, Some(s)) => method.build(Some(s.lane().unwrap())),
        (true, None) => method.build(Some(model().new_lm().unwrap())),
    };
    Prepared::free(request.clone(), drafter.unwrap())
}

fn jobs(requests: &[GenerateRequest], shared: Option<&SharedDraft<'static>>) -> Vec<Prepared<'static>> {
    let methods = methods();
    requests.iter().enumerate().map(|(i, r)| job(r, &methods[i % methods.len()], shared)).collect()
}

#[test]
fn eight_requests_at_once_emit_what_each_emits_alone() {
    if common::skip_model_tests("eight_requests_at_once_emit_what_each_emits_alone") {
        return;
    }
    let requests = requests(1);
    let reference: Vec<Vec<u32>> = requests.iter().map(alone).collect();
    let mut lm = model().new_batch_lm(2048, 8).unwrap();
    let draft = shared_draft(8);
    let outputs =
        run_batched(&mut lm, jobs(&requests, Some(&draft)), 8, StepLimits::default(), None, Some(&draft));
    for (i, (out, want)) in outputs.into_iter().zip(&reference).enumerate() {
        let out = out.unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(&out.tokens, want, "request {i} ({})", methods()[i % 5].name());
    }
    // The chain and DySpec requests drafted together: draft forwards held several lanes.
    let d = draft.counters();
    assert!(d.feeds > d.forwards, "{d:?}");
    // Eight lanes share each forward, and speculative lanes dropped rows below kept ones.
    assert!(lm.counters.forwards < 8 * 40, "{:?}", lm.counters);
    assert!(lm.counters.moved_rows > 0, "{:?}", lm.counters);
}

#[test]
fn lanes_joining_leaving_compacting_and_reusing_prefixes_stay_exact() {
    if common::skip_model_tests("lanes_joining_leaving_compacting_and_reusing_prefixes_stay_exact") {
        return;
    }
    // Each prompt twice (the second time from a cached prefix), three lanes at a time in a
    // context so small it must be compacted, prompts prefilled in chunks of 16 tokens (5 beside
    // a decoding lane).
    let requests = requests(2);
    let reference: Vec<Vec<u32>> = requests.iter().take(MIXED).map(alone).collect();
    let mut lm = model().new_batch_lm(256, 3).unwrap();
    let limits = StepLimits { prefill_chunk: 16, decode_chunk: 5, ..StepLimits::default() };
    let outputs = run_batched(&mut lm, jobs(&requests, None), 3, limits, None, None);
    for (i, out) in outputs.into_iter().enumerate() {
        let out = out.unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(out.tokens, reference[i % MIXED], "request {i}");
    }
    let c = lm.counters;
    assert!(c.compactions > 0, "{c:?}");
    assert!(c.reused_tokens > 0, "{c:?}");
    assert!(c.moved_rows > 0, "{c:?}");
    // Prefixes moved to host memory by the compactions came back bit for bit.
    assert!(c.restored_prefixes > 0, "{c:?}");
}

/// Plain decoding and every speculative method.
fn every_method() -> Vec<Method> {
    std::iter::once(Method::Plain).chain(common::speculative_methods()).collect()
}

/// Methods `i % 2 == half` of [`every_method`] (two tests, so the two cores share the work).
fn every_method_half(half: usize) {
    if common::skip_model_tests("every_method_on_twenty_prompts_eight_at_a_time_matches_alone") {
        return;
    }
    let requests: Vec<GenerateRequest> = prompts(20)
        .into_iter()
        .enumerate()
        .map(|(i, p)| common::greedy_chat_request(model(), p, 24, i as u64))
        .collect();
    assert_eq!(requests.len(), 20);
    let reference: Vec<Vec<u32>> = requests.iter().map(alone).collect();
    for method in every_method().into_iter().skip(half).step_by(2) {
        let draft = shared_draft(requests.len());
        let jobs = requests.iter().map(|r| job(r, &method, Some(&draft))).collect();
        let mut lm = model().new_batch_lm(2048, 8).unwrap();
        let outputs = run_batched(&mut lm, jobs, 8, StepLimits::default(), None, Some(&draft));
        for (i, out) in outputs.into_iter().enumerate() {
            let out = out.unwrap_or_else(|e| panic!("{} request {i}: {e}", method.name()));
            assert_eq!(out.tokens, reference[i], "{} request {i}", method.name());
        }
    }
}

#[test]
fn every_method_on_twenty_prompts_eight_at_a_time_matches_alone_half_0() {
    every_method_half(0);
}

#[test]
fn every_method_on_twenty_prompts_eight_at_a_time_matches_alone_half_1() {
    every_method_half(1);
}

/// A cached prefix is reused only by a lane of the same scope (a server's tenant): another
/// tenant's prompt is prefilled whole, so its speed cannot tell what the first one sent.
#[test]
fn cached_prefixes_are_reused_only_within_their_scope() {
    if common::skip_model_tests("cached_prefixes_are_reused_only_within_their_scope") {
        return;
    }
    let prompt: Vec<u32> = (0..48).map(|i| 100 + (i * 7) % 300).collect();
    let mut lm = model().new_batch_lm(512, 3).unwrap();
    let (first, reused) = lm.open(&prompt, 1).unwrap();
    assert_eq!(reused, 0);
    // Prefill the first lane, then let it go: its cells stay as a cached prefix of scope 1.
    lm.forward(&[LaneWork::Prefill { lane: first, tokens: &prompt }]).unwrap();
    lm.close(first);
    let (other, reused) = lm.open(&prompt, 2).unwrap();
    assert_eq!(reused, 0, "scope 2 must not reuse scope 1's prefix");
    lm.close(other);
    let (same, reused) = lm.open(&prompt, 1).unwrap();
    assert!(reused > 0, "scope 1 reuses its own prefix");
    lm.close(same);
}

/// Prefill `tokens` into `lane` in chunks of 256 rows, settling each step.
fn prefill(lm: &mut treespec_llama::LlamaBatchLm<'_>, lane: usize, tokens: &[u32]) {
    for chunk in tokens.chunks(256) {
        lm.forward(&[LaneWork::Prefill { lane, tokens: chunk }]).unwrap();
        lm.settle().unwrap();
    }
}

/// Distinct ordinary tokens: `n` of them from `seed`.
fn tokens(seed: u32, n: u32) -> Vec<u32> {
    (0..n).map(|i| 100 + (seed * 131 + i * 7) % 3000).collect()
}

/// Three conversations between turns: a finished turn stays reusable whole — in the cells for
/// the next turn right after, in host memory once other requests' rows have paid its keep
/// (a compaction moved it there, freeing its cells) — and a later turn restores it.
#[test]
fn finished_turns_stay_reusable_in_the_cells_then_in_host_memory() {
    if common::skip_model_tests("finished_turns_stay_reusable_in_the_cells_then_in_host_memory") {
        return;
    }
    let mut lm = model().new_batch_lm(8192, 3).unwrap();
    let first: Vec<Vec<u32>> = (1..=3).map(|k| tokens(k, 1100)).collect();
    for (scope, turn) in (1u64..).zip(&first) {
        let (lane, reused) = lm.open(turn, scope).unwrap();
        assert_eq!(reused, 0);
        prefill(&mut lm, lane, turn);
        lm.close(lane);
    }
    // The first conversations' prefixes cost their keep while the later ones were read: moved
    // to host memory, not dropped.
    assert!(lm.counters.saved_prefixes >= 1 && lm.counters.dropped_prefixes == 0, "{:?}", lm.counters);
    assert!(lm.counters.saved_bytes > 0, "{:?}", lm.counters);
    // Each conversation comes back with a next turn and reuses its whole first turn, from
    // wherever it is now.
    for (scope, turn) in (1u64..).zip(&first) {
        let next: Vec<u32> = turn.iter().copied().chain(tokens(10 + scope as u32, 50)).collect();
        let (lane, reused) = lm.open(&next, scope).unwrap();
        assert_eq!(reused, turn.len(), "conversation {scope}: {:?}", lm.counters);
        prefill(&mut lm, lane, &next[reused..]);
        lm.close(lane);
    }
    assert!(lm.counters.restored_prefixes >= 1, "{:?}", lm.counters);
    // Another tenant never restores them.
    let (lane, reused) = lm.open(&first[0], 9).unwrap();
    assert_eq!(reused, 0);
    lm.close(lane);
}

/// A saved prefix comes back even when prefixes kept in the cells leave no room above them: the
/// oldest kept one goes to host memory instead (it comes back the same way). Before, the restore
/// was refused and the prompt prefilled again, and in a small context under load (the test
/// above, on AVX2 kernels) no saved prefix ever came back.
#[test]
fn a_saved_prefix_comes_back_when_kept_prefixes_fill_the_cells() {
    if common::skip_model_tests("a_saved_prefix_comes_back_when_kept_prefixes_fill_the_cells") {
        return;
    }
    let mut lm = model().new_batch_lm(1024, 3).unwrap();
    // A finishes; F's rows pay A's keep, and a compaction moves A to host memory.
    let first = tokens(1, 300);
    for turn in [first.clone(), tokens(2, 300)] {
        let (lane, _) = lm.open(&turn, 1).unwrap();
        prefill(&mut lm, lane, &turn);
        lm.close(lane);
    }
    assert_eq!(lm.counters.saved_prefixes, 1, "{:?}", lm.counters);
    // Two requests read together and finish: both kept, 900 of the 1,024 cells held.
    let (b1, b2) = (tokens(3, 450), tokens(4, 450));
    let (l1, _) = lm.open(&b1, 1).unwrap();
    let (l2, _) = lm.open(&b2, 1).unwrap();
    for (c1, c2) in b1.chunks(256).zip(b2.chunks(256)) {
        let work = [LaneWork::Prefill { lane: l1, tokens: c1 }, LaneWork::Prefill { lane: l2, tokens: c2 }];
        lm.forward(&work).unwrap();
        lm.settle().unwrap();
    }
    lm.close(l1);
    lm.close(l2);
    let saved = lm.counters.saved_prefixes;
    // A's next turn restores all of A: the older kept request leaves for host memory.
    let next: Vec<u32> = first.iter().copied().chain(tokens(5, 50)).collect();
    let (lane, reused) = lm.open(&next, 1).unwrap();
    assert_eq!(reused, first.len(), "{:?}", lm.counters);
    assert_eq!(lm.counters.restored_prefixes, 1, "{:?}", lm.counters);
    assert_eq!(lm.counters.saved_prefixes, saved + 1, "{:?}", lm.counters);
    prefill(&mut lm, lane, &next[reused..]);
    lm.close(lane);
    // The one moved out comes back whole in turn.
    let (lane, reused) = lm.open(&b1, 1).unwrap();
    assert_eq!(reused, b1.len(), "{:?}", lm.counters);
    lm.close(lane);
}

/// A request that takes over most of a finished one's prefix leaves that prefix's unshared tail
/// dead in the cells, where it slows every later forward's attention; once the dead cells'
/// rent (dead cells summed over the forwards since) reaches twice the cells a compaction keeps,
/// a compaction frees them — after a few dozen one-row steps here, not only once a thousand
/// cells have died.
#[test]
fn a_dead_tail_is_compacted_away_once_its_rent_is_paid() {
    if common::skip_model_tests("a_dead_tail_is_compacted_away_once_its_rent_is_paid") {
        return;
    }
    let mut lm = model().new_batch_lm(4096, 2).unwrap();
    let first = tokens(1, 900);
    let (lane, _) = lm.open(&first, 1).unwrap();
    prefill(&mut lm, lane, &first);
    lm.close(lane);
    // The same head, another ending: 800 cells shared, the first one's last 100 now dead.
    let second: Vec<u32> = first[..800].iter().copied().chain(tokens(2, 100)).collect();
    let (lane, reused) = lm.open(&second, 1).unwrap();
    assert_eq!(reused, 800);
    prefill(&mut lm, lane, &second[800..]);
    let before = lm.counters.compactions;
    // One-row steps: the rent of 100 dead cells reaches 2 × ~900 kept cells in ~18 of them.
    let mut steps = 0;
    for t in tokens(3, 60) {
        lm.forward(&[LaneWork::Prefill { lane, tokens: &[t] }]).unwrap();
        lm.settle().unwrap();
        steps += 1;
        if lm.counters.compactions > before {
            break;
        }
    }
    assert!(lm.counters.compactions > before, "no compaction in {steps} steps: {:?}", lm.counters);
    assert!((10..=30).contains(&steps), "compacted after {steps} steps: {:?}", lm.counters);
    // The first prefix, taken over, was dropped, not copied to host memory: the lane carries
    // its head on, and a request for it again finds that head in the cells.
    assert_eq!((lm.counters.taken_over_prefixes, lm.counters.saved_prefixes), (1, 0), "{:?}", lm.counters);
    lm.close(lane);
    let (again, reused) = lm.open(&first, 1).unwrap();
    assert_eq!(reused, 800, "{:?}", lm.counters);
    lm.close(again);
}
