//! DySpec (arXiv 2410.11744): a dynamic token tree grown best-first by estimated value.
//!
//! The hypothesis is that a token's draft probability predicts its acceptance, so the value of a
//! drafted node is the product of the draft probabilities along its path, and the tree that
//! maximises the summed value of `budget` nodes is the one built greedily from the most valuable
//! *sampling events* (ALGORITHMS.md §3). An event `(R, v, parent)` means "draw one more child of
//! `parent` from `R`", where `R` is the draft distribution left at that position after the earlier
//! without-replacement draws and `v` the event's value. Drawing `y ~ R` adds the child with value
//! `v·R[y]`, leaves the sibling event `(R − y, v·(1 − R[y]), parent)` and, once the child's draft
//! distribution is known, its first-child event `(q(·|path), v·R[y], child)`.
//!
//! Sampled children are verified without replacement (family 2). That needs the siblings of one
//! parent in the tree in the order they were drawn, each carrying the parent's full `q`; it holds
//! by construction because a parent has at most one live event at any time (its sibling event
//! only exists after the previous draw). Deciding *whether* to draw another sibling from values
//! that depend on earlier draws is allowed: every draw is a fresh sample from exactly the `q_i`
//! the verifier rebuilds, so recursive rejection sampling stays exact at each step.
//!
//! Two growth schedules ([`DySpecMode`]):
//! * `Heap` (Algorithm 1): one global max-heap. The paper feeds every new node to the draft at
//!   once; here a node is fed only when its first-child event reaches the top of the heap (its
//!   value `v·R[y]` is known before `q(·|path)` is), which builds the same tree with fewer draft
//!   forwards: one per node that gets children.
//! * `Layer` (Algorithm 2): one depth at a time, every event whose value is at least the
//!   threshold `t` is expanded, and the new nodes of a depth are fed in ONE batched draft forward.
//!   The paper stops there, so with a high `t` the tree can fall short of the budget (why it loses
//!   to Sequoia at large budgets); here a *fill* pass then keeps taking the best remaining events
//!   of every depth, by value, until the budget is reached. The fill adds leaves only: giving a
//!   fill node children would cost an extra draft forward, and this mode promises at most one
//!   forward per depth.
//!
//! Under greedy decoding nothing is sampled: a node's children are its draft top tokens in rank
//! order (the greedy token first), each a deterministic candidate whose value is the parent's value
//! times the token's temperature-1 draft probability. The same heap/layer schedules apply, with an
//! event's value being the value of the child it would add.

use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use treespec_core::dist::Dist;
use treespec_core::rng::{Stream, StreamRng};
use treespec_core::sampling::Sampler;
use treespec_core::tree::{Draw, NodeId, TokenTree, ROOT};
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;

use super::candidates::{node_context, ranked_candidates, scoring_sampler, ByScore};
use crate::auto_budget::{AutoBudget, SharedCosts};
use crate::backend::CausalLm;
use crate::draft_model::{forward_to_draft_model, DraftModel};
use crate::drafter::{Drafter, ForwardCost, ProposeContext};
use crate::error::{EngineError, Result};
use crate::extra_stats::ExtraStats;
use crate::method_kind::MethodKind;

/// How a [`DySpecDrafter`] schedules tree growth and draft forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DySpecMode {
    /// Algorithm 1: global best-first heap; one draft forward per node that gets children. The
    /// best tree under the value proxy, but draft forwards grow with the budget.
    Heap,
    /// Algorithm 2: layer by layer with a value threshold, one batched draft forward per depth,
    /// then filled up to the budget with the best remaining events.
    #[default]
    Layer,
}

/// DySpec knobs.
#[derive(Debug, Clone, PartialEq)]
pub struct DySpecConfig {
    /// Drafted nodes per step (capped by the context room the loop offers). Default 16. With
    /// `costs` set this is only the cap: the step's size is chosen by the cost model.
    pub budget: usize,
    /// Deepest drafted node (capped by the tokens still wanted). Default 8.
    pub max_depth: usize,
    /// Growth schedule. Default [`DySpecMode::Layer`].
    pub mode: DySpecMode,
    /// `Layer` mode's expansion threshold on event values, in (0, 1]. `None` = 1/budget: an event
    /// below it cannot be among the budget best of a depth whose values sum to at most 1.
    pub threshold: Option<f32>,
    /// `--budget auto`: the measured cost curves. Each step then grows the tree only while the
    /// calibrated expected tokens pay for the target and draft time they cost, prunes it to the
    /// best size (greedy), and drafts nothing where plain decoding is faster (see [`cost_aware`]).
    pub costs: Option<Arc<SharedCosts>>,
}

