//! `--method suffix`: suffix drafting — free drafts from what followed the text's longest suffix
//! earlier in this request and in every earlier request, priced pessimistically on the measured
//! cost curve.
//!
//! Each step looks up the last tokens of the history (up to 64) in two match indexes: the
//! request's own prompt and output so far, and the global history of earlier requests shared by
//! every drafter of the method (bounded, oldest evicted first; see
//! [`treespec_core::suffix::GlobalHistory`]). The continuations of the best occurrences are
//! merged into a trie ([`treespec_core::suffix::continuation_trie`]); every node is priced at a
//! lower confidence bound of its learned acceptance ([`SuffixPricing`]), its path value is the
//! product of the prices above it, and the step keeps the value-ordered prefix with the best gain
//! on the target's cost curve — long when a long exact copy is under way, nothing at all when the
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

use std::sync::{Arc, Mutex, RwLock};

use treespec_core::budget::value_order;
use treespec_core::sampling::Sampler;
use treespec_core::suffix::{
    continuation_trie, graft_resumes, prompt_key, AnchorTracker, Features, GlobalHistory, LookupLimits,
    Matches, Resume, SuffixIndex, SuffixPricing, DEFAULT_CAP_TOKENS,
};
use treespec_core::tree::{Draw, TokenTree, ROOT};
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;

use crate::auto_budget::{AutoBudget, SharedCosts};
use crate::drafter::{Cuttable, Drafter, ProposeContext, Provenance};
use crate::error::{EngineError, Result};
use crate::extra_stats::{ExtraStats, SuffixCounts};

/// Most nodes the trie is built with before pricing (the pricing then keeps far fewer).
const TRIE_NODES: usize = 256;
/// Most nodes the re-anchoring chains may add to it.
const RESUME_NODES: usize = 256;

/// What every drafter of one suffix method shares: the global history and the learned prices.
#[derive(Debug)]
pub struct SuffixShared {
    history: RwLock<GlobalHistory>,
    pricing: Mutex<SuffixPricing>,
}

impl SuffixShared {
    /// Shared state around a history (e.g. one loaded from a file).
    pub fn new(history: GlobalHistory) -> Arc<Self> {
        Self::with_pricing(history, SuffixPricing::new())
    }

    /// Shared state around a history and learned prices (e.g. both loaded from files).
    pub fn with_pricing(history: GlobalHistory, pricing: SuffixPricing) -> Arc<Self> {
        Arc::new(Self { history: RwLock::new(history), pricing: Mutex::new(pricing) })
    }

    /// Shared state with an empty history of the default cap.
    pub fn empty() -> Arc<Self> {
        Self::new(GlobalHistory::new(DEFAULT_CAP_TOKENS).expect("the default cap is valid"))
    }

    /// Read access to the global history (e.g. to save it).
    pub fn history(&self) -> std::sync::RwLockReadGuard<'_, GlobalHistory> {
        self.history.read().unwrap_or_else(|p| p.into_inner())
    }

    fn history_mut(&self) -> std::sync::RwLockWriteGuard<'_, GlobalHistory> {
        self.history.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Add a finished request's text to the history (what a drafter does when its request ends).
    pub fn add(&self, prompt_key: u64, text: &[TokenId]) {
        self.history_mut().add(prompt_key, text);
    }

    /// The learned prices.
    pub fn pricing(&self) -> std::sync::MutexGuard<'_, SuffixPricing> {
        self.pricing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A copy of the learned prices (e.g. to save them without holding the drafters up).
    pub fn pricing_snapshot(&self) -> SuffixPricing {
        self.pricing().clone()
    }

    /// Replace the learned prices (e.g. with prices saved by an earlier run).
    pub fn set_pricing(&self, pricing: SuffixPricing) {
        *self.pricing() = pricing;
    }
}

/// Two handles are equal when they share the same state.
impl PartialEq for SuffixShared {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

/// Knobs of the suffix drafter.
#[derive(Debug, Clone, PartialEq)]
pub struct SuffixConfig {
    /// Longest match measured, in tokens. Default 64.
    pub max_match: usize,
    /// Deepest draft, in tokens. Default 64.
    pub max_depth: usize,
    /// Occurrences (per index) whose continuations are merged into the tree. Default 8.
    pub occurrences: usize,
    /// Most drafted nodes verified per step. Default 64.
    pub max_nodes: usize,
    /// Draft from, and add finished requests to, the global history. Default on.
    pub global: bool,
    /// Never draft from earlier requests with the very same prompt (benchmarks: a prompt must
    /// not be sped up by its own earlier answer). Default off.
    pub exclude_same_prompt: bool,
    /// Standard deviations below the mean acceptance a node is priced at. Default 0.9: on the
    /// stepped cost curve (every 4-row step measured), replaying the main set's 52 recorded
    /// answers through the drafter (`treespec-bench` example `suffix_replay`) gave 1.301× plain
    /// at 0.9 against 1.288× at 1 and 1.305× at 0.8, where translation starts to lose.
    pub pessimism: f64,
    /// Every this many steps, price little-tried cells optimistically (0 = never). Default 16.
    pub explore_every: u32,
    /// Re-anchor copies broken by an edit: while the suffix match is short after a long copy of
    /// the request's own text broke, also draft the places where the copy may resume near where
    /// it stood. Default on.
    pub reanchor: bool,
    /// Without cost curves: keep nodes whose path value is at least this. Default 0.3.
    pub min_value: f64,
    /// The measured cost curves: with them a step keeps the prefix with the best gain.
    pub costs: Option<Arc<SharedCosts>>,
    /// State shared by every drafter of the method.
    pub shared: Arc<SuffixShared>,
}

impl Default for SuffixConfig {
    fn default() -> Self {
        Self {
            max_match: 64,
            max_depth: 64,
            occurrences: 8,
            max_nodes: 64,
            global: true,
            exclude_same_prompt: false,
            pessimism: 0.9,
            explore_every: 16,
            reanchor: true,
            min_value: 0.3,
            costs: None,
            shared: SuffixShared::empty(),
        }
    }
}

impl SuffixConfig {
    /// Check every knob's domain; the message names the knob.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::InvalidRequest(format!("suffix {m}")));
        for (name, v) in [
            ("max_match", self.max_match),
            ("max_depth", self.max_depth),
            ("occurrences", self.occurrences),
            ("max_nodes", self.max_nodes),
        ] {
            if v == 0 {
                return bad(format!("{name} must be ≥ 1"));
            }
        }
        if self.max_match < 2 {
            return bad(format!("max_match must be ≥ 2 (the shortest key), got {}", self.max_match));
        }
        if !(self.pessimism.is_finite() && (0.0..=5.0).contains(&self.pessimism)) {
            return bad(format!("pessimism must be in [0, 5], got {}", self.pessimism));
        }
        if !(self.min_value.is_finite() && (0.0..=1.0).contains(&self.min_value)) {
            return bad(format!("min_value must be in [0, 1], got {}", self.min_value));
        }
        Ok(())
    }
}

