//! The state a cost-aware drafter carries between steps: the measured cost curves, the online
//! calibration of its confidence into acceptance, and the rate it has been achieving.
//!
//! The decisions themselves are pure functions in `treespec_core::budget`; this module feeds them
//! with what the engine measures (forward times, verify outcomes) and keeps the running estimates.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use treespec_core::budget::{chain_bound, Economics};
use treespec_core::cost::CostCurve;
use treespec_core::online_calibration::{AcceptanceCalibrator, DEPTHS};
use treespec_core::tree::{NodeId, TokenTree, ROOT};
use treespec_core::verify::VerifyOutcome;

use crate::drafter::ForwardCost;
use crate::extra_stats::{BudgetDecisions, CalibratedAcceptance, ExtraStats};

/// Decay per step of the running token and time sums behind the achieved rate.
const RATE_DECAY: f64 = 0.95;
/// A step that decided not to draft drafts anyway after this many such steps, so acceptance
/// estimates that were too pessimistic (or text that got easier) are noticed. A probe is not
/// cheap (the draft model first catches up on every token it skipped), so each probe that does
/// not lead to drafting doubles the interval, up to `PROBE_MAX`.
const PROBE_FIRST: u32 = 16;
const PROBE_MAX: u32 = 256;

/// Calibration trials a drafter needs before [`AutoBudget::chain_can_pay`] may say no.
const GATE_TRIALS: u64 = 64;
/// Longest chain [`AutoBudget::chain_can_pay`] considers.
const GATE_CHAIN: usize = 16;
/// Acceptance per depth that a draft model not yet tried is priced at where a cost is paid before
/// any of its nodes is seen (catching it up on the text: [`AutoBudget::catch_up_gain`]). An
/// empty calibrator rates its top confidence bin near 1, which is right for a step's own draft
/// (cut to what pays once drafted) and wrong for a prefill: read at 1, every cold code answer of
/// the Qwen 0.5B/1.5B pair on a 2-core Xeon caught the draft up (570–710 ms, 9–11 plain steps)
/// to draft at 0.9–0.95 where the curve pays only above 0.95, and lost 5–12% of its answer.
/// 0.9 is the top of that pair's measured acceptance (0.82–0.90 per depth).
const UNTRIED_ACCEPTANCE: f64 = 0.9;

/// Measured forward costs of the target and (if any) the draft model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// Target T(n), all rows with logits (a verify batch).
    pub target: CostCurve,
    /// Draft model T(n), all rows with logits; `None` for model-free drafters.
    pub draft: Option<CostCurve>,
    /// Refine the curves and the achieved rate from the forwards actually timed (the default).
    /// Off, the curves are taken as given: reproducible decisions for tests and what-if runs.
    #[serde(default = "refine_default")]
    pub refine: bool,
    /// The curves are another machine's (a GPU's, `TREESPEC_COSTS=file:`): a step costs what
    /// they say, not what this machine's clock says, so the choices made are that machine's.
    #[serde(default)]
    pub elsewhere: bool,
}

fn refine_default() -> bool {
    true
}

impl CostModel {
    /// Curves refined online.
    pub fn new(target: CostCurve, draft: Option<CostCurve>) -> Self {
        Self { target, draft, refine: true, elsewhere: false }
    }
}

/// Counters of a cost-aware drafter, for reports.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AutoStats {
    /// Steps that verified no drafted node (plain decoding), drafting skipped or pruned away.
    pub plain_steps: u64,
    /// Steps that skipped the draft model entirely.
    pub skipped_drafts: u64,
    /// Drafted nodes pruned by the budget before verification.
    pub pruned: u64,
}

/// What a cost-aware drafter has learned: refined curves, calibration, achieved rate.
#[derive(Debug, Clone)]
struct Learned {
    costs: CostModel,
    calib: AcceptanceCalibrator,
    tokens: f64,
    ms: f64,
}

/// The measured curves of one method, plus what its drafters have learned so far, shared by
/// every drafter built from that method: a server's requests and a benchmark's prompts each
/// start from the calibration and refined curves the previous ones left, instead of relearning.
#[derive(Debug)]
pub struct SharedCosts {
    initial: CostModel,
    learned: Mutex<HashMap<&'static str, Learned>>,
}

impl SharedCosts {
    /// Shared state starting from measured curves.
    pub fn new(costs: CostModel) -> Arc<Self> {
        Arc::new(Self { initial: costs, learned: Mutex::new(HashMap::new()) })
    }

    /// The curves as measured.
    pub fn initial(&self) -> &CostModel {
        &self.initial
    }

