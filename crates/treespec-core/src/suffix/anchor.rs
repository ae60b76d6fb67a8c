//! Re-anchoring a broken copy: where a long copy of the request's own text stood when an edit
//! broke it, and where it may resume.
//!
//! A model that re-emits a file it was given with a few edits copies long stretches and then
//! changes something: inserts a line, drops a word, renames an identifier. While it copies, the
//! suffix match is long and the drafter drafts far. The token the target emits instead of the
//! copied one ends that: the text's suffix now ends in the edit and matches nothing long, so a
//! suffix drafter proposes nothing (or weak short matches) until a fresh long match forms, many
//! one-token steps per edit — though the copy usually resumes a few tokens later, right where
//! it left off.
//!
//! An [`AnchorTracker`] keeps, per request, the *anchor*: the position in the text where the
//! copy's source goes on (the next token the copy expects). A strong match (at least
//! [`STRONG_MATCH`] tokens) places it, and every emitted token that continues the source moves
//! it on. When an emitted token does not, the copy is *broken*; for the next steps, until a
//! strong match forms again or [`WINDOW`] tokens pass unexplained, the tracker offers a few
//! places to resume the copy ([`Resume`]):
//!
//! * **stay** — the source at the anchor itself: whatever was emitted since the break was an
//!   insertion, and it ends now;
//! * **replace** — the source as many tokens past the anchor as were emitted since the break: a
//!   replacement of the same length (a renamed identifier);
//! * **skip** — the source right after the first occurrence of the last two (else the last one)
//!   emitted tokens within [`REACH`] tokens after the anchor: a deletion, or, right after the
//!   break, the target's correction found further on in the source;
//! * **follow** — once the emitted text agrees with one of them again, the source from there,
//!   until the suffix match is long again.
//!
//! At the next step the tokens emitted meanwhile are matched against the places offered (and
//! the anchor itself): the one they agree with longest becomes the anchor. Every resume is
//! computed from the text emitted at earlier steps only, so the drafter's nodes built from them
//! are deterministic candidates like any suffix node.

use super::index::Occurrence;
use crate::TokenId;

/// A match at least this long is a copy under way: it places the anchor, and while it holds
/// the suffix match drafts the copy by itself (no resumes are offered).
pub const STRONG_MATCH: usize = 8;
/// Tokens emitted without the copy resuming (agreeing with its source for two tokens in a
/// row) after which the anchor is dropped.
pub const WINDOW: usize = 32;
/// How far past the anchor a skip looks for the last emitted tokens.
pub const REACH: usize = 64;
/// Longest run of emitted tokens a skip matches (it tries this many, then fewer).
const SKIP_KEY: usize = 2;

/// How a resume place was chosen (see the module docs); part of what prices its nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResumeKind {
    /// The emitted text agrees with the source again: it goes on.
    Follow,
    /// The source at the anchor: an insertion ends now.
    Stay,
    /// The source as many tokens past the anchor as were emitted since the break.
    Replace,
    /// The source after the last emitted tokens' first occurrence past the anchor.
    Skip,
}

impl ResumeKind {
    /// Every kind, in the pricing grid's order.
    pub const ALL: [ResumeKind; 4] =
        [ResumeKind::Follow, ResumeKind::Stay, ResumeKind::Replace, ResumeKind::Skip];
}

/// One place to resume a broken copy: the text from `start` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    /// How the place was chosen.
    pub kind: ResumeKind,
    /// Where the resumed copy starts in the text (its first drafted token).
    pub start: usize,
    /// Tokens that tie the place to the text: for `Follow`, the tokens that have agreed with
    /// the source since the copy resumed; for `Skip`, the emitted tokens matched (1 or 2); 0 for
    /// `Stay` and `Replace`.
    pub evidence: usize,
}

/// The anchor of a copy (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Anchor {
    /// The next position of the source the copy expects (an index into the text).
    pos: usize,
    /// Tokens emitted since the copy broke (0: the text follows the source up to `pos`).
    gap: usize,
    /// Tokens in a row that have agreed with the source since the copy last resumed.
    run: usize,
    /// Emitted tokens the anchor has not explained since it was last confirmed (a strong match,
    /// or two tokens in a row agreeing with the source).
    lost: usize,
}

/// Per request: the anchor of the last long copy and the places offered to resume it (see the
/// module docs).
#[derive(Debug, Clone, Default)]
pub struct AnchorTracker {
    anchor: Option<Anchor>,
    /// Text length at the last update.
    seen: usize,
    /// The places offered at the last update: the tokens emitted since are matched against them.
    offered: Vec<Resume>,
}

/// How many of the `count` tokens at `from` in `text` equal the text from `start` on.
fn agreement(text: &[TokenId], start: usize, from: usize, count: usize) -> usize {
    (0..count).take_while(|&i| text.get(start + i).is_some_and(|&t| t == text[from + i])).count()
}

impl AnchorTracker {
    /// A tracker with no anchor.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forget the anchor (a new request).
    pub fn reset(&mut self) {
        self.anchor = None;
        self.seen = 0;
        self.offered.clear();
    }

