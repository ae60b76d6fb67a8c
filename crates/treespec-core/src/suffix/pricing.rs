//! Pricing free drafts: P(target accepts a suffix-drafted node | its parent was accepted), learned
//! online per (context, vote share, source) and priced *pessimistically*.
//!
//! A free draft costs nothing to propose but each verified row costs target time, and on a CPU a
//! node must be accepted well over half the time to pay for its row. Weak matches are common and
//! usually wrong, long exact copies are rare and almost always right; one number per depth (the
//! prompt-lookup calibration) mixes them and ends up verifying the weak ones and cutting the copies
//! short. Here each cell of the feature grid is a Beta posterior (prior centred on a guess from the
//! context and vote share, worth two trials), and a node is priced at its posterior mean minus `z`
//! standard deviations: a cell seen a few times is not trusted, a cell seen hundreds of times is
//! priced at what it did. A node's context is the match it continues (the root's match length
//! plus the drafted tokens above it), so the deep nodes of a short match and the shallow nodes of
//! a long one share what they learn. A negative `z` prices optimistically — the drafter does that
//! on explicit exploration steps so that cells the pessimistic price keeps out still get tried.
//! Old trials are slowly forgotten, so the prices follow the text being written.
//!
//! Nodes that resume a broken copy near its anchor ([`super::anchor`]) have cells of their own,
//! per (resume kind, context): a resume's first node by how its place was chosen (stay,
//! replace, skip, follow), its deeper nodes — whose parents were accepted, so the copy did
//! resume there — as a copy that has followed its source for that many tokens. Their prior says
//! that the source near the anchor predicts better than a random short match (a copy that
//! resumed and agreed for one token starts where a 4-token match does) but is learned and
//! priced pessimistically like every other cell. A node that both a match and a resume draft
//! keeps its match's price — re-anchoring only adds nodes no match drafts (pricing such a node
//! by the better of its two cells verified more rows than they paid for, in replays of recorded
//! answers) — and teaches both cells, each learning what its own features predict. Each family
//! of cells forgets on its own trials, so the bursts of resumes scored after an edit do not
//! push out what the match cells learned.
//!
//! The cells' layout is versioned ([`PRICING_GRID`]): saved prices of another grid are read
//! only where their cells mean the same ([`SuffixPricing::from_grid`]).
//!
//! **A cold start drafts like a warm one.** A fresh install, a `treespec generate` with no learned
//! prices, or a new tenant of the server does not start from the formula prior alone but from
//! the shipped calibrated prior (`calibrated_prior.json`, written by
//! `scripts/calibrate-prior.sh`): what each cell learned over a replay of public recorded
//! answers, shrunk to the evidence of at most 16 trials. A long copy of the prompt is then priced
//! on its first step as it is after a hundred requests (from the formula prior's two trials a
//! run priced it low, and explored its cells, for its first few hundred steps), and a run's own
//! trials outweigh the prior within a few dozen steps. [`SuffixPricing::uninformed`] is the
//! formula prior alone, which the calibration starts from.

use serde::{Deserialize, Serialize};

use super::anchor::ResumeKind;
use super::trie::{AnchorFeatures, AsFeatures, Features, NodeFeatures};

