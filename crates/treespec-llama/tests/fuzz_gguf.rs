//! Fuzzing the GGUF pre-check and llama.cpp's loader behind it (issue #15: no input file may
//! abort the process). Bounded property runs: `TREESPEC_FUZZ_CASES` cases per property (default
//! a few seconds' worth for CI); `scripts/fuzz.sh` runs many more.
//!
//! Three generators: (1) well-formed GGUF headers with random metadata drawn around the values
//! llama.cpp asserts on, and random tensor tables, then random byte flips, insertions and
//! truncations; (2) random bytes after the magic; (3) the real SmolLM2 file with one integer
//! metadata value replaced by an extreme one. For every file: [`check_gguf`] returns (Ok or
//! Err, never a panic), and when it accepts the file, loading it — and for the real model,
//! making a context and decoding — returns too. A llama.cpp abort kills the test process; the
//! file that did it is left at the path printed at the start (`last-case.gguf`).

mod common;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::gguf::{patch_u32, Gguf, TensorInfo, V};
use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use treespec_engine::{CausalLm, TreeBatch};
use treespec_llama::{check_gguf, LlamaModel, LoadOptions};

fn cases(default: u32) -> u32 {
    std::env::var("TREESPEC_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The one file every case is written to (kept after a crash, as the reproducer).
fn case_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("treespec-fuzz-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{name}-last-case.gguf"));
    eprintln!("fuzz {name}: each case is written to {} (left there if the process dies)", p.display());
    p
}

fn options() -> LoadOptions {
    LoadOptions { threads: 1, ctx_size: 256, n_seq_max: 4, n_ubatch: 256, ..LoadOptions::default() }
}

/// Whatever happens, it must be a return: Ok or Err. Counts what the pre-check refused.
fn probe(path: &Path, bytes: &[u8], decode: bool, stats: &RefCell<Stats>) {
    let mut stats = stats.borrow_mut();
    std::fs::write(path, bytes).unwrap();
    stats.cases += 1;
    if check_gguf(path).is_err() {
        stats.precheck_refused += 1;
        return;
    }
    match LlamaModel::load(path, options()) {
        Err(_) => stats.load_refused += 1,
        Ok(model) => {
            stats.loaded += 1;
            if decode {
                if let Ok(mut lm) = model.new_lm() {
                    let _ = lm.forward(&TreeBatch::chain(&[1, 2], None, 0, true));
                }
            }
        }
    }
}

#[derive(Debug, Default)]
struct Stats {
    cases: u32,
    precheck_refused: u32,
    load_refused: u32,
    loaded: u32,
}

const KEYS: &[&str] = &[
    "general.architecture",
    "general.alignment",
    "llama.block_count",
    "llama.context_length",
    "llama.embedding_length",
    "llama.feed_forward_length",
    "llama.attention.head_count",
    "llama.attention.head_count_kv",
    "llama.attention.key_length",
    "llama.attention.value_length",
    "llama.expert_count",
    "llama.expert_used_count",
    "llama.expert_group_count",
    "llama.expert_group_used_count",
    "llama.nextn_predict_layers",
    "llama.rope.scaling.type",
    "llama.rope.dimension_count",
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "llama.vocab_size",
    "general.file_type",
];

fn interesting_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(3),
        Just(30),
        Just(512),
        Just(513),
        Just(1024),
        Just(1025),
        Just(u32::MAX as u64),
        Just(u64::MAX),
        any::<u64>(),
    ]
}

fn value() -> impl Strategy<Value = V> {
    let word = prop_oneof![
        Just("llama".to_string()),
        Just("qwen2".to_string()),
        Just("gpt2".to_string()),
        Just("yarn".to_string()),
        Just("".to_string()),
        "[a-z<|>_ ]{0,12}",
    ];
    prop_oneof![
        interesting_u64().prop_map(|v| V::U32(v as u32)),
        interesting_u64().prop_map(|v| V::I32(v as i32)),
        interesting_u64().prop_map(V::U64),
        interesting_u64().prop_map(|v| V::I64(v as i64)),
        any::<u8>().prop_map(V::U8),
        any::<i8>().prop_map(V::I8),
        any::<u16>().prop_map(V::U16),
        any::<i16>().prop_map(V::I16),
        any::<f32>().prop_map(V::F32),
        any::<bool>().prop_map(V::Bool),
        word.clone().prop_map(V::Str),
        proptest::collection::vec(interesting_u64().prop_map(|v| v as u32), 0..40).prop_map(V::ArrU32),
        proptest::collection::vec(interesting_u64().prop_map(|v| v as i32), 0..40).prop_map(V::ArrI32),
        proptest::collection::vec(word, 0..12).prop_map(V::ArrStr),
    ]
}

