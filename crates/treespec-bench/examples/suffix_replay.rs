//! Replay recorded greedy answers through the real suffix drafter on a measured cost curve: what a
//! drafting policy would have done on these texts, without running a model, deterministically.
//!
//! On this project's 2-vCPU machines two runs of the same benchmark differ by ±5–10% per prompt,
//! more than most drafting changes move. Greedy verification of a free draft needs no model once
//! the target's answer is known: a drafted node is accepted exactly when it is the next token of
//! the recorded answer. So the replay feeds each answer of a `plain-tokens.jsonl` (written by
//! `treespec bench`) to a `SuffixDrafter`, step by step, in the benchmark's order (the global
//! history and the learned prices carry from answer to answer as they do in a run), verifies each
//! proposal against the answer with treespec's own greedy verifier, and prices every step on a cost curve. The decisions use one
//! curve and the time is counted on another (`--score`, default the same), so a change to the
//! curve the drafter believes can be judged on the curve the machine has.
//!
//! ```sh
//! cargo run --release -p treespec-bench --example suffix_replay -- \
//!     bench/results/main-greedy/plain-tokens.jsonl ~/.cache/treespec/costs/<target>-t2-fast-v4.json \
//!     [--score OTHER-CURVE.json] [--pessimism Z] [--explore N] [--refine] [--per-answer] [--trace]
//! ```
//!
//! `--cold` replays each answer as a fresh `treespec generate` does: an empty global history and
//! the prices the replay started from (the drafter's starting prices, or `--prices FILE`: a
//! `SuffixPricing` as JSON), nothing carried from one answer to the next. The drafter starts from
//! the shipped calibrated prior, as a fresh install does; `--uninformed` starts it from the
//! formula prior alone. `--write-prices FILE` writes the prices learned over the whole replay (as
//! JSON) — what `scripts/calibrate-prior.sh` distils the shipped prior from (from `--uninformed`,
//! so that a calibration never feeds on the prior it replaces).
//!
//! `--pessimism Z` and `--explore N` set the drafter's pessimism and its exploration period
//! (`--suffix-pessimism`, `--suffix-explore`; 0 never explores).
//!
//! `--refine` folds each step's time into the curve and tracks the achieved rate, as a live run
//! does (without it every step is priced against plain decoding's rate). `--per-answer` prints
//! each answer's speed-up and tokens per forward to stderr; `--trace` prints one `TRACE` line per
//! step (prompt id, position in the answer, drafted nodes, deepest node, tokens emitted).
//!
//! Prints, per category, the median and the pooled speed-up over plain decoding (plain's time for
//! the same tokens on the scoring curve over the replay's) and the tokens emitted per forward.
//! It models the drafter alone: near-tie tokens that a real speculative run emits differently,
//! and the curve's online refinement, are not replayed.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use treespec_bench::runner::PlainText;
use treespec_core::cost::CostCurve;
use treespec_core::sampling::{Sampler, SamplingParams};
use treespec_core::suffix::{GlobalHistory, SuffixPricing, DEFAULT_CAP_TOKENS};
use treespec_core::tree::{NodeId, TokenTree};
use treespec_core::verify::{verify, Choice, TargetDists};
use treespec_core::{Dist, TokenId};
use treespec_engine::auto_budget::{CostModel, SharedCosts};
use treespec_engine::drafters::{SuffixConfig, SuffixDrafter, SuffixShared};
use treespec_engine::{Drafter, ForwardCost, ProposeContext};

/// Times and tokens of one category (or of all answers).
#[derive(Default)]
struct Tally {
    speedups: Vec<f64>,
    plain_ms: f64,
    ms: f64,
    emitted: usize,
    forwards: usize,
}

/// What one answer cost.
struct Replayed {
    plain_ms: f64,
    ms: f64,
    emitted: usize,
    forwards: usize,
}

fn read_curve(path: &Path) -> Result<CostCurve> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let cached: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    serde_json::from_value(cached["curve"].clone())
        .with_context(|| format!("{} holds no cost curve (a treespec cost-cache file)", path.display()))
}

