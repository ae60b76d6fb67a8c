//! Tree decoding against the real SmolLM2 model: a node's logits must not depend on the tree
//! around it, on how the tree was fed, or on what was committed before.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use treespec_engine::{CausalLm, TreeBatch};
use treespec_llama::LlamaLm;

/// SmolLM2 Q4_1 has no batch-size dependent kernels and the backend keeps KV cells in position
/// order, so trees and chains agree bit for bit in practice (max diff 0). Other models need
/// `TREESPEC_TEST_EXACT=1` (see `common::test_options`).
const TOL: f32 = 1e-3;
const EXACT_HINT: &str = " (for a model other than SmolLM2 Q4_1, set TREESPEC_TEST_EXACT=1)";

fn tree_batch(tokens: &[u32], parents: &[Option<usize>]) -> TreeBatch {
    TreeBatch { tokens: tokens.to_vec(), parents: parents.to_vec(), logits: vec![true; tokens.len()] }
}

/// Logits of every node on `path` (node indices into `tokens`) when the path is fed alone as a
/// chain on top of the committed prefix. Leaves nothing pending.
fn chain_logits(lm: &mut LlamaLm<'_>, tokens: &[u32], path: &[usize]) -> Vec<Vec<f32>> {
    let toks: Vec<u32> = path.iter().map(|&i| tokens[i]).collect();
    let out = lm.forward(&TreeBatch::chain(&toks, None, 0, false)).unwrap().into_owned();
    lm.commit(&[]).unwrap();
    (0..out.rows()).map(|r| out.row(r).to_vec()).collect()
}

/// Every node's logits from plain chains, cheaper than one chain per leaf: leaves in depth-first
/// order, each leaf's chain starting where it leaves the previous leaf's path (the shared part
/// stays committed, the rest is truncated). Each node is computed once, as plain decoding would.
fn chain_logits_dfs(lm: &mut LlamaLm<'_>, tokens: &[u32], parents: &[Option<usize>]) -> Vec<Vec<f32>> {
    let base = lm.committed_len();
    let mut paths: Vec<Vec<usize>> = leaves(parents).into_iter().map(|l| path_to(parents, l)).collect();
    paths.sort();
    let mut out = vec![Vec::new(); parents.len()];
    let mut prev: &[usize] = &[];
    for path in &paths {
        let common = path.iter().zip(prev).take_while(|(a, b)| a == b).count();
        lm.truncate(base + common).unwrap();
        let suffix = &path[common..];
        let toks: Vec<u32> = suffix.iter().map(|&i| tokens[i]).collect();
        let logits = lm.forward(&TreeBatch::chain(&toks, None, 0, false)).unwrap().into_owned();
        for (k, &node) in suffix.iter().enumerate() {
            out[node] = logits.row(k).to_vec();
        }
        lm.commit(&(0..suffix.len()).collect::<Vec<_>>()).unwrap();
        prev = path;
    }
    lm.truncate(base).unwrap();
    out
}

/// Compare a node's tree logits with its chain logits; return the max abs difference.
fn compare(what: &str, tree: &[f32], chain: &[f32]) -> f32 {
    let d = max_abs_diff(tree, chain);
    if top2_margin(chain) > d {
        assert_eq!(argmax(tree), argmax(chain), "{what}: argmax differs (diff {d})");
    }
    d
}

