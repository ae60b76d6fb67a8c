//! Writing a result set's files: `results.json`, `summary.md` ([`markdown`]), `speedup.svg` and
//! `acceptance.svg` ([`svg`]), and `plain-tokens.jsonl`. The schema itself is [`crate::record`].

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::record::Results;
use crate::runner::PlainText;

pub mod markdown;
pub mod svg;

pub use markdown::summary_markdown;
pub use svg::{acceptance_svg, speedup_svg};

/// Write results.json, summary.md, speedup.svg and acceptance.svg into `dir` (created if
/// needed). Returns the paths written.
pub fn write_all(dir: &Path, results: &Results) -> Result<Vec<PathBuf>> {
    let files = [
        ("results.json", serde_json::to_string_pretty(results)? + "\n"),
        ("summary.md", summary_markdown(results)),
        ("speedup.svg", speedup_svg(results)?),
        ("acceptance.svg", acceptance_svg(results)?),
    ];
    write_files(dir, &files)
}

/// Write each (name, text) into `dir` (created if needed); the paths written.
pub fn write_files(dir: &Path, files: &[(&str, String)]) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create output directory {}", dir.display()))?;
    let mut out = Vec::new();
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        out.push(path);
    }
    Ok(out)
}

/// Write `DIR/plain-tokens.jsonl`: one [`PlainText`] per line.
pub fn write_plain_texts(dir: &Path, texts: &[PlainText]) -> Result<PathBuf> {
    let mut text = String::new();
    for t in texts {
        text += &serde_json::to_string(t)?;
        text.push('\n');
    }
    let path = dir.join("plain-tokens.jsonl");
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}
