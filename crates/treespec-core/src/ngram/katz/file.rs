//! Storing an [`NgramTable`] in a small binary file tied to its tokenizer.
//!
//! Format (version 1, all integers little-endian):
//!
//! ```text
//! magic        8 bytes  "TSNGRAM\0"
//! version      u32      1
//! fingerprint  u64      tokenizer fingerprint (chosen by the caller)
//! vocab        u32      tokenizer vocabulary size
//! discounts    3 × f64  D1, D2, D3, each in (0, 1)
//! unigrams     u32 n, then n × (token u32, count u32), tokens strictly ascending
//! bigrams      u32 n contexts, each: v u32, m u32, m × (w u32, count u32), v and w ascending
//! trigrams     u32 n contexts, each: u u32, v u32, m u32, m × (w u32, count u32), (u, v) and w ascending
//! checksum     u64      FNV-1a of every byte before it
//! ```
//!
//! Only counts are stored; the back-off weights are recomputed on load, so a file cannot carry
//! weights inconsistent with its counts. Loading checks the magic, version, checksum and the
//! tokenizer, then every count and ordering, and reports any problem as an [`Error`].

use std::collections::HashMap;
use std::path::Path;

use super::{Followers, NgramTable, TokenizerId};
use crate::{Error, Result, TokenId};

/// First bytes of an n-gram table file.
pub const NGRAM_FILE_MAGIC: [u8; 8] = *b"TSNGRAM\0";
/// Version of the file format written by [`NgramTable::save`].
pub const NGRAM_FILE_VERSION: u32 = 1;

/// Magic + version + fingerprint + vocab + three discounts.
pub(super) const HEADER_LEN: usize = 8 + 4 + 8 + 4 + 3 * 8;
pub(super) const TRAILER_LEN: usize = 8;