impl Default for DySpecConfig {
    fn default() -> Self {
        Self { budget: 16, max_depth: 8, mode: DySpecMode::Layer, threshold: None, costs: None }
    }
}

impl DySpecConfig {
    /// Check every knob's domain; the message names the knob.
    pub fn validate(&self) -> Result<()> {
        if self.budget == 0 {
            return Err(EngineError::InvalidRequest("dyspec budget must be ≥ 1 drafted node".into()));
        }
        if self.max_depth == 0 {
            return Err(EngineError::InvalidRequest("dyspec max_depth must be ≥ 1".into()));
        }
        if let Some(t) = self.threshold {
            if !(t > 0.0 && t <= 1.0) {
                return Err(EngineError::InvalidRequest(format!(
                    "dyspec threshold must be in (0, 1], got {t}"
                )));
            }
        }
        Ok(())
    }

    /// The `Layer` threshold actually used.
    pub fn effective_threshold(&self) -> f32 {
        self.threshold.unwrap_or(1.0 / self.budget.max(1) as f32)
    }
}

/// Per-generation counters of a [`DySpecDrafter`] (reset by `begin`). Draft forwards are
/// reported through [`Drafter::draft_forwards`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DySpecStats {
    /// `propose` calls.
    pub steps: u64,
    /// Drafted nodes proposed, summed over steps.
    pub drafted: u64,
    /// Of those, nodes added by `Layer` mode's fill pass (below the threshold).
    pub filled: u64,
    /// Tree nodes fed to the draft model (the root's step start not included).
    pub fed: u64,
}

/// The DySpec dynamic-tree drafter over a draft model.
pub struct DySpecDrafter<M: CausalLm> {
    draft: DraftModel<M>,
    config: DySpecConfig,
    rng: StreamRng,
    stats: DySpecStats,
    auto: Option<AutoBudget>,
    /// `--budget auto`: the gain a step's tree must beat to be drafted (0 = plain decoding; the
    /// `auto` method raises it to what a model-free proposal already offers).
    bar: f64,
    /// `--budget auto`: the estimated gain of the last proposed tree (0 for plain decoding).
    last_gain: f64,
    /// `--budget auto`: the expected tokens of the last proposed tree (`1 + Σ` its values).
    last_expected: f64,
    /// Whether the draft model holds this generation's text. `auto` in a continuous batch starts
    /// a generation without it ([`Self::begin_deferred`]): the draft's prompt prefill is then
    /// spent only when a cost-aware step finds that drafting pays for it.
    synced: bool,
    /// Prompt tokens of this generation (set by [`Self::begin_deferred`]): what the history
    /// holds beyond them is the answer so far.
    prompt_len: usize,
    /// How long the last catch-up ([`Self::sync`] of a deferred start) took, until taken by
    /// [`Self::take_catch_up`].
    catch_up: Duration,
}

impl<M: CausalLm> DySpecDrafter<M> {
    /// A DySpec drafter; errors on an invalid config.
    pub fn new(draft: M, config: DySpecConfig) -> Result<Self> {
        config.validate()?;
        let auto = config.costs.as_ref().map(|c| AutoBudget::shared(c.clone(), "model", true));
        Ok(Self {
            draft: DraftModel::new(draft),
            config,
            rng: StreamRng::new(0, Stream::Draft),
            stats: DySpecStats::default(),
            auto,
            bar: 0.0,
            last_gain: 0.0,
            last_expected: 1.0,
            synced: false,
            prompt_len: 0,
            catch_up: Duration::ZERO,
        })
    }

    /// Start a generation like [`Drafter::begin`] but leave the draft model empty: the
    /// cost-aware step fills it with the whole history ([`Self::sync`]) when it first drafts.
    pub(crate) fn begin_deferred(&mut self, seed: u64, prompt_len: usize) {
        self.prompt_len = prompt_len;
        self.rng = StreamRng::new(seed, Stream::Draft);
        self.stats = DySpecStats::default();
        if let Some(a) = self.auto.as_mut() {
            a.begin();
        }
        self.synced = false;
    }

