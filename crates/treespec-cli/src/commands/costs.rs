//! The measured cost curves behind `--budget auto` and `--method auto`, cached per model file,
//! thread count and kernel mode, so only the first run on a machine pays for the profile.
//!
//! Cache: `$TREESPEC_CACHE_DIR`, else `$XDG_CACHE_HOME/treespec`, else `~/.cache/treespec`; one
//! JSON file per (file name, size, modification time, threads, fast|exact). Delete it, or pass
//! `--reprofile`, after changing the machine's load or the build.

use std::path::{Path, PathBuf};
use std::time::{Instant, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use treespec_core::cost::CostCurve;
use treespec_engine::auto_budget::CostModel;
use treespec_engine::profile::{measure_curve, PROFILE_SIZES};
use treespec_llama::LlamaModel;

use super::args::ModelArgs;
use super::models::Models;

/// Timed repetitions per batch size of a start-up profile (the median is kept).
const REPEAT: usize = 3;
/// Bump when the profile's meaning changes, so stale caches are not read.
const FORMAT: u32 = 2;

#[derive(Debug, Serialize, Deserialize)]
struct CachedCurve {
    format: u32,
    model: String,
    threads: usize,
    exact: bool,
    curve: CostCurve,
}

/// The cost model for the loaded models: the target's curve, and the draft's when `with_draft`.
pub fn cost_model(args: &ModelArgs, models: &Models, with_draft: bool, reprofile: bool) -> Result<CostModel> {
    let target = curve(&args.model, &models.target, reprofile)?;
    let draft = match (with_draft, models.draft(), &args.draft) {
        (true, Some(d), Some(path)) => Some(curve(path, d, reprofile)?),
        _ => None,
    };
    Ok(CostModel::new(target, draft))
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("TREESPEC_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("treespec"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("treespec"))
}

fn cache_file(path: &Path, model: &LlamaModel) -> Option<PathBuf> {
    let meta = std::fs::metadata(path).ok()?;
    let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?.as_secs();
    let name =
        path.file_name()?.to_string_lossy().replace(|c: char| !c.is_ascii_alphanumeric() && c != '.', "_");
    let o = model.options();
    let mode = if o.exact { "exact" } else { "fast" };
    Some(cache_dir()?.join("costs").join(format!(
        "{name}-{}-{mtime}-t{}-{mode}-v{FORMAT}.json",
        meta.len(),
        o.threads
    )))
}

/// One model's curve: from the cache, or measured now (and cached).
fn curve(path: &Path, model: &LlamaModel, reprofile: bool) -> Result<CostCurve> {
    let file = cache_file(path, model);
    if let (Some(f), false) = (&file, reprofile) {
        if let Ok(text) = std::fs::read_to_string(f) {
            match serde_json::from_str::<CachedCurve>(&text) {
                Ok(c) if c.format == FORMAT => return Ok(c.curve),
                _ => eprintln!("[treespec] ignoring unreadable cost cache {}", f.display()),
            }
        }
    }
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
        "[treespec]   T(1) = {:.1} ms, T(4) = {:.1} ms, T(8) = {:.1} ms, T(16) = {:.1} ms ({:.1} s)",
        curve.ms(1),
        curve.ms(4),
        curve.ms(8),
        curve.ms(16),
        t.elapsed().as_secs_f64()
    );
    if let Some(f) = file {
        let cached = CachedCurve {
            format: FORMAT,
            model: path.display().to_string(),
            threads: model.options().threads,
            exact: model.options().exact,
            curve: curve.clone(),
        };
        let written = f
            .parent()
            .map(std::fs::create_dir_all)
            .transpose()
            .and_then(|_| std::fs::write(&f, serde_json::to_string_pretty(&cached).unwrap_or_default()));
        if let Err(e) = written {
            eprintln!("[treespec] could not cache the cost curve in {}: {e}", f.display());
        }
    }
    Ok(curve)
}

/// Options of `treespec bound`.
#[derive(Debug, clap::Args)]
pub struct BoundArgs {
    #[command(flatten)]
    pub models: ModelArgs,
    /// Measured acceptance per depth (the last value repeats deeper), e.g. from a bench report's
    /// "accept rate by depth".
    #[arg(long, value_delimiter = ',', default_value = "0.8")]
    pub acceptance: Vec<f64>,
    /// Longest chain considered.
    #[arg(long = "max-k", default_value_t = 16)]
    pub max_k: usize,
    /// Re-measure the cost curves instead of reading the cache.
    #[arg(long)]
    pub reprofile: bool,
}

/// `treespec bound`: the best tokens/s any chain of drafted tokens can reach on this machine's
/// measured cost curves, for the measured acceptance and for perfect acceptance, with the draft
/// model's cost and with a free draft (prompt lookup). A tree does no better than its best path
/// plus the extra rows it pays for, so when no chain beats plain decoding here, no tree does.
pub fn bound(args: BoundArgs) -> Result<()> {
    if args.acceptance.iter().any(|a| !(0.0..=1.0).contains(a)) {
        anyhow::bail!("--acceptance values must be in [0, 1]");
    }
    let models = Models::load(&args.models)?;
    let costs = cost_model(&args.models, &models, args.models.draft.is_some(), args.reprofile)?;
    let t1 = costs.target.ms(1);
    println!("target T(1) = {t1:.1} ms: plain decoding {:.1} tok/s", 1e3 / t1);
    let mut drafts = vec![("free draft (lookup)", 0.0)];
    if let Some(d) = &costs.draft {
        println!("draft  T(1) = {:.1} ms ({:.0}% of a target step)", d.ms(1), 100.0 * d.ms(1) / t1);
        drafts.push(("draft model", d.ms(1)));
    }
    println!("\n| draft | acceptance | best k | tokens/step | ms/step | tok/s | vs plain |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for (name, draft_ms) in drafts {
        for (label, acc) in [("measured", args.acceptance.clone()), ("perfect", vec![1.0])] {
            let rows = treespec_core::budget::chain_bound(&costs.target, draft_ms, &acc, args.max_k);
            let best = rows.iter().max_by(|a, b| a.3.total_cmp(&b.3)).expect("k = 0 is always there");
            println!(
                "| {name} | {label} | {} | {:.2} | {:.1} | {:.1} | {:.2}× |",
                best.0,
                best.1,
                best.2,
                best.3 * 1e3,
                best.3 * t1
            );
        }
    }
    Ok(())
}
