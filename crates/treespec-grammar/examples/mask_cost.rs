//! What grammar constraints cost per token on a real vocabulary.
//!
//! `cargo run --release -p treespec-grammar --example mask_cost -- MODEL.gguf [MODEL.gguf...]`
//!
//! For each model: build the [`Vocabulary`] from its tokens, compile a realistic JSON schema (an
//! order with a customer, a list of items, an enum, free text), write a valid document along
//! the masks (at each step the longest allowed token that continues the document), then replay
//! that path and time, per position: the mask, the advance, the forced-token chain, a fork
//! (clone), and rollbacks of 1 and 8 tokens. Medians and 90th percentiles in µs.

#[path = "../tests/common/llama.rs"]
mod llama;

use std::path::PathBuf;
use std::time::Instant;

use serde_json::{json, Value};
use treespec_grammar::{Constraint, Grammar, GrammarSpec, TokenId, Vocabulary};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "order_id": {"type": "integer", "minimum": 1},
            "customer": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "email": {"type": "string", "pattern": "^[a-z.]+@[a-z]+\\.[a-z]{2,}$"},
                    "vip": {"type": "boolean"}
                },
                "required": ["name", "email", "vip"],
                "additionalProperties": false
            },
            "items": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                        "quantity": {"type": "integer", "minimum": 1},
                        "unit_price": {"type": "number"}
                    },
                    "required": ["sku", "quantity", "unit_price"],
                    "additionalProperties": false
                }
            },
            "status": {"enum": ["pending", "paid", "shipped", "delivered", "cancelled"]},
            "notes": {"type": "string"}
        },
        "required": ["order_id", "customer", "items", "status", "notes"],
        "additionalProperties": false
    })
}

/// A valid document in the grammar's layout (`", "` and `": "` separators).
fn document() -> String {
    let items: Vec<String> = (0..14)
        .map(|i| {
            format!(
                r#"{{"sku": "{}{}{}-{:04}", "quantity": {}, "unit_price": {}.{:02}}}"#,
                (b'A' + i % 26) as char,
                (b'K' + i % 7) as char,
                (b'Q' + i % 5) as char,
                1000 + 37 * i as u32,
                1 + i % 4,
                3 + 11 * i as u32,
                (17 * i as u32) % 100
            )
        })
        .collect();
    format!(
        r#"{{"order_id": 48213, "customer": {{"name": "Ada Lovelace", "email": "ada.lovelace@example.org", "vip": true}}, "items": [{}], "status": "shipped", "notes": "Leave the parcel with the neighbour at number 12 if nobody answers; fragile items inside."}}"#,
        items.join(", ")
    )
}

/// The token path that writes `doc` along the masks: at each step the longest allowed token
/// whose bytes continue the document, then EOS. Also returns each mask's time: this first pass
/// runs on a freshly compiled grammar, with llguidance's lexer caches cold.
fn write_along_masks(grammar: &Grammar, doc: &[u8]) -> (Vec<TokenId>, Vec<f64>) {
    let mut c = grammar.constraint();
    let vocab = grammar.vocab().clone();
    let (mut path, mut at, mut cold) = (Vec::new(), 0, Vec::new());
    while !c.is_finished() {
        let t0 = Instant::now();
        let mask = c.mask().expect("mask");
        cold.push(micros(t0));
        let rest = &doc[at..];
        let next = if rest.is_empty() {
            mask.iter().find(|&t| vocab.is_eos(t))
        } else {
            mask.iter()
                .filter(|&t| rest.starts_with(vocab.token_bytes(t)))
                .max_by_key(|&t| vocab.token_bytes(t).len())
        };
        let t = next.unwrap_or_else(|| {
            panic!("the document leaves the grammar at byte {at}: {:?}", vocab.decode(&path))
        });
        at += if vocab.is_eos(t) { 0 } else { vocab.token_bytes(t).len() };
        c.advance(t).expect("allowed");
        path.push(t);
    }
    (path, cold)
}

#[derive(Default)]
struct Samples {
    mask: Vec<f64>,
    /// Masks at positions that allow more than one token (the bias computation proper).
    open_mask: Vec<f64>,
    advance: Vec<f64>,
    forced: Vec<f64>,
    fork: Vec<f64>,
    rollback1: Vec<f64>,
    rollback8: Vec<f64>,
    commit: Vec<f64>,
}

