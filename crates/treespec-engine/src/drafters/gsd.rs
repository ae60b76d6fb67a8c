//! Graph-structured speculative decoding (GSD, arXiv 2407.16207): a draft *DAG* whose repeated
//! token sequences are drafted once and shared, unrolled into a token tree for verification.
//!
//! Layer by layer, every frontier node gets the draft's `top_n` candidates (one batched draft
//! forward per depth), of which GSD keeps those with probability ≥ `ratio` · top-1; a new node is
//! expanded at the next depth only if its own probability is ≥ `parent_min` (the root always is).
//! Before a candidate token `x` is added under frontier node `f`, a hash map keyed by
//! (the `r` tokens before `x`, `x`) finds an existing DAG node `u` with the same key; if `u` is
//! not an ancestor of `f` (`TokenDag::link` refuses cycles), `f → u` is linked instead: `u` and
//! everything drafted below it are reused on `f`'s path without running the draft again.
//!
//! The DAG is unrolled into a tree best-first by path score (product of draft probabilities),
//! bounded by `unroll_cap` nodes and the depth limit, for one target pass.
//!
//! Lossless: every node is `Draw::Deterministic` — candidates are chosen by rank, not sampled —
//! so the verifier treats each as a point mass (family 3), which is exact however the candidates
//! were chosen, including the linked copies whose draft probabilities were computed under another
//! prefix. Under greedy the verifier follows the target argmax as usual.
//!
//! Draft KV: the DAG's drafted edges form a tree (the *shadow* tree, same node ids as the DAG),
//! and that is what the draft model's cache holds. On the accepted path, a node reached through a
//! link was fed under a different parent, so its cache entries belong to another prefix: it and
//! everything after it are treated as never fed (queued for the next step's first draft forward),
//! and only the link-free prefix of the path is committed.

use std::collections::{BinaryHeap, HashMap};

use treespec_core::dag::TokenDag;
use treespec_core::sampling::Sampler;
use treespec_core::tree::{Draw, NodeId, TokenTree, ROOT};
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;

use super::candidates::{node_context, ranked_candidates, scoring_sampler, ByScore};
use crate::backend::CausalLm;
use crate::draft_model::{forward_to_draft_model, DraftModel};
use crate::drafter::{Drafter, ProposeContext};
use crate::error::{EngineError, Result};
use crate::extra_stats::{ExtraStats, GsdCounts};
use crate::method_kind::MethodKind;

/// GSD knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GsdConfig {
    /// Candidate children drafted per expanded node. Default 4.
    pub top_n: usize,
    /// Keep a candidate only if its probability is ≥ `ratio` · the top candidate's. In [0, 1].
    /// Default 0.7.
    pub ratio: f32,
    /// Expand a (non-root) node only if its own probability is ≥ this. In [0, 1]. Default 0.3.
    pub parent_min: f32,
    /// Context tokens in the merge key besides the token itself: 0 (token only) or 1 (parent's
    /// token + token). Default 1.
    pub r: usize,
    /// Deepest draft (capped by the tokens still wanted). Default 6.
    pub max_depth: usize,
    /// Most drafted DAG nodes per step (capped by the context room). Default 32.
    pub budget: usize,
    /// Most nodes of the unrolled tree, root included (capped by the context room); the most
    /// probable paths are kept. Default 100.
    pub unroll_cap: usize,
    /// Merge equal keys into links (GSD); false drafts a plain tree with the same filters, the
    /// baseline for measuring what merging saves. Default true.
    pub merge: bool,
}

impl Default for GsdConfig {
    fn default() -> Self {
        Self {
            top_n: 4,
            ratio: 0.7,
            parent_min: 0.3,
            r: 1,
            max_depth: 6,
            budget: 32,
            unroll_cap: 100,
            merge: true,
        }
    }
}

impl GsdConfig {
    /// Check every knob's domain; the message names the knob.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::InvalidRequest(format!("gsd {m}")));
        for (name, v) in [("top_n", self.top_n), ("max_depth", self.max_depth), ("budget", self.budget)] {
            if v == 0 {
                return bad(format!("{name} must be ≥ 1"));
            }
        }
        for (name, v) in [("ratio", self.ratio), ("parent_min", self.parent_min)] {
            if !(0.0..=1.0).contains(&v) {
                return bad(format!("{name} must be a number in [0, 1], got {v}"));
            }
        }
        if self.r > 1 {
            return bad(format!("r (context tokens in the merge key) must be 0 or 1, got {}", self.r));
        }
        if self.unroll_cap < 2 {
            return bad(format!(
                "unroll_cap must be ≥ 2 (the root plus at least one drafted node), got {}",
                self.unroll_cap
            ));
        }
        Ok(())
    }
}

