//! The measured cost curves behind `--budget auto` and `--method auto`, cached on disk per model
//! file, thread count and kernel mode, so only the first run on a machine pays for the profile,
//! and in memory per runtime, so a process profiles (or reads) each curve once however many
//! methods ask for it.
//!
//! Disk cache: `$TREESPEC_CACHE_DIR`, else `$XDG_CACHE_HOME/treespec`, else `~/.cache/treespec`;
//! one JSON file per (file name, size, modification time, threads, fast|exact, huge pages or
//! not). Delete it, or pass
//! `--reprofile`, after changing the build; `treespec profile --check` says whether it still
//! matches the machine.
//!
//! A curve measured while the machine was busy (see [`treespec_engine::measure::profile::measure_curve`])
//! is cached marked noisy, with a warning then and at every later read, rather than not at
//! all: re-measuring at every start on a machine that stays busy would cost minutes each time
//! and come out no better. Every run refines the curves it uses from the forwards it times
//! (faster forwards count more, see [`CostCurve::observe`]) and writes the refined curve back
//! (when the runtime is dropped, and every [`SAVE_EVERY`] observations when a method asks for
//! the curves), so a noisy curve washes out over the runs that use it.
//!
//! `TREESPEC_COSTS=linear:BASE_MS,ROW_MS` replaces every measured curve with a synthetic linear
//! one, T(n) = BASE_MS + ROW_MS · n, without measuring or touching the cache: for tests (whose
//! time limits must not depend on how long this machine takes to profile itself) and what-if
//! runs. `TREESPEC_COSTS=file:TARGET.json[,DRAFT.json]` takes the curves from cache files written
//! on another machine (a GPU's, `scripts/gpu-check.sh`) and keeps them as they are, never refined
//! by this machine's forwards: the drafters then choose what they would choose there, which is how
//! acceptance is recorded on a CPU with the budgets a GPU would pick.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, UNIX_EPOCH};
use treespec_core::cost::shapes::{ShapeBuckets, ShapeTimes};
use treespec_engine::measure::shapes::time_shapes;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use treespec_core::cost::{CostCurve, CurveTap};
use treespec_engine::auto_budget::CostModel;
use treespec_engine::measure::profile::{
    check_curve, measure_curve, CurveCheck, MeasureOptions, Progress, PROFILE_SIZES,
};

use super::models::{ModelPair, ModelPaths};
use crate::kernels::{self, TiledMatmul, TILED_ENV};
use crate::lm::LlamaLm;
use crate::load::{LlamaModel, DECODED};

/// Interleaved rounds over every batch size of a start-up profile (the fastest repeat is kept;
/// sizes whose repeats disagree get up to [`EXTRA_ROUNDS`] more).
const ROUNDS: usize = 3;
/// See [`ROUNDS`].
const EXTRA_ROUNDS: usize = 4;
/// Bump when the profile's meaning changes, so stale caches are not read (4: every size of the
/// 4-row steps, see [`PROFILE_SIZES`]; 5: fastest of interleaved repeats, fitted, marked noisy,
/// refined online and written back).
const FORMAT: u32 = 5;
/// Observations after which a refined curve is written back when a method asks for the curves.
const SAVE_EVERY: u64 = 256;