fn micros(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// Replay `path`, timing every operation at every position.
fn measure(grammar: &Grammar, path: &[TokenId]) -> (Samples, usize, usize) {
    let mut s = Samples::default();
    let (mut singletons, mut forced_total) = (0, 0);
    let mut c = grammar.constraint();
    for (i, &t) in path.iter().enumerate() {
        let t0 = Instant::now();
        let single = c.mask().expect("mask").single();
        s.mask.push(micros(t0));
        if single.is_none() {
            s.open_mask.push(*s.mask.last().expect("pushed"));
        }
        singletons += usize::from(single.is_some());
        let t0 = Instant::now();
        let forced = c.forced_tokens(64).expect("forced");
        s.forced.push(micros(t0));
        forced_total += forced.len();
        let t0 = Instant::now();
        let fork = c.fork();
        s.fork.push(micros(t0));
        drop(fork);
        let t0 = Instant::now();
        c.advance(t).expect("advance");
        s.advance.push(micros(t0));
        if i >= 8 && i + 1 < path.len() {
            time_rollbacks(&mut c, &path[i + 1 - 8..=i], &mut s);
        }
    }
    (s, singletons, forced_total)
}

/// Roll back 1 and 8 tokens (the last of `recent` and all of them) and put them back.
fn time_rollbacks(c: &mut Constraint, recent: &[TokenId], s: &mut Samples) {
    let t0 = Instant::now();
    c.rollback(1).expect("rollback");
    s.rollback1.push(micros(t0));
    c.commit(&recent[7..]).expect("commit");
    let t0 = Instant::now();
    c.rollback(8).expect("rollback");
    s.rollback8.push(micros(t0));
    let t0 = Instant::now();
    c.commit(recent).expect("commit");
    s.commit.push(micros(t0) / 8.0);
}

fn stats(name: &str, v: &mut [f64]) {
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    println!("  {name:<28} median {:>8.1} µs   p90 {:>8.1} µs   max {:>8.1} µs", q(0.5), q(0.9), q(1.0));
}

fn run(path: PathBuf) {
    println!("{}", path.display());
    let model = std::sync::Arc::new(llama::load_model(&path));
    let t0 = Instant::now();
    let vocab: Vocabulary = llama::llama_vocabulary(&model);
    println!(
        "  vocabulary: {} tokens, {} EOS ids, built in {:.0} ms",
        vocab.size(),
        vocab.eos().len(),
        micros(t0) / 1e3
    );
    report("forced text split greedily", &vocab);
    report("forced text split by llama.cpp's tokenizer", &llama::with_model_tokenizer(&vocab, model));
}

fn report(label: &str, vocab: &Vocabulary) {
    println!(" {label}:");
    let t0 = Instant::now();
    let grammar = GrammarSpec::JsonSchema(schema()).compile(vocab).expect("schema");
    println!("  schema compiled in {:.1} ms", micros(t0) / 1e3);
    let doc = document();
    let (tokens, mut cold) = write_along_masks(&grammar, doc.as_bytes());
    assert_eq!(vocab.decode(&tokens), doc);
    let (mut s, singletons, forced_total) = measure(&grammar, &tokens);
    println!(
        "  document: {} bytes, {} tokens; {} positions ({:.0}%) have a one-token mask; forced chains average {:.1} tokens",
        doc.len(),
        tokens.len(),
        singletons,
        100.0 * singletons as f64 / tokens.len() as f64,
        forced_total as f64 / tokens.len() as f64
    );
    stats("mask, first request (cold)", &mut cold);
    stats("mask, warm lexer cache", &mut s.mask);
    stats("mask, warm, >1 token allowed", &mut s.open_mask);
    stats("advance (mask cached)", &mut s.advance);
    let mut both: Vec<f64> = s.mask.iter().zip(&s.advance).map(|(m, a)| m + a).collect();
    stats("mask + advance (warm)", &mut both);
    stats("forced_tokens (max 64)", &mut s.forced);
    stats("fork (clone)", &mut s.fork);
    stats("rollback 1", &mut s.rollback1);
    stats("rollback 8", &mut s.rollback8);
    stats("commit, per token", &mut s.commit);
}

fn main() {
    let models: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    if models.is_empty() {
        eprintln!("usage: mask_cost MODEL.gguf [MODEL.gguf...]");
        std::process::exit(2);
    }
    models.into_iter().for_each(run);
}