/// Per-generation counters of a [`SuffixDrafter`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SuffixStats {
    /// `propose` calls.
    pub steps: u64,
    /// Steps whose own text had a match.
    pub local_hits: u64,
    /// Steps where the global history had a match.
    pub global_hits: u64,
    /// Steps that verified at least one node.
    pub drafting_steps: u64,
    /// Steps priced optimistically.
    pub explore_steps: u64,
    /// Nodes verified, summed over steps.
    pub verified: u64,
    /// Verified nodes accepted.
    pub accepted: u64,
    /// Steps whose trie held re-anchoring chains.
    pub reanchor_steps: u64,
    /// Re-anchoring nodes in the proposals (verified or not, before a batch budget's cut).
    pub anchored_nodes_proposed: u64,
    /// Re-anchoring nodes verified.
    pub anchored_nodes_verified: u64,
    /// Re-anchoring nodes verified and accepted.
    pub anchored_nodes_accepted: u64,
}

/// Most nodes an exploration step verifies beyond what the pessimistic prices would: this many,
/// plus as many again as they keep. Doubling lets a long copy reach, within a few exploration
/// steps, the depths its pessimistic price never lets it verify (an untried cell is priced near
/// 0.89 however good its prior, and 16 such nodes in a row are worth almost nothing), while a
/// weak match costs at most a few extra rows.
const EXPLORE_EXTRA: usize = 4;

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

/// A proposal's whole trie (not only the nodes verified), scored at the next step against the
/// tokens the target emitted meanwhile. A free draft needs no verification to be learned from:
/// whether each child of the emitted path was the token that came next is known for free once the
/// text has moved on. So the pricing learns from every match, including the many it priced out —
/// which is how a cell priced too low gets to show it is better (a copy of an article being
/// summarised), without paying rows to explore it.
#[derive(Debug)]
struct Shadow {
    /// History length when proposed: the root is `history[len − 1]`, depth-d nodes predict
    /// `history[len + d − 1]`.
    len: usize,
    /// The whole trie, and each node's features and posterior mean acceptance when proposed.
    trie: TokenTree,
    features: Vec<Features>,
    means: Vec<f64>,
    /// Each trie node's id in the proposal (`None`: not proposed).
    proposed: Vec<Option<usize>>,
    /// Rows of the proposal that were verified (set by `observe`; a batch budget may cut it).
    verified_rows: usize,
}

/// The shared prices pool every request, but whether a match continues depends on the text: an
/// article being summarised or code being edited keeps following its matches, a worked math
/// answer quotes a few words of the question and moves on. Each request keeps a moving tally of
/// its scored nodes (verified or not) — how many were right against how many the shared prices
/// expected — and scales every price's odds by that ratio: the pooled knowledge, bent toward what
/// this text has shown.
#[derive(Debug, Clone, Copy, PartialEq)]
struct RequestCalibration {
    hits: f64,
    expected: f64,
    trials: f64,
}

/// Per scored node, the weight the older node tally keeps (a memory of about 30 nodes).
const NODE_DECAY: f64 = 0.97;
/// Per verified step, the weight the older step tally keeps (a memory of about 10 steps).
const STEP_DECAY: f64 = 0.9;
/// Pseudo-nodes at the shared prices' own rate, so that a request's first few nodes move its
/// ratios only a little.
const CALIBRATION_PRIOR: f64 = 3.0;
/// The ratios' range.
const CALIBRATION_RANGE: (f64, f64) = (0.25, 4.0);

impl RequestCalibration {
    const NEUTRAL: Self = Self { hits: 0.0, expected: 0.0, trials: 0.0 };

    /// Add `hits` successes out of `trials` against `expected`, the older tally weighted by
    /// `decay`.
    fn record(&mut self, hits: f64, expected: f64, trials: f64, decay: f64) {
        self.hits = self.hits * decay + hits;
        self.expected = self.expected * decay + expected;
        self.trials = self.trials * decay + trials;
    }

    /// Observed over expected successes, with the prior pseudo-nodes.
    fn ratio(&self) -> f64 {
        ((self.hits + CALIBRATION_PRIOR) / (self.expected + CALIBRATION_PRIOR))
            .clamp(CALIBRATION_RANGE.0, CALIBRATION_RANGE.1)
    }

    /// Observed over expected failures, with the prior pseudo-nodes.
    fn miss_ratio(&self) -> f64 {
        let missed = (self.trials - self.hits).max(0.0);
        let expected = (self.trials - self.expected).max(0.0);
        ((missed + CALIBRATION_PRIOR) / (expected + CALIBRATION_PRIOR))
            .clamp(CALIBRATION_RANGE.0, CALIBRATION_RANGE.1)
    }