    fn load(&self, role: &'static str) -> Option<Learned> {
        self.learned.lock().unwrap_or_else(|p| p.into_inner()).get(role).cloned()
    }

    fn store(&self, role: &'static str, learned: Learned) {
        self.learned.lock().unwrap_or_else(|p| p.into_inner()).insert(role, learned);
    }
}

/// Two handles are equal when they share the same state.
impl PartialEq for SharedCosts {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

/// Cost model + calibration + achieved rate.
#[derive(Debug, Clone)]
pub struct AutoBudget {
    shared: Option<(Arc<SharedCosts>, &'static str)>,
    costs: CostModel,
    calib: AcceptanceCalibrator,
    tokens: f64,
    ms: f64,
    /// Forward time of the step under way, joining `ms` when the step is observed: added to
    /// `ms` straight away, each step's time was decayed once more than its tokens, and the
    /// achieved rate read 1/0.95 of what it was (plain decoding at 29 ms a token read 28),
    /// a bar that even plain decoding missed by 5%.
    step_ms: f64,
    since_draft: u32,
    probe_every: u32,
    /// Raw conditional confidence of each node of the tree last proposed (root: 1).
    raw: Vec<f64>,
    /// Other requests' rows in the coming forward (set per step by the drafter).
    batch_rows: usize,
    /// Committed tokens this request's rows attend to in the coming forward (set per step).
    context: usize,
    /// The shape of the last target forward, when the target pads to fixed shapes: the next
    /// step is priced at that shape's replay if it stays in it.
    previous_shape: Option<usize>,
    /// Counters since the last `begin`.
    pub stats: AutoStats,
}

impl AutoBudget {
    /// A budget for the drafter role `role` (e.g. "model", "lookup") of a method: it starts from
    /// what earlier drafters of the same role learned, and leaves its own learning there.
    pub fn shared(shared: Arc<SharedCosts>, role: &'static str, draft: bool) -> Self {
        let mut costs = shared.initial().clone();
        if !draft {
            costs.draft = None;
        }
        let mut b = Self::new(costs);
        if let Some(l) = shared.load(role) {
            b.costs = l.costs;
            b.calib = l.calib;
            b.tokens = l.tokens;
            b.ms = l.ms;
        }
        b.shared = Some((shared, role));
        b
    }

    /// Start from measured curves; the calibration starts empty (raw confidences) and persists
    /// across generations, as the curves do.
    pub fn new(costs: CostModel) -> Self {
        Self {
            shared: None,
            costs,
            calib: AcceptanceCalibrator::new(),
            tokens: 0.0,
            ms: 0.0,
            step_ms: 0.0,
            since_draft: 0,
            probe_every: PROBE_FIRST,
            raw: Vec::new(),
            batch_rows: 0,
            previous_shape: None,
            context: 0,
            stats: AutoStats::default(),
        }
    }

    /// Reset the per-generation counters (curves, calibration and rate are kept).
    pub fn begin(&mut self) {
        self.stats = AutoStats::default();
        self.raw.clear();
    }

    /// The calibration.
    pub fn calibrator(&self) -> &AcceptanceCalibrator {
        &self.calib
    }

    /// The achieved rate in tokens per ms over recent steps (`None` before the first step).
    pub fn achieved_rate(&self) -> Option<f64> {
        (self.ms > 0.0).then(|| self.tokens / self.ms)
    }

    /// The economics of the next step: beat the achieved rate, and at least plain decoding (of
    /// the whole batch, when other requests share the forward).
    pub fn economics(&self) -> Economics<'_> {
        let rate = self.achieved_rate().unwrap_or(0.0);
        Economics::in_batch_at(&self.costs.target, rate, self.batch_rows, self.context)
            .after_shape(self.previous_shape)
    }

    /// The target's cost curve as refined so far.
    pub fn target(&self) -> &CostCurve {
        &self.costs.target
    }

    /// The next forward holds `rows` rows of other requests besides this one's (0 alone), and
    /// this request's rows attend to `context` committed tokens (a long context makes every row
    /// dearer: see [`CostCurve::row_surcharge`]).
    pub fn set_forward(&mut self, rows: usize, context: usize) {
        self.batch_rows = rows;
        self.context = context;
    }

    /// Calibrated P(accept | parent accepted) of a node at `depth` with raw confidence `r`.
    pub fn acceptance(&self, depth: usize, r: f64) -> f64 {
        self.calib.acceptance(depth, r)
    }

