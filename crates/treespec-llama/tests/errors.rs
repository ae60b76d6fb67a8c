//! Bad files and bad requests give errors, never panics, and leave the context usable.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use treespec_engine::{CausalLm, EngineError, TreeBatch};
use treespec_llama::{LlamaModel, LoadOptions};

/// A scratch directory unique to this test process and test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("treespec-llama-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn load_err(path: &Path) -> String {
    match LlamaModel::load(path, test_options()) {
        Ok(_) => panic!("loading {} should fail", path.display()),
        Err(e) => {
            assert!(matches!(e, EngineError::Backend(_)), "unexpected variant: {e:?}");
            eprintln!("{e}");
            e.to_string()
        }
    }
}

#[test]
fn missing_file() {
    let msg = load_err(Path::new("/nonexistent/dir/model.gguf"));
    assert!(msg.contains("not found") && msg.contains("/nonexistent/dir/model.gguf"), "{msg}");
}

#[test]
fn not_gguf() {
    let dir = scratch("not-gguf");
    let p = dir.join("hello.gguf");
    std::fs::write(&p, b"hello world, I am not a model").unwrap();
    let msg = load_err(&p);
    assert!(msg.contains("not a GGUF file"), "{msg}");

    std::fs::write(&p, b"PK\x03\x04rest of a zip").unwrap();
    let msg = load_err(&p);
    assert!(msg.contains("zip"), "{msg}");

    std::fs::write(&p, b"GG").unwrap();
    let msg = load_err(&p);
    assert!(msg.contains("not a GGUF file"), "{msg}");

    let msg = load_err(&dir);
    assert!(msg.contains("not a regular file"), "{msg}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A minimal GGUF v3 file: no tensors, only string metadata.
fn tiny_gguf(kv: &[(&str, &str)]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend((kv.len() as u64).to_le_bytes());
    for (k, v) in kv {
        b.extend((k.len() as u64).to_le_bytes());
        b.extend(k.as_bytes());
        b.extend(8u32.to_le_bytes()); // GGUF_TYPE_STRING
        b.extend((v.len() as u64).to_le_bytes());
        b.extend(v.as_bytes());
    }
    b
}

#[test]
fn unsupported_architecture() {
    let dir = scratch("arch");
    let p = dir.join("weird.gguf");
    std::fs::write(&p, tiny_gguf(&[("general.architecture", "treespec-no-such-arch")])).unwrap();
    let msg = load_err(&p);
    assert!(msg.contains("unsupported model architecture 'treespec-no-such-arch'"), "{msg}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn corrupt_header() {
    let dir = scratch("corrupt");
    let p = dir.join("corrupt.gguf");
    let mut bytes = tiny_gguf(&[("general.architecture", "llama")]);
    bytes[4] = 99; // version 99
    std::fs::write(&p, &bytes).unwrap();
    let msg = load_err(&p);
    assert!(msg.contains("corrupt or truncated"), "{msg}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Found by the GGUF fuzzer: gguf's parser accepts a tensor whose dimensions multiply past
/// `i64::MAX` when one of them is 0, and ggml then aborts the process while loading it.
#[test]
fn a_tensor_too_large_to_count_is_refused_by_name() {
    use common::gguf::{Gguf, TensorInfo, V};
    let dir = scratch("huge-tensor");
    let p = dir.join("huge.gguf");
    let mut file = Gguf::with_kv(&[("general.architecture", V::Str("llama".into()))]);
    let dims = vec![1024, 0, u32::MAX as u64, u32::MAX as u64];
    file.tensors.push(TensorInfo { name: "token_embd.weight".into(), dims, ggml_type: 6, offset: 0 });
    std::fs::write(&p, file.bytes()).unwrap();
    let msg = load_err(&p);
    assert!(
        msg.contains("tensor 'token_embd.weight'") && msg.contains("more elements than ggml can count"),
        "{msg}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn truncated_model() {
    if skip_model_tests("truncated_model") {
        return;
    }
    let real = std::fs::read(model_path()).unwrap();
    let dir = scratch("truncated");
    let p = dir.join("truncated.gguf");

    // Cut inside the tensor data: the header parses, the tensors do not fit.
    std::fs::write(&p, &real[..real.len() / 2]).unwrap();
    let msg = load_err(&p);
    assert!(msg.contains("truncated GGUF") && msg.contains("bytes missing"), "{msg}");

    // Cut inside the metadata.
    std::fs::write(&p, &real[..5000]).unwrap();
    let msg = load_err(&p);
    assert!(msg.contains("corrupt or truncated"), "{msg}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_options() {
    for opts in [
        LoadOptions { threads: 0, ..test_options() },
        LoadOptions { ctx_size: 0, ..test_options() },
        LoadOptions { n_seq_max: 0, ..test_options() },
        LoadOptions { n_seq_max: 1000, ..test_options() },
    ] {
        let e = LlamaModel::load(model_path(), opts).unwrap_err();
        assert!(matches!(e, EngineError::InvalidRequest(_)), "{e:?}");
    }
}

/// GPU offload asked of a build or machine without a GPU is an error naming the problem (what
/// the devices are, how to build with one), never a silent CPU run; `--exact` is CPU-only; a
/// device that does not exist is named. (On a GPU build with a GPU the first case loads.)
#[test]
fn gpu_offload_without_a_gpu_or_with_exact_is_refused_by_name() {
    use treespec_llama::{GpuLayers, Offload};
    let offload = |layers, device: Option<&str>| Offload { layers, device: device.map(String::from) };
    let exact = LoadOptions { exact: true, offload: offload(GpuLayers::All, None), ..test_options() };
    let msg = LlamaModel::load(model_path(), exact).unwrap_err().to_string();
    assert!(msg.contains("--exact is CPU-only"), "{msg}");
    let nothing = LoadOptions { offload: offload(GpuLayers::None, Some("Vulkan0")), ..test_options() };
    let msg = LlamaModel::load(model_path(), nothing).unwrap_err().to_string();
    assert!(msg.contains("offloads nothing"), "{msg}");
    if skip_model_tests("gpu_offload_without_a_gpu_or_with_exact_is_refused_by_name") {
        return;
    }
    let gpus = treespec_llama::devices::devices().unwrap().into_iter().filter(|d| d.takes_layers()).count();
    let all = LoadOptions { offload: offload(GpuLayers::Count(4), None), ..test_options() };
    match LlamaModel::load(model_path(), all) {
        Err(e) => {
            let msg = e.to_string();
            assert_eq!(gpus, 0, "a GPU is there, yet: {msg}");
            assert!(
                msg.contains("no GPU backend") && msg.contains("CPU") && msg.contains("docs/GPU.md"),
                "{msg}"
            );
        }
        Ok(model) => {
            assert!(gpus > 0, "offloaded without a GPU");
            assert!(model.runs_on().contains("4 of"), "{}", model.runs_on());
        }
    }
    if gpus > 0 {
        let named = LoadOptions { offload: offload(GpuLayers::All, Some("NoSuchGpu7")), ..test_options() };
        let msg = LlamaModel::load(model_path(), named).unwrap_err().to_string();
        assert!(msg.contains("no GPU device named \"NoSuchGpu7\""), "{msg}");
    }
}

/// A context smaller than its sequence-id count (llama.cpp reserves an output row per id and
/// aborted on `-c 64`) works, and keeps to the size asked for.
#[test]
fn contexts_smaller_than_their_sequence_count_work() {
    if skip_model_tests("contexts_smaller_than_their_sequence_count_work") {
        return;
    }
    let model = LlamaModel::load(model_path(), LoadOptions { ctx_size: 48, ..test_options() }).unwrap();
    let mut lm = model.new_lm().unwrap();
    assert_eq!(lm.context_size(), 48);
    lm.prefill(&[100, 200, 300]).unwrap();
    let logits = lm.forward(&TreeBatch::chain(&[400, 500], None, 0, false)).unwrap();
    assert_eq!(logits.rows(), 2);
    let e = lm.prefill(&[7; 60]).unwrap_err();
    assert!(matches!(e, EngineError::PromptTooLong { .. } | EngineError::State(_)), "{e:?}");
    let batch = model.new_batch_lm(40, 2).unwrap();
    assert_eq!(treespec_engine::BatchedLm::context_size(&batch), 40);
}

#[test]
fn requests_beyond_limits_are_errors() {
    if skip_model_tests("requests_beyond_limits_are_errors") {
        return;
    }
    let model = LlamaModel::load(model_path(), LoadOptions { ctx_size: 256, n_seq_max: 4, ..test_options() })
        .unwrap();
    let mut lm = model.new_lm().unwrap();
    let n_ctx = lm.context_size();
    assert_eq!(n_ctx, 256);

    // Prompt longer than the context.
    let long: Vec<u32> = (0..n_ctx as u32 + 10).map(|i| 100 + i).collect();
    let e = lm.prefill(&long).unwrap_err();
    assert!(matches!(e, EngineError::PromptTooLong { .. }), "{e:?}");
    assert_eq!(lm.committed_len(), 0);

    lm.prefill(&long[..n_ctx - 10]).unwrap();
    // A chain that does not fit what is left.
    let e = lm.forward(&TreeBatch::chain(&long[..11], None, 0, false)).unwrap_err();
    assert!(e.to_string().contains("exceeds the context"), "{e}");
    assert_eq!(lm.pending_len(), 0);

    // More root-to-leaf paths than n_seq_max.
    let wide = TreeBatch { tokens: vec![5000; 5], parents: vec![None; 5], logits: vec![true; 5] };
    let e = lm.forward(&wide).unwrap_err();
    assert!(e.to_string().contains("more than 4"), "{e}");
    // Bad parent, bad token, malformed batch.
    let e = lm
        .forward(&TreeBatch { tokens: vec![5, 6], parents: vec![None, Some(1)], logits: vec![true; 2] })
        .unwrap_err();
    assert!(matches!(e, EngineError::State(_)), "{e:?}");
    let e = lm.forward(&TreeBatch::chain(&[u32::MAX], None, 0, false)).unwrap_err();
    assert!(matches!(e, EngineError::State(_)), "{e:?}");
    let e = lm.forward(&TreeBatch { tokens: vec![5], parents: vec![], logits: vec![] }).unwrap_err();
    assert!(matches!(e, EngineError::State(_)), "{e:?}");
    assert_eq!(lm.pending_len(), 0);

    // Still usable: 4 paths fit, and filling the context exactly works.
    let four =
        TreeBatch { tokens: vec![5000, 5001, 5002, 5003], parents: vec![None; 4], logits: vec![true; 4] };
    assert_eq!(lm.forward(&four).unwrap().rows(), 4);
    // Bad commit paths.
    assert!(lm.commit(&[7]).is_err());
    assert!(lm.commit(&[0, 1]).is_err());
    assert_eq!(lm.pending_len(), 4);
    // Prefill with pending nodes is refused.
    assert!(matches!(lm.prefill(&[5]).unwrap_err(), EngineError::State(_)));
    lm.commit(&[]).unwrap();
    let rest = n_ctx - lm.committed_len();
    let out = lm.forward(&TreeBatch::chain(&long[..rest], None, 0, true)).unwrap();
    assert_eq!(out.rows(), 1);
    lm.commit(&(0..rest).collect::<Vec<_>>()).unwrap();
    assert_eq!(lm.committed_len(), n_ctx);
    assert!(lm.forward(&TreeBatch::chain(&[5], None, 0, false)).is_err());
}
