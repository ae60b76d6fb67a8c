//! Statistical proof that the tree verifier is lossless at one position (ALGORITHMS.md §4.1).
//!
//! Every configuration is a one-level tree (root + 1–5 children) verified against a fixed target
//! distribution `p`. The children are drafted exactly as each verification family assumes:
//! i.i.d. draws from `q`, draws without replacement (child i from `q` with the earlier
//! without-replacement siblings removed), deterministic candidates chosen by anything that does
//! not look at the verifier's coins, and mixtures of these. Drafting and verification use
//! independent random streams. Over 10^5 trials per configuration the first emitted token must
//! follow `p` (chi-square goodness of fit, Bonferroni-corrected across the whole file), and where
//! the acceptance rate is known in closed form it must match too.

// Tests are exempt from the 80-line limit (clippy.toml): a test reads top to bottom as one story.
#![allow(clippy::too_many_lines)]

mod common;

use std::sync::Arc;

use common::{binomial_p_value, chi_square, FAMILY_ALPHA};
use treespec_core::rng::{Stream, StreamRng};
use treespec_core::tree::{Draw, NodeId, TokenTree, ROOT};
use treespec_core::verify::{verify, Choice, TargetDists};
use treespec_core::{Dist, Result, TokenId};

/// Trials per configuration.
const TRIALS: u64 = 100_000;

/// The target: `p` after the root; some other distribution after any drafted child (only the
/// bonus token after an accepted child is drawn from it, and it is not what is tested here).
struct Target {
    root: Dist,
    below: Dist,
}

impl TargetDists for Target {
    fn dist(&mut self, node: NodeId) -> Result<Dist> {
        Ok(if node == ROOT { self.root.clone() } else { self.below.clone() })
    }
    fn greedy(&mut self, node: NodeId) -> Result<TokenId> {
        Ok(if node == ROOT { self.root.argmax() } else { self.below.argmax() })
    }
}

/// How one child is drafted.
#[derive(Clone)]
enum Kid {
    /// Family 1: an independent draw from `q`.
    Iid(Arc<Dist>),
    /// Family 2: a draw from `q` with the earlier without-replacement siblings removed.
    Wor(Arc<Dist>),
    /// Family 3: a fixed token.
    Det(TokenId),
    /// Family 3: a token the drafter drew from some distribution of its own, proposed as a
    /// deterministic candidate (exact whatever chose it, as long as it is not the verifier's coin).
    DetDrawn(Arc<Dist>),
}

/// What the acceptance rate must be.
#[derive(Clone, Copy, Debug)]
enum Accept {
    /// Not checked.
    Any,
    /// Exactly this rate in every trial (0 or 1).
    Exactly(f64),
    /// This rate in expectation (binomial test).
    Rate(f64),
}

struct Config {
    group: &'static str,
    name: String,
    p: Dist,
    kids: Vec<Kid>,
    accept: Accept,
}

// ---------------------------------------------------------------------------------------------
// Synthetic distributions.

/// Random weights `exp(sharp · g)`, g roughly standard normal, from the auxiliary stream.
fn rand_dist(vocab: usize, seed: u64, sharp: f64) -> Dist {
    let mut rng = StreamRng::new(seed, Stream::Aux);
    let w: Vec<f32> = (0..vocab)
        .map(|_| {
            let g: f64 = (0..4).map(|_| rng.uniform()).sum::<f64>() - 2.0;
            (sharp * g * 3f64.sqrt()).exp() as f32
        })
        .collect();
    Dist::from_weights(w).unwrap()
}

/// Keep only the tokens `keep` allows.
fn restrict(d: &Dist, keep: impl Fn(usize) -> bool) -> Dist {
    let w: Vec<f32> = d.probs().iter().enumerate().map(|(i, &x)| if keep(i) { x } else { 0.0 }).collect();
    Dist::from_weights(w).unwrap()
}