    /// `p` bent by what the request showed. Fewer hits than priced: the price is scaled by the
    /// ratio (a request whose nodes came true a third as often gets a third of each price). More:
    /// the odds are scaled by the hits' ratio over the misses' ratio, the shift of a logistic
    /// calibration — a copy priced 0.8 a node in a request that missed a quarter as often as
    /// expected is priced about 0.94 (scaling by the hits' ratio alone could not get it past
    /// 0.8 × 1.25), while a weak match stays weak (0 stays 0).
    fn adjust(&self, p: f64) -> f64 {
        let r = self.ratio();
        if r < 1.0 {
            return (p * r).clamp(0.0, 1.0);
        }
        let m = r / self.miss_ratio();
        let denominator = 1.0 - p + p * m;
        if denominator <= 0.0 {
            p
        } else {
            (p * m / denominator).clamp(0.0, 1.0)
        }
    }
}

impl Shadow {
    /// Record every not-yet-verified child along the path the text took since the proposal in
    /// the shared prices, and every child (verified or not) in the request's calibration.
    fn learn(&self, history: &[TokenId], pricing: &mut SuffixPricing, calibration: &mut RequestCalibration) {
        let Some(emitted) = history.get(self.len..) else { return };
        let mut at = ROOT;
        for &next in emitted {
            let mut taken = None;
            for &id in self.trie.children(at) {
                let hit = self.trie.node(id).token == next;
                // Verified nodes were recorded by `observe`.
                if self.proposed[id].is_none_or(|row| row >= self.verified_rows) {
                    pricing.record(&self.features[id], hit);
                }
                // The request's tally is of how its text follows its matches: the guesses of where
                // a broken copy resumes, several a step after an edit, would drown it.
                if !matches!(self.features[id], Features::Anchored(_)) {
                    calibration.record(f64::from(hit), self.means[id], 1.0, NODE_DECAY);
                }
                if hit {
                    taken = Some(id);
                }
            }
            match taken {
                Some(id) => at = id,
                None => return,
            }
        }
    }
}

/// What [`SuffixDrafter::select`] chose.
struct Selection {
    /// The trie's nodes in value order.
    order: Vec<usize>,
    /// How many of them to verify.
    keep: usize,
    /// The expected gain of verifying them.
    gain: f64,
    /// Every trie node's path value, and its posterior mean acceptance under the shared prices.
    value: Vec<f64>,
    means: Vec<f64>,
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

    /// The last proposal was not verified (another drafter's was): learn nothing from this step.
    pub fn discard_proposal(&mut self) {
        self.features.clear();
        self.values.clear();
    }

    /// The nodes of `tree` in value order and how many of them to verify (at most `room`): every
    /// node priced pessimistically, or on an exploration step (`explore`) little-tried cells
    /// optimistically.
    fn select(&self, tree: &TokenTree, features: &[Features], room: usize, explore: bool) -> Selection {
        let pricing = self.config.shared.pricing();
        let z = self.config.pessimism;
        let mut value = vec![1.0; tree.len()];
        let mut means = vec![1.0; tree.len()];
        for (id, node) in tree.nodes().iter().enumerate().skip(1) {
            let f = &features[id];
            let price = if explore { pricing.exploration_price(f, z) } else { pricing.price(f, z) };
            let price = self.calibration.adjust(price);
            value[id] = value[node.parent.unwrap_or(ROOT)] * price;
            means[id] = pricing.posterior(f).0;
        }
        drop(pricing);
        // A request whose verified steps fell short of what their values promised has every
        // path value scaled down by as much (never up: the node prices already rose with it).
        let shortfall = self.bets.ratio().min(1.0);
        for v in value.iter_mut().skip(1) {
            *v *= shortfall;
        }
        let order = value_order(tree, &value);
        let values: Vec<f64> = order.iter().take(room).map(|&n| value[n]).collect();
        let (keep, gain) = match &self.budget {
            Some(b) => b.economics().best_prefix(&values),
            None => (values.iter().take_while(|&&v| v >= self.config.min_value).count(), 0.0),
        };
        Selection { order, keep, gain, value, means }
    }

    /// The merged continuation trie for `history` as a token tree, with each node's features:
    /// the suffix matches' continuations, and the re-anchoring chains.
    fn trie(&mut self, history: &[TokenId], depth: usize) -> Result<(TokenTree, Vec<Features>)> {
        let limits =
            LookupLimits { want: self.config.occurrences, scan: 64, max_match: self.config.max_match };
        let local = self.local.lookup(history, limits);
        let shared = self.config.shared.clone();
        let global_history = shared.history();
        let exclude = self.config.exclude_same_prompt.then_some(self.prompt_key);
        let global =
            if self.config.global { global_history.lookup(history, limits, exclude) } else { Vec::new() };
        self.stats.local_hits += !local.is_empty() as u64;
        self.stats.global_hits += !global.is_empty() as u64;
        let sources = [
            Matches { index: &self.local, occurrences: &local, global: false },
            Matches { index: global_history.index(), occurrences: &global, global: true },
        ];
        let root = *history.last().expect("history holds the root");
        let mut trie = continuation_trie(root, &sources, depth, TRIE_NODES);
        drop(global_history);
        if self.config.reanchor {
            // Only the history (text emitted at earlier steps) places the anchor and the chains.
            let resumes: Vec<Resume> = self.anchors.update(history, local.first().copied()).to_vec();
            let chains: Vec<(Resume, &[TokenId])> =
                resumes.iter().map(|r| (*r, &history[r.start..history.len().min(r.start + depth)])).collect();
            graft_resumes(&mut trie, &chains, TRIE_NODES + RESUME_NODES);
            self.stats.reanchor_steps += !chains.is_empty() as u64;
        }
        let mut tree = TokenTree::new(root);
        for node in &trie[1..] {
            tree.add(node.parent, node.token, Draw::Deterministic, 0.0)?;
        }
        Ok((tree, trie.iter().map(|n| n.priced()).collect()))
    }
}

