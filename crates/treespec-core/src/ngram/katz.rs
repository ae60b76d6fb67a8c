//! A static token trigram table with Katz back-off (the draft² of staged speculative decoding).
//!
//! Counts of unigrams, bigrams and trigrams are collected from token sequences. Seen n-grams get
//! absolutely discounted estimates, `(c − D_n) / c(context ·)`, with one discount per order from
//! the count-of-counts (Ney: `D = n1 / (n1 + 2·n2)`). The mass freed by discounting goes to the
//! tokens *not* seen after the context, in proportion to the next-lower order (Katz back-off
//! weight `α = freed / (1 − Σ_seen P_lower)`), so every conditional sums to one and unseen
//! contexts fall back to shorter ones. Unigrams spread their freed mass uniformly over the
//! vocabulary, so every token keeps a non-zero probability.
//!
//! The binary file format and its reader live in [`file`].

use std::collections::HashMap;
use std::fmt;

use crate::{Error, Result, TokenId};

mod file;

pub use file::{NGRAM_FILE_MAGIC, NGRAM_FILE_VERSION};

/// Identifies the tokenizer a table's token ids belong to. The fingerprint is the caller's (a hash
/// of the vocabulary, say); the table only compares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenizerId {
    /// Caller-defined fingerprint of the tokenizer.
    pub fingerprint: u64,
    /// Vocabulary size.
    pub vocab: u32,
}

impl fmt::Display for TokenizerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fingerprint {:#018x} with vocabulary {}", self.fingerprint, self.vocab)
    }
}

/// The tokens seen after one context, with counts.
#[derive(Debug, Clone, PartialEq)]
struct Followers {
    /// Sum of the counts: occurrences of the context followed by some token.
    total: u64,
    /// `(token, count)`, strictly ascending by token (binary search).
    by_token: Vec<(TokenId, u32)>,
    /// Indices into `by_token`, by count descending then token ascending.
    ranked: Vec<u32>,
    /// Katz back-off weight for tokens not seen after the context.
    alpha: f64,
}

impl Followers {
    fn new(by_token: Vec<(TokenId, u32)>) -> Self {
        let total = by_token.iter().map(|&(_, c)| c as u64).sum();
        let mut ranked: Vec<u32> = (0..by_token.len() as u32).collect();
        ranked.sort_by(|&a, &b| {
            let (ta, ca) = by_token[a as usize];
            let (tb, cb) = by_token[b as usize];
            cb.cmp(&ca).then(ta.cmp(&tb))
        });
        Self { total, by_token, ranked, alpha: 0.0 }
    }

    fn count(&self, w: TokenId) -> u32 {
        match self.by_token.binary_search_by_key(&w, |&(t, _)| t) {
            Ok(i) => self.by_token[i].1,
            Err(_) => 0,
        }
    }

    fn ranked_tokens(&self) -> impl Iterator<Item = TokenId> + '_ {
        self.ranked.iter().map(move |&i| self.by_token[i as usize].0)
    }
}

/// A trigram table with Katz back-off (see the module docs).
#[derive(Clone, PartialEq)]
pub struct NgramTable {
    tokenizer: TokenizerId,
    /// Absolute discounts for unigrams, bigrams, trigrams.
    discounts: [f64; 3],
    /// Unigram count per token id.
    unigram: Vec<u32>,
    unigram_total: u64,
    unigram_seen: u64,
    /// Seen tokens by count descending, token ascending.
    unigram_ranked: Vec<TokenId>,
    bigrams: HashMap<TokenId, Followers>,
    trigrams: HashMap<(TokenId, TokenId), Followers>,
}

impl fmt::Debug for NgramTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NgramTable")
            .field("tokenizer", &self.tokenizer)
            .field("discounts", &self.discounts)
            .field("tokens", &self.unigram_total)
            .field("bigram_contexts", &self.bigrams.len())
            .field("trigram_contexts", &self.trigrams.len())
            .finish()
    }
}

