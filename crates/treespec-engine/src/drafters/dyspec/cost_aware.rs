//! `--budget auto`: DySpec's tree grown only as far as it pays on the measured cost curves.
//!
//! The schedule is the layer one (one batched draft forward per depth). Every node carries two
//! numbers: its raw conditional confidence `r` (its draft probability given the parent) and its
//! calibrated value `a` = the product, along its path, of the calibrated acceptance of each `r`
//! at its depth — the estimated probability that the target accepts it. Decisions, all made from
//! what is already drafted (so under sampling they are stopping rules, and exactness holds by the
//! same argument as DySpec's own dynamic growth):
//!
//! 1. *Draft at all?* Only if an optimistic lookahead (every future depth accepted at the best
//!    calibrated rate) beats plain decoding after paying the draft forwards; otherwise the step
//!    verifies the root alone, and the draft model is not run (a probe every few skipped steps
//!    keeps the estimates honest, unless even perfect acceptance could not pay: then probing
//!    cannot change the answer and the draft model stays idle).
//! 2. *Add the next node of a depth?* While its calibrated value is worth more than the target
//!    time it adds, at the rate to beat (the marginal cost looks a few nodes ahead, so the cheap
//!    steps of the curve are used).
//! 3. *Go one depth deeper?* Only if the lookahead from the new frontier beats the best gain of
//!    the tree as it stands, after paying the draft forwards.
//! 4. Under greedy decoding, every node is a deterministic candidate, so the finished tree is cut
//!    to its best prefix in value order (possibly nothing). Sampled trees are never cut.

use treespec_core::budget::{value_order, Economics};
use treespec_core::tree::{NodeId, TokenTree, ROOT};

use super::{DySpecDrafter, Event, Growth};
use crate::auto_budget::AutoBudget;
use crate::backend::CausalLm;
use crate::draft_model::DraftModel;
use crate::drafter::ProposeContext;
use crate::error::Result;

/// Most frontier nodes fed in one draft forward.
const MAX_FEED: usize = 4;
/// Frontier nodes worth less than this fraction of the best one are not fed.
const FEED_FRACTION: f64 = 0.3;
/// Nodes the marginal-cost rule looks ahead over (a cheap step within this many nodes counts).
const LOOKAHEAD_NODES: usize = 4;

impl<M: CausalLm> DySpecDrafter<M> {
    /// One step under the cost model, in the module's four decisions: draft at all
    /// ([`Self::draft_at_all`]), grow while it pays ([`Self::grow_priced`]), cut to the best
    /// prefix ([`Self::cut_to_best_prefix`]).
    pub(super) fn propose_auto(&mut self, ctx: &ProposeContext) -> Result<TokenTree> {
        let budget = self.config.budget.min(ctx.max_nodes);
        let depth = self.config.max_depth.min(ctx.max_depth);
        let root_only = TokenTree::new(ctx.root());
        if budget == 0 || depth == 0 {
            return Ok(root_only);
        }
        let draft = self.draft_at_all(ctx, depth);
        self.last_gain = 0.0;
        self.last_expected = 1.0;
        if !draft {
            self.auto.as_mut().expect("propose_auto needs the cost model").set_raw(vec![1.0]);
            return Ok(root_only);
        }
        self.sync(ctx.history)?;
        let (tree, cal) = self.grow_priced(ctx, budget, depth)?;
        self.cut_to_best_prefix(ctx, tree, cal)
    }

    /// Decision 1, draft at all: when the lookahead pays, or for a probe; a deferred model only
    /// when what it would add over the steps left repays catching it up.
    fn draft_at_all(&mut self, ctx: &ProposeContext, depth: usize) -> bool {
        let start_rows = if self.synced { self.draft.unfed_len().max(1) } else { 1 };
        let auto = self.auto.as_ref().expect("propose_auto needs the cost model");
        let (look, perfect) = step_lookahead(auto, start_rows, depth);
        let pays = look > self.bar;
        // A probe can only change the answer if drafting would pay at perfect acceptance.
        let could_pay = perfect > self.bar;
        // Probes only a model that already holds the text: on a deferred one a probe would cost
        // the whole prompt's prefill (in a batch, a stall for every request) to learn one step.
        let mut draft = pays || (could_pay && self.synced && auto.probe_due());
        if draft && !self.synced {
            draft = self.catch_up_pays(ctx);
        }
        let pays = pays && draft;
        self.auto.as_mut().expect("propose_auto needs the cost model").note_drafting(pays, draft);
        draft
    }