impl Drafter for SuffixDrafter {
    fn name(&self) -> &str {
        "suffix"
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
        let (tree, features) = self.trie(ctx.history, depth)?;
        let explore = self.config.explore_every > 0
            && self.stats.steps.is_multiple_of(self.config.explore_every as u64);
        self.stats.explore_steps += explore as u64;
        let Selection { mut order, mut keep, gain, value, means } =
            self.select(&tree, &features, room, false);
        if explore {
            // Little-tried cells at their optimistic price, a few nodes past the cautious choice.
            let optimistic = self.select(&tree, &features, room, true);
            (order, keep) = (optimistic.order, optimistic.keep.min(2 * keep + EXPLORE_EXTRA));
        }
        // The kept nodes in value order (parents come first in it), so that every arena prefix is
        // the best tree of its size: a batch budget may cut the proposal by truncating it.
        let mut cut = TokenTree::new(tree.node(ROOT).token);
        let mut new_id = vec![None; tree.len()];
        new_id[ROOT] = Some(ROOT);
        self.features.push(features[ROOT]);
        for &n in &order[..keep] {
            let node = tree.node(n);
            let parent = node
                .parent
                .and_then(|p| new_id[p])
                .ok_or_else(|| EngineError::State(format!("suffix: node {n} ordered before its parent")))?;
            new_id[n] = Some(cut.add(parent, node.token, Draw::Deterministic, 0.0)?);
            self.features.push(features[n]);
            self.stats.anchored_nodes_proposed += features[n].is_anchored() as u64;
            // Pessimistic values, non-increasing even where exploration reordered the nodes.
            let floor = self.values.last().copied().unwrap_or(1.0);
            self.values.push(value[n].min(floor));
        }
        self.last_gain = gain.max(0.0);
        self.shadow = Some(Shadow {
            len: ctx.history.len(),
            trie: tree,
            features,
            means,
            proposed: new_id,
            verified_rows: 0,
        });
        Ok(cut)
    }

