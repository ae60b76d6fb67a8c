//! `treespec profile -m MODEL.gguf`: the measured cost curve T(n) — milliseconds for one forward
//! of n new tokens with logits for every row — on this machine and thread count. On a CPU it is
//! far from flat and has steps (kernels change with batch size), which is what tree budgeting
//! has to respect.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use treespec_engine::{CausalLm, TreeBatch};
use treespec_llama::LlamaModel;

use super::args::ModelArgs;

/// Options of `treespec profile`.
#[derive(Debug, Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub models: ModelArgs,
    /// Largest batch measured.
    #[arg(long, default_value_t = 64)]
    pub max_n: usize,
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

/// One measured point.
pub struct Point {
    /// Tokens in the batch.
    pub n: usize,
    /// Median milliseconds.
    pub ms: f64,
    /// Fastest run.
    pub min_ms: f64,
}

/// Run `profile`.
pub fn run(args: ProfileArgs) -> Result<()> {
    if args.max_n == 0 || args.repeat == 0 {
        bail!("--max-n and --repeat must be at least 1");
    }
    if args.prefix + args.max_n >= args.models.ctx {
        bail!("--prefix + --max-n must fit the context (--ctx {})", args.models.ctx);
    }
    let model = LlamaModel::load(&args.models.model, args.models.load_options())
        .with_context(|| format!("loading {}", args.models.model.display()))?;
    let points = measure(&model, args.prefix, args.max_n, args.repeat, args.last_only)?;
    let threads = model.options().threads;
    if args.json {
        let rows: Vec<_> = points.iter().map(|p| json!({"n": p.n, "ms": p.ms, "min_ms": p.min_ms})).collect();
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
    println!("{:>4} {:>9} {:>9} {:>10} {:>8}", "n", "ms", "min ms", "ms/token", "T(n)/T(1)");
    let t1 = points[0].ms;
    for p in &points {
        println!("{:>4} {:>9.2} {:>9.2} {:>10.2} {:>8.2}", p.n, p.ms, p.min_ms, p.ms / p.n as f64, p.ms / t1);
    }
    Ok(())
}

/// Measure T(n) for n = 1..=max_n as a chain of n tokens on top of `prefix` committed tokens.
pub fn measure(
    model: &LlamaModel,
    prefix: usize,
    max_n: usize,
    repeat: usize,
    last_only: bool,
) -> Result<Vec<Point>> {
    let mut lm = model.new_lm()?;
    let vocab = model.vocab_size() as u32;
    // Ordinary text-like ids; the values do not change the cost.
    let tokens: Vec<u32> = (0..prefix + max_n).map(|i| (i as u32 * 7919 + 13) % vocab).collect();
    lm.prefill(&tokens[..prefix])?;
    // Warm-up: first decodes allocate buffers.
    for n in [1, max_n] {
        lm.forward(&TreeBatch::chain(&tokens[prefix..prefix + n], None, 0, false))?;
        lm.commit(&[])?;
    }
    let mut out = Vec::with_capacity(max_n);
    for n in 1..=max_n {
        let mut times = Vec::with_capacity(repeat);
        for _ in 0..repeat {
            let batch = TreeBatch::chain(&tokens[prefix..prefix + n], None, 0, last_only);
            let t = Instant::now();
            lm.forward(&batch)?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
            lm.commit(&[])?;
        }
        times.sort_by(f64::total_cmp);
        out.push(Point { n, ms: times[times.len() / 2], min_ms: times[0] });
    }
    Ok(out)
}