#[derive(Debug, Serialize, Deserialize)]
struct CachedCurve {
    format: u32,
    model: String,
    threads: usize,
    exact: bool,
    curve: CostCurve,
    /// Measured while the machine was busy: why (empty when it was quiet).
    #[serde(default)]
    noisy: String,
    /// Timed forwards folded into the curve since it was measured, over all runs.
    #[serde(default)]
    observations: u64,
    /// The CPU kernel setting the curve was measured with, when not ggml's default (see
    /// [`crate::kernels`]): every later process applies it before its first decode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kernels: Option<String>,
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
/// satisfied by a curve measured here, not by one read from the disk cache); its tap collects
/// what the drafters refine, to be written back to `file`.
#[derive(Debug, Clone)]
struct Held {
    curve: CostCurve,
    measured: bool,
    /// Measured while the cores stayed busy past the wait (see [`measure`]): used and refined
    /// by this run, never cached.
    provisional: bool,
    tap: Arc<CurveTap>,
    file: Option<PathBuf>,
    stored: Stored,
}

/// What the cache file says besides the curve, and how many of the tap's observations it holds.
#[derive(Debug, Clone, Default)]
struct Stored {
    model: String,
    threads: usize,
    exact: bool,
    noisy: String,
    /// Observations of earlier runs.
    observations: u64,
    kernels: Option<String>,
    /// Of this run's observations, how many were written back.
    saved: u64,
}

impl Held {
    /// Write the refined curve back if at least `min_new` observations arrived since the last
    /// write.
    fn save_refined(&mut self, min_new: u64) {
        let seen = self.tap.observations();
        let Some(file) = &self.file else { return };
        if seen == 0 || seen < self.stored.saved + min_new.max(1) {
            return;
        }
        let s = &self.stored;
        let cached = CachedCurve {
            format: FORMAT,
            model: s.model.clone(),
            threads: s.threads,
            exact: s.exact,
            curve: self.tap.curve(),
            noisy: s.noisy.clone(),
            observations: s.observations + seen,
            kernels: s.kernels.clone(),
        };
        write_cached(file, &cached);
        self.stored.saved = seen;
    }
}

/// The runtime's curves: computed on first need. A mutex rather than a `OnceLock`, because
/// profiling takes seconds and two threads asking at once must wait for one profile, not run two
/// (which would also time each other's contention), and because `reprofile` may replace a curve.
#[derive(Debug)]
pub(crate) struct CostCache {
    dir: Option<PathBuf>,
    held: Mutex<[Option<Held>; 2]>,
    /// The curves `TREESPEC_COSTS` names, read once when the cache is made (a `file:` curve is
    /// a JSON file: not re-read per request); the error, in words, is reported where a cost model
    /// is asked for.
    given: std::result::Result<Option<GivenCurves>, String>,
}

impl CostCache {
    /// A cache keeping its files under `dir` (None: memory only).
    pub(crate) fn new(dir: Option<PathBuf>) -> Self {
        let given = synthetic_curve().map_err(|e| format!("{e:#}"));
        Self { dir, held: Mutex::new([None, None]), given }
    }

