//! `treespec profile -m MODEL.gguf`: the measured cost curve T(n) — milliseconds for one forward
//! of n new tokens with logits for every row — on this machine and thread count. On a CPU it is
//! far from flat and has steps (kernels change with batch size), which is what tree budgeting
//! has to respect.

use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use treespec_engine::profile::{time_forwards, ProfileSpec};
use treespec_llama::{ModelPaths, ModelRuntime};

use super::args::ModelArgs;

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
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Run `profile`.
pub fn run(args: ProfileArgs) -> Result<()> {
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
    let spec =
        ProfileSpec { sizes: &sizes, repeat: args.repeat, prefix: args.prefix, last_only: args.last_only };
    let points = time_forwards(&mut model.new_lm()?, spec)?;
    let threads = model.options().threads;
    if args.json {
        let rows: Vec<_> =
            points.iter().map(|p| json!({"n": p.n, "ms": p.median_ms, "min_ms": p.min_ms})).collect();
        println!(
            "{}",
            json!({"model": args.models.model, "threads": threads, "prefix": args.prefix, "points": rows})
        );
        return Ok(());
    }
    println!(
        "T(n) for {} ({} threads, {} committed tokens, median of {})",
        args.models.model.display(),
        threads,
        args.prefix,
        args.repeat
    );
    // Relative to the smallest size measured (T(1) unless --sizes leaves it out).
    let first = &points[0];
    let ratio = format!("T(n)/T({})", first.n);
    println!("{:>4} {:>9} {:>9} {:>10} {:>9}", "n", "ms", "min ms", "ms/token", ratio);
    let t1 = first.median_ms;
    for p in &points {
        let ms = p.median_ms;
        println!("{:>4} {:>9.2} {:>9.2} {:>10.2} {:>9.2}", p.n, ms, p.min_ms, ms / p.n as f64, ms / t1);
    }
    Ok(())
}
