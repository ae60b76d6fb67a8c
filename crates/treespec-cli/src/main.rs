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
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => commands::demo::run(args),
        Command::Generate(args) => commands::generate::run(*args),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
