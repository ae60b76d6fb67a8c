//! The seeded verifier (`Choice::Seeded`) is lossless (ALGORITHMS.md §4.1), whatever the drafter
//! proposed — even a drafter that looks at the noise, which would bias rejection sampling: the
//! emitted tokens are the target's own noisy choices, a function of (seed, position, p) alone.
//!
//! Over 10^5 seeds per configuration: the first emitted token follows `p` (χ²), a child is
//! accepted exactly when the target's choice is among the children (binomial against Σ p over the
//! children), and over several verify steps of a Markov target the joint of three tokens is the
//! product of its conditionals (catches positions that share noise or skip one).

mod common;

use std::sync::Arc;

use common::{binomial_p_value, chi_square, FAMILY_ALPHA};
use treespec_core::noise::PositionNoise;
use treespec_core::rng::{Stream, StreamRng};
use treespec_core::tree::{Draw, NodeId, TokenTree, ROOT};
use treespec_core::verify::{verify, Choice, TargetDists};
use treespec_core::{Dist, Result, TokenId};

const TRIALS: u64 = 100_000;

/// Random weights `exp(sharp · g)` from the auxiliary stream.
fn rand_dist(vocab: usize, seed: u64, sharp: f64, keep: impl Fn(usize) -> bool) -> Dist {
    let mut rng = StreamRng::new(seed, Stream::Aux);
    let w: Vec<f32> = (0..vocab)
        .map(|i| {
            let g: f64 = (0..4).map(|_| rng.uniform()).sum::<f64>() - 2.0;
            if keep(i) {
                (sharp * g * 3f64.sqrt()).exp() as f32
            } else {
                0.0
            }
        })
        .collect();
    Dist::from_weights(w).unwrap()
}

/// The target of a Markov chain: after a node, `rows[token]` (the root's token included).
struct Markov<'a> {
    tree: &'a TokenTree,
    rows: &'a [Dist],
}

impl TargetDists for Markov<'_> {
    fn dist(&mut self, node: NodeId) -> Result<Dist> {
        Ok(self.rows[self.tree.node(node).token as usize].clone())
    }
    fn greedy(&mut self, node: NodeId) -> Result<TokenId> {
        Ok(self.dist(node)?.argmax())
    }
}

