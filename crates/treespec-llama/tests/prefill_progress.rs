//! A prefill that reports its progress (`treespec generate`'s bar for long prompts) runs one
//! `llama_decode` per `n_ubatch` tokens: it must report every chunk, end at the whole prompt, and
//! leave the cache exactly as one call does — the next forward's logits bit-identical — since
//! llama.cpp splits one call into the same micro-batches.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use rand::SeedableRng;
use treespec_engine::{CausalLm, TreeBatch};
use treespec_llama::{LlamaModel, LoadOptions};

#[test]
fn reported_prefill_is_chunked_and_leaves_the_same_cache() {
    if skip_model_tests("reported_prefill_is_chunked_and_leaves_the_same_cache") {
        return;
    }
    // A small micro-batch so a short prompt spans several chunks (the last one partial).
    let options = LoadOptions { n_ubatch: 16, ctx_size: 256, ..test_options() };
    let model = LlamaModel::load(model_path(), options).expect("load test model");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let prompt = random_tokens(&mut rng, 70, model.vocab_size());
    let next = TreeBatch::chain(&[prompt[0]], None, 0, false);

    let mut quiet = model.new_lm().unwrap();
    quiet.prefill(&prompt).unwrap();
    let expected = quiet.forward(&next).unwrap().into_owned();

    let reports = Arc::new(Mutex::new(Vec::new()));
    let mut watched = model.new_lm().unwrap();
    let seen = reports.clone();
    watched.set_prefill_progress(Some(Box::new(move |done, total| seen.lock().unwrap().push((done, total)))));
    watched.prefill(&prompt).unwrap();
    assert_eq!(watched.committed_len(), prompt.len());
    let got = watched.forward(&next).unwrap().into_owned();

    assert_eq!(*reports.lock().unwrap(), vec![(16, 70), (32, 70), (48, 70), (64, 70), (70, 70)]);
    assert_eq!(got.row(0), expected.row(0), "a chunked prefill must leave the same cache");
}
