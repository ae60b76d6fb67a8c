//! Heap traffic of the per-step data path: allocations and bytes allocated per decode step and
//! per token, counted by a global allocator, for `generate --method chain -k 4` (greedy).
//!
//! `cargo run --release --example step_copies -p treespec-llama -- MODEL [DRAFT] [TOKENS] [K]`
//!
//! DRAFT defaults to MODEL (a second context on the same weights), TOKENS to 32, K to 4. The
//! callback does what `treespec generate` does with each step (takes the text the step
//! released). Counted: Rust heap allocations (`alloc`, `alloc_zeroed`, and `realloc`, which
//! counts as one allocation of the new size): a copied logits row or history is one allocation of
//! its size, so "bytes allocated" is an upper bound on bytes copied into fresh buffers.
//! llama.cpp's own C/C++ allocations are not seen. The first step also carries the drafter's
//! prompt processing, so the figures are over steps 2.. only.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use treespec_core::sampling::SamplingParams;
use treespec_engine::{generate, GenerateRequest, Method, StopConditions, TokenBytes};
use treespec_llama::{LlamaModel, LoadOptions};
use treespec_text::ChatMessage;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(layout.size() as u64, Relaxed);
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(layout.size() as u64, Relaxed);
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(new_size as u64, Relaxed);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn counters() -> (u64, u64) {
    (ALLOCS.load(Relaxed), BYTES.load(Relaxed))
}

struct Bytes<'a>(&'a LlamaModel);

impl TokenBytes for Bytes<'_> {
    fn token_bytes(&self, token: u32) -> Vec<u8> {
        self.0.token_to_bytes(token, false).unwrap_or_default()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(model_path) = args.first() else {
        return Err("usage: step_copies MODEL [DRAFT] [TOKENS] [K]".into());
    };
    let draft_path = args.get(1).filter(|d| *d != model_path);
    let tokens: usize = args.get(2).map_or(Ok(32), |s| s.parse())?;
    let k: usize = args.get(3).map_or(Ok(4), |s| s.parse())?;
    let opts = LoadOptions { ctx_size: 1024, n_seq_max: 16, ..LoadOptions::default() };
    let target = LlamaModel::load(model_path, opts.clone())?;
    let draft_model = match draft_path {
        Some(p) => Some(LlamaModel::load(p, opts)?),
        None => None,
    };
    let template = target.compiled_chat_template()?;
    let prompt = target.chat_prompt(
        &template,
        &[ChatMessage::new("user", "Write a Python function that tells whether a number is prime.")],
        None,
    )?;
    let eos: Vec<u32> = [target.eos(), target.eot()].into_iter().flatten().collect();

    let mut lm = target.new_lm()?;
    let draft = draft_model.as_ref().unwrap_or(&target).new_lm()?;
    let mut drafter = Method::Chain { k }.build(Some(draft))?;
    let request = GenerateRequest {
        prompt,
        max_new_tokens: tokens,
        sampling: SamplingParams::default(),
        seed: 0,
        stop: StopConditions { eos, stop_strings: Vec::new() },
    };
    let bytes = Bytes(&target);
    let mut text = String::new();
    // (allocations, bytes, tokens) at the end of each step.
    let mut marks: Vec<(u64, u64, usize)> = Vec::with_capacity(tokens + 1);
    let mut emitted = 0usize;
    let out = generate(&mut lm, drafter.as_mut(), &request, Some(&bytes), &mut |step| {
        text.push_str(&step.text());
        emitted += step.emitted.len();
        let (a, b) = counters();
        marks.push((a, b, emitted));
        true
    })?;
    text.push_str(&out.tail);

    println!("method chain -k {k}, {} tokens in {} steps", out.tokens.len(), marks.len());
    println!("step  tokens  allocations  bytes allocated");
    for (i, w) in marks.windows(2).enumerate() {
        println!("{:>4}  {:>6}  {:>11}  {:>15}", i + 2, w[1].2 - w[0].2, w[1].0 - w[0].0, w[1].1 - w[0].1);
    }
    if let (Some(first), Some(last)) = (marks.first(), marks.last()) {
        let steps = (marks.len() - 1).max(1) as f64;
        let toks = (last.2 - first.2).max(1) as f64;
        let (a, b) = ((last.0 - first.0) as f64, (last.1 - first.1) as f64);
        println!("steps 2..{}: per step {:.1} allocations, {:.0} bytes", marks.len(), a / steps, b / steps);
        println!("steps 2..{}: per token {:.1} allocations, {:.0} bytes", marks.len(), a / toks, b / toks);
    }
    println!("tokens/s {:.1} (wall {:.3} s)", out.stats.tokens_per_s(), out.stats.wall.as_secs_f64());
    eprintln!("{text}");
    Ok(())
}
