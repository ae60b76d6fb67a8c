//! `treespec demo`: the full speculative loop on enumerable toy models, to see the mechanics
//! (acceptance by depth, forwards saved) in milliseconds and without any download.

use anyhow::{bail, Result};
use clap::Args;
use treespec_core::sampling::SamplingParams;
use treespec_engine::drafters::{ChainDrafter, TreeDrafter};
use treespec_engine::toy::{ToyLm, ToyModel};
use treespec_engine::{generate, Drafter, GenerateRequest, PlainDrafter, StopConditions};

/// Options of `treespec demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Methods to compare (plain, chain, tree).
    #[arg(long, value_delimiter = ',', default_value = "plain,chain,tree")]
    methods: Vec<String>,
    /// Toy vocabulary size.
    #[arg(long, default_value_t = 32)]
    vocab: usize,
    /// Context tokens the toy conditionals depend on.
    #[arg(long, default_value_t = 2)]
    order: usize,
    /// How far the draft's logits stray from the target's (0 = identical draft).
    #[arg(long, default_value_t = 1.0)]
    noise: f32,
    /// Chain length for `chain`.
    #[arg(short = 'k', long, default_value_t = 4)]
    k: usize,
    /// Children per node at each depth for `tree`.
    #[arg(long, value_delimiter = ',', default_value = "3,2,2,1")]
    widths: Vec<usize>,
    /// New tokens to generate.
    #[arg(short = 'n', long, default_value_t = 200)]
    n: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temp: f32,
    /// Seed for the toy models and the random streams.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Run the demo.
pub fn run(args: DemoArgs) -> Result<()> {
    if args.vocab < 2 {
        bail!("--vocab must be at least 2");
    }
    let target = ToyModel::new(args.vocab, args.order, args.seed);
    let draft = target.draft(args.noise, args.seed.wrapping_add(1));
    let ctx = 4096;
    let request = GenerateRequest {
        prompt: vec![0, 1],
        max_new_tokens: args.n,
        sampling: SamplingParams::with_temperature(args.temp),
        seed: args.seed,
        stop: StopConditions::default(),
    };
    println!(
        "toy target: vocab {}, order {}; draft noise {}; temperature {}; {} new tokens",
        args.vocab, args.order, args.noise, args.temp, args.n
    );
    let mut plain_tokens = None;
    for method in &args.methods {
        let mut drafter: Box<dyn Drafter> = match method.as_str() {
            "plain" => Box::new(PlainDrafter),
            "chain" => Box::new(ChainDrafter::new(ToyLm::new(draft.clone(), ctx), args.k)?),
            "tree" => Box::new(TreeDrafter::new(ToyLm::new(draft.clone(), ctx), args.widths.clone())?),
            other => bail!("unknown method '{other}' for the demo (plain, chain, tree)"),
        };
        let mut lm = ToyLm::new(target.clone(), ctx);
        let out = generate(&mut lm, drafter.as_mut(), &request, None, &mut |_| true)?;
        let same = match (&plain_tokens, method.as_str()) {
            (None, "plain") => {
                plain_tokens = Some(out.tokens.clone());
                String::new()
            }
            (Some(p), _) if args.temp == 0.0 => {
                format!(" | identical to plain: {}", *p == out.tokens)
            }
            _ => String::new(),
        };
        println!("{:>6}: {}{}", method, out.stats.summary_line(), same);
    }
    Ok(())
}
