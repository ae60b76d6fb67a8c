//! Cost-aware budgeting: how many drafted nodes a step should verify, and whether drafting more
//! can still pay.
//!
//! A step that verifies `n` drafted nodes emits `1 + Σ a_i` tokens on average (`a_i` the
//! calibrated probability that node i is accepted) and costs `T_target(n + 1)` plus the drafting
//! time. Decoding runs many steps, so the quantity to maximise is the long-run rate (tokens per
//! millisecond), a ratio of expectations. The standard way to optimise a ratio step by step
//! (Dinkelbach) is to maximise the *gain* `E[tokens] − ρ · E[ms]` for the best known rate `ρ`:
//! a node is worth verifying iff it adds more expected tokens than the time it costs is worth at
//! `ρ`. With `ρ` at least the plain-decoding rate `1 / T(1)`, plain decoding has gain 0, so a step
//! drafts only if that beats plain decoding, and the cheap steps of a measured curve (T(4) ≈ T(3)
//! on some CPUs) are found because the whole prefix range is scanned, not just the next node.
//! Time already spent drafting is sunk and does not enter the choice of `n`; it enters the
//! decision to spend it.

use crate::cost::CostCurve;
use crate::tree::{NodeId, TokenTree, ROOT};

/// The rate a step has to beat and the target's cost curve.
#[derive(Debug, Clone, Copy)]
pub struct Economics<'a> {
    /// The target's forward cost T(n).
    pub target: &'a CostCurve,
    /// Tokens per millisecond to beat (≥ plain decoding's `1 / T(1)`, or in a batch the plain
    /// batch's `(b + 1) / T(b + 1)`).
    pub rate: f64,
    /// Rows other requests already put in the same forward: this request's rows cost only what
    /// they add on top of them, `T(b + n) − T(b)`.
    pub batch_rows: usize,
    /// What each of this request's rows costs for its context, beyond the profiled curve (ms;
    /// see [`CostCurve::row_surcharge`]).
    pub row_ms: f64,
    /// Plain decoding's rate (of the whole batch, in a batch): the least `rate` can be.
    pub plain_rate: f64,
    /// The shape (rows) of the forward before, for a target whose forwards are padded to fixed
    /// shapes ([`CostCurve::padding`]): staying in it is priced at its replay.
    pub previous_shape: Option<usize>,
}

impl<'a> Economics<'a> {
    /// Economics that beat `rate`, or plain decoding, whichever is faster.
    pub fn new(target: &'a CostCurve, rate: f64) -> Self {
        Self::in_batch(target, rate, 0)
    }

    /// Economics for a request sharing its forward with `batch_rows` rows of other requests. The
    /// rate to beat is at least the whole batch's plain rate, one token per request per forward,
    /// and a node's price is what it adds to the merged forward: as the batch fills the cheap
    /// part of the curve, speculation shrinks, down to none.
    pub fn in_batch(target: &'a CostCurve, rate: f64, batch_rows: usize) -> Self {
        Self::in_batch_at(target, rate, batch_rows, 0)
    }

    /// [`Economics::in_batch`] for a request with `context` committed tokens: each of its rows
    /// costs the curve's context surcharge on top (the batch's other rows are priced at the same
    /// context, for the plain rate to beat).
    pub fn in_batch_at(target: &'a CostCurve, rate: f64, batch_rows: usize, context: usize) -> Self {
        let row_ms = target.row_surcharge(context);
        let plain = (batch_rows + 1) as f64 / target.expected_ms_at(batch_rows + 1, context);
        let rate = if rate.is_finite() { rate.max(plain) } else { plain };
        Self { target, rate, batch_rows, row_ms, plain_rate: plain, previous_shape: None }
    }

    /// These economics after a forward of `shape` rows (see [`Economics::previous_shape`]).
    pub fn after_shape(mut self, shape: Option<usize>) -> Self {
        self.previous_shape = shape;
        self
    }

