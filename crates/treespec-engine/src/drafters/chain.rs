//! Chain speculative decoding (Leviathan et al. / Chen et al.): the draft proposes `k` tokens one
//! after another; the baseline every tree method is measured against.

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

/// Drafts a chain of `k` tokens with a draft model.
pub struct ChainDrafter<M: CausalLm> {
    draft: DraftModel<M>,
    k: usize,
    rng: StreamRng,
}

impl<M: CausalLm> ChainDrafter<M> {
    /// A chain drafter proposing `k ≥ 1` tokens per step.
    pub fn new(draft: M, k: usize) -> Result<Self> {
        if k == 0 {
            return Err(EngineError::InvalidRequest("chain length k must be ≥ 1".into()));
        }
        Ok(Self { draft: DraftModel::new(draft), k, rng: StreamRng::new(0, Stream::Draft) })
    }
}

impl<M: CausalLm> Drafter for ChainDrafter<M> {
    fn kind(&self) -> MethodKind {
        MethodKind::Chain
    }

    fn begin(&mut self, prompt: &[TokenId], _: &Sampler, seed: u64) -> Result<()> {
        self.rng = StreamRng::new(seed, Stream::Draft);
        self.draft.begin(prompt)
    }

    fn propose(&mut self, ctx: &ProposeContext) -> Result<TokenTree> {
        draft_chain(&mut self.draft, ctx, self.k, &mut self.rng, |_, _, _| Ok(true))
    }

    forward_to_draft_model!(draft, observe);
}

/// Draft a chain of at most `k` tokens, one draft forward per token after the first. After each
/// drafted token, `keep_going(logits, token, index)` — seeing only the draft's own values, never
/// the verifier's — decides whether to draft another (DISCO's stop rule; always true for `chain`).
pub(crate) fn draft_chain<M: CausalLm>(
    draft: &mut DraftModel<M>,
    ctx: &ProposeContext,
    k: usize,
    rng: &mut StreamRng,
    mut keep_going: impl FnMut(&[f32], TokenId, usize) -> Result<bool>,
) -> Result<TokenTree> {
    let mut tree = TokenTree::new(ctx.root());
    let k = k.min(ctx.max_nodes).min(ctx.max_depth);
    if k == 0 {
        return Ok(tree);
    }
    // Only the repetition penalty reads the context: its window of history, then the drafted
    // tokens (nothing copied without a penalty).
    let mut context = ctx.history_window().to_vec();
    let mut at = ROOT;
    for i in 0..k {
        // The row is borrowed from the draft's output: it is read before the next feed.
        let out = if i == 0 { draft.start_step()? } else { draft.feed(&tree, &[at])? };
        let logits = out.row(0);
        let kids = draw_children(
            &mut tree,
            at,
            logits,
            &context,
            1,
            SampleMode::WithoutReplacement,
            ctx.sampler,
            rng,
        )?;
        let Some(&child) = kids.first() else { break };
        let token = tree.node(child).token;
        if ctx.sampler.context_window() > 0 {
            context.push(token);
        }
        at = child;
        if !keep_going(logits, token, i)? {
            break;
        }
    }
    Ok(tree)
}