impl NgramTable {
    /// Serialise in the documented file format.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&NGRAM_FILE_MAGIC);
        put_u32(&mut out, NGRAM_FILE_VERSION);
        out.extend_from_slice(&self.tokenizer.fingerprint.to_le_bytes());
        put_u32(&mut out, self.tokenizer.vocab);
        for d in self.discounts {
            out.extend_from_slice(&d.to_le_bytes());
        }
        let seen: Vec<(TokenId, u32)> = (0..self.unigram.len() as TokenId)
            .map(|t| (t, self.unigram[t as usize]))
            .filter(|&(_, c)| c > 0)
            .collect();
        put_len(&mut out, seen.len());
        put_pairs(&mut out, &seen);
        let mut bi: Vec<(&TokenId, &Followers)> = self.bigrams.iter().collect();
        bi.sort_by_key(|&(v, _)| *v);
        put_len(&mut out, bi.len());
        for (&v, f) in bi {
            put_u32(&mut out, v);
            put_len(&mut out, f.by_token.len());
            put_pairs(&mut out, &f.by_token);
        }
        let mut tri: Vec<(&(TokenId, TokenId), &Followers)> = self.trigrams.iter().collect();
        tri.sort_by_key(|&(k, _)| *k);
        put_len(&mut out, tri.len());
        for (&(u, v), f) in tri {
            put_u32(&mut out, u);
            put_u32(&mut out, v);
            put_len(&mut out, f.by_token.len());
            put_pairs(&mut out, &f.by_token);
        }
        let sum = fnv1a(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Parse a table written by [`NgramTable::to_bytes`] for the tokenizer `expected`.
    pub fn from_bytes(bytes: &[u8], expected: TokenizerId) -> Result<Self> {
        if bytes.len() < HEADER_LEN + TRAILER_LEN {
            return Err(corrupt(format!(
                "{} bytes is shorter than the {}-byte header and checksum (truncated?)",
                bytes.len(),
                HEADER_LEN + TRAILER_LEN
            )));
        }
        if bytes[..8] != NGRAM_FILE_MAGIC {
            return Err(Error::Invalid("not a treespec n-gram table (bad magic bytes)".into()));
        }
        let mut r = Reader { buf: &bytes[..bytes.len() - TRAILER_LEN], pos: 8 };
        let version = r.u32()?;
        if version != NGRAM_FILE_VERSION {
            return Err(Error::Invalid(format!(
                "n-gram table format version {version} is not supported (this build reads version {NGRAM_FILE_VERSION})"
            )));
        }
        let (body, trailer) = bytes.split_at(bytes.len() - TRAILER_LEN);
        let stored = u64::from_le_bytes(trailer.try_into().expect("8-byte trailer"));
        if fnv1a(body) != stored {
            return Err(corrupt("checksum mismatch (the file is damaged or truncated)".into()));
        }
        let found = TokenizerId { fingerprint: r.u64()?, vocab: r.u32()? };
        if found != expected {
            return Err(Error::Invalid(format!(
                "n-gram table was built for the tokenizer with {found}, but the current tokenizer has {expected}; \
                 rebuild the table with this tokenizer"
            )));
        }
        let vocab = found.vocab as usize;
        if vocab == 0 {
            return Err(Error::EmptyVocab);
        }
        let mut discounts = [0f64; 3];
        for (i, d) in discounts.iter_mut().enumerate() {
            *d = r.f64()?;
            if !(d.is_finite() && *d > 0.0 && *d < 1.0) {
                return Err(corrupt(format!("discount D{} = {d} is outside (0, 1)", i + 1)));
            }
        }
        let mut unigram = vec![0u32; vocab];
        let n = r.len(8)?;
        let pairs = r.pairs(n, vocab)?;
        for (t, c) in pairs {
            unigram[t as usize] = c;
        }
        let bigrams = read_bigrams(&mut r, vocab, &unigram)?;
        let trigrams = read_trigrams(&mut r, vocab, &bigrams)?;
        if r.pos != r.buf.len() {
            return Err(corrupt(format!("{} unexpected bytes after the trigrams", r.buf.len() - r.pos)));
        }
        Ok(Self::assemble(found, discounts, unigram, bigrams, trigrams))
    }

    /// Write the table to `path` (through a temporary file renamed into place, so a crash never
    /// leaves a half-written table under the real name).
    pub fn save(&self, path: &Path) -> Result<()> {
        let io =
            |e: std::io::Error| Error::Invalid(format!("cannot write n-gram table {}: {e}", path.display()));
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        std::fs::write(&tmp, self.to_bytes()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Read a table from `path`; it must have been built for the tokenizer `expected`.
    pub fn load(path: &Path, expected: TokenizerId) -> Result<Self> {
        let bytes = std::fs::read(path)
            .map_err(|e| Error::Invalid(format!("cannot read n-gram table {}: {e}", path.display())))?;
        Self::from_bytes(&bytes, expected).map_err(|e| match e {
            Error::Invalid(m) => Error::Invalid(format!("{}: {m}", path.display())),
            other => other,
        })
    }
}

fn put_u32(out: &mut Vec<u8>, x: u32) {
    out.extend_from_slice(&x.to_le_bytes());
}

fn put_len(out: &mut Vec<u8>, n: usize) {
    // Counts of distinct n-grams of a vocabulary indexed by u32 fit in u32 for any real corpus.
    put_u32(out, u32::try_from(n).expect("fewer than 2^32 entries per section"));
}

fn put_pairs(out: &mut Vec<u8>, pairs: &[(TokenId, u32)]) {
    for &(t, c) in pairs {
        put_u32(out, t);
        put_u32(out, c);
    }
}

/// Followers (token, count) of each bigram context `v`, as the file stores them.
type Bigrams = HashMap<TokenId, Vec<(TokenId, u32)>>;
/// Followers (token, count) of each trigram context `(u, v)`, as the file stores them.
type Trigrams = HashMap<(TokenId, TokenId), Vec<(TokenId, u32)>>;

/// A file whose content is inconsistent.
fn corrupt(m: String) -> Error {
    Error::Invalid(format!("corrupt n-gram table: {m}"))
}

/// The bigram section: contexts ascending, every token with a unigram count.
fn read_bigrams(r: &mut Reader<'_>, vocab: usize, unigram: &[u32]) -> Result<Bigrams> {
    let n = r.len(8)?;
    let mut bigrams: HashMap<TokenId, Vec<(TokenId, u32)>> = HashMap::with_capacity(n);
    let mut prev: Option<TokenId> = None;
    for _ in 0..n {
        let v = r.token(vocab)?;
        if prev.is_some_and(|p| p >= v) {
            return Err(corrupt(format!("bigram context {v} out of order")));
        }
        prev = Some(v);
        let m = r.len(8)?;
        let list = r.pairs(m, vocab)?;
        if unigram[v as usize] == 0 || list.iter().any(|&(w, _)| unigram[w as usize] == 0) {
            return Err(corrupt(format!("bigram after {v} uses a token with no unigram count")));
        }
        bigrams.insert(v, list);
    }
    Ok(bigrams)
}

/// The trigram section: contexts ascending, every trigram backed by its bigram.
fn read_trigrams(r: &mut Reader<'_>, vocab: usize, bigrams: &Bigrams) -> Result<Trigrams> {
    let n = r.len(12)?;
    let mut trigrams: HashMap<(TokenId, TokenId), Vec<(TokenId, u32)>> = HashMap::with_capacity(n);
    let mut prev: Option<(TokenId, TokenId)> = None;
    for _ in 0..n {
        let key = (r.token(vocab)?, r.token(vocab)?);
        if prev.is_some_and(|p| p >= key) {
            return Err(corrupt(format!("trigram context {key:?} out of order")));
        }
        prev = Some(key);
        let m = r.len(8)?;
        let list = r.pairs(m, vocab)?;
        let Some(bl) = bigrams.get(&key.1) else {
            return Err(corrupt(format!("trigram context {key:?} has no bigram context {}", key.1)));
        };
        if list.iter().any(|&(w, _)| bl.binary_search_by_key(&w, |&(t, _)| t).is_err()) {
            return Err(corrupt(format!("trigram after {key:?} has no matching bigram")));
        }
        trigrams.insert(key, list);
    }
    Ok(trigrams)
}

/// 64-bit FNV-1a: enough to catch damaged or truncated files (not an adversarial check).
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Bounds-checked little-endian reader: running off the end is an error, never a panic.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.buf.len() - self.pos < n {
            return Err(Error::Invalid(format!(
                "corrupt n-gram table: truncated at byte {} (needed {n} more bytes)",
                self.pos
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn f64(&mut self) -> Result<f64> {
        Ok(f64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn token(&mut self, vocab: usize) -> Result<TokenId> {
        let t = self.u32()?;
        if t as usize >= vocab {
            return Err(Error::Invalid(format!(
                "corrupt n-gram table: token {t} at byte {} is outside the vocabulary of {vocab}",
                self.pos - 4
            )));
        }
        Ok(t)
    }

    /// A section length whose entries take at least `item` bytes each; checked against the bytes
    /// left before anything is allocated.
    fn len(&mut self, item: usize) -> Result<usize> {
        let n = self.u32()? as usize;
        if n.saturating_mul(item) > self.buf.len() - self.pos {
            return Err(Error::Invalid(format!(
                "corrupt n-gram table: {n} entries at byte {} do not fit in the file (truncated?)",
                self.pos - 4
            )));
        }
        Ok(n)
    }

    /// `n` `(token, count)` pairs, tokens strictly ascending, counts > 0.
    fn pairs(&mut self, n: usize, vocab: usize) -> Result<Vec<(TokenId, u32)>> {
        let mut out: Vec<(TokenId, u32)> = Vec::with_capacity(n);
        for _ in 0..n {
            let t = self.token(vocab)?;
            let c = self.u32()?;
            if c == 0 || out.last().is_some_and(|&(p, _)| p >= t) {
                return Err(Error::Invalid(format!(
                    "corrupt n-gram table: entry ({t}, {c}) at byte {} is zero or out of order",
                    self.pos - 8
                )));
            }
            out.push((t, c));
        }
        Ok(out)
    }
}
