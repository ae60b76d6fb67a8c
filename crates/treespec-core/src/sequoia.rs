//! Sequoia's optimal fixed tree shape (arXiv 2402.12374, ALGORITHMS.md §3 "Fixed trees").
//!
//! Model: every node's children are drawn without replacement from the draft (greedy: its top
//! tokens), and the k-th drawn child is the one the verifier accepts with a *positional*
//! probability `P[k]` that does not depend on where the node sits. Under that model a tree's
//! expected emitted tokens per step (τ, bonus included) is `Σ_v Π_{i ∈ path(v)} P[rank(i)]`, the
//! root contributing 1: a node is reached exactly when every edge on its path was the accepted
//! child, and the bonus token follows the deepest accepted node.
//!
//! Children of one node must have the contiguous ranks 1..c: the verifier rebuilds the
//! without-replacement sequence from the draws in order, so a drawn child can never be skipped.
//! That makes the search space "ordered trees with at most B children per node", and the best
//! tree of `m` nodes decomposes as the best root with `b − 1` children over `m − s` nodes plus the
//! best subtree of `s` nodes hung as the b-th child, worth `P[b]` times its own value:
//!
//! ```text
//! G[m][b] = max_s G[m − s][b − 1] + P[b] · F[s]        G[1][0] = 1
//! F[m]    = max_b G[m][b]
//! ```
//!
//! With a depth bound the tables get a height index and the hung subtree must be one level
//! shorter: `G_d[m][b] = max_s G_d[m − s][b − 1] + P[b] · F_{d−1}[s]`, `F_0[1] = 1`.
//! Sizes are exact inside the recursion; the answer is the best over sizes ≤ the budget, a
//! smaller tree winning ties (extra nodes cost verify compute and buy nothing).

use crate::{Error, Result};

/// Relative improvement a larger tree must show to beat a smaller one (float noise guard).
const TIE_EPS: f64 = 1e-12;

/// Check a positional acceptance vector: non-empty, every entry a probability, total ≤ 1 (the
/// events "the k-th child is the accepted one" are disjoint).
pub fn validate_acceptance(acceptance: &[f32]) -> Result<()> {
    if acceptance.is_empty() {
        return Err(Error::Invalid(
            "the positional acceptance vector is empty; measure it with `treespec calibrate`".into(),
        ));
    }
    let mut total = 0f64;
    for (k, &p) in acceptance.iter().enumerate() {
        if !p.is_finite() || !(0.0..=1.0).contains(&p) {
            return Err(Error::Invalid(format!(
                "acceptance P[{}] = {p} is not a probability in [0, 1]",
                k + 1
            )));
        }
        total += p as f64;
    }
    // A little slack for vectors written out as rounded decimals.
    if total > 1.0 + 1e-4 {
        return Err(Error::Invalid(format!(
            "acceptance probabilities sum to {total:.6} > 1; P[k] must be the probability that the \
             k-th child is the accepted one"
        )));
    }
    Ok(())
}

/// The shape of a draft tree: node 0 is the root; every other node has a parent before it and a
/// 1-based rank among its siblings (its drawing order). Nodes are in breadth-first order, children
/// of each node in rank order, so a drafter can fill it one depth (one draft forward) at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeShape {
    parents: Vec<Option<usize>>,
    ranks: Vec<usize>,
    depths: Vec<usize>,
    children: Vec<Vec<usize>>,
}

impl TreeShape {
    /// The root alone (plain decoding).
    pub fn root_only() -> Self {
        Self { parents: vec![None], ranks: vec![0], depths: vec![0], children: vec![Vec::new()] }
    }

    /// A shape from parent indices (`parents[0] = None`, each other parent before its child);
    /// ranks are the order of appearance among siblings.
    pub fn from_parents(parents: &[Option<usize>]) -> Result<Self> {
        if parents.first() != Some(&None) {
            return Err(Error::Invalid("a tree shape needs node 0 as its root (parent None)".into()));
        }
        let mut shape = Self::root_only();
        for (i, &p) in parents.iter().enumerate().skip(1) {
            let p = p.ok_or_else(|| Error::Invalid(format!("node {i} has no parent; only the root may")))?;
            if p >= i {
                return Err(Error::BadParent { node: i, parent: p });
            }
            shape.push(p);
        }
        Ok(shape)
    }