    /// Fill the draft model with `history` (all but the last token, which is the next root) if a
    /// deferred start left it empty.
    pub(crate) fn sync(&mut self, history: &[TokenId]) -> Result<()> {
        if !self.synced {
            let started = Instant::now();
            self.draft.begin(history)?;
            self.catch_up += started.elapsed();
            self.synced = true;
        }
        Ok(())
    }

    /// The time spent catching a deferred start up since the last call (zero if none).
    pub(crate) fn take_catch_up(&mut self) -> Duration {
        std::mem::take(&mut self.catch_up)
    }

    /// The configuration.
    pub fn config(&self) -> &DySpecConfig {
        &self.config
    }

    /// Counters since the last `begin`.
    pub fn stats(&self) -> &DySpecStats {
        &self.stats
    }
}

impl<M: CausalLm> Drafter for DySpecDrafter<M> {
    fn kind(&self) -> MethodKind {
        MethodKind::DySpec
    }

    fn begin(&mut self, prompt: &[TokenId], _: &Sampler, seed: u64) -> Result<()> {
        self.begin_deferred(seed, prompt.len());
        self.sync(prompt)
    }

    fn propose(&mut self, ctx: &ProposeContext) -> Result<TokenTree> {
        self.stats.steps += 1;
        if let Some(auto) = self.auto.as_mut() {
            auto.set_forward(ctx.batch_rows, ctx.history.len());
            return self.propose_auto(ctx);
        }
        let budget = self.config.budget.min(ctx.max_nodes);
        let depth = self.config.max_depth.min(ctx.max_depth);
        if budget == 0 || depth == 0 {
            return Ok(TokenTree::new(ctx.root()));
        }
        // The root's row is borrowed from the draft's output: read before the growth feeds it.
        let root_logits = self.draft.start_step()?;
        let mut g = Growth::new(ctx, &mut self.rng, budget, depth)?;
        let root = g.first_child_event(ROOT, root_logits.row(0))?;
        if let Some(root) = root {
            match self.config.mode {
                DySpecMode::Heap => g.grow_heap(root, &mut self.draft)?,
                DySpecMode::Layer => {
                    g.grow_layer(root, &mut self.draft, self.config.effective_threshold() as f64)?
                }
            }
        }
        self.stats.drafted += g.tree.drafted() as u64;
        self.stats.filled += g.filled;
        self.stats.fed += g.fed;
        Ok(g.tree)
    }

    fn observe_cost(&mut self, forward: ForwardCost) {
        if let Some(a) = self.auto.as_mut() {
            a.observe_target(forward);
        }
    }

    fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) -> Result<()> {
        if let Some(a) = self.auto.as_mut() {
            a.observe(tree, outcome);
        }
        if !self.synced {
            return Ok(()); // the whole history is fed when the model first drafts
        }
        self.draft.observe(tree, outcome)
    }

    forward_to_draft_model!(draft);

    fn extra_stats(&self) -> ExtraStats {
        self.auto.as_ref().map(|a| a.report()).unwrap_or_default()
    }
}

mod cost_aware;

/// Where the next child of an event's parent comes from.
enum Source {
    /// The parent is not fed yet (`Heap` mode): its draft distribution is computed when the event
    /// reaches the top of the heap. The event's value is exact under sampling and an upper bound
    /// under greedy (the first child's value is the parent's times a probability ≤ 1).
    Unfed,
    /// Sampling: the parent's full processed draft distribution `q` and what is left of it after
    /// the earlier without-replacement draws.
    Sampled { q: Arc<Dist>, left: Dist },
    /// Greedy: the parent's ranked candidates (token, temperature-1 probability) and the next rank.
    Ranked { ranked: Vec<(TokenId, f32)>, next: usize },
}

/// A sampling event on the heap: its value is the score, ties to the older event (deterministic
/// trees).
type Event = ByScore<NextChild>;

/// What a sampling event draws: one more child of `parent`, from `source`.
struct NextChild {
    parent: NodeId,
    source: Source,
}