    /// What a forward of `rows` rows takes on the curve as it is run: padded to its shape and
    /// priced at that shape's replay or change when the target pads, T(rows) otherwise.
    fn rows_ms(&self, rows: usize) -> f64 {
        match self.target.padding() {
            Some(p) if rows > 0 => p.padded_ms(self.target, rows, self.previous_shape),
            _ => self.target.ms(rows),
        }
    }

    /// What this request's root and `n` drafted nodes are expected to add to the forward, in ms
    /// (`T(n + 1)` alone, plus their context surcharge, times the excess that forwards of that
    /// many rows have really shown over the curve: [`CostCurve::excess`]).
    pub fn ms(&self, n: usize) -> f64 {
        let rows = match self.batch_rows {
            // Padded, the rows a bucket has room for are free and a change of shape is not.
            b if self.target.padding().is_some() => (self.rows_ms(b + n + 1) - self.rows_ms(b)).max(0.0),
            0 => self.target.ms(n + 1),
            // In a batch the curve is read as non-decreasing (its floor): what the rows add is
            // never negative, and the rows after a dip are not free.
            b => self.target.ms_floor(b + n + 1) - self.target.ms_floor(b),
        };
        (rows + (n + 1) as f64 * self.row_ms) * self.target.excess(self.batch_rows + n + 1)
    }

    /// What a whole forward of `rows` rows is expected to take on this request's context (every
    /// row at its surcharge, the batch's other rows taken at the same context as in
    /// [`Economics::in_batch_at`], times the excess of its kind): the time a timed forward is
    /// compared with.
    pub fn forward_ms(&self, rows: usize) -> f64 {
        (self.rows_ms(rows) + rows as f64 * self.row_ms) * self.target.excess(rows)
    }

    /// Gain of verifying `n` drafted nodes whose acceptance probabilities sum to `accepted`.
    pub fn gain(&self, n: usize, accepted: f64) -> f64 {
        1.0 + accepted - self.rate * self.ms(n)
    }

    /// The best number of nodes to verify out of `values` (acceptance probabilities in the order
    /// they would be taken) and its gain at `rate`. 0 nodes — plain decoding — is always a
    /// candidate.
    ///
    /// The choice maximises `tokens − λ · ms` (Dinkelbach's rule for the best long-run rate) with
    /// λ = `rate`, the rate achieved lately — unless no candidate reaches that rate. Then λ drops
    /// to the best candidate's own rate (never below plain decoding's): the achieved rate can be
    /// inflated by a run of fully accepted copies, and read as is it would pick the *cheapest*
    /// candidate, plain decoding, which has the worst rate of all, while the copy goes on.
    pub fn best_prefix(&self, values: &[f64]) -> (usize, f64) {
        // Every candidate's expected tokens and ms, read off the curve once.
        let mut tokens = 1.0;
        let mut options = Vec::with_capacity(values.len() + 1);
        options.push((tokens, self.ms(0)));
        for (i, v) in values.iter().enumerate() {
            tokens += v;
            options.push((tokens, self.ms(i + 1)));
        }
        let pick = |lambda: f64| {
            let mut best = (0, f64::NEG_INFINITY);
            for (n, &(t, ms)) in options.iter().enumerate() {
                if t - lambda * ms > best.1 {
                    best = (n, t - lambda * ms);
                }
            }
            best
        };
        let (mut n, g) = pick(self.rate);
        if g < 0.0 {
            let bar = options.iter().map(|&(t, ms)| t / ms).fold(0.0, f64::max);
            n = pick(bar.max(self.plain_rate)).0;
        }
        let (t, ms) = options[n];
        (n, t - self.rate * ms)
    }

