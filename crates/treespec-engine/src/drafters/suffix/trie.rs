//! A step's candidates: the continuations of the history's suffix matches in the request's own
//! text and in the global history, merged into one trie (plus the re-anchoring chains), as a
//! token tree with each node's pricing features. Nothing is drafted under a token that ends
//! generation: a copy of a prompt's turn would run on into the chat template's next header.

use treespec_core::suffix::{continuation_trie, Features, LookupLimits, Matches};
use treespec_core::tree::{Draw, TokenTree, ROOT};
use treespec_core::TokenId;

use super::SuffixDrafter;
use crate::error::Result;

/// Most nodes the trie is built with before pricing (the pricing then keeps far fewer).
pub(super) const TRIE_NODES: usize = 256;

impl SuffixDrafter {
    /// The merged continuation trie for `history` as a token tree, with each node's features:
    /// the suffix matches' continuations, and the re-anchoring chains, with nothing under a
    /// token of `eos`.
    pub(super) fn trie(
        &mut self,
        history: &[TokenId],
        depth: usize,
        eos: &[TokenId],
    ) -> Result<(TokenTree, Vec<Features>)> {
        let limits =
            LookupLimits { want: self.config.occurrences, scan: 64, max_match: self.config.max_match };
        let local = self.local.lookup(history, limits);
        let shared = self.config.shared.clone();
        let global_history = shared.history();
        let exclude = self.config.exclude_same_prompt.then_some(self.prompt_key);
        let global =
            if self.config.global { global_history.lookup(history, limits, exclude) } else { Vec::new() };
        self.stats.local_hits += !local.is_empty() as u64;
        self.stats.global_hits += !global.is_empty() as u64;
        let sources = [
            Matches { index: &self.local, occurrences: &local, global: false },
            Matches { index: global_history.index(), occurrences: &global, global: true },
        ];
        let root = *history.last().expect("history holds the root");
        let mut trie = continuation_trie(root, &sources, depth, TRIE_NODES);
        drop(global_history);
        if self.config.reanchor {
            self.graft_resume_chains(&mut trie, history, local.first().copied(), depth);
        }
        // Each trie node's id in the tree (None: under an end token, dropped); parents come
        // first in the trie.
        let mut tree = TokenTree::new(root);
        let mut features = vec![trie[0].priced()];
        let mut image = vec![Some(ROOT); trie.len()];
        for (i, node) in trie.iter().enumerate().skip(1) {
            let ends = node.parent != 0 && eos.contains(&trie[node.parent].token);
            image[i] = match image[node.parent].filter(|_| !ends) {
                Some(parent) => {
                    features.push(node.priced());
                    Some(tree.add(parent, node.token, Draw::Deterministic, 0.0)?)
                }
                None => None,
            };
        }
        Ok((tree, features))
    }
}
