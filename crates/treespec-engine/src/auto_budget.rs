//! The state a cost-aware drafter carries between steps: the measured cost curves, the online
//! calibration of its confidence into acceptance, and the rate it has been achieving.
//!
//! The decisions themselves are pure functions in `treespec_core::budget`; this module feeds them
//! with what the engine measures (forward times, verify outcomes) and keeps the running estimates.

use serde::{Deserialize, Serialize};
use treespec_core::budget::Economics;
use treespec_core::calibration::AcceptanceCalibrator;
use treespec_core::cost::CostCurve;
use treespec_core::tree::{NodeId, TokenTree, ROOT};
use treespec_core::verify::VerifyOutcome;

/// Decay per step of the running token and time sums behind the achieved rate.
const RATE_DECAY: f64 = 0.95;
/// A step that decided not to draft drafts anyway after this many such steps, so acceptance
/// estimates that were too pessimistic (or text that got easier) are noticed.
const PROBE_EVERY: u32 = 16;

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
}

fn refine_default() -> bool {
    true
}

impl CostModel {
    /// Curves refined online.
    pub fn new(target: CostCurve, draft: Option<CostCurve>) -> Self {
        Self { target, draft, refine: true }
    }
}

/// Counters of a cost-aware drafter, for reports.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AutoStats {
    /// Steps proposed.
    pub steps: u64,
    /// Steps that verified no drafted node (plain decoding), drafting skipped or pruned away.
    pub plain_steps: u64,
    /// Steps that skipped the draft model entirely.
    pub skipped_drafts: u64,
    /// Drafted nodes pruned by the budget before verification.
    pub pruned: u64,
}

/// Cost model + calibration + achieved rate.
#[derive(Debug, Clone)]
pub struct AutoBudget {
    costs: CostModel,
    calib: AcceptanceCalibrator,
    tokens: f64,
    ms: f64,
    since_draft: u32,
    /// Raw conditional confidence of each node of the tree last proposed (root: 1).
    raw: Vec<f64>,
    draft_ms: f64,
    /// Counters since the last `begin`.
    pub stats: AutoStats,
}

impl AutoBudget {
    /// Start from measured curves; the calibration starts empty (raw confidences) and persists
    /// across generations, as the curves do.
    pub fn new(costs: CostModel) -> Self {
        Self {
            costs,
            calib: AcceptanceCalibrator::new(),
            tokens: 0.0,
            ms: 0.0,
            since_draft: 0,
            raw: Vec::new(),
            draft_ms: 0.0,
            stats: AutoStats::default(),
        }
    }

    /// Reset the per-generation counters (curves, calibration and rate are kept).
    pub fn begin(&mut self) {
        self.stats = AutoStats::default();
        self.raw.clear();
        self.draft_ms = 0.0;
    }

    /// The cost curves.
    pub fn costs(&self) -> &CostModel {
        &self.costs
    }

    /// The calibration.
    pub fn calibrator(&self) -> &AcceptanceCalibrator {
        &self.calib
    }

    /// The achieved rate in tokens per ms over recent steps (`None` before the first step).
    pub fn achieved_rate(&self) -> Option<f64> {
        (self.ms > 0.0).then(|| self.tokens / self.ms)
    }

    /// The economics of the next step: beat the achieved rate, and at least plain decoding.
    pub fn economics(&self) -> Economics<'_> {
        Economics::new(&self.costs.target, self.achieved_rate().unwrap_or(0.0))
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
        self.costs.draft.as_ref().map_or(0.0, |c| c.ms(n))
    }

    /// Whether this step should draft although the estimates say it will not pay (a probe).
    pub fn probe_due(&self) -> bool {
        self.since_draft >= PROBE_EVERY
    }

    /// Note the step's decision: drafted (with the draft model) or skipped it.
    pub fn note_drafting(&mut self, drafted: bool) {
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

    /// Fold a timed target forward of `rows` rows into the target curve.
    pub fn observe_target(&mut self, rows: usize, ms: f64) {
        if self.costs.refine {
            self.costs.target.observe(rows, ms);
            self.ms += ms;
        }
    }

    /// Fold a timed draft forward into the draft curve.
    pub fn observe_draft(&mut self, rows: usize, ms: f64) {
        if !self.costs.refine {
            return;
        }
        if let Some(c) = self.costs.draft.as_mut() {
            c.observe(rows, ms);
        }
        self.draft_ms += ms;
        self.ms += ms;
    }

    /// Learn from a verified step: every drafted node whose parent was accepted is one trial of
    /// the calibration, and the emitted tokens count toward the achieved rate.
    pub fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) {
        self.stats.steps += 1;
        if tree.drafted() == 0 {
            self.stats.plain_steps += 1;
        }
        let mut accepted = vec![false; tree.len()];
        accepted[ROOT] = true;
        for &n in &outcome.accepted {
            accepted[n] = true;
        }
        if self.raw.len() == tree.len() {
            for (id, node) in tree.nodes().iter().enumerate().skip(1) {
                let parent: NodeId = node.parent.unwrap_or(ROOT);
                if accepted[parent] {
                    self.calib.record(node.depth, self.raw[id], accepted[id]);
                }
            }
        }
        self.raw.clear();
        self.tokens = self.tokens * RATE_DECAY + outcome.tokens.len() as f64;
        self.ms *= RATE_DECAY;
    }

    /// Report lines for `extra_stats`.
    pub fn report(&self) -> Vec<(&'static str, f64)> {
        let mut out = vec![
            ("auto_plain_steps", self.stats.plain_steps as f64),
            ("auto_skipped_drafts", self.stats.skipped_drafts as f64),
            ("auto_pruned_nodes", self.stats.pruned as f64),
        ];
        let names = ["calibrated_accept_d1", "calibrated_accept_d2", "calibrated_accept_d3"];
        for (name, a) in names.iter().zip(self.calib.per_depth()) {
            if let Some(a) = a {
                out.push((name, a));
            }
        }
        out
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
    fn achieved_rate_raises_the_bar_above_plain() {
        let mut b = budget();
        assert!((b.economics().rate - 1.0 / 33.0).abs() < 1e-12, "plain rate before any step");
        let t = TokenTree::new(0);
        b.observe_target(1, 33.0);
        b.observe(&t, &VerifyOutcome { accepted: vec![], tokens: vec![1, 2, 3], depths: vec![] });
        assert!(b.economics().rate > 1.0 / 33.0);
        assert_eq!(b.stats.plain_steps, 1);
    }
}