    /// An optimistic bound on the gain reachable by drafting `levels` more depths below a frontier
    /// whose best node has acceptance `frontier_best`, each new depth accepted with probability at
    /// most `c_best`, on top of the nodes already drafted (`values`, sorted non-increasing).
    /// `forward_ms[l]` is the drafting cost of level l (the first one may feed several nodes).
    /// Only one node per new level is assumed: under greedy decoding siblings are exclusive, so a
    /// level adds at most its best path's value.
    pub fn lookahead_gain(
        &self,
        values: &[f64],
        frontier_best: f64,
        c_best: f64,
        forward_ms: &[f64],
        room: usize,
    ) -> f64 {
        let mut best = f64::NEG_INFINITY;
        let mut extra = Vec::new();
        let mut v = frontier_best;
        let mut spent = 0.0;
        for &ms in forward_ms.iter().take(room) {
            v *= c_best;
            extra.push(v);
            spent += ms;
            let merged = merge_sorted(values, &extra);
            let (_, g) = self.best_prefix(&merged);
            best = best.max(g - self.rate * spent);
        }
        best
    }
}

/// The best a chain of k drafted tokens can do on given curves: for each k, the expected tokens
/// per step `1 + Σ_{i≤k} Π_{j≤i} a_j` (`a_j` the acceptance at depth j, the last one repeated)
/// over the step time `T_target(k + 1) + k · draft_ms` — the bound the README quotes. Returns
/// `(k, expected tokens, ms, tokens per ms)` for k = 0 (plain) ..= `max_k`.
pub fn chain_bound(
    target: &CostCurve,
    draft_ms: f64,
    acceptance: &[f64],
    max_k: usize,
) -> Vec<(usize, f64, f64, f64)> {
    lanes_chain_bound(target, 1, draft_ms, acceptance, max_k)
}

/// [`chain_bound`] for `lanes` requests decoding together, each verifying a k-chain in ONE target
/// forward of `lanes · (k + 1)` rows: `lanes` times the tokens, over `T_target(lanes · (k + 1)) +
/// k · depth_ms`, where `depth_ms` is what drafting one depth for every lane costs (0 for a free
/// draft; `lanes · T_draft(1)` when each lane's draft model runs alone; `T_draft(lanes)` when the
/// draft model is batched across the lanes too). k = 0 is the batch decoding plain.
pub fn lanes_chain_bound(
    target: &CostCurve,
    lanes: usize,
    depth_ms: f64,
    acceptance: &[f64],
    max_k: usize,
) -> Vec<(usize, f64, f64, f64)> {
    let lanes = lanes.max(1);
    let mut out = Vec::with_capacity(max_k + 1);
    let (mut tokens, mut reach) = (1.0, 1.0);
    for k in 0..=max_k {
        if k > 0 {
            let a = acceptance.get(k - 1).or(acceptance.last()).copied().unwrap_or(0.0);
            reach *= a.clamp(0.0, 1.0);
            tokens += reach;
        }
        let ms = target.ms(lanes * (k + 1)) + k as f64 * depth_ms;
        out.push((k, lanes as f64 * tokens, ms, lanes as f64 * tokens / ms));
    }
    out
}

