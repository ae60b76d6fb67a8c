//! `--method suffix`: suffix drafting — free drafts from what followed the text's longest suffix
//! earlier in this request and in every earlier request, priced pessimistically on the measured
//! cost curve.
//!
//! Each step looks up the last tokens of the history (up to 64) in two match indexes: the
//! request's own prompt and output so far, and the global history of earlier requests shared by
//! every drafter of the method (bounded, oldest evicted first; see
//! [`treespec_core::suffix::GlobalHistory`]). The continuations of the best occurrences are
//! merged into a trie ([`treespec_core::suffix::continuation_trie`]); every node is priced at a
//! lower confidence bound of its learned acceptance
//! ([`SuffixPricing`](treespec_core::suffix::SuffixPricing)), its path value is the product of
//! the prices above it, and the step keeps the value-ordered prefix with the best gain on the
//! target's cost curve — long when a long exact copy is under way, nothing at all when the
//! matches are weak. Every `explore_every` steps, cells with few trials are priced optimistically
//! instead so that the pessimistic price cannot lock them out forever.
//!
//! The prices learn from every proposal, not only from the nodes verified: at the next step the
//! tokens emitted meanwhile say which children of the last trie were right ([`Shadow`]). And each
//! request bends the shared prices by how its own text has borne them out
//! ([`RequestCalibration`]): a summary quoting its article is priced up, a math answer that quotes
//! three words of its question and moves on is priced down.
//!
//! Copies broken by an edit are re-anchored ([`treespec_core::suffix::anchor`]): the drafter
//! keeps the position in the request's own text where the last long copy's source goes on, and
//! when the target leaves the copy (an insertion, a deletion, a replacement begins) it grafts a
//! few chains onto the trie for the next steps — the source at the anchor, past the replaced
//! tokens, after the last emitted tokens found further on — priced in cells of their own and
//! learned from every proposal like the other nodes, until the copy resumes and a long match
//! forms again (`reanchor`).
//!
//! Lossless: every node is a `Draw::Deterministic` candidate chosen from the history and from
//! verify outcomes of *earlier* steps, never from this step's verifier randomness, so family-3
//! verification is exact under sampling, and greedy verification follows the target's argmax.
//! The re-anchoring chains are read from the history alone (the tokens emitted at earlier steps).
//!
//! One job a file: this one holds the drafter and its [`Drafter`] steps; [`shared`] the state
//! every drafter of the method shares, [`config`] the knobs, [`stats`] the counters, [`trie`] the
//! step's candidates and [`reanchor`] the chains grafted onto them, [`selection`] their prices
//! and the prefix kept, [`proposal`] the tree proposed from it, [`shadow`] the learning from the
//! text that followed, and [`calibration`] each request's own tallies; [`store`] keeps the
//! history a process shares, and [`history_file`] saves it (the file, its lock and its format).

mod calibration;
mod config;
pub mod history_file;
mod proposal;
mod reanchor;
mod selection;
mod shadow;
mod shared;
mod stats;
mod store;
mod trie;

#[cfg(test)]
mod tests;

pub use config::SuffixConfig;
pub use shared::SuffixShared;
pub use stats::SuffixStats;
pub use store::{StorePlaces, StoreSave, SuffixStore};

use treespec_core::sampling::Sampler;
use treespec_core::suffix::{prompt_key, AnchorTracker, Features, SuffixIndex};
use treespec_core::tree::{TokenTree, ROOT};
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;

use self::calibration::{RequestCalibration, STEP_DECAY};
use self::shadow::Shadow;
use crate::auto_budget::AutoBudget;
use crate::drafter::{Cuttable, Drafter, ForwardCost, ProposeContext, Provenance};
use crate::error::Result;
use crate::extra_stats::ExtraStats;
use crate::method_kind::MethodKind;

