//! The format of a saved suffix history: magic (`TSSUFH01`, format version 1), the tokenizer
//! (fingerprint, vocabulary), the number of documents, then each one's prompt key, length and
//! tokens, all little-endian ([`to_bytes`], [`documents_in`]); and a history read from a file
//! ([`load`]: an empty file is an empty history).

use std::path::Path;

use treespec_core::ngram::TokenizerId;
use treespec_core::suffix::GlobalHistory;
use treespec_core::{Error, Result, TokenId};

/// File magic of a saved history (format version 1).
const MAGIC: &[u8; 8] = b"TSSUFH01";

/// The bytes of a saved history (what [`from_bytes`] reads back).
pub fn to_bytes(history: &GlobalHistory, tokenizer: TokenizerId) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(32 + history.index().len() * 4 + history.docs() * 12);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&tokenizer.fingerprint.to_le_bytes());
    bytes.extend_from_slice(&tokenizer.vocab.to_le_bytes());
    bytes.extend_from_slice(&(history.docs() as u64).to_le_bytes());
    for (prompt_key, text) in history.documents() {
        bytes.extend_from_slice(&prompt_key.to_le_bytes());
        bytes.extend_from_slice(&(text.len() as u32).to_le_bytes());
        for &t in text {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
    }
    bytes
}

/// Read a history written by [`super::save_history`] (or a [`super::HistoryFile`]) for the
/// same tokenizer, into a history capped at `cap_tokens` (older documents past the cap are
/// dropped). Every malformed file is an error naming the problem.
pub fn load(path: &Path, tokenizer: TokenizerId, cap_tokens: usize) -> Result<GlobalHistory> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::Invalid(format!("reading {}: {e}", path.display())))?;
    // An empty file (made with `touch` before its permissions are set) is an empty history.
    if bytes.is_empty() {
        return GlobalHistory::new(cap_tokens);
    }
    from_bytes(&bytes, tokenizer, cap_tokens)
        .map_err(|e| Error::Invalid(format!("suffix history {}: {e}", path.display())))
}

/// Parse the bytes of a saved history (see [`load`]).
pub fn from_bytes(bytes: &[u8], tokenizer: TokenizerId, cap_tokens: usize) -> Result<GlobalHistory> {
    let mut out = GlobalHistory::new(cap_tokens)?;
    for (key, text) in documents_in(bytes, tokenizer)? {
        out.add(key, &text);
    }
    Ok(out)
}

/// The documents of a saved history (prompt key and text each), checked, in the format
/// [`to_bytes`] writes: magic, the tokenizer (fingerprint, vocabulary), the number of
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
        let raw = r.take(len.checked_mul(4).ok_or_else(|| Error::Invalid("document too long".into()))?)?;
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
        return Err(Error::Invalid(format!("{} trailing bytes after the last document", bytes.len() - r.at)));
    }
    Ok(docs)
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
    use treespec_core::suffix::LookupLimits;

    use super::*;

    const TOK: TokenizerId = TokenizerId { fingerprint: 7, vocab: 1000 };

    #[test]
    fn an_empty_file_loads_as_an_empty_history() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let h = load(file.path(), TOK, 1000).unwrap();
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
        super::super::save_history(&h, &path, TOK).unwrap();
        let back = load(&path, TOK, 1000).unwrap();
        assert_eq!(back.index().tokens(), h.index().tokens());
        assert_eq!(back.lookup(&[1, 2, 3], LookupLimits::default(), Some(4)).len(), 1);

        let bytes = std::fs::read(&path).unwrap();
        let other = TokenizerId { fingerprint: 8, vocab: 1000 };
        assert!(from_bytes(&bytes, other, 1000).unwrap_err().to_string().contains("tokenizer"));
        for cut in [0, 7, 20, bytes.len() - 1] {
            assert!(from_bytes(&bytes[..cut], TOK, 1000).is_err(), "cut at {cut}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(from_bytes(&extra, TOK, 1000).unwrap_err().to_string().contains("trailing"));
        let small = TokenizerId { fingerprint: 7, vocab: 5 };
        let mut wrong_vocab = bytes.clone();
        wrong_vocab[16..20].copy_from_slice(&5u32.to_le_bytes());
        assert!(from_bytes(&wrong_vocab, small, 1000).unwrap_err().to_string().contains("vocabulary"));
        assert!(GlobalHistory::new(0).is_err() && GlobalHistory::new(1).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