/// Tokens by descending probability (ties by id).
fn ranked(d: &Dist) -> Vec<TokenId> {
    let mut idx: Vec<TokenId> = (0..d.len() as TokenId).collect();
    idx.sort_by(|&a, &b| d.prob(b).total_cmp(&d.prob(a)).then(a.cmp(&b)));
    idx
}

/// Top-k truncation.
fn top_k(d: &Dist, k: usize) -> Dist {
    let keep: Vec<TokenId> = ranked(d).into_iter().take(k).collect();
    restrict(d, |i| keep.contains(&(i as TokenId)))
}

/// Nucleus truncation: the smallest prefix by probability with mass ≥ `top_p`.
fn top_p(d: &Dist, top_p: f64) -> Dist {
    let mut keep = Vec::new();
    let mut acc = 0.0;
    for t in ranked(d) {
        keep.push(t);
        acc += d.prob(t) as f64;
        if acc >= top_p {
            break;
        }
    }
    restrict(d, |i| keep.contains(&(i as TokenId)))
}

fn arc(d: &Dist) -> Arc<Dist> {
    Arc::new(d.clone())
}

/// Σ min(p, q): the acceptance rate of one sampled child.
fn overlap(p: &Dist, q: &Dist) -> f64 {
    p.probs().iter().zip(q.probs()).map(|(&a, &b)| a.min(b) as f64).sum()
}

/// Target mass covered by a set of deterministic candidates (duplicates count once).
fn covered(p: &Dist, tokens: &[TokenId]) -> f64 {
    let mut seen = Vec::new();
    let mut mass = 0.0;
    for &t in tokens {
        if !seen.contains(&t) {
            seen.push(t);
            mass += p.prob(t) as f64;
        }
    }
    mass
}

// ---------------------------------------------------------------------------------------------
// The configurations.

