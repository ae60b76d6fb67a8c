//! Turn a `treespec profile --json` table into a cost-cache curve file, for replays on the curve
//! of a machine where `treespec profile` ran but nothing could be cached (`scripts/gpu-check.sh`):
//! `suffix_replay` and `TREESPEC_COSTS=file:…` read the file it writes.
//!
//! Each size costs at most what any larger measured size costs: a batch can always be padded
//! to more rows, so `T(n) = min over m ≥ n of T(m)`. That envelope keeps every measured drop and
//! removes a slow single timing (a device's first use of a kernel) without inventing a time;
//! the engine's own fit ([`treespec_core::cost::fit`]) assumes a CPU's kernel steps of four rows,
//! which a GPU's kernels do not have.
//!
//! ```sh
//! cargo run --release -p treespec-bench --example profile_curve -- PROFILE.json OUT.json
//! ```
//!
//! The profile times one cache length, so the curve's cost of context is 0 at the profiled
//! prefix: rows over a longer cache are priced as over the profiled one.

use anyhow::{bail, Context, Result};
use treespec_core::cost::CostCurve;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [profile, out] = args.as_slice() else {
        bail!("usage: profile_curve PROFILE.json OUT.json");
    };
    let text = std::fs::read_to_string(profile).with_context(|| format!("reading {profile}"))?;
    let table: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {profile}"))?;
    let mut points: Vec<(usize, f64)> = table["points"]
        .as_array()
        .with_context(|| format!("{profile} holds no points (a `treespec profile --json` table)"))?
        .iter()
        .map(|p| {
            Ok((
                p["n"].as_u64().context("a point without n")? as usize,
                p["ms"].as_f64().context("a point without ms")?,
            ))
        })
        .collect::<Result<_>>()?;
    points.sort_by_key(|p| p.0);
    // (n, as timed, lowered to)
    let mut lowered = Vec::new();
    let mut cheapest_after = f64::INFINITY;
    for p in points.iter_mut().rev() {
        if p.1 > cheapest_after {
            lowered.push((p.0, p.1, cheapest_after));
            p.1 = cheapest_after;
        }
        cheapest_after = p.1;
    }
    lowered.reverse();
    let prefix = table["prefix"].as_u64().unwrap_or(0) as usize;
    let curve = CostCurve::from_points(&points)?.with_context_cost(0.0, prefix)?;
    let file = serde_json::json!({
        "model": table["model"],
        "device": table["device"],
        "threads": table["threads"],
        "exact": false,
        "curve": curve,
        "noisy": "",
        "observations": 0,
        "lowered": lowered.iter().map(|&(n, was, _)| (n, was)).collect::<Vec<_>>(),
    });
    std::fs::write(out, serde_json::to_string_pretty(&file)?).with_context(|| format!("writing {out}"))?;
    let by_far: Vec<String> = lowered
        .iter()
        .filter(|&&(_, was, now)| was > 1.25 * now)
        .map(|(n, was, now)| format!("{n}: {was:.2} → {now:.2} ms"))
        .collect();
    eprintln!(
        "{out}: {} sizes, {} lowered to a larger size's time; by more than 25%: {}",
        points.len(),
        lowered.len(),
        if by_far.is_empty() { "none".to_string() } else { by_far.join(", ") }
    );
    Ok(())
}