/// The target of a replay: the recorded answer. Its greedy token after a node at depth d is the
/// answer's token d (the drafter never drafts past the answer's end, so d is always in it).
struct Answer<'a> {
    tree: &'a TokenTree,
    answer: &'a [TokenId],
}

impl TargetDists for Answer<'_> {
    fn dist(&mut self, node: NodeId) -> treespec_core::Result<Dist> {
        let next = self.greedy(node)?;
        Dist::point_mass(next, next as usize + 1)
    }

    fn greedy(&mut self, node: NodeId) -> treespec_core::Result<TokenId> {
        let depth = self.tree.node(node).depth;
        self.answer.get(depth).copied().ok_or_else(|| {
            treespec_core::Error::Invalid(format!("a node at depth {depth} is past the answer's end"))
        })
    }
}

fn replay(drafter: &mut SuffixDrafter, text: &PlainText, score: &CostCurve, trace: bool) -> Result<Replayed> {
    let sampler = Sampler::new(SamplingParams::greedy())?;
    // Greedy verification draws nothing; the stream is what the verifier's signature asks for.
    let plen = text.prompt.len();
    let mut history = text.prompt.clone();
    history.extend(&text.output);
    drafter.begin(&text.prompt, &sampler, 0)?;
    // The first answer token comes from the prompt's forward, as in a run.
    let mut at = plen + 1;
    let (mut ms, mut plain_ms, mut forwards) = (0.0, 0.0, 0);
    while at < history.len() {
        let ctx = ProposeContext {
            history: &history[..at],
            max_nodes: 256,
            max_depth: history.len() - at - 1,
            sampler: &sampler,
            batch_rows: 0,
            batch_cut: false,
            eos: &[],
        };
        let tree = drafter.propose(&ctx)?;
        let mut answer = Answer { tree: &tree, answer: &history[at..] };
        let outcome = verify(&tree, &mut answer, Choice::Greedy)?;
        let step_ms = score.ms_at(tree.len(), at);
        if trace {
            println!(
                "TRACE\t{}\t{}\t{}\t{}\t{}",
                text.prompt_id,
                at - plen,
                tree.len() - 1,
                tree.nodes().iter().map(|n| n.depth).max().unwrap_or(0),
                outcome.tokens.len()
            );
        }
        ms += step_ms;
        plain_ms += (0..outcome.tokens.len()).map(|j| score.ms_at(1, at + j)).sum::<f64>();
        forwards += 1;
        drafter.observe_cost(ForwardCost::trees(tree.len(), step_ms));
        drafter.observe(&tree, &outcome)?;
        at += outcome.tokens.len();
    }
    drafter.finish(&history);
    Ok(Replayed { plain_ms, ms, emitted: history.len() - plen - 1, forwards })
}

/// The command line.
#[derive(Default)]
struct Options {
    tokens: String,
    curve: String,
    score_path: Option<String>,
    pessimism: Option<f64>,
    explore: Option<u32>,
    per_answer: bool,
    trace: bool,
    refine: bool,
    cold: bool,
    uninformed: bool,
    prices_in: Option<String>,
    prices_out: Option<String>,
}

fn parse_args() -> Result<Options> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut o, mut positional) = (Options::default(), Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--score" => o.score_path = Some(it.next().context("--score needs a file")?.clone()),
            "--pessimism" => {
                o.pessimism = Some(it.next().context("--pessimism needs a number")?.parse::<f64>()?)
            }
            "--explore" => o.explore = Some(it.next().context("--explore needs a number")?.parse::<u32>()?),
            "--per-answer" => o.per_answer = true,
            "--trace" => o.trace = true,
            "--refine" => o.refine = true,
            "--cold" => o.cold = true,
            "--uninformed" => o.uninformed = true,
            "--prices" => o.prices_in = Some(it.next().context("--prices needs a file")?.clone()),
            "--write-prices" => {
                o.prices_out = Some(it.next().context("--write-prices needs a file")?.clone())
            }
            _ => positional.push(a.clone()),
        }
    }
    let [tokens, curve] = positional.as_slice() else {
        bail!(
            "usage: suffix_replay PLAIN-TOKENS.jsonl CURVE.json [--score CURVE.json] [--pessimism Z] [--explore N] \
             [--refine] [--per-answer] [--trace] [--cold] [--uninformed | --prices FILE] [--write-prices FILE]"
        );
    };
    if o.cold && o.prices_out.is_some() {
        bail!("--write-prices needs a warm replay: a cold one starts every answer afresh and keeps nothing");
    }
    (o.tokens, o.curve) = (tokens.clone(), curve.clone());
    Ok(o)
}

