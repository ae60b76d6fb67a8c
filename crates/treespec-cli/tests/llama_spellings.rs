//! llama.cpp's spellings on the real binary and model (issue #12): `-md`, `-c`, `-n`, `-t`,
//! `--spec-draft-n-max` mean what they mean in llama.cpp, and sequoia runs without a
//! calibration file.

mod common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn md_names_the_draft_and_c_n_t_mean_context_tokens_threads() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let base = ["generate", "-m", m, "-p", "Count: one, two, three,", "--json", "--temp", "0"];
    // -md: the draft runs (draft forwards happen); --spec-draft-n-max: at most 2 per step.
    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain(["-md", m, "--method", "chain", "--spec-draft-n-max", "2", "-n", "16", "-t", "1"])
        .collect();
    let out = treespec_json(&args, LIMIT);
    let s = &out["stats"];
    assert_eq!(out["method"], "chain");
    assert!(s["draft_forwards"].as_u64().unwrap() > 0, "{out}");
    assert!(s["new_tokens"].as_u64().unwrap() <= 16, "{out}");
    assert!(s["drafted"].as_u64().unwrap() <= 2 * s["target_forwards"].as_u64().unwrap(), "{out}");
    // -n 16 generates 16 tokens unless the model ends first; -c sizes the context.
    let args: Vec<&str> = base.iter().copied().chain(["-c", "2048", "-n", "16", "-t", "1"]).collect();
    let out = treespec_json(&args, LIMIT);
    assert_eq!(
        out["token_ids"].as_array().unwrap().len(),
        out["stats"]["new_tokens"].as_u64().unwrap() as usize
    );
    let long = "word ".repeat(200);
    let run = treespec(&["generate", "-m", m, "-p", &long, "-c", "64", "-n", "4", "-t", "1"], LIMIT);
    assert!(run.exited_cleanly() && run.code != Some(0), "{run:#?}");
    assert!(run.stderr.contains("context holds 64"), "{run:#?}");
}

#[test]
fn sequoia_runs_out_of_the_box() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let out = treespec_json(
        &[
            "generate", "-m", m, "-md", m, "--method", "sequoia", "-p", "Hello", "-n", "8", "-t", "1",
            "--json",
        ],
        LIMIT,
    );
    assert_eq!(out["method"], "sequoia");
    assert!(out["stats"]["draft_forwards"].as_u64().unwrap() > 0, "{out}");
}
