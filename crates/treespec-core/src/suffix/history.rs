//! The global history: every earlier request's prompt and output, in one bounded match index
//! shared by every request a process serves (and, saved to a file, by a CLI user's next runs).
//!
//! Memory is bounded by a cap on stored tokens. When a new document would pass it, the oldest
//! documents are dropped until the store is at three quarters of the cap and the index is rebuilt
//! from what is left: a rebuild costs O(cap) once every cap/4 tokens, so O(1) per token amortised,
//! and no stale entry ever survives an eviction.

use std::collections::VecDeque;
use std::path::Path;

use super::index::{LookupLimits, Occurrence, SuffixIndex, BREAK, MAX_STORE_TOKENS};
use crate::ngram::TokenizerId;
use crate::{Error, Result, TokenId};

/// File magic of a saved history (format version 1).
const MAGIC: &[u8; 8] = b"TSSUFH01";

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

    /// The bytes of a saved history (what [`Self::from_bytes`] reads back).
    pub fn to_bytes(&self, tokenizer: TokenizerId) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(32 + self.index.len() * 4 + self.docs.len() * 12);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&tokenizer.fingerprint.to_le_bytes());
        bytes.extend_from_slice(&tokenizer.vocab.to_le_bytes());
        bytes.extend_from_slice(&(self.docs.len() as u64).to_le_bytes());
        for (prompt_key, text) in self.documents() {
            bytes.extend_from_slice(&prompt_key.to_le_bytes());
            bytes.extend_from_slice(&(text.len() as u32).to_le_bytes());
            for &t in text {
                bytes.extend_from_slice(&t.to_le_bytes());
            }
        }
        bytes
    }

    /// The documents held, oldest first: each one's prompt key and text.
    pub fn documents(&self) -> impl Iterator<Item = (u64, &[TokenId])> + '_ {
        self.docs.iter().map(|d| (d.prompt_key, &self.index.tokens()[d.start..d.start + d.len]))
    }

    /// Read a history written by [`Self::save`] for the same tokenizer, into a history capped at
    /// `cap_tokens` (older documents past the cap are dropped). Every malformed file is an error
    /// naming the problem.
    pub fn load(path: &Path, tokenizer: TokenizerId, cap_tokens: usize) -> Result<Self> {
        let bytes =
            std::fs::read(path).map_err(|e| Error::Invalid(format!("reading {}: {e}", path.display())))?;
        // An empty file (made with `touch` before its permissions are set) is an empty history.
        if bytes.is_empty() {
            return Self::new(cap_tokens);
        }
        Self::from_bytes(&bytes, tokenizer, cap_tokens)
            .map_err(|e| Error::Invalid(format!("suffix history {}: {e}", path.display())))
    }

    /// Parse the bytes of a saved history (see [`Self::load`]).
    pub fn from_bytes(bytes: &[u8], tokenizer: TokenizerId, cap_tokens: usize) -> Result<Self> {
        let mut out = Self::new(cap_tokens)?;
        for (key, text) in Self::documents_in(bytes, tokenizer)? {
            out.add(key, &text);
        }
        Ok(out)
    }

    /// The documents of a saved history (prompt key and text each), checked, in the format
    /// [`Self::to_bytes`] writes: magic, the tokenizer (fingerprint, vocabulary), the number of
    /// documents, then each one's prompt key, length and tokens, all little-endian.
    pub fn documents_in(bytes: &[u8], tokenizer: TokenizerId) -> Result<Vec<(u64, Vec<TokenId>)>> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(8)? != MAGIC {
            return Err(Error::Invalid("not a treespec suffix history (bad magic)".into()));
        }
        let found = TokenizerId { fingerprint: r.u64()?, vocab: r.u32()? };
        if found != tokenizer {
            return Err(Error::Invalid(format!(
                "written for the tokenizer with {found}, but the model's is {tokenizer}"
            )));
        }
        let count = r.u64()?;
        let mut docs = Vec::new();
        for i in 0..count {
            let key = r.u64()?;
            let len = r.u32()? as usize;
            let raw =
                r.take(len.checked_mul(4).ok_or_else(|| Error::Invalid("document too long".into()))?)?;
            let text: Vec<TokenId> =
                raw.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            if let Some(&t) = text.iter().find(|&&t| t >= tokenizer.vocab) {
                return Err(Error::Invalid(format!(
                    "document {i} holds token {t}, outside the vocabulary of {}",
                    tokenizer.vocab
                )));
            }
            docs.push((key, text));
        }
        if r.at != bytes.len() {
            return Err(Error::Invalid(format!(
                "{} trailing bytes after the last document",
                bytes.len() - r.at
            )));
        }
        Ok(docs)
    }
}

/// A bounds-checked little-endian reader.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| {
            Error::Invalid(format!(
                "truncated: wanted {n} bytes at offset {} of {}",
                self.at,
                self.bytes.len()
            ))
        })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOK: TokenizerId = TokenizerId { fingerprint: 7, vocab: 1000 };

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

    #[test]
    fn an_empty_file_loads_as_an_empty_history() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let h = GlobalHistory::load(file.path(), TOK, 1000).unwrap();
        assert_eq!((h.docs(), h.tokens()), (0, 0));
    }

    #[test]
    fn saves_and_loads_and_refuses_bad_files() {
        let dir = std::env::temp_dir().join(format!("treespec-suffix-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("h.bin");
        let mut h = GlobalHistory::new(1000).unwrap();
        h.add(3, &[1, 2, 3, 4]);
        h.add(4, &[9, 9, 1, 2, 3, 7]);
        h.save(&path, TOK).unwrap();
        let back = GlobalHistory::load(&path, TOK, 1000).unwrap();
        assert_eq!(back.index().tokens(), h.index().tokens());
        assert_eq!(back.lookup(&[1, 2, 3], LookupLimits::default(), Some(4)).len(), 1);

        let bytes = std::fs::read(&path).unwrap();
        let other = TokenizerId { fingerprint: 8, vocab: 1000 };
        assert!(GlobalHistory::from_bytes(&bytes, other, 1000)
            .unwrap_err()
            .to_string()
            .contains("tokenizer"));
        for cut in [0, 7, 20, bytes.len() - 1] {
            assert!(GlobalHistory::from_bytes(&bytes[..cut], TOK, 1000).is_err(), "cut at {cut}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(GlobalHistory::from_bytes(&extra, TOK, 1000).unwrap_err().to_string().contains("trailing"));
        let small = TokenizerId { fingerprint: 7, vocab: 5 };
        let mut wrong_vocab = bytes.clone();
        wrong_vocab[16..20].copy_from_slice(&5u32.to_le_bytes());
        assert!(GlobalHistory::from_bytes(&wrong_vocab, small, 1000)
            .unwrap_err()
            .to_string()
            .contains("vocabulary"));
        assert!(GlobalHistory::new(0).is_err() && GlobalHistory::new(1).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
