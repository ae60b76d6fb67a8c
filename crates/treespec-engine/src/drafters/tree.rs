//! A fixed-shape tree drafter: at depth d every frontier node gets `widths[d]` children, drawn
//! from the draft (deterministic top candidates under greedy). One batched draft forward per
//! depth, so width costs little on the draft side. With i.i.d. draws this is SpecInfer's
//! expansion tree `<k1,…,km>` verified by multi-round speculative sampling; with draws without
//! replacement it is the same shape verified by recursive rejection sampling.

use treespec_core::rng::{Stream, StreamRng};
use treespec_core::sampling::Sampler;
use treespec_core::tree::{TokenTree, ROOT};
use treespec_core::TokenId;

use super::sample::{draw_children, SampleMode};
use crate::backend::CausalLm;
use crate::draft_model::{forward_to_draft_model, DraftModel};
use crate::drafter::{Drafter, ProposeContext};
use crate::error::{EngineError, Result};
use crate::method_kind::MethodKind;

/// Drafts a tree with per-depth branching widths.
pub struct TreeDrafter<M: CausalLm> {
    draft: DraftModel<M>,
    widths: Vec<usize>,
    mode: SampleMode,
    rng: StreamRng,
}

impl<M: CausalLm> TreeDrafter<M> {
    /// A tree drafter; `widths[d]` children per node at depth `d + 1`. Every width must be ≥ 1.
    pub fn new(draft: M, widths: Vec<usize>) -> Result<Self> {
        Self::with_mode(draft, widths, SampleMode::WithoutReplacement)
    }

    /// A tree drafter drawing sampled children with `mode`.
    pub fn with_mode(draft: M, widths: Vec<usize>, mode: SampleMode) -> Result<Self> {
        if widths.is_empty() || widths.contains(&0) {
            return Err(EngineError::InvalidRequest(format!(
                "tree widths must be a non-empty list of numbers ≥ 1, got {widths:?}"
            )));
        }
        Ok(Self { draft: DraftModel::new(draft), widths, mode, rng: StreamRng::new(0, Stream::Draft) })
    }
}

impl<M: CausalLm> Drafter for TreeDrafter<M> {
    fn kind(&self) -> MethodKind {
        match self.mode {
            SampleMode::WithoutReplacement => MethodKind::Tree,
            SampleMode::Iid => MethodKind::SpecInfer,
        }
    }

    fn begin(&mut self, prompt: &[TokenId], _: &Sampler, seed: u64) -> Result<()> {
        self.rng = StreamRng::new(seed, Stream::Draft);
        self.draft.begin(prompt)
    }

    fn propose(&mut self, ctx: &ProposeContext) -> Result<TokenTree> {
        let mut tree = TokenTree::new(ctx.root());
        let depth = self.widths.len().min(ctx.max_depth);
        if depth == 0 || ctx.max_nodes == 0 {
            return Ok(tree);
        }
        // The nodes drawn at the last depth, fed in one forward at the top of the next; their
        // rows are borrowed from the draft's output and read before the following feed.
        let mut frontier = vec![ROOT];
        for (d, &width) in self.widths.iter().enumerate().take(depth) {
            let logits = if d == 0 { self.draft.start_step()? } else { self.draft.feed(&tree, &frontier)? };
            let mut layer = Vec::new();
            'nodes: for (i, &node) in frontier.iter().enumerate() {
                let context = ctx.node_context(&tree, node);
                let room = ctx.max_nodes - tree.drafted();
                let kids = draw_children(
                    &mut tree,
                    node,
                    logits.row(i),
                    &context,
                    width.min(room),
                    self.mode,
                    ctx.sampler,
                    &mut self.rng,
                )?;
                layer.extend(kids);
                if tree.drafted() >= ctx.max_nodes {
                    break 'nodes;
                }
            }
            if layer.is_empty() || d + 1 == depth || tree.drafted() >= ctx.max_nodes {
                break;
            }
            frontier = layer;
        }
        Ok(tree)
    }

    forward_to_draft_model!(draft, observe);
}
