//! Sequoia (arXiv 2402.12374): a fixed tree shape, DP-optimal for a measured positional
//! acceptance vector (`treespec_core::sequoia`), filled each step from the draft model.
//!
//! The shape is built one depth at a time with one batched draft forward per depth. A node's
//! k-th child is the draft's k-th draw without replacement under sampling (verification family 2,
//! which is what the positional vector was measured with) and its k-th best token under greedy
//! decoding. Only nodes that have children in the shape are fed to the draft, since leaves' logits
//! would never be used.

use std::collections::HashMap;
use std::sync::Arc;

use treespec_core::rng::{Stream, StreamRng};
use treespec_core::sampling::Sampler;
use treespec_core::sequoia::{optimal_tree, validate_acceptance, OptimalTree};
use treespec_core::tree::{NodeId, TokenTree, ROOT};
use treespec_core::TokenId;

use super::sample::{draw_children, SampleMode};
use crate::backend::CausalLm;
use crate::draft_model::{forward_to_draft_model, DraftModel};
use crate::drafter::{Drafter, ProposeContext};
use crate::error::{EngineError, Result};
use crate::method_kind::MethodKind;

/// Knobs of [`SequoiaDrafter`].
#[derive(Debug, Clone, PartialEq)]
pub struct SequoiaConfig {
    /// Most drafted nodes per step (the root not counted). Default 16.
    pub budget: usize,
    /// Deepest drafted node (`None`: only the budget bounds it). Default `None`.
    pub max_depth: Option<usize>,
    /// Positional acceptance vector `P[1..B]`: probability that the k-th drawn child is the
    /// accepted one. It depends on the model pair and the sampling settings, so there is no
    /// default: it comes from `treespec calibrate` (see `crate::measure::offline`) or the command line.
    pub acceptance: Vec<f32>,
}

impl Default for SequoiaConfig {
    fn default() -> Self {
        Self { budget: 16, max_depth: None, acceptance: Vec::new() }
    }
}

impl SequoiaConfig {
    /// Check every knob, naming the bad one.
    pub fn validate(&self) -> Result<()> {
        if self.budget == 0 {
            return Err(EngineError::InvalidRequest("sequoia budget must be ≥ 1 drafted node".into()));
        }
        // The optimal-shape DP costs O(budget² · width): past this it would stall the request
        // (and a budget near usize::MAX overflowed its table size).
        if self.budget > MAX_BUDGET {
            return Err(EngineError::InvalidRequest(format!(
                "sequoia budget must be ≤ {MAX_BUDGET} drafted nodes, got {}",
                self.budget
            )));
        }
        if self.max_depth == Some(0) {
            return Err(EngineError::InvalidRequest(
                "sequoia max depth must be ≥ 1 (omit it for no bound)".into(),
            ));
        }
        if self.acceptance.is_empty() {
            return Err(EngineError::InvalidRequest(
                "sequoia needs a positional acceptance vector: run `treespec calibrate` for this model \
                 pair and sampling setting, or pass one on the command line"
                    .into(),
            ));
        }
        validate_acceptance(&self.acceptance)
            .map_err(|e| EngineError::InvalidRequest(format!("sequoia acceptance vector: {e}")))
    }
}

/// Largest Sequoia budget accepted, in drafted nodes.
pub const MAX_BUDGET: usize = 1024;

/// Drafts Sequoia's optimal tree shape.
pub struct SequoiaDrafter<M: CausalLm> {
    draft: DraftModel<M>,
    config: SequoiaConfig,
    rng: StreamRng,
    /// Optimal shapes by (budget, depth bound): the configured one, plus smaller ones when the
    /// step's room or remaining tokens are tighter (re-solving beats cutting the big tree).
    shapes: HashMap<(usize, Option<usize>), Arc<OptimalTree>>,
}

