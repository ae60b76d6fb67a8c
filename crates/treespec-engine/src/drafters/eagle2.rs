//! EAGLE-2 (arXiv 2406.16858) dynamic draft trees, with any draft model.
//!
//! Expansion: at each depth the `top_k` newest nodes with the highest *path value* (the product of
//! draft confidences from the root) are fed to the draft together, in ONE forward, and each gets
//! its `top_k` most probable tokens as candidate children. After `depth` depths every candidate is
//! reranked by value and the best `total` are kept. The kept set is a connected tree: a child's
//! value is its parent's times a probability ≤ 1 (never larger, also in floating point), and ties
//! are broken towards the lower arena id, so a parent always ranks before its children.
//!
//! Candidates are chosen by rank, not sampled, so every node is `Draw::Deterministic` and the
//! verifier treats each as a point mass (family 3): exact whatever the draft does. Values use the
//! draft's processed distribution at the sampler's settings under sampling, and its temperature-1
//! softmax under greedy (where the processed distribution is a point mass).
//!
//! The draft model's cache holds the *candidate* tree, of which the proposed tree is a pruned
//! copy with its own node ids; `observe` maps the accepted nodes back before committing the draft.

use treespec_core::sampling::Sampler;
use treespec_core::tree::{Draw, NodeId, TokenTree, ROOT};
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;

use super::candidates::{node_context, ranked_candidates, scoring_sampler};
use crate::backend::CausalLm;
use crate::draft_model::{forward_to_draft_model, DraftModel};
use crate::drafter::{Drafter, ProposeContext};
use crate::error::{EngineError, Result};
use crate::method_kind::MethodKind;

/// EAGLE-2 knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eagle2Config {
    /// Nodes expanded per depth, and candidate children per expanded node. Default 4.
    pub top_k: usize,
    /// Expansion depths (capped by the tokens still wanted). Default 5.
    pub depth: usize,
    /// Nodes kept after reranking (capped by the context room). Default 16.
    pub total: usize,
}

impl Default for Eagle2Config {
    fn default() -> Self {
        Self { top_k: 4, depth: 5, total: 16 }
    }
}

impl Eagle2Config {
    /// Check every knob's domain; the message names the knob.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [("top_k", self.top_k), ("depth", self.depth), ("total", self.total)] {
            if v == 0 {
                return Err(EngineError::InvalidRequest(format!("eagle2 {name} must be ≥ 1")));
            }
        }
        Ok(())
    }
}

/// Per-generation counters of an [`Eagle2Drafter`] (reset by `begin`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Eagle2Stats {
    /// `propose` calls.
    pub steps: u64,
    /// Candidate nodes drafted before reranking, summed over steps.
    pub candidates: u64,
    /// Nodes kept and proposed, summed over steps.
    pub kept: u64,
    /// Candidate nodes fed to the draft model (the root's step start not included).
    pub fed: u64,
}

/// The drafted candidate tree of the current step and, for each proposed node, its candidate id.
struct Pending {
    candidates: TokenTree,
    to_candidate: Vec<NodeId>,
}

/// The EAGLE-2 dynamic-tree drafter over a draft model.
pub struct Eagle2Drafter<M: CausalLm> {
    draft: DraftModel<M>,
    config: Eagle2Config,
    pending: Option<Pending>,
    stats: Eagle2Stats,
}

impl<M: CausalLm> Eagle2Drafter<M> {
    /// An EAGLE-2 drafter; errors on an invalid config.
    pub fn new(draft: M, config: Eagle2Config) -> Result<Self> {
        config.validate()?;
        Ok(Self { draft: DraftModel::new(draft), config, pending: None, stats: Eagle2Stats::default() })
    }

    /// The configuration.
    pub fn config(&self) -> &Eagle2Config {
        &self.config
    }

    /// Counters since the last `begin`.
    pub fn stats(&self) -> &Eagle2Stats {
        &self.stats
    }
}