/// Context buckets: upper bounds (inclusive) of each bucket; longer contexts share the last. A
/// node's context is the match it continues: the root's match length plus the drafted tokens above
/// it. Once its parent is accepted, a node at depth d under an m-token match is in exactly the
/// situation of a depth-1 node under an (m + d − 1)-token match, so both share a cell: the deep
/// nodes of a copy learn from the shallow ones and the other way round.
const CONTEXT_EDGES: [usize; 13] = [2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64];
/// Buckets per feature.
const CONTEXT_BUCKETS: usize = CONTEXT_EDGES.len() + 1;
const SHARE_BUCKETS: usize = 4;
/// Cells of suffix-match nodes: (context, vote share, source).
const MATCH_CELLS: usize = CONTEXT_BUCKETS * SHARE_BUCKETS * 2;
/// Context buckets of resumed copies (upper bounds, inclusive; longer share the last): the
/// evidence tying the resume to the text plus the drafted tokens above the node.
const ANCHOR_EDGES: [usize; 10] = [0, 1, 2, 3, 4, 6, 8, 12, 16, 32];
const ANCHOR_BUCKETS: usize = ANCHOR_EDGES.len() + 1;
/// Cells of resumed-copy nodes: (kind, context).
const ANCHOR_CELLS: usize = ResumeKind::ALL.len() * ANCHOR_BUCKETS;
const CELLS: usize = MATCH_CELLS + ANCHOR_CELLS;
/// The version of the cells' layout, saved with the prices. Bump it whenever the cells change.
/// Grid 1 (before re-anchoring) held the match cells alone, laid out as now.
pub const PRICING_GRID: u64 = 2;
/// Pseudo-trials of the prior in every cell.
const PRIOR_TRIALS: f64 = 2.0;
/// Per-trial decay of past counts (an effective memory of about 4,000 trials).
const DECAY: f64 = 0.99975;
/// A cell with fewer (decayed) trials than this is priced optimistically on exploration steps.
const EXPLORE_TRIALS: f64 = 16.0;

fn bucket(edges: &[usize], v: usize) -> usize {
    edges.iter().position(|&e| v <= e).unwrap_or(edges.len())
}

/// Vote share bucket: a split vote, a majority, one unanimous occurrence, a repeated unanimous one.
fn share_bucket(f: &NodeFeatures) -> usize {
    match (f.share, f.support) {
        (s, _) if s < 0.5 => 0,
        (s, _) if s < 0.999 => 1,
        (_, 1) => 2,
        _ => 3,
    }
}

/// The match a node continues, in tokens (see [`CONTEXT_EDGES`]).
fn context(f: &NodeFeatures) -> usize {
    f.match_len + f.depth.saturating_sub(1)
}

fn match_cell(f: &NodeFeatures) -> usize {
    (bucket(&CONTEXT_EDGES, context(f)) * SHARE_BUCKETS + share_bucket(f)) * 2 + f.global as usize
}

/// How a resumed copy's node is placed: its resume's kind at depth 1; below that the copy
/// resumed (the parent was accepted) and the node follows it.
fn anchor_kind(a: &AnchorFeatures) -> ResumeKind {
    if a.depth <= 1 {
        a.kind
    } else {
        ResumeKind::Follow
    }
}

/// A resumed copy's context: the evidence tying it to the text plus the drafted tokens above.
fn anchor_context(a: &AnchorFeatures) -> usize {
    a.evidence + a.depth.saturating_sub(1)
}

fn anchor_cell(a: &AnchorFeatures) -> usize {
    let kind = ResumeKind::ALL.iter().position(|&k| k == anchor_kind(a)).expect("a kind");
    MATCH_CELLS + kind * ANCHOR_BUCKETS + bucket(&ANCHOR_EDGES, anchor_context(a))
}

/// The cells a node is learned in, each with its prior guess: one, or two for a node both a
/// match and a resume draft. The first is the one it is priced in.
fn cells(f: &Features) -> ([(usize, f64); 2], usize) {
    let m = |f: &NodeFeatures| (match_cell(f), prior_acceptance(f));
    let a = |f: &AnchorFeatures| (anchor_cell(f), anchored_prior(f));
    match f {
        Features::Match(f) => ([m(f); 2], 1),
        Features::Anchored(f) => ([a(f); 2], 1),
        Features::Both(f, g) => ([m(f), a(g)], 2),
    }
}

/// The cell a node is priced in: its match's when a match drafts it.
fn priced_cell(f: &Features) -> (usize, f64) {
    cells(f).0[0]
}

/// The prior guess: a match of m tokens followed d − 1 tokens deep is a context of m + d − 1
/// tokens; longer contexts predict better (m'/(m' + 2)), scaled by the node's vote share, and
/// other requests' text predicts less than the request's own.
pub fn prior_acceptance(f: &NodeFeatures) -> f64 {
    let context = context(f) as f64;
    let source = if f.global { 0.8 } else { 1.0 };
    (context / (context + 2.0) * f.share.clamp(0.0, 1.0) * source).clamp(0.01, 0.99)
}