impl<M: CausalLm> SequoiaDrafter<M> {
    /// A Sequoia drafter; solves the DP for the configured budget now, so a bad vector fails early.
    pub fn new(draft: M, config: SequoiaConfig) -> Result<Self> {
        config.validate()?;
        let mut d = Self {
            draft: DraftModel::new(draft),
            config,
            rng: StreamRng::new(0, Stream::Draft),
            shapes: HashMap::new(),
        };
        d.shape_for(d.config.budget, d.config.max_depth)?;
        Ok(d)
    }

    /// The configuration.
    pub fn config(&self) -> &SequoiaConfig {
        &self.config
    }

    /// The optimal tree for the configured budget and depth bound, with its expected τ.
    pub fn tree(&self) -> Arc<OptimalTree> {
        self.shapes[&key(self.config.budget, self.config.max_depth)].clone()
    }

    fn shape_for(&mut self, budget: usize, depth: Option<usize>) -> Result<Arc<OptimalTree>> {
        let k = key(budget, depth);
        if let Some(s) = self.shapes.get(&k) {
            return Ok(s.clone());
        }
        let s = Arc::new(optimal_tree(&self.config.acceptance, k.0, k.1)?);
        self.shapes.insert(k, s.clone());
        Ok(s)
    }
}

/// Cache key: a depth bound at or beyond the budget cannot bind, so it is dropped.
fn key(budget: usize, depth: Option<usize>) -> (usize, Option<usize>) {
    (budget, depth.filter(|&d| d < budget))
}

impl<M: CausalLm> Drafter for SequoiaDrafter<M> {
    fn kind(&self) -> MethodKind {
        MethodKind::Sequoia
    }

    fn begin(&mut self, prompt: &[TokenId], _: &Sampler, seed: u64) -> Result<()> {
        self.rng = StreamRng::new(seed, Stream::Draft);
        self.draft.begin(prompt)
    }

    fn propose(&mut self, ctx: &ProposeContext) -> Result<TokenTree> {
        let mut tree = TokenTree::new(ctx.root());
        let budget = self.config.budget.min(ctx.max_nodes);
        let depth_cap = self.config.max_depth.unwrap_or(usize::MAX).min(ctx.max_depth);
        if budget == 0 || depth_cap == 0 {
            return Ok(tree);
        }
        let opt = self.shape_for(budget, Some(depth_cap))?;
        let shape = &opt.shape;
        if shape.drafted() == 0 {
            return Ok(tree);
        }
        // Frontier: (shape node, tree node), fed in one forward at the top of each level, their
        // rows borrowed from the draft's output and read before the next feed. A shape node
        // whose draw did not happen (without-replacement draws ran out of support) is skipped
        // with its subtree.
        let mut frontier: Vec<(usize, NodeId)> = vec![(0, ROOT)];
        for level in 0usize.. {
            let logits = if level == 0 {
                self.draft.start_step()?
            } else {
                let nodes: Vec<NodeId> = frontier.iter().map(|&(_, t)| t).collect();
                self.draft.feed(&tree, &nodes)?
            };
            let mut to_feed: Vec<(usize, NodeId)> = Vec::new();
            for (i, &(s, node)) in frontier.iter().enumerate() {
                let kids = shape.children(s);
                let context = ctx.node_context(&tree, node);
                let drawn = draw_children(
                    &mut tree,
                    node,
                    logits.row(i),
                    &context,
                    kids.len(),
                    SampleMode::WithoutReplacement,
                    ctx.sampler,
                    &mut self.rng,
                )?;
                // Only inner nodes need draft logits; leaves are never fed.
                to_feed.extend(
                    kids.iter()
                        .zip(&drawn)
                        .filter(|(&sk, _)| !shape.children(sk).is_empty())
                        .map(|(&sk, &tk)| (sk, tk)),
                );
            }
            if to_feed.is_empty() {
                break;
            }
            frontier = to_feed;
        }
        Ok(tree)
    }

    forward_to_draft_model!(draft, observe);
}
