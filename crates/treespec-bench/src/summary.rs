//! Aggregation: one summary row per (method, category) and per method over all prompts.
//!
//! Definitions (a group is the runs of one method in one category, or in all categories):
//!
//! - `tokens_per_s`: the **median** over the group's runs (every prompt × every repeat) of each
//!   run's decoding speed (new tokens / (wall − prefill)). An even count takes the mean of the two
//!   middle values. `tokens_per_s_min` / `_max`: the smallest and largest run in the group.
//! - `speedup_vs_plain`: `tokens_per_s` of the method ÷ `tokens_per_s` of `plain` for the same
//!   category, i.e. the ratio of the two medians, over the same prompts and repeats (every method
//!   runs every selected prompt). `plain` itself is 1. `speedup_min` / `_max`: the smallest and
//!   largest *paired* ratio, run of the method ÷ plain's run of the same prompt and repeat: the
//!   spread of the speed-up across prompts and machine noise.
//! - `mean_accepted`: pooled over the group, Σ emitted tokens ÷ Σ target forwards (bonus token
//!   included, so 1.0 = no gain); `accept_rate_by_depth[d-1]`: Σ walks that accepted at depth d ÷
//!   Σ walks that reached depth d with a candidate.
//! - `draft_ms_per_step`: Σ drafting time ÷ Σ target forwards (decode steps); `verify_ms_per_step`:
//!   Σ (target forward + accept/reject walk) ÷ steps, the cost of checking one tree;
//!   `target_forward_ms_per_step` is the forward part alone.
//! - `identical_runs`: runs whose tokens equal plain's (temperature 0 only, else null).

use std::collections::BTreeMap;

use crate::record::{run_categories, run_methods, RunRecord};
pub use crate::record::{SummaryRow, ALL};

/// Median (mean of the two middle values for an even count); 0 for no values.
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn min_max(values: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    values.into_iter().fold(None, |acc, x| match acc {
        None => Some((x, x)),
        Some((lo, hi)) => Some((lo.min(x), hi.max(x))),
    })
}

/// Summary rows: for each method, one row over all prompts ("all") and one per category.
pub fn summarize(runs: &[RunRecord]) -> Vec<SummaryRow> {
    let methods = run_methods(runs);
    let mut cats = vec![ALL.to_string()];
    cats.extend(run_categories(runs));
    // Plain's runs by (prompt, category, repeat), for the paired ratios.
    let plain: BTreeMap<(&str, &str, usize), &RunRecord> = runs
        .iter()
        .filter(|r| r.method == "plain")
        .map(|r| ((r.prompt_id.as_str(), r.category.as_str(), r.repeat), r))
        .collect();
    let mut rows = Vec::new();
    for m in &methods {
        for c in &cats {
            let group: Vec<&RunRecord> =
                runs.iter().filter(|r| &r.method == m && (c == ALL || &r.category == c)).collect();
            if group.is_empty() {
                continue;
            }
            rows.push(row(m, c, &group, &plain));
        }
    }
    rows
}