fn configs() -> Vec<Config> {
    let mut out = Vec::new();
    let mut add = |group: &'static str, name: &str, p: Dist, kids: Vec<Kid>, accept: Accept| {
        out.push(Config { group, name: name.to_string(), p, kids, accept })
    };

    // q = p: a single sampled child (or the first of several) is always accepted.
    let p = rand_dist(8, 1, 1.0);
    add("same", "q=p iid x1 V8", p.clone(), vec![Kid::Iid(arc(&p))], Accept::Exactly(1.0));
    let p = rand_dist(16, 2, 1.5);
    add("same", "q=p wor x1 V16", p.clone(), vec![Kid::Wor(arc(&p))], Accept::Exactly(1.0));
    let p = rand_dist(12, 3, 1.0);
    add("same", "q=p iid x3 V12", p.clone(), vec![Kid::Iid(arc(&p)); 3], Accept::Exactly(1.0));
    let p = top_k(&rand_dist(24, 4, 1.0), 6);
    add("same", "q=p top-k6 wor x4 V24", p.clone(), vec![Kid::Wor(arc(&p)); 4], Accept::Exactly(1.0));

    // Disjoint supports: nothing is ever accepted and the output is still p.
    let base = rand_dist(16, 5, 1.0);
    let p = restrict(&base, |i| i % 2 == 0);
    let q = arc(&restrict(&rand_dist(16, 6, 1.0), |i| i % 2 == 1));
    add("disjoint", "disjoint iid x1 V16", p.clone(), vec![Kid::Iid(q.clone())], Accept::Exactly(0.0));
    add("disjoint", "disjoint wor x3 V16", p.clone(), vec![Kid::Wor(q.clone()); 3], Accept::Exactly(0.0));
    add(
        "disjoint",
        "disjoint det x3 V16",
        p.clone(),
        vec![Kid::Det(1), Kid::Det(7), Kid::Det(15)],
        Accept::Exactly(0.0),
    );
    add(
        "disjoint",
        "disjoint mixed x5 V16",
        p,
        vec![Kid::Det(3), Kid::Iid(q.clone()), Kid::Wor(q.clone()), Kid::Wor(q), Kid::Det(9)],
        Accept::Exactly(0.0),
    );

    // One-hot targets: the output is always that token; one-hot drafts.
    let p = Dist::point_mass(5, 8).unwrap();
    let q = arc(&rand_dist(8, 7, 1.0));
    add("onehot", "one-hot p iid x2 V8", p.clone(), vec![Kid::Iid(q.clone()); 2], Accept::Any);
    add("onehot", "one-hot p wor x3 V8", p.clone(), vec![Kid::Wor(q); 3], Accept::Any);
    add("onehot", "one-hot p det x2 V8", p, vec![Kid::Det(2), Kid::Det(5)], Accept::Exactly(1.0));
    let p = rand_dist(12, 8, 1.0);
    let q = Dist::point_mass(3, 12).unwrap();
    let rate = overlap(&p, &q);
    add("onehot", "one-hot q iid x1 V12", p.clone(), vec![Kid::Iid(arc(&q))], Accept::Rate(rate));
    add("onehot", "one-hot q wor x2 V12", p, vec![Kid::Wor(arc(&q)); 2], Accept::Rate(rate));

    // Family 1: i.i.d. children.
    let p = rand_dist(8, 10, 1.0);
    let q = rand_dist(8, 11, 1.0);
    let rate = overlap(&p, &q);
    add("iid", "iid x1 V8", p, vec![Kid::Iid(arc(&q))], Accept::Rate(rate));
    let p = rand_dist(16, 12, 1.2);
    let q = arc(&rand_dist(16, 13, 1.2));
    add("iid", "iid x2 V16", p, vec![Kid::Iid(q); 2], Accept::Any);
    let p = rand_dist(32, 14, 1.5);
    let q = arc(&rand_dist(32, 15, 1.5));
    add("iid", "iid x5 V32", p, vec![Kid::Iid(q); 5], Accept::Any);
    // Almost all mass of q on two tokens: five children are mostly duplicates.
    let p = rand_dist(8, 16, 1.0);
    let q = arc(&restrict(&rand_dist(8, 17, 1.0), |i| i == 1 || i == 6));
    add("iid", "iid dup x5 (|supp q|=2) V8", p, vec![Kid::Iid(q); 5], Accept::Any);
    // Siblings drawn from different q's.
    let p = rand_dist(12, 18, 1.0);
    let q1 = arc(&rand_dist(12, 19, 1.0));
    let q2 = arc(&rand_dist(12, 20, 2.0));
    add(
        "iid",
        "iid x3 different q V12",
        p,
        vec![Kid::Iid(q1.clone()), Kid::Iid(q2), Kid::Iid(q1)],
        Accept::Any,
    );

    // Family 2: without replacement.
    let p = rand_dist(8, 21, 1.0);
    let q = rand_dist(8, 22, 1.0);
    let rate = overlap(&p, &q);
    add("wor", "wor x1 V8", p, vec![Kid::Wor(arc(&q))], Accept::Rate(rate));
    let p = rand_dist(8, 23, 1.0);
    let q = arc(&rand_dist(8, 24, 2.0));
    add("wor", "wor x2 peaky q V8", p, vec![Kid::Wor(q); 2], Accept::Any);
    let p = rand_dist(16, 25, 1.5);
    let q = arc(&rand_dist(16, 26, 1.5));
    add("wor", "wor x3 V16", p, vec![Kid::Wor(q); 3], Accept::Any);
    let p = rand_dist(12, 27, 1.0);
    let q = arc(&rand_dist(12, 28, 3.0));
    add("wor", "wor x5 peaky q V12", p, vec![Kid::Wor(q); 5], Accept::Any);
    // q's support (3 tokens) runs out before five children: the drafter stops at three.
    let p = rand_dist(8, 29, 1.0);
    let q = arc(&top_k(&rand_dist(8, 30, 1.0), 3));
    add("wor", "wor x5 exhausts |supp q|=3 V8", p, vec![Kid::Wor(q); 5], Accept::Any);

    // Family 3: deterministic candidates.
    let p = rand_dist(8, 31, 1.0);
    let q = rand_dist(8, 32, 1.0);
    let t = ranked(&q)[0];
    add("det", "det top-1 of q V8", p.clone(), vec![Kid::Det(t)], Accept::Rate(covered(&p, &[t])));
    let p = rand_dist(16, 33, 1.5);
    let top3: Vec<TokenId> = ranked(&rand_dist(16, 34, 1.5)).into_iter().take(3).collect();
    add(
        "det",
        "det top-3 of q V16",
        p.clone(),
        top3.iter().map(|&t| Kid::Det(t)).collect(),
        Accept::Rate(covered(&p, &top3)),
    );
    let p = rand_dist(32, 35, 2.0);
    let fixed = [31, 0, 17, 4, 22];
    add(
        "det",
        "det x5 fixed V32",
        p.clone(),
        fixed.iter().map(|&t| Kid::Det(t)).collect(),
        Accept::Rate(covered(&p, &fixed)),
    );
    let p = rand_dist(8, 36, 1.0);
    let a = p.argmax();
    let b = (a + 3) % 8;
    add(
        "det",
        "det duplicates [a,a,b] V8",
        p.clone(),
        vec![Kid::Det(a), Kid::Det(a), Kid::Det(b)],
        Accept::Rate(covered(&p, &[a, a, b])),
    );
    let p = rand_dist(12, 37, 1.0);
    let r = arc(&rand_dist(12, 38, 2.0));
    add("det", "det x4 drawn from r V12", p, vec![Kid::DetDrawn(r); 4], Accept::Any);

    // Truncated (top-k / top-p style zeros) targets and drafts.
    let p = top_k(&rand_dist(16, 39, 1.0), 5);
    let q = arc(&top_p(&rand_dist(16, 40, 1.0), 0.8));
    add("trunc", "p top-k5, q top-p0.8, iid x3 V16", p, vec![Kid::Iid(q); 3], Accept::Any);
    let p = top_p(&rand_dist(24, 41, 1.0), 0.9);
    let q = arc(&top_k(&rand_dist(24, 42, 1.0), 4));
    add("trunc", "p top-p0.9, q top-k4, wor x3 V24", p, vec![Kid::Wor(q); 3], Accept::Any);
    // Candidates: the top token of a top-k3 draft and the second token of the target (family 3
    // may look at anything but the verifier's coins).
    let p = top_k(&rand_dist(12, 43, 1.0), 3);
    let q = top_k(&rand_dist(12, 44, 1.0), 3);
    let cands = [ranked(&q)[0], ranked(&p)[1]];
    add(
        "trunc",
        "p top-k3, det [top q top-k3, 2nd of p] V12",
        p.clone(),
        cands.iter().map(|&t| Kid::Det(t)).collect(),
        Accept::Rate(covered(&p, &cands)),
    );
    // p and q truncated to partially overlapping supports.
    let base = rand_dist(16, 45, 1.0);
    let p = restrict(&base, |i| i < 10);
    let q = restrict(&rand_dist(16, 46, 1.0), |i| i >= 6);
    let rate = overlap(&p, &q);
    add("trunc", "p [0,10), q [6,16), wor x1 V16", p.clone(), vec![Kid::Wor(arc(&q))], Accept::Rate(rate));
    add("trunc", "p [0,10), q [6,16), wor x4 V16", p, vec![Kid::Wor(arc(&q)); 4], Accept::Any);

    // Mixtures of deterministic and sampled siblings.
    let p = rand_dist(16, 47, 1.0);
    let q = rand_dist(16, 48, 1.0);
    let t = ranked(&q)[0];
    let q = arc(&q);
    add(
        "mixed",
        "mix [det top-1 q, wor, wor] V16",
        p,
        vec![Kid::Det(t), Kid::Wor(q.clone()), Kid::Wor(q)],
        Accept::Any,
    );
    let p = rand_dist(12, 49, 1.5);
    let q = arc(&rand_dist(12, 50, 1.5));
    let q2 = arc(&rand_dist(12, 51, 1.0));
    add(
        "mixed",
        "mix [wor, iid q2, det, wor] V12",
        p,
        vec![Kid::Wor(q.clone()), Kid::Iid(q2), Kid::Det(4), Kid::Wor(q)],
        Accept::Any,
    );
    let p = rand_dist(8, 52, 1.0);
    let q = arc(&rand_dist(8, 53, 1.0));
    let q2 = arc(&rand_dist(8, 54, 2.0));
    add(
        "mixed",
        "mix [iid q, iid q2, det, det] V8",
        p,
        vec![Kid::Iid(q), Kid::Iid(q2), Kid::Det(0), Kid::Det(7)],
        Accept::Any,
    );
    let p = top_k(&rand_dist(32, 55, 1.5), 12);
    let q = arc(&top_p(&rand_dist(32, 56, 1.5), 0.95));
    let q2 = arc(&rand_dist(32, 57, 1.0));
    let t = ranked(&q)[0];
    add(
        "mixed",
        "mix truncated [wor, det dup, wor, wor, iid] V32",
        p,
        vec![Kid::Wor(q.clone()), Kid::Det(t), Kid::Wor(q.clone()), Kid::Wor(q), Kid::Iid(q2)],
        Accept::Any,
    );
    // A deterministic candidate that a sampled sibling is likely to duplicate.
    let p = rand_dist(8, 58, 1.0);
    let q = rand_dist(8, 59, 2.5);
    let t = q.argmax();
    let q = arc(&q);
    add(
        "mixed",
        "mix dup [det a, iid q (q(a) large), det drawn] V8",
        p,
        vec![Kid::Det(t), Kid::Iid(q.clone()), Kid::DetDrawn(q)],
        Accept::Any,
    );
    out
}

