//! Lossless verification of a drafted token tree against the target (ALGORITHMS.md §2).
//!
//! The walk starts at the root. At each node the children are tried in the order the drafter
//! added them; each child is one exact *rejection step* on the current target distribution `p`,
//! chosen by how the child was drawn:
//!
//! * deterministic candidate `x` (family 3): accept with probability `p(x)`; on reject
//!   `p ← norm(p with x zeroed)`;
//! * i.i.d. sample `x ~ q` (family 1): accept with `min(1, p(x)/q(x))`; on reject
//!   `p ← norm(max(p − q, 0))`;
//! * without-replacement sample `x ~ q_i` (family 2), where `q_i` is `q` with the earlier
//!   without-replacement siblings zeroed: accept with `min(1, p(x)/q_i(x))`; on reject
//!   `p ← norm(max(p − q_i, 0))` and `q_{i+1} ← norm(q_i with x zeroed)`.
//!
//! Each step splits the current `p` exactly into "emit x" plus "continue with the residual", so
//! by induction the emitted token is distributed as the target's `p`, whatever mix of families
//! the siblings use, as long as the drafter never looked at the verifier's random numbers. When no
//! child is accepted the bonus/correction token is sampled from the residual; after an accepted
//! leaf it is sampled from the leaf's own target distribution.
//!
//! Greedy decoding (temperature 0) is the limit of all three: follow the child equal to the
//! target's argmax, then emit the argmax. It consumes no random numbers.
//!
//! Reproducible sampling ([`Choice::Seeded`]) walks the tree as greedy does, with the target's
//! argmax replaced by its token drawn with the noise fixed for that node's sequence position
//! ([`PositionNoise`]): the emitted tokens are then exactly plain decoding's under the same
//! seed, whatever the drafter proposed and however its children were drawn.

use crate::dist::Dist;
use crate::noise::PositionNoise;
use crate::rng::StreamRng;
use crate::sampling::Sampler;
use crate::tree::{Draw, NodeId, TokenTree, ROOT};
use crate::{Error, Result, TokenId};

/// Supplies the target's processed next-token distribution after each tree node. Computed
/// lazily: the verifier asks only for the nodes on its walk, which for a large vocabulary is most
/// of the verification cost.
pub trait TargetDists {
    /// The target's distribution for the token after `node` (its row in the verify batch).
    fn dist(&mut self, node: NodeId) -> Result<Dist>;
    /// The target's greedy token after `node`.
    fn greedy(&mut self, node: NodeId) -> Result<TokenId>;
}

/// What happened at one depth of the walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DepthRecord {
    /// Depth of the children considered (1 = the root's children).
    pub depth: usize,
    /// How many drafted children the node had.
    pub candidates: usize,
    /// How many of them were tried before one was accepted (or all were rejected).
    pub tried: usize,
    /// Whether one was accepted.
    pub accepted: bool,
}

/// The result of verifying one tree.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyOutcome {
    /// Accepted drafted nodes, root's child first (the root itself is implied).
    pub accepted: Vec<NodeId>,
    /// Emitted tokens: the accepted nodes' tokens followed by the bonus/correction token.
    pub tokens: Vec<TokenId>,
    /// One record per depth the walk reached with at least one candidate child.
    pub depths: Vec<DepthRecord>,
}

impl VerifyOutcome {
    /// The bonus/correction token sampled from the target.
    pub fn bonus(&self) -> TokenId {
        *self.tokens.last().expect("an outcome always emits the bonus token")
    }

    /// Root-inclusive accepted path, as node ids (what the backends commit).
    pub fn path(&self) -> Vec<NodeId> {
        std::iter::once(ROOT).chain(self.accepted.iter().copied()).collect()
    }
}

/// How the target picks its token at a node, which decides how the walk goes on.
#[derive(Debug)]
pub enum Choice<'r> {
    /// Temperature 0: the target's argmax (no random numbers).
    Greedy,
    /// Exact rejection steps on the drafted children (the three families), with the verifier's
    /// coins from this stream: what a sample is depends on the coins rejected drafts used.
    Sampled(&'r mut StreamRng),
    /// The target's own sample, drawn with `noise` at the node's sequence position (`next` is
    /// the position of the token after the root; a node at depth d decides position next + d).
    /// The output is a function of the seed, the prompt and the target alone.
    Seeded {
        /// The request's noise.
        noise: PositionNoise,
        /// Sequence position of the root's next token (the history's length).
        next: u64,
    },
}

impl<'r> Choice<'r> {
    /// What `sampler` calls for at a root whose next token sits at sequence position `next`:
    /// greedy at temperature 0, seeded by `seed` when reproducible, else coins from `rng`.
    pub fn for_sampler(sampler: &Sampler, seed: u64, next: usize, rng: &'r mut StreamRng) -> Self {
        if sampler.is_greedy() {
            Choice::Greedy
        } else if sampler.params().reproducible {
            Choice::Seeded { noise: PositionNoise::new(seed), next: next as u64 }
        } else {
            Choice::Sampled(rng)
        }
    }
}

