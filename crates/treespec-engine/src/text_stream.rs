//! The generated text as a stream: token bytes in, text out as soon as it is final. Shared by
//! the CLI (`generate`) and the server, so both show the same text.
//!
//! Three things keep text back. Byte-level BPE tokens often carry part of a multi-byte character,
//! so an incomplete UTF-8 sequence at the end waits for the next token. A stop string may span
//! tokens, so the last `longest stop − 1` bytes wait until they cannot start one. And once a stop
//! string matched, nothing from its start on is ever shown. At the end of generation (budget
//! spent, end token, stop string) an incomplete trailing sequence can no longer complete: it is
//! dropped, never shown as U+FFFD. Bytes that can never be valid UTF-8 anywhere else in the
//! text do become U+FFFD, as in any lossy decode.

use crate::stop::StopScanner;

/// Incremental bytes → final text, with stop strings.
#[derive(Debug, Default)]
pub struct TextStream {
    scanner: StopScanner,
    stops: Vec<String>,
    /// Bytes held back while no stop string matched: the longest stop string minus one.
    hold: usize,
    /// Bytes already handed out.
    sent: usize,
}

impl TextStream {
    /// A stream that ends the text at the first of `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        let stops: Vec<String> = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        let hold = stops.iter().map(|s| s.len()).max().unwrap_or(1) - 1;
        Self { scanner: StopScanner::default(), stops, hold, sent: 0 }
    }

    /// Append one token's bytes; true when a stop string now matches (the text ends there).
    pub fn push(&mut self, token_bytes: &[u8]) -> bool {
        self.scanner.push(token_bytes, &self.stops)
    }

    /// Where the text is cut once a stop string matched (a byte offset into the generated
    /// bytes).
    pub fn cut_at(&self) -> Option<usize> {
        self.scanner.cut_at
    }

    /// All the text handed out so far ([`take`](Self::take) and [`finish`](Self::finish)).
    pub fn released(&self) -> String {
        String::from_utf8_lossy(&self.scanner.bytes()[..self.sent]).into_owned()
    }

    /// The text that became final since the last call (empty if none).
    pub fn take(&mut self) -> String {
        let all = self.scanner.bytes();
        let limit = self.scanner.cut_at.unwrap_or(all.len().saturating_sub(self.hold)).max(self.sent);
        let end = self.sent + complete_prefix(&all[self.sent..limit]);
        self.emit(end)
    }

    /// End of generation: the rest of the text up to the stop-string cut, with an incomplete
    /// trailing character dropped.
    pub fn finish(&mut self) -> String {
        let all = self.scanner.bytes();
        let cut = self.scanner.cut_at.unwrap_or(all.len()).max(self.sent);
        let end = self.sent + complete_prefix(&all[self.sent..cut]);
        self.emit(end)
    }

    /// The stop string the text ended at, once one matched (the first of the request's that
    /// starts where the text was cut).
    pub fn stopped_by(&self) -> Option<&str> {
        let rest = &self.scanner.bytes()[self.scanner.cut_at?..];
        self.stops.iter().map(String::as_str).find(|s| rest.starts_with(s.as_bytes()))
    }

    fn emit(&mut self, end: usize) -> String {
        let text = String::from_utf8_lossy(&self.scanner.bytes()[self.sent..end]).into_owned();
        self.sent = end;
        text
    }
}

/// The length of the longest prefix of `b` that does not end inside an incomplete UTF-8
/// sequence (invalid bytes in the middle count as complete: they decode to U+FFFD).
pub fn complete_prefix(b: &[u8]) -> usize {
    let mut i = 0;
    loop {
        match std::str::from_utf8(&b[i..]) {
            Ok(_) => return b.len(),
            Err(e) => match e.error_len() {
                Some(n) => i += e.valid_up_to() + n,
                None => return i + e.valid_up_to(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pieces: &[&[u8]], stops: &[&str]) -> (Vec<String>, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut s = TextStream::new(&stops);
        let mut taken = Vec::new();
        for p in pieces {
            s.push(p);
            taken.push(s.take());
        }
        (taken, s.finish())
    }

    #[test]
    fn complete_prefix_stops_before_a_split_character() {
        let e = "é".as_bytes();
        assert_eq!(complete_prefix(b"abc"), 3);
        assert_eq!(complete_prefix(&[b'a', e[0]]), 1);
        assert_eq!(complete_prefix(&[b'a', e[0], e[1]]), 3);
        assert_eq!(complete_prefix(&[b'a', 0xff, b'b']), 3);
        assert_eq!(complete_prefix(&[0xff, e[0]]), 1);
    }

    #[test]
    fn characters_split_across_tokens_come_out_whole() {
        let bytes = "a€😀b".as_bytes();
        let pieces: Vec<&[u8]> = bytes.chunks(1).collect();
        let (taken, rest) = run(&pieces, &[]);
        assert!(taken.iter().all(|t| !t.contains('\u{FFFD}')), "{taken:?}");
        assert_eq!(taken.concat() + &rest, "a€😀b");
    }

    #[test]
    fn an_unfinished_character_at_the_end_is_dropped() {
        let smile = "😀".as_bytes();
        let (taken, rest) = run(&[b"ok ", &smile[..2], &smile[2..3]], &[]);
        assert_eq!((taken.concat(), rest), ("ok ".to_string(), String::new()));
        // Bytes that can never decode still show, as U+FFFD.
        let (taken, rest) = run(&[&[b'x', 0xff, b'y']], &[]);
        assert_eq!(taken.concat() + &rest, "x\u{FFFD}y");
    }

    #[test]
    fn stop_strings_hold_back_and_cut() {
        let (taken, rest) = run(&[b"hello E", b"N", b"Dx"], &["END", ""]);
        assert_eq!(taken, ["hello", " ", ""]);
        assert_eq!(rest, "");
        let (taken, rest) = run(&[b"no stop here"], &["END"]);
        assert_eq!(taken.concat() + &rest, "no stop here");
    }

    #[test]
    fn the_stop_string_that_matched_is_known() {
        let stops = ["END".to_string(), "\n\n".to_string()];
        let mut s = TextStream::new(&stops);
        s.push(b"one\n");
        assert_eq!(s.stopped_by(), None);
        s.push(b"\nEND");
        assert_eq!(s.stopped_by(), Some("\n\n"));
        assert_eq!(s.finish(), "one");
    }
}