/// The prior guess for a resumed copy's node. A copy that has followed its source for c tokens
/// since it resumed goes on with (c + 3)/(c + 5) (0.67 after one token, 0.8 after five: above a
/// c-token suffix match's c/(c + 2), for the copy around it says more than the few tokens
/// matched); a resume's first node is a guess at where an edit ended: 0.55 after two emitted
/// tokens found ahead of the anchor, 0.35 for one or for the anchor itself, 0.3 for a
/// same-length replacement (the guesses exclude each other, and most edits are not over after
/// one step).
pub fn anchored_prior(a: &AnchorFeatures) -> f64 {
    let p = match anchor_kind(a) {
        ResumeKind::Follow => {
            let c = anchor_context(a) as f64;
            (c + 3.0) / (c + 5.0)
        }
        ResumeKind::Skip if a.evidence >= 2 => 0.55,
        ResumeKind::Skip | ResumeKind::Stay => 0.35,
        ResumeKind::Replace => 0.3,
    };
    p.clamp(0.01, 0.99)
}

/// Acceptance statistics per feature cell (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuffixPricing {
    accepted: Vec<f64>,
    trials: Vec<f64>,
    total: u64,
}

/// The shipped calibrated prior as `scripts/calibrate-prior.sh` writes it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShippedPrior {
    format: String,
    grid: u64,
    cap: f64,
    /// Provenance, for readers of the file.
    #[serde(rename = "calibrated_on")]
    _calibrated_on: serde::de::IgnoredAny,
    accepted: Vec<f64>,
    trials: Vec<f64>,
}

/// The shipped prior's cells, checked once.
static CALIBRATED: std::sync::LazyLock<SuffixPricing> = std::sync::LazyLock::new(|| {
    let shipped: ShippedPrior =
        serde_json::from_str(include_str!("calibrated_prior.json")).expect("the shipped prior is JSON");
    assert_eq!(shipped.format, "treespec suffix prior");
    assert_eq!(
        shipped.grid, PRICING_GRID,
        "the shipped prior is of another grid: run scripts/calibrate-prior.sh"
    );
    assert!(shipped.accepted.len() == CELLS && shipped.trials.len() == CELLS, "the shipped prior's cells");
    for (&a, &t) in shipped.accepted.iter().zip(&shipped.trials) {
        assert!(a.is_finite() && 0.0 <= a && a <= t && t <= shipped.cap, "a shipped cell of {a}/{t}");
    }
    SuffixPricing { accepted: shipped.accepted, trials: shipped.trials, total: 0 }
});

/// The shipped calibrated prior (see the module docs).
impl Default for SuffixPricing {
    fn default() -> Self {
        CALIBRATED.clone()
    }
}

impl SuffixPricing {
    /// Pricing of a fresh start: the shipped calibrated prior, no trials of its own yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The formula prior alone: every cell untried (what the calibration starts from).
    pub fn uninformed() -> Self {
        Self { accepted: vec![0.0; CELLS], trials: vec![0.0; CELLS], total: 0 }
    }

    /// Trials recorded so far.
    pub fn total_trials(&self) -> u64 {
        self.total
    }

    /// Prices saved under the cells' layout `grid` (a [`PRICING_GRID`] version) as this grid's:
    /// the same prices when `grid` is this one, the cells that mean the same with the others at
    /// their prior when it is an older layout whose cells this one extends (grid 1: the match
    /// cells), `None` for any other layout or a pricing not of `grid`'s shape.
    pub fn from_grid(grid: u64, saved: SuffixPricing) -> Option<SuffixPricing> {
        let cells = Self::grid_cells(grid)?;
        if saved.accepted.len() != cells || saved.trials.len() != cells {
            return None;
        }
        // The cells the older layout lacks start from the shipped prior.
        let mut p = saved;
        p.accepted.extend_from_slice(&CALIBRATED.accepted[cells..]);
        p.trials.extend_from_slice(&CALIBRATED.trials[cells..]);
        Some(p)
    }