impl NgramTable {
    /// Count the n-grams of `sequences` (each one a separate text: no n-gram spans two) and
    /// estimate the back-off model. Every token must lie inside `tokenizer.vocab`.
    pub fn build<I, S>(sequences: I, tokenizer: TokenizerId) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[TokenId]>,
    {
        let vocab = tokenizer.vocab as usize;
        if vocab == 0 {
            return Err(Error::EmptyVocab);
        }
        let mut unigram = vec![0u32; vocab];
        let mut bi: HashMap<(TokenId, TokenId), u32> = HashMap::new();
        let mut tri: HashMap<(TokenId, TokenId, TokenId), u32> = HashMap::new();
        for seq in sequences {
            let seq = seq.as_ref();
            if let Some(&t) = seq.iter().find(|&&t| t as usize >= vocab) {
                return Err(Error::TokenOutOfRange { token: t, vocab });
            }
            for &t in seq {
                unigram[t as usize] = unigram[t as usize].saturating_add(1);
            }
            for w in seq.windows(2) {
                let c = bi.entry((w[0], w[1])).or_default();
                *c = c.saturating_add(1);
            }
            for w in seq.windows(3) {
                let c = tri.entry((w[0], w[1], w[2])).or_default();
                *c = c.saturating_add(1);
            }
        }
        let discounts = [
            ney_discount(unigram.iter().copied()),
            ney_discount(bi.values().copied()),
            ney_discount(tri.values().copied()),
        ];
        let mut bigrams: HashMap<TokenId, Vec<(TokenId, u32)>> = HashMap::new();
        for ((v, w), c) in bi {
            bigrams.entry(v).or_default().push((w, c));
        }
        let mut trigrams: HashMap<(TokenId, TokenId), Vec<(TokenId, u32)>> = HashMap::new();
        for ((u, v, w), c) in tri {
            trigrams.entry((u, v)).or_default().push((w, c));
        }
        for list in bigrams.values_mut().chain(trigrams.values_mut()) {
            list.sort_unstable();
        }
        Ok(Self::assemble(tokenizer, discounts, unigram, bigrams, trigrams))
    }

    /// Derive totals, rankings and back-off weights from counts (shared by build and load).
    fn assemble(
        tokenizer: TokenizerId,
        discounts: [f64; 3],
        unigram: Vec<u32>,
        bigrams: HashMap<TokenId, Vec<(TokenId, u32)>>,
        trigrams: HashMap<(TokenId, TokenId), Vec<(TokenId, u32)>>,
    ) -> Self {
        let unigram_total = unigram.iter().map(|&c| c as u64).sum();
        let unigram_seen = unigram.iter().filter(|&&c| c > 0).count() as u64;
        let mut unigram_ranked: Vec<TokenId> =
            (0..unigram.len() as TokenId).filter(|&t| unigram[t as usize] > 0).collect();
        unigram_ranked.sort_by(|&a, &b| unigram[b as usize].cmp(&unigram[a as usize]).then(a.cmp(&b)));
        let mut table = Self {
            tokenizer,
            discounts,
            unigram,
            unigram_total,
            unigram_seen,
            unigram_ranked,
            bigrams: bigrams.into_iter().map(|(v, l)| (v, Followers::new(l))).collect(),
            trigrams: trigrams.into_iter().map(|(k, l)| (k, Followers::new(l))).collect(),
        };
        // Bigram weights need only unigrams; trigram weights need the finished bigrams.
        let alphas: Vec<(TokenId, f64)> = table
            .bigrams
            .iter()
            .map(|(&v, f)| (v, backoff_weight(f, discounts[1], |w| table.p1(w))))
            .collect();
        for (v, a) in alphas {
            table.bigrams.get_mut(&v).expect("key from the same map").alpha = a;
        }
        let alphas: Vec<((TokenId, TokenId), f64)> = table
            .trigrams
            .iter()
            .map(|(&(u, v), f)| ((u, v), backoff_weight(f, discounts[2], |w| table.p2(Some(v), w))))
            .collect();
        for (k, a) in alphas {
            table.trigrams.get_mut(&k).expect("key from the same map").alpha = a;
        }
        table
    }

    /// The tokenizer the table was built for.
    pub fn tokenizer(&self) -> TokenizerId {
        self.tokenizer
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.unigram.len()
    }

    /// The absolute discounts of unigrams, bigrams and trigrams.
    pub fn discounts(&self) -> [f64; 3] {
        self.discounts
    }

    /// Tokens counted.
    pub fn total_tokens(&self) -> u64 {
        self.unigram_total
    }

    /// Distinct bigram and trigram contexts (tokens / token pairs followed by something).
    pub fn contexts(&self) -> (usize, usize) {
        (self.bigrams.len(), self.trigrams.len())
    }