/// Per-generation counters of a [`GsdDrafter`] (reset by `begin`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GsdStats {
    /// `propose` calls.
    pub steps: u64,
    /// DAG nodes drafted (each computed by the draft once), summed over steps.
    pub dag_nodes: u64,
    /// Merges: links added instead of drafting a new node.
    pub links: u64,
    /// Nodes of the proposed (unrolled) trees, summed over steps.
    pub tree_nodes: u64,
    /// Proposed nodes that are copies reached through a link: tokens the draft never computed on
    /// that path (what merging bought).
    pub reused: u64,
    /// DAG nodes fed to the draft model (the step's root chain not included).
    pub fed: u64,
    /// Accepted tokens reached through a link (their draft KV was for another prefix).
    pub accepted_linked: u64,
}

/// The current step's DAG bookkeeping, needed by `observe`.
struct Pending {
    /// The DAG's drafted (non-link) edges: what the draft model's cache holds; ids = DAG ids.
    shadow: TokenTree,
    /// Proposed tree node → DAG node.
    origin: Vec<NodeId>,
    /// Proposed tree node → reached through a link at or above it.
    linked: Vec<bool>,
}

/// The GSD drafter over a draft model.
pub struct GsdDrafter<M: CausalLm> {
    draft: DraftModel<M>,
    config: GsdConfig,
    pending: Option<Pending>,
    stats: GsdStats,
}

impl<M: CausalLm> GsdDrafter<M> {
    /// A GSD drafter; errors on an invalid config.
    pub fn new(draft: M, config: GsdConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self { draft: DraftModel::new(draft), config, pending: None, stats: GsdStats::default() })
    }

    /// The configuration.
    pub fn config(&self) -> &GsdConfig {
        &self.config
    }

    /// Counters since the last `begin`.
    pub fn stats(&self) -> &GsdStats {
        &self.stats
    }

    /// Merges (links) made since the last `begin`: each one reused an already drafted subtree
    /// instead of running the draft for it again. [`GsdStats::reused`] counts the tree nodes
    /// obtained that way.
    pub fn merges(&self) -> u64 {
        self.stats.links
    }
}

impl<M: CausalLm> Drafter for GsdDrafter<M> {
    fn kind(&self) -> MethodKind {
        MethodKind::Gsd
    }

    /// GSD draws nothing at random (candidates are ranked), so the seed is unused.
    fn begin(&mut self, prompt: &[TokenId], _: &Sampler, _seed: u64) -> Result<()> {
        self.pending = None;
        self.stats = GsdStats::default();
        self.draft.begin(prompt)
    }

    fn propose(&mut self, ctx: &ProposeContext) -> Result<TokenTree> {
        self.stats.steps += 1;
        self.pending = None;
        let depth = self.config.max_depth.min(ctx.max_depth);
        let budget = self.config.budget.min(ctx.max_nodes);
        let cap = self.config.unroll_cap.min(ctx.max_nodes.saturating_add(1));
        if depth == 0 || budget == 0 || cap < 2 {
            return Ok(TokenTree::new(ctx.root()));
        }
        let scorer = scoring_sampler(ctx.sampler)?;
        let mut dag = TokenDag::new(ctx.root());
        let mut shadow = TokenTree::new(ctx.root());
        // (the r tokens before x, x) → DAG nodes with that key, oldest first.
        let mut by_key: HashMap<(Option<TokenId>, TokenId), Vec<NodeId>> = HashMap::new();
        // The nodes expanded at the last depth, fed in one forward at the top of the next; their
        // rows are borrowed from the draft's output and read before the following feed.
        let mut frontier = vec![ROOT];
        'depths: for d in 1..=depth {
            let logits =
                if d == 1 { self.draft.start_step()? } else { self.draft.feed(&shadow, &frontier)? };
            let mut layer: Vec<(NodeId, f32)> = Vec::new();
            for (i, &f) in frontier.iter().enumerate() {
                let context = node_context(ctx, &shadow, f);
                let cands =
                    ranked_candidates(ctx.sampler, &scorer, logits.row(i), &context, self.config.top_n)?;
                let top = cands.iter().map(|&(_, p)| p).fold(0.0f32, f32::max);
                for (x, p) in cands.into_iter().filter(|&(_, p)| p >= self.config.ratio * top) {
                    let key = (if self.config.r == 1 { Some(dag.node(f).token) } else { None }, x);
                    if self.config.merge {
                        let existing = by_key.get(&key).map(Vec::as_slice).unwrap_or(&[]);
                        // `link` refuses an ancestor of f (a cycle); try the next match then.
                        if existing.iter().any(|&u| dag.link(f, u).is_ok()) {
                            self.stats.links += 1;
                            continue;
                        }
                    }
                    if dag.len() > budget {
                        break 'depths;
                    }
                    let id = dag.add(f, x, Draw::Deterministic, p)?;
                    let sid = shadow.add(f, x, Draw::Deterministic, p)?;
                    debug_assert_eq!(id, sid, "the shadow tree mirrors the DAG's ids");
                    by_key.entry(key).or_default().push(id);
                    layer.push((id, p));
                }
            }
            if d == depth {
                break;
            }
            let expand: Vec<NodeId> =
                layer.iter().filter(|&&(_, p)| p >= self.config.parent_min).map(|&(n, _)| n).collect();
            if expand.is_empty() {
                break;
            }
            self.stats.fed += expand.len() as u64;
            frontier = expand;
        }
        self.stats.dag_nodes += (dag.len() - 1) as u64;