/// One budget for a whole batch: how many of the batch's cuttable draft nodes to verify.
///
/// The forward already holds `fixed_rows` rows (prompt chunks, every request's root, trees that
/// may not be cut), whose decoding rows cost `fixed_ms` beyond the curve for their contexts, and
/// which will emit `tokens` tokens; `nodes` are every cuttable node of every request as
/// (expected acceptance, its row's context surcharge), merged into one order of non-increasing
/// acceptance. The cut is the prefix that maximises the forward's rate, `(work + Σ values) /
/// ms`: a node of any request competes with every other request's next token, so the more rows
/// a batch already holds, the fewer drafts pay, down to none.
///
/// `prompt_rows` of the fixed rows are prompt chunks, and each counts as work done, worth a
/// token: a prompt row is work some request needs before it can emit anything, exactly as a
/// root row is. A server with prompts to process is saturated — every row it spends on a draft
/// is a row of waiting work it does later — so a node must be worth about as much as the rows
/// around it. On a CPU whose cost per row is flat at large batches (SmolLM2-135M Q4_1: ~2.5 ms a
/// row from 8 rows up) that means almost never: verifying 85%-accepted drafts beside prompt
/// chunks cost 5% of a 16-client server's throughput. Counted as *cost* only, a chunk made any
/// node look cheap next to the forward's few tokens; counted as *sunk* (left out of the rate),
/// nodes were priced against the decoding rows alone and rode along at 0.85 tokens a row.
///
/// The curve is read as measured, dips included: where the kernels make T(16) cheaper than
/// T(15), a 15-row forward is topped up to 16 by the best node on offer, which then costs less
/// than nothing. Each size is read at its expected time ([`CostCurve::expected_ms`]).
pub fn batch_cut(
    target: &CostCurve,
    fixed_rows: usize,
    prompt_rows: usize,
    fixed_ms: f64,
    tokens: f64,
    nodes: &[(f64, f64)],
) -> usize {
    let work = tokens + prompt_rows.min(fixed_rows) as f64;
    let mut extra = fixed_ms.max(0.0);
    let rate = |ms: f64, extra: f64, work: f64| if ms + extra > 0.0 { work / (ms + extra) } else { 0.0 };
    let mut best = (0, rate(target.expected_ms(fixed_rows), extra, work));
    let mut sum = work;
    for (i, &(v, row_ms)) in nodes.iter().enumerate() {
        sum += v;
        extra += row_ms.max(0.0);
        let r = rate(target.expected_ms(fixed_rows + i + 1), extra, sum);
        if r > best.1 {
            best = (i + 1, r);
        }
    }
    best.0
}

fn merge_sorted(a: &[f64], b: &[f64]) -> Vec<f64> {
    let mut out: Vec<f64> = a.iter().chain(b).copied().collect();
    out.sort_by(|x, y| y.total_cmp(x));
    out
}