    fn push(&mut self, parent: usize) -> usize {
        let id = self.parents.len();
        self.parents.push(Some(parent));
        self.ranks.push(self.children[parent].len() + 1);
        self.depths.push(self.depths[parent] + 1);
        self.children.push(Vec::new());
        self.children[parent].push(id);
        id
    }

    /// Nodes including the root.
    pub fn len(&self) -> usize {
        self.parents.len()
    }

    /// Never true: the root is always there.
    pub fn is_empty(&self) -> bool {
        self.parents.is_empty()
    }

    /// Drafted nodes (excluding the root).
    pub fn drafted(&self) -> usize {
        self.parents.len() - 1
    }

    /// Parent of node `i` (`None` for the root).
    pub fn parent(&self, i: usize) -> Option<usize> {
        self.parents[i]
    }

    /// All parents in node order.
    pub fn parents(&self) -> &[Option<usize>] {
        &self.parents
    }

    /// 1-based rank of node `i` among its siblings (0 for the root).
    pub fn rank(&self, i: usize) -> usize {
        self.ranks[i]
    }

    /// Depth of node `i` (root 0).
    pub fn depth(&self, i: usize) -> usize {
        self.depths[i]
    }

    /// Children of node `i` in rank order.
    pub fn children(&self, i: usize) -> &[usize] {
        &self.children[i]
    }

    /// Depth of the deepest node.
    pub fn max_depth(&self) -> usize {
        self.depths.iter().copied().max().unwrap_or(0)
    }

    /// Node ids at `depth`, in order.
    pub fn level(&self, depth: usize) -> Vec<usize> {
        (0..self.len()).filter(|&i| self.depths[i] == depth).collect()
    }

    /// Expected τ (emitted tokens per step, bonus included) under the positional model:
    /// `Σ_v Π_{i ∈ path(v)} P[rank(i)]`, ranks beyond `acceptance` counting 0.
    pub fn expected_tau(&self, acceptance: &[f32]) -> f64 {
        let mut reach = vec![0f64; self.len()];
        reach[0] = 1.0;
        for i in 1..self.len() {
            let p = acceptance.get(self.ranks[i] - 1).copied().unwrap_or(0.0) as f64;
            reach[i] = reach[self.parents[i].expect("non-root")] * p;
        }
        reach.iter().sum()
    }
}

/// A DP-optimal tree and its expected τ.
#[derive(Debug, Clone, PartialEq)]
pub struct OptimalTree {
    /// The shape.
    pub shape: TreeShape,
    /// Its expected emitted tokens per step (bonus included) under the positional model.
    pub expected_tau: f64,
}

/// DP tables for trees of exact size `1..=n` and one height bound (or none).
struct Level {
    /// `f[m]`: best value of a tree of exactly `m` nodes (−∞ if none fits the bound).
    f: Vec<f64>,
    /// Argmax root child count for `f[m]`.
    best_b: Vec<usize>,
    /// `choice[m * (w + 1) + b]`: size of the b-th child's subtree in the best `G[m][b]`.
    choice: Vec<u32>,
}