    fn cuttable(&self) -> Option<Cuttable<'_>> {
        let target = self.budget.as_ref()?.target();
        (!self.values.is_empty()).then_some(Cuttable { values: &self.values, target })
    }

    fn observe_cost(&mut self, target_rows: usize, target_ms: f64) {
        if let Some(b) = self.budget.as_mut() {
            b.observe_target(target_rows, target_ms);
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
            // The guard above keeps the verified tree within the proposal's values.
            let expected: f64 = self.values[..tree.drafted()].iter().sum();
            self.bets.record(outcome.accepted.len() as f64, expected, tree.drafted() as f64, STEP_DECAY);
        } else {
            // A step that bet nothing: the tally fades toward the shared prices' own rate. Only
            // verified bets move it, so without this one long bet that fell short could keep a
            // request from drafting for good (its scaled-down values never pay for a row again),
            // through a long exact repetition too.
            self.bets.record(0.0, 0.0, 0.0, STEP_DECAY);
        }
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
        let s = &self.stats;
        let suffix = SuffixCounts {
            local_hit_steps: s.local_hits,
            global_hit_steps: s.global_hits,
            drafting_steps: s.drafting_steps,
            explore_steps: s.explore_steps,
            verified_nodes: s.verified,
            accepted_nodes: s.accepted,
            node_accept_rate: (s.verified > 0).then(|| s.accepted as f64 / s.verified as f64),
        };
        ExtraStats { suffix: Some(suffix), ..ExtraStats::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use treespec_core::sampling::SamplingParams;
    use treespec_core::suffix::NodeFeatures;

    /// Pricing that has seen exact copies accepted many times, at every match length and depth.
    fn trained(shared: &SuffixShared) {
        trained_at(shared, 1);
    }

    /// Pricing that has seen exact copies at every match length and depth, one in `fail_every`
    /// of them (drawn pseudo-randomly) rejected (1 = none).
    fn trained_at(shared: &SuffixShared, fail_every: u64) {
        let mut p = shared.pricing();
        let mut i: u64 = 1;
        for _ in 0..40 {
            for match_len in [8, 12, 20, 40, 64] {
                for depth in 1..=64 {
                    for global in [false, true] {
                        let f = NodeFeatures { match_len, depth, share: 1.0, support: 1, global };
                        i = i.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        p.record(&f, fail_every <= 1 || !(i >> 33).is_multiple_of(fail_every));
                    }
                }
            }
        }
    }

    /// A text that quotes 40 distinct tokens after `head` and then, as its output so far, has
    /// copied the first 20 of them: the quote and the text.
    fn copying(head: &[TokenId]) -> (Vec<TokenId>, Vec<TokenId>) {
        let quote: Vec<TokenId> = (100..140).collect();
        let mut history = head.to_vec();
        history.extend(&quote);
        history.extend([3, 4]);
        history.extend(&quote[..20]);
        (quote, history)
    }

    fn ctx<'a>(history: &'a [TokenId], sampler: &'a Sampler) -> ProposeContext<'a> {
        ProposeContext { history, max_nodes: 64, max_depth: 64, sampler, batch_rows: 0, batch_cut: false }
    }

    #[test]
    fn bad_configs_name_the_knob() {
        for (c, knob) in [
            (SuffixConfig { max_match: 1, ..Default::default() }, "max_match"),
            (SuffixConfig { occurrences: 0, ..Default::default() }, "occurrences"),
            (SuffixConfig { pessimism: f64::NAN, ..Default::default() }, "pessimism"),
            (SuffixConfig { min_value: 2.0, ..Default::default() }, "min_value"),
        ] {
            let e = SuffixDrafter::new(c).err().expect("invalid").to_string();
            assert!(e.contains(knob), "{e}");
        }
    }

    #[test]
    fn a_long_copy_is_drafted_far_and_a_weak_match_not_at_all() {
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let shared = SuffixShared::empty();
        let config = SuffixConfig { explore_every: 0, shared: shared.clone(), ..Default::default() };
        let mut d = SuffixDrafter::new(config).unwrap();
        // The prompt quotes 40 distinct tokens; the output has copied the first 20 of them.
        let (quote, history) = copying(&[1, 2]);
        d.begin(&history, &sampler, 0).unwrap();
        // Untrained, the pessimistic prior drafts a few tokens of the copy, not all of it.
        let cautious = d.propose(&ctx(&history, &sampler)).unwrap();
        assert!((1..20).contains(&cautious.max_depth()), "{}", cautious.max_depth());
        d.discard_proposal();
        trained(&shared);
        let tree = d.propose(&ctx(&history, &sampler)).unwrap();
        assert!(tree.max_depth() >= 20, "the rest of the quote, then what followed it");
        assert_eq!(tree.leaves().len(), 1);
        assert_eq!(tree.path_tokens(tree.leaves()[0])[..20], quote[20..]);
        // A 2-token match with a split continuation is not worth a row.
        let weak = vec![7, 8, 1, 7, 8, 2, 7, 8];
        d.begin(&weak, &sampler, 0).unwrap();
        assert_eq!(d.propose(&ctx(&weak, &sampler)).unwrap().drafted(), 0);
    }

    #[test]
    fn prices_carried_to_new_shared_state_draft_the_long_copy_at_once() {
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let learned = SuffixShared::empty();
        trained(&learned);
        // What a later process starts with: an empty history, the saved prices.
        let warm = SuffixShared::with_pricing(
            GlobalHistory::new(DEFAULT_CAP_TOKENS).unwrap(),
            learned.pricing_snapshot(),
        );
        assert_eq!(*warm.pricing(), *learned.pricing());
        let (_, history) = copying(&[1, 2]);
        let depth = |shared: &Arc<SuffixShared>| {
            let config = SuffixConfig { explore_every: 0, shared: shared.clone(), ..Default::default() };
            let mut d = SuffixDrafter::new(config).unwrap();
            d.begin(&history, &sampler, 0).unwrap();
            d.propose(&ctx(&history, &sampler)).unwrap().max_depth()
        };
        assert!(depth(&warm) >= 20, "the learned prices draft the rest of the quote");
        assert!(depth(&SuffixShared::empty()) < 20, "the prior is cautious");
        // set_pricing replaces the prices of state already shared.
        let cold = SuffixShared::empty();
        cold.set_pricing(learned.pricing_snapshot());
        assert!(depth(&cold) >= 20);
    }

    #[test]
    fn a_long_context_makes_the_same_copy_verify_fewer_rows() {
        use crate::auto_budget::{CostModel, SharedCosts};
        use treespec_core::cost::CostCurve;
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        // The 1.5B target's short-cache shape, and 40 µs per row per committed token (steep, so
        // that the test does not hinge on a near-tie).
        let curve = CostCurve::from_points(&[(1, 25.0), (4, 67.0), (8, 112.0), (16, 136.0), (32, 244.0)])
            .unwrap()
            .with_context_cost(0.04, 64)
            .unwrap();
        let drafted = |filler: usize| {
            let shared = SuffixShared::empty();
            // Copies right 19 times in 20: near-certain copies pay at any context (the context
            // surcharge is on plain decoding's row too), these are worth fewer rows as rows get dear.
            trained_at(&shared, 20);
            let costs = SharedCosts::new(CostModel::new(curve.clone(), None));
            let config = SuffixConfig { explore_every: 0, shared, costs: Some(costs), ..Default::default() };
            let mut d = SuffixDrafter::new(config).unwrap();
            // The same quote and copy, after `filler` tokens of unrelated prompt.
            let unrelated: Vec<TokenId> = (0..filler as TokenId).map(|i| 1000 + i).collect();
            let (_, history) = copying(&unrelated);
            d.begin(&history, &sampler, 0).unwrap();
            d.propose(&ctx(&history, &sampler)).unwrap().drafted()
        };
        let (short, long) = (drafted(0), drafted(1500));
        assert!(short >= 15, "a trained copy on a short cache rides the curve to 16 rows: {short}");
        assert!(long < short, "every row costs 60 ms more at 1,500 tokens: {long} vs {short}");
    }

    #[test]
    fn exploration_tries_a_few_nodes_the_pessimistic_price_keeps_out() {
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let weak = vec![7, 8, 1, 7, 8, 2, 7, 8, 3, 4, 5, 6];
        let cautious = SuffixConfig { explore_every: 0, ..Default::default() };
        let mut d = SuffixDrafter::new(cautious.clone()).unwrap();
        d.begin(&weak[..8], &sampler, 0).unwrap();
        assert_eq!(d.propose(&ctx(&weak[..8], &sampler)).unwrap().drafted(), 0);
        let mut d = SuffixDrafter::new(SuffixConfig { explore_every: 1, ..cautious }).unwrap();
        d.begin(&weak[..8], &sampler, 0).unwrap();
        let tree = d.propose(&ctx(&weak[..8], &sampler)).unwrap();
        assert!((1..=EXPLORE_EXTRA).contains(&tree.drafted()), "{}", tree.drafted());
        assert_eq!(d.stats().explore_steps, 1);
    }

    #[test]
    fn exploring_a_long_copy_doubles_what_the_pessimistic_price_keeps() {
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let (_, history) = copying(&[1, 2]);
        let drafted = |explore_every: u32| {
            let config = SuffixConfig { explore_every, ..Default::default() };
            let mut d = SuffixDrafter::new(config).unwrap();
            d.begin(&history, &sampler, 0).unwrap();
            d.propose(&ctx(&history, &sampler)).unwrap().drafted()
        };
        let (cautious, explored) = (drafted(0), drafted(1));
        assert!(cautious >= 1, "{cautious}");
        // Untried deep cells: the exploration step goes past the cautious cut by more than the
        // fixed extra, up to twice it plus the extra.
        assert!(explored > cautious + EXPLORE_EXTRA, "{explored} vs {cautious}");
        assert!(explored <= 2 * cautious + EXPLORE_EXTRA, "{explored} vs {cautious}");
    }

    #[test]
    fn finished_requests_feed_the_next_ones_but_not_the_same_prompt_when_excluded() {
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let shared = SuffixShared::empty();
        trained(&shared);
        let config = SuffixConfig { shared: shared.clone(), explore_every: 0, ..Default::default() };
        let answer: Vec<TokenId> = (200..230).collect();
        let mut first = SuffixDrafter::new(config.clone()).unwrap();
        first.begin(&[1, 2, 3], &sampler, 0).unwrap();
        let mut text = vec![1, 2, 3];
        text.extend(&answer);
        first.finish(&text);
        assert_eq!(shared.history().docs(), 1);
        // Another prompt whose output starts like the earlier answer drafts the rest of it.
        let mut second = SuffixDrafter::new(config.clone()).unwrap();
        let mut history = vec![9, 9];
        history.extend(&answer[..12]);
        second.begin(&history, &sampler, 0).unwrap();
        let tree = second.propose(&ctx(&history, &sampler)).unwrap();
        assert!(tree.drafted() >= 10, "{}", tree.drafted());
        assert_eq!(second.stats().global_hits, 1);
        // The same prompt is kept from its own answer when the benchmark asks for it.
        let mut same = SuffixDrafter::new(SuffixConfig { exclude_same_prompt: true, ..config }).unwrap();
        let mut again = vec![1, 2, 3];
        same.begin(&again, &sampler, 0).unwrap();
        again.extend(&answer[..12]);
        assert_eq!(same.propose(&ctx(&again, &sampler)).unwrap().drafted(), 0);
    }

    /// The outcome of a step that verified `accepted` (drafted node ids, root's child first) and
    /// then emitted `bonus`.
    fn outcome(tree: &TokenTree, accepted: &[usize], bonus: TokenId) -> VerifyOutcome {
        let mut tokens: Vec<TokenId> = accepted.iter().map(|&n| tree.node(n).token).collect();
        tokens.push(bonus);
        VerifyOutcome { accepted: accepted.to_vec(), tokens, depths: Vec::new() }
    }

    #[test]
    fn priced_out_children_are_learned_from_the_text_that_followed() {
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let shared = SuffixShared::empty();
        let config = SuffixConfig { explore_every: 0, shared: shared.clone(), ..Default::default() };
        let mut d = SuffixDrafter::new(config).unwrap();
        // After [7, 8] the text went on once with 1 and once with 2: a split vote, not verified.
        let mut text = vec![7, 8, 1, 7, 8, 2, 7, 8];
        d.begin(&text, &sampler, 0).unwrap();
        let tree = d.propose(&ctx(&text, &sampler)).unwrap();
        assert_eq!(tree.drafted(), 0);
        d.observe(&tree, &outcome(&tree, &[], 1)).unwrap();
        assert_eq!(shared.pricing().total_trials(), 0, "nothing was verified");
        // The text took 1: at the next step both priced-out children are scored, for free.
        text.push(1);
        d.propose(&ctx(&text, &sampler)).unwrap();
        assert_eq!(shared.pricing().total_trials(), 2);
        // One hit (the child 1) and one miss, against what their prices expected.
        assert!((d.calibration.hits - 1.0).abs() < 0.05 && d.calibration.expected > 0.0);
    }

    #[test]
    fn verified_nodes_are_learned_once() {
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let shared = SuffixShared::empty();
        trained(&shared);
        let config = SuffixConfig { explore_every: 0, shared: shared.clone(), ..Default::default() };
        let mut d = SuffixDrafter::new(config).unwrap();
        let (_, mut history) = copying(&[1, 2]);
        d.begin(&history, &sampler, 0).unwrap();
        let tree = d.propose(&ctx(&history, &sampler)).unwrap();
        assert!(tree.drafted() >= 5 && tree.leaves().len() == 1, "one long chain");
        let before = shared.pricing().total_trials();
        // The target took the chain's first three tokens and then another than the fourth.
        let step = outcome(&tree, &[1, 2, 3], 9999);
        d.observe(&tree, &step).unwrap();
        assert_eq!(shared.pricing().total_trials(), before + 4, "three accepted, one rejected");
        // The next step scores the trie along the same path: every node on it was verified.
        history.extend(&step.tokens);
        d.propose(&ctx(&history, &sampler)).unwrap();
        assert_eq!(shared.pricing().total_trials(), before + 4);
    }

    #[test]
    fn a_request_calibration_bends_prices_toward_what_its_text_showed() {
        let neutral = RequestCalibration::NEUTRAL;
        assert!((neutral.adjust(0.6) - 0.6).abs() < 1e-12);
        let (mut leaving, mut following) = (neutral, neutral);
        for _ in 0..30 {
            leaving.record(0.0, 0.7, 1.0, NODE_DECAY);
            following.record(1.0, 0.5, 1.0, NODE_DECAY);
        }
        assert!(leaving.ratio() < 1.0 && following.ratio() > 1.0);
        assert!(leaving.ratio() >= CALIBRATION_RANGE.0 && following.ratio() <= CALIBRATION_RANGE.1);
        for c in [leaving, following] {
            assert_eq!(c.adjust(0.0), 0.0);
            assert!(c.adjust(0.3) < c.adjust(0.6) && c.adjust(0.6) < c.adjust(1.0), "order is kept");
        }
        assert_eq!((leaving.adjust(1.0), following.adjust(1.0)), (leaving.ratio(), 1.0));
        assert!(leaving.adjust(0.6) < 0.6 && following.adjust(0.6) > 0.6 && following.adjust(0.6) < 1.0);
        // Below 1 the ratio scales the price itself: a third as many hits, a third of the price.
        assert!((leaving.adjust(0.9) - 0.9 * leaving.ratio()).abs() < 1e-12);
        // A copy priced 0.8 a node that came true every time: its misses' ratio, not its hits',
        // prices it (hits alone could not lift it past 0.8 × 1.25).
        let mut copying = neutral;
        for _ in 0..30 {
            copying.record(1.0, 0.8, 1.0, NODE_DECAY);
        }
        assert!(copying.ratio() < 1.25 && copying.adjust(0.8) > 0.9, "{}", copying.adjust(0.8));
        // A few nodes move the ratio only a little.
        let mut one = neutral;
        one.record(0.0, 0.9, 1.0, NODE_DECAY);
        assert!(one.ratio() > 0.7);
    }

    #[test]
    fn a_request_that_keeps_leaving_its_matches_drafts_less_of_the_same_copy() {
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let shared = SuffixShared::empty();
        trained(&shared);
        let config = SuffixConfig { explore_every: 0, shared, ..Default::default() };
        let (_, history) = copying(&[1, 2]);
        let drafted = |calibration: RequestCalibration| {
            let mut d = SuffixDrafter::new(config.clone()).unwrap();
            d.begin(&history, &sampler, 0).unwrap();
            d.calibration = calibration;
            d.propose(&ctx(&history, &sampler)).unwrap().drafted()
        };
        let mut leaving = RequestCalibration::NEUTRAL;
        for _ in 0..50 {
            leaving.record(0.0, 0.9, 1.0, NODE_DECAY);
        }
        let (neutral, bent) = (drafted(RequestCalibration::NEUTRAL), drafted(leaving));
        assert!(neutral >= 20 && bent < neutral, "{bent} vs {neutral}");
    }

    /// A drafter on `trained` prices, begun on a request that copies a 40-token quote (no
    /// exploration steps).
    fn copying_drafter() -> (SuffixDrafter, Sampler, Vec<TokenId>) {
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let shared = SuffixShared::empty();
        trained(&shared);
        let config = SuffixConfig { explore_every: 0, shared, ..Default::default() };
        let mut d = SuffixDrafter::new(config).unwrap();
        let (_, history) = copying(&[1, 2]);
        d.begin(&history, &sampler, 0).unwrap();
        (d, sampler, history)
    }

    /// Three verified long chains, each rejected at the root's child.
    fn fail_three_bets(d: &mut SuffixDrafter, sampler: &Sampler, history: &[TokenId]) {
        for _ in 0..3 {
            let tree = d.propose(&ctx(history, sampler)).unwrap();
            d.observe(&tree, &outcome(&tree, &[], 9999)).unwrap();
        }
    }

    #[test]
    fn a_long_bet_that_falls_short_scales_the_next_ones_down() {
        let (mut d, sampler, history) = copying_drafter();
        let first = d.propose(&ctx(&history, &sampler)).unwrap();
        assert!(first.drafted() >= 20);
        // Three verified long chains each rejected at the root's child: the per-node prices barely
        // move (three misses), the step tally sees some 60 promised tokens and none delivered.
        fail_three_bets(&mut d, &sampler, &history);
        assert!(d.bets.ratio() <= 0.3, "{}", d.bets.ratio());
        let after = d.propose(&ctx(&history, &sampler)).unwrap();
        assert!(after.drafted() < first.drafted(), "{} vs {}", after.drafted(), first.drafted());
    }

    #[test]
    fn a_request_that_stopped_betting_after_a_failed_bet_drafts_again_later() {
        let (mut d, sampler, history) = copying_drafter();
        fail_three_bets(&mut d, &sampler, &history);
        // The failed bets price everything out; the steps that bet nothing let the tally fade.
        let mut idle = 0;
        loop {
            let tree = d.propose(&ctx(&history, &sampler)).unwrap();
            if tree.drafted() > 0 {
                break;
            }
            d.observe(&tree, &outcome(&tree, &[], 9999)).unwrap();
            idle += 1;
            assert!(idle < 60, "still locked out: {}", d.bets.ratio());
        }
        assert!(idle >= 1, "the failed bets held it back for a while");
    }

    /// Pricing that has seen exact copies (as `trained`) and every kind of resumed copy accepted
    /// many times, the two interleaved (old trials are forgotten).
    fn trained_with_resumes(shared: &SuffixShared) {
        use treespec_core::suffix::{AnchorFeatures, ResumeKind};
        let mut p = shared.pricing();
        for _ in 0..40 {
            for match_len in [8, 12, 20, 40, 64] {
                for depth in 1..=64 {
                    for global in [false, true] {
                        p.record(&NodeFeatures { match_len, depth, share: 1.0, support: 1, global }, true);
                    }
                }
            }
            for kind in ResumeKind::ALL {
                for evidence in 0..=3 {
                    for depth in 1..=16 {
                        p.record(&AnchorFeatures { kind, evidence, depth }, true);
                    }
                }
            }
        }
    }

    /// Whether `tokens` is a path of `tree` from the root.
    fn has_chain(tree: &TokenTree, tokens: &[TokenId]) -> bool {
        let mut at = ROOT;
        for &t in tokens {
            match tree.children(at).iter().find(|&&c| tree.node(c).token == t) {
                Some(&c) => at = c,
                None => return false,
            }
        }
        true
    }

    /// The drafter on the quote being copied (`copying`), its prices trained on copies and
    /// resumes, after the step that drafted the rest of the quote: the target rejected it and
    /// emitted `edit` instead, one token a step (the bets' tally kept neutral). Returns the
    /// drafter, the text and the proposal after the edit.
    fn after_edit(reanchor: bool, edit: &[TokenId]) -> (SuffixDrafter, Vec<TokenId>, TokenTree) {
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let shared = SuffixShared::empty();
        trained_with_resumes(&shared);
        let config = SuffixConfig { explore_every: 0, reanchor, shared, ..Default::default() };
        let mut d = SuffixDrafter::new(config).unwrap();
        let (quote, mut history) = copying(&[1, 2]);
        d.begin(&history, &sampler, 0).unwrap();
        let mut tree = d.propose(&ctx(&history, &sampler)).unwrap();
        assert!(has_chain(&tree, &quote[20..30]), "the copy is drafted");
        for &t in edit {
            d.observe(&tree, &outcome(&tree, &[], t)).unwrap();
            // A long chain rejected at once scales every later path value down (the bets'
            // tally, tested above); here only where the copy resumes is under test.
            d.bets = RequestCalibration::NEUTRAL;
            history.push(t);
            tree = d.propose(&ctx(&history, &sampler)).unwrap();
        }
        (d, history, tree)
    }

    #[test]
    fn an_edit_in_a_copy_is_resumed_at_once_with_re_anchoring_and_not_without() {
        let quote: Vec<TokenId> = copying(&[]).0;
        // The target's tokens instead of the copy's quote[20], where the copy goes on, and how
        // much of that at least is verified at once (the request's tally of the rejected nodes
        // before trims the chains).
        let cases: [(&str, Vec<TokenId>, &[TokenId], usize); 4] = [
            // 900 inserted: the copy resumes with quote[20].
            ("insertion", vec![900], &quote[20..30], 2),
            // 900 replaced quote[20]: it resumes with quote[21].
            ("replacement", vec![900], &quote[21..31], 2),
            // quote[20..23] deleted: the target emitted quote[23], the copy goes on after it.
            ("deletion", vec![quote[23]], &quote[24..34], 2),
            // Two tokens replaced two: after the second, the copy resumes past both.
            ("two-token replacement", vec![900, 901], &quote[22..32], 1),
        ];
        for (what, edit, resumed, verified) in cases {
            let (d, _, tree) = after_edit(true, &edit);
            assert!(has_chain(&tree, &resumed[..verified]), "{what}: the resumed copy is drafted");
            assert!(d.stats().anchored_nodes_proposed >= verified as u64, "{what}: {:?}", d.stats());
            // The whole resumed copy is in the trie, for the pricing to learn from.
            assert!(has_chain(&d.shadow.as_ref().unwrap().trie, resumed), "{what}");
            assert!(d.stats().reanchor_steps >= 1, "{what}");
            // Without re-anchoring, the edited text matches nothing: nothing is drafted.
            let (off, _, tree) = after_edit(false, &edit);
            assert!(!has_chain(&tree, &resumed[..1]), "{what}");
            assert_eq!(tree.drafted(), 0, "{what}");
            assert_eq!(off.stats().reanchor_steps + off.stats().anchored_nodes_proposed, 0, "{what}");
        }
    }

    #[test]
    fn a_resumed_copy_is_followed_and_then_drafted_by_its_long_match_again() {
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let quote: Vec<TokenId> = copying(&[]).0;
        // quote[20..23] deleted; the target emitted quote[23].
        let (mut d, mut history, tree) = after_edit(true, &[quote[23]]);
        // The target takes two tokens of the skip's chain, then the next copied token.
        let mut path = Vec::new();
        let mut at = ROOT;
        for &t in &quote[24..26] {
            at = *tree.children(at).iter().find(|&&c| tree.node(c).token == t).expect("on the chain");
            path.push(at);
        }
        let step = outcome(&tree, &path, quote[26]);
        d.observe(&tree, &step).unwrap();
        assert_eq!(d.stats().anchored_nodes_accepted, 2, "{:?}", d.stats());
        assert!(d.stats().anchored_nodes_verified >= 2, "{:?}", d.stats());
        history.extend(&step.tokens);
        // The copy agrees with its source again: the anchor follows it to quote[27] (the quote
        // starts after the 2-token head), and so does the trie. The 4-token match since the
        // deletion drafts the same chain: its nodes keep their match's price and teach the
        // follow cells too.
        d.propose(&ctx(&history, &sampler)).unwrap();
        assert_eq!(d.anchors.anchor(), Some((2 + 27, 0)));
        assert_eq!(d.anchors.offered()[0].kind, treespec_core::suffix::ResumeKind::Follow);
        let shadow = d.shadow.as_ref().unwrap();
        assert!(has_chain(&shadow.trie, &quote[27..37]), "the copy is followed");
        let first =
            *shadow.trie.children(ROOT).iter().find(|&&c| shadow.trie.node(c).token == quote[27]).unwrap();
        assert!(
            matches!(shadow.features[first], Features::Both(m, a) if m.match_len == 4
                && a.kind == treespec_core::suffix::ResumeKind::Follow && a.evidence == 3),
            "{:?}",
            shadow.features[first]
        );
        // Four more tokens of it: a strong match (8 tokens since the deletion) drafts it alone.
        history.extend(&quote[27..31]);
        let tree = d.propose(&ctx(&history, &sampler)).unwrap();
        assert!(d.anchors.offered().is_empty(), "{:?}", d.anchors.offered());
        assert!(has_chain(&tree, &quote[31..34]));
    }

    #[test]
    fn resumes_are_learned_from_the_text_that_followed_like_every_node() {
        use treespec_core::suffix::{AnchorFeatures, ResumeKind};
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let shared = SuffixShared::empty();
        let config = SuffixConfig { explore_every: 0, shared: shared.clone(), ..Default::default() };
        let mut d = SuffixDrafter::new(config).unwrap();
        let (quote, mut history) = copying(&[1, 2]);
        d.begin(&history, &sampler, 0).unwrap();
        let tree = d.propose(&ctx(&history, &sampler)).unwrap();
        // 900 inserted: the resumes are in the trie, priced out by their cautious prior.
        d.observe(&tree, &outcome(&tree, &[], 900)).unwrap();
        history.push(900);
        let tree = d.propose(&ctx(&history, &sampler)).unwrap();
        assert_eq!(tree.drafted(), 0);
        assert!(d.stats().reanchor_steps == 1 && d.stats().anchored_nodes_proposed == 0);
        d.observe(&tree, &outcome(&tree, &[], quote[20])).unwrap();
        // The insertion ended: the stay's first node was right, the replacement's wrong.
        let stay = AnchorFeatures { kind: ResumeKind::Stay, evidence: 0, depth: 1 };
        let replace = AnchorFeatures { kind: ResumeKind::Replace, evidence: 0, depth: 1 };
        let fresh = SuffixPricing::new();
        history.push(quote[20]);
        d.propose(&ctx(&history, &sampler)).unwrap();
        let p = shared.pricing();
        assert!(p.posterior(&stay).0 > fresh.posterior(&stay).0);
        assert!(p.posterior(&replace).0 < fresh.posterior(&replace).0);
    }
}