    /// Whether a deferred model repays being caught up: a prefill of the whole history, paid once,
    /// against what its steps are expected to earn over the tokens still to come
    /// ([`AutoBudget::catch_up_gain`]: the best chain at the acceptance the model has shown, a
    /// modest prior before it has shown any, never the optimistic lookahead a step's own draft
    /// is started on). How many tokens will come is unknown until the answer ends: at most what
    /// is wanted, and, by the Copernican rule, about as many as the answer has had so far. Priced
    /// over all 128 tokens wanted, a 47-token prompt's catch-up (160 ms, six target steps on a
    /// 2-core Zen 5) was taken at the first step of a 22-token answer and never earned back.
    fn catch_up_pays(&self, ctx: &ProposeContext) -> bool {
        let auto = self.auto.as_ref().expect("propose_auto needs the cost model");
        let catch_up = auto.draft_cost(ctx.history.len());
        let answered = ctx.history.len().saturating_sub(self.prompt_len).max(1);
        let to_come = (ctx.max_depth + 1).min(answered) as f64;
        auto.catch_up_gain(to_come, self.bar) > auto.economics().rate * catch_up
    }

    /// Decisions 2 and 3: the tree grown node by node and depth by depth while each pays, with
    /// every node's raw confidence and calibrated value; the draft forwards' times go to the cost
    /// model.
    fn grow_priced(
        &mut self,
        ctx: &ProposeContext,
        budget: usize,
        depth: usize,
    ) -> Result<(TokenTree, Calibrated)> {
        let auto = self.auto.as_mut().expect("propose_auto needs the cost model");
        // The root's row is borrowed from the draft's output: read before the growth feeds it.
        let root_logits = self.draft.start_step()?;
        let mut g = Growth::new(ctx, &mut self.rng, budget, depth)?;
        let mut cal = Calibrated { raw: vec![1.0], value: vec![1.0] };
        let root = g.first_child_event(ROOT, root_logits.row(0))?;
        if let Some(root) = root {
            g.grow_auto(root, &mut self.draft, auto, &mut cal)?;
        }
        let (tree, fed) = (g.tree, g.fed);
        for (rows, ms) in self.draft.take_timings() {
            auto.observe_draft(rows, ms);
        }
        self.stats.drafted += tree.drafted() as u64;
        self.stats.fed += fed;
        Ok((tree, cal))
    }

    /// Decision 4, greedy only: the tree cut to its best prefix in value order
    /// ([`Self::cut_greedy`]). Sampled trees are never cut. Either way the step's expected gain
    /// and tokens are noted and the nodes' raw confidences handed to the calibration.
    fn cut_to_best_prefix(
        &mut self,
        ctx: &ProposeContext,
        tree: TokenTree,
        cal: Calibrated,
    ) -> Result<TokenTree> {
        let (tree, cal) = if ctx.sampler.is_greedy() {
            self.cut_greedy(tree, cal)?
        } else {
            self.note_sampled(&cal);
            (tree, cal)
        };
        self.auto.as_mut().expect("propose_auto needs the cost model").set_raw(cal.raw);
        Ok(tree)
    }

    /// The greedy tree cut to its best prefix in value order, the draft model's rows and the
    /// raw confidences remapped to the nodes kept; the step's expected gain and tokens noted.
    fn cut_greedy(&mut self, tree: TokenTree, cal: Calibrated) -> Result<(TokenTree, Calibrated)> {
        let auto = self.auto.as_mut().expect("propose_auto needs the cost model");
        let order = value_order(&tree, &cal.value);
        let values: Vec<f64> = order.iter().map(|&n| cal.value[n]).collect();
        let (n, gain) = auto.economics().best_prefix(&values);
        self.last_gain = gain;
        self.last_expected = 1.0 + values[..n].iter().sum::<f64>();
        if n == order.len() {
            return Ok((tree, cal));
        }
        let (cut, map) = tree.retain(&order[..n])?;
        self.draft.remap(&map);
        auto.stats.pruned += (tree.drafted() - cut.drafted()) as u64;
        let raw = cal.remapped_raw(&map, cut.len());
        Ok((cut, Calibrated { raw, value: cal.value }))
    }

    /// A sampled tree's expected gain and tokens noted, uncut.
    fn note_sampled(&mut self, cal: &Calibrated) {
        let auto = self.auto.as_ref().expect("propose_auto needs the cost model");
        let sorted = cal.sorted_values();
        self.last_gain = auto.economics().gain(sorted.len(), sorted.iter().sum());
        self.last_expected = 1.0 + sorted.iter().sum::<f64>();
    }

