//! A grammar's forced chain with the drafter's proposal grafted under it.
//!
//! When a grammar forces tokens (a tool call's `{"name": "`), the step verifies them as a free
//! chain. The drafter proposes too: where its tree already holds the forced tokens as a path (a
//! suffix draft copying an earlier call of the same tool), what it drafted past them hangs under
//! the chain's end, so one forward takes the envelope *and* the copied arguments instead of the
//! envelope alone. Every node stays a deterministic-or-drawn candidate of the drafter's own tree
//! (the chain's nodes are forced: probability 1 under the masked target), so verification is the
//! usual one and losslessness is unchanged.
//!
//! The drafter then learns from its own tree: the emitted tokens are replayed onto it (the path
//! they follow is accepted, the next token is its bonus), and tokens past that are plain steps.

use treespec_core::tree::{Draw, NodeId, TokenTree, ROOT};
use treespec_core::verify::{DepthRecord, VerifyOutcome};
use treespec_core::TokenId;

use crate::drafter::Drafter;
use crate::error::Result;

/// The forced chain under `root`, with the subtree of `drafted` that follows the forced tokens
/// hung under its end when `drafted` holds them as a path from its root (else the chain alone).
pub(crate) fn graft(root: TokenId, forced: &[TokenId], drafted: &TokenTree) -> Result<TokenTree> {
    let mut tree = TokenTree::new(root);
    let mut at = ROOT;
    for &t in forced {
        at = tree.add(at, t, Draw::Deterministic, 1.0)?;
    }
    let Some(end) = follow(drafted, forced) else { return Ok(tree) };
    // Depth-first, children in their order: a parent is added before its children.
    let mut stack: Vec<(NodeId, NodeId)> = drafted.children(end).iter().map(|&c| (c, at)).collect();
    stack.reverse();
    while let Some((node, parent)) = stack.pop() {
        let n = drafted.node(node);
        let added = tree.add(parent, n.token, n.draw.clone(), n.draft_prob)?;
        stack.extend(drafted.children(node).iter().rev().map(|&c| (c, added)));
    }
    Ok(tree)
}

/// The node of `tree` reached from its root by `tokens`, if every one is a child on the way.
fn follow(tree: &TokenTree, tokens: &[TokenId]) -> Option<NodeId> {
    tokens
        .iter()
        .try_fold(ROOT, |at, &t| tree.children(at).iter().copied().find(|&c| tree.node(c).token == t))
}

/// Tell `drafter` how its proposal `drafted` fared, given the `emitted` tokens of the step: the
/// path of `drafted` they follow is accepted, the token after it is the bonus, and any emitted
/// past that are observed as plain steps.
pub(crate) fn replay(drafter: &mut dyn Drafter, drafted: &TokenTree, emitted: &[TokenId]) -> Result<()> {
    let (mut accepted, mut depths, mut at) = (Vec::new(), Vec::new(), ROOT);
    // The last emitted token is the target's own: the bonus whatever the drafted tree holds.
    for (j, &t) in emitted[..emitted.len().saturating_sub(1)].iter().enumerate() {
        let children = drafted.children(at);
        if children.is_empty() {
            break;
        }
        let hit = children.iter().position(|&c| drafted.node(c).token == t);
        depths.push(DepthRecord {
            depth: j + 1,
            candidates: children.len(),
            tried: hit.map_or(children.len(), |k| k + 1),
            accepted: hit.is_some(),
        });
        let Some(k) = hit else { break };
        at = children[k];
        accepted.push(at);
    }
    let mine = (accepted.len() + 1).min(emitted.len());
    let outcome = VerifyOutcome { accepted, tokens: emitted[..mine].to_vec(), depths };
    drafter.observe(drafted, &outcome)?;
    observe_as_plain_steps(drafter, emitted[mine - 1], &emitted[mine..])
}