    /// `P(w | u v)`, `u` the older token. 0 for a token outside the vocabulary.
    pub fn prob(&self, u: TokenId, v: TokenId, w: TokenId) -> f64 {
        self.p3(Some(u), Some(v), w)
    }

    /// `P(w | context)` using the last two tokens of `context` (fewer at the start of a text).
    pub fn prob_after(&self, context: &[TokenId], w: TokenId) -> f64 {
        let (u, v) = last_two(context);
        self.p3(u, v, w)
    }

    /// The `k` most probable next tokens after `u v` with their probabilities, best first (ties
    /// towards the lower id).
    pub fn top_next(&self, u: TokenId, v: TokenId, k: usize) -> Vec<(TokenId, f64)> {
        self.top(Some(u), Some(v), k)
    }

    /// [`NgramTable::top_next`] after the last two tokens of `context` (fewer at the start).
    pub fn top_next_after(&self, context: &[TokenId], k: usize) -> Vec<(TokenId, f64)> {
        let (u, v) = last_two(context);
        self.top(u, v, k)
    }

    /// The most probable continuation of `context`, `len` tokens long, each token the table's
    /// top choice after the previous two (a draft² proposal chain).
    pub fn greedy_chain(&self, context: &[TokenId], len: usize) -> Vec<TokenId> {
        let (mut u, mut v) = last_two(context);
        let mut out = Vec::with_capacity(len);
        for _ in 0..len {
            let Some(&(w, _)) = self.top(u, v, 1).first() else { break };
            out.push(w);
            (u, v) = (v, Some(w));
        }
        out
    }

    fn p1(&self, w: TokenId) -> f64 {
        let vocab = self.unigram.len() as f64;
        let Some(&c) = self.unigram.get(w as usize) else { return 0.0 };
        if self.unigram_total == 0 {
            return 1.0 / vocab;
        }
        let n = self.unigram_total as f64;
        let d = self.discounts[0];
        (c as f64 - d).max(0.0) / n + d * self.unigram_seen as f64 / (n * vocab)
    }

    fn p2(&self, v: Option<TokenId>, w: TokenId) -> f64 {
        match v.and_then(|v| self.bigrams.get(&v)) {
            Some(f) => discounted(f, self.discounts[1], w).unwrap_or_else(|| f.alpha * self.p1(w)),
            None => self.p1(w),
        }
    }

    fn p3(&self, u: Option<TokenId>, v: Option<TokenId>, w: TokenId) -> f64 {
        if w as usize >= self.unigram.len() {
            return 0.0;
        }
        let ctx = match (u, v) {
            (Some(u), Some(v)) => self.trigrams.get(&(u, v)),
            _ => None,
        };
        match ctx {
            Some(f) => discounted(f, self.discounts[2], w).unwrap_or_else(|| f.alpha * self.p2(v, w)),
            None => self.p2(v, w),
        }
    }

    /// Exact top-k of `P(· | u v)`. Within each back-off level probabilities are monotone in the
    /// level's counts, so the answer lies among the k best seen trigram followers, the k best
    /// bigram followers not seen as trigram followers, and the k best remaining unigrams.
    fn top(&self, u: Option<TokenId>, v: Option<TokenId>, k: usize) -> Vec<(TokenId, f64)> {
        if k == 0 {
            return Vec::new();
        }
        let f3 = match (u, v) {
            (Some(u), Some(v)) => self.trigrams.get(&(u, v)),
            _ => None,
        };
        let f2 = v.and_then(|v| self.bigrams.get(&v));
        let in3 = |w: TokenId| f3.is_some_and(|f| f.count(w) > 0);
        let in2 = |w: TokenId| f2.is_some_and(|f| f.count(w) > 0);
        let mut cand: Vec<TokenId> = Vec::with_capacity(3 * k);
        if let Some(f) = f3 {
            cand.extend(f.ranked_tokens().take(k));
        }
        if let Some(f) = f2 {
            cand.extend(f.ranked_tokens().filter(|&w| !in3(w)).take(k));
        }
        let unseen = (0..self.unigram.len() as TokenId).filter(|&w| self.unigram[w as usize] == 0);
        cand.extend(
            self.unigram_ranked.iter().copied().chain(unseen).filter(|&w| !in3(w) && !in2(w)).take(k),
        );
        let mut scored: Vec<(TokenId, f64)> = cand.into_iter().map(|w| (w, self.p3(u, v, w))).collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        scored.truncate(k);
        scored
    }
}