/// The drafted nodes of `tree` in the order a verifier budget should take them: by expected
/// acceptance `value[node]` (non-increasing along every path), ties to the shallower then older
/// node, so that every prefix of the order is ancestor-closed and can be cut out with
/// [`TokenTree::retain`].
pub fn value_order(tree: &TokenTree, value: &[f64]) -> Vec<NodeId> {
    let mut ids: Vec<NodeId> = (0..tree.len()).filter(|&i| i != ROOT).collect();
    ids.sort_by(|&a, &b| {
        value[b].total_cmp(&value[a]).then(tree.node(a).depth.cmp(&tree.node(b).depth)).then(a.cmp(&b))
    });
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Draw;

    fn curve() -> CostCurve {
        // The shape measured on the 1.5B target: 3 and 4 tokens cost about the same.
        CostCurve::from_points(&[(1, 33.0), (2, 45.0), (3, 61.0), (4, 62.0), (5, 89.0), (6, 104.0)]).unwrap()
    }

    #[test]
    fn plain_decoding_has_zero_gain_and_is_kept_when_nothing_pays() {
        let c = curve();
        let e = Economics::new(&c, 0.0);
        assert!((e.rate - 1.0 / 33.0).abs() < 1e-12);
        assert_eq!(e.best_prefix(&[]), (0, 0.0));
        // 12 ms for 0.3 expected tokens: a token costs 40 ms > 33 ms.
        assert_eq!(e.best_prefix(&[0.3]).0, 0);
    }

    #[test]
    fn a_bet_that_beats_plain_only_on_the_fastest_timings_is_declined() {
        // T(2) = 45 against T(1) = 33: a node worth 0.41 tokens beats plain decoding by 3% on
        // the curve. Two-row forwards that take 45 or 53 ms in turn (the curve follows the fast
        // ones) cost 49 on average, and that makes the bet a loss once the curve has seen them;
        // one-row forwards that take their T(1) change nothing.
        let mut c = curve();
        let bet = [0.41];
        assert_eq!(Economics::new(&c, 0.0).best_prefix(&bet).0, 1);
        for i in 0..60 {
            c.observe(1, 33.0);
            c.observe(2, if i % 2 == 0 { 45.0 } else { 53.0 });
        }
        assert!(c.ms(2) < 47.0, "T(2) follows the fast forwards: {}", c.ms(2));
        assert!((c.expected_ms(2) - 49.0).abs() < 1.0, "expected {}", c.expected_ms(2));
        assert!((c.expected_ms(1) - 33.0).abs() < 1e-6);
        let e = Economics::new(&c, 0.0);
        assert!((e.ms(1) - c.expected_ms(2)).abs() < 1e-9);
        assert_eq!(e.best_prefix(&bet).0, 0);
    }

    #[test]
    fn finds_the_cheap_step_of_the_curve() {
        let c = curve();
        let e = Economics::new(&c, 0.0);
        // Node 2 costs 16 ms, node 3 then only 1 ms, node 4 another 27 ms for 0.3 tokens: take 3.
        let values = [0.9, 0.6, 0.45, 0.3, 0.2];
        let (n, g) = e.best_prefix(&values);
        assert_eq!(n, 3, "gain {g}");
        assert!((g - (1.0 + 1.95 - 62.0 / 33.0)).abs() < 1e-9);
    }

    #[test]
    fn a_rate_no_candidate_reaches_picks_the_best_rate_not_plain_decoding() {
        // The 1.5B target's shape: 16 rows cost 5.4 steps. A copy priced at 0.9 a node.
        let c =
            CostCurve::from_points(&[(1, 25.0), (4, 67.0), (8, 112.0), (16, 136.0), (32, 244.0)]).unwrap();
        let copy: Vec<f64> = (1..=31).map(|d| 0.9f64.powi(d)).collect();
        // After a run of fully accepted copies the achieved rate is 3.5× plain: no candidate
        // reaches it, and read as is, the rule would verify nothing — 1 token in 25 ms, the worst
        // rate on offer. The best rate on offer is the 15-node prefix on the curve's dip.
        let e = Economics::new(&c, 3.5 / 25.0);
        let (n, gain) = e.best_prefix(&copy);
        assert_eq!(n, 15, "gain {gain}");
        assert!(gain < 0.0, "the gain is still reported at the rate to beat: {gain}");
        // When plain decoding is the best rate on offer, it stays the choice.
        assert_eq!(e.best_prefix(&[0.1, 0.1]).0, 0);
        // In a batch the bar never drops below the batch's plain rate: a node that would slow
        // the whole forward down is not verified, however the achieved rate reads.
        let full = Economics::in_batch(&c, 10.0, 16);
        assert_eq!(full.best_prefix(&[0.3]).0, 0);
    }

    #[test]
    fn a_higher_rate_to_beat_verifies_less() {
        // 13 ms per node: worth 0.39 tokens at plain's rate, 0.59 at 1.5× plain's.
        let c = CostCurve::linear(20.0, 13.0, 8).unwrap();
        let values = [0.9, 0.6, 0.45, 0.3, 0.2];
        assert_eq!(Economics::new(&c, 0.0).best_prefix(&values).0, 3);
        assert_eq!(Economics::new(&c, 1.5 / 33.0).best_prefix(&values).0, 2);
    }

    #[test]
    fn lookahead_sees_that_two_depths_pay_where_one_does_not() {
        let c = CostCurve::from_points(&[(1, 33.0), (2, 60.0), (3, 62.0)]).unwrap();
        let e = Economics::new(&c, 0.0);
        // One more depth: 0.9 tokens for 27 + 5 ms = 0.97 tokens' worth: a loss.
        let one = e.lookahead_gain(&[], 1.0, 0.9, &[5.0], 8);
        assert!(one < 0.0, "{one}");
        // Two: 1.71 tokens for 29 + 10 ms: a win.
        let two = e.lookahead_gain(&[], 1.0, 0.9, &[5.0, 5.0], 8);
        assert!(two > 0.0, "{two}");
        // No room, no gain.
        assert_eq!(e.lookahead_gain(&[], 1.0, 0.9, &[5.0, 5.0], 0), f64::NEG_INFINITY);
    }

    #[test]
    fn chain_bound_adds_reached_acceptance_and_draft_time() {
        let c = CostCurve::linear(20.0, 10.0, 8).unwrap();
        let b = chain_bound(&c, 5.0, &[0.5], 2);
        assert_eq!(b.len(), 3);
        assert_eq!((b[0].1, b[0].2), (1.0, 30.0));
        assert_eq!((b[1].1, b[1].2), (1.5, 45.0));
        assert_eq!((b[2].1, b[2].2), (1.75, 60.0));
        assert!((b[2].3 - 1.75 / 60.0).abs() < 1e-12);
    }

    #[test]
    fn a_batch_cut_keeps_what_pays_on_the_merged_forward_and_nothing_once_rows_are_dear() {
        // 1 row 30 ms, 2..=4 rows 40 ms, then 25 ms a row; a dip at 6 (kernel change).
        let c = CostCurve::from_points(&[(1, 30.0), (2, 40.0), (4, 40.0), (5, 65.0), (6, 60.0), (8, 110.0)])
            .unwrap();
        // Alone: 3 good nodes ride the flat part of the curve, the weak 4th does not pay.
        assert_eq!(batch_cut(&c, 1, 0, 0.0, 1.0, &free(&[0.9, 0.8, 0.7, 0.1])), 3);
        // Four requests' roots already fill the flat part: 0.9 more tokens for 25 ms is less than
        // the batch's 4 tokens / 40 ms, so nothing is drafted.
        assert_eq!(batch_cut(&c, 4, 0, 0.0, 4.0, &free(&[0.9, 0.8])), 0);
        // A row onto the dip (T(6) = 60 < T(5) = 65) makes the forward faster: even a node worth
        // nothing is verified, one worth something all the more; past the dip rows cost again.
        assert_eq!(batch_cut(&c, 5, 0, 0.0, 5.0, &free(&[0.0])), 1);
        assert_eq!(batch_cut(&c, 5, 0, 0.0, 5.0, &free(&[0.3, 0.2, 0.1])), 1);
        // No candidates, or no rows at all: nothing to cut.
        assert_eq!(batch_cut(&c, 3, 0, 0.0, 3.0, &[]), 0);
        assert_eq!(batch_cut(&c, 0, 0, 0.0, 0.0, &[]), 0);
        // Two requests: a near-certain copy pays up to the end of the flat part, not past it.
        assert_eq!(batch_cut(&c, 2, 0, 0.0, 2.0, &free(&[1.0; 4])), 2);
        // On the flat part a weak third node rides free; on a long context each row costs 20 ms
        // more, and 0.3 tokens for 20 ms is below the 2.7 tokens / 100 ms of the first two.
        assert_eq!(batch_cut(&c, 1, 0, 0.0, 1.0, &free(&[0.9, 0.8, 0.3])), 3);
        let long: Vec<(f64, f64)> = [0.9, 0.8, 0.3].iter().map(|&v| (v, 20.0)).collect();
        assert_eq!(batch_cut(&c, 1, 0, 20.0, 1.0, &long), 2);
    }

    #[test]
    fn prompt_rows_in_the_forward_are_work_a_node_must_match() {
        // 16 decoding rows cost 140 ms; far out the curve costs 5.5 ms a row, below its average.
        let c = CostCurve::from_points(&[(1, 29.0), (16, 140.0), (272, 1_550.0), (273, 1_555.5)]).unwrap();
        let weak = free(&[0.3, 0.2, 0.1]);
        // With a 256-token chunk counted as cost only, 16 tokens / 1,550 ms is so slow that a
        // node worth 0.1 tokens for 5.5 ms looks like a bargain: all three are verified.
        assert_eq!(batch_cut(&c, 272, 0, 0.0, 16.0, &weak), 3);
        // Counted as work, the chunk makes the forward 272 rows' worth in 1,550 ms (0.175 a ms):
        // weak nodes do not pay, and neither does a 0.9 one (0.16 a ms); a near-certain one does
        // (0.18 a ms), as it would in decoding alone.
        assert_eq!(batch_cut(&c, 272, 256, 0.0, 16.0, &weak), 0);
        assert_eq!(batch_cut(&c, 272, 256, 0.0, 16.0, &free(&[0.9])), 0);
        assert_eq!(batch_cut(&c, 272, 256, 0.0, 16.0, &free(&[1.0, 0.3])), 1);
        // A curve whose next row costs more than its average one (7 ms against 5.9): beside a
        // chunk not even a certain node pays — a saturated server verifies no drafts.
        let flat = CostCurve::from_points(&[(1, 29.0), (16, 140.0), (272, 1_600.0), (273, 1_607.0)]).unwrap();
        assert_eq!(batch_cut(&flat, 272, 256, 0.0, 16.0, &free(&[1.0])), 0);
        // Decoding alone (16 tokens / 140 ms) still takes a near-certain node.
        assert_eq!(batch_cut(&flat, 16, 0, 0.0, 16.0, &weak), 0);
        assert_eq!(batch_cut(&flat, 16, 0, 0.0, 16.0, &free(&[0.95, 0.3])), 1);
    }

    fn free(values: &[f64]) -> Vec<(f64, f64)> {
        values.iter().map(|&v| (v, 0.0)).collect()
    }

    #[test]
    fn a_long_context_prices_every_row_of_the_request_dearer() {
        let c = CostCurve::from_points(&[(1, 25.0), (4, 67.0), (16, 136.0)])
            .unwrap()
            .with_context_cost(0.003, 64)
            .unwrap();
        let short = Economics::in_batch_at(&c, 0.0, 0, 64);
        let long = Economics::in_batch_at(&c, 0.0, 0, 4064);
        assert_eq!(short.ms(3), 67.0);
        assert!((long.ms(3) - (67.0 + 4.0 * 12.0)).abs() < 1e-9);
        // Plain decoding there is slower too: the rate to beat is one token per 37 ms.
        assert!((long.rate - 1.0 / 37.0).abs() < 1e-12);
        // Three nodes accepted 0.6 each: on the short cache 2.8 tokens in 67 ms beat 1 in 25; on
        // the long one 2.8 in 115 ms (and any shorter prefix) lose to 1 in 37.
        assert_eq!(short.best_prefix(&[0.6, 0.6, 0.6]).0, 3);
        assert_eq!(long.best_prefix(&[0.6, 0.6, 0.6]).0, 0);
    }

    #[test]
    fn batched_economics_read_the_curve_as_non_decreasing() {
        let c = CostCurve::from_points(&[(1, 30.0), (4, 60.0), (5, 90.0), (6, 80.0), (7, 100.0)]).unwrap();
        let e = Economics::in_batch(&c, 0.0, 4);
        // T(6) dips below T(5): on the floor, T(5) reads 80 (a fifth row can be topped up to the
        // sixth), so one row on top of 4 costs 20 ms and two cost 20, never less than one.
        assert!((e.ms(0) - 20.0).abs() < 1e-9);
        assert!((e.ms(1) - 20.0).abs() < 1e-9);
        // Past the dip rows cost again: the seventh is 20 ms more, not free under a peak of 90.
        assert!((e.ms(2) - 40.0).abs() < 1e-9);
    }

    #[test]
    fn a_batched_draft_is_priced_once_per_depth_for_every_lane() {
        let target = CostCurve::linear(20.0, 5.0, 64).unwrap();
        // One lane: exactly the single-request bound.
        assert_eq!(lanes_chain_bound(&target, 1, 7.0, &[0.8], 4), chain_bound(&target, 7.0, &[0.8], 4));
        // Four lanes, k = 2, acceptance 0.5: 4 × 1.75 tokens over T(12) + 2 depths.
        let alone = lanes_chain_bound(&target, 4, 4.0 * 10.0, &[0.5], 2);
        let batched = lanes_chain_bound(&target, 4, 16.0, &[0.5], 2);
        assert_eq!(alone[0], batched[0], "k = 0 is the batch decoding plain");
        assert!((alone[0].3 - 4.0 / 40.0).abs() < 1e-12);
        assert!((batched[2].1 - 7.0).abs() < 1e-12);
        assert!((batched[2].2 - (80.0 + 32.0)).abs() < 1e-12);
        assert!((alone[2].2 - (80.0 + 80.0)).abs() < 1e-12);
        assert!(batched[2].3 > alone[2].3);
    }

    #[test]
    fn value_order_prefixes_are_ancestor_closed() {
        let mut t = TokenTree::new(0);
        let a = t.add(ROOT, 1, Draw::Deterministic, 1.0).unwrap();
        let b = t.add(a, 2, Draw::Deterministic, 1.0).unwrap();
        let c = t.add(ROOT, 3, Draw::Deterministic, 1.0).unwrap();
        let d = t.add(b, 4, Draw::Deterministic, 1.0).unwrap();
        // Ties (acceptance 1 all the way down) must still put parents first.
        let value = vec![1.0, 1.0, 1.0, 0.5, 1.0];
        let order = value_order(&t, &value);
        assert_eq!(order, vec![a, b, d, c]);
        for k in 0..=order.len() {
            assert!(t.retain(&order[..k]).is_ok());
        }
    }

    #[test]
    fn a_full_batch_prices_nodes_at_their_marginal_cost() {
        // T(n) = 20 + 13n alone pays for a node accepted 0.9; past a knee at 16 rows every row
        // costs 40 ms, and the batch's plain rate is high, so the same node no longer pays.
        let c = CostCurve::from_points(&[(1, 33.0), (16, 228.0), (32, 868.0)]).unwrap();
        let alone = Economics::new(&c, 0.0);
        assert_eq!(alone.ms(0), c.ms(1));
        assert_eq!(alone.best_prefix(&[0.9]).0, 1);
        let full = Economics::in_batch(&c, 0.0, 16);
        assert!((full.ms(0) - (c.ms(17) - c.ms(16))).abs() < 1e-9);
        assert!(full.rate > alone.rate);
        assert_eq!(full.best_prefix(&[0.9]).0, 0);
    }

    #[test]
    fn a_padded_target_fills_its_bucket_when_the_step_before_had_that_shape() {
        use crate::cost::shapes::{ShapeBuckets, ShapeTime, ShapeTimes};
        // A device: 2 ms a replayed shape of any bucket, 6 ms a changed one.
        let c = CostCurve::from_points(&[(1, 2.0), (8, 5.0), (16, 6.0)]).unwrap();
        let b = ShapeBuckets::new(&[8, 16]).unwrap();
        let t = |rows| ShapeTime { rows, changed_ms: 6.0, replayed_ms: 2.0 + rows as f64 * 0.01 };
        let shapes = ShapeTimes::new(b, vec![t(1), t(8), t(16)]).unwrap().activated(true);
        let padded = c.clone().with_shapes(Some(shapes));
        let staying = Economics::new(&padded, 0.0).after_shape(Some(8));
        // The root and up to six drafted nodes run as the 8-row bucket, replayed.
        assert_eq!(staying.ms(1), staying.ms(6));
        assert!((staying.ms(6) - 2.08).abs() < 1e-9);
        // A seventh node needs the 16-row bucket: a change of shape.
        assert_eq!(staying.ms(7), 6.0);
        // After a plain step the same tree switches shape.
        assert_eq!(Economics::new(&padded, 0.0).after_shape(Some(1)).ms(6), 6.0);
        // Nodes nearly free in the bucket: low-value ones pay when staying, not when switching.
        let values = [0.9, 0.5, 0.2, 0.1, 0.05, 0.05];
        assert_eq!(staying.best_prefix(&values).0, 6);
        // Unpadded, the same curve prices each row.
        assert!(Economics::new(&c, 0.0).ms(6) > 4.0);
    }
}