    /// The curves `TREESPEC_COSTS` names, if any (an unreadable spec is an error).
    fn given(&self) -> Result<Option<&GivenCurves>> {
        self.given.as_ref().map(Option::as_ref).map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// Re-time a few sizes of the target's cached curve and compare (`treespec profile
    /// --check`): the cache file and the comparison, or None when nothing is cached.
    pub(crate) fn check(&self, path: &Path, model: &LlamaModel) -> Result<Option<(PathBuf, CurveCheck)>> {
        let Some(file) = self.file(path, model) else { return Ok(None) };
        let Some(cached) = read_cached(&file) else { return Ok(None) };
        let opts = MeasureOptions {
            rounds: 3,
            extra_rounds: 2,
            threads: model.options().threads,
            ..Default::default()
        };
        let mut lm = model.new_lm()?;
        let bar = Bar::new("checking this machine against the cached cost curve");
        let check = check_curve(&mut lm, &cached.curve, &opts, &mut |p| bar.update(p));
        bar.finish();
        Ok(Some((file, check?)))
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
        if let Some(given) = self.given()? {
            let with_draft = with_draft && pair.draft().is_some();
            return Ok(given.cost_model(with_draft));
        }
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        for h in held.iter_mut().flatten() {
            h.save_refined(SAVE_EVERY);
        }
        let [target_slot, draft_slot] = &mut *held;
        let target = self.curve(target_slot, &paths.model, &pair.target, reprofile)?;
        let draft = match (with_draft, pair.draft(), &paths.draft) {
            (true, Some(_), Some(_)) if pair.draft_is_target() => Some(target.clone()),
            (true, Some(d), Some(path)) => Some(self.curve(draft_slot, path, d, reprofile)?),
            _ => None,
        };
        Ok(CostModel::new(target, draft))
    }

    /// Apply the CPU kernel setting recorded with the target's cached curve to this process
    /// (before its first decode; see [`crate::kernels`]), so the curve and the kernels agree.
    pub(crate) fn apply_recorded_kernels(&self, path: &Path, target: &LlamaModel) {
        if matches!(self.given, Ok(Some(_))) || target.runs_on() != "CPU" {
            return;
        }
        let recorded = self.file(path, target).as_deref().and_then(read_cached_quietly);
        if let Some(cached) = recorded {
            kernels::apply(
                TiledMatmul::from_recorded(cached.kernels.as_deref()),
                DECODED.load(Ordering::SeqCst),
            );
        }
    }

    /// Whether a curve held now is provisional (measured while the cores never freed up): the
    /// run prices on it but the next run measures again.
    /// Never waits: while a curve is being measured, nothing is provisional yet.
    pub(crate) fn provisional(&self) -> bool {
        let held = match self.held.try_lock() {
            Ok(held) => held,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        held.iter().flatten().any(|h| h.provisional)
    }

    /// Whether [`CostCache::cost_model`] would answer without measuring: every curve it needs is
    /// held or readable from the disk cache (and no measurement is under way). Never waits.
    pub(crate) fn has_curves(&self, pair: &ModelPair, paths: &ModelPaths, with_draft: bool) -> bool {
        if matches!(self.given, Ok(Some(_))) {
            return true;
        }
        // A curve being measured right now holds the lock for minutes: not known yet, and the
        // caller (a server starting up) must not wait for it.
        let held = match self.held.try_lock() {
            Ok(held) => held,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        let known = |slot: &Option<Held>, path: &Path, model: &LlamaModel| {
            slot.is_some() || self.file(path, model).as_deref().and_then(read_cached_quietly).is_some()
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
        if let Some(h) = slot.as_mut() {
            h.save_refined(1);
        }
        let file = self.file(path, model);
        let read = file.as_deref().filter(|_| !reprofile).and_then(read_cached);
        let (cached, measured, provisional) = match read {
            Some(c) => {
                if !c.noisy.is_empty() {
                    eprintln!(
                        "[treespec] warning: the cached cost curve of {} was measured while the machine was \
                         busy ({}); it is refined by every run, `treespec profile --check` compares it \
                         with the machine now, `--reprofile` measures it again",
                        path.display(),
                        c.noisy
                    );
                }
                (c, false, false)
            }
            None => {
                let (c, provisional) = measure(path, model, file.as_deref())?;
                match &file {
                    Some(_) if provisional => {
                        eprintln!(
                            "[treespec] warning: other processes kept the cores busy through the whole \
                             measurement, so it timed how busy the machine was, not what a forward costs: \
                             this run prices rows on it, refining it as it goes, but it is not cached \
                             (the next run measures again)"
                        );
                    }
                    Some(f) => write_cached(f, &c),
                    None => {}
                }
                (c, true, provisional)
            }
        };
        // A provisional curve is never written back, refined or not.
        let file = if provisional { None } else { file };
        let (curve, tap) = cached.curve.tapped();
        let stored = Stored {
            model: cached.model,
            threads: cached.threads,
            exact: cached.exact,
            noisy: cached.noisy,
            observations: cached.observations,
            kernels: cached.kernels,
            saved: 0,
        };
        Ok(slot.insert(Held { curve, measured, provisional, tap, file, stored }).curve.clone())
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
        // A curve is the device's: one measured with layers on a GPU is not the CPU's.
        let device = device_key(model.runs_on());
        // Weights on huge pages decode faster (crate::huge_pages): a curve measured on 4 KiB
        // pages is another machine's.
        let pages = if crate::huge_pages::enabled() { "-hp" } else { "" };
        Some(self.dir.as_ref()?.join("costs").join(format!(
            "{name}-{}-{mtime}-t{}-{mode}{device}{pages}-v{FORMAT}.json",
            meta.len(),
            o.threads
        )))
    }
}

/// The part of a cache file's name that says where the model runs: nothing on the CPU (so the
/// CPU's cached curves keep their names), else the device and layers in file-name characters.
fn device_key(runs_on: &str) -> String {
    if runs_on == "CPU" {
        return String::new();
    }
    let key: String = runs_on
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
        .collect();
    format!("-{}", key.split('_').filter(|p| !p.is_empty()).collect::<Vec<_>>().join("_"))
}

/// Write the curves refined by this runtime's drafters back to the cache.
impl Drop for CostCache {
    fn drop(&mut self) {
        let held = self.held.get_mut().unwrap_or_else(PoisonError::into_inner);
        for h in held.iter_mut().flatten() {
            h.save_refined(1);
        }
    }
}

/// A cached curve, if `file` holds a readable one of this format (a warning when it holds
/// something else).
fn read_cached(file: &Path) -> Option<CachedCurve> {
    let text = std::fs::read_to_string(file).ok()?;
    let read = parse_cached(&text);
    if read.is_none() {
        eprintln!("[treespec] ignoring unreadable cost cache {}", file.display());
    }
    read
}

/// [`read_cached`] without the warning.
fn read_cached_quietly(file: &Path) -> Option<CachedCurve> {
    parse_cached(&std::fs::read_to_string(file).ok()?)
}

fn parse_cached(text: &str) -> Option<CachedCurve> {
    serde_json::from_str::<CachedCurve>(text).ok().filter(|c| c.format == FORMAT)
}

/// The progress of a measurement on stderr: a bar with an ETA on a terminal, nothing
/// otherwise (the callers print a line at the start and the end).
struct Bar(Option<ProgressBar>);

impl Bar {
    fn new(what: &str) -> Self {
        if !std::io::stderr().is_terminal() {
            return Self(None);
        }
        let bar = ProgressBar::with_draw_target(Some(1), ProgressDrawTarget::stderr());
        let style =
            ProgressStyle::with_template(&format!("[treespec] {what}, {{msg}}, ~{{eta}} left {{wide_bar}}"))
                .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(500));
        Self(Some(bar))
    }

    fn update(&self, p: &Progress) {
        if let Some(bar) = &self.0 {
            bar.set_length(p.work_total as u64);
            bar.set_position(p.work_done as u64);
            let extra = if p.round > p.rounds.min(ROUNDS) { " (again: repeats disagreed)" } else { "" };
            let waited = if p.waited_ms > 0.0 {
                format!("; waited {:.0} s for cores another process was using", p.waited_ms / 1e3)
            } else {
                String::new()
            };
            bar.set_message(format!(
                "{}/{} batch sizes, round {}/{} on the {}{extra}{waited}",
                p.sizes_done, p.sizes, p.round, p.rounds, p.phase
            ));
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// Profile `model` on a fresh context (what will be cached in `file`).
/// Also whether the curve is provisional (see
/// [`Interference::stood_in`](treespec_engine::measure::profile::Interference::stood_in): not to be cached).
fn measure(path: &Path, model: &LlamaModel, file: Option<&Path>) -> Result<(CachedCurve, bool)> {
    let threads = model.options().threads;
    let into = file.map_or_else(|| "not cached".to_string(), |f| format!("cached in {}", f.display()));
    eprintln!(
        "[treespec] measuring this machine's cost curve T(n) for {} ({threads} threads, {} batch \
         sizes; once, then {into})…",
        path.display(),
        PROFILE_SIZES.len()
    );
    let kernels = choose_kernels(path, model);
    let t = Instant::now();
    let mut lm = model.new_lm()?;
    let opts = MeasureOptions { rounds: ROUNDS, extra_rounds: EXTRA_ROUNDS, threads, ..Default::default() };
    let bar = Bar::new("measuring this machine's cost curve");
    let measured = measure_curve(&mut lm, PROFILE_SIZES, &opts, &mut |p| bar.update(p));
    bar.finish();
    let measured = measured.with_context(|| format!("profiling {}", path.display()))?;
    let curve = measured.curve.clone().with_shapes(measure_shapes(&mut lm));
    eprintln!(
        "[treespec]   T(1) = {:.1} ms, T(4) = {:.1} ms, T(8) = {:.1} ms, T(16) = {:.1} ms, \
         +{:.1} ms a row per 1,000 committed tokens ({:.1} s; {into})",
        curve.ms(1),
        curve.ms(4),
        curve.ms(8),
        curve.ms(16),
        curve.row_ms_per_context_token() * 1e3,
        t.elapsed().as_secs_f64()
    );
    let i = &measured.interference;
    let noisy = if i.noisy() { i.describe() } else { String::new() };
    // A noisy curve's warning below names the shared forwards itself.
    if i.shared > 0 && noisy.is_empty() {
        eprintln!(
            "[treespec]   {} forwards shared their cores with another process and were timed again \
             ({:.0} s spent waiting for the cores)",
            i.shared,
            i.waited_ms / 1e3
        );
    }
    if !noisy.is_empty() {
        eprintln!(
            "[treespec] warning: the machine was busy while the cost curve was measured ({noisy}); \
             it is cached marked noisy and refined by every run; `--reprofile` on a quiet machine \
             measures it again"
        );
    }
    let o = model.options();
    let cached = CachedCurve {
        format: FORMAT,
        model: path.display().to_string(),
        threads: o.threads,
        exact: o.exact,
        curve,
        noisy,
        observations: 0,
        kernels,
    };
    Ok((cached, measured.interference.stood_in))
}

/// Repeats of each padded shape's changed and replayed timings (the median is kept).
const SHAPE_REPEATS: usize = 3;

/// The padded shapes' times on `lm` (what `--pad-shapes auto` decides on), and one line saying
/// what they decide; None, with a warning, where they cannot be timed (the curve then never pads
/// on its own).
fn measure_shapes(lm: &mut LlamaLm<'_>) -> Option<ShapeTimes> {
    let buckets = ShapeBuckets::default();
    eprintln!("[treespec]   timing the padded shapes, 1 and {:?} rows (seconds)…", buckets.sizes());
    match time_shapes(lm, &buckets, SHAPE_REPEATS) {
        Ok(times) => {
            let shown: Vec<String> = times
                .times
                .iter()
                .map(|t| format!("{} rows {:.1}/{:.1}", t.rows, t.changed_ms, t.replayed_ms))
                .collect();
            eprintln!("[treespec]   padded shapes, ms changed/replayed: {}", shown.join(", "));
            Some(times)
        }
        Err(e) => {
            eprintln!(
                "[treespec] warning: the padded shapes could not be timed ({e}); forwards stay unpadded"
            );
            None
        }
    }
}

/// The CPU kernels the curve about to be measured runs on: on a CPU's first profile, the faster
/// of ggml's two matmul paths, timed in child processes and set for this process now (see
/// [`crate::kernels`]); what the environment already says otherwise. Recorded in the cache.
fn choose_kernels(path: &Path, model: &LlamaModel) -> Option<String> {
    let o = model.options();
    if model.runs_on() == "CPU" && !o.exact && kernels::probe_allowed(DECODED.load(Ordering::SeqCst)) {
        eprintln!(
            "[treespec] timing ggml's tiled and untiled CPU matmul on {} (once, in child processes)…",
            path.display()
        );
        match kernels::probe(path, o.threads, o.ctx_size) {
            Some((choice, on_ms, off_ms)) => {
                eprintln!(
                    "[treespec]   8–32 rows: tiled {on_ms:.0} ms, untiled {off_ms:.0} ms: {}",
                    match choice {
                        TiledMatmul::Off => format!("{TILED_ENV}=0 from now on for this model"),
                        TiledMatmul::On => "ggml's default kept".to_string(),
                    }
                );
                kernels::apply(choice, DECODED.load(Ordering::SeqCst));
            }
            None => eprintln!("[treespec]   the kernel probe could not run; ggml's default kept"),
        }
    }
    let off = std::env::var(TILED_ENV).is_ok_and(|v| v.trim() == "0");
    (if off { TiledMatmul::Off } else { TiledMatmul::On }).recorded()
}

/// Write `cached` to `file` atomically (a unique temporary file in the same folder, synced,
/// renamed over it); a failure only warns (the next run profiles again).
fn write_cached(file: &Path, cached: &CachedCurve) {
    let written = (|| -> std::io::Result<()> {
        let dir = file.parent().ok_or_else(|| std::io::Error::other("no parent folder"))?;
        std::fs::create_dir_all(dir)?;
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let nanos = std::time::SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let tmp = dir.join(format!(".{name}.{}.{nanos}.tmp", std::process::id()));
        let result = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(serde_json::to_string_pretty(cached).unwrap_or_default().as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, file)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    })();
    if let Err(e) = written {
        eprintln!("[treespec] could not cache the cost curve in {}: {e}", file.display());
    }
}

/// The curves `TREESPEC_COSTS` names instead of measured ones (see the module docs).
#[derive(Debug, Clone)]
enum GivenCurves {
    /// `linear:BASE_MS,ROW_MS`: one synthetic curve for every model, refined online as usual.
    Linear(CostCurve),
    /// `file:TARGET.json[,DRAFT.json]`: another machine's curves, taken as they are.
    Files { target: CostCurve, draft: Option<CostCurve> },
}

impl GivenCurves {
    fn cost_model(&self, with_draft: bool) -> CostModel {
        match self {
            GivenCurves::Linear(curve) => CostModel::new(curve.clone(), with_draft.then(|| curve.clone())),
            // A draft without its own file is priced on the target's curve (as a draft that
            // shares the target's weights is).
            GivenCurves::Files { target, draft } => {
                let draft = with_draft.then(|| draft.as_ref().unwrap_or(target).clone());
                CostModel { target: target.clone(), draft, refine: false, elsewhere: true }
            }
        }
    }
}

/// The curves `TREESPEC_COSTS` asks for, if it is set.
fn synthetic_curve() -> Result<Option<GivenCurves>> {
    let Some(spec) = std::env::var_os("TREESPEC_COSTS") else { return Ok(None) };
    parse_given(&spec.to_string_lossy()).map(Some)
}

fn parse_given(spec: &str) -> Result<GivenCurves> {
    if let Some(files) = spec.strip_prefix("file:") {
        let mut paths = files.split(',').map(str::trim);
        let target = read_given(paths.next().unwrap_or_default())?;
        let draft = paths.next().map(read_given).transpose()?;
        if paths.next().is_some() {
            anyhow::bail!("TREESPEC_COSTS=file: takes one or two curve files (target, draft), not {spec:?}");
        }
        return Ok(GivenCurves::Files { target, draft });
    }
    let parsed = spec.strip_prefix("linear:").and_then(|rest| {
        let (base, row) = rest.split_once(',')?;
        let (base, row) = (base.trim().parse::<f64>().ok()?, row.trim().parse::<f64>().ok()?);
        (base.is_finite() && row.is_finite() && base > 0.0 && row >= 0.0).then_some((base, row))
    });
    let Some((base, row)) = parsed else {
        anyhow::bail!(
            "TREESPEC_COSTS must be `linear:BASE_MS,ROW_MS` with BASE_MS > 0 and ROW_MS >= 0, or \
             `file:TARGET.json[,DRAFT.json]`, not {spec:?}"
        );
    };
    Ok(GivenCurves::Linear(CostCurve::linear(base, row, 64)?))
}

/// A cost-curve cache file (as this module writes them) named by `TREESPEC_COSTS=file:`.
fn read_given(path: &str) -> Result<CostCurve> {
    if path.is_empty() {
        anyhow::bail!("TREESPEC_COSTS=file: needs a curve file (a cost-cache JSON file)");
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("TREESPEC_COSTS: reading {path}"))?;
    // A cache file, or any object holding a curve under "curve" (profile_curve's, a device run's).
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("TREESPEC_COSTS: {path} is not JSON"))?;
    let curve =
        value.get("curve").cloned().with_context(|| format!("TREESPEC_COSTS: {path} holds no \"curve\""))?;
    serde_json::from_value(curve).with_context(|| format!("TREESPEC_COSTS: {path} is not a cost-curve file"))
}

#[cfg(test)]
mod tests {
    use super::{device_key, parse_given, GivenCurves};

    #[test]
    fn a_gpu_curve_is_cached_apart_from_the_cpu_one() {
        assert_eq!(device_key("CPU"), "", "CPU curves keep their file names");
        let gpu = device_key("Vulkan0 (llvmpipe (LLVM 15.0.6, 256 bits)), every layer");
        assert_eq!(gpu, "-vulkan0_llvmpipe_llvm_15_0_6_256_bits_every_layer");
        assert_ne!(gpu, device_key("Vulkan0 (llvmpipe (LLVM 15.0.6, 256 bits)), 8 of 30 layers"));
    }

    /// A GPU's cached curve, named by file, is priced as it is and never refined here.
    #[test]
    fn given_curve_files_are_read_and_kept_unrefined() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, ms: &[f64]| {
            let points: Vec<(usize, f64)> = ms.iter().enumerate().map(|(i, &t)| (i + 1, t)).collect();
            let path = dir.path().join(name);
            let cached = super::CachedCurve {
                format: super::FORMAT,
                model: name.into(),
                threads: 16,
                exact: false,
                curve: treespec_core::cost::CostCurve::from_points(&points).unwrap(),
                noisy: String::new(),
                observations: 0,
                kernels: None,
            };
            std::fs::write(&path, serde_json::to_string(&cached).unwrap()).unwrap();
            path.display().to_string()
        };
        let target = write("t.json", &[5.0, 5.1, 5.2, 5.4]);
        let draft = write("d.json", &[2.0, 2.0, 2.1, 2.1]);
        let model = parse_given(&format!("file:{target},{draft}")).unwrap().cost_model(true);
        assert!(!model.refine, "another machine's curve must not be refined by this one's forwards");
        assert!(model.elsewhere, "steps are timed on the given curves, not by this machine's clock");
        assert_eq!(model.target.ms(4), 5.4);
        assert_eq!(model.draft.as_ref().map(|d| d.ms(1)), Some(2.0));
        // Without a draft file the draft is priced on the target's curve.
        let model = parse_given(&format!("file:{target}")).unwrap().cost_model(true);
        assert_eq!(model.draft.as_ref().map(|d| d.ms(2)), Some(5.1));
        assert!(parse_given(&format!("file:{target}")).unwrap().cost_model(false).draft.is_none());
        // Errors name the problem.
        let missing = parse_given("file:/nonexistent/curve.json").unwrap_err();
        assert!(format!("{missing:#}").contains("/nonexistent/curve.json"), "{missing:#}");
        let not_curve = dir.path().join("x.json");
        std::fs::write(&not_curve, "{}").unwrap();
        let wrong = parse_given(&format!("file:{}", not_curve.display())).unwrap_err();
        assert!(format!("{wrong:#}").contains("holds no \"curve\""), "{wrong:#}");
        // A device run's curve file (no cache format field) is read for its curve.
        let bare = dir.path().join("bare.json");
        std::fs::write(&bare, r#"{"device": "CUDA0", "curve": {"ms": [2.0, 3.0]}}"#).unwrap();
        let model = parse_given(&format!("file:{}", bare.display())).unwrap().cost_model(false);
        assert_eq!(model.target.ms(2), 3.0);
        assert!(parse_given("file:").is_err());
        assert!(parse_given(&format!("file:{target},{draft},{draft}")).is_err());
        assert!(matches!(parse_given("linear:30,2"), Ok(GivenCurves::Linear(_))));
        assert!(parse_given("quadratic:1").is_err());
    }
}