/// Feed `count` random trees (width 1-4, depth 1-6, 1-40 nodes) each in one forward and compare
/// every node with its root path fed as a plain chain. The first `independent` trees use one
/// fresh chain per leaf, the rest the cheaper prefix-sharing chains. Returns the max difference.
fn check_random_trees(seed: u64, count: usize, independent: usize) -> f32 {
    let model = model();
    let mut lm = model.new_lm().unwrap();
    lm.prefill(&prompt(model)).unwrap();
    let committed = lm.committed_len();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut worst = 0.0f32;
    let mut nodes_checked = 0;
    for t in 0..count {
        let width = rng.random_range(1..=4);
        let depth = rng.random_range(1..=6);
        let n = rng.random_range(1..=40);
        let parents = random_tree(&mut rng, width, depth, n);
        let tokens = random_tokens(&mut rng, parents.len(), lm.vocab_size());
        let tree = lm.forward(&tree_batch(&tokens, &parents)).unwrap().into_owned();
        assert_eq!(tree.rows(), parents.len());
        assert_eq!(lm.pending_len(), parents.len());
        lm.commit(&[]).unwrap();
        assert_eq!(lm.committed_len(), committed);

        if t < independent {
            let mut checked = vec![false; parents.len()];
            for leaf in leaves(&parents) {
                let path = path_to(&parents, leaf);
                let chain = chain_logits(&mut lm, &tokens, &path);
                for (k, &node) in path.iter().enumerate() {
                    worst = worst.max(compare(&format!("tree {t} node {node}"), tree.row(node), &chain[k]));
                    checked[node] = true;
                }
            }
            assert!(checked.iter().all(|&c| c), "every node lies on a leaf path");
        } else {
            let chain = chain_logits_dfs(&mut lm, &tokens, &parents);
            for (node, c) in chain.iter().enumerate() {
                worst = worst.max(compare(&format!("tree {t} node {node}"), tree.row(node), c));
            }
        }
        assert_eq!(lm.committed_len(), committed);
        nodes_checked += parents.len();
    }
    eprintln!(
        "tree vs chain (seed {seed}): {nodes_checked} nodes in {count} trees, max |logit diff| = {worst:e}"
    );
    worst
}

// 20 random trees, split in two tests so they run on both cores.
#[test]
fn tree_logits_equal_chain_logits() {
    if skip_model_tests("tree_logits_equal_chain_logits") {
        return;
    }
    let worst = check_random_trees(7, 10, 3);
    assert!(worst < TOL, "max logit difference {worst} exceeds {TOL}{EXACT_HINT}");
}

#[test]
fn tree_logits_equal_chain_logits_more() {
    if skip_model_tests("tree_logits_equal_chain_logits_more") {
        return;
    }
    let worst = check_random_trees(8, 10, 1);
    assert!(worst < TOL, "max logit difference {worst} exceeds {TOL}{EXACT_HINT}");
}

/// After committing a path of a tree, the next token's logits equal those of plain incremental
/// decoding (one token per forward, committed each time) of the same sequence; truncating back
/// restores the earlier state.
#[test]
fn commit_then_decode_matches_incremental_decoding() {
    if skip_model_tests("commit_then_decode_matches_incremental_decoding") {
        return;
    }
    let model = model();
    let prompt = prompt(model);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut worst = 0.0f32;
    let mut spec = model.new_lm().unwrap();
    spec.prefill(&prompt).unwrap();
    let mut history = prompt.clone();
    for _ in 0..3 {
        let parents = random_tree(&mut rng, 3, 4, 12);
        let tokens = random_tokens(&mut rng, parents.len(), spec.vocab_size());
        spec.forward(&tree_batch(&tokens, &parents)).unwrap();
        let leaves = leaves(&parents);
        let path = path_to(&parents, leaves[rng.random_range(0..leaves.len())]);
        spec.commit(&path).unwrap();
        history.extend(path.iter().map(|&i| tokens[i]));
        assert_eq!(spec.committed_len(), history.len());
        assert_eq!(spec.pending_len(), 0);

        let next = random_tokens(&mut rng, 1, spec.vocab_size())[0];
        let got = spec.forward(&TreeBatch::chain(&[next], None, 0, false)).unwrap().into_owned();
        spec.commit(&[0]).unwrap();
        history.push(next);

        // Plain decoding from scratch: prompt, then one token per call.
        let mut plain = model.new_lm().unwrap();
        plain.prefill(&prompt).unwrap();
        let mut last = None;
        for &tok in &history[prompt.len()..] {
            last = Some(plain.forward(&TreeBatch::chain(&[tok], None, 0, false)).unwrap().into_owned());
            plain.commit(&[0]).unwrap();
        }
        let want = last.unwrap();
        worst = worst.max(compare("after commit", got.row(0), want.row(0)));
    }

    // Truncate back to the prompt: the first token's logits come back unchanged.
    let first = history[prompt.len()];
    spec.truncate(prompt.len()).unwrap();
    assert_eq!(spec.committed_len(), prompt.len());
    let again = spec.forward(&TreeBatch::chain(&[first], None, 0, false)).unwrap().into_owned();
    let mut plain = model.new_lm().unwrap();
    plain.prefill(&prompt).unwrap();
    let want = plain.forward(&TreeBatch::chain(&[first], None, 0, false)).unwrap().into_owned();
    worst = worst.max(compare("after truncate", again.row(0), want.row(0)));

    eprintln!("commit/truncate vs incremental: max |logit diff| = {worst:e}");
    assert!(worst < TOL, "max logit difference {worst} exceeds {TOL}{EXACT_HINT}");
}

