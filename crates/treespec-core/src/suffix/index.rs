//! A match index over a growing token store: where did the end of the current text occur before,
//! and how long is each of those matches?
//!
//! Suffix decoding needs, at every step, the earlier occurrences of the *longest* suffix of the
//! text so far (up to 64 tokens), with what followed each. A suffix automaton or suffix tree
//! answers that, but neither evicts old text cheaply nor stays small on a 150k-token vocabulary.
//! This index gets the same answers from four hash levels: for each key length k in
//! [`KEY_LENGTHS`], every k-gram of the store points to its most recent occurrence, and each
//! occurrence to the previous one with the same k-gram (a chain threaded through one `u32` array
//! per level, most recent first). A lookup takes the longest key the query can use, walks its
//! chain, and measures each candidate's true match length by comparing backwards (up to
//! `max_match` tokens); only when the long keys find too little does it fall back to shorter ones.
//!
//! Appending a token costs one hash and one map insert per level (O(1), no allocation beyond
//! amortised vector growth). Several documents can share one store: [`BREAK`] separates them and
//! no key, match or continuation ever crosses it.

use rustc_hash::FxHashMap;

use crate::TokenId;

/// Separates documents in a store. Never a real token id (the vocabulary is far smaller).
pub const BREAK: TokenId = TokenId::MAX;

/// Key lengths of the hash levels, shortest first. A 1-token match predicts too little to ever pay
/// for its verification on a CPU, so the shortest key is 2.
pub const KEY_LENGTHS: [usize; 4] = [2, 4, 8, 16];

/// "No earlier occurrence" in a chain.
const NONE: u32 = u32::MAX;

/// Most tokens one store may hold (positions are `u32`, `NONE` is reserved).
pub const MAX_STORE_TOKENS: usize = (u32::MAX - 1) as usize;

/// One earlier occurrence of the query's suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occurrence {
    /// Where the continuation starts in the store: the position right after the match.
    pub start: usize,
    /// Match length in tokens (≥ the key length that found it, ≤ `max_match`).
    pub len: usize,
}

/// How much a lookup may examine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupLimits {
    /// Occurrences wanted (the longest matches, most recent first among equals).
    pub want: usize,
    /// Chain entries examined per level: bounds the cost of frequent short keys.
    pub scan: usize,
    /// Longest match measured; longer matches count as this long.
    pub max_match: usize,
}

impl Default for LookupLimits {
    fn default() -> Self {
        Self { want: 8, scan: 64, max_match: 64 }
    }
}

/// The token store and its hash levels (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct SuffixIndex {
    tokens: Vec<TokenId>,
    /// Per level: key hash → end (exclusive) of its most recent occurrence.
    heads: [FxHashMap<u64, u32>; KEY_LENGTHS.len()],
    /// Per level: `prev[i]` = end of the previous occurrence of the key that ends at `i + 1`.
    prev: [Vec<u32>; KEY_LENGTHS.len()],
}

