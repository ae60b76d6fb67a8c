//! `treespec profile -m MODEL.gguf`: the measured cost curve T(n) — milliseconds for one forward
//! of n new tokens with logits for every row — on this machine and thread count. On a CPU it is
//! far from flat and has steps (kernels change with batch size), which is what tree budgeting
//! has to respect.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use treespec_engine::measure::profile::{time_forwards, ProfileSpec};
use treespec_llama::{ModelPaths, ModelRuntime};

use super::args::ModelArgs;
use super::profile_shapes;

/// Options of `treespec profile`.
#[derive(Debug, Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub models: ModelArgs,
    /// Largest batch measured (every size from 1).
    #[arg(long, default_value_t = 64)]
    pub max_n: usize,
    /// Measure only these batch sizes instead of 1..=max-n (comma-separated, e.g. `271,272` to
    /// see a kernel step far out on the curve).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<usize>,
    /// Committed tokens under the measured batch (a realistic KV length).
    #[arg(long, default_value_t = 128)]
    pub prefix: usize,
    /// Timed repetitions per n (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Request logits for the last row only (a prompt-processing batch, as llama-bench's ppN
    /// measures it) instead of every row (a verify batch). The difference is the output layer's
    /// cost per row.
    #[arg(long)]
    pub last_only: bool,
    /// Time each size after two untimed forwards of the same size: what a step costs where its
    /// size repeats from step to step (a GPU then replays a captured graph). Without it, on a
    /// GPU only one row is timed so (plain decoding repeats it); larger sizes are timed after
    /// other sizes, as tree steps of changing size run.
    #[arg(long)]
    pub repeated_shapes: bool,
    /// Also time the padded shapes (one row and each bucket of `--pad-shapes LIST`, default 8, 16,
    /// 32, 64) after a forward of another shape and after forwards of their own, with
    /// llama.cpp's graph reuse, and say whether padding pays on this device (docs/GPU.md).
    #[arg(long)]
    pub shapes: bool,
    /// Replay the shape sequence of a decision trace (`--decision-trace` of a single request) as
    /// real forwards: unpadded, padded, and plain decoding of the same tokens, each beside what
    /// the measured times predict (repeatable; implies --shapes).
    #[arg(long, value_name = "FILE")]
    pub replay_trace: Vec<PathBuf>,
    /// At most this many steps of each replayed trace.
    #[arg(long, default_value_t = 400)]
    pub replay_steps: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Instead of a table: whether the cost curve cached for this model, thread count and
    /// kernel mode (what `--budget auto` and `--method auto` price rows on) still matches this
    /// machine. A few sizes are timed again (fastest of interleaved repeats) and compared per
    /// size; the exit code is nonzero when one differs by more than `--tolerance` or nothing is
    /// cached.
    #[arg(long)]
    pub check: bool,
    /// Largest measured/cached deviation `--check` accepts (a fraction).
    #[arg(long, default_value_t = 0.15)]
    pub tolerance: f64,
}

/// Run `profile`.
pub fn run(args: ProfileArgs) -> Result<()> {
    if args.check {
        return check(&args);
    }
    let mut sizes: Vec<usize> =
        if args.sizes.is_empty() { (1..=args.max_n).collect() } else { args.sizes.clone() };
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.first().is_none_or(|&n| n == 0) || args.repeat == 0 {
        bail!("--max-n, every --sizes entry and --repeat must be at least 1");
    }
    let largest = sizes.last().copied().unwrap_or(0);
    if args.prefix + largest >= args.models.runtime.ctx {
        bail!(
            "--prefix + the largest size ({largest}) must fit the context (--ctx {})",
            args.models.runtime.ctx
        );
    }
    // The target only: a draft given on the command line is not profiled here.
    let paths = ModelPaths::new(args.models.model.clone(), None);
    let runtime = ModelRuntime::load(paths, args.models.runtime.load_options())?;
    let model = runtime.target();
    let threads = model.options().threads;
    let spec = ProfileSpec {
        sizes: &sizes,
        repeat: args.repeat,
        prefix: args.prefix,
        last_only: args.last_only,
        threads,
        repeated_shapes: args.repeated_shapes,
    };
    let points = time_forwards(&mut model.new_lm()?, spec)?;
    let (shapes, replays) = shapes_and_replays(&args, model, &points)?;
    // MiB of the large mappings advised to huge pages, and collapsed at once (treespec_llama::huge_pages).
    let (advised, collapsed) = treespec_llama::huge_pages::backed_mib();
    if args.json {
        let rows: Vec<_> =
            points.iter().map(|p| json!({"n": p.n, "ms": p.median_ms, "min_ms": p.min_ms})).collect();
        println!(
            "{}",
            json!({"model": args.models.model, "threads": threads, "device": model.runs_on(),
                "prefix": args.prefix, "repeated_shapes": args.repeated_shapes,
                "tiled_matmul": treespec_llama::tiled_matmul_state(),
                "huge_pages_mib": {"advised": advised, "collapsed": collapsed},
                "points": rows, "shapes": shapes, "replays": replays})
        );
        return Ok(());
    }
    println!(
        "T(n) for {} on {} ({} threads, {} committed tokens, median of {})",
        args.models.model.display(),
        model.runs_on(),
        threads,
        args.prefix,
        args.repeat
    );
    if model.runs_on() == "CPU" {
        println!("ggml's tiled K-quant matmul: {}", treespec_llama::tiled_matmul_state());
        println!(
            "huge pages under weights and cache: {collapsed} of {advised} MiB advised \
             ({}=off for 4 KiB pages)",
            treespec_llama::huge_pages::HUGE_PAGES_ENV
        );
    }
    // Relative to the smallest size measured (T(1) unless --sizes leaves it out).
    let first = &points[0];
    let ratio = format!("T(n)/T({})", first.n);
    println!("{:>4} {:>9} {:>9} {:>10} {:>9}", "n", "ms", "min ms", "ms/token", ratio);
    let t1 = first.median_ms;
    for p in &points {
        let ms = p.median_ms;
        println!("{:>4} {:>9.2} {:>9.2} {:>10.2} {:>9.2}", p.n, ms, p.min_ms, ms / p.n as f64, ms / t1);
    }
    if !shapes.is_null() {
        println!("padded shapes (changed / replayed ms): {shapes}");
    }
    if !replays.is_null() {
        println!("replayed traces: {replays}");
    }
    Ok(())
}