/// Feed `parents`/`tokens` in the calls given by `chunks` (consecutive node ranges, parents before
/// children) and return each node's logits.
fn feed_in_chunks(
    lm: &mut LlamaLm<'_>,
    tokens: &[u32],
    parents: &[Option<usize>],
    chunks: &[usize],
) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    let mut start = 0;
    for &len in chunks {
        let end = start + len;
        let logits = lm.forward(&tree_batch(&tokens[start..end], &parents[start..end])).unwrap().into_owned();
        out.extend((0..logits.rows()).map(|r| logits.row(r).to_vec()));
        start = end;
    }
    assert_eq!(start, tokens.len());
    assert_eq!(lm.pending_len(), tokens.len());
    out
}

/// Reorder a tree so nodes come layer by layer (stable within a layer); returns the new parents
/// and, for each new index, the old one.
fn by_layers(parents: &[Option<usize>]) -> (Vec<Option<usize>>, Vec<usize>, Vec<usize>) {
    let depth: Vec<usize> = (0..parents.len()).map(|i| path_to(parents, i).len() - 1).collect();
    let mut order: Vec<usize> = (0..parents.len()).collect();
    order.sort_by_key(|&i| depth[i]);
    let mut new_of = vec![0; parents.len()];
    for (new, &old) in order.iter().enumerate() {
        new_of[old] = new;
    }
    let new_parents = order.iter().map(|&old| parents[old].map(|p| new_of[p])).collect();
    let max_depth = depth.iter().max().map_or(0, |d| d + 1);
    let layer_sizes = (0..max_depth).map(|d| depth.iter().filter(|&&x| x == d).count()).collect();
    (new_parents, order, layer_sizes)
}

#[test]
fn multi_call_trees_equal_one_shot_trees() {
    if skip_model_tests("multi_call_trees_equal_one_shot_trees") {
        return;
    }
    let model = model();
    let mut lm = model.new_lm().unwrap();
    lm.prefill(&prompt(model)).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    let mut worst = 0.0f32;

    // A hand-made case first: a later call branches under a node that already has children from
    // an earlier call, both at a root (A) and deeper (B).
    //   call 1: A, B under A          call 2: C under A, D under B, E under B
    //   call 3: F beside A, G under C, H under A (third child)
    let parents = vec![None, Some(0), Some(0), Some(1), Some(1), None, Some(2), Some(0)];
    // (tree as parent links, sizes of the consecutive node ranges fed per call)
    let mut cases: Vec<(Vec<Option<usize>>, Vec<usize>)> = vec![(parents, vec![2, 3, 3])];
    for _ in 0..5 {
        let (w, d, n) = (rng.random_range(1..=4), rng.random_range(1..=6), rng.random_range(1..=20));
        let parents = random_tree(&mut rng, w, d, n);
        // Random consecutive chunks: children of one node end up in different calls.
        let mut chunks = Vec::new();
        let mut left = parents.len();
        while left > 0 {
            let c = rng.random_range(1..=left.min(6));
            chunks.push(c);
            left -= c;
        }
        cases.push((parents, chunks));
    }

    for (t, (parents, chunks)) in cases.iter().enumerate() {
        let tokens = random_tokens(&mut rng, parents.len(), lm.vocab_size());
        let one_shot = feed_in_chunks(&mut lm, &tokens, parents, &[parents.len()]);
        lm.commit(&[]).unwrap();
        let multi = feed_in_chunks(&mut lm, &tokens, parents, chunks);
        for i in 0..parents.len() {
            let what = format!("case {t} node {i} chunks {chunks:?}");
            worst = worst.max(compare(&what, &multi[i], &one_shot[i]));
        }
        lm.commit(&[]).unwrap();
        // Layer per call.
        let (lp, order, layers) = by_layers(parents);
        let lt: Vec<u32> = order.iter().map(|&o| tokens[o]).collect();
        let layered = feed_in_chunks(&mut lm, &lt, &lp, &layers);
        for (new, &old) in order.iter().enumerate() {
            worst =
                worst.max(compare(&format!("case {t} node {old} by layers"), &layered[new], &one_shot[old]));
        }
        // Commit a random leaf path of the multi-call tree, then decode one more token: it must
        // match the same path fed as a chain.
        let leaves = leaves(&lp);
        let path = path_to(&lp, leaves[rng.random_range(0..leaves.len())]);
        lm.commit(&path).unwrap();
        let next = random_tokens(&mut rng, 1, lm.vocab_size());
        let got = lm.forward(&TreeBatch::chain(&next, None, 0, false)).unwrap().into_owned();
        lm.truncate(lm.committed_len() - path.len()).unwrap();
        let mut chain_toks: Vec<u32> = path.iter().map(|&i| lt[i]).collect();
        chain_toks.extend(&next);
        let want = lm.forward(&TreeBatch::chain(&chain_toks, None, 0, true)).unwrap().into_owned();
        lm.commit(&[]).unwrap();
        worst = worst.max(compare(&format!("case {t} after commit"), got.row(0), want.row(0)));
    }
    eprintln!("multi-call vs one-shot: max |logit diff| = {worst:e}");
    assert!(worst < TOL, "max logit difference {worst} exceeds {TOL}{EXACT_HINT}");
}

