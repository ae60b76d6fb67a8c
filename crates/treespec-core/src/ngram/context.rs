//! A context n-gram index over a growing token history (prompt lookup, llama.cpp's context
//! n-gram cache).
//!
//! For every n in `min_n..=max_n` a hash map sends each n-gram of the history to the positions
//! right after its occurrences. Appending a token adds one entry per n, so keeping the index in
//! step with generation costs O(max_n) per token, and a lookup costs a hash probe plus the few most
//! recent occurrences — never a scan of the history.

use std::collections::{HashMap, HashSet};

use crate::{Error, Result, TokenId};

/// Occurrences examined per n-gram length and lookup: the most recent ones. Bounds the cost of
/// frequent short n-grams (a unigram like "the" occurs thousands of times in a long history).
const SCAN_LIMIT: usize = 256;

/// One candidate continuation found in the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continuation {
    /// Length of the matched n-gram (longer = more specific context).
    pub n: usize,
    /// The tokens that followed the match (at most the requested length; shorter when the
    /// occurrence sits near the end of the history).
    pub tokens: Vec<TokenId>,
    /// How many scanned occurrences of the n-gram were followed by exactly these tokens.
    pub count: usize,
    /// Where the most recent such continuation starts in the history.
    pub position: usize,
}

/// The n-grams of a token history, keyed by the n-gram (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct ContextIndex {
    min_n: usize,
    max_n: usize,
    tokens: Vec<TokenId>,
    /// `maps[n - min_n]`: n-gram → positions right after each occurrence, oldest first.
    maps: Vec<HashMap<Vec<TokenId>, Vec<u32>>>,
}

impl ContextIndex {
    /// An empty index matching n-grams of `min_n..=max_n` tokens (`1 ≤ min_n ≤ max_n`).
    pub fn new(min_n: usize, max_n: usize) -> Result<Self> {
        if min_n == 0 || min_n > max_n {
            return Err(Error::Invalid(format!(
                "context n-gram lengths must satisfy 1 ≤ min_n ≤ max_n, got min_n {min_n}, max_n {max_n}"
            )));
        }
        Ok(Self { min_n, max_n, tokens: Vec::new(), maps: vec![HashMap::new(); max_n - min_n + 1] })
    }

    /// Shortest n-gram length matched.
    pub fn min_n(&self) -> usize {
        self.min_n
    }

    /// Longest n-gram length matched.
    pub fn max_n(&self) -> usize {
        self.max_n
    }

    /// The indexed history.
    pub fn tokens(&self) -> &[TokenId] {
        &self.tokens
    }

    /// Number of indexed tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Forget the history (a new generation).
    pub fn clear(&mut self) {
        self.tokens.clear();
        for m in &mut self.maps {
            m.clear();
        }
    }

    /// Append one token: registers the n-grams that end with it.
    pub fn push(&mut self, token: TokenId) {
        self.tokens.push(token);
        let len = self.tokens.len();
        for n in self.min_n..=self.max_n.min(len) {
            let key = self.tokens[len - n..].to_vec();
            self.maps[n - self.min_n].entry(key).or_default().push(len as u32);
        }
    }

    /// Append tokens.
    pub fn extend(&mut self, tokens: &[TokenId]) {
        for &t in tokens {
            self.push(t);
        }
    }

    /// Make the index hold exactly `history`: appends the new tail when `history` extends what is
    /// indexed (the normal case during generation), rebuilds otherwise.
    pub fn sync(&mut self, history: &[TokenId]) {
        let len = self.tokens.len();
        if history.len() >= len && history[..len] == self.tokens[..] {
            self.extend(&history[len..]);
        } else {
            self.clear();
            self.extend(history);
        }
    }

    /// Continuations of the indexed history's own suffix (see [`ContextIndex::lookup_after`]).
    pub fn lookup(&self, max_len: usize, max_results: usize) -> Vec<Continuation> {
        self.lookup_after(&self.tokens, max_len, max_results)
    }