    /// The next forward holds `rows` rows of other requests (see [`ProposeContext::batch_rows`])
    /// and this request's rows attend to `context` committed tokens.
    pub(crate) fn set_forward(&mut self, rows: usize, context: usize) {
        if let Some(a) = self.auto.as_mut() {
            a.set_forward(rows, context);
        }
    }

    /// Whether any chain of this draft model's tokens could beat the rate to beat (see
    /// [`crate::auto_budget::AutoBudget::chain_can_pay`]); always yes without a cost model.
    pub(crate) fn chain_can_pay(&self) -> bool {
        self.auto.as_ref().is_none_or(|a| a.chain_can_pay())
    }

    /// Set the gain a proposal must beat before the draft model runs (see [`Self::last_gain`]).
    pub(crate) fn set_bar(&mut self, bar: f64) {
        self.bar = bar;
    }

    /// The expected tokens of the last proposed tree (the bonus token included).
    pub(crate) fn last_expected(&self) -> f64 {
        self.last_expected
    }

    /// Forget the last proposal because another tree is verified instead: the draft keeps only
    /// its root, and the verified tree is not a calibration trial for this drafter.
    pub(crate) fn discard_proposal(&mut self, tree_len: usize) {
        let mut map = vec![None; tree_len.max(1)];
        map[0] = Some(ROOT);
        self.draft.remap(&map);
        if let Some(a) = self.auto.as_mut() {
            a.set_raw(Vec::new());
        }
    }
}

/// Per-node raw confidence and calibrated value (index = node id).
struct Calibrated {
    raw: Vec<f64>,
    value: Vec<f64>,
}

impl Calibrated {
    /// Record a new node (ids are dense, so it is always the next index).
    fn push(&mut self, tree: &TokenTree, values: &[f64], auto: &AutoBudget, node: NodeId) {
        let parent = tree.node(node).parent.unwrap_or(ROOT);
        let r = if values[parent] > 0.0 { (values[node] / values[parent]).clamp(0.0, 1.0) } else { 0.0 };
        self.raw.push(r);
        self.value.push(self.value[parent] * auto.acceptance(tree.node(node).depth, r));
    }

    fn sorted_values(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self.value[1..].to_vec();
        v.sort_by(|a, b| b.total_cmp(a));
        v
    }

    /// The raw confidences of a tree cut to `len` nodes by `map` (old id → new id, if kept).
    fn remapped_raw(&self, map: &[Option<NodeId>], len: usize) -> Vec<f64> {
        let mut raw = vec![1.0; len];
        for (old, new) in map.iter().enumerate() {
            if let Some(new) = new {
                raw[*new] = self.raw[old];
            }
        }
        raw
    }
}

/// The gain of a tree whose node values are `sorted` (best first) as it stands: its best prefix
/// under greedy decoding, all of it under sampling (sampled trees are never cut).
fn gain_now(sorted: &[f64], econ: &Economics, greedy: bool) -> f64 {
    if greedy {
        econ.best_prefix(sorted).1
    } else {
        econ.gain(sorted.len(), sorted.iter().sum())
    }
}

/// Decision 1's lookahead from the root, with the first draft forward holding `start_rows`
/// rows: (at the best calibrated acceptance, at perfect acceptance).
fn step_lookahead(auto: &AutoBudget, start_rows: usize, depth: usize) -> (f64, f64) {
    let econ = auto.economics();
    let forwards = draft_forwards(auto, start_rows, depth);
    let look = econ.lookahead_gain(&[], 1.0, auto.best_acceptance(1), &forwards, depth);
    let perfect = econ.lookahead_gain(&[], 1.0, 1.0, &forwards, depth);
    (look, perfect)
}

/// The draft forwards' times over `depths` more depths: the first feeds `first_rows` rows,
/// each later one a single row.
fn draft_forwards(auto: &AutoBudget, first_rows: usize, depths: usize) -> Vec<f64> {
    (0..depths).map(|l| auto.draft_cost(if l == 0 { first_rows } else { 1 })).collect()
}

/// The target time one more node costs after `n` drafted nodes: the cheapest average over the
/// next few nodes, so a flat step of the curve is seen as cheap.
fn marginal_ms(econ: &Economics, n: usize) -> f64 {
    let now = econ.ms(n);
    (1..=LOOKAHEAD_NODES).map(|k| (econ.ms(n + k) - now) / k as f64).fold(f64::INFINITY, f64::min)
}