/// Only the flagged rows come back, in batch order.
#[test]
fn logits_only_for_flagged_rows() {
    if skip_model_tests("logits_only_for_flagged_rows") {
        return;
    }
    let model = model();
    let mut lm = model.new_lm().unwrap();
    lm.prefill(&prompt(model)).unwrap();
    let tokens = [1000, 2000, 3000, 4000];
    let parents = [None, Some(0), Some(0), None];
    let all = lm.forward(&tree_batch(&tokens, &parents)).unwrap().into_owned();
    lm.commit(&[]).unwrap();
    let some = lm
        .forward(&TreeBatch {
            tokens: tokens.to_vec(),
            parents: parents.to_vec(),
            logits: vec![false, true, false, true],
        })
        .unwrap();
    assert_eq!(some.rows(), 2);
    assert!(max_abs_diff(some.row(0), all.row(1)) < TOL);
    assert!(max_abs_diff(some.row(1), all.row(3)) < TOL);
    lm.commit(&[]).unwrap();
    let none = lm
        .forward(&TreeBatch { tokens: tokens.to_vec(), parents: parents.to_vec(), logits: vec![false; 4] })
        .unwrap();
    assert_eq!(none.rows(), 0);
}

/// A tree bigger than the physical batch (`n_ubatch`): still one `forward`, split by llama.cpp
/// into several graphs, and the same logits as with one big graph.
#[test]
fn tree_larger_than_ubatch() {
    if skip_model_tests("tree_larger_than_ubatch") {
        return;
    }
    let small = treespec_llama::LlamaModel::load(
        model_path(),
        treespec_llama::LoadOptions { n_ubatch: 8, ..test_options() },
    )
    .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    let parents = random_tree(&mut rng, 3, 6, 30);
    let tokens = random_tokens(&mut rng, parents.len(), small.vocab_size());
    let prompt = prompt(&small);
    let mut a = small.new_lm().unwrap();
    a.prefill(&prompt).unwrap();
    let split = a.forward(&tree_batch(&tokens, &parents)).unwrap().into_owned();
    let mut b = model().new_lm().unwrap();
    b.prefill(&prompt).unwrap();
    let whole = b.forward(&tree_batch(&tokens, &parents)).unwrap().into_owned();
    let worst = (0..parents.len()).map(|i| max_abs_diff(split.row(i), whole.row(i))).fold(0.0, f32::max);
    eprintln!("{} nodes with n_ubatch 8 vs 512: max |logit diff| = {worst:e}", parents.len());
    assert!(worst < TOL, "max logit difference {worst} exceeds {TOL}{EXACT_HINT}");
}
