//! Helpers shared by the drafters that rank deterministic candidates (DySpec under greedy,
//! EAGLE-2, GSD): the context a node's draft distribution is conditioned on, the sampler that
//! scores candidates, the ranked candidates of a node, and the max-heap key they are grown by.

use std::cmp::Ordering;

use treespec_core::sampling::{Sampler, SamplingParams};
use treespec_core::tree::{NodeId, TokenTree};
use treespec_core::TokenId;

use super::sample::top_tokens;
use crate::drafter::ProposeContext;
use crate::error::Result;

/// The token history a node's draft distribution is conditioned on, as the repetition penalty
/// sees it (empty when there is no penalty: nothing looks at it then).
pub(super) fn node_context(ctx: &ProposeContext, tree: &TokenTree, node: NodeId) -> Vec<TokenId> {
    let p = ctx.sampler.params();
    if !p.penalises() {
        return Vec::new();
    }
    let mut c = ctx.history.to_vec();
    c.extend(tree.path_tokens(node));
    c
}

/// The sampler that scores deterministic candidates: the sampler itself when sampling (values are
/// the processed draft probabilities), temperature 1 with the same repetition penalty under greedy
/// (a point mass would score every runner-up 0).
pub(super) fn scoring_sampler(sampler: &Sampler) -> Result<Sampler> {
    if !sampler.is_greedy() {
        return Ok(sampler.clone());
    }
    let p = sampler.params();
    Ok(Sampler::new(SamplingParams {
        temperature: 1.0,
        repetition_penalty: p.repetition_penalty,
        penalty_last_n: p.penalty_last_n,
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
        ..SamplingParams::default()
    })?)
}

/// Up to `cap` deterministic candidates for a node, best first, with their `scorer` probabilities:
/// under greedy the greedy token first (it is what the verifier follows), then the most probable
/// others. Tokens of probability 0 are left out: they add a node of no value.
pub(super) fn ranked_candidates(
    sampler: &Sampler,
    scorer: &Sampler,
    logits: &[f32],
    context: &[TokenId],
    cap: usize,
) -> Result<Vec<(TokenId, f32)>> {
    if cap == 0 {
        return Ok(Vec::new());
    }
    let probs = scorer.distribution(logits, context)?;
    let mut out = Vec::with_capacity(cap);
    if sampler.is_greedy() {
        let best = sampler.greedy_token(logits, context)?;
        out.push((best, probs.prob(best)));
    }
    for t in top_tokens(probs.probs(), cap + 1) {
        if out.len() == cap {
            break;
        }
        let p = probs.prob(t);
        if p > 0.0 && !out.iter().any(|&(b, _)| b == t) {
            out.push((t, p));
        }
    }
    Ok(out)
}

/// A max-heap entry: ordered by `score` (a total order on floats), ties to the lower `seq`, i.e.
/// the entry pushed first, so trees grown from a heap are deterministic.
pub(super) struct ByScore<T> {
    pub score: f64,
    pub seq: u64,
    pub item: T,
}

impl<T> PartialEq for ByScore<T> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<T> Eq for ByScore<T> {}
impl<T> PartialOrd for ByScore<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for ByScore<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then(other.seq.cmp(&self.seq))
    }
}
