//! `treespec draft …`: write cheaper draft models with llama.cpp's quantizer.
//!
//! * `quantize IN OUT --type q4_0`: a requantized draft (llama.cpp runs Q4_0 with its fastest
//!   repacked CPU kernels; the draft's own accuracy matters less than its cost, since the target
//!   verifies every token).
//! * `from-target -m TARGET OUT --drop-layers 12-27`: a layer-dropped self-draft from the target's
//!   own file — same tokenizer, no second download.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use treespec_llama::{available_cores, write_draft, DraftOptions, DraftType};

use super::threads::threads_arg;

/// `treespec draft …`.
#[derive(Debug, Args)]
pub struct DraftArgs {
    #[command(subcommand)]
    pub command: DraftCommand,
}

/// The draft-writing subcommands.
#[derive(Debug, Subcommand)]
pub enum DraftCommand {
    /// Requantize a model into a cheaper draft.
    Quantize(QuantizeArgs),
    /// Cut a self-draft out of the target: its first layers (or any subset) at a cheap type.
    FromTarget(FromTargetArgs),
}

/// Options of `treespec draft quantize`.
#[derive(Debug, Args)]
pub struct QuantizeArgs {
    /// Input GGUF.
    pub input: PathBuf,
    /// Output GGUF (a new file).
    pub output: PathBuf,
    #[command(flatten)]
    pub write: WriteArgs,
}

/// Options of `treespec draft from-target`.
#[derive(Debug, Args)]
pub struct FromTargetArgs {
    /// The target GGUF.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Output GGUF (a new file).
    pub output: PathBuf,
    /// Transformer blocks to leave out, e.g. `12-27` or `4,8,12-27`.
    #[arg(long = "drop-layers")]
    pub drop_layers: String,
    #[command(flatten)]
    pub write: WriteArgs,
}

/// How a draft file is written (both subcommands).
#[derive(Debug, Args)]
pub struct WriteArgs {
    /// Weight type: q4_0, q8_0, q4_k_m or copy.
    #[arg(long = "type", default_value = "q4_0")]
    pub kind: String,
    /// Threads for quantizing (default: all cores).
    #[arg(short = 't', long, value_parser = threads_arg)]
    pub threads: Option<usize>,
    /// Overwrite the output file if it exists.
    #[arg(long)]
    pub force: bool,
}

/// Parse `4,8,12-27` into layer indices.
pub fn parse_layers(spec: &str) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let (a, b): (u32, u32) = (
            a.parse().with_context(|| format!("bad layer '{a}' in '{spec}'"))?,
            b.parse().with_context(|| format!("bad layer '{b}' in '{spec}'"))?,
        );
        if a > b {
            bail!("layer range {a}-{b} runs backwards");
        }
        out.extend(a..=b);
    }
    if out.is_empty() {
        bail!("--drop-layers names no layer");
    }
    Ok(out)
}

/// Run `treespec draft …`.
pub fn run(args: DraftArgs) -> Result<()> {
    let t = Instant::now();
    let options = |kind: &str, drop_layers: Vec<u32>, threads: Option<usize>, force: bool| -> Result<_> {
        let threads = threads.unwrap_or_else(available_cores);
        Ok(DraftOptions { kind: DraftType::parse(kind)?, drop_layers, threads, force })
    };
    let (input, output) = match &args.command {
        DraftCommand::Quantize(a) => {
            write_draft(
                &a.input,
                &a.output,
                &options(&a.write.kind, Vec::new(), a.write.threads, a.write.force)?,
            )?;
            (&a.input, &a.output)
        }
        DraftCommand::FromTarget(a) => {
            let layers = parse_layers(&a.drop_layers)?;
            write_draft(
                &a.model,
                &a.output,
                &options(&a.write.kind, layers, a.write.threads, a.write.force)?,
            )?;
            (&a.model, &a.output)
        }
    };
    let size = |p: &PathBuf| std::fs::metadata(p).map(|m| m.len() as f64 / (1 << 20) as f64).unwrap_or(0.0);
    eprintln!(
        "wrote {} ({:.1} MiB, from {:.1} MiB) in {:.1} s",
        output.display(),
        size(output),
        size(input),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_layer_lists() {
        assert_eq!(parse_layers("4,8,10-12").unwrap(), vec![4, 8, 10, 11, 12]);
        assert!(parse_layers("").is_err());
        assert!(parse_layers("5-3").is_err());
        assert!(parse_layers("a").is_err());
    }
}
