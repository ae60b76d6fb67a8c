//! The simplest drafter that pays on copies, as one of `auto`'s policies: llama.cpp's
//! `ngram-mod` kind. The last [`MATCH_TOKENS`] tokens are looked up among every earlier
//! position of the request's text (prompt and output), the token that followed the most recent
//! occurrence is drafted, and the lookup goes on from the drafted text, up to [`MAX_CHAIN`]
//! tokens: one chain, no tree, no pricing cell per context. A chain ends at a token that ends
//! generation: copied past a prompt's end of turn it would bet the chat template's next header,
//! which an answer never emits.
//!
//! Its one estimate is how often such a chain's next token is right: a per-token acceptance `p`
//! (node i of the chain is worth `p^i`), learned for free from every step, drafted or not — the
//! chain proposed at a step is compared with the tokens the target emitted there (all of them
//! known once the step is verified), so a chain never verified still says whether it would have
//! been right. The prior, 29 right to 1 wrong (0.967), sits a little below what the shipped
//! suffix prior says of a long exact match's next node (0.98 for a 40-token match).
//!
//! Lossless: the chain is read from the committed text alone (deterministic candidates).

use rustc_hash::FxHashMap;
use treespec_core::TokenId;

/// Tokens a match must span before its continuation is drafted (llama.cpp's ngram-mod uses 24
/// with its minimum draft of 48; here every chain is priced, so shorter matches may draft where
/// they pay and the price says when they do not).
pub const MATCH_TOKENS: usize = 16;
/// Longest chain drafted.
pub const MAX_CHAIN: usize = 64;
/// The acceptance prior: right and wrong next tokens, in pseudo-counts.
const PRIOR: (f64, f64) = (29.0, 1.0);

/// The long-match proposer of one request (see the module docs).
#[derive(Debug, Clone)]
pub struct LongMatch {
    /// The request's text, as far as it is indexed.
    text: Vec<TokenId>,
    /// Hash of each `MATCH_TOKENS`-gram → the position of the token that followed its most
    /// recent occurrence.
    next: FxHashMap<u64, u32>,
    /// The chain proposed at the last step, to be scored against what the target emitted.
    last_chain: Vec<TokenId>,
    right: f64,
    wrong: f64,
}

impl Default for LongMatch {
    fn default() -> Self {
        Self::new()
    }
}

fn gram_hash(gram: &[TokenId]) -> u64 {
    gram.iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &t| (h ^ t as u64).wrapping_mul(0x0100_0000_01b3).rotate_left(7))
}

impl LongMatch {
    /// An empty proposer at the prior.
    pub fn new() -> Self {
        Self {
            text: Vec::new(),
            next: FxHashMap::default(),
            last_chain: Vec::new(),
            right: PRIOR.0,
            wrong: PRIOR.1,
        }
    }

    /// A new request: index its prompt, forget the last request's chain and acceptance.
    pub fn begin(&mut self, prompt: &[TokenId]) {
        *self = Self::new();
        self.sync(prompt);
    }

    /// Index the text up to `history` (which extends what was indexed; a history that does not
    /// is indexed afresh).
    fn sync(&mut self, history: &[TokenId]) {
        if !history.starts_with(&self.text) {
            self.text.clear();
            self.next.clear();
        }
        let from = self.text.len();
        self.text.extend_from_slice(&history[from..]);
        // The gram ending just before position `end` maps to `end`, for every `end` whose token
        // is known.
        for end in from.max(MATCH_TOKENS)..self.text.len() {
            self.next.insert(gram_hash(&self.text[end - MATCH_TOKENS..end]), end as u32);
        }
    }

    /// Per-token acceptance of a chain's next token, as learned so far.
    pub fn acceptance(&self) -> f64 {
        self.right / (self.right + self.wrong)
    }

    /// This step's chain for `history` (at most `depth` tokens, ending at the first of `eos` it
    /// drafts), and each node's value `p^i`. Empty when the last tokens have no earlier
    /// occurrence.
    pub fn propose(
        &mut self,
        history: &[TokenId],
        depth: usize,
        eos: &[TokenId],
    ) -> (Vec<TokenId>, Vec<f64>) {
        self.sync(history);
        let mut chain: Vec<TokenId> = Vec::new();
        let limit = depth.min(MAX_CHAIN);
        let mut tail: Vec<TokenId> = history[history.len().saturating_sub(MATCH_TOKENS)..].to_vec();
        while chain.len() < limit && tail.len() == MATCH_TOKENS {
            let Some(&pos) = self.next.get(&gram_hash(&tail)) else { break };
            let pos = pos as usize;
            // A hash collision is not a match: the gram must really precede `pos`.
            if self.text[pos - MATCH_TOKENS..pos] != tail[..] {
                break;
            }
            let token = self.text[pos];
            chain.push(token);
            if eos.contains(&token) {
                break;
            }
            tail.remove(0);
            tail.push(token);
        }
        let p = self.acceptance();
        let values = (1..=chain.len()).map(|i| p.powi(i as i32)).collect();
        self.last_chain = chain.clone();
        (chain, values)
    }

