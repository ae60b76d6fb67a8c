//! The global history: every earlier request's prompt and output, in one bounded match index
//! shared by every request a process serves (and, saved to a file, by a CLI user's next runs:
//! the file and its format are treespec-engine's, `drafters/suffix/history_file/`).
//!
//! Memory is bounded by a cap on stored tokens. When a new document would pass it, the oldest
//! documents are dropped until the store is at three quarters of the cap and the index is rebuilt
//! from what is left: a rebuild costs O(cap) once every cap/4 tokens, so O(1) per token amortised,
//! and no stale entry ever survives an eviction.

use std::collections::VecDeque;

use super::index::{LookupLimits, Occurrence, SuffixIndex, BREAK, MAX_STORE_TOKENS};
use crate::{Error, Result, TokenId};

/// Default cap: one million tokens (about 60–80 MB of index).
pub const DEFAULT_CAP_TOKENS: usize = 1_000_000;

/// One stored document: a request's prompt followed by its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Doc {
    /// Fingerprint of the request's prompt (see [`prompt_key`]).
    prompt_key: u64,
    /// First token in the store.
    start: usize,
    /// Tokens (without the break after them).
    len: usize,
}

/// A fingerprint of a prompt, so that a benchmark can keep a prompt from drafting out of its own
/// earlier answers (FNV-1a over the token ids).
pub fn prompt_key(prompt: &[TokenId]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in prompt {
        for b in t.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Earlier requests' text in a bounded match index (see the module docs).
#[derive(Debug, Clone)]
pub struct GlobalHistory {
    index: SuffixIndex,
    docs: VecDeque<Doc>,
    cap_tokens: usize,
    evictions: u64,
}

impl GlobalHistory {
    /// An empty history holding at most `cap_tokens` tokens (≥ 2: a token and its break).
    pub fn new(cap_tokens: usize) -> Result<Self> {
        if !(2..MAX_STORE_TOKENS / 2).contains(&cap_tokens) {
            return Err(Error::Invalid(format!(
                "the suffix history cap must be between 2 and {} tokens, got {cap_tokens}",
                MAX_STORE_TOKENS / 2 - 1
            )));
        }
        Ok(Self { index: SuffixIndex::new(), docs: VecDeque::new(), cap_tokens, evictions: 0 })
    }

    /// The token cap.
    pub fn cap_tokens(&self) -> usize {
        self.cap_tokens
    }

    /// Documents held.
    pub fn docs(&self) -> usize {
        self.docs.len()
    }

    /// Tokens held (breaks included).
    pub fn tokens(&self) -> usize {
        self.index.len()
    }

    /// Documents evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Bytes held by the index.
    pub fn memory_bytes(&self) -> usize {
        self.index.memory_bytes() + self.docs.capacity() * std::mem::size_of::<Doc>()
    }

    /// The match index (its store is every document, [`BREAK`] after each).
    pub fn index(&self) -> &SuffixIndex {
        &self.index
    }

    /// Add a finished request's text (prompt + output). A document longer than the cap keeps only
    /// its last `cap_tokens - 1` tokens.
    pub fn add(&mut self, prompt_key: u64, text: &[TokenId]) {
        let text = &text[text.len().saturating_sub(self.cap_tokens - 1)..];
        if text.is_empty() {
            return;
        }
        if self.index.len() + text.len() + 1 > self.cap_tokens {
            self.evict(text.len() + 1);
        }
        self.docs.push_back(Doc { prompt_key, start: self.index.len(), len: text.len() });
        self.index.extend(text);
        self.index.push(BREAK);
    }

    /// Drop the oldest documents until `room` more tokens fit under three quarters of the cap, then
    /// rebuild the index from the rest.
    fn evict(&mut self, room: usize) {
        let three_quarters = self.cap_tokens * 3 / 4;
        let target =
            if room <= three_quarters { three_quarters - room } else { self.cap_tokens.saturating_sub(room) };
        let mut kept: usize = self.docs.iter().map(|d| d.len + 1).sum();
        while kept > target {
            let Some(d) = self.docs.pop_front() else { break };
            kept -= d.len + 1;
            self.evictions += 1;
        }
        let old = std::mem::take(&mut self.index);
        let docs = std::mem::take(&mut self.docs);
        for d in docs {
            let text = &old.tokens()[d.start..d.start + d.len];
            self.docs.push_back(Doc { start: self.index.len(), ..d });
            self.index.extend(text);
            self.index.push(BREAK);
        }
    }

    /// The prompt fingerprint of the document holding store position `pos`.
    fn doc_key(&self, pos: usize) -> Option<u64> {
        let i = self.docs.partition_point(|d| d.start <= pos).checked_sub(1)?;
        Some(self.docs[i].prompt_key)
    }

    /// Earlier occurrences of the longest suffixes of `query`, leaving out documents whose prompt
    /// fingerprint is `exclude` (a prompt never drafts from its own earlier answers then).
    pub fn lookup(&self, query: &[TokenId], limits: LookupLimits, exclude: Option<u64>) -> Vec<Occurrence> {
        let Some(key) = exclude else { return self.index.lookup(query, limits) };
        // Ask for more, then filter: excluded documents must not crowd out the others.
        let wider = LookupLimits { want: limits.want * 2 + 4, ..limits };
        let mut out: Vec<Occurrence> = self
            .index
            .lookup(query, wider)
            .into_iter()
            .filter(|o| self.doc_key(o.start) != Some(key))
            .collect();
        out.truncate(limits.want);
        out
    }

    /// The documents held, oldest first: each one's prompt key and text.
    pub fn documents(&self) -> impl Iterator<Item = (u64, &[TokenId])> + '_ {
        self.docs.iter().map(|d| (d.prompt_key, &self.index.tokens()[d.start..d.start + d.len]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_under_its_cap_dropping_the_oldest() {
        let mut h = GlobalHistory::new(100).unwrap();
        for i in 0..50u32 {
            let doc: Vec<TokenId> = (0..9).map(|j| i * 10 + j).collect();
            h.add(i as u64, &doc);
            assert!(h.tokens() <= 100, "{} tokens after doc {i}", h.tokens());
        }
        assert!(h.evictions() > 0);
        // The newest document is still found, the first one is gone.
        let newest: Vec<TokenId> = (490..495).collect();
        assert_eq!(h.lookup(&newest, LookupLimits::default(), None).len(), 1);
        assert!(h.lookup(&[0, 1, 2], LookupLimits::default(), None).is_empty());
    }

    #[test]
    fn excluded_prompts_are_not_drafted_from() {
        let mut h = GlobalHistory::new(1000).unwrap();
        h.add(1, &[5, 6, 7, 8]);
        h.add(2, &[5, 6, 9]);
        let all = h.lookup(&[5, 6], LookupLimits::default(), None);
        assert_eq!(all.len(), 2);
        let others = h.lookup(&[5, 6], LookupLimits::default(), Some(2));
        assert_eq!(others.len(), 1);
        assert_eq!(h.index().continuation(others[0].start, 4), &[7, 8]);
    }
}
