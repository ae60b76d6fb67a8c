//! Which prompt a batched step reads (`batched/chunks.rs`), and the first tree riding the chunk
//! that finishes its prompt: a short prompt that joins while a long one is being read gets its
//! first token from the very next step — its prompt and its first tree, alone — instead of after
//! the whole long prompt; the long prompt is never starved; and neither request's output changes
//! (greedy and sampled, against each alone).

use treespec_core::sampling::{Sampler, SamplingParams};
use treespec_core::tree::TokenTree;
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;
use treespec_engine::batched::{Batch, LaneStep, StepLimits};
use treespec_engine::drafters::ChainDrafter;
use treespec_engine::toy::{ToyBatchLm, ToyLm, ToyModel};
use treespec_engine::{
    generate, Drafter, ForwardCost, GenerateRequest, Generation, MethodKind, PlainDrafter, ProposeContext,
};

const CTX: usize = 512;
const VOCAB: usize = 7;
const CHUNK: usize = 16;

fn target() -> ToyModel {
    ToyModel::new(VOCAB, 2, 5)
}

fn prompt(len: usize, salt: usize) -> Vec<TokenId> {
    (0..len).map(|i| ((i * 3 + salt + i / 5) % VOCAB) as TokenId).collect()
}

fn request(prompt: &[TokenId], new: usize, temperature: f32) -> GenerateRequest {
    GenerateRequest::new(prompt.to_vec(), new, SamplingParams::with_temperature(temperature), 11)
}

fn drafter(chain: bool) -> Box<dyn Drafter> {
    match chain {
        true => Box::new(ChainDrafter::new(ToyLm::new(target().draft(0.7, 3), CTX), 3).unwrap()),
        false => Box::new(PlainDrafter),
    }
}

fn alone(req: GenerateRequest, chain: bool) -> Vec<TokenId> {
    let mut lm = ToyLm::new(target(), CTX);
    generate(&mut lm, drafter(chain).as_mut(), &req, None, &mut |_| true).unwrap().tokens
}

/// Per step: (the long request's prompt tokens read, tokens each member emitted so far).
struct Trace {
    long_read: Vec<usize>,
    emitted: Vec<[usize; 2]>,
}

/// A long prompt (300 tokens, joined first) and a short one (6 tokens, joined second) decoded
/// together with 16-token chunks; returns each one's output and the per-step trace.
fn long_then_short(temperature: f32, chain: bool, short_new: usize) -> ([Vec<TokenId>; 2], Trace) {
    long_then_short_in(
        StepLimits { prefill_chunk: CHUNK, ..StepLimits::default() },
        temperature,
        chain,
        short_new,
    )
}

/// [`long_then_short`] with the given step limits.
fn long_then_short_in(
    limits: StepLimits,
    temperature: f32,
    chain: bool,
    short_new: usize,
) -> ([Vec<TokenId>; 2], Trace) {
    let mut lm = ToyBatchLm::new(target(), CTX, 2);
    let mut batch: Batch<'_, usize> = Batch::new();
    let reqs = [request(&prompt(300, 1), 5, temperature), request(&prompt(6, 4), short_new, temperature)];
    for (i, req) in reqs.into_iter().enumerate() {
        let generation = Generation::new(req, CTX, VOCAB, None).unwrap();
        batch.join(&mut lm, generation, drafter(chain), None, 0, i).unwrap();
    }
    let mut outputs: [Vec<TokenId>; 2] = Default::default();
    let mut trace = Trace { long_read: Vec::new(), emitted: Vec::new() };
    let mut emitted = [0usize; 2];
    for _ in 0..200 {
        if batch.is_empty() {
            break;
        }
        let (results, _) = batch.step(&mut lm, limits, None, None);
        for (k, result) in results.into_iter().enumerate().rev() {
            let job = *batch.data(k);
            match result {
                LaneStep::Stepped(o) => {
                    emitted[job] += o.emitted.len();
                    if o.done {
                        let (_, out) = batch.leave(&mut lm, k, true);
                        outputs[job] = out.unwrap().tokens;
                    }
                }
                LaneStep::Failed(e) => panic!("request {job} failed: {e}"),
                LaneStep::Waiting => {}
            }
        }
        let long_read = batch.iter().find(|(_, &job)| job == 0).map_or(299, |(lane, _)| lane.prefilled);
        trace.long_read.push(long_read);
        trace.emitted.push(emitted);
    }
    assert!(batch.is_empty(), "both requests finished");
    (outputs, trace)
}