/// `(c − D) / total` for a seen follower, `None` for an unseen one.
fn discounted(f: &Followers, d: f64, w: TokenId) -> Option<f64> {
    let c = f.count(w);
    (c > 0).then(|| (c as f64 - d).max(0.0) / f.total as f64)
}

/// Katz weight: the mass freed by discounting the seen followers, spread over the unseen ones in
/// proportion to the lower order. 0 when the lower order leaves them no mass (then every token was
/// seen, and nothing needs it).
fn backoff_weight(f: &Followers, d: f64, lower: impl Fn(TokenId) -> f64) -> f64 {
    let freed = f.by_token.iter().map(|&(_, c)| (c as f64).min(d)).sum::<f64>() / f.total as f64;
    let covered: f64 = f.by_token.iter().map(|&(w, _)| lower(w)).sum();
    let left = 1.0 - covered;
    if left <= 1e-12 {
        0.0
    } else {
        freed / left
    }
}

/// Ney's absolute discount from count-of-counts, clamped to a sane range (0.5 without data).
fn ney_discount(counts: impl Iterator<Item = u32>) -> f64 {
    let (mut n1, mut n2) = (0u64, 0u64);
    for c in counts {
        match c {
            1 => n1 += 1,
            2 => n2 += 1,
            _ => {}
        }
    }
    if n1 + n2 == 0 {
        0.5
    } else {
        (n1 as f64 / (n1 + 2 * n2) as f64).clamp(0.1, 0.9)
    }
}

