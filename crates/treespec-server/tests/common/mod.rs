//! Shared by the model tests: where SmolLM2-135M lives.

use std::path::PathBuf;

/// `models/SmolLM2-135M-Instruct.Q4_1.gguf`, or None (skip) when it is missing and
/// TREESPEC_SKIP_MODEL_TESTS=1; missing otherwise is a failure.
pub fn model_path() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        return Some(p);
    }
    if std::env::var("TREESPEC_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!("skipping: {} is missing and TREESPEC_SKIP_MODEL_TESTS=1", p.display());
        return None;
    }
    panic!("{} is missing: run scripts/fetch-models.sh (or set TREESPEC_SKIP_MODEL_TESTS=1)", p.display());
}
