//! Property tests of the verify-batch layout ([`FlatTree`]) and of DAG unrolling ([`TokenDag`]),
//! each checked against an independent model built in the test from raw parent/edge lists.

use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::sample::Index;
use treespec_core::dag::TokenDag;
use treespec_core::flatten::FlatTree;
use treespec_core::tree::{Draw, TokenTree, ROOT};
use treespec_core::{Dist, TokenId};

// ---------------------------------------------------------------------------------------------
// Trees.

/// Random trees: node i's parent is any earlier node.
fn raw_tree() -> impl Strategy<Value = (Vec<TokenId>, Vec<Option<usize>>)> {
    (1usize..=60)
        .prop_flat_map(|n| {
            (proptest::collection::vec(0u32..64, n), proptest::collection::vec(any::<Index>(), n))
        })
        .prop_map(|(tokens, idx)| {
            let parents =
                (0..tokens.len()).map(|i| if i == 0 { None } else { Some(idx[i].index(i)) }).collect();
            (tokens, parents)
        })
}

/// Root paths computed from the raw parent list alone.
fn raw_paths(parents: &[Option<usize>]) -> Vec<Vec<usize>> {
    (0..parents.len())
        .map(|i| {
            let mut path = vec![i];
            let mut at = parents[i];
            while let Some(p) = at {
                path.push(p);
                at = parents[p];
            }
            path.reverse();
            path
        })
        .collect()
}

/// Every layout property of `flat` for `tree`, against the independent `paths` (root path of
/// each node). Pairwise attention checks cover all pairs up to `max_pairs_n` rows, else a band.
fn check_flat(
    tree: &TokenTree,
    paths: &[Vec<usize>],
    prefix_len: usize,
    max_pairs_n: usize,
) -> Result<(), TestCaseError> {
    let flat = FlatTree::new(tree, prefix_len);
    let n = tree.len();
    prop_assert_eq!(flat.len(), n);
    prop_assert!(!flat.is_empty());
    prop_assert_eq!(paths.len(), n);
    for (i, path) in paths.iter().enumerate() {
        let depth = path.len() - 1;
        prop_assert_eq!(flat.tokens[i], tree.node(i).token);
        prop_assert_eq!(flat.parents[i], tree.node(i).parent);
        prop_assert_eq!(flat.depths[i], depth);
        prop_assert_eq!(tree.node(i).depth, depth);
        prop_assert_eq!(flat.positions[i], prefix_len + depth);
        // The ancestor set is exactly the root path, root first, itself last.
        prop_assert_eq!(&flat.ancestors[i], path);
        prop_assert_eq!(&tree.path(i), path);
    }

    // attends(i, j) ⇔ j is on i's root path ⇔ the additive mask is 0 there; −inf otherwise.
    let mask = flat.additive_mask();
    prop_assert_eq!(mask.len(), n * n);
    let rows: Vec<usize> =
        if n <= max_pairs_n { (0..n).collect() } else { (0..n).step_by(n / max_pairs_n + 1).collect() };
    for &i in &rows {
        let anc: BTreeSet<usize> = paths[i].iter().copied().collect();
        for j in 0..n {
            let allowed = anc.contains(&j);
            prop_assert_eq!(flat.attends(i, j), allowed, "attends({}, {})", i, j);
            let m = mask[i * n + j];
            if allowed {
                prop_assert_eq!(m, 0.0);
            } else {
                prop_assert!(m == f32::NEG_INFINITY, "mask[{}][{}] = {}", i, j, m);
            }
        }
    }

    // Leaf paths: one per leaf, in arena order of the leaves, each the leaf's root path.
    let mut has_child = vec![false; n];
    for i in 1..n {
        has_child[paths[i][paths[i].len() - 2]] = true;
    }
    let leaves: Vec<usize> = (0..n).filter(|&i| !has_child[i]).collect();
    prop_assert_eq!(&tree.leaves(), &leaves);
    let ends: Vec<usize> = flat.leaf_paths.iter().map(|p| *p.last().expect("non-empty path")).collect();
    prop_assert_eq!(&ends, &leaves, "every leaf exactly once");
    for (p, &leaf) in flat.leaf_paths.iter().zip(&leaves) {
        prop_assert_eq!(p, &paths[leaf]);
    }
    let mut covered = vec![false; n];
    for p in &flat.leaf_paths {
        for &r in p {
            covered[r] = true;
        }
    }
    prop_assert!(covered.iter().all(|&c| c), "a node is on no leaf path");

    // row_paths: the leaf paths containing each row, in path order; a leaf has exactly one, the
    // root all of them; a row has as many as there are leaves below it.
    let row_paths = flat.row_paths();
    prop_assert_eq!(row_paths.len(), n);
    for (r, rp) in row_paths.iter().enumerate() {
        let expect: Vec<usize> =
            (0..flat.leaf_paths.len()).filter(|&p| flat.leaf_paths[p].contains(&r)).collect();
        prop_assert_eq!(rp, &expect, "row {}", r);
        let leaves_below = leaves.iter().filter(|&&l| paths[l].contains(&r)).count();
        prop_assert_eq!(rp.len(), leaves_below);
        prop_assert!(!rp.is_empty());
        if !has_child[r] {
            prop_assert_eq!(rp.len(), 1);
        }
    }
    prop_assert_eq!(row_paths[0].len(), flat.leaf_paths.len());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn flat_tree_layout((tokens, parents) in raw_tree(), prefix_len in 0usize..4096) {
        let tree = TokenTree::from_parents(&tokens, &parents).unwrap();
        check_flat(&tree, &raw_paths(&parents), prefix_len, usize::MAX)?;
    }
}