/// Verify `tree` against the target, picking the target's tokens as `choice` says.
pub fn verify(
    tree: &TokenTree,
    target: &mut dyn TargetDists,
    mut choice: Choice<'_>,
) -> Result<VerifyOutcome> {
    let mut out = VerifyOutcome { accepted: Vec::new(), tokens: Vec::new(), depths: Vec::new() };
    let mut at = ROOT;
    loop {
        let children = tree.children(at);
        let step = match &mut choice {
            Choice::Greedy => follow(tree, at, target.greedy(at)?),
            Choice::Sampled(rng) => sampled_step(tree, target, at, rng)?,
            Choice::Seeded { noise, next } => {
                let pos = *next + tree.node(at).depth as u64;
                follow(tree, at, noise.choose(&target.dist(at)?, pos))
            }
        };
        if !children.is_empty() {
            out.depths.push(DepthRecord {
                depth: tree.node(at).depth + 1,
                candidates: children.len(),
                tried: step.tried,
                accepted: matches!(step.next, Next::Accept(_)),
            });
        }
        match step.next {
            Next::Accept(child) => {
                out.accepted.push(child);
                out.tokens.push(tree.node(child).token);
                at = child;
            }
            Next::Bonus(token) => {
                out.tokens.push(token);
                return Ok(out);
            }
        }
    }
}

/// Where the walk goes from a node.
enum Next {
    /// This child was accepted: the walk continues there.
    Accept(NodeId),
    /// No child was accepted: this token (the correction, or the bonus after a leaf) ends the walk.
    Bonus(TokenId),
}

/// One node's result: where the walk goes, and how many children were tried.
struct Step {
    next: Next,
    tried: usize,
}

/// The deterministic walk (greedy and seeded): follow the child holding `want`, the target's
/// own token at `at`, or end on `want` when no child holds it.
fn follow(tree: &TokenTree, at: NodeId, want: TokenId) -> Step {
    let children = tree.children(at);
    match children.iter().position(|&c| tree.node(c).token == want) {
        Some(i) => Step { next: Next::Accept(children[i]), tried: i + 1 },
        None => Step { next: Next::Bonus(want), tried: children.len() },
    }
}

fn sampled_step(
    tree: &TokenTree,
    target: &mut dyn TargetDists,
    at: NodeId,
    rng: &mut StreamRng,
) -> Result<Step> {
    let mut p = target.dist(at)?;
    let children = tree.children(at);
    // The without-replacement draft distribution q_i, rebuilt in drawing order.
    let mut q_wor: Option<Dist> = None;
    for (i, &c) in children.iter().enumerate() {
        let node = tree.node(c);
        let x = node.token;
        if x as usize >= p.len() {
            return Err(Error::TokenOutOfRange { token: x, vocab: p.len() });
        }
        let q_step: Option<Dist> = match &node.draw {
            Draw::Deterministic => None,
            Draw::Iid { q } => Some(check_q(q, &p, c)?.clone()),
            Draw::WithoutReplacement { q } => {
                let qi = match q_wor.take() {
                    Some(qi) => qi,
                    None => check_q(q, &p, c)?.clone(),
                };
                Some(qi)
            }
        };
        let u = rng.uniform();
        let accept = match &q_step {
            None => u < p.prob(x) as f64,
            Some(q) => {
                let qx = q.prob(x) as f64;
                if qx <= 0.0 {
                    return Err(Error::BadDraftNode {
                        node: c,
                        reason: format!(
                            "token {x} was sampled from a draft distribution that gives it probability 0"
                        ),
                    });
                }
                u * qx < p.prob(x) as f64
            }
        };
        if accept {
            return Ok(Step { next: Next::Accept(c), tried: i + 1 });
        }
        // Reject: move to the residual. A residual with no mass means the rejection had
        // probability 0 and only rounding got us here; keep p then.
        p = match &q_step {
            None => p.without(x),
            Some(q) => p.residual(q),
        }
        .unwrap_or(p);
        if let (Draw::WithoutReplacement { .. }, Some(qi)) = (&node.draw, q_step) {
            match qi.without(x) {
                Some(next) => q_wor = Some(next),
                // q is exhausted: no further without-replacement child can have been drawn.
                None => {
                    let rest_wor = children[i + 1..]
                        .iter()
                        .any(|&s| matches!(tree.node(s).draw, Draw::WithoutReplacement { .. }));
                    if rest_wor {
                        return Err(Error::BadDraftNode {
                            node: c,
                            reason: "more without-replacement siblings than the draft distribution's support"
                                .into(),
                        });
                    }
                }
            }
        }
    }
    Ok(Step { next: Next::Bonus(p.sample(rng)), tried: children.len() })
}