/// Number of statistical tests in the file (one chi-square per configuration plus one binomial
/// test per configuration with a known acceptance rate): the Bonferroni divisor.
fn number_of_tests(all: &[Config]) -> usize {
    all.len() + all.iter().filter(|c| matches!(c.accept, Accept::Rate(_))).count()
}

// ---------------------------------------------------------------------------------------------
// Running one configuration.

/// Draft the children of one trial, exactly as each family assumes.
fn draft(kids: &[Kid], rng: &mut StreamRng) -> TokenTree {
    let mut tree = TokenTree::new(0);
    // The without-replacement draft distribution left for the next WOR child.
    let mut wor_left: Option<Dist> = None;
    let mut wor_exhausted = false;
    for kid in kids {
        match kid {
            Kid::Iid(q) => {
                let x = q.sample(rng);
                tree.add(ROOT, x, Draw::Iid { q: q.clone() }, q.prob(x)).unwrap();
            }
            Kid::Wor(q) => {
                if wor_exhausted {
                    continue;
                }
                let cur = wor_left.take().unwrap_or_else(|| (**q).clone());
                let x = cur.sample(rng);
                tree.add(ROOT, x, Draw::WithoutReplacement { q: q.clone() }, q.prob(x)).unwrap();
                match cur.without(x) {
                    Some(next) => wor_left = Some(next),
                    None => wor_exhausted = true,
                }
            }
            Kid::Det(t) => {
                tree.add(ROOT, *t, Draw::Deterministic, 1.0).unwrap();
            }
            Kid::DetDrawn(r) => {
                let x = r.sample(rng);
                tree.add(ROOT, x, Draw::Deterministic, 1.0).unwrap();
            }
        }
    }
    tree
}