fn last_two(context: &[TokenId]) -> (Option<TokenId>, Option<TokenId>) {
    let n = context.len();
    let v = context.last().copied();
    let u = if n >= 2 { Some(context[n - 2]) } else { None };
    (u, v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use file::{fnv1a, HEADER_LEN, TRAILER_LEN};

    const TOK: TokenizerId = TokenizerId { fingerprint: 0xfeed_beef, vocab: 12 };

    fn corpus() -> Vec<Vec<TokenId>> {
        vec![
            vec![1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4],
            vec![6, 7, 8, 6, 7, 9, 6, 7, 8],
            vec![1, 2, 6, 7, 8, 3, 4],
            vec![10],
        ]
    }

    #[test]
    fn conditionals_sum_to_one_and_back_off() {
        let t = NgramTable::build(corpus(), TOK).unwrap();
        let contexts = [(1, 2), (2, 3), (6, 7), (11, 11), (3, 4), (0, 1), (7, 8)];
        for (u, v) in contexts {
            let s: f64 = (0..12).map(|w| t.prob(u, v, w)).sum();
            assert!((s - 1.0).abs() < 1e-9, "P(·|{u} {v}) sums to {s}");
            assert!((0..12).all(|w| t.prob(u, v, w) > 0.0), "every token keeps some mass");
        }
        for ctx in [&[][..], &[3][..], &[11][..]] {
            let s: f64 = (0..12).map(|w| t.prob_after(ctx, w)).sum();
            assert!((s - 1.0).abs() < 1e-9);
        }
        // "1 2" was followed by 3 three times and by 6 once.
        assert!(t.prob(1, 2, 3) > t.prob(1, 2, 6));
        assert!(t.prob(1, 2, 6) > t.prob(1, 2, 9));
        // An unseen context backs off to the bigram of its last token.
        assert_eq!(t.prob(11, 2, 3), t.prob_after(&[2], 3));
        assert_eq!(t.prob(0, 1, 99), 0.0);
    }

    #[test]
    fn top_next_is_the_exact_top_k() {
        let t = NgramTable::build(corpus(), TOK).unwrap();
        for (u, v) in [(1, 2), (2, 3), (6, 7), (11, 11), (4, 1), (7, 9)] {
            for k in [1, 2, 3, 5, 12, 20] {
                let top = t.top_next(u, v, k);
                let mut all: Vec<(TokenId, f64)> = (0..12).map(|w| (w, t.prob(u, v, w))).collect();
                all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                all.truncate(k);
                assert_eq!(top, all, "context {u} {v}, k {k}");
            }
        }
        assert_eq!(t.top_next(1, 2, 1)[0].0, 3);
        assert_eq!(t.greedy_chain(&[1, 2], 2), vec![3, 4]);
        assert_eq!(t.greedy_chain(&[1, 2], 5).len(), 5);
        assert!(t.top_next(1, 2, 0).is_empty());
    }

    #[test]
    fn file_round_trip() {
        let t = NgramTable::build(corpus(), TOK).unwrap();
        let bytes = t.to_bytes();
        assert_eq!(&bytes[..8], b"TSNGRAM\0");
        let back = NgramTable::from_bytes(&bytes, TOK).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.to_bytes(), bytes, "serialisation is deterministic");
        let dir = std::env::temp_dir().join(format!("treespec-ngram-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.ngram");
        t.save(&path).unwrap();
        assert_eq!(NgramTable::load(&path, TOK).unwrap(), t);
        let err = NgramTable::load(&dir.join("missing"), TOK).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn another_tokenizer_is_an_error_naming_both() {
        let t = NgramTable::build(corpus(), TOK).unwrap();
        let other = TokenizerId { fingerprint: 0x1234, vocab: 12 };
        let err = NgramTable::from_bytes(&t.to_bytes(), other).unwrap_err().to_string();
        assert!(err.contains("0x00000000feedbeef") && err.contains("0x0000000000001234"), "{err}");
        let bigger = TokenizerId { vocab: 13, ..TOK };
        let err = NgramTable::from_bytes(&t.to_bytes(), bigger).unwrap_err().to_string();
        assert!(err.contains("vocabulary 12") && err.contains("vocabulary 13"), "{err}");
    }

    #[test]
    fn corrupt_and_truncated_files_are_errors() {
        let t = NgramTable::build(corpus(), TOK).unwrap();
        let bytes = t.to_bytes();
        for cut in [0, 7, 20, HEADER_LEN, HEADER_LEN + 9, bytes.len() / 2, bytes.len() - 1] {
            assert!(NgramTable::from_bytes(&bytes[..cut], TOK).is_err(), "cut at {cut}");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x41;
            assert!(NgramTable::from_bytes(&b, TOK).is_err(), "flipped byte {i}");
        }
        let mut b = bytes.clone();
        b[8] = 9;
        assert!(NgramTable::from_bytes(&b, TOK).unwrap_err().to_string().contains("version 9"));
        // A well-checksummed file with bad content is still refused: re-seal a tampered body.
        let reseal = |mut body: Vec<u8>| {
            body.truncate(body.len() - TRAILER_LEN);
            let s = fnv1a(&body);
            body.extend_from_slice(&s.to_le_bytes());
            body
        };
        let mut b = bytes.clone();
        let first_unigram = HEADER_LEN + 4;
        b[first_unigram..first_unigram + 4].copy_from_slice(&99u32.to_le_bytes());
        assert!(NgramTable::from_bytes(&reseal(b), TOK).unwrap_err().to_string().contains("outside"));
        let mut b = bytes.clone();
        b[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(NgramTable::from_bytes(&reseal(b), TOK).is_err());
        let mut b = bytes.clone();
        b.splice(bytes.len() - TRAILER_LEN..bytes.len() - TRAILER_LEN, [0u8; 4]);
        assert!(NgramTable::from_bytes(&reseal(b), TOK).unwrap_err().to_string().contains("unexpected"));
        let mut b = bytes.clone();
        b[..8].copy_from_slice(b"GGUF\0\0\0\0");
        assert!(NgramTable::from_bytes(&b, TOK).unwrap_err().to_string().contains("magic"));
    }

    #[test]
    fn bad_build_inputs_are_errors() {
        assert_eq!(
            NgramTable::build([vec![1u32, 12]], TOK).unwrap_err(),
            Error::TokenOutOfRange { token: 12, vocab: 12 }
        );
        assert!(NgramTable::build([vec![0u32]], TokenizerId { fingerprint: 0, vocab: 0 }).is_err());
        // An empty corpus is a uniform model.
        let t = NgramTable::build(Vec::<Vec<TokenId>>::new(), TOK).unwrap();
        assert!((t.prob(0, 1, 2) - 1.0 / 12.0).abs() < 1e-12);
        assert_eq!(t.top_next(0, 1, 2), vec![(0, 1.0 / 12.0), (1, 1.0 / 12.0)]);
    }
}