        let (tree, origin, linked) = unroll_best_first(&dag, ctx.root(), cap, depth)?;
        self.stats.tree_nodes += tree.drafted() as u64;
        self.stats.reused += linked.iter().filter(|&&l| l).count() as u64;
        self.pending = Some(Pending { shadow, origin, linked });
        Ok(tree)
    }

    fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) -> Result<()> {
        let Some(Pending { mut shadow, origin, linked }) = self.pending.take() else {
            // Nothing was drafted this step (root-only tree): no node ids to translate.
            return self.draft.observe(tree, outcome);
        };
        // The link-free prefix of the accepted path maps onto the shadow tree; from the first
        // linked node on, the tokens become fresh shadow nodes that were never fed, so the draft
        // queues them instead of committing cache entries computed for another prefix.
        let mut accepted = Vec::with_capacity(outcome.accepted.len());
        let mut at = ROOT;
        let mut off_shadow = false;
        for &n in &outcome.accepted {
            let Some(&o) = origin.get(n) else {
                return Err(EngineError::State(format!(
                    "gsd: accepted node {n} is not in the proposed tree"
                )));
            };
            if off_shadow || linked[n] {
                off_shadow = true;
                self.stats.accepted_linked += linked[n] as u64;
                at = shadow.add(at, tree.node(n).token, Draw::Deterministic, 1.0)?;
            } else {
                at = o;
            }
            accepted.push(at);
        }
        let mapped =
            VerifyOutcome { accepted, tokens: outcome.tokens.clone(), depths: outcome.depths.clone() };
        self.draft.observe(&shadow, &mapped)
    }

    forward_to_draft_model!(draft);

    fn extra_stats(&self) -> ExtraStats {
        let s = &self.stats;
        let gsd = GsdCounts { merges: s.links, dag_nodes: s.dag_nodes, draft_rows_saved: s.reused };
        ExtraStats { gsd: Some(gsd), ..ExtraStats::default() }
    }
}

/// Unroll the DAG into a tree of at most `max_nodes` nodes (root included) and depth `max_depth`,
/// best-first by path score (the product of the nodes' draft probabilities), so the cap keeps the
/// most probable paths. `TokenDag::unroll` goes depth-first without a depth bound: copies a link
/// pushes below the depth limit would use up the cap and then have to be dropped, and the cap
/// would cut whole late subtrees whatever their value. Returns the tree, each tree node's DAG
/// node, and whether it was reached through a link (at or above it).
fn unroll_best_first(
    dag: &TokenDag,
    root: TokenId,
    max_nodes: usize,
    max_depth: usize,
) -> Result<(TokenTree, Vec<NodeId>, Vec<bool>)> {
    /// A DAG edge waiting to be copied (scored by its path score, first pushed first on ties).
    struct Edge {
        dag: NodeId,
        parent: NodeId,
        linked: bool,
    }

    let mut tree = TokenTree::new(root);
    let mut origin = vec![ROOT];
    let mut linked = vec![false];
    let mut heap = BinaryHeap::new();
    let mut seq = 0;
    let mut push_children =
        |heap: &mut BinaryHeap<ByScore<Edge>>, at: NodeId, dag_node: NodeId, score: f64, l: bool| {
            for &(c, link) in &dag.node(dag_node).edges {
                let p = dag.node(c).draft_prob as f64;
                let item = Edge { dag: c, parent: at, linked: l || link };
                heap.push(ByScore { score: score * p, seq, item });
                seq += 1;
            }
        };
    if max_depth > 0 {
        push_children(&mut heap, ROOT, ROOT, 1.0, false);
    }
    while tree.len() < max_nodes {
        let Some(ByScore { score, item: e, .. }) = heap.pop() else { break };
        let node = dag.node(e.dag);
        let id = tree.add(e.parent, node.token, Draw::Deterministic, node.draft_prob)?;
        origin.push(e.dag);
        linked.push(e.linked);
        if tree.node(id).depth < max_depth {
            push_children(&mut heap, id, e.dag, score, e.linked);
        }
    }
    Ok((tree, origin, linked))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_configs_name_the_knob() {
        let cases = [
            (GsdConfig { top_n: 0, ..Default::default() }, "top_n"),
            (GsdConfig { ratio: 1.5, ..Default::default() }, "ratio"),
            (GsdConfig { ratio: f32::NAN, ..Default::default() }, "ratio"),
            (GsdConfig { parent_min: -0.1, ..Default::default() }, "parent_min"),
            (GsdConfig { r: 2, ..Default::default() }, "r "),
            (GsdConfig { max_depth: 0, ..Default::default() }, "max_depth"),
            (GsdConfig { budget: 0, ..Default::default() }, "budget"),
            (GsdConfig { unroll_cap: 1, ..Default::default() }, "unroll_cap"),
        ];
        for (c, knob) in cases {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(knob), "{e}");
        }
        assert!(GsdConfig::default().validate().is_ok());
    }
}
