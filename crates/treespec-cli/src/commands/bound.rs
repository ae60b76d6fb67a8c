//! `treespec bound`: the best speed-up any chain of drafted tokens can reach on this machine's
//! measured cost curves (the runtime's, cached per model file; see `treespec_llama::runtime`).

use anyhow::Result;
use treespec_core::budget::lanes_chain_bound;

use super::args::ModelArgs;
use super::models::load_runtime;

/// Options of `treespec bound`.
#[derive(Debug, clap::Args)]
pub struct BoundArgs {
    #[command(flatten)]
    pub models: ModelArgs,
    /// Measured acceptance per depth (the last value repeats deeper), e.g. from a bench report's
    /// "accept rate by depth".
    #[arg(long, value_delimiter = ',', default_value = "0.8")]
    pub acceptance: Vec<f64>,
    /// Longest chain considered.
    #[arg(long = "max-k", default_value_t = 16)]
    pub max_k: usize,
    /// Requests decoding together (a serving batch): each verifies its chain in ONE target
    /// forward with the others', and the draft model either runs alone per request or is batched
    /// across them. 1 = a single request.
    #[arg(long, default_value_t = 1)]
    pub lanes: usize,
    /// Committed tokens each request's rows attend to (a long prompt makes every row dearer: the
    /// curves' context cost, measured with the profile, is added). 0 = the profiled short cache.
    #[arg(long, default_value_t = 0)]
    pub context: usize,
    /// Re-measure the cost curves instead of reading the cache.
    #[arg(long)]
    pub reprofile: bool,
}

/// `treespec bound`: the best tokens/s any chain of drafted tokens can reach on this machine's
/// measured cost curves, for the measured acceptance and for perfect acceptance, with the draft
/// model's cost and with a free draft (prompt lookup). A tree does no better than its best path
/// plus the extra rows it pays for, so when no chain beats plain decoding here, no tree does.
pub fn bound(args: BoundArgs) -> Result<()> {
    if args.acceptance.iter().any(|a| !(0.0..=1.0).contains(a)) {
        anyhow::bail!("--acceptance values must be in [0, 1]");
    }
    let runtime = load_runtime(&args.models)?;
    let costs = runtime.cost_model(runtime.has_draft(), args.reprofile)?;
    if args.lanes == 0 {
        anyhow::bail!("--lanes must be at least 1");
    }
    let n = args.lanes;
    let target = costs.target.at_context(args.context);
    let draft = costs.draft.as_ref().map(|d| d.at_context(args.context));
    if args.context > 0 {
        println!(
            "context {} tokens: +{:.1} ms per target row, +{:.1} ms per draft row",
            args.context,
            costs.target.row_surcharge(args.context),
            costs.draft.as_ref().map_or(0.0, |d| d.row_surcharge(args.context))
        );
    }
    let plain_ms = target.ms(n);
    println!(
        "target T({n}) = {plain_ms:.1} ms: {n} request(s) decoding plain together, {:.1} tok/s",
        1e3 * n as f64 / plain_ms
    );
    let mut drafts = vec![("free draft (lookup, suffix)".to_string(), 0.0)];
    if let Some(d) = &draft {
        let t1 = target.ms(1);
        println!("draft  T(1) = {:.1} ms ({:.0}% of a target step)", d.ms(1), 100.0 * d.ms(1) / t1);
        if n == 1 {
            drafts.push(("draft model".into(), d.ms(1)));
        } else {
            println!("draft  T({n}) = {:.1} ms (one draft forward for every request)", d.ms(n));
            drafts.push(("draft model, each request alone".into(), n as f64 * d.ms(1)));
            drafts.push((format!("draft model, batched across the {n}"), d.ms(n)));
        }
    }
    println!("\n| draft | acceptance | best k | tokens/step | ms/step | tok/s | vs plain |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for (name, depth_ms) in drafts {
        for (label, acc) in [("measured", args.acceptance.clone()), ("perfect", vec![1.0])] {
            let rows = lanes_chain_bound(&target, n, depth_ms, &acc, args.max_k);
            let plain = rows[0].3;
            let best = rows.iter().max_by(|a, b| a.3.total_cmp(&b.3)).expect("k = 0 is always there");
            println!(
                "| {name} | {label} | {} | {:.2} | {:.1} | {:.1} | {:.2}× |",
                best.0,
                best.1,
                best.2,
                best.3 * 1e3,
                best.3 / plain
            );
        }
    }
    Ok(())
}
