//! Re-anchoring glue: the request's anchor tracker follows its last long copy, and once an edit
//! breaks the copy, the places where it may resume are grafted onto the step's trie as chains of
//! their own (see [`treespec_core::suffix::anchor`]). The chains are read from the history alone
//! — text emitted at earlier steps — so they keep the drafter lossless.

use treespec_core::suffix::{graft_resumes, Occurrence, Resume, TrieNode};
use treespec_core::TokenId;

use super::trie::TRIE_NODES;
use super::SuffixDrafter;

/// Most nodes the re-anchoring chains may add to the trie.
const RESUME_NODES: usize = 256;

impl SuffixDrafter {
    /// Move the anchor over `history` (`strongest`: the step's best match in the request's own
    /// text) and graft the chains where the broken copy may resume onto `trie`, each at most
    /// `depth` tokens.
    pub(super) fn graft_resume_chains(
        &mut self,
        trie: &mut Vec<TrieNode>,
        history: &[TokenId],
        strongest: Option<Occurrence>,
        depth: usize,
    ) {
        // Only the history (text emitted at earlier steps) places the anchor and the chains.
        let resumes: Vec<Resume> = self.anchors.update(history, strongest).to_vec();
        let chains: Vec<(Resume, &[TokenId])> =
            resumes.iter().map(|r| (*r, &history[r.start..history.len().min(r.start + depth)])).collect();
        graft_resumes(trie, &chains, TRIE_NODES + RESUME_NODES);
        self.stats.reanchor_steps += !chains.is_empty() as u64;
    }
}