#[test]
fn a_short_prompt_beside_a_long_one_gets_its_first_token_in_one_step() {
    let (outputs, trace) = long_then_short(0.0, false, 4);
    // Step 1 reads the short prompt and scores its first tree, alone.
    assert_eq!(trace.long_read[0], 0, "the long prompt waited for the short one's first token");
    assert_eq!(trace.emitted[0], [0, 1], "the short request's first token came out of step 1");
    // Then the long prompt is read, a full chunk per step, while the short one decodes; its
    // first tree rides its last chunk.
    assert_eq!(trace.long_read[1], CHUNK);
    let step = trace.emitted.iter().position(|e| e[0] > 0).expect("the long request emitted");
    assert_eq!(step, 299usize.div_ceil(CHUNK), "the long prompt lost one step, and its first token none");
    assert_eq!(outputs[0], alone(request(&prompt(300, 1), 5, 0.0), false));
    assert_eq!(outputs[1], alone(request(&prompt(6, 4), 4, 0.0), false));
}

#[test]
fn while_a_request_decodes_a_prompt_is_read_in_decode_chunks() {
    // 32-token chunks when nothing decodes, 8 while the short request does.
    let limits = StepLimits { prefill_chunk: 32, decode_chunk: 8, ..StepLimits::default() };
    let short_new = 10;
    let (outputs, trace) = long_then_short_in(limits, 0.0, false, short_new);
    assert_eq!(trace.emitted[0], [0, 1], "the short request's first token came out of step 1");
    let (mut read_before, mut emitted_before) = (0, [0, 0]);
    let (mut small, mut full) = (0, 0);
    for (&read, &emitted) in trace.long_read.iter().zip(&trace.emitted) {
        let chunk = read - read_before;
        // The short request decoded in this step: its prompt was in and it was not done.
        let short_decoding = emitted_before[1] > 0 && emitted_before[1] < short_new;
        if chunk > 0 && read < 299 {
            if short_decoding {
                assert_eq!(chunk, 8, "a chunk beside a decoding request: {:?}", trace.long_read);
                small += 1;
            } else if emitted_before[1] == short_new {
                assert_eq!(chunk, 32, "a chunk with nothing decoding: {:?}", trace.long_read);
                full += 1;
            }
        }
        (read_before, emitted_before) = (read, emitted);
    }
    // One small chunk beside each of the short request's tokens after its first, then the rest
    // of the prompt in full chunks.
    assert_eq!(small, short_new - 1, "{:?}", trace.long_read);
    assert!(full >= 3, "{:?}", trace.long_read);
    assert_eq!(outputs[0], alone(request(&prompt(300, 1), 5, 0.0), false));
    assert_eq!(outputs[1], alone(request(&prompt(6, 4), short_new, 0.0), false));
}

#[test]
fn batching_order_never_changes_what_a_request_emits() {
    for (temperature, chain) in [(0.0, true), (0.9, false), (0.9, true)] {
        let (outputs, _) = long_then_short(temperature, chain, 12);
        assert_eq!(
            outputs[0],
            alone(request(&prompt(300, 1), 5, temperature), chain),
            "long, t={temperature}"
        );
        assert_eq!(
            outputs[1],
            alone(request(&prompt(6, 4), 12, temperature), chain),
            "short, t={temperature}"
        );
    }
}