    /// The number of cells a saved pricing of layout `grid` holds (`None`: a layout this build
    /// cannot read).
    pub fn grid_cells(grid: u64) -> Option<usize> {
        match grid {
            PRICING_GRID => Some(CELLS),
            1 => Some(MATCH_CELLS),
            _ => None,
        }
    }

    /// The posterior mean and standard deviation of one cell's acceptance, given its prior.
    fn cell_posterior(&self, (c, p0): (usize, f64)) -> (f64, f64) {
        let a = self.accepted[c] + PRIOR_TRIALS * p0;
        let b = (self.trials[c] - self.accepted[c]).max(0.0) + PRIOR_TRIALS * (1.0 - p0);
        let n = a + b;
        (a / n, (a * b / (n * n * (n + 1.0))).sqrt())
    }

    /// The posterior mean and standard deviation of a node's acceptance (of a node both a match
    /// and a resume draft: its match's).
    pub fn posterior(&self, f: &impl AsFeatures) -> (f64, f64) {
        self.cell_posterior(priced_cell(&f.as_features()))
    }

    /// The price of a node: posterior mean − `z` standard deviations, in [0, 1].
    pub fn price(&self, f: &impl AsFeatures, z: f64) -> f64 {
        self.cell_price(priced_cell(&f.as_features()), z)
    }

    fn cell_price(&self, c: (usize, f64), z: f64) -> f64 {
        let (mean, sd) = self.cell_posterior(c);
        (mean - z * sd).clamp(0.0, 1.0)
    }

    /// The price on an exploration step: optimistic (mean + `z` sd) for a cell tried fewer than
    /// `EXPLORE_TRIALS` times, the usual pessimistic price for the others.
    pub fn exploration_price(&self, f: &impl AsFeatures, z: f64) -> f64 {
        let c = priced_cell(&f.as_features());
        self.cell_price(c, if self.trials[c.0] < EXPLORE_TRIALS { -z } else { z })
    }

