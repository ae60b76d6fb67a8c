//! The `treespec` binary against hostile inputs (issue #15), on the real SmolLM2 model: every
//! case ends with a clear message and an exit code, never an abort, a hang or a silent success.

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;
use treespec_engine::{generate, GenerateRequest, Method, StopConditions};
use treespec_llama::{LlamaModel, LoadOptions};

const LIMIT: Duration = Duration::from_secs(120);

fn ok(run: &Run) {
    assert!(run.exited_cleanly() && run.code == Some(0), "{run:#?}");
}

fn refused(run: &Run, needle: &str) {
    assert!(run.exited_cleanly(), "{run:#?}");
    assert_ne!(run.code, Some(0), "should fail: {run:#?}");
    assert!(run.stderr.contains(needle), "stderr lacks {needle:?}: {run:#?}");
}

/// Rows 1 and 4: from-target refuses to drop every layer (it wrote a 0-layer file with exit 0)
/// and layers the model does not have (it wrote a full model with exit 0), naming the range.
#[test]
fn from_target_refuses_bad_layer_lists() {
    let Some(m) = model() else { return };
    let dir = scratch("layers");
    let out = dir.join("out.gguf");
    let (m, o) = (m.to_str().unwrap(), out.to_str().unwrap());
    let run = treespec(&["draft", "from-target", "-m", m, "--drop-layers", "0-29", o, "-t", "1"], LIMIT);
    refused(&run, "all 30 layers");
    assert!(run.stderr.contains("0-29"), "{run:#?}");
    let run = treespec(&["draft", "from-target", "-m", m, "--drop-layers", "100-200", o, "-t", "1"], LIMIT);
    refused(&run, "layer 100 does not exist");
    assert!(run.stderr.contains("0-29"), "{run:#?}");
    assert!(!out.exists());
    std::fs::remove_dir_all(dir).unwrap();
}

/// Row 1: a 0-layer file (what from-target used to write) makes `inspect` and `generate` fail
/// with a message; llama.cpp used to abort them (SIGABRT).
#[test]
fn zero_layer_files_are_refused_not_aborted() {
    let Some(m) = model() else { return };
    let dir = scratch("zero");
    let zero = dir.join("zero.gguf");
    patched_copy(&m, &zero, "llama.block_count", 0);
    let z = zero.to_str().unwrap();
    refused(&treespec(&["inspect", z], LIMIT), "block_count is 0");
    refused(&treespec(&["generate", "-m", z, "-p", "hi", "-n", "1", "-t", "1"], LIMIT), "block_count is 0");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Row 2: a context whose KV cache cannot fit is refused up front (it grew until killed), and
/// one above the training context warns.
#[test]
fn huge_contexts_are_refused_and_long_ones_warned() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let run =
        treespec(&["generate", "-m", m, "-p", "hi", "-n", "1", "-t", "1", "--ctx", "1000000000"], LIMIT);
    refused(&run, "KV cache");
    assert!(run.stderr.contains("MemAvailable") && run.stderr.contains("--ctx"), "{run:#?}");
    let run = treespec(&["generate", "-m", m, "-p", "hi", "-n", "1", "-t", "1", "--ctx", "9000"], LIMIT);
    ok(&run);
    assert!(run.stderr.contains("warning") && run.stderr.contains("trained with"), "{run:#?}");
}

/// Row 3: the draft commands never overwrite an existing file unless --force.
#[test]
fn draft_outputs_are_not_overwritten_without_force() {
    let Some(m) = model() else { return };
    let dir = scratch("force");
    let existing = dir.join("existing.txt");
    std::fs::write(&existing, "keep me").unwrap();
    let (m, e) = (m.to_str().unwrap(), existing.to_str().unwrap());
    refused(&treespec(&["draft", "quantize", m, e, "-t", "1"], LIMIT), "already exists");
    refused(
        &treespec(&["draft", "from-target", "-m", m, e, "--drop-layers", "29", "-t", "1"], LIMIT),
        "--force",
    );
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep me");
    ok(&treespec(
        &["draft", "from-target", "-m", m, e, "--drop-layers", "29", "--type", "copy", "--force", "-t", "1"],
        LIMIT,
    ));
    assert!(std::fs::read(&existing).unwrap().starts_with(b"GGUF"));
    std::fs::remove_dir_all(dir).unwrap();
}

/// Row 6: `serve` with a default method that cannot build stops at start with the reason (it
/// used to listen and answer 400 to every request without a treespec object).
#[test]
fn serve_refuses_a_bad_default_method_at_start() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let run = treespec(
        &["serve", "-m", m, "--draft", m, "--method", "dyspec", "--budget", "0", "--port", "0", "-t", "1"],
        LIMIT,
    );
    refused(&run, "default method 'dyspec' is invalid");
    assert!(run.stderr.contains("budget"), "{run:#?}");
}

