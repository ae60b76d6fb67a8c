//! Streaming UTF-8 decoding of token bytes.
//!
//! Byte-level BPE tokens often carry part of a multi-byte character (an emoji spans several
//! tokens). Printing each token's bytes lossily would show replacement characters mid-stream;
//! this decoder holds back an incomplete trailing sequence until the next token completes it,
//! and only replaces bytes that can never become valid.

/// Incremental bytes → text decoder.
#[derive(Debug, Default, Clone)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// A fresh decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed bytes; returns the text that is now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..good]).expect("validated prefix"));
                    match e.error_len() {
                        // Incomplete sequence at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        // Invalid bytes: they can never decode, replace them and go on.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// End of stream: whatever is still held back is invalid; replace it.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multibyte_split_across_tokens() {
        let bytes = "a€😀b".as_bytes();
        // Feed one byte at a time: never a replacement character, same text at the end.
        let mut s = Utf8Stream::new();
        let mut text = String::new();
        for b in bytes {
            let piece = s.push(&[*b]);
            assert!(!piece.contains('\u{FFFD}'));
            text.push_str(&piece);
        }
        text.push_str(&s.finish());
        assert_eq!(text, "a€😀b");
    }

    #[test]
    fn invalid_bytes_are_replaced_not_held() {
        let mut s = Utf8Stream::new();
        assert_eq!(s.push(&[b'x', 0xff, b'y']), "x\u{FFFD}y");
        assert_eq!(s.push(&[0xe2, 0x82]), "");
        assert_eq!(s.finish(), "\u{FFFD}");
    }
}