    /// Record one trial: a node whose parent was accepted, and whether it was (in each of its
    /// cells).
    pub fn record(&mut self, f: &impl AsFeatures, accepted: bool) {
        let f = f.as_features();
        let (cs, k) = cells(&f);
        // Each family of cells forgets on its own trials: the bursts of resumes scored after an
        // edit do not push out what the match cells learned, nor the other way round.
        let (matched, anchored) = match f {
            Features::Match(_) => (true, false),
            Features::Anchored(_) => (false, true),
            Features::Both(..) => (true, true),
        };
        let family = |c: usize| if c < MATCH_CELLS { matched } else { anchored };
        for (c, (a, t)) in self.accepted.iter_mut().zip(self.trials.iter_mut()).enumerate() {
            if family(c) {
                *a *= DECAY;
                *t *= DECAY;
            }
        }
        for &(c, _) in &cs[..k] {
            self.trials[c] += 1.0;
            self.accepted[c] += accepted as u8 as f64;
        }
        self.total += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(match_len: usize, depth: usize) -> NodeFeatures {
        NodeFeatures { match_len, depth, share: 1.0, support: 1, global: false }
    }

    #[test]
    fn an_untried_cell_answers_a_pessimistic_prior() {
        let p = SuffixPricing::uninformed();
        let long = node(40, 1);
        let weak = node(2, 1);
        assert!(p.posterior(&long).0 > 0.9 && p.posterior(&weak).0 < 0.6);
        // Pessimism lowers, optimism raises, z = 0 is the mean.
        assert!(p.price(&long, 1.0) < p.posterior(&long).0);
        assert!(p.price(&weak, -1.0) > p.posterior(&weak).0);
        assert_eq!(p.price(&long, 0.0), p.posterior(&long).0);
        assert_eq!(p.exploration_price(&long, 1.0), p.price(&long, -1.0));
        // Split votes and other requests' text start lower.
        let split = NodeFeatures { share: 0.3, ..long };
        let global = NodeFeatures { global: true, ..long };
        assert!(p.posterior(&split).0 < p.posterior(&long).0);
        assert!(p.posterior(&global).0 < p.posterior(&long).0);
    }

    #[test]
    fn learns_per_cell_and_trusts_what_it_saw_often() {
        let mut p = SuffixPricing::uninformed();
        // Weak matches at depth 1: accepted 20%; long copies at depth 10: 98%.
        for i in 0..500 {
            p.record(&node(2, 1), i % 5 == 0);
            p.record(&node(30, 10), i % 50 != 0);
        }
        let weak = p.price(&node(2, 1), 1.0);
        let copy = p.price(&node(30, 10), 1.0);
        assert!((weak - 0.2).abs() < 0.05, "{weak}");
        assert!((copy - 0.98).abs() < 0.02, "{copy}");
        // A cell never tried still answers its prior.
        let untouched = node(6, 3);
        assert_eq!(p.posterior(&untouched).0, SuffixPricing::uninformed().posterior(&untouched).0);
        // Well-tried cells keep their pessimistic price on exploration steps.
        assert_eq!(p.exploration_price(&node(2, 1), 1.0), weak);
        // A depth-1 node under a 39-token match continues the same context as the depth-10 node
        // under a 30-token one: it learned from those trials.
        assert_eq!(p.price(&node(39, 1), 1.0), copy);
        assert!(p.price(&node(3, 1), 1.0) < copy);
    }

    fn resumed(kind: ResumeKind, evidence: usize, depth: usize) -> AnchorFeatures {
        AnchorFeatures { kind, evidence, depth }
    }

    #[test]
    fn resumed_copies_have_cells_and_priors_of_their_own() {
        let p = SuffixPricing::uninformed();
        let mean = |a: AnchorFeatures| p.posterior(&a).0;
        // A copy that resumed and agreed for a token beats a 2-token match; a resume's first node
        // is a guess, two matched tokens a better one.
        let follow = resumed(ResumeKind::Follow, 1, 1);
        assert!(mean(follow) > p.posterior(&node(2, 1)).0);
        assert!(mean(resumed(ResumeKind::Skip, 2, 1)) > mean(resumed(ResumeKind::Skip, 1, 1)));
        assert!(
            mean(resumed(ResumeKind::Stay, 0, 1)) < 0.5 && mean(resumed(ResumeKind::Replace, 0, 1)) < 0.5
        );
        // Deeper nodes follow the resumed copy: a stay's second node is a one-token follow.
        assert_eq!(anchor_cell(&resumed(ResumeKind::Stay, 0, 2)), anchor_cell(&follow));
        assert_eq!(mean(resumed(ResumeKind::Stay, 0, 2)), mean(follow));
        // Every resumed cell lies past the match cells, and learning one leaves the others.
        let mut q = SuffixPricing::uninformed();
        for _ in 0..200 {
            q.record(&resumed(ResumeKind::Replace, 0, 1), true);
        }
        assert!(q.price(&resumed(ResumeKind::Replace, 0, 1), 0.9) > 0.9);
        assert_eq!(
            q.posterior(&resumed(ResumeKind::Stay, 0, 1)),
            p.posterior(&resumed(ResumeKind::Stay, 0, 1))
        );
        assert_eq!(q.posterior(&node(2, 1)), p.posterior(&node(2, 1)));
        // A node both a match and a resume draft keeps its match's price, and teaches both cells.
        let both = Features::Both(node(2, 1), resumed(ResumeKind::Replace, 0, 1));
        assert_eq!(q.price(&both, 0.9), q.price(&node(2, 1), 0.9));
        assert_eq!(q.posterior(&both), q.posterior(&node(2, 1)));
        assert_eq!(q.exploration_price(&both, 0.9), q.exploration_price(&node(2, 1), 0.9));
        let mut r = SuffixPricing::uninformed();
        r.record(&both, false);
        assert_eq!(r.total_trials(), 1);
        assert!(r.posterior(&node(2, 1)).0 < p.posterior(&node(2, 1)).0);
        assert!(
            r.posterior(&resumed(ResumeKind::Replace, 0, 1)).0
                < p.posterior(&resumed(ResumeKind::Replace, 0, 1)).0
        );
        for kind in ResumeKind::ALL {
            for (e, d) in [(0, 1), (2, 1), (1, 40), (70, 70)] {
                let c = anchor_cell(&resumed(kind, e, d));
                assert!((MATCH_CELLS..CELLS).contains(&c), "{kind:?} {e} {d}");
            }
        }
    }

    #[test]
    fn saved_prices_of_another_grid_are_read_where_their_cells_mean_the_same() {
        // The layout this build saves: a change of the cells must bump PRICING_GRID.
        assert_eq!((PRICING_GRID, CELLS, MATCH_CELLS), (2, 156, 112), "changed the grid? bump PRICING_GRID");
        let mut p = SuffixPricing::uninformed();
        for i in 0..50 {
            p.record(&node(2 + i % 20, 1), i % 3 == 0);
            p.record(&resumed(ResumeKind::Skip, 1, 1), i % 2 == 0);
        }
        assert_eq!(SuffixPricing::from_grid(PRICING_GRID, p.clone()), Some(p.clone()));
        // Grid 1 held the match cells alone, laid out as now: they are kept, the resumed cells
        // start from the shipped prior.
        let old = SuffixPricing {
            accepted: p.accepted[..MATCH_CELLS].to_vec(),
            trials: p.trials[..MATCH_CELLS].to_vec(),
            total: 77,
        };
        let read = SuffixPricing::from_grid(1, old.clone()).expect("grid 1 is read");
        assert_eq!(read.total_trials(), 77);
        assert_eq!(read.posterior(&node(5, 1)), p.posterior(&node(5, 1)));
        let fresh = SuffixPricing::new();
        assert_eq!(
            read.posterior(&resumed(ResumeKind::Skip, 1, 1)),
            fresh.posterior(&resumed(ResumeKind::Skip, 1, 1))
        );
        // Another layout, or a pricing not of its grid's shape, is not.
        assert_eq!(SuffixPricing::from_grid(3, p.clone()), None);
        assert_eq!(SuffixPricing::from_grid(1, p), None);
        assert_eq!(SuffixPricing::from_grid(PRICING_GRID, old), None);
    }
    #[test]
    fn a_fresh_start_prices_from_the_shipped_calibration() {
        let (shipped, formula) = (SuffixPricing::new(), SuffixPricing::uninformed());
        assert_eq!(shipped.total_trials(), 0, "the prior is not this run's trials");
        assert_eq!(SuffixPricing::default(), shipped);
        // A long copy of the request's own text: calibrated near-certain, with enough evidence
        // to be priced near its mean and never explored again; the formula prior's two trials
        // price it far lower on a first step.
        let copy = node(40, 1);
        let (mean, _) = shipped.posterior(&copy);
        assert!(mean > 0.9, "{mean}");
        assert!(shipped.trials[priced_cell(&copy.as_features()).0] >= EXPLORE_TRIALS);
        assert_eq!(shipped.exploration_price(&copy, 0.9), shipped.price(&copy, 0.9));
        assert!(shipped.price(&copy, 0.9) > formula.price(&copy, 0.9) + 0.1);
        // A weak two-token match of a split vote: the calibration learned it fails more often
        // than the formula guesses.
        let weak = NodeFeatures { share: 0.3, ..node(2, 1) };
        assert!(shipped.posterior(&weak).0 < formula.posterior(&weak).0);
        // What a run learns still moves the prices: 200 failures of the long copy's cell.
        let mut p = shipped.clone();
        for _ in 0..200 {
            p.record(&copy, false);
        }
        assert!(p.posterior(&copy).0 < 0.2);
    }
}
