//! Every file or folder the docs name exists: a newcomer who follows a path in the README, in
//! `docs/` or in the scripts' index finds it. Paths are read as written from the repository root
//! (`scripts/run.sh`, `bench/inputs/sessions/…`), relative to the document for `../` links, or relative
//! to `crates/treespec-*` for the short crate paths the architecture notes use
//! (`server/src/request/validate.rs`). Patterns (`*`, `<target>`, `{…}`, `$VAR`, `…`) are skipped.

use std::path::{Path, PathBuf};

/// First path components a doc path can start with.
const ROOTS: &[&str] = &["crates", "scripts", "docs", "bench", ".ci"];
/// Crate short names (`server/src/…` is `crates/treespec-server/src/…`).
const CRATES: &[&str] = &["server", "engine", "core", "llama", "cli", "grammar", "bench", "request"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The documents a newcomer opens.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs = vec![root.join("README.md"), root.join("scripts/README.md")];
    let mut in_docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    in_docs.sort();
    docs.extend(in_docs);
    docs
}

/// Candidate paths in `text`: maximal runs of path characters whose first component is one of
/// [`ROOTS`] or [`CRATES`] (optionally behind `../`), with trailing punctuation dropped; runs
/// followed by a pattern character are skipped.
fn named_paths(text: &str) -> Vec<String> {
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-');
    let chars: Vec<char> = text.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if !is_path_char(chars[i]) || (i > 0 && is_path_char(chars[i - 1])) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && is_path_char(chars[i]) {
            i += 1;
        }
        if chars.get(i).is_some_and(|&c| matches!(c, '*' | '<' | '{' | '$' | '…')) {
            continue;
        }
        let word: String = chars[start..i].iter().collect();
        let word = word.trim_end_matches(['.', '-', '/']);
        let bare = word.trim_start_matches("../");
        let Some((first, rest)) = bare.split_once('/') else { continue };
        if rest.is_empty() || !(ROOTS.contains(&first) || CRATES.contains(&first)) {
            continue;
        }
        found.push(word.to_string());
    }
    found
}

/// Whether `named` (as written in `doc`) exists under `root`.
fn exists(root: &Path, doc: &Path, named: &str) -> bool {
    if named.starts_with("../") {
        return doc.parent().is_some_and(|d| d.join(named).exists());
    }
    let first = named.split('/').next().unwrap_or_default();
    root.join(named).exists()
        || (CRATES.contains(&first) && root.join("crates").join(format!("treespec-{named}")).exists())
}

#[test]
fn every_path_a_doc_names_exists() {
    let root = repo();
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in documents(&root) {
        let text = std::fs::read_to_string(&doc).expect("a document");
        for named in named_paths(&text) {
            checked += 1;
            if !exists(&root, &doc, &named) {
                missing.push(format!("{}: {named}", doc.strip_prefix(&root).unwrap_or(&doc).display()));
            }
        }
    }
    assert!(checked > 100, "only {checked} paths found: the scan is broken");
    assert!(missing.is_empty(), "the docs name files that do not exist:\n{}", missing.join("\n"));
}

#[test]
fn the_scan_finds_paths_and_skips_patterns() {
    let text = "Run `scripts/run.sh`, see [x](../bench/results/serve/README.md) \
                and server/src/request/validate.rs. \
                Not these: bench/*.md, ~/.cache/treespec/costs/<target>.json, docs, a/b, \
                bench/results/sessions-qwen/c1.";
    assert_eq!(
        named_paths(text),
        vec![
            "scripts/run.sh",
            "../bench/results/serve/README.md",
            "server/src/request/validate.rs",
            "bench/results/sessions-qwen/c1"
        ]
    );
    let root = repo();
    let readme = root.join("docs/GPU.md");
    assert!(exists(&root, &readme, "server/src/request/validate.rs"), "a crate's short path");
    assert!(exists(&root, &readme, "../bench/results/gpu-vulkan-lavapipe/README.md"), "a link from docs/");
    assert!(!exists(&root, &readme, "scripts/no-such-script.sh"));
}