fn check_q<'a>(q: &'a Dist, p: &Dist, node: NodeId) -> Result<&'a Dist> {
    if q.len() != p.len() {
        return Err(Error::VerifyMismatch(format!(
            "node {node}: draft distribution has {} entries, target has {}",
            q.len(),
            p.len()
        )));
    }
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Stream;
    use std::sync::Arc;

    /// A target with the same distribution after every node.
    struct Fixed(Dist);
    impl TargetDists for Fixed {
        fn dist(&mut self, _: NodeId) -> Result<Dist> {
            Ok(self.0.clone())
        }
        fn greedy(&mut self, _: NodeId) -> Result<TokenId> {
            Ok(self.0.argmax())
        }
    }

    fn d(w: &[f32]) -> Dist {
        Dist::from_weights(w.to_vec()).unwrap()
    }

    #[test]
    fn greedy_follows_argmax_and_emits_bonus() {
        let mut t = TokenTree::new(0);
        let a = t.add(ROOT, 1, Draw::Deterministic, 1.0).unwrap();
        t.add(ROOT, 2, Draw::Deterministic, 1.0).unwrap();
        t.add(a, 2, Draw::Deterministic, 1.0).unwrap();
        let b = t.add(a, 1, Draw::Deterministic, 1.0).unwrap();
        let out = verify(&t, &mut Fixed(d(&[0.1, 0.5, 0.4])), Choice::Greedy).unwrap();
        assert_eq!(out.accepted, vec![a, b]);
        assert_eq!(out.tokens, vec![1, 1, 1]);
        assert_eq!(out.path(), vec![ROOT, a, b]);
        assert_eq!(out.depths[0], DepthRecord { depth: 1, candidates: 2, tried: 1, accepted: true });
        assert_eq!(out.depths[1], DepthRecord { depth: 2, candidates: 2, tried: 2, accepted: true });
        assert_eq!(out.depths.len(), 2);
    }

    /// The seeded walk follows the child equal to the target's own noisy choice at each depth,
    /// whatever the children's draws say, and ends on the choice where no child holds it.
    #[test]
    fn seeded_walk_follows_the_targets_choice_at_each_position() {
        let p = d(&[0.3, 0.3, 0.4]);
        let q = Arc::new(d(&[0.9, 0.05, 0.05]));
        for seed in 0..40 {
            let noise = PositionNoise::new(seed);
            let (c1, c2) = (noise.choose(&p, 10), noise.choose(&p, 11));
            let mut t = TokenTree::new(0);
            let kids: Vec<NodeId> = (0..3)
                .map(|x| t.add(ROOT, x, Draw::WithoutReplacement { q: q.clone() }, 0.1).unwrap())
                .collect();
            let grand = t.add(kids[c1 as usize], (c2 + 1) % 3, Draw::Deterministic, 0.1).unwrap();
            let out = verify(&t, &mut Fixed(p.clone()), Choice::Seeded { noise, next: 10 }).unwrap();
            assert_eq!(out.accepted, vec![kids[c1 as usize]], "seed {seed}");
            assert_eq!(out.tokens, vec![c1, c2]);
            assert_ne!(out.accepted.last(), Some(&grand));
            assert_eq!(out.depths[1], DepthRecord { depth: 2, candidates: 1, tried: 1, accepted: false });
        }
    }

    #[test]
    fn equal_draft_and_target_always_accepts() {
        let p = d(&[0.2, 0.3, 0.5]);
        let q = Arc::new(p.clone());
        let mut rng = StreamRng::new(3, Stream::Verify);
        let mut drng = StreamRng::new(3, Stream::Draft);
        for _ in 0..200 {
            let mut t = TokenTree::new(0);
            let x = q.sample(&mut drng);
            t.add(ROOT, x, Draw::Iid { q: q.clone() }, q.prob(x)).unwrap();
            let out = verify(&t, &mut Fixed(p.clone()), Choice::Sampled(&mut rng)).unwrap();
            assert_eq!(out.accepted.len(), 1);
        }
    }

    #[test]
    fn zero_probability_draft_token_is_an_error() {
        let q = Arc::new(d(&[1.0, 0.0]));
        let mut t = TokenTree::new(0);
        t.add(ROOT, 1, Draw::Iid { q }, 0.0).unwrap();
        let mut rng = StreamRng::new(0, Stream::Verify);
        assert!(matches!(
            verify(&t, &mut Fixed(d(&[0.5, 0.5])), Choice::Sampled(&mut rng)),
            Err(Error::BadDraftNode { .. })
        ));
    }

    #[test]
    fn vocab_mismatch_is_an_error() {
        let q = Arc::new(d(&[1.0, 1.0, 1.0]));
        let mut t = TokenTree::new(0);
        t.add(ROOT, 1, Draw::Iid { q }, 0.3).unwrap();
        let mut rng = StreamRng::new(0, Stream::Verify);
        assert!(matches!(
            verify(&t, &mut Fixed(d(&[0.5, 0.5])), Choice::Sampled(&mut rng)),
            Err(Error::VerifyMismatch(_))
        ));
    }
}
