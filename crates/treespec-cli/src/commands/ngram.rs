//! `treespec ngram build CORPUS... -m MODEL -o FILE`: the static Katz back-off trigram table
//! behind `lookup` and `staged`, counted over text tokenized with the model's own tokenizer and
//! stamped with that tokenizer's fingerprint (loading it for another tokenizer is an error).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use treespec_core::ngram::NgramTable;
use treespec_llama::{tokenizer_id, LlamaModel, LoadOptions};

/// `treespec ngram …`.
#[derive(Debug, Args)]
pub struct NgramArgs {
    #[command(subcommand)]
    pub command: NgramCommand,
}

/// N-gram table commands.
#[derive(Debug, Subcommand)]
pub enum NgramCommand {
    /// Build a trigram table from text files.
    Build(BuildArgs),
}

/// Options of `treespec ngram build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// Text files (each paragraph — text between blank lines — is one sequence).
    #[arg(required = true)]
    pub corpus: Vec<PathBuf>,
    /// The model whose tokenizer the table is for (target and draft share it).
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// Output file.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
}

/// Run `ngram`.
pub fn run(args: NgramArgs) -> Result<()> {
    match args.command {
        NgramCommand::Build(b) => build(b),
    }
}

fn build(args: BuildArgs) -> Result<()> {
    let opts = LoadOptions { ctx_size: 256, n_seq_max: 1, ..LoadOptions::default() };
    let model =
        LlamaModel::load(&args.model, opts).with_context(|| format!("loading {}", args.model.display()))?;
    let mut sequences = Vec::new();
    let mut tokens = 0usize;
    for path in &args.corpus {
        let bytes = std::fs::read(path).with_context(|| format!("reading corpus {}", path.display()))?;
        let text = String::from_utf8_lossy(&bytes);
        for para in text.split("\n\n").map(str::trim).filter(|p| !p.is_empty()) {
            let seq = model.tokenize(para, false, false)?;
            tokens += seq.len();
            sequences.push(seq);
        }
    }
    if tokens == 0 {
        bail!("the corpus files hold no text");
    }
    let table = NgramTable::build(&sequences, tokenizer_id(&model)?)?;
    table.save(&args.out).with_context(|| format!("writing {}", args.out.display()))?;
    let (bi, tri) = table.contexts();
    eprintln!(
        "{} tokens in {} sequences → {} ({} bigram contexts, {} trigram contexts)",
        tokens,
        sequences.len(),
        args.out.display(),
        bi,
        tri
    );
    Ok(())
}
