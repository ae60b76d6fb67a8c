//! The suffix drafter's learned prices outlive the process: `treespec generate --method suffix`
//! writes them to the learned-prices cache (or beside `--suffix-history`) and the next run starts
//! from them; `--no-learned-prices` and `TREESPEC_NO_LEARNED_PRICES=1` read and write none.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

const LIMIT: Duration = Duration::from_secs(120);

/// A prompt that repeats itself, so that the suffix drafter has matches to price from the start.
const PROMPT: &str = "Repeat after me exactly: the quick brown fox jumps over the lazy dog. The quick brown \
                      fox jumps over the lazy dog. The quick brown fox";

/// `treespec ARGS` with the cache folder `cache` and `extra` environment, killed after [`LIMIT`].
fn run_in(cache: &Path, args: &[&str], extra: &[(&str, &str)]) -> Run {
    let mut c = command(args);
    c.env("TREESPEC_CACHE_DIR", cache).env_remove("TREESPEC_NO_LEARNED_PRICES");
    for (k, v) in extra {
        c.env(k, v);
    }
    let mut child = c.spawn().unwrap();
    let start = Instant::now();
    let mut timed_out = false;
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > LIMIT {
            timed_out = true;
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        timed_out,
    }
}

/// `generate --json` on the test model with `more` arguments: its `learned_prices` object.
fn prices_of(cache: &Path, model: &Path, more: &[&str], extra: &[(&str, &str)]) -> serde_json::Value {
    let m = model.to_str().unwrap();
    let mut args = vec!["generate", "-m", m, "-p", PROMPT, "-n", "48", "--ctx", "512", "-t", "1", "--json"];
    args.extend(more);
    let run = run_in(cache, &args, extra);
    assert!(run.exited_cleanly() && run.code == Some(0), "{run:#?}");
    let v: serde_json::Value =
        serde_json::from_str(run.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {run:#?}"));
    v["learned_prices"].clone()
}

fn only_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

#[test]
fn generate_keeps_what_the_suffix_prices_learned_for_the_next_run() {
    let Some(model) = model() else { return };
    let dir = scratch("learned-prices");
    let _ = std::fs::remove_dir_all(&dir);
    let cache = dir.join("cache");
    std::fs::create_dir_all(&cache).unwrap();

    // A cold run starts from the prior and leaves its prices in the cache, one file per tokenizer.
    let first = prices_of(&cache, &model, &["--method", "suffix"], &[]);
    assert!(first["loaded_from"].is_null(), "{first}");
    let learned = first["trials"].as_u64().unwrap();
    assert!(learned > 0, "a repeating prompt gives the prices something to learn: {first}");
    let file = only_file(&cache.join("prices"));
    assert_eq!(first["saved_to"], serde_json::json!([file.to_str().unwrap()]));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("\"format\": \"treespec suffix prices\""), "{text}");
    assert!(text.contains(&format!("\"total\": {learned}")), "{text}");

    // The next run starts from them, and says so.
    let m = model.to_str().unwrap();
    let args =
        ["generate", "-m", m, "-p", PROMPT, "-n", "48", "--ctx", "512", "-t", "1", "--method", "suffix"];
    let second = run_in(&cache, &args, &[]);
    assert!(second.exited_cleanly() && second.code == Some(0), "{second:#?}");
    let line = format!("learned prices: loaded {learned} trials from {}", file.display());
    assert!(second.stderr.contains(&line), "wanted {line:?}: {second:#?}");
    let now: u64 = {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        v["pricing"]["total"].as_u64().unwrap()
    };
    assert!(now > learned, "the second run added its trials: {now} after {learned}");
    let third = prices_of(&cache, &model, &["--method", "suffix"], &[]);
    assert_eq!(third["loaded_from"], file.to_str().unwrap(), "{third}");
    assert_eq!(third["loaded_trials"].as_u64(), Some(now), "{third}");

    // Opting out reads and writes nothing.
    let before = std::fs::read(&file).unwrap();
    let off = prices_of(&cache, &model, &["--method", "suffix", "--no-learned-prices"], &[]);
    assert!(off.is_null(), "{off}");
    let off = prices_of(&cache, &model, &["--method", "suffix"], &[("TREESPEC_NO_LEARNED_PRICES", "1")]);
    assert!(off.is_null(), "{off}");
    assert_eq!(std::fs::read(&file).unwrap(), before, "the cache is untouched");

    // With --suffix-history the prices are saved beside the history, and read from there next.
    let history = dir.join("h.bin");
    let h = history.to_str().unwrap();
    let with = prices_of(&cache, &model, &["--method", "suffix", "--suffix-history", h], &[]);
    let beside = dir.join("h.bin.prices.json");
    assert_eq!(with["loaded_from"], file.to_str().unwrap(), "no prices beside it yet: the cache's");
    assert_eq!(with["saved_to"][0], beside.to_str().unwrap(), "{with}");
    assert!(history.is_file() && beside.is_file());
    let again = prices_of(&cache, &model, &["--method", "suffix", "--suffix-history", h], &[]);
    assert_eq!(again["loaded_from"], beside.to_str().unwrap(), "{again}");
    assert_eq!(again["loaded_trials"], with["trials"], "{again}");

    // A method without suffix drafts has no prices.
    assert!(prices_of(&cache, &model, &["--method", "plain"], &[]).is_null());
    std::fs::remove_dir_all(&dir).unwrap();
}
