//! `treespec`: speculative decoding with dynamic token trees.
//!
//! The binary is a thin layer: argument parsing here, every decision in the engine.

// Tests are exempt from the 80-line limit (clippy.toml): a test reads top to bottom as one story.
#![cfg_attr(test, allow(clippy::too_many_lines))]

mod commands;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Lossless speculative decoding with dynamic token trees.
#[derive(Debug, Parser)]
#[command(name = "treespec", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the speculative loop on small pure-Rust toy models (no model files needed).
    Demo(Box<commands::demo::DemoArgs>),
    /// Generate text from a GGUF model, speculatively.
    Generate(Box<commands::generate::GenerateArgs>),
    /// Benchmark methods on a prompt set: speed-up, acceptance, identity with plain decoding.
    Bench(Box<commands::bench::BenchArgs>),
    /// Print a GGUF model's architecture, sizes, quantization, tokenizer and chat template.
    Inspect(commands::inspect::InspectArgs),
    /// List the compute devices (CPU, GPUs) this build finds, by the names `--device` takes.
    #[command(visible_alias = "list-devices")]
    Devices,
    /// Measure a model pair's positional acceptance vector (for --method sequoia).
    Calibrate(Box<commands::calibrate::CalibrateArgs>),
    /// DISCO stop classifier.
    Disco(DiscoArgs),
    /// Build n-gram tables for the lookup and staged drafters.
    Ngram(commands::ngram::NgramArgs),
    /// Measure the target-forward cost curve T(n) on this machine.
    Profile(Box<commands::profile::ProfileArgs>),
    /// The best speed-up any draft chain can reach on this machine's measured cost curves.
    Bound(Box<commands::bound::BoundArgs>),
    /// Write cheaper draft models (requantized, or layer-dropped from the target).
    Draft(commands::draft::DraftArgs),
    /// OpenAI-compatible HTTP server that decodes speculatively.
    Serve(Box<commands::serve::ServeArgs>),
}

/// `treespec disco …`.
#[derive(Debug, clap::Args)]
struct DiscoArgs {
    #[command(subcommand)]
    command: DiscoCommand,
}

#[derive(Debug, Subcommand)]
enum DiscoCommand {
    /// Train the stop classifier from oracle runs of a model pair.
    Train(Box<commands::calibrate::DiscoTrainArgs>),
}

fn main() {
    let args: Vec<_> = std::env::args_os().collect();
    if let Some(why) = commands::spellings::refused_flag(&args) {
        eprintln!("error: {why}");
        std::process::exit(2);
    }
    let args = commands::spellings::llama_spellings(args).unwrap_or_else(|why| {
        eprintln!("error: {why}");
        std::process::exit(2);
    });
    let cli = parse(args);
    let result = match cli.command {
        Command::Demo(args) => commands::demo::run(*args),
        Command::Generate(args) => commands::generate::run(*args),
        Command::Bench(args) => commands::bench::run(*args),
        Command::Inspect(args) => commands::inspect::run(args),
        Command::Devices => commands::devices::run(),
        Command::Draft(args) => commands::draft::run(args),
        Command::Bound(args) => commands::bound::bound(*args),
        Command::Ngram(args) => commands::ngram::run(args),
        Command::Calibrate(args) => commands::calibrate::calibrate(*args),
        Command::Disco(DiscoArgs { command: DiscoCommand::Train(args) }) => {
            commands::calibrate::disco_train(*args)
        }
        Command::Profile(args) => commands::profile::run(*args),
        Command::Serve(args) => commands::serve::run(*args),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// The command line parsed, `serve --help` saying which llama-server flags it accepts with
/// nothing to do.
fn parse(args: Vec<std::ffi::OsString>) -> Cli {
    let no_ops = commands::llama_flags::no_op_help();
    let command = Cli::command().mut_subcommand("serve", |serve| serve.after_help(no_ops));
    Cli::from_arg_matches(&command.get_matches_from(args)).unwrap_or_else(|e| e.exit())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// clap checks flag clashes (two `-c`s, a knob shadowing a command's own flag) only here.
    #[test]
    fn every_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn llama_cpp_spellings_mean_what_they_mean_there() {
        let parse = |line: &str| {
            let args =
                commands::spellings::llama_spellings(line.split(' ').map(std::ffi::OsString::from)).unwrap();
            let Command::Generate(g) = Cli::try_parse_from(args).unwrap().command else { panic!() };
            g
        };
        let g = parse("treespec generate -m T.gguf -md D.gguf -c 2048 -n 16 -t 1 --temp 0.5 -s 3 -p hi");
        assert_eq!(g.models.model.to_str(), Some("T.gguf"));
        assert_eq!(g.models.runtime.draft.as_deref().and_then(|p| p.to_str()), Some("D.gguf"));
        assert_eq!(
            (g.models.runtime.ctx, g.n, g.models.runtime.threads, g.sampling.temp, g.sampling.seed),
            (2048, 16, Some(1), 0.5, Some(3))
        );
        let g = parse(
            "treespec generate -m T --model-draft D --ctx-size 512 --spec-draft-n-max 6 --method chain -p x",
        );
        assert_eq!((g.models.runtime.ctx, g.method.knobs.k), (512, Some(6)));
        assert_eq!(g.models.runtime.draft.as_deref().and_then(|p| p.to_str()), Some("D"));
    }
}