impl<M: CausalLm> Drafter for Eagle2Drafter<M> {
    fn kind(&self) -> MethodKind {
        MethodKind::Eagle2
    }

    /// EAGLE-2 draws nothing at random (candidates are ranked), so the seed is unused.
    fn begin(&mut self, prompt: &[TokenId], _: &Sampler, _seed: u64) -> Result<()> {
        self.pending = None;
        self.stats = Eagle2Stats::default();
        self.draft.begin(prompt)
    }

    fn propose(&mut self, ctx: &ProposeContext) -> Result<TokenTree> {
        self.stats.steps += 1;
        self.pending = None;
        let total = self.config.total.min(ctx.max_nodes);
        let depth = self.config.depth.min(ctx.max_depth);
        let k = self.config.top_k;
        if total == 0 || depth == 0 {
            return Ok(TokenTree::new(ctx.root()));
        }
        let scorer = scoring_sampler(ctx.sampler)?;
        let mut cand = TokenTree::new(ctx.root());
        let mut values = vec![1.0f64];
        // Fed nodes stay pending in the draft until observe: keep them within the context room
        // the loop offers (the draft's window is assumed to match the target's).
        let mut feed_room = ctx.max_nodes;
        // The nodes expanded at the last depth, fed in one forward at the top of the next; their
        // rows are borrowed from the draft's output and read before the following feed.
        let mut frontier = vec![ROOT];
        for d in 1..=depth {
            let logits = if d == 1 { self.draft.start_step()? } else { self.draft.feed(&cand, &frontier)? };
            let mut layer = Vec::new();
            for (i, &node) in frontier.iter().enumerate() {
                let context = node_context(ctx, &cand, node);
                for (token, p) in ranked_candidates(ctx.sampler, &scorer, logits.row(i), &context, k)? {
                    let value = values[node] * p as f64;
                    layer.push(cand.add(node, token, Draw::Deterministic, value as f32)?);
                    values.push(value);
                }
            }
            if d == depth {
                break;
            }
            let mut expand = layer;
            expand.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
            expand.truncate(k.min(feed_room));
            if expand.is_empty() {
                break;
            }
            feed_room -= expand.len();
            self.stats.fed += expand.len() as u64;
            frontier = expand;
        }

        // Rerank every candidate; the kept set is closed under parents (see the module doc).
        let mut order: Vec<NodeId> = (1..cand.len()).collect();
        order.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
        order.truncate(total);
        let mut keep = vec![false; cand.len()];
        for &n in &order {
            keep[n] = true;
        }
        let mut tree = TokenTree::new(ctx.root());
        let mut to_tree: Vec<Option<NodeId>> = vec![None; cand.len()];
        to_tree[ROOT] = Some(ROOT);
        let mut to_candidate = vec![ROOT];
        // Arena order: parents before children, siblings in rank order.
        for n in 1..cand.len() {
            let node = cand.node(n);
            let parent = node.parent.and_then(|p| to_tree[p]);
            if let (true, Some(parent)) = (keep[n], parent) {
                to_tree[n] = Some(tree.add(parent, node.token, Draw::Deterministic, node.draft_prob)?);
                to_candidate.push(n);
            }
        }
        self.stats.candidates += cand.drafted() as u64;
        self.stats.kept += tree.drafted() as u64;
        self.pending = Some(Pending { candidates: cand, to_candidate });
        Ok(tree)
    }

    fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) -> Result<()> {
        let Some(p) = self.pending.take() else {
            // Nothing was drafted this step (root-only tree): no node ids to translate.
            return self.draft.observe(tree, outcome);
        };
        let mut mapped = outcome.clone();
        for n in &mut mapped.accepted {
            let id = *n;
            *n = *p.to_candidate.get(id).ok_or_else(|| {
                EngineError::State(format!("eagle2: accepted node {id} is not in the proposed tree"))
            })?;
        }
        self.draft.observe(&p.candidates, &mapped)
    }

    forward_to_draft_model!(draft);
}
