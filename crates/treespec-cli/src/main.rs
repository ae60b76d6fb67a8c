//! `treespec`: speculative decoding with dynamic token trees.
//!
//! The binary is a thin layer: argument parsing here, every decision in the engine.

mod commands;

use clap::{Parser, Subcommand};

/// Lossless speculative decoding with dynamic token trees.
#[derive(Debug, Parser)]
#[command(name = "treespec", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the speculative loop on small pure-Rust toy models (no model files needed).
    Demo(commands::demo::DemoArgs),
    /// Generate text from a GGUF model, speculatively.
    Generate(Box<commands::generate::GenerateArgs>),
    /// Print a GGUF model's architecture, sizes, quantization, tokenizer and chat template.
    Inspect(commands::inspect::InspectArgs),
    /// Build n-gram tables for the lookup and staged drafters.
    Ngram(commands::ngram::NgramArgs),
    /// Measure the target-forward cost curve T(n) on this machine.
    Profile(commands::profile::ProfileArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => commands::demo::run(args),
        Command::Generate(args) => commands::generate::run(*args),
        Command::Inspect(args) => commands::inspect::run(args),
        Command::Ngram(args) => commands::ngram::run(args),
        Command::Profile(args) => commands::profile::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