/// The prices the replay starts from: a file's, the uninformed ones, or the shipped prior.
fn starting_prices(o: &Options) -> Result<SuffixPricing> {
    Ok(match &o.prices_in {
        Some(p) => serde_json::from_str::<SuffixPricing>(
            &std::fs::read_to_string(p).with_context(|| format!("reading {p}"))?,
        )
        .with_context(|| format!("{p} holds no suffix prices"))?,
        None if o.uninformed => SuffixPricing::uninformed(),
        None => SuffixPricing::new(),
    })
}

/// One answer's replay counted in its category and in `all`.
fn tally(tallies: &mut BTreeMap<String, Tally>, category: &str, r: &Replayed) {
    for key in [category.to_string(), "all".to_string()] {
        let t = tallies.entry(key).or_default();
        t.speedups.push(r.plain_ms / r.ms);
        t.plain_ms += r.plain_ms;
        t.ms += r.ms;
        t.emitted += r.emitted;
        t.forwards += r.forwards;
    }
}

fn print_table(tallies: BTreeMap<String, Tally>) {
    println!("| category | answers | median speed-up | pooled speed-up | tokens per forward |");
    println!("|---|---:|---:|---:|---:|");
    for (category, mut t) in tallies {
        t.speedups.sort_by(f64::total_cmp);
        let median = t.speedups[t.speedups.len() / 2];
        println!(
            "| {category} | {} | {median:.2}× | {:.3}× | {:.2} |",
            t.speedups.len(),
            t.plain_ms / t.ms,
            t.emitted as f64 / t.forwards.max(1) as f64
        );
    }
}

fn main() -> Result<()> {
    let o = parse_args()?;
    let decide = read_curve(Path::new(&o.curve))?;
    let score = match &o.score_path {
        Some(p) => read_curve(Path::new(p))?,
        None => decide.clone(),
    };
    let costs =
        SharedCosts::new(CostModel { target: decide, draft: None, refine: o.refine, elsewhere: false });
    let mut config = SuffixConfig { costs: Some(costs), exclude_same_prompt: true, ..Default::default() };
    if let Some(z) = o.pessimism {
        config.pessimism = z;
    }
    if let Some(e) = o.explore {
        config.explore_every = e;
    }
    let start = starting_prices(&o)?;
    config.shared.set_pricing(start.clone());
    let fresh = |config: &SuffixConfig| -> Result<SuffixDrafter> {
        let shared = SuffixShared::with_pricing(GlobalHistory::new(DEFAULT_CAP_TOKENS)?, start.clone());
        Ok(SuffixDrafter::new(SuffixConfig { shared, ..config.clone() })?)
    };
    let mut drafter = SuffixDrafter::new(config.clone())?;
    let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
    let tokens = &o.tokens;
    let file = std::fs::read_to_string(tokens).with_context(|| format!("reading {tokens}"))?;
    for (i, line) in file.lines().enumerate() {
        let text: PlainText =
            serde_json::from_str(line).with_context(|| format!("{tokens}, line {}", i + 1))?;
        if text.output.is_empty() {
            continue;
        }
        if o.cold {
            drafter = fresh(&config)?;
        }
        let r = replay(&mut drafter, &text, &score, o.trace)?;
        if o.per_answer {
            eprintln!(
                "{}\t{}\t{:.3}\t{:.2}",
                text.prompt_id,
                text.category,
                r.plain_ms / r.ms,
                r.emitted as f64 / r.forwards.max(1) as f64
            );
        }
        tally(&mut tallies, &text.category, &r);
    }
    if let Some(p) = &o.prices_out {
        let learned = config.shared.pricing_snapshot();
        std::fs::write(p, serde_json::to_string(&learned)?).with_context(|| format!("writing {p}"))?;
    }
    print_table(tallies);
    Ok(())
}