fn row(
    method: &str,
    category: &str,
    group: &[&RunRecord],
    plain: &BTreeMap<(&str, &str, usize), &RunRecord>,
) -> SummaryRow {
    let tps: Vec<f64> = group.iter().map(|r| r.tokens_per_s).collect();
    let (lo, hi) = min_max(tps.iter().copied()).unwrap_or((0.0, 0.0));
    let med = median(&tps);
    let paired: Vec<(&RunRecord, &RunRecord)> = group
        .iter()
        .filter_map(|r| plain.get(&(r.prompt_id.as_str(), r.category.as_str(), r.repeat)).map(|p| (*r, *p)))
        .collect();
    let plain_med = median(&paired.iter().map(|(_, p)| p.tokens_per_s).collect::<Vec<_>>());
    let speedup = (plain_med > 0.0 && paired.len() == group.len()).then(|| med / plain_med);
    let ratios =
        paired.iter().filter(|(_, p)| p.tokens_per_s > 0.0).map(|(r, p)| r.tokens_per_s / p.tokens_per_s);
    let spread = min_max(ratios);

    let steps: u64 = group.iter().map(|r| r.target_forwards).sum();
    let emitted: u64 = group.iter().map(|r| r.emitted).sum();
    let per_step = |f: &dyn Fn(&RunRecord) -> f64| {
        if steps == 0 {
            0.0
        } else {
            group.iter().map(|r| f(r)).sum::<f64>() / steps as f64 * 1000.0
        }
    };
    let depth = group.iter().map(|r| r.depth_reached.len()).max().unwrap_or(0);
    let mut reached = vec![0u64; depth];
    let mut accepted = vec![0u64; depth];
    for r in group {
        for (d, (&n, &a)) in r.depth_reached.iter().zip(&r.depth_accepted).enumerate() {
            reached[d] += n;
            accepted[d] += a;
        }
    }
    let rates = reached.iter().zip(&accepted).map(|(&n, &a)| if n == 0 { 0.0 } else { a as f64 / n as f64 });
    let mut prompts: Vec<(&str, &str)> =
        group.iter().map(|r| (r.category.as_str(), r.prompt_id.as_str())).collect();
    prompts.sort_unstable();
    prompts.dedup();
    let identical = group
        .iter()
        .all(|r| r.identical_to_plain.is_some())
        .then(|| group.iter().filter(|r| r.identical_to_plain == Some(true)).count());
    SummaryRow {
        method: method.to_string(),
        category: category.to_string(),
        n_prompts: prompts.len(),
        n_runs: group.len(),
        tokens_per_s: med,
        tokens_per_s_min: lo,
        tokens_per_s_max: hi,
        plain_tokens_per_s: plain_med,
        speedup_vs_plain: speedup,
        speedup_min: spread.map(|s| s.0),
        speedup_max: spread.map(|s| s.1),
        mean_accepted: if steps == 0 { 0.0 } else { emitted as f64 / steps as f64 },
        accept_rate_by_depth: rates.collect(),
        depth_reached: reached,
        draft_ms_per_step: per_step(&|r| r.draft_s),
        verify_ms_per_step: per_step(&|r| r.target_s + r.verify_s),
        target_forward_ms_per_step: per_step(&|r| r.target_s),
        new_tokens: group.iter().map(|r| r.new_tokens).sum(),
        target_forwards: steps,
        graph_reuses: group.iter().map(|r| r.graph_reuses).sum(),
        draft_forwards: group.iter().map(|r| r.draft_forwards).sum(),
        identical_runs: identical,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(
        method: &str,
        prompt: &str,
        cat: &str,
        repeat: usize,
        tps: f64,
        emitted: u64,
        steps: u64,
    ) -> RunRecord {
        RunRecord {
            method: method.into(),
            prompt_id: prompt.into(),
            category: cat.into(),
            repeat,
            tokens_per_s: tps,
            emitted,
            target_forwards: steps,
            depth_reached: vec![steps, steps / 2],
            depth_accepted: vec![steps / 2, steps / 4],
            draft_s: 0.5,
            target_s: 1.0,
            verify_s: 0.25,
            identical_to_plain: Some(true),
            ..RunRecord::default()
        }
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn rows_use_medians_pooled_acceptance_and_paired_spread() {
        let runs = vec![
            run("plain", "1", "a", 0, 10.0, 10, 10),
            run("chain", "1", "a", 0, 30.0, 10, 4),
            run("plain", "2", "a", 0, 20.0, 10, 10),
            run("chain", "2", "a", 0, 20.0, 10, 6),
            run("plain", "3", "b", 0, 40.0, 10, 10),
            run("chain", "3", "b", 0, 60.0, 10, 5),
        ];
        let rows = summarize(&runs);
        assert_eq!(rows.len(), 6);
        let get = |m: &str, c: &str| rows.iter().find(|r| r.method == m && r.category == c).unwrap();
        let all = get("chain", ALL);
        assert_eq!((all.n_runs, all.n_prompts), (3, 3));
        assert_eq!(all.tokens_per_s, 30.0);
        assert_eq!(all.plain_tokens_per_s, 20.0);
        assert_eq!(all.speedup_vs_plain, Some(1.5));
        assert_eq!((all.speedup_min, all.speedup_max), (Some(1.0), Some(3.0)));
        assert_eq!((all.tokens_per_s_min, all.tokens_per_s_max), (20.0, 60.0));
        assert_eq!(all.mean_accepted, 30.0 / 15.0);
        assert_eq!(all.draft_ms_per_step, 1.5 / 15.0 * 1000.0);
        assert_eq!(all.verify_ms_per_step, 3.75 / 15.0 * 1000.0);
        assert_eq!(all.identical_runs, Some(3));
        let a = get("chain", "a");
        assert_eq!(a.speedup_vs_plain, Some(25.0 / 15.0));
        assert_eq!(a.depth_reached, vec![10, 5]);
        assert_eq!(a.accept_rate_by_depth, vec![5.0 / 10.0, 2.0 / 5.0]);
        assert_eq!(get("plain", "b").speedup_vs_plain, Some(1.0));
    }
}
