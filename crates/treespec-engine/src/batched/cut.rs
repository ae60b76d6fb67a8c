//! The cut phase of a step: the batch budget over every request's cuttable draft nodes.

use treespec_core::budget::batch_cut;

use super::Lane;

/// The batch budget: every cuttable proposal of the step (`proposed` lanes) cut together by one
/// value-ordered budget on the merged forward of `rows` rows; returns the rows dropped. Lanes
/// whose trees may not be cut keep them whole; they count as rows already in the forward.
pub(super) fn cut_together(
    lanes: &mut [&mut Lane<'_>],
    proposed: &[usize],
    rows: usize,
    prompt_rows: usize,
) -> usize {
    let mut target = None;
    let mut candidates: Vec<(f64, usize, usize)> = Vec::new(); // (value, lane, node)
    let mut cuttable: Vec<(usize, usize)> = Vec::new(); // (lane, drafted nodes)
    for &i in proposed {
        let lane = &lanes[i];
        if let Some(c) = lane.generation.cuttable(lane.drafter.as_ref()) {
            target.get_or_insert_with(|| c.target.clone());
            candidates.extend(c.values.iter().enumerate().map(|(k, &v)| (v, i, k)));
            cuttable.push((i, c.values.len()));
        }
    }
    let Some(target) = target else { return 0 };
    let cuttable_nodes: usize = cuttable.iter().map(|&(_, n)| n).sum();
    // One order over every request's nodes: by value, then (ties) each lane's arena order, so
    // the kept nodes of a lane are a prefix of its tree.
    candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.2.cmp(&b.2)).then(a.1.cmp(&b.1)));
    // Each row also costs what its request's context adds; the fixed decoding rows are priced at
    // the proposing requests' mean context surcharge (prompt chunks count as work, see
    // `batch_cut`).
    let surcharge: Vec<f64> =
        lanes.iter().map(|l| target.row_surcharge(l.generation.context_len())).collect();
    let mean = proposed.iter().map(|&i| surcharge[i]).sum::<f64>() / proposed.len().max(1) as f64;
    let nodes: Vec<(f64, f64)> = candidates.iter().map(|c| (c.0, surcharge[c.1])).collect();
    let fixed = rows - cuttable_nodes;
    let decoding = fixed.saturating_sub(prompt_rows);
    let keep = batch_cut(&target, fixed, prompt_rows, decoding as f64 * mean, proposed.len() as f64, &nodes);
    let mut kept = vec![0usize; lanes.len()];
    for &(_, i, _) in &candidates[..keep] {
        kept[i] += 1;
    }
    let mut dropped = 0;
    for (i, n) in cuttable {
        if kept[i] < n && lanes[i].generation.cut(kept[i]).is_ok() {
            dropped += n - kept[i];
        }
    }
    dropped
}