// ---------------------------------------------------------------------------------------------
// DAGs.

#[derive(Debug, Clone)]
enum Op {
    /// Add a node under `parent` (an index that may point one past the end: an invalid parent).
    Add { parent: u32, token: TokenId, draw: u8 },
    /// Link two nodes (indices may be out of range: an invalid edge).
    Link { from: u32, to: u32 },
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let adds = proptest::collection::vec(
        (any::<u32>(), 0u32..5, 0u8..3).prop_map(|(parent, token, draw)| Op::Add { parent, token, draw }),
        0..30,
    );
    let links = proptest::collection::vec((any::<u32>(), any::<u32>(), any::<Index>()), 0..24);
    (adds, links).prop_map(|(mut ops, links)| {
        for (from, to, at) in links {
            let at = at.index(ops.len() + 1);
            ops.insert(at, Op::Link { from, to });
        }
        ops
    })
}

/// Largest full unrolling a generated DAG may have.
const MAX_UNROLLED: usize = 3000;

/// The test's own model of a DAG.
struct Model {
    tokens: Vec<TokenId>,
    draws: Vec<Draw>,
    edges: Vec<Vec<(usize, bool)>>,
}

impl Model {
    fn reaches(&self, from: usize, to: usize) -> bool {
        from == to || self.edges[from].iter().any(|&(c, _)| self.reaches(c, to))
    }

    fn linked(&self, from: usize, to: usize) -> bool {
        self.edges[from].iter().find(|&&(c, _)| c == to).expect("edge exists").1
    }

    /// Every root-to-sink node path, enumerated independently of the library.
    fn sink_paths(&self) -> Vec<Vec<usize>> {
        fn walk(m: &Model, at: usize, path: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
            path.push(at);
            if m.edges[at].is_empty() {
                out.push(path.clone());
            }
            for &(c, _) in &m.edges[at] {
                walk(m, c, path, out);
            }
            path.pop();
        }
        let mut out = Vec::new();
        walk(self, 0, &mut Vec::new(), &mut out);
        out
    }