fn tensor() -> impl Strategy<Value = TensorInfo> {
    (
        prop_oneof![
            Just("token_embd.weight".to_string()),
            Just("output.weight".to_string()),
            "[a-z._]{0,16}"
        ],
        proptest::collection::vec(interesting_u64(), 0..6),
        prop_oneof![0u32..40, any::<u32>()],
        prop_oneof![Just(0u64), (0u64..64).prop_map(|x| x * 32), any::<u64>()],
    )
        .prop_map(|(name, dims, ggml_type, offset)| TensorInfo { name, dims, ggml_type, offset })
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..9))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(mut b: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        if b.is_empty() {
            break;
        }
        match m {
            Mutation::Flip(i, x) => {
                let i = i % b.len();
                b[i] ^= x;
            }
            Mutation::Insert(i, x) => {
                let i = i % b.len();
                b.splice(i..i, x.iter().copied());
            }
            Mutation::Truncate(i) => b.truncate(i % b.len()),
        }
    }
    b
}

fn generated_file() -> impl Strategy<Value = Vec<u8>> {
    let kv = proptest::collection::vec((prop::sample::select(KEYS).prop_map(str::to_string), value()), 0..10);
    (
        prop_oneof![8 => Just(3u32), 1 => Just(2), 1 => any::<u32>()],
        Just(("general.architecture".to_string(), V::Str("llama".into()))),
        kv,
        // Mostly no tensors and no byte mutations, so that most files reach llama.cpp's loader.
        prop_oneof![3 => Just(Vec::new()), 1 => proptest::collection::vec(tensor(), 1..3)],
        0usize..512,
        prop_oneof![3 => Just(Vec::new()), 1 => proptest::collection::vec(mutation(), 1..4)],
    )
        .prop_map(|(version, arch, mut kv, tensors, data, mutations)| {
            kv.insert(0, arch);
            mutate(Gguf { version, kv, tensors, data }.bytes(), &mutations)
        })
}

/// Run `cases` files made by `strategy` through [`probe`] (decoding too with `decode`), and
/// return what happened to them.
fn fuzz<S: Strategy>(
    name: &str,
    cases: u32,
    strategy: S,
    file: impl Fn(S::Value) -> Vec<u8>,
    decode: bool,
) -> Stats {
    let path = case_path(name);
    let stats = RefCell::new(Stats::default());
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    runner
        .run(&strategy, |v| {
            probe(&path, &file(v), decode, &stats);
            Ok(())
        })
        .unwrap();
    let stats = stats.into_inner();
    eprintln!("fuzz {name}: {stats:?}");
    stats
}

#[test]
fn generated_and_mutated_headers_never_abort() {
    let stats = fuzz("generated", cases(300), generated_file(), |bytes| bytes, false);
    assert!(stats.precheck_refused > 0, "the generator should reach the pre-check's refusals");
    assert!(stats.load_refused > 0, "the generator should reach llama.cpp's loader too");
}

#[test]
fn random_bytes_after_the_magic_never_abort() {
    let tail = proptest::collection::vec(any::<u8>(), 0..256);
    fuzz("random", cases(300), tail, |tail| [b"GGUF".to_vec(), tail].concat(), false);
}

#[test]
fn the_real_model_with_extreme_metadata_never_aborts() {
    if skip_model_tests("the_real_model_with_extreme_metadata_never_aborts") {
        return;
    }
    static REAL: OnceLock<Vec<u8>> = OnceLock::new();
    let real = REAL.get_or_init(|| std::fs::read(model_path()).unwrap());
    // The keys SmolLM2 holds as u32 values: those a patch can change in place.
    let present: Vec<&str> = KEYS
        .iter()
        .copied()
        .filter(|k| {
            let mut needle = (k.len() as u64).to_le_bytes().to_vec();
            needle.extend(k.as_bytes());
            needle.extend(4u32.to_le_bytes());
            real.windows(needle.len()).any(|w| w == needle)
        })
        .collect();
    assert!(present.len() >= 8, "SmolLM2 should carry most of these keys as u32: {present:?}");
    let values = prop_oneof![
        Just(0u32),
        Just(1),
        Just(2),
        Just(7),
        Just(63),
        Just(512),
        Just(513),
        Just(49152),
        Just(1 << 31),
        Just(u32::MAX),
        any::<u32>()
    ];
    let patched = |(key, value)| patch_u32(real, key, value);
    fuzz("real", cases(24), (prop::sample::select(present), values), patched, true);
}