    /// Continuations of `query`'s suffix found in the indexed history: for n from `max_n` down to
    /// `min_n`, the last n tokens of `query` are looked up and what followed each earlier
    /// occurrence (up to `max_len` tokens) becomes a candidate. Longer matches come first; within
    /// one n, the most frequent continuation first, then the most recent. Identical continuations
    /// and occurrences already found through a longer match are reported once. `query` may run
    /// past the indexed history (a draft path on top of it).
    pub fn lookup_after(&self, query: &[TokenId], max_len: usize, max_results: usize) -> Vec<Continuation> {
        let mut out: Vec<Continuation> = Vec::new();
        if max_len == 0 || max_results == 0 {
            return out;
        }
        // Occurrences already reported through a longer match, and where each distinct
        // continuation sits in `out`.
        let mut used_positions: HashSet<u32> = HashSet::new();
        let mut slot: HashMap<&[TokenId], usize> = HashMap::new();
        for n in (self.min_n..=self.max_n.min(query.len())).rev() {
            let key = &query[query.len() - n..];
            let Some(positions) = self.maps[n - self.min_n].get(key) else { continue };
            let first_new = out.len();
            // The most recent occurrences, newest first, grouped by what followed them.
            for &p in positions.iter().rev().take(SCAN_LIMIT) {
                let start = p as usize;
                // The query's own occurrence at the end of the history has no continuation yet.
                if start >= self.tokens.len() || !used_positions.insert(p) {
                    continue;
                }
                let tokens = &self.tokens[start..(start + max_len).min(self.tokens.len())];
                match slot.get(tokens) {
                    Some(&i) => out[i].count += 1,
                    None => {
                        slot.insert(tokens, out.len());
                        out.push(Continuation { n, tokens: tokens.to_vec(), count: 1, position: start });
                    }
                }
            }
            // Stable sort: equal counts keep newest-first order. Then re-point the moved slots.
            out[first_new..].sort_by_key(|g| std::cmp::Reverse(g.count));
            for (i, c) in out.iter().enumerate().skip(first_new) {
                slot.insert(&self.tokens[c.position..c.position + c.tokens.len()], i);
            }
            if out.len() >= max_results {
                break;
            }
        }
        out.truncate(max_results);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_followed_the_longest_match_first() {
        let mut ix = ContextIndex::new(1, 3).unwrap();
        // 1 2 3 4 | 9 2 3 5 | 1 2 3 → longest match "1 2 3" was followed by 4.
        ix.extend(&[1, 2, 3, 4, 9, 2, 3, 5, 1, 2, 3]);
        let c = ix.lookup(2, 4);
        assert_eq!(c[0], Continuation { n: 3, tokens: vec![4, 9], count: 1, position: 3 });
        // Then "2 3" (n = 2) adds the other occurrence, followed by 5.
        assert_eq!(c[1].n, 2);
        assert_eq!(c[1].tokens, vec![5, 1]);
        // The unigram "3" finds no occurrence not already reported.
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn most_frequent_then_most_recent() {
        let mut ix = ContextIndex::new(1, 1).unwrap();
        ix.extend(&[7, 1, 7, 2, 7, 1, 7, 3, 7]);
        let c = ix.lookup(1, 8);
        let firsts: Vec<u32> = c.iter().map(|c| c.tokens[0]).collect();
        assert_eq!(firsts, vec![1, 3, 2]);
        assert_eq!(c[0].count, 2);
        assert_eq!(c[0].position, 5);
    }

    #[test]
    fn incremental_equals_batch_and_sync_rebuilds() {
        let seq: Vec<u32> = (0..200).map(|i| (i * 7 % 13) as u32).collect();
        let mut a = ContextIndex::new(1, 4).unwrap();
        for &t in &seq {
            a.push(t);
        }
        let mut b = ContextIndex::new(1, 4).unwrap();
        b.sync(&seq[..50]);
        b.sync(&seq);
        assert_eq!(a, b);
        // A history that does not extend the index: rebuilt from scratch.
        b.sync(&[5, 6, 5]);
        assert_eq!(b.tokens(), &[5, 6, 5]);
        assert_eq!(b.lookup(3, 2)[0].tokens, vec![6, 5]);
    }

    /// The hash-indexed lookup against a direct scan of the history.
    #[test]
    fn matches_a_naive_scan() {
        fn naive(
            tokens: &[TokenId],
            query: &[TokenId],
            min_n: usize,
            max_n: usize,
            len: usize,
        ) -> Vec<Continuation> {
            let mut out: Vec<Continuation> = Vec::new();
            let mut used = Vec::new();
            for n in (min_n..=max_n.min(query.len())).rev() {
                let key = &query[query.len() - n..];
                let first_new = out.len();
                let starts: Vec<usize> =
                    (n..tokens.len()).rev().filter(|&p| &tokens[p - n..p] == key).collect();
                for p in starts.into_iter().take(SCAN_LIMIT) {
                    if used.contains(&p) {
                        continue;
                    }
                    used.push(p);
                    let cont = &tokens[p..(p + len).min(tokens.len())];
                    match out.iter_mut().find(|c| c.tokens == cont) {
                        Some(c) => c.count += 1,
                        None => out.push(Continuation { n, tokens: cont.to_vec(), count: 1, position: p }),
                    }
                }
                out[first_new..].sort_by_key(|c| std::cmp::Reverse(c.count));
            }
            out
        }
        let mut x: u64 = 7;
        for round in 0..60 {
            let vocab = 2 + round % 4;
            let len = 20 + round * 7;
            let tokens: Vec<TokenId> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((x >> 33) % vocab as u64) as TokenId
                })
                .collect();
            let (min_n, max_n) = (1 + round % 2, 2 + round % 3);
            let mut ix = ContextIndex::new(min_n, max_n).unwrap();
            ix.extend(&tokens);
            for cont_len in [1, 3] {
                let all = naive(&tokens, &tokens, min_n, max_n, cont_len);
                assert_eq!(ix.lookup(cont_len, usize::MAX), all, "round {round}");
                let query = [tokens[3], tokens[1], tokens[4]];
                let key = |c: &Continuation| (c.n, c.tokens.clone(), c.position);
                let want: Vec<_> =
                    naive(&tokens, &query, min_n, max_n, cont_len).iter().take(2).map(key).collect();
                let got: Vec<_> = ix.lookup_after(&query, cont_len, 2).iter().map(key).collect();
                // The indexed lookup stops at the first n that fills the request, so its counts
                // may leave out shorter matches; which continuations, and their order, agree.
                assert_eq!(got, want, "round {round}");
            }
        }
    }

    #[test]
    fn query_past_the_history_and_limits() {
        let mut ix = ContextIndex::new(2, 3).unwrap();
        ix.extend(&[1, 2, 3, 4, 5]);
        // A draft path "… 2 3" on top of another history.
        let c = ix.lookup_after(&[8, 8, 2, 3], 10, 1);
        assert_eq!(c, vec![Continuation { n: 2, tokens: vec![4, 5], count: 1, position: 3 }]);
        assert!(ix.lookup_after(&[3], 4, 4).is_empty(), "shorter than min_n");
        assert!(ix.lookup(0, 4).is_empty());
        assert!(ContextIndex::new(0, 2).is_err());
        assert!(ContextIndex::new(3, 2).is_err());
    }
}