    /// Optimistic acceptance at `depth` (for nodes not drafted yet).
    pub fn best_acceptance(&self, depth: usize) -> f64 {
        self.calib.best_acceptance(depth)
    }

    /// Draft forward cost of `n` rows (0 without a draft curve).
    pub fn draft_cost(&self, n: usize) -> f64 {
        self.costs.draft.as_ref().map_or(0.0, |c| c.expected_ms_at(n, self.context))
    }

    /// Whether any chain of draft-model tokens could beat the rate to beat, at the acceptance
    /// observed per depth and the draft's measured cost per token (the bound `treespec bound`
    /// prints). It answers yes until enough trials were seen, and for model-free drafters. When
    /// it says no, even the best-shaped draft loses to plain decoding on this machine: the draft
    /// model should not run at all, because once a step has started drafting, the time spent is
    /// sunk and each further depth looks cheap on its own.
    pub fn chain_can_pay(&self) -> bool {
        if self.calib.total_trials() < GATE_TRIALS {
            return true;
        }
        let acceptance: Vec<f64> = self
            .calib
            .per_depth()
            .iter()
            .enumerate()
            .map(|(d, a)| a.unwrap_or_else(|| self.calib.best_acceptance(d + 1)))
            .collect();
        self.chain_beats_rate(&acceptance)
    }

    /// What catching the draft model up is expected to earn over the `tokens` still to come, in
    /// tokens at the rate to beat: a step of the best chain (up to `GATE_CHAIN` tokens, each depth
    /// accepted as observed, [`UNTRIED_ACCEPTANCE`] before any trial) gains its expected tokens
    /// less its time at the rate, beyond `bar` (the best free offer's gain), and the tokens last
    /// `tokens ÷ expected tokens` such steps. 0 when no chain gains.
    pub fn catch_up_gain(&self, tokens: f64, bar: f64) -> f64 {
        let rate = self.economics().rate;
        let acceptance: Vec<f64> =
            (1..=DEPTHS).map(|d| self.calib.expected_acceptance(d, UNTRIED_ACCEPTANCE)).collect();
        self.chains(self.draft_cost(1), &acceptance)
            .map(|(_, expected, ms, _)| (expected - rate * ms - bar) * tokens / expected)
            .fold(0.0, f64::max)
    }

    /// The draft-model chains of 1 to `GATE_CHAIN` tokens on the target's curve at this context,
    /// each drafted token costing `draft_ms`: `(k, expected tokens, ms, tokens per ms)`.
    fn chains(&self, draft_ms: f64, acceptance: &[f64]) -> impl Iterator<Item = (usize, f64, f64, f64)> {
        let target = self.costs.target.at_context(self.context);
        chain_bound(&target, draft_ms, acceptance, GATE_CHAIN).into_iter().skip(1)
    }

    /// Whether some draft-model chain of up to `GATE_CHAIN` tokens, accepted per depth as
    /// `acceptance` says, beats the rate to beat (always yes without a draft model).
    fn chain_beats_rate(&self, acceptance: &[f64]) -> bool {
        let Some(draft) = &self.costs.draft else { return true };
        let rate = self.economics().rate;
        self.chains(draft.ms_at(1, self.context), acceptance).any(|b| b.3 > rate)
    }

    /// Whether this step should draft although the estimates say it will not pay (a probe).
    pub fn probe_due(&self) -> bool {
        self.since_draft >= self.probe_every
    }

    /// Note the step's decision: `paid` = the estimates said drafting pays, `drafted` = the
    /// draft model ran (because it pays, or as a probe).
    pub fn note_drafting(&mut self, paid: bool, drafted: bool) {
        if paid {
            self.probe_every = PROBE_FIRST;
        } else if drafted {
            self.probe_every = (self.probe_every * 2).min(PROBE_MAX);
        }
        if drafted {
            self.since_draft = 0;
        } else {
            self.since_draft += 1;
            self.stats.skipped_drafts += 1;
        }
    }

    /// Remember the raw conditional confidence of every node of the tree about to be verified
    /// (index = node id; the root's entry is ignored).
    pub fn set_raw(&mut self, raw: Vec<f64>) {
        self.raw = raw;
    }

    /// Fold a timed target forward into the target curve (when it timed one of its sizes) and
    /// into the step's time.
    pub fn observe_target(&mut self, forward: ForwardCost) {
        // A padded forward ran as its shape, replayed or not: its time is the shape's, not
        // T(rows), and does not refine the curve.
        self.previous_shape = self.costs.target.padding().map(|p| p.buckets.shape(forward.rows));
        if self.costs.refine {
            if let Some(rows) = forward.timed_rows().filter(|_| self.previous_shape.is_none()) {
                // The batch's other rows are taken at this request's context: an approximation
                // that only matters when contexts in one forward differ widely.
                self.costs.target.observe_at(rows, forward.ms(), self.context);
            }
            self.step_ms += forward.ms();
        }
    }