/// `serve`'s batch sizes are checked before the models load: 0 is refused by name.
#[test]
fn serve_refuses_empty_steps() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    for flag in ["--parallel", "--prefill-chunk", "--decode-chunk", "--queue"] {
        let run = treespec(&["serve", "-m", m, flag, "0", "--port", "0", "-t", "1"], LIMIT);
        refused(&run, "--queue must be at least 1");
    }
}

/// HTTPS's files are read before the model loads: one without the other, a missing file and a
/// key given as the certificate are refused naming the flags and the file.
#[test]
fn serve_refuses_bad_tls_files_before_loading() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key.pem");
    std::fs::write(&key, rcgen::KeyPair::generate().unwrap().serialize_pem()).unwrap();
    let key = key.to_str().unwrap();
    // The model is not there: a refusal that names TLS came before any load.
    let serve = |tls: &[&str]| {
        let mut args = vec!["serve", "-m", "/nonexistent/tls-test.gguf", "--port", "0"];
        args.extend_from_slice(tls);
        treespec(&args, LIMIT)
    };
    refused(&serve(&["--ssl-key-file", key]), "--ssl-key-file needs --ssl-cert-file");
    refused(&serve(&["--ssl-cert-file", key]), "--ssl-cert-file needs --ssl-key-file");
    let missing = serve(&["--ssl-cert-file", "/nonexistent/cert.pem", "--ssl-key-file", key]);
    refused(&missing, "--ssl-cert-file / --ssl-key-file");
    assert!(missing.stderr.contains("/nonexistent/cert.pem"), "{missing:#?}");
    refused(&serve(&["--ssl-cert-file", key, "--ssl-key-file", key]), "no PEM certificate");
}

/// Row 11: one rule for -t everywhere: 0 refused (draft quantize accepted it), more than the cores
/// capped with a warning.
#[test]
fn thread_counts_follow_one_rule() {
    let Some(m) = model() else { return };
    let dir = scratch("threads");
    let out = dir.join("q.gguf");
    let (m, o) = (m.to_str().unwrap(), out.to_str().unwrap());
    for args in [
        vec!["draft", "quantize", m, o, "-t", "0"],
        vec!["draft", "from-target", "-m", m, o, "--drop-layers", "1", "-t", "0"],
        vec!["generate", "-m", m, "-p", "hi", "-t", "0"],
        vec!["bench", "--quick", "-t", "0"],
    ] {
        refused(&treespec(&args, LIMIT), "at least 1");
    }
    assert!(!out.exists());
    let run = treespec(&["generate", "-m", m, "-p", "hi", "-n", "1", "-t", "100000"], LIMIT);
    ok(&run);
    let cores = treespec_llama::available_cores();
    assert!(run.stderr.contains(&format!("-t 100000 is more than the {cores} CPU cores")), "{run:#?}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Row 10: when -n ends the output inside a multi-byte character, the incomplete bytes are held
/// back and dropped (the text used to end in U+FFFD), streamed and in --json.
#[test]
fn output_cut_inside_a_character_ends_cleanly() {
    let Some(path) = model() else { return };
    let prompt = "Write three emojis about the sea.";
    // Find where the greedy answer splits a character across tokens, with the library.
    let model =
        LlamaModel::load(&path, LoadOptions { threads: 1, ctx_size: 512, ..LoadOptions::default() }).unwrap();
    let template = model.compiled_chat_template().unwrap();
    let tokens =
        model.chat_prompt(&template, &[treespec_text::ChatMessage::new("user", prompt)], None).unwrap();
    let request = GenerateRequest {
        prompt: tokens,
        max_new_tokens: 64,
        sampling: Default::default(),
        seed: 0,
        stop: StopConditions {
            eos: model.eos().into_iter().chain(model.eot()).collect(),
            stop_strings: vec![],
        },
    };
    let mut lm = model.new_lm().unwrap();
    let mut plain = Method::Plain.build::<treespec_llama::LlamaLm>(None).unwrap();
    let out = generate(&mut lm, plain.as_mut(), &request, None, &mut |_| true).unwrap();
    let mut bytes = Vec::new();
    let cut = out
        .tokens
        .iter()
        .position(|&t| {
            bytes.extend(model.token_to_bytes(t, false).unwrap());
            std::str::from_utf8(&bytes).is_err_and(|e| e.error_len().is_none())
        })
        .expect("the greedy answer should split an emoji across tokens")
        + 1;
    let expected = String::from_utf8_lossy(&bytes[..std::str::from_utf8(&bytes).unwrap_err().valid_up_to()])
        .into_owned();

    let p = path.to_str().unwrap();
    let n = cut.to_string();
    let base = ["generate", "-m", p, "--chat", "-p", prompt, "-n", &n, "-t", "1", "--ctx", "512"];
    let run = treespec(&[&base[..], &["--json"]].concat(), LIMIT);
    ok(&run);
    let v: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(v["token_ids"].as_array().unwrap().len(), cut, "{v}");
    assert_eq!(v["text"].as_str().unwrap(), expected);
    let run = treespec(&base, LIMIT);
    ok(&run);
    assert!(!run.stdout.contains('\u{FFFD}'), "{:?}", run.stdout);
    assert_eq!(run.stdout, format!("{expected}\n"));
}

/// `profile --sizes` times exactly the sizes asked (sorted, once each), and refuses a zero size
/// or one past the context before loading anything, naming the flag.
#[test]
fn profile_times_the_sizes_asked_and_refuses_bad_ones() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let run =
        treespec(&["profile", "-m", m, "-t", "1", "--sizes", "3,1,3", "--repeat", "1", "--json"], LIMIT);
    ok(&run);
    let v: Value = serde_json::from_str(run.stdout.trim()).unwrap();
    let sizes: Vec<u64> = v["points"].as_array().unwrap().iter().map(|p| p["n"].as_u64().unwrap()).collect();
    assert_eq!(sizes, vec![1, 3]);
    refused(&treespec(&["profile", "-m", m, "--sizes", "0,4"], LIMIT), "--sizes");
    refused(&treespec(&["profile", "-m", m, "--sizes", "5000", "-c", "4096"], LIMIT), "largest size (5000)");
}

/// Issue #66 row 4: `-ngld` that no GPU can take fails as `-ngl` does (it was accepted silently
/// when no draft was loaded), for `generate` and `serve`. On a build with a GPU there is nothing
/// to refuse: skipped.
#[test]
fn draft_layers_on_a_cpu_build_fail_as_target_layers_do() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let target = treespec(&["generate", "-m", m, "-p", "hi", "-n", "1", "-t", "1", "-ngl", "5"], LIMIT);
    if target.code == Some(0) {
        eprintln!("skipping: this build offloads layers");
        return;
    }
    refused(&target, "asks for a GPU");
    for layers in ["5", "all"] {
        let run = treespec(&["generate", "-m", m, "-p", "hi", "-n", "1", "-t", "1", "-ngld", layers], LIMIT);
        refused(&run, "--n-gpu-layers-draft (-ngld) asks for a GPU");
        let run = treespec(&["serve", "-m", m, "--port", "0", "-t", "1", "-ngld", layers], LIMIT);
        refused(&run, "--n-gpu-layers-draft (-ngld) asks for a GPU");
    }
}