    /// The anchor, if any: the next source position the copy expects, and the tokens emitted
    /// since it broke (0 while the copy follows its source).
    pub fn anchor(&self) -> Option<(usize, usize)> {
        self.anchor.map(|a| (a.pos, a.gap))
    }

    /// The places offered at the last update.
    pub fn offered(&self) -> &[Resume] {
        &self.offered
    }

    /// Catch up with `text` (the request's text so far: an extension of the text at the last
    /// call, else the tracker starts over) and return the places to resume the copy from this
    /// step: none while `strongest` — the longest earlier occurrence, in the text itself, of
    /// the text's suffix — is a strong match (it places the anchor), none without an anchor.
    /// Every place starts before the end of the text.
    pub fn update(&mut self, text: &[TokenId], strongest: Option<Occurrence>) -> &[Resume] {
        let n = text.len();
        if n < self.seen {
            self.reset();
        }
        let (from, count) = (self.seen, n - self.seen);
        if let (Some(a), true) = (self.anchor.as_mut(), count > 0) {
            // The anchor first (the copy simply went on), then the places offered, in order.
            let mut best = (agreement(text, a.pos, from, count), a.pos);
            for r in &self.offered {
                let j = agreement(text, r.start, from, count);
                if j > best.0 {
                    best = (j, r.start);
                }
            }
            let (j, start) = best;
            let unexplained = count - j;
            if j > 0 {
                let went_on = start == a.pos && a.gap == 0;
                a.run = if unexplained > 0 {
                    0
                } else if went_on {
                    a.run + j
                } else {
                    j
                };
                a.pos = start + j;
                a.gap = unexplained;
                a.lost = if j >= 2 { unexplained } else { a.lost + unexplained };
            } else {
                a.gap += count;
                a.run = 0;
                a.lost += count;
            }
            if a.lost > WINDOW {
                self.anchor = None;
            }
        }
        self.seen = n;
        self.offered.clear();
        if let Some(o) = strongest.filter(|o| o.len >= STRONG_MATCH) {
            self.anchor = Some(Anchor { pos: o.start, gap: 0, run: o.len, lost: 0 });
            return &self.offered;
        }
        let Some(a) = self.anchor else { return &self.offered };
        let mut offer = |kind, start: usize, evidence| {
            if start < n && !self.offered.iter().any(|r| r.start == start) {
                self.offered.push(Resume { kind, start, evidence });
            }
        };
        if a.gap == 0 {
            offer(ResumeKind::Follow, a.pos, a.run);
            return &self.offered;
        }
        // The most specific first: it wins where two places draft the same tokens.
        if let Some((start, k)) = skip(text, a.pos) {
            if k >= 2 {
                offer(ResumeKind::Skip, start, k);
            }
        }
        offer(ResumeKind::Stay, a.pos, 0);
        offer(ResumeKind::Replace, a.pos + a.gap, 0);
        if let Some((start, 1)) = skip(text, a.pos) {
            offer(ResumeKind::Skip, start, 1);
        }
        &self.offered
    }
}