#[test]
fn a_stream_of_short_prompts_never_starves_a_long_one() {
    // Lane 0 reads a long prompt; a new short request joins at every step, each of them
    // asking for the shortest-first and first-token rules: the long prompt still advances at
    // least once every few steps.
    let mut lm = ToyBatchLm::new(target(), CTX, 8);
    let limits = StepLimits { prefill_chunk: CHUNK, ..StepLimits::default() };
    let mut batch: Batch<'_, usize> = Batch::new();
    let long = Generation::new(request(&prompt(200, 2), 2, 0.0), CTX, VOCAB, None).unwrap();
    batch.join(&mut lm, long, drafter(false), None, 0, 0).unwrap();
    let mut read = Vec::new();
    for step in 1..=40 {
        if batch.len() < 8 {
            let short = Generation::new(request(&prompt(3, step), 1, 0.0), CTX, VOCAB, None).unwrap();
            batch.join(&mut lm, short, drafter(false), None, 0, step).unwrap();
        }
        let (results, _) = batch.step(&mut lm, limits, None, None);
        for (k, result) in results.into_iter().enumerate().rev() {
            if matches!(result, LaneStep::Stepped(ref o) if o.done) && *batch.data(k) != 0 {
                batch.leave(&mut lm, k, true);
            }
        }
        read.push(batch.iter().find(|(_, &job)| job == 0).map_or(199, |(lane, _)| lane.prefilled));
    }
    for window in read.windows(6) {
        assert!(
            window[5] > window[0] || window[0] == 199,
            "the long prompt advanced within 6 steps: {read:?}"
        );
    }
}

/// Plain decoding that records every forward its steps were scored in.
struct Recording(std::sync::Arc<std::sync::Mutex<Vec<ForwardCost>>>);

impl Drafter for Recording {
    fn kind(&self) -> MethodKind {
        MethodKind::Plain
    }
    fn begin(&mut self, _: &[TokenId], _: &Sampler, _: u64) -> treespec_engine::Result<()> {
        Ok(())
    }
    fn propose(&mut self, ctx: &ProposeContext) -> treespec_engine::Result<TokenTree> {
        Ok(TokenTree::new(ctx.root()))
    }
    fn observe(&mut self, _: &TokenTree, _: &VerifyOutcome) -> treespec_engine::Result<()> {
        Ok(())
    }
    fn observe_cost(&mut self, forward: ForwardCost) {
        self.0.lock().unwrap().push(forward);
    }
}

#[test]
fn a_forward_that_reads_a_prompt_chunk_is_reported_with_its_prompt_rows() {
    // The short request decodes while the long prompt is read 8 tokens a step beside it: its
    // drafter hears of each of those forwards as 9 rows, 8 of them prompt (no logits, so no
    // timing of T(9)), and of the forwards after the prompt is in as trees alone.
    let limits = StepLimits { prefill_chunk: 32, decode_chunk: 8, ..StepLimits::default() };
    let mut lm = ToyBatchLm::new(target(), CTX, 2);
    let mut batch: Batch<'_, usize> = Batch::new();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let long = Generation::new(request(&prompt(300, 1), 3, 0.0), CTX, VOCAB, None).unwrap();
    batch.join(&mut lm, long, drafter(false), None, 0, 0).unwrap();
    let short = Generation::new(request(&prompt(6, 4), 60, 0.0), CTX, VOCAB, None).unwrap();
    batch.join(&mut lm, short, Box::new(Recording(seen.clone())), None, 0, 1).unwrap();
    while !batch.is_empty() {
        let (results, _) = batch.step(&mut lm, limits, None, None);
        for (k, result) in results.into_iter().enumerate().rev() {
            match result {
                LaneStep::Stepped(o) if o.done => drop(batch.leave(&mut lm, k, true)),
                LaneStep::Failed(e) => panic!("failed: {e}"),
                _ => {}
            }
        }
    }
    let seen = seen.lock().unwrap();
    let beside_chunks = seen.iter().filter(|f| f.prompt_rows == 8).count();
    assert!(beside_chunks >= 30, "{seen:?}");
    assert!(seen.iter().all(|f| f.rows > f.prompt_rows), "every forward holds the tree's root: {seen:?}");
    assert!(seen.iter().filter(|f| f.prompt_rows == 8).all(|f| f.timed_rows().is_none()));
    let alone: Vec<_> = seen.iter().filter(|f| f.prompt_rows == 0).collect();
    assert!(!alone.is_empty() && alone.iter().all(|f| f.timed_rows() == Some(f.rows)), "{seen:?}");
}