/// The state of one `propose` call. The draft model is not part of it but lent to each growth
/// schedule: the rows of a draft forward stay borrowed from the model while this state reads them.
struct Growth<'s, 'c> {
    ctx: &'s ProposeContext<'c>,
    /// Scores greedy candidates (temperature 1, same repetition penalty); the sampler itself when
    /// sampling.
    scorer: Sampler,
    rng: &'s mut StreamRng,
    tree: TokenTree,
    /// Value of each tree node (root = 1): the product of draft probabilities along its path.
    values: Vec<f64>,
    budget: usize,
    depth: usize,
    seq: u64,
    fed: u64,
    filled: u64,
}

impl<'s, 'c> Growth<'s, 'c> {
    /// An empty tree at `ctx`'s root, to grow within `budget` nodes and `depth` levels.
    fn new(ctx: &'s ProposeContext<'c>, rng: &'s mut StreamRng, budget: usize, depth: usize) -> Result<Self> {
        Ok(Self {
            ctx,
            scorer: scoring_sampler(ctx.sampler)?,
            rng,
            tree: TokenTree::new(ctx.root()),
            values: vec![1.0],
            budget,
            depth,
            seq: 0,
            fed: 0,
            filled: 0,
        })
    }

    /// A new event, younger than every earlier one.
    fn event(&mut self, value: f64, parent: NodeId, source: Source) -> Event {
        self.seq += 1;
        Event { score: value, seq: self.seq, item: NextChild { parent, source } }
    }

    fn full(&self) -> bool {
        self.tree.drafted() >= self.budget
    }

    /// The first-child event of a fed node from its draft logits; `None` if it has no candidate.
    fn first_child_event(&mut self, node: NodeId, logits: &[f32]) -> Result<Option<Event>> {
        let context = node_context(self.ctx, &self.tree, node);
        let value = self.values[node];
        let source = if self.ctx.sampler.is_greedy() {
            let room = self.budget - self.tree.drafted();
            let ranked = ranked_candidates(self.ctx.sampler, &self.scorer, logits, &context, room)?;
            let Some(&(_, p)) = ranked.first() else { return Ok(None) };
            let source = Source::Ranked { ranked, next: 0 };
            return Ok(Some(self.event(value * p as f64, node, source)));
        } else {
            let q = Arc::new(self.ctx.sampler.distribution(logits, &context)?);
            Source::Sampled { left: (*q).clone(), q }
        };
        Ok(Some(self.event(value, node, source)))
    }

    /// Carry out a ready event: add its child; return the child and the parent's next event.
    fn expand(&mut self, ev: Event) -> Result<(NodeId, Option<Event>)> {
        let (value, NextChild { parent, source }) = (ev.score, ev.item);
        match source {
            Source::Unfed => Err(EngineError::State("dyspec: expanding a node that was not fed".into())),
            Source::Sampled { q, left } => {
                let y = left.sample(self.rng);
                let r = left.prob(y) as f64;
                let child_value = value * r;
                let child = self.tree.add(
                    parent,
                    y,
                    Draw::WithoutReplacement { q: q.clone() },
                    child_value as f32,
                )?;
                self.values.push(child_value);
                let sibling = left
                    .without(y)
                    .map(|rest| self.event(value * (1.0 - r), parent, Source::Sampled { q, left: rest }));
                Ok((child, sibling))
            }
            Source::Ranked { ranked, next } => {
                let (token, _) = ranked[next];
                let child = self.tree.add(parent, token, Draw::Deterministic, value as f32)?;
                self.values.push(value);
                let sibling = ranked.get(next + 1).map(|&(_, p)| p).map(|p| {
                    let sibling_value = self.values[parent] * p as f64;
                    self.event(sibling_value, parent, Source::Ranked { ranked, next: next + 1 })
                });
                Ok((child, sibling))
            }
        }
    }

    /// Algorithm 1, feeding a node to `draft` only when its first-child event is popped.
    fn grow_heap<M: CausalLm>(&mut self, root: Event, draft: &mut DraftModel<M>) -> Result<()> {
        let mut heap = BinaryHeap::from([root]);
        while !self.full() {
            let Some(ev) = heap.pop() else { break };
            if let Source::Unfed = ev.item.source {
                let node = ev.item.parent;
                let logits = draft.feed(&self.tree, &[node])?;
                self.fed += 1;
                if let Some(mut ready) = self.first_child_event(node, logits.row(0))? {
                    // Keep the popped event's place among equal values: under sampling its value
                    // is unchanged, so it is expanded next, exactly as if fed on creation.
                    ready.seq = ev.seq;
                    heap.push(ready);
                }
                continue;
            }
            let (child, sibling) = self.expand(ev)?;
            heap.extend(sibling);
            if self.tree.node(child).depth < self.depth && !self.full() {
                heap.push(self.event(self.values[child], child, Source::Unfed));
            }
        }
        Ok(())
    }