/// The suffix drafter (see the module docs).
pub struct SuffixDrafter {
    config: SuffixConfig,
    local: SuffixIndex,
    budget: Option<AutoBudget>,
    prompt_key: u64,
    /// Features of each node of the tree last proposed (index = node id), empty if discarded.
    features: Vec<Features>,
    /// Pessimistic path value of each drafted node of the tree last proposed (node 1.., in
    /// arena order = value order), for a batch budget.
    values: Vec<f64>,
    last_gain: f64,
    stats: SuffixStats,
    /// The whole trie of the last proposal, kept to be scored against the tokens emitted next.
    shadow: Option<Shadow>,
    /// How this request's text bears out the shared prices (see [`RequestCalibration`]).
    calibration: RequestCalibration,
    /// Where this request's last long copy stood, and where it may resume once broken.
    anchors: AnchorTracker,
    /// Tokens accepted against the tokens the verified nodes' path values promised, per verified
    /// step. The node tally cannot see a long bet fail: a 15-node chain rejected at depth 3 is two
    /// hits and one miss, about what the prices expected of those three nodes, while the step
    /// promised seven tokens and got two. A worked math answer that quotes a phrase of its
    /// question and then changes the number does that again and again. Steps that bet nothing
    /// let it fade back toward neutral.
    bets: RequestCalibration,
}

impl SuffixDrafter {
    /// A suffix drafter; errors on an invalid config.
    pub fn new(config: SuffixConfig) -> Result<Self> {
        config.validate()?;
        let budget = config.costs.clone().map(|c| AutoBudget::shared(c, "suffix", false));
        Ok(Self {
            config,
            local: SuffixIndex::new(),
            budget,
            prompt_key: 0,
            features: Vec::new(),
            values: Vec::new(),
            last_gain: 0.0,
            stats: SuffixStats::default(),
            shadow: None,
            calibration: RequestCalibration::NEUTRAL,
            anchors: AnchorTracker::new(),
            bets: RequestCalibration::NEUTRAL,
        })
    }

    /// Counters since the last `begin`.
    pub fn stats(&self) -> &SuffixStats {
        &self.stats
    }

    /// The expected gain of the last proposal over plain decoding (tokens − rate × ms; 0 when it
    /// drafted nothing or has no cost curves).
    pub fn last_gain(&self) -> f64 {
        self.last_gain
    }

    /// The economics the proposals are priced on (`None` without cost curves).
    pub fn economics(&self) -> Option<treespec_core::budget::Economics<'_>> {
        self.budget.as_ref().map(|b| b.economics())
    }

    /// The target's cost curve the proposals are priced on (`None` without cost curves).
    pub fn cuttable_target(&self) -> Option<&treespec_core::cost::CostCurve> {
        self.budget.as_ref().map(|b| b.target())
    }

    /// The last proposal was not verified (another drafter's was): learn nothing from this step.
    pub fn discard_proposal(&mut self) {
        self.features.clear();
        self.values.clear();
    }

    /// Record a verified tree's nodes in the shared prices (each whose parent was accepted: the
    /// verifier tried it) and the step's bet in the request's step tally.
    fn learn_verified(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) {
        self.stats.drafting_steps += (tree.drafted() > 0) as u64;
        self.stats.verified += tree.drafted() as u64;
        let mut accepted = vec![false; tree.len()];
        accepted[ROOT] = true;
        for &n in &outcome.accepted {
            accepted[n] = true;
        }
        self.stats.accepted += outcome.accepted.len() as u64;
        let mut pricing = self.config.shared.pricing();
        for (id, node) in tree.nodes().iter().enumerate().skip(1) {
            if accepted[node.parent.unwrap_or(ROOT)] {
                pricing.record(&self.features[id], accepted[id]);
            }
            if self.features[id].is_anchored() {
                self.stats.anchored_nodes_verified += 1;
                self.stats.anchored_nodes_accepted += accepted[id] as u64;
            }
        }
        if tree.drafted() > 0 {
            // The caller's guard keeps the verified tree within the proposal's values.
            let expected: f64 = self.values[..tree.drafted()].iter().sum();
            self.bets.record(outcome.accepted.len() as f64, expected, tree.drafted() as f64, STEP_DECAY);
        } else {
            // A step that bet nothing: the tally fades toward the shared prices' own rate. Only
            // verified bets move it, so without this one long bet that fell short could keep a
            // request from drafting for good (its scaled-down values never pay for a row again),
            // through a long exact repetition too.
            self.bets.record(0.0, 0.0, 0.0, STEP_DECAY);
        }
    }
}

