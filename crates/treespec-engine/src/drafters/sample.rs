//! Turning a draft model's logits row into children of a tree node, in the form the verifier
//! needs: deterministic top candidates under greedy decoding, draws without replacement from the
//! processed draft distribution `q` otherwise.

use std::sync::Arc;

use treespec_core::rng::StreamRng;
use treespec_core::sampling::{softmax_at, Sampler};
use treespec_core::tree::{Draw, NodeId, TokenTree};
use treespec_core::TokenId;

use crate::error::Result;

/// The `k` highest logits' tokens, best first (ties towards the lower id).
pub fn top_tokens(logits: &[f32], k: usize) -> Vec<TokenId> {
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    let cmp = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, cmp);
        idx.truncate(k);
    }
    idx.sort_unstable_by(cmp);
    idx.into_iter().map(|i| i as TokenId).collect()
}

/// How sampled children of one node are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SampleMode {
    /// Without replacement (Sequoia / DySpec; verification family 2). Never duplicates.
    #[default]
    WithoutReplacement,
    /// Independent draws (SpecInfer; verification family 1). May duplicate.
    Iid,
}

/// Add up to `width` children under `parent` from the draft's `logits` after `context`.
///
/// Greedy: the top-`width` tokens as deterministic candidates, scored with their temperature-1
/// probability. Sampling: `width` draws from `q` (without replacement, fewer if `q`'s support
/// runs out; or i.i.d.), each node carrying the full `q` so the verifier can rebuild exactly the
/// distributions the drafter drew from.
#[allow(clippy::too_many_arguments)]
pub fn draw_children(
    tree: &mut TokenTree,
    parent: NodeId,
    logits: &[f32],
    context: &[TokenId],
    width: usize,
    mode: SampleMode,
    sampler: &Sampler,
    rng: &mut StreamRng,
) -> Result<Vec<NodeId>> {
    let mut out = Vec::with_capacity(width);
    let parent_prob = tree.node(parent).draft_prob;
    if sampler.is_greedy() {
        let best = sampler.greedy_token(logits, context)?;
        // The greedy token first (it may differ from the raw top-1 under a repetition penalty).
        let mut tokens = vec![best];
        if width > 1 {
            // (A vocabulary-sized index sort, skipped for a single child.)
            tokens.extend(top_tokens(logits, width).into_iter().filter(|&t| t != best));
        }
        tokens.truncate(width);
        // Only the chosen tokens' probabilities, not a whole softmax row.
        let probs = softmax_at(logits, &tokens)?;
        for (t, p) in tokens.into_iter().zip(probs) {
            out.push(tree.add(parent, t, Draw::Deterministic, parent_prob * p)?);
        }
        return Ok(out);
    }
    let q = Arc::new(sampler.distribution(logits, context)?);
    if mode == SampleMode::Iid {
        for _ in 0..width {
            let x = q.sample(rng);
            out.push(tree.add(parent, x, Draw::Iid { q: q.clone() }, parent_prob * q.prob(x))?);
        }
        return Ok(out);
    }
    let mut remaining = Some((*q).clone());
    for _ in 0..width {
        let Some(cur) = remaining.take() else { break };
        let x = cur.sample(rng);
        out.push(tree.add(parent, x, Draw::WithoutReplacement { q: q.clone() }, parent_prob * q.prob(x))?);
        remaining = cur.without(x);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use treespec_core::rng::Stream;
    use treespec_core::sampling::SamplingParams;
    use treespec_core::tree::ROOT;

    #[test]
    fn top_tokens_orders_and_breaks_ties_by_id() {
        assert_eq!(top_tokens(&[1.0, 3.0, 3.0, 0.0], 3), vec![1, 2, 0]);
        assert_eq!(top_tokens(&[1.0], 4), vec![0]);
    }

    #[test]
    fn sampled_children_are_distinct_and_bounded_by_support() {
        let s =
            Sampler::new(SamplingParams { temperature: 1.0, top_k: Some(2), ..Default::default() }).unwrap();
        let mut rng = StreamRng::new(5, Stream::Draft);
        let mut t = TokenTree::new(0);
        let kids = draw_children(
            &mut t,
            ROOT,
            &[0.0, 1.0, 2.0, 0.5],
            &[],
            4,
            SampleMode::WithoutReplacement,
            &s,
            &mut rng,
        )
        .unwrap();
        assert_eq!(kids.len(), 2);
        assert_ne!(t.node(kids[0]).token, t.node(kids[1]).token);
    }
}