/// `tokens` as plain steps after `root`: each a root-only tree whose bonus is the token.
fn observe_as_plain_steps(drafter: &mut dyn Drafter, mut root: TokenId, tokens: &[TokenId]) -> Result<()> {
    for &t in tokens {
        let tree = TokenTree::new(root);
        let outcome = VerifyOutcome { accepted: Vec::new(), tokens: vec![t], depths: Vec::new() };
        drafter.observe(&tree, &outcome)?;
        root = t;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drafter::ProposeContext;

    /// root 0 → 1 → 2 → {3 → 4, 5}, and root → 6.
    fn drafted() -> TokenTree {
        let mut t = TokenTree::new(0);
        let a = t.add(ROOT, 1, Draw::Deterministic, 1.0).unwrap();
        t.add(ROOT, 6, Draw::Deterministic, 1.0).unwrap();
        let b = t.add(a, 2, Draw::Deterministic, 1.0).unwrap();
        let c = t.add(b, 3, Draw::Deterministic, 1.0).unwrap();
        t.add(b, 5, Draw::Deterministic, 1.0).unwrap();
        t.add(c, 4, Draw::Deterministic, 1.0).unwrap();
        t
    }

    fn paths(t: &TokenTree) -> Vec<Vec<TokenId>> {
        let mut p: Vec<_> = (1..t.len()).map(|i| t.path_tokens(i)).collect();
        p.sort();
        p
    }

    #[test]
    fn the_drafted_subtree_past_the_forced_tokens_hangs_under_the_chain() {
        let g = graft(0, &[1, 2], &drafted()).unwrap();
        assert_eq!(paths(&g), vec![vec![1], vec![1, 2], vec![1, 2, 3], vec![1, 2, 3, 4], vec![1, 2, 5]]);
        assert_eq!(paths(&graft(0, &[6], &drafted()).unwrap()), vec![vec![6]], "nothing past a leaf");
        assert_eq!(
            paths(&graft(0, &[1, 5], &drafted()).unwrap()),
            vec![vec![1], vec![1, 5]],
            "not a path: the chain"
        );
        for i in 1..g.len() {
            let parent = g.node(i).parent.expect("a drafted node has a parent");
            assert!(parent < i, "parents come first in the arena");
        }
    }

    /// Records what it observes.
    #[derive(Default)]
    struct Seen(Vec<(usize, Vec<NodeId>, Vec<TokenId>)>);
    impl Drafter for Seen {
        fn kind(&self) -> crate::MethodKind {
            crate::MethodKind::Plain
        }
        fn begin(&mut self, _: &[TokenId], _: &treespec_core::sampling::Sampler, _: u64) -> Result<()> {
            Ok(())
        }
        fn propose(&mut self, ctx: &ProposeContext) -> Result<TokenTree> {
            Ok(TokenTree::new(ctx.root()))
        }
        fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) -> Result<()> {
            self.0.push((tree.len(), outcome.accepted.clone(), outcome.tokens.clone()));
            Ok(())
        }
    }

    #[test]
    fn the_drafter_learns_from_its_own_tree_then_plain_steps() {
        let mut seen = Seen::default();
        // Emitted 1 2 3 9 7: its tree's path 1 2 3 is accepted, 9 is the bonus, 7 a plain step.
        replay(&mut seen, &drafted(), &[1, 2, 3, 9, 7]).unwrap();
        assert_eq!(seen.0, vec![(7, vec![1, 3, 4], vec![1, 2, 3, 9]), (1, vec![], vec![7])]);
        // Emitted 1 2 3 4: the last is the bonus even where the tree drafted it.
        let mut seen = Seen::default();
        replay(&mut seen, &drafted(), &[1, 2, 3, 4]).unwrap();
        assert_eq!(seen.0, vec![(7, vec![1, 3, 4], vec![1, 2, 3, 4])]);
        // A miss at once: nothing accepted, the first token the bonus.
        let mut seen = Seen::default();
        replay(&mut seen, &drafted(), &[8, 1]).unwrap();
        assert_eq!(seen.0, vec![(7, vec![], vec![8]), (1, vec![], vec![1])]);
    }
}