impl Drafter for SuffixDrafter {
    fn kind(&self) -> MethodKind {
        MethodKind::Suffix
    }

    fn source(&self) -> Provenance {
        Provenance::Copied
    }

    /// Model-free and deterministic: the seed is unused.
    fn begin(&mut self, prompt: &[TokenId], _: &Sampler, _seed: u64) -> Result<()> {
        self.stats = SuffixStats::default();
        self.features.clear();
        self.shadow = None;
        self.calibration = RequestCalibration::NEUTRAL;
        self.bets = RequestCalibration::NEUTRAL;
        self.anchors.reset();
        self.local.clear();
        self.local.extend(prompt);
        self.prompt_key = prompt_key(prompt);
        if let Some(b) = self.budget.as_mut() {
            b.begin();
        }
        Ok(())
    }

    fn propose(&mut self, ctx: &ProposeContext) -> Result<TokenTree> {
        self.stats.steps += 1;
        if let Some(b) = self.budget.as_mut() {
            // Cut by the batch's budget afterwards, the proposal is priced as if alone.
            b.set_forward(if ctx.batch_cut { 0 } else { ctx.batch_rows }, ctx.history.len());
        }
        self.features.clear();
        self.values.clear();
        self.last_gain = 0.0;
        let depth = self.config.max_depth.min(ctx.max_depth);
        let room = self.config.max_nodes.min(ctx.max_nodes);
        if depth == 0 || room == 0 {
            return Ok(TokenTree::new(ctx.root()));
        }
        self.local.sync(ctx.history);
        if let Some(shadow) = self.shadow.take() {
            shadow.learn(ctx.history, &mut self.config.shared.pricing(), &mut self.calibration);
        }
        let (trie, features) = self.trie(ctx.history, depth, ctx.eos)?;
        let explore = self.config.explore_every > 0
            && self.stats.steps.is_multiple_of(self.config.explore_every as u64);
        self.stats.explore_steps += explore as u64;
        let chosen = self.choose(&trie, &features, room, explore);
        self.proposal(ctx.history.len(), trie, features, chosen)
    }

    fn cuttable(&self) -> Option<Cuttable<'_>> {
        let target = self.budget.as_ref()?.target();
        (!self.values.is_empty()).then_some(Cuttable { values: &self.values, target })
    }

    fn observe_cost(&mut self, forward: ForwardCost) {
        if let Some(b) = self.budget.as_mut() {
            b.observe_target(forward);
        }
    }

    fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) -> Result<()> {
        if let Some(b) = self.budget.as_mut() {
            b.observe(tree, outcome);
        }
        // The tree verified is the proposal or, cut by a batch budget, an arena prefix of it.
        if self.features.is_empty() || tree.len() > self.features.len() {
            return Ok(());
        }
        self.learn_verified(tree, outcome);
        if let Some(shadow) = self.shadow.as_mut() {
            shadow.verified_rows = tree.len();
        }
        self.features.clear();
        self.values.clear();
        Ok(())
    }

    /// The finished request's text joins the global history.
    fn finish(&mut self, text: &[TokenId]) {
        if self.config.global {
            self.config.shared.add(self.prompt_key, text);
        }
    }

    fn extra_stats(&self) -> ExtraStats {
        ExtraStats { suffix: Some(self.stats.counts()), ..ExtraStats::default() }
    }
}