fn run_config(index: usize, c: &Config, alpha: f64) -> Vec<String> {
    let vocab = c.p.len();
    let seed = 0x5eed_0000 + index as u64;
    let mut drng = StreamRng::new(seed, Stream::Draft);
    let mut vrng = StreamRng::new(seed, Stream::Verify);
    let mut target = Target { root: c.p.clone(), below: Dist::from_weights(vec![1.0; vocab]).unwrap() };
    let mut counts = vec![0u64; vocab];
    let mut accepted = 0u64;
    for _ in 0..TRIALS {
        let tree = draft(&c.kids, &mut drng);
        let out = verify(&tree, &mut target, Choice::Sampled(&mut vrng)).unwrap();
        // Structure of the outcome of a one-level tree.
        assert!(out.accepted.len() <= 1, "{}: {out:?}", c.name);
        assert_eq!(out.tokens.len(), out.accepted.len() + 1, "{}", c.name);
        if let Some(&a) = out.accepted.first() {
            assert_eq!(tree.node(a).parent, Some(ROOT));
            assert_eq!(out.tokens[0], tree.node(a).token);
            accepted += 1;
        }
        if tree.drafted() > 0 {
            let r = out.depths[0];
            assert_eq!((r.depth, r.candidates), (1, tree.drafted()));
            assert!(r.tried >= 1 && r.tried <= r.candidates);
            assert_eq!(r.accepted, !out.accepted.is_empty());
        }
        counts[out.tokens[0] as usize] += 1;
    }
    let mut failures = Vec::new();
    let probs: Vec<f64> = c.p.probs().iter().map(|&x| x as f64).collect();
    match chi_square(&counts, &probs) {
        Ok(g) => {
            eprintln!(
                "[{:>2}] {:<48} chi2 {:>8.2} df {:>2} p {:.3e}  accept {:.4}",
                index,
                c.name,
                g.stat,
                g.df,
                g.p_value,
                accepted as f64 / TRIALS as f64
            );
            if g.p_value <= alpha {
                failures.push(format!(
                    "{}: emitted token does not follow p: chi2 {:.1}, df {}, p-value {:.3e} ≤ {alpha:.1e}; worst cells (token, observed, expected) {:?}",
                    c.name, g.stat, g.df, g.p_value, g.worst
                ));
            }
        }
        Err(e) => failures.push(format!("{}: {e}", c.name)),
    }
    match c.accept {
        Accept::Any => {}
        Accept::Exactly(rate) => {
            let want = (rate * TRIALS as f64).round() as u64;
            if accepted != want {
                failures
                    .push(format!("{}: acceptance must be exactly {rate}, got {accepted}/{TRIALS}", c.name));
            }
        }
        Accept::Rate(rate) => {
            let pv = binomial_p_value(accepted, TRIALS, rate);
            if pv <= alpha {
                failures.push(format!(
                    "{}: acceptance {}/{TRIALS} = {:.4}, expected {rate:.4} (p-value {pv:.3e})",
                    c.name,
                    accepted,
                    accepted as f64 / TRIALS as f64
                ));
            }
        }
    }
    failures
}