    /// Fold a timed draft forward into the draft curve.
    pub fn observe_draft(&mut self, rows: usize, ms: f64) {
        if !self.costs.refine {
            return;
        }
        if let Some(c) = self.costs.draft.as_mut() {
            c.observe_at(rows, ms, self.context);
        }
        self.step_ms += ms;
    }

    /// Learn from a verified step: every drafted node whose parent was accepted is one trial of
    /// the calibration, and the emitted tokens count toward the achieved rate.
    pub fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) {
        if tree.drafted() == 0 {
            self.stats.plain_steps += 1;
        }
        let mut accepted = vec![false; tree.len()];
        accepted[ROOT] = true;
        for &n in &outcome.accepted {
            accepted[n] = true;
        }
        // The tree verified is the one the raw confidences were noted for or (auto's combined
        // tree) that tree with other nodes appended: its nodes keep their ids, and under greedy
        // decoding their acceptance does not depend on the nodes added after them.
        if !self.raw.is_empty() && self.raw.len() <= tree.len() {
            for (id, node) in tree.nodes().iter().enumerate().take(self.raw.len()).skip(1) {
                let parent: NodeId = node.parent.unwrap_or(ROOT);
                if accepted[parent] {
                    self.calib.record(node.depth, self.raw[id], accepted[id]);
                }
            }
        }
        self.raw.clear();
        self.tokens = self.tokens * RATE_DECAY + outcome.tokens.len() as f64;
        self.ms = self.ms * RATE_DECAY + std::mem::take(&mut self.step_ms);
        if let Some((shared, role)) = &self.shared {
            let learned = Learned {
                costs: self.costs.clone(),
                calib: self.calib.clone(),
                tokens: self.tokens,
                ms: self.ms,
            };
            shared.store(role, learned);
        }
    }

    /// The decisions and calibration for `extra_stats`.
    pub fn report(&self) -> ExtraStats {
        let budget = BudgetDecisions {
            plain_steps: self.stats.plain_steps,
            skipped_drafts: self.stats.skipped_drafts,
            pruned_nodes: self.stats.pruned,
        };
        ExtraStats { budget: Some(budget), calibrated: Some(self.calibrated()), ..ExtraStats::default() }
    }