/// Issue #66 row 10: `-n -1` (llama.cpp's "until the end") runs to the end of generation or of
/// the context instead of failing to parse; 0 and other negatives are refused by name.
#[test]
fn n_minus_one_runs_to_the_end() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let run = treespec(
        &["generate", "-m", m, "-p", "Count: 1, 2, 3,", "-n", "-1", "-c", "48", "-t", "1", "--json"],
        LIMIT,
    );
    ok(&run);
    let out: Value = serde_json::from_str(run.stdout.trim()).unwrap();
    let tokens = out["token_ids"].as_array().unwrap().len();
    assert!(tokens > 1 && tokens < 48, "{tokens} tokens in a 48-token context: {run:#?}");
    for n in ["0", "-3"] {
        refused(
            &treespec(&["generate", "-m", m, "-p", "hi", "-n", n, "-t", "1"], LIMIT),
            "-n must be at least 1",
        );
    }
}

/// Issue #65: tree verification stays exact with llama-server's GPU-user settings, flash attention
/// on and a q8_0 KV cache given by flag: `chain` and `suffix` emit plain decoding's tokens under
/// `--exact`; with flash attention off the quantized V cache is refused by name.
#[test]
fn trees_stay_exact_with_flash_attention_and_a_quantized_cache() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let prompt = "Write the numbers from one to twenty in words, separated by commas.";
    let run = |method: &str| {
        let args =
            ["generate", "-m", m, "--draft", m, "--method", method, "-p", prompt, "-n", "48", "-t", "1"];
        let flags = ["--exact", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "--json", "--chat"];
        let out = treespec(&[&args[..], &flags[..]].concat(), LIMIT);
        ok(&out);
        serde_json::from_str::<Value>(out.stdout.trim()).unwrap()["token_ids"].clone()
    };
    let plain = run("plain");
    for method in ["chain", "suffix"] {
        assert_eq!(run(method), plain, "{method}");
    }
    let off =
        treespec(&["generate", "-m", m, "-p", "hi", "-n", "1", "-t", "1", "--exact", "-fa", "off"], LIMIT);
    refused(&off, "needs flash attention");
}