fn run_group(group: &str) {
    let all = configs();
    let alpha = FAMILY_ALPHA / number_of_tests(&all) as f64;
    let mut ran = 0;
    let mut failures = Vec::new();
    for (i, c) in all.iter().enumerate().filter(|(_, c)| c.group == group) {
        assert!((8..=32).contains(&c.p.len()));
        assert!(c.kids.len() <= 5);
        failures.extend(run_config(i, c, alpha));
        ran += 1;
    }
    assert!(ran > 0, "no configuration in group {group}");
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn q_equals_p_always_accepts() {
    run_group("same");
}

#[test]
fn disjoint_supports_never_accept_and_emit_p() {
    run_group("disjoint");
}

#[test]
fn one_hot_targets_and_drafts() {
    run_group("onehot");
}

#[test]
fn iid_children() {
    run_group("iid");
}

#[test]
fn without_replacement_children() {
    run_group("wor");
}

#[test]
fn deterministic_candidates() {
    run_group("det");
}

#[test]
fn truncated_targets_and_drafts() {
    run_group("trunc");
}

#[test]
fn mixed_families() {
    run_group("mixed");
}

#[test]
fn every_configuration_belongs_to_a_test() {
    let groups = ["same", "disjoint", "onehot", "iid", "wor", "det", "trunc", "mixed"];
    let all = configs();
    for c in &all {
        assert!(groups.contains(&c.group), "{} is in no test", c.name);
    }
    assert!(all.len() >= 30);
}