/// Fill one level. `child` gives the best subtree values the hung children may use (`None`: this
/// level itself, the unbounded case, which only ever looks at smaller sizes).
fn fill_level(p: &[f64], n: usize, child: Option<&[f64]>) -> Level {
    let w = p.len();
    let stride = w + 1;
    let mut g = vec![f64::NEG_INFINITY; (n + 1) * stride];
    let mut choice = vec![0u32; (n + 1) * stride];
    let mut f = vec![f64::NEG_INFINITY; n + 1];
    let mut best_b = vec![0usize; n + 1];
    for m in 1..=n {
        if m == 1 {
            g[stride] = 1.0;
        }
        for b in 1..=w.min(m - 1) {
            let pb = p[b - 1];
            let mut best = f64::NEG_INFINITY;
            let mut arg = 0u32;
            // The other b − 1 children and the root need at least b nodes.
            for s in 1..=(m - b) {
                let rest = g[(m - s) * stride + b - 1];
                let sub = match child {
                    Some(c) => c[s],
                    None => f[s],
                };
                if rest == f64::NEG_INFINITY || sub == f64::NEG_INFINITY {
                    continue;
                }
                let v = rest + pb * sub;
                if v > best {
                    best = v;
                    arg = s as u32;
                }
            }
            g[m * stride + b] = best;
            choice[m * stride + b] = arg;
        }
        for b in 0..=w.min(m - 1) {
            if g[m * stride + b] > f[m] {
                f[m] = g[m * stride + b];
                best_b[m] = b;
            }
        }
    }
    Level { f, best_b, choice }
}

/// Largest budget [`optimal_tree`] builds tables for (they grow as budget² · width).
pub const MAX_TABLE_BUDGET: usize = 1 << 14;

/// The best tree of at most `budget` drafted nodes (the root not counted) whose drafted nodes
/// sit at depth ≤ `max_depth` (`None`: unbounded), for the positional acceptance vector
/// `acceptance` (`P[1..B]`; at most B children per node).
///
/// Cost: O(n² · B) unbounded, O(n² · B · d) with a depth bound, for n = budget + 1.
pub fn optimal_tree(acceptance: &[f32], budget: usize, max_depth: Option<usize>) -> Result<OptimalTree> {
    validate_acceptance(acceptance)?;
    if budget > MAX_TABLE_BUDGET {
        return Err(Error::Invalid(format!(
            "sequoia budget {budget} is too large (the tables hold at most {MAX_TABLE_BUDGET} nodes)"
        )));
    }
    let p: Vec<f64> = acceptance.iter().map(|&x| x as f64).collect();
    let n = budget + 1;
    let w = p.len();
    // A depth bound at or beyond the budget cannot bind: use the cheaper unbounded tables.
    let depth = max_depth.filter(|&d| d < budget);
    let levels: Vec<Level> = match depth {
        None => vec![fill_level(&p, n, None)],
        Some(d) => {
            let mut levels = Vec::with_capacity(d + 1);
            let mut f0 = vec![f64::NEG_INFINITY; n + 1];
            f0[1] = 1.0;
            levels.push(Level { f: f0, best_b: vec![0; n + 1], choice: vec![0; (n + 1) * (w + 1)] });
            for _ in 1..=d {
                let below = levels.last().expect("level 0 exists").f.clone();
                levels.push(fill_level(&p, n, Some(&below)));
            }
            levels
        }
    };
    let top = levels.len() - 1;
    // Best size ≤ n; a larger tree must be strictly (beyond float noise) better.
    let f = &levels[top].f;
    let mut size = 1;
    for m in 2..=n {
        if f[m] > f[size] + TIE_EPS * f[size].abs().max(1.0) {
            size = m;
        }
    }
    // Rebuild: (parent in the output, rank, level, size) in breadth-first order.
    let child_level = |l: usize| if depth.is_some() { l - 1 } else { 0 };
    let mut shape = TreeShape::root_only();
    let mut queue = std::collections::VecDeque::from([(0usize, top, size)]);
    while let Some((node, level, m)) = queue.pop_front() {
        let lv = &levels[level];
        let mut b = lv.best_b[m];
        let mut left = m;
        let mut subs = Vec::with_capacity(b);
        while b > 0 {
            let s = lv.choice[left * (w + 1) + b] as usize;
            subs.push(s);
            left -= s;
            b -= 1;
        }
        debug_assert_eq!(left, 1);
        for &s in subs.iter().rev() {
            let id = shape.push(node);
            queue.push_back((id, child_level(level), s));
        }
    }
    let expected_tau = shape.expected_tau(acceptance);
    debug_assert!((expected_tau - f[size]).abs() < 1e-9 * f[size].max(1.0));
    Ok(OptimalTree { shape, expected_tau })
}

