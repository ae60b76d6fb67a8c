//! What the global suffix history costs: memory after 10,000 requests (against its cap), the
//! update cost per indexed token at about 1 M tokens, and the lookup cost per decoding step.
//!
//! `cargo run --release -p treespec-core --example suffix_cost -- [PROMPTS.jsonl] [REQUESTS] [CAP]`
//!
//! The requests are Spec-Bench's prompts (default ../shared/data/spec-bench/question.jsonl), word
//! by word mapped to ids (a word-level stand-in for tokens with natural repetition), each followed
//! by a made-up "answer" that quotes spans of its prompt, as real answers do.

use std::collections::HashMap;
use std::time::Instant;

use treespec_core::suffix::{GlobalHistory, LookupLimits};
use treespec_core::TokenId;

/// The first turn of each prompt in the JSON lines file at `path`, word by word mapped to ids.
fn word_prompts(path: &str) -> Vec<Vec<TokenId>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let mut ids: HashMap<String, TokenId> = HashMap::new();
    let prompts: Vec<Vec<TokenId>> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["turns"][0].as_str().map(str::to_owned))
        .map(|t| {
            t.split_whitespace()
                .map(|w| {
                    let n = ids.len() as TokenId;
                    *ids.entry(w.to_owned()).or_insert(n)
                })
                .collect()
        })
        .collect();
    assert!(!prompts.is_empty(), "no prompts in {path}");
    prompts
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).cloned().unwrap_or_else(|| "../shared/data/spec-bench/question.jsonl".into());
    let requests: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let cap: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let prompts = word_prompts(&path);

    let mut history = GlobalHistory::new(cap).expect("valid cap");
    let mut added = 0usize;
    let mut peak = 0usize;
    let start = Instant::now();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for r in 0..requests {
        let prompt = &prompts[r % prompts.len()];
        let mut doc = prompt.clone();
        // An answer: four quoted spans of the prompt with a few fresh words between them.
        for _ in 0..4 {
            let a = next() as usize % prompt.len().max(1);
            let b = (a + 5 + next() as usize % 30).min(prompt.len());
            doc.extend_from_slice(&prompt[a..b]);
            doc.extend((0..3).map(|_| 1_000_000 + (next() % 50_000) as TokenId));
        }
        added += doc.len() + 1;
        history.add(r as u64, &doc);
        peak = peak.max(history.memory_bytes());
    }
    let elapsed = start.elapsed();
    println!("requests                 {requests}");
    println!("tokens added             {added}");
    println!("tokens held / cap        {} / {cap}", history.tokens());
    println!("documents held           {} ({} evicted)", history.docs(), history.evictions());
    println!("index memory now / peak  {:.1} MB / {:.1} MB", mb(history.memory_bytes()), mb(peak));
    println!("bytes per held token     {:.1}", history.memory_bytes() as f64 / history.tokens() as f64);
    println!("add cost per token       {:.0} ns (evictions and rebuilds included)", ns(elapsed, added));

    // Steady-state cost at ~1 M tokens: index fresh tokens into a history that holds ~1 M.
    let mut full = GlobalHistory::new(2_000_000).expect("valid cap");
    let mut r = 0;
    while full.tokens() < 1_000_000 {
        full.add(r as u64, &prompts[r % prompts.len()]);
        r += 1;
    }
    let probe: Vec<TokenId> = prompts.iter().take(200).flatten().copied().collect();
    let t = Instant::now();
    full.add(u64::MAX, &probe);
    println!(
        "update cost at {:.2} M tokens  {:.0} ns per token",
        full.tokens() as f64 / 1e6,
        ns(t.elapsed(), probe.len())
    );

    // Lookup per step: the last 64 tokens of a request's text, as the drafter asks.
    let limits = LookupLimits::default();
    let steps = 20_000;
    let mut found = 0usize;
    let t = Instant::now();
    for s in 0..steps {
        let p = &prompts[(s * 7) % prompts.len()];
        let end = 1 + (next() as usize % p.len().max(1));
        let q = &p[end.saturating_sub(64)..end];
        found += full.lookup(q, limits, None).len();
    }
    println!(
        "lookup per step          {:.1} µs ({:.1} occurrences found on average)",
        ns(t.elapsed(), steps) / 1e3,
        found as f64 / steps as f64
    );
}

fn mb(b: usize) -> f64 {
    b as f64 / 1e6
}

fn ns(d: std::time::Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e9 / n.max(1) as f64
}