    /// Number of root-to-v paths summed over v: the size of the full unrolling.
    fn unrolled_size(&self) -> usize {
        // Memoised over the DAG (acyclic: links that would close a cycle are refused).
        fn below(m: &Model, at: usize, memo: &mut Vec<Option<usize>>) -> usize {
            if let Some(x) = memo[at] {
                return x;
            }
            let x = 1 + m.edges[at].iter().map(|&(c, _)| below(m, c, memo)).sum::<usize>();
            memo[at] = Some(x);
            x
        }
        below(self, 0, &mut vec![None; self.tokens.len()])
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn dag_unrolls_to_all_root_to_sink_paths(ops in ops(), caps in proptest::collection::vec(1usize..120, 3)) {
        let q = Arc::new(Dist::from_weights(vec![1.0; 8]).unwrap());
        let mk_draw = |k: u8| match k {
            0 => Draw::Deterministic,
            1 => Draw::Iid { q: q.clone() },
            _ => Draw::WithoutReplacement { q: q.clone() },
        };
        let mut g = TokenDag::new(7);
        let mut m = Model { tokens: vec![7], draws: vec![Draw::Deterministic], edges: vec![Vec::new()] };
        for op in &ops {
            let len = m.tokens.len();
            match *op {
                Op::Add { parent, token, draw } => {
                    let parent = parent as usize % (len + 1);
                    let d = mk_draw(draw);
                    let prob = 0.1 + token as f32 / 10.0;
                    let r = g.add(parent, token, d.clone(), prob);
                    if parent < len {
                        prop_assert_eq!(r, Ok(len));
                        m.tokens.push(token);
                        m.draws.push(d);
                        m.edges.push(Vec::new());
                        m.edges[parent].push((len, false));
                    } else {
                        prop_assert!(r.is_err());
                    }
                }
                Op::Link { from, to } => {
                    let (from, to) = (from as usize % (len + 2), to as usize % (len + 2));
                    let valid = from < len
                        && to < len
                        && to != ROOT
                        && !m.edges[from].iter().any(|&(c, _)| c == to)
                        && !m.reaches(to, from);
                    if valid {
                        // Keep the full unrolling small enough to enumerate: skip valid links
                        // that would blow it up (the DAG is then left as it is).
                        m.edges[from].push((to, true));
                        let size = m.unrolled_size();
                        m.edges[from].pop();
                        if size > MAX_UNROLLED {
                            continue;
                        }
                    }
                    let before = g.clone();
                    let r = g.link(from, to);
                    prop_assert_eq!(r.is_ok(), valid, "link {} -> {}: {:?}", from, to, r);
                    if valid {
                        m.edges[from].push((to, true));
                    } else {
                        prop_assert_eq!(&g, &before, "a refused link changed the DAG");
                    }
                }
            }
        }
        // The library's view of the graph matches the model.
        prop_assert_eq!(g.len(), m.tokens.len());
        for v in 0..g.len() {
            prop_assert_eq!(g.node(v).token, m.tokens[v]);
            prop_assert_eq!(&g.node(v).edges, &m.edges[v]);
        }
        for a in (0..g.len()).step_by(3) {
            for b in 0..g.len() {
                prop_assert_eq!(g.reaches(a, b), m.reaches(a, b));
            }
        }

        // Full unrolling.
        let size = m.unrolled_size();
        let (tree, origin) = g.unroll(usize::MAX);
        prop_assert_eq!(tree.len(), size);
        prop_assert_eq!(origin.len(), tree.len());
        prop_assert_eq!(origin[0], ROOT);
        for i in 0..tree.len() {
            let node = tree.node(i);
            prop_assert_eq!(node.token, m.tokens[origin[i]]);
            // Children in the DAG's edge order.
            let kids: Vec<usize> = tree.children(i).iter().map(|&c| origin[c]).collect();
            let want: Vec<usize> = m.edges[origin[i]].iter().map(|&(c, _)| c).collect();
            prop_assert_eq!(kids, want);
            if i == ROOT {
                continue;
            }
            // Deterministic iff reached through a link somewhere on the root path.
            let path = tree.path(i);
            let via_link = path
                .windows(2)
                .any(|w| m.linked(origin[w[0]], origin[w[1]]));
            if via_link {
                prop_assert_eq!(&node.draw, &Draw::Deterministic, "node {} below a link", i);
            } else {
                prop_assert_eq!(&node.draw, &m.draws[origin[i]]);
            }
        }

        // Root-to-leaf paths of the tree = root-to-sink paths of the DAG (as node paths through
        // `origin`, as a multiset, and as a set of token sequences).
        let mut tree_paths: Vec<Vec<usize>> = tree
            .leaves()
            .into_iter()
            .map(|l| tree.path(l).into_iter().map(|n| origin[n]).collect())
            .collect();
        let mut dag_paths = m.sink_paths();
        tree_paths.sort();
        dag_paths.sort();
        prop_assert_eq!(&tree_paths, &dag_paths);
        let tree_tokens: BTreeSet<Vec<TokenId>> =
            tree.leaves().into_iter().map(|l| tree.path_tokens(l)).collect();
        let dag_tokens: BTreeSet<Vec<TokenId>> = dag_paths
            .iter()
            .map(|p| p[1..].iter().map(|&v| m.tokens[v]).collect())
            .collect();
        prop_assert_eq!(tree_tokens, dag_tokens);

        // The unrolled tree flattens like any other tree.
        check_flat(&tree, &raw_paths(&tree.nodes().iter().map(|n| n.parent).collect::<Vec<_>>()), 3, 64)?;

        // A cap never exceeds it and keeps a prefix of the full unrolling.
        for cap in caps.into_iter().chain([1, 2, size, size + 1]) {
            let (t, o) = g.unroll(cap);
            prop_assert!(t.len() <= cap, "cap {} gave {} nodes", cap, t.len());
            prop_assert_eq!(t.len(), cap.min(size));
            prop_assert_eq!(t.nodes(), &tree.nodes()[..t.len()]);
            prop_assert_eq!(&o[..], &origin[..t.len()]);
        }
    }
}

/// A hand-made diamond with a shared tail, checked without randomness: two routes to the same
/// subtree give two copies, the one through the link deterministic.
#[test]
fn diamond_unrolls_into_both_routes() {
    let q = Arc::new(Dist::from_weights(vec![1.0; 8]).unwrap());
    let mut g = TokenDag::new(0);
    let a = g.add(ROOT, 1, Draw::Iid { q: q.clone() }, 0.5).unwrap();
    let b = g.add(ROOT, 2, Draw::Iid { q: q.clone() }, 0.5).unwrap();
    let c = g.add(a, 3, Draw::Iid { q: q.clone() }, 0.5).unwrap();
    g.add(c, 4, Draw::Iid { q }, 0.5).unwrap();
    g.link(b, c).unwrap();
    assert!(g.link(c, a).is_err());
    assert!(g.link(c, ROOT).is_err());
    let (t, origin) = g.unroll(1000);
    let paths: BTreeSet<Vec<TokenId>> = t.leaves().into_iter().map(|l| t.path_tokens(l)).collect();
    assert_eq!(paths, [vec![1, 3, 4], vec![2, 3, 4]].into_iter().collect());
    assert_eq!(t.len(), 7);
    for i in 1..t.len() {
        let under_b = t.path(i).iter().any(|&n| origin[n] == b) && origin[i] != b;
        assert_eq!(t.node(i).draw == Draw::Deterministic, under_b, "node {i}");
    }
}