/// The place after the first occurrence, starting at `pos` and within [`REACH`] tokens of it,
/// of the text's last [`SKIP_KEY`] tokens (else fewer), with the number of tokens matched. The
/// occurrence must end before the text's own end (a place to resume must hold a token).
fn skip(text: &[TokenId], pos: usize) -> Option<(usize, usize)> {
    let n = text.len();
    for k in (1..=SKIP_KEY.min(n)).rev() {
        let key = &text[n - k..];
        let last_start = (pos + REACH).min(n.saturating_sub(k + 1));
        if let Some(i) = (pos..=last_start).find(|&i| i + k < n && text[i..i + k] == *key) {
            return Some((i + k, k));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source of 40 distinct tokens, then the copy so far.
    fn source() -> Vec<TokenId> {
        (100..140).collect()
    }

    /// The text after `source` + a separator + `copy`, with the anchor placed by a strong match
    /// at the last step (as the drafter does when the copy is under way).
    fn tracking(copy: &[TokenId]) -> (AnchorTracker, Vec<TokenId>) {
        let mut text = source();
        text.push(7);
        text.extend(copy);
        let mut t = AnchorTracker::new();
        // The copy's first `copy.len()` tokens matched the source from its start.
        let strong = Occurrence { start: copy.len(), len: copy.len() };
        assert!(t.update(&text, Some(strong)).is_empty(), "a strong match drafts by itself");
        assert_eq!(t.anchor(), Some((copy.len(), 0)));
        (t, text)
    }

    fn starts(t: &AnchorTracker) -> Vec<(ResumeKind, usize, usize)> {
        t.offered().iter().map(|r| (r.kind, r.start, r.evidence)).collect()
    }

    #[test]
    fn the_anchor_follows_the_copy_and_offers_where_it_may_resume_after_a_break() {
        let src = source();
        let (mut t, mut text) = tracking(&src[..12]);
        // The copy goes on for three tokens: the anchor moves with it.
        text.extend(&src[12..15]);
        assert!(t.update(&text, Some(Occurrence { start: 15, len: 15 })).is_empty());
        assert_eq!(t.anchor(), Some((15, 0)));
        // An edit: 999 instead of the source's 115 (position 15).
        text.push(999);
        let offered = starts(&{
            t.update(&text, None);
            t.clone()
        });
        assert_eq!(t.anchor(), Some((15, 1)));
        // Stay (115 at 15), replace (116 at 16); 999 occurs nowhere ahead: no skip.
        assert_eq!(offered, vec![(ResumeKind::Stay, 15, 0), (ResumeKind::Replace, 16, 0)]);
    }

    #[test]
    fn an_insertion_resumes_at_the_anchor() {
        let src = source();
        let (mut t, mut text) = tracking(&src[..12]);
        // Two inserted tokens, then the copy resumes at 112.
        text.extend([900, 901]);
        t.update(&text, None);
        assert!(starts(&t).contains(&(ResumeKind::Stay, 12, 0)));
        text.extend(&src[12..14]);
        let offered = t.update(&text, None).to_vec();
        // The two tokens agreed with the stay place: the copy follows again from 114.
        assert_eq!(t.anchor(), Some((14, 0)));
        assert_eq!(offered, vec![Resume { kind: ResumeKind::Follow, start: 14, evidence: 2 }]);
        assert_eq!(text[offered[0].start], src[14]);
    }

    #[test]
    fn a_deletion_skips_to_the_target_correction() {
        let src = source();
        let (mut t, mut text) = tracking(&src[..12]);
        // 112..115 deleted: the target emitted 116 instead of 112.
        text.push(src[16]);
        let offered = t.update(&text, None).to_vec();
        let skip = offered.iter().find(|r| r.kind == ResumeKind::Skip).expect("a skip");
        assert_eq!((skip.start, skip.evidence), (17, 1));
        assert_eq!(text[skip.start..skip.start + 3], src[17..20]);
        // The copy resumed there: two more tokens agree, the anchor moves past them.
        text.extend(&src[17..19]);
        t.update(&text, None);
        assert_eq!(t.anchor(), Some((19, 0)));
    }

    #[test]
    fn a_replacement_resumes_past_the_replaced_tokens() {
        let src = source();
        let (mut t, mut text) = tracking(&src[..12]);
        // 112 113 replaced by 900 901.
        text.push(900);
        t.update(&text, None);
        text.push(901);
        let offered = t.update(&text, None).to_vec();
        assert_eq!(t.anchor(), Some((12, 2)));
        assert!(
            offered.contains(&Resume { kind: ResumeKind::Replace, start: 14, evidence: 0 }),
            "{offered:?}"
        );
        text.extend(&src[14..16]);
        t.update(&text, None);
        assert_eq!(t.anchor(), Some((16, 0)));
    }

    #[test]
    fn a_skip_prefers_two_matched_tokens_and_stays_within_reach() {
        // Source: ... 5 6 ... 6 9 ..., the copy broke after "… 4", the target emitted 6 then 9.
        let mut text: Vec<TokenId> = vec![1, 2, 3, 4, 50, 6, 51, 52, 6, 9, 10, 11, 12];
        text.extend([77, 1, 2, 3, 4]);
        let mut t = AnchorTracker::new();
        t.update(&text, Some(Occurrence { start: 4, len: STRONG_MATCH }));
        text.push(6);
        let first = t.update(&text, None).to_vec();
        // One token: the first 6 after the anchor.
        assert!(first.contains(&Resume { kind: ResumeKind::Skip, start: 6, evidence: 1 }), "{first:?}");
        text.push(9);
        let second = t.update(&text, None).to_vec();
        // "6 9": the second 6, with both tokens matched, offered first.
        assert_eq!(second[0], Resume { kind: ResumeKind::Skip, start: 10, evidence: 2 });
        // Nothing past REACH is found.
        let mut far: Vec<TokenId> = (1000..1000 + REACH as TokenId + 10).collect();
        far.push(5);
        assert_eq!(skip(&far, 0), None);
        let near: Vec<TokenId> = vec![1, 5, 8, 2, 5];
        assert_eq!(skip(&near, 0), Some((2, 1)));
    }

    #[test]
    fn the_anchor_is_dropped_after_a_window_without_the_copy_and_restarts_with_the_text() {
        let src = source();
        let (mut t, mut text) = tracking(&src[..12]);
        for i in 0..WINDOW as TokenId {
            text.push(2000 + i);
            t.update(&text, None);
            assert!(t.anchor().is_some(), "{i}");
        }
        text.push(3000);
        assert!(t.update(&text, None).is_empty());
        assert_eq!(t.anchor(), None);
        // A shorter text is another request: the tracker starts over.
        let (mut t, _) = tracking(&src[..12]);
        assert!(t.update(&src[..5], None).is_empty());
        assert_eq!(t.anchor(), None);
    }
}