fn key_hash(k: usize, window: &[TokenId]) -> u64 {
    let mut h = 0x9e37_79b9_7f4a_7c15u64 ^ k as u64;
    for &t in window {
        h = (h.rotate_left(5) ^ t as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    h
}

impl SuffixIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// The stored tokens ([`BREAK`] between documents).
    pub fn tokens(&self) -> &[TokenId] {
        &self.tokens
    }

    /// Number of stored tokens (breaks included).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Forget everything, keeping the allocations.
    pub fn clear(&mut self) {
        self.tokens.clear();
        for (h, p) in self.heads.iter_mut().zip(self.prev.iter_mut()) {
            h.clear();
            p.clear();
        }
    }

    /// Append one token (or [`BREAK`]) and index the keys that end with it. Does nothing once the
    /// store holds [`MAX_STORE_TOKENS`] (callers cap far below that).
    pub fn push(&mut self, token: TokenId) {
        if self.tokens.len() >= MAX_STORE_TOKENS {
            return;
        }
        self.tokens.push(token);
        let end = self.tokens.len();
        for (level, &k) in KEY_LENGTHS.iter().enumerate() {
            let mut prev = NONE;
            if end >= k {
                let window = &self.tokens[end - k..end];
                if !window.contains(&BREAK) {
                    prev = self.heads[level].insert(key_hash(k, window), end as u32).unwrap_or(NONE);
                }
            }
            self.prev[level].push(prev);
        }
    }

    /// Append several tokens.
    pub fn extend(&mut self, tokens: &[TokenId]) {
        self.tokens.reserve(tokens.len());
        for &t in tokens {
            self.push(t);
        }
    }

    /// Catch up with a history of which the store holds a prefix (the tokens emitted since).
    /// A history that is not an extension of the store re-indexes it from scratch.
    pub fn sync(&mut self, history: &[TokenId]) {
        let n = self.tokens.len();
        if history.len() < n || history[..n] != self.tokens[..] {
            self.clear();
            self.extend(history);
        } else {
            self.extend(&history[n..]);
        }
    }

    /// Tokens the store holds that equal the last tokens of `query`, read backwards from `end`
    /// (exclusive), up to `max` — the true length of a match ending at `end`.
    fn match_len(&self, end: usize, query: &[TokenId], max: usize) -> usize {
        let stored = self.tokens[..end].iter().rev();
        let asked = query.iter().rev();
        stored.zip(asked).take(max).take_while(|(s, q)| s == q && **s != BREAK).count()
    }

    /// The earlier occurrences of the longest suffixes of `query` (see the module docs): at most
    /// `limits.want`, longest match first, most recent first among equal lengths. Only
    /// occurrences with a continuation count: the store must hold a real token right after the
    /// match, so the query's own end (when the query is the store's text) is never returned.
    pub fn lookup(&self, query: &[TokenId], limits: LookupLimits) -> Vec<Occurrence> {
        let mut found: Vec<Occurrence> = Vec::new();
        if limits.want == 0 {
            return found;
        }
        for (level, &k) in KEY_LENGTHS.iter().enumerate().rev() {
            if query.len() < k || query[query.len() - k..].contains(&BREAK) {
                continue;
            }
            let mut at = self.heads[level].get(&key_hash(k, &query[query.len() - k..])).copied();
            let mut scanned = 0;
            while let Some(end) = at.filter(|&e| e != NONE).map(|e| e as usize) {
                if scanned == limits.scan {
                    break;
                }
                scanned += 1;
                let continues = self.tokens.get(end).is_some_and(|&t| t != BREAK);
                if continues && !found.iter().any(|o| o.start == end) {
                    let len = self.match_len(end, query, limits.max_match.max(k));
                    // Shorter than the key: a hash collision, not a match.
                    if len >= k {
                        found.push(Occurrence { start: end, len: len.min(limits.max_match) });
                    }
                }
                at = Some(self.prev[level][end - 1]);
            }
            if found.len() >= limits.want {
                break;
            }
        }
        found.sort_by(|a, b| b.len.cmp(&a.len).then(b.start.cmp(&a.start)));
        found.truncate(limits.want);
        found
    }

    /// The continuation after an occurrence: up to `max` tokens from `start`, stopping at a
    /// document break or the end of the store.
    pub fn continuation(&self, start: usize, max: usize) -> &[TokenId] {
        let tail = &self.tokens[start.min(self.tokens.len())..];
        let tail = &tail[..tail.len().min(max)];
        let stop = tail.iter().position(|&t| t == BREAK).unwrap_or(tail.len());
        &tail[..stop]
    }

    /// Bytes held by the store and its levels (vector and table capacities).
    pub fn memory_bytes(&self) -> usize {
        let slot = std::mem::size_of::<(u64, u32)>() + 1;
        self.tokens.capacity() * 4
            + self.prev.iter().map(|p| p.capacity() * 4).sum::<usize>()
            + self.heads.iter().map(|h| h.capacity() * slot).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(want: usize) -> LookupLimits {
        LookupLimits { want, ..LookupLimits::default() }
    }

    #[test]
    fn finds_the_longest_earlier_match_and_its_continuation() {
        let mut ix = SuffixIndex::new();
        // "1 2 3 4 5" then "9 2 3 4 6" then the query ends in "2 3 4".
        ix.extend(&[1, 2, 3, 4, 5, 9, 2, 3, 4, 6, 7, 1, 2, 3, 4]);
        let occ = ix.lookup(ix.tokens(), limits(4));
        // "1 2 3 4" (len 4, start 4) beats "9 2 3 4" (len 3, start 9); the query's own end is
        // never a match.
        assert_eq!(occ, vec![Occurrence { start: 4, len: 4 }, Occurrence { start: 9, len: 3 }]);
        assert_eq!(ix.continuation(4, 3), &[5, 9, 2]);
    }

    #[test]
    fn breaks_stop_matches_and_continuations() {
        let mut ix = SuffixIndex::new();
        ix.extend(&[5, 6, 7, BREAK, 6, 7, 8, BREAK]);
        let occ = ix.lookup(&[6, 7], limits(4));
        // "6 7" after the break continues with 8; the first "6 7" runs into the break.
        assert_eq!(occ, vec![Occurrence { start: 6, len: 2 }]);
        assert_eq!(ix.continuation(6, 5), &[8]);
        // A query across a break in the store never matches through it.
        assert!(ix.lookup(&[7, 6, 7], limits(4)).iter().all(|o| o.len <= 2));
    }

    #[test]
    fn sync_catches_up_or_restarts() {
        let mut ix = SuffixIndex::new();
        ix.sync(&[1, 2, 3]);
        ix.sync(&[1, 2, 3, 1, 2]);
        assert_eq!(ix.tokens(), &[1, 2, 3, 1, 2]);
        assert_eq!(ix.lookup(ix.tokens(), limits(1)), vec![Occurrence { start: 2, len: 2 }]);
        ix.sync(&[4, 4]);
        assert_eq!(ix.tokens(), &[4, 4]);
        assert!(ix.lookup(ix.tokens(), limits(1)).is_empty());
    }

    #[test]
    fn match_length_is_capped_and_memory_is_counted() {
        let mut ix = SuffixIndex::new();
        let text: Vec<TokenId> = (0..100).chain(0..100).collect();
        ix.extend(&text);
        let occ = ix.lookup(&text, LookupLimits { want: 1, scan: 8, max_match: 40 });
        assert_eq!(occ, vec![Occurrence { start: 100, len: 40 }]);
        assert!(ix.memory_bytes() >= 200 * 4 * 5);
    }
}