/// The optimal expected τ for every budget `0..=max_budget` (index = budget), e.g. to pick a tree
/// size against a measured target-forward cost curve, as Sequoia's hardware-aware selection does.
pub fn optimal_tau_by_budget(
    acceptance: &[f32],
    max_budget: usize,
    max_depth: Option<usize>,
) -> Result<Vec<f64>> {
    validate_acceptance(acceptance)?;
    let p: Vec<f64> = acceptance.iter().map(|&x| x as f64).collect();
    let n = max_budget + 1;
    let f = match max_depth.filter(|&d| d < max_budget) {
        None => fill_level(&p, n, None).f,
        Some(d) => {
            let mut f = vec![f64::NEG_INFINITY; n + 1];
            f[1] = 1.0;
            for _ in 1..=d {
                f = fill_level(&p, n, Some(&f)).f;
            }
            f
        }
    };
    // Best over sizes ≤ budget + 1.
    let mut out = Vec::with_capacity(n);
    let mut best = f64::NEG_INFINITY;
    for &v in &f[1..] {
        best = best.max(v);
        out.push(best);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every ordered tree with exactly `n` nodes, ≤ `w` children per node, height ≤ `d`, as
    /// parent vectors in preorder.
    fn all_trees(n: usize, w: usize, d: usize) -> Vec<Vec<Option<usize>>> {
        // Forests of ordered trees: a tree = root + ordered forest of its children.
        fn forests(n: usize, w: usize, d: usize, max_roots: usize) -> Vec<Vec<Vec<Option<usize>>>> {
            // Each forest is a list of subtrees (parent vectors relative to their own root).
            if n == 0 {
                return vec![vec![]];
            }
            if max_roots == 0 {
                return vec![];
            }
            let mut out = Vec::new();
            for first in 1..=n {
                for t in trees(first, w, d) {
                    for rest in forests(n - first, w, d, max_roots - 1) {
                        let mut f = vec![t.clone()];
                        f.extend(rest);
                        out.push(f);
                    }
                }
            }
            out
        }
        fn trees(n: usize, w: usize, d: usize) -> Vec<Vec<Option<usize>>> {
            if n == 1 {
                return vec![vec![None]];
            }
            if d == 0 {
                return vec![];
            }
            forests(n - 1, w, d - 1, w)
                .into_iter()
                .map(|forest| {
                    let mut parents = vec![None];
                    for sub in forest {
                        let base = parents.len();
                        for p in sub {
                            parents.push(Some(p.map_or(0, |q| q + base)));
                        }
                    }
                    parents
                })
                .collect()
        }
        trees(n, w, d)
    }

    fn tau(parents: &[Option<usize>], p: &[f32]) -> f64 {
        TreeShape::from_parents(parents).unwrap().expected_tau(p)
    }

    fn brute(p: &[f32], budget: usize, depth: Option<usize>) -> f64 {
        let d = depth.unwrap_or(budget);
        (1..=budget + 1)
            .flat_map(|n| all_trees(n, p.len(), d))
            .map(|t| tau(&t, p))
            .fold(f64::NEG_INFINITY, f64::max)
    }

    fn vectors() -> Vec<Vec<f32>> {
        vec![
            vec![0.7],
            vec![0.5, 0.3],
            vec![0.6, 0.2, 0.1],
            vec![0.3, 0.25, 0.2, 0.15],
            vec![0.9, 0.05],
            vec![0.4, 0.0, 0.3],
            vec![0.1, 0.1, 0.1, 0.1, 0.1],
        ]
    }

    #[test]
    fn enumeration_counts_ordered_trees() {
        // Catalan numbers: ordered trees with n nodes = C(n − 1).
        let counts: Vec<usize> = (1..=7).map(|n| all_trees(n, n, n).len()).collect();
        assert_eq!(counts, vec![1, 1, 2, 5, 14, 42, 132]);
    }

    #[test]
    fn dp_equals_brute_force_for_small_trees() {
        for p in vectors() {
            for budget in 0..=6 {
                for depth in [None, Some(1), Some(2), Some(3)] {
                    let opt = optimal_tree(&p, budget, depth).unwrap();
                    let want = brute(&p, budget, depth);
                    assert!(
                        (opt.expected_tau - want).abs() < 1e-9,
                        "P {p:?} budget {budget} depth {depth:?}: dp {} brute {want}",
                        opt.expected_tau
                    );
                    // The shape really is that good and respects the limits.
                    assert!((opt.shape.expected_tau(&p) - want).abs() < 1e-9);
                    assert!(opt.shape.drafted() <= budget);
                    assert!(opt.shape.max_depth() <= depth.unwrap_or(usize::MAX));
                    for i in 1..opt.shape.len() {
                        assert!(opt.shape.parent(i).unwrap() < i);
                        assert!(opt.shape.rank(i) <= p.len());
                        assert!(opt.shape.depth(i) >= opt.shape.depth(i - 1), "breadth-first order");
                    }
                }
            }
        }
    }

    #[test]
    fn monotone_in_budget_and_table_agrees() {
        for p in vectors() {
            for depth in [None, Some(2), Some(4)] {
                let table = optimal_tau_by_budget(&p, 40, depth).unwrap();
                let mut last = 0.0;
                for (budget, &t) in table.iter().enumerate() {
                    let opt = optimal_tree(&p, budget, depth).unwrap();
                    assert!((opt.expected_tau - t).abs() < 1e-9, "{p:?} {budget} {depth:?}");
                    assert!(t >= last - 1e-12, "τ must not drop with budget");
                    last = t;
                }
            }
        }
    }

    #[test]
    fn single_positive_rank_gives_a_chain() {
        for p0 in [0.3f32, 0.8, 0.99] {
            let p = [p0, 0.0, 0.0];
            let opt = optimal_tree(&p, 10, None).unwrap();
            assert_eq!(opt.shape.drafted(), 10);
            assert_eq!(opt.shape.max_depth(), 10);
            let want: f64 = (0..=10).map(|k| (p0 as f64).powi(k)).sum();
            assert!((opt.expected_tau - want).abs() < 1e-9);
            // A depth bound shortens the chain and never adds useless rank-2 nodes.
            let short = optimal_tree(&p, 10, Some(4)).unwrap();
            assert_eq!(short.shape.drafted(), 4);
        }
    }

    #[test]
    fn flat_acceptance_prefers_width() {
        // P = [0.5, 0.4]: a second child is worth more than a grandchild (0.4 > 0.25).
        let opt = optimal_tree(&[0.5, 0.4], 2, None).unwrap();
        assert_eq!(opt.shape.children(0).len(), 2);
        assert!((opt.expected_tau - 1.9).abs() < 1e-6);
    }

    #[test]
    fn bad_vectors_are_errors() {
        assert!(optimal_tree(&[], 4, None).is_err());
        assert!(optimal_tree(&[0.6, 0.6], 4, None).is_err());
        assert!(optimal_tree(&[-0.1], 4, None).is_err());
        assert!(optimal_tree(&[f32::NAN], 4, None).is_err());
        // A budget near usize::MAX once overflowed `budget + 1` and indexed out of bounds.
        assert!(optimal_tree(&[0.5], usize::MAX, None).is_err());
        assert!(optimal_tree(&[0.5], usize::MAX, Some(3)).is_err());
        assert!(validate_acceptance(&[0.5, 0.5]).is_ok());
    }

    #[test]
    fn zero_budget_or_depth_is_root_only() {
        let opt = optimal_tree(&[0.5], 0, None).unwrap();
        assert_eq!(opt.shape, TreeShape::root_only());
        assert_eq!(opt.expected_tau, 1.0);
        assert_eq!(optimal_tree(&[0.5], 8, Some(0)).unwrap().shape.drafted(), 0);
    }

    #[test]
    fn large_budget_is_fast_enough() {
        let p: Vec<f32> = (1..=16).map(|k| 0.5 / k as f32 / 3.5).collect();
        let t = std::time::Instant::now();
        let opt = optimal_tree(&p, 512, Some(12)).unwrap();
        assert_eq!(opt.shape.drafted(), 512);
        assert!(t.elapsed().as_secs_f64() < 10.0);
    }
}
