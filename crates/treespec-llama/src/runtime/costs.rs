//! The measured cost curves behind `--budget auto` and `--method auto`, cached on disk per model
//! file, thread count and kernel mode, so only the first run on a machine pays for the profile,
//! and in memory per runtime, so a process profiles (or reads) each curve once however many
//! methods ask for it.
//!
//! Disk cache: `$TREESPEC_CACHE_DIR`, else `$XDG_CACHE_HOME/treespec`, else `~/.cache/treespec`;
//! one JSON file per (file name, size, modification time, threads, fast|exact). Delete it, or pass
//! `--reprofile`, after changing the machine's load or the build.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Instant, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use treespec_core::cost::CostCurve;
use treespec_engine::auto_budget::CostModel;
use treespec_engine::profile::{measure_curve, PROFILE_SIZES};

use super::models::{ModelPair, ModelPaths};
use crate::load::LlamaModel;

/// Timed repetitions per batch size of a start-up profile (the median is kept).
const REPEAT: usize = 3;
/// Bump when the profile's meaning changes, so stale caches are not read (4: every size of the
/// 4-row steps, see [`PROFILE_SIZES`]).
const FORMAT: u32 = 4;

#[derive(Debug, Serialize, Deserialize)]
struct CachedCurve {
    format: u32,
    model: String,
    threads: usize,
    exact: bool,
    curve: CostCurve,
}

/// The default cache folder (see the module documentation); None when no variable names one.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("TREESPEC_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("treespec"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("treespec"))
}

/// A curve held in memory, and whether this process measured it (a `--reprofile` request is
/// satisfied by a curve measured here, not by one read from the disk cache).
#[derive(Debug, Clone)]
struct Held {
    curve: CostCurve,
    measured: bool,
}

/// The runtime's curves: computed on first need. A mutex rather than a `OnceLock`, because
/// profiling takes seconds and two threads asking at once must wait for one profile, not run two
/// (which would also time each other's contention), and because `reprofile` may replace a curve.
#[derive(Debug)]
pub(crate) struct CostCache {
    dir: Option<PathBuf>,
    held: Mutex<[Option<Held>; 2]>,
}

impl CostCache {
    /// A cache keeping its files under `dir` (None: memory only).
    pub(crate) fn new(dir: Option<PathBuf>) -> Self {
        Self { dir, held: Mutex::new([None, None]) }
    }

    /// The cost model for `pair`: the target's curve, and the draft's when `with_draft` and there
    /// is a draft (a draft sharing the target's weights shares its curve). `reprofile` measures
    /// anew instead of reading the disk cache, once per runtime.
    pub(crate) fn cost_model(
        &self,
        pair: &ModelPair,
        paths: &ModelPaths,
        with_draft: bool,
        reprofile: bool,
    ) -> Result<CostModel> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let [target_slot, draft_slot] = &mut *held;
        let target = self.curve(target_slot, &paths.model, &pair.target, reprofile)?;
        let draft = match (with_draft, pair.draft(), &paths.draft) {
            (true, Some(_), Some(_)) if pair.draft_is_target() => Some(target.clone()),
            (true, Some(d), Some(path)) => Some(self.curve(draft_slot, path, d, reprofile)?),
            _ => None,
        };
        Ok(CostModel::new(target, draft))
    }

    /// Whether [`CostCache::cost_model`] would answer without measuring: every curve it needs is
    /// held or readable from the disk cache.
    pub(crate) fn has_curves(&self, pair: &ModelPair, paths: &ModelPaths, with_draft: bool) -> bool {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let known = |slot: &Option<Held>, path: &Path, model: &LlamaModel| {
            slot.is_some() || self.file(path, model).as_deref().and_then(read_cached).is_some()
        };
        let target = known(&held[0], &paths.model, &pair.target);
        let draft = match (with_draft, pair.draft(), &paths.draft) {
            (true, Some(d), Some(path)) if !pair.draft_is_target() => known(&held[1], path, d),
            _ => true,
        };
        target && draft
    }

    /// One model's curve: held, else from the disk cache, else measured now (and cached).
    fn curve(
        &self,
        slot: &mut Option<Held>,
        path: &Path,
        model: &LlamaModel,
        reprofile: bool,
    ) -> Result<CostCurve> {
        if let Some(h) = slot.as_ref().filter(|h| h.measured || !reprofile) {
            return Ok(h.curve.clone());
        }
        let file = self.file(path, model);
        let read = file.as_deref().filter(|_| !reprofile).and_then(read_cached);
        let held = match read {
            Some(curve) => Held { curve, measured: false },
            None => {
                let curve = measure(path, model)?;
                if let Some(f) = &file {
                    write_cached(f, path, model, &curve);
                }
                Held { curve, measured: true }
            }
        };
        Ok(slot.insert(held).curve.clone())
    }

    /// The cache file of `model` loaded from `path`.
    fn file(&self, path: &Path, model: &LlamaModel) -> Option<PathBuf> {
        let meta = std::fs::metadata(path).ok()?;
        let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?.as_secs();
        let name = path
            .file_name()?
            .to_string_lossy()
            .replace(|c: char| !c.is_ascii_alphanumeric() && c != '.', "_");
        let o = model.options();
        let mode = if o.exact { "exact" } else { "fast" };
        Some(self.dir.as_ref()?.join("costs").join(format!(
            "{name}-{}-{mtime}-t{}-{mode}-v{FORMAT}.json",
            meta.len(),
            o.threads
        )))
    }
}

/// A cached curve, if `file` holds a readable one of this format.
fn read_cached(file: &Path) -> Option<CostCurve> {
    let text = std::fs::read_to_string(file).ok()?;
    match serde_json::from_str::<CachedCurve>(&text) {
        Ok(c) if c.format == FORMAT => Some(c.curve),
        _ => {
            eprintln!("[treespec] ignoring unreadable cost cache {}", file.display());
            None
        }
    }
}

/// Profile `model` on a fresh context.
fn measure(path: &Path, model: &LlamaModel) -> Result<CostCurve> {
    eprintln!(
        "[treespec] measuring the cost curve T(n) of {} ({} threads; once, then cached)…",
        path.display(),
        model.options().threads
    );
    let t = Instant::now();
    let mut lm = model.new_lm()?;
    let curve = measure_curve(&mut lm, PROFILE_SIZES, REPEAT)
        .with_context(|| format!("profiling {}", path.display()))?;
    eprintln!(
        "[treespec]   T(1) = {:.1} ms, T(4) = {:.1} ms, T(8) = {:.1} ms, T(16) = {:.1} ms, \
         +{:.1} ms a row per 1,000 committed tokens ({:.1} s)",
        curve.ms(1),
        curve.ms(4),
        curve.ms(8),
        curve.ms(16),
        curve.row_ms_per_context_token() * 1e3,
        t.elapsed().as_secs_f64()
    );
    Ok(curve)
}

/// Write `curve` to `file`; a failure only warns (the next run profiles again).
fn write_cached(file: &Path, path: &Path, model: &LlamaModel, curve: &CostCurve) {
    let cached = CachedCurve {
        format: FORMAT,
        model: path.display().to_string(),
        threads: model.options().threads,
        exact: model.options().exact,
        curve: curve.clone(),
    };
    let written = file
        .parent()
        .map(std::fs::create_dir_all)
        .transpose()
        .and_then(|_| std::fs::write(file, serde_json::to_string_pretty(&cached).unwrap_or_default()));
    if let Err(e) = written {
        eprintln!("[treespec] could not cache the cost curve in {}: {e}", file.display());
    }
}
