//! Running the `treespec` binary in tests, on the real SmolLM2 model.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The test model (`TREESPEC_TEST_MODEL`, else the repository's models/ folder), or None (after a
/// note) when `TREESPEC_SKIP_MODEL_TESTS=1`; a missing file fails with instructions.
pub fn model() -> Option<PathBuf> {
    if std::env::var("TREESPEC_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("note: skipping: TREESPEC_SKIP_MODEL_TESTS=1");
        return None;
    }
    let p = match std::env::var_os("TREESPEC_TEST_MODEL") {
        Some(p) => PathBuf::from(p),
        None => {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        }
    };
    assert!(p.is_file(), "test model {} is missing: run `bash scripts/fetch-models.sh`", p.display());
    Some(p)
}

/// A scratch directory unique to this process and `name`.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("treespec-cli-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What one run of the binary did.
#[derive(Debug)]
pub struct Run {
    /// Exit code; None when killed by a signal (an abort) or by the time limit.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Still running at the time limit (then killed).
    pub timed_out: bool,
}

impl Run {
    /// The process exited by itself, with no Rust panic.
    pub fn exited_cleanly(&self) -> bool {
        !self.timed_out && self.code.is_some() && !self.stderr.contains("panicked")
    }
}

/// The binary under test: this build's, or `TREESPEC_TEST_BIN` (e.g. an older build, to see
/// which cases it fails).
pub fn binary() -> PathBuf {
    std::env::var_os("TREESPEC_TEST_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_treespec")), PathBuf::from)
}

/// A synthetic cost curve for every run (`TREESPEC_COSTS`): no test waits for this machine to
/// profile itself, whose time depends on what else it is doing (tests that check the profiling
/// itself remove it).
pub const TEST_COSTS: &str = "linear:20,2";

/// `treespec ARGS` with no input and its output piped. OpenMP threads wait passively, since tests
/// run in parallel. The cache folder (`TREESPEC_CACHE_DIR`: cost curves, learned prices) is this
/// test process's own, so that no test reads or writes the user's cache.
pub fn command(args: &[&str]) -> Command {
    let mut c = Command::new(binary());
    c.args(args)
        .env("OMP_WAIT_POLICY", "passive")
        .env("TREESPEC_COSTS", TEST_COSTS)
        .env("TREESPEC_CACHE_DIR", scratch("cache"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Run `treespec ARGS`, killed after `limit`. OpenMP threads wait passively, since tests run in
/// parallel.
pub fn treespec(args: &[&str], limit: Duration) -> Run {
    let mut child = command(args).spawn().unwrap();
    let start = Instant::now();
    let mut timed_out = false;
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            timed_out = true;
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let Output { status, stdout, stderr } = child.wait_with_output().unwrap();
    Run {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        timed_out,
    }
}

/// Run `treespec ARGS` (which must print one JSON object, as `generate --json` does), expect a
/// clean success, and parse its output.
pub fn treespec_json(args: &[&str], limit: Duration) -> serde_json::Value {
    let run = treespec(args, limit);
    assert!(run.exited_cleanly() && run.code == Some(0), "{run:#?}");
    serde_json::from_str(run.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {run:#?}"))
}

/// A copy of GGUF `src` at `dst` with the u32 metadata value `key` set to `value`.
pub fn patched_copy(src: &Path, dst: &Path, key: &str, value: u32) {
    let mut bytes = std::fs::read(src).unwrap();
    let mut needle = (key.len() as u64).to_le_bytes().to_vec();
    needle.extend(key.as_bytes());
    let at = bytes.windows(needle.len()).position(|w| w == needle).expect("key in file") + needle.len();
    assert_eq!(bytes[at..at + 4], 4u32.to_le_bytes(), "{key} is not a u32");
    bytes[at + 4..at + 8].copy_from_slice(&value.to_le_bytes());
    std::fs::write(dst, bytes).unwrap();
}