    /// Algorithm 2 (threshold pass, one forward of `draft` per depth), then the fill pass.
    fn grow_layer<M: CausalLm>(
        &mut self,
        root: Event,
        draft: &mut DraftModel<M>,
        threshold: f64,
    ) -> Result<()> {
        let mut layer = BinaryHeap::from([root]);
        // Below-threshold events of finished depths: all have fed parents, so the fill can use them.
        let mut rest: Vec<Event> = Vec::new();
        for d in 1..=self.depth {
            let mut new_nodes = Vec::new();
            while !self.full() && layer.peek().is_some_and(|e| e.score >= threshold) {
                let ev = layer.pop().expect("peeked");
                let (child, sibling) = self.expand(ev)?;
                new_nodes.push(child);
                layer.extend(sibling);
            }
            rest.extend(layer.drain());
            if self.full() || new_nodes.is_empty() || d == self.depth {
                break;
            }
            // Feed every new node, not only those above the threshold: the batch is one forward
            // either way, and the fill may want their first children.
            let logits = draft.feed(&self.tree, &new_nodes)?;
            self.fed += new_nodes.len() as u64;
            for (i, &n) in new_nodes.iter().enumerate() {
                layer.extend(self.first_child_event(n, logits.row(i))?);
            }
        }
        let mut pool = BinaryHeap::from(rest);
        while !self.full() {
            let Some(ev) = pool.pop() else { break };
            let (_, sibling) = self.expand(ev)?;
            self.filled += 1;
            pool.extend(sibling);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toy::{ToyLm, ToyModel};
    use treespec_core::sampling::SamplingParams;

    fn ctx<'a>(
        history: &'a [TokenId],
        sampler: &'a Sampler,
        nodes: usize,
        depth: usize,
    ) -> ProposeContext<'a> {
        ProposeContext {
            history,
            max_nodes: nodes,
            max_depth: depth,
            sampler,
            batch_rows: 0,
            batch_cut: false,
            eos: &[],
        }
    }

    /// Sibling without-replacement draws must share one `q` and never repeat a token, and values
    /// must not grow down a path (the best-first argument relies on it).
    #[test]
    fn sampled_trees_are_well_formed() {
        let model = ToyModel::new(6, 1, 4).with_sharpness(0.5);
        let sampler = Sampler::new(SamplingParams::with_temperature(1.0)).unwrap();
        for mode in [DySpecMode::Heap, DySpecMode::Layer] {
            let cfg = DySpecConfig { budget: 20, max_depth: 3, mode, ..Default::default() };
            let mut d = DySpecDrafter::new(ToyLm::new(model.clone(), 64), cfg).unwrap();
            d.begin(&[1, 2], &sampler, 9).unwrap();
            let tree = d.propose(&ctx(&[1, 2], &sampler, 100, 100)).unwrap();
            assert_eq!(tree.drafted(), 20, "{mode:?}");
            assert!(tree.max_depth() <= 3);
            for id in 0..tree.len() {
                let kids = tree.children(id);
                let mut tokens: Vec<_> = kids.iter().map(|&k| tree.node(k).token).collect();
                tokens.sort_unstable();
                tokens.dedup();
                assert_eq!(tokens.len(), kids.len());
                for &k in kids {
                    assert!(tree.node(k).draft_prob <= tree.node(id).draft_prob);
                }
            }
        }
    }

    #[test]
    fn respects_context_limits() {
        let model = ToyModel::new(8, 1, 4);
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let mut d = DySpecDrafter::new(ToyLm::new(model, 64), DySpecConfig::default()).unwrap();
        d.begin(&[1], &sampler, 0).unwrap();
        let tree = d.propose(&ctx(&[1], &sampler, 3, 2)).unwrap();
        assert!(tree.drafted() <= 3 && tree.max_depth() <= 2);
        let empty = d.propose(&ctx(&[1], &sampler, 0, 2));
        assert_eq!(empty.unwrap().drafted(), 0);
    }
}