/// The frontier of a new depth worth feeding: its nodes best first, at most [`MAX_FEED`] of
/// them and none worth less than [`FEED_FRACTION`] of the best; and the best one's value.
fn frontier_feed(mut new_nodes: Vec<NodeId>, cal: &Calibrated) -> (Vec<NodeId>, f64) {
    new_nodes.sort_by(|&a, &b| cal.value[b].total_cmp(&cal.value[a]));
    let frontier_best = cal.value[new_nodes[0]];
    let feed: Vec<NodeId> = new_nodes
        .iter()
        .copied()
        .take(MAX_FEED)
        .filter(|&n| cal.value[n] >= FEED_FRACTION * frontier_best)
        .collect();
    (feed, frontier_best)
}

impl Growth<'_, '_> {
    /// The layer schedule with the cost model's stopping rules (see the module docs), feeding
    /// `draft` once per depth: per depth, the nodes that pay ([`Self::expand_paying`]), then
    /// whether a deeper depth pays ([`Self::deeper_loses`]) and its events ([`Self::feed_depth`]).
    fn grow_auto<M: CausalLm>(
        &mut self,
        root: Event,
        draft: &mut DraftModel<M>,
        auto: &AutoBudget,
        cal: &mut Calibrated,
    ) -> Result<()> {
        let econ = auto.economics();
        let mut layer = vec![root];
        for d in 1..=self.depth {
            let new_nodes = self.expand_paying(&mut layer, d, auto, &econ, cal)?;
            if self.full() || new_nodes.is_empty() || d == self.depth {
                break;
            }
            let (feed, frontier_best) = frontier_feed(new_nodes, cal);
            if self.deeper_loses(d, &feed, frontier_best, auto, &econ, cal) {
                break;
            }
            layer = self.feed_depth(draft, &feed)?;
        }
        Ok(())
    }

    /// Decision 2 at depth `d`: this depth's events expanded best first while the node each adds
    /// is worth more than the target time it adds; returns the new nodes.
    fn expand_paying(
        &mut self,
        layer: &mut Vec<Event>,
        d: usize,
        auto: &AutoBudget,
        econ: &Economics,
        cal: &mut Calibrated,
    ) -> Result<Vec<NodeId>> {
        let mut new_nodes = Vec::new();
        while !self.full() {
            let Some(best) = best_event(layer) else { break };
            if self.node_too_dear(&layer[best], d, auto, econ, cal) {
                break;
            }
            let ev = layer.swap_remove(best);
            let (child, sibling) = self.expand(ev)?;
            cal.push(&self.tree, &self.values, auto, child);
            new_nodes.push(child);
            layer.extend(sibling);
        }
        Ok(new_nodes)
    }

    /// Whether the child `ev` would add at depth `d` is worth no more than the target time it
    /// adds, at the rate to beat.
    fn node_too_dear(
        &self,
        ev: &Event,
        d: usize,
        auto: &AutoBudget,
        econ: &Economics,
        cal: &Calibrated,
    ) -> bool {
        let parent_raw = self.values[ev.item.parent];
        let r = if parent_raw > 0.0 { ev.score / parent_raw } else { 0.0 };
        let worth = cal.value[ev.item.parent] * auto.acceptance(d, r);
        worth <= econ.rate * marginal_ms(econ, self.tree.drafted())
    }

    /// Decision 3 after depth `d`: whether the lookahead from the frontier (`feed`, the best
    /// worth `frontier_best`), after paying the draft forwards, fails to beat the gain of the
    /// tree as it stands.
    fn deeper_loses(
        &self,
        d: usize,
        feed: &[NodeId],
        frontier_best: f64,
        auto: &AutoBudget,
        econ: &Economics,
        cal: &Calibrated,
    ) -> bool {
        let sorted = cal.sorted_values();
        let now = gain_now(&sorted, econ, self.ctx.sampler.is_greedy());
        let forwards = draft_forwards(auto, feed.len(), self.depth - d);
        let room = self.budget - self.tree.drafted();
        let look = econ.lookahead_gain(&sorted, frontier_best, auto.best_acceptance(d + 1), &forwards, room);
        look <= now
    }

    /// The next depth's events: `feed` in one draft forward, each fed node's first-child event.
    fn feed_depth<M: CausalLm>(&mut self, draft: &mut DraftModel<M>, feed: &[NodeId]) -> Result<Vec<Event>> {
        let logits = draft.feed(&self.tree, feed)?;
        self.fed += feed.len() as u64;
        let mut layer = Vec::new();
        for (i, &n) in feed.iter().enumerate() {
            layer.extend(self.first_child_event(n, logits.row(i))?);
        }
        Ok(layer)
    }
}

/// Index of the most valuable event (ties to the older one), if any.
fn best_event(layer: &[Event]) -> Option<usize> {
    (0..layer.len()).max_by(|&a, &b| layer[a].cmp(&layer[b]))
}