/// `--shapes` and `--replay-trace`: the shapes' times and the replays as JSON (null when not asked).
fn shapes_and_replays(
    args: &ProfileArgs,
    model: &treespec_llama::LlamaModel,
    points: &[treespec_engine::measure::profile::TimedSize],
) -> Result<(serde_json::Value, serde_json::Value)> {
    if !args.shapes && args.replay_trace.is_empty() {
        return Ok((serde_json::Value::Null, serde_json::Value::Null));
    }
    let buckets = profile_shapes::buckets(&args.models.runtime.pad_shapes);
    let (times, shapes) = profile_shapes::shapes_json(model, &buckets, points)?;
    let replays = match args.replay_trace.is_empty() {
        true => serde_json::Value::Null,
        false => profile_shapes::replay_json(model, &args.replay_trace, args.replay_steps, &times, points)?,
    };
    Ok((shapes, replays))
}

/// `treespec profile --check`.
fn check(args: &ProfileArgs) -> Result<()> {
    if !(args.tolerance.is_finite() && args.tolerance >= 0.0) {
        bail!("--tolerance must be a fraction ≥ 0");
    }
    let paths = ModelPaths::new(args.models.model.clone(), None);
    let runtime = ModelRuntime::load(paths, args.models.runtime.load_options())?;
    let threads = runtime.options().threads;
    let Some((file, check)) = runtime.check_cost_curve()? else {
        bail!(
            "no cost curve is cached for {} with {threads} threads (the first `--budget auto` or \
             `--method auto` run measures one)",
            args.models.model.display()
        );
    };
    let matches = check.matches(args.tolerance);
    let busy = check.interference.noisy();
    if args.json {
        let rows: Vec<_> = check
            .rows
            .iter()
            .map(|&(n, cached, now)| json!({"n": n, "cached_ms": cached, "measured_ms": now, "ratio": now / cached}))
            .collect();
        println!(
            "{}",
            json!({"cache": file, "threads": threads, "matches": matches, "tolerance": args.tolerance,
                   "worst_ratio": check.worst_ratio(), "busy": check.interference.describe(), "rows": rows})
        );
    } else {
        println!("cached cost curve {} ({threads} threads)", file.display());
        println!("{:>4} {:>10} {:>10} {:>7}", "n", "cached ms", "now ms", "ratio");
        for &(n, cached, now) in &check.rows {
            let flag = if (now / cached - 1.0).abs() > args.tolerance { "  ←" } else { "" };
            println!("{n:>4} {cached:>10.2} {now:>10.2} {:>7.3}{flag}", now / cached);
        }
        if busy {
            println!(
                "the machine is busy now ({}): a mismatch may be the load",
                check.interference.describe()
            );
        }
    }
    let worst = check.worst_ratio();
    if matches {
        if args.json {
            return Ok(());
        }
        println!("verdict: matches (every size within {:.0}%, worst ×{worst:.3})", args.tolerance * 100.0);
        Ok(())
    } else {
        let advice = if worst > 1.0 {
            "this machine is slower now than the cache says"
        } else {
            "this machine is faster now than the cache says"
        };
        bail!(
            "verdict: mismatch (worst ×{worst:.3}, tolerance {:.0}%): {advice}; `--reprofile` on a quiet \
             machine measures the curve again",
            args.tolerance * 100.0
        )
    }
}