/// How a trial's children are drafted.
#[derive(Clone, Copy, Debug)]
enum Kids {
    /// These fixed tokens.
    Fixed(&'static [TokenId]),
    /// Three draws without replacement from a draft distribution, from the draft stream.
    Sampled,
    /// The two best tokens of the race `E / q` under the verifier's own noise and a draft `q`:
    /// a drafter that looks at the noise (coupled drafting).
    Peeking,
}

fn children(kids: Kids, q: &Arc<Dist>, noise: PositionNoise, pos: u64, rng: &mut StreamRng) -> Vec<TokenId> {
    match kids {
        Kids::Fixed(t) => t.to_vec(),
        Kids::Sampled => {
            let mut left = Some((**q).clone());
            let mut out = Vec::new();
            for _ in 0..3 {
                let Some(cur) = left.take() else { break };
                let x = cur.sample(rng);
                out.push(x);
                left = cur.without(x);
            }
            out
        }
        Kids::Peeking => {
            let mut race: Vec<(f64, TokenId)> = (0..q.len() as TokenId)
                .filter(|&x| q.prob(x) > 0.0)
                .map(|x| (noise.exponential(pos, x) / q.prob(x) as f64, x))
                .collect();
            race.sort_by(|a, b| a.0.total_cmp(&b.0));
            race.iter().take(2).map(|r| r.1).collect()
        }
    }
}

#[test]
fn the_first_token_follows_p_and_acceptance_is_the_mass_of_the_children() {
    let vocab = 12;
    let configs: Vec<(&str, Dist, Kids)> = vec![
        ("sharp p, fixed children", rand_dist(vocab, 1, 1.0, |_| true), Kids::Fixed(&[0, 3, 7])),
        ("flat p, no children", rand_dist(vocab, 2, 0.2, |_| true), Kids::Fixed(&[])),
        ("top-5 p, sampled children", rand_dist(vocab, 3, 1.0, |i| i < 5), Kids::Sampled),
        ("p, peeking children", rand_dist(vocab, 4, 1.0, |_| true), Kids::Peeking),
        ("even p, peeking children", rand_dist(vocab, 5, 1.5, |i| i % 2 == 0), Kids::Peeking),
        ("one-hot p, fixed children", Dist::point_mass(4, vocab).unwrap(), Kids::Fixed(&[4, 5])),
    ];
    let q = Arc::new(rand_dist(vocab, 9, 1.0, |_| true));
    let alpha = FAMILY_ALPHA / (2 * configs.len()) as f64;
    let mut failures = Vec::new();
    for (k, (name, p, kids)) in configs.iter().enumerate() {
        let rows = vec![p.clone(); vocab];
        let mut drng = StreamRng::new(k as u64, Stream::Draft);
        let (mut counts, mut accepted, mut mass) = (vec![0u64; vocab], 0u64, 0f64);
        for trial in 0..TRIALS {
            let noise = PositionNoise::new(trial ^ (k as u64) << 40);
            let pos = 3 + trial % 5;
            let mut tree = TokenTree::new(0);
            let kids = children(*kids, &q, noise, pos, &mut drng);
            for &x in &kids {
                tree.add(ROOT, x, Draw::WithoutReplacement { q: q.clone() }, q.prob(x)).unwrap();
            }
            mass += kids.iter().map(|&x| p.prob(x) as f64).sum::<f64>();
            let mut target = Markov { tree: &tree, rows: &rows };
            let out = verify(&tree, &mut target, Choice::Seeded { noise, next: pos }).unwrap();
            assert_eq!(out.tokens[0], noise.choose(p, pos), "{name}: the target's own choice");
            accepted += out.accepted.len().min(1) as u64;
            counts[out.tokens[0] as usize] += 1;
        }
        let probs: Vec<f64> = p.probs().iter().map(|&x| x as f64).collect();
        match chi_square(&counts, &probs) {
            Ok(g) if g.p_value <= alpha => {
                failures.push(format!("{name}: χ² p {:.3e} {:?}", g.p_value, g.worst))
            }
            Ok(g) => eprintln!("{name}: χ² {:.1} df {} p {:.3e}", g.stat, g.df, g.p_value),
            Err(e) => failures.push(format!("{name}: {e}")),
        }
        // Acceptance: Bernoulli(Σ_children p) per trial; fixed and sampled children are
        // independent of the noise, so the mean of those masses is the expected rate (the
        // binomial variance bounds the varying masses' from above: a conservative test).
        if !matches!(kids, Kids::Peeking) {
            let rate = mass / TRIALS as f64;
            let pv = binomial_p_value(accepted, TRIALS, rate);
            eprintln!("{name}: accepted {accepted}/{TRIALS}, expected rate {rate:.4}");
            if pv <= alpha {
                failures.push(format!("{name}: acceptance {accepted}/{TRIALS}, expected {rate:.4}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Several verify steps of drafted trees over a Markov target: the first three emitted tokens'
/// joint is the product of the conditionals.
#[test]
fn three_tokens_over_several_steps_follow_the_joint() {
    let vocab = 5;
    let rows: Vec<Dist> = (0..vocab).map(|t| rand_dist(vocab, 20 + t as u64, 1.0, |_| true)).collect();
    let q = Arc::new(rand_dist(vocab, 30, 1.0, |_| true));
    let start: TokenId = 2;
    let mut drng = StreamRng::new(1, Stream::Draft);
    let mut counts = vec![0u64; vocab.pow(3)];
    for trial in 0..TRIALS {
        let noise = PositionNoise::new(trial);
        let mut emitted: Vec<TokenId> = Vec::new();
        let mut root = start;
        while emitted.len() < 3 {
            // A width-2 tree two deep, sampled without replacement.
            let mut tree = TokenTree::new(root);
            let mut frontier = vec![ROOT];
            for _ in 0..2 {
                let mut next = Vec::new();
                for &parent in &frontier {
                    let x = q.sample(&mut drng);
                    let y = q.without(x).unwrap().sample(&mut drng);
                    for t in [x, y] {
                        next.push(
                            tree.add(parent, t, Draw::WithoutReplacement { q: q.clone() }, 0.1).unwrap(),
                        );
                    }
                }
                frontier = next;
            }
            let pos = 10 + emitted.len() as u64;
            let out =
                verify(&tree, &mut Markov { tree: &tree, rows: &rows }, Choice::Seeded { noise, next: pos })
                    .unwrap();
            emitted.extend(&out.tokens);
            root = *emitted.last().unwrap();
        }
        counts[emitted[..3].iter().fold(0usize, |a, &t| a * vocab + t as usize)] += 1;
    }
    let mut probs = vec![0f64; vocab.pow(3)];
    for (cell, p) in probs.iter_mut().enumerate() {
        let (a, b, c) = (cell / 25, cell / 5 % 5, cell % 5);
        *p = rows[start as usize].prob(a as TokenId) as f64
            * rows[a].prob(b as TokenId) as f64
            * rows[b].prob(c as TokenId) as f64;
    }
    let g = chi_square(&counts, &probs).unwrap();
    eprintln!("three tokens: χ² {:.1} df {} p {:.3e}", g.stat, g.df, g.p_value);
    assert!(g.p_value > FAMILY_ALPHA, "joint differs: p {:.3e}, worst {:?}", g.p_value, g.worst);
}