    /// Tokens of the last chain proposed.
    pub fn last_chain_len(&self) -> usize {
        self.last_chain.len()
    }

    /// The step proposed at the last [`propose`](Self::propose) emitted `emitted` (accepted
    /// tokens and the target's own): learn how far the chain was right. A chain right over every
    /// emitted token says nothing of its next one.
    pub fn learn(&mut self, emitted: &[TokenId]) {
        let chain = std::mem::take(&mut self.last_chain);
        let right = chain.iter().zip(emitted).take_while(|(c, e)| c == e).count();
        self.right += right as f64;
        if right < chain.len().min(emitted.len()) {
            self.wrong += 1.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize, seed: u32) -> Vec<TokenId> {
        (0..n as u32).map(|i| (i * 7919 + seed * 104_729) % 50_000).collect()
    }

    #[test]
    fn a_long_match_drafts_what_followed_it() {
        let source = text(100, 1);
        let mut history = text(20, 2);
        history.extend_from_slice(&source);
        history.extend_from_slice(&text(5, 3));
        // The answer starts copying the source: 30 tokens in.
        history.extend_from_slice(&source[..30]);
        let mut lm = LongMatch::new();
        lm.begin(&history[..25]);
        let (chain, values) = lm.propose(&history, 200, &[]);
        assert_eq!(chain, source[30..30 + MAX_CHAIN]);
        assert_eq!(values.len(), chain.len());
        assert!(values.windows(2).all(|w| w[1] < w[0]) && values[0] < 1.0);
    }

    #[test]
    fn a_short_match_drafts_nothing_and_depth_bounds_the_chain() {
        let source = text(100, 1);
        let mut history = source.clone();
        history.extend_from_slice(&text(3, 9));
        history.extend_from_slice(&source[40..40 + MATCH_TOKENS - 1]);
        let mut lm = LongMatch::new();
        lm.begin(&history);
        assert!(lm.propose(&history, 64, &[]).0.is_empty());
        history.push(source[40 + MATCH_TOKENS - 1]);
        let (chain, _) = lm.propose(&history, 5, &[]);
        assert_eq!(chain, source[40 + MATCH_TOKENS..40 + MATCH_TOKENS + 5]);
    }

    #[test]
    fn a_chain_ends_at_a_token_that_ends_generation() {
        // A chat prompt quoting a file ends its turn (EOT) and opens the answer's header; the
        // answer re-emits the file. Near the file's end the chain may draft EOT (the answer
        // could end there) but never the header after it.
        const EOT: TokenId = 60_000;
        let file = text(40, 1);
        let mut history = text(10, 2);
        history.extend_from_slice(&file);
        history.push(EOT);
        history.extend_from_slice(&text(3, 3));
        history.extend_from_slice(&file[..30]);
        let mut lm = LongMatch::new();
        lm.begin(&history);
        let (chain, values) = lm.propose(&history, 64, &[EOT]);
        let mut expect = file[30..].to_vec();
        expect.push(EOT);
        assert_eq!(chain, expect);
        assert_eq!(values.len(), chain.len());
        // Without the stop it copies on through the header and the answer's own start.
        let (through, _) = lm.propose(&history, 64, &[]);
        assert!(through.len() > chain.len() && through[..chain.len()] == chain[..]);
    }

    #[test]
    fn a_repetition_drafts_through_its_own_chain() {
        // A 20-token period repeated: the chain runs on through text it drafted itself.
        let period = text(20, 4);
        let history: Vec<TokenId> = period.iter().cycle().take(45).copied().collect();
        let mut lm = LongMatch::new();
        lm.begin(&history);
        let (chain, _) = lm.propose(&history, 64, &[]);
        let expect: Vec<TokenId> = period.iter().cycle().skip(45).take(64).copied().collect();
        assert_eq!(chain, expect);
    }

    #[test]
    fn acceptance_learns_from_what_the_target_emitted() {
        let source = text(200, 1);
        let mut history = source.clone();
        history.extend_from_slice(&source[..MATCH_TOKENS]);
        let mut lm = LongMatch::new();
        lm.begin(&history);
        let before = lm.acceptance();
        // The target leaves the copy at once, ten steps running.
        for _ in 0..10 {
            let (chain, _) = lm.propose(&history, 64, &[]);
            assert!(!chain.is_empty());
            lm.learn(&[chain[0] + 1]);
        }
        assert!(lm.acceptance() < before - 0.15, "{} → {}", before, lm.acceptance());
        // A chain right over all the emitted tokens adds right ones and no wrong one.
        let (chain, _) = lm.propose(&history, 64, &[]);
        let wrong = lm.wrong;
        lm.learn(&chain[..3]);
        assert_eq!(lm.wrong, wrong);
    }

    #[test]
    fn an_edited_history_is_indexed_afresh() {
        let a = text(60, 1);
        let mut lm = LongMatch::new();
        lm.begin(&a);
        let b = text(60, 2);
        let (chain, _) = lm.propose(&b, 64, &[]);
        assert!(chain.is_empty());
        assert_eq!(lm.text, b);
    }
}