    /// The calibrated acceptance at depths 1–3.
    pub fn calibrated(&self) -> CalibratedAcceptance {
        let d = self.calib.per_depth();
        let at = |i: usize| d.get(i).copied().flatten();
        CalibratedAcceptance { d1: at(0), d2: at(1), d3: at(2) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use treespec_core::tree::Draw;

    fn budget() -> AutoBudget {
        let target = CostCurve::linear(20.0, 13.0, 16).unwrap();
        AutoBudget::new(CostModel::new(target, Some(CostCurve::linear(4.0, 4.0, 16).unwrap())))
    }

    #[test]
    fn trials_are_nodes_whose_parent_was_accepted() {
        let mut b = budget();
        let mut t = TokenTree::new(0);
        let a = t.add(ROOT, 1, Draw::Deterministic, 0.9).unwrap();
        let c = t.add(a, 2, Draw::Deterministic, 0.8).unwrap();
        t.add(c, 3, Draw::Deterministic, 0.7).unwrap();
        t.add(ROOT, 4, Draw::Deterministic, 0.05).unwrap();
        b.set_raw(vec![1.0, 0.9, 0.9, 0.9, 0.05]);
        // a accepted, c rejected: trials a (d1, yes), node 4 (d1, no), c (d2, no); node 3 is not
        // a trial (its parent was rejected).
        b.observe(&t, &VerifyOutcome { accepted: vec![a], tokens: vec![1, 9], depths: vec![] });
        assert_eq!(b.calibrator().total_trials(), 3);
        // (Older trials decay a little as newer ones arrive.)
        let d = b.calibrator().per_depth();
        assert!((d[0].unwrap() - 0.5).abs() < 1e-3, "{d:?}");
        assert_eq!(d[1], Some(0.0));
        assert_eq!(b.calibrator().per_depth()[2], None);
    }

    #[test]
    fn shared_state_carries_calibration_to_the_next_drafter() {
        let shared = SharedCosts::new(CostModel::new(CostCurve::linear(20.0, 13.0, 16).unwrap(), None));
        let mut first = AutoBudget::shared(shared.clone(), "model", true);
        let mut t = TokenTree::new(0);
        let a = t.add(ROOT, 1, Draw::Deterministic, 0.9).unwrap();
        first.set_raw(vec![1.0, 0.9]);
        first.observe(&t, &VerifyOutcome { accepted: vec![a], tokens: vec![1, 2], depths: vec![] });
        let second = AutoBudget::shared(shared.clone(), "model", true);
        assert_eq!(second.calibrator().total_trials(), 1);
        let other_role = AutoBudget::shared(shared, "lookup", false);
        assert_eq!(other_role.calibrator().total_trials(), 0);
    }

    #[test]
    fn a_draft_that_cannot_pay_is_gated_off_once_calibrated() {
        // Target T(n) = 20 + 13n, draft 4 + 4n: a perfect draft pays, one accepted 30% never does.
        let mut b = budget();
        let mut t = TokenTree::new(0);
        let a = t.add(ROOT, 1, Draw::Deterministic, 0.9).unwrap();
        assert!(b.chain_can_pay(), "too few trials to judge");
        for i in 0..100 {
            b.set_raw(vec![1.0, 0.9]);
            let accepted = if i % 10 < 3 { vec![a] } else { vec![] };
            b.observe(&t, &VerifyOutcome { accepted, tokens: vec![1], depths: vec![] });
        }
        assert!(!b.chain_can_pay(), "30% acceptance cannot pay for 8 ms per drafted token");
        let mut good = budget();
        for _ in 0..100 {
            good.set_raw(vec![1.0, 0.9]);
            good.observe(&t, &VerifyOutcome { accepted: vec![a], tokens: vec![1, 2], depths: vec![] });
        }
        assert!(good.chain_can_pay(), "an always-accepted draft pays");
    }

    #[test]
    fn achieved_rate_raises_the_bar_above_plain() {
        let mut b = budget();
        assert!((b.economics().rate - 1.0 / 33.0).abs() < 1e-12, "plain rate before any step");
        let t = TokenTree::new(0);
        b.observe_target(ForwardCost::trees(1, 33.0));
        b.observe(&t, &VerifyOutcome { accepted: vec![], tokens: vec![1, 2, 3], depths: vec![] });
        assert!(b.economics().rate > 1.0 / 33.0);
        assert_eq!(b.stats.plain_steps, 1);
    }

    #[test]
    fn a_forward_that_read_prompt_chunks_counts_in_the_step_but_times_no_size() {
        // 4 tree rows beside 12 rows of another request's prompt, in 80 ms: the curve's T(16)
        // (228 ms) is a forward with logits on every row, so it learns nothing from this one,
        // but the step still waited 80 ms.
        let mut b = budget();
        let before = b.costs.target.clone();
        let t = TokenTree::new(0);
        b.observe_target(ForwardCost { prompt_rows: 12, ..ForwardCost::trees(16, 80.0) });
        b.observe(&t, &VerifyOutcome { accepted: vec![], tokens: vec![1], depths: vec![] });
        assert_eq!(b.costs.target, before);
        let achieved = b.achieved_rate().expect("the step was timed");
        assert!((achieved - 1.0 / 80.0).abs() < 1e-9, "{achieved}");
        // The same forward without the prompt rows is a timing of T(4).
        b.observe_target(ForwardCost::trees(4, 80.0));
        assert_ne!(b.costs.target, before);
    }

    #[test]
    fn plain_steps_achieve_their_own_rate() {
        // Every step one token in 34 ms, a little slower than the curve's 33: the bar is what
        // the steps achieved, 1/34, raised to the curve's plain rate. Each step's time decayed
        // once more than its token read 1/0.95 of it (1/32.3), a bar plain decoding never met.
        let mut b = budget();
        let t = TokenTree::new(0);
        for _ in 0..200 {
            b.observe_target(ForwardCost::trees(1, 34.0));
            b.observe(&t, &VerifyOutcome { accepted: vec![], tokens: vec![1], depths: vec![] });
        }
        let achieved = b.achieved_rate().expect("steps were timed");
        assert!((achieved - 1.0 / 34.0).abs() < 1e-9, "achieved {achieved}, 1/34 is {}", 1.0 / 34.0);
        let plain = 1.0 / b.economics().forward_ms(1);
        assert!((b.economics().rate - achieved.max(plain)).abs() < 1e-12);
    }
}
