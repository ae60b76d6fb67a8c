//! [`Constraint`]: one request's grammar state, with token masks, forced tokens and rollback.

use llguidance::Matcher;
use toktrie::{SimpleVob, TokenId};

use crate::{GrammarError, Vocabulary};

/// The set of tokens the grammar allows next: a bitset over the vocabulary.
#[derive(Clone)]
pub struct TokenMask {
    bits: SimpleVob,
}

impl std::fmt::Debug for TokenMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenMask").field("allowed", &self.count()).field("size", &self.len()).finish()
    }
}

impl TokenMask {
    fn from_vob(bits: SimpleVob, size: usize) -> Self {
        // llguidance allocates every mask from the trie, whose size is the vocabulary's.
        debug_assert_eq!(bits.len(), size);
        Self { bits }
    }

    /// Vocabulary size (the number of token ids the mask covers).
    pub fn len(&self) -> usize {
        self.bits.len()
    }

    /// Whether the vocabulary is empty (never, for a [`Vocabulary`]).
    pub fn is_empty(&self) -> bool {
        self.bits.is_empty()
    }

    /// Whether `token` is allowed; false for ids outside the vocabulary.
    pub fn contains(&self, token: TokenId) -> bool {
        (token as usize) < self.len() && self.bits.is_allowed(token)
    }

    /// Number of allowed tokens.
    pub fn count(&self) -> usize {
        self.bits.num_set()
    }

    /// The only allowed token, if exactly one is allowed: a forced step.
    pub fn single(&self) -> Option<TokenId> {
        let first = self.bits.first_bit_set()?;
        (self.count() == 1).then_some(first as TokenId)
    }

    /// Allowed token ids in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = TokenId> + '_ {
        self.bits.iter()
    }

    /// Write the mask as one bool per token (`out.len()` must be [`len`](Self::len)).
    pub fn fill(&self, out: &mut [bool]) {
        assert_eq!(out.len(), self.len(), "mask buffer of the wrong size");
        out.fill(false);
        self.bits.iter_set_entries(|i| out[i] = true);
    }

    /// Set the logits of disallowed tokens to -inf, so that softmax gives the grammar-masked
    /// distribution (extra logits beyond the vocabulary, if any, are disallowed too).
    pub fn apply_to_logits(&self, logits: &mut [f32]) {
        for (i, l) in logits.iter_mut().enumerate() {
            if !self.contains(i as TokenId) {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// The bits, 32 tokens per word, token `i` at bit `i % 32` of word `i / 32`.
    pub fn as_words(&self) -> &[u32] {
        self.bits.as_slice()
    }
}

/// How generation ended, when an end-of-generation token has been advanced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// llguidance consumed the EOS (the grammar could have gone on).
    Parser,
    /// The parser had already stopped (nothing but EOS could follow), so llguidance refuses
    /// tokens; the EOS is held here and undone here on rollback.
    Held,
}

/// One request's grammar state.
///
/// The state is the sequence of tokens advanced so far. [`mask`](Self::mask) gives the tokens
/// allowed next (cached until the state changes), [`advance`](Self::advance) takes one,
/// [`rollback`](Self::rollback) undoes the last `n` (llguidance keeps the Earley rows of every
/// byte, so rollback is cheap and exact: the mask after a rollback is the mask that was
/// there before), and [`forced_tokens`](Self::forced_tokens) lists the tokens the grammar
/// fixes from here. End-of-generation tokens are allowed exactly where the grammar can end,
/// and they are the only thing allowed once the grammar cannot go on.
///
/// `Send`: a request's constraint can move to a worker thread. `Clone` forks the state (see
/// [`fork`](Self::fork)).
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    vocab: Vocabulary,
    /// Mask of the current state, once computed.
    mask: Option<TokenMask>,
    /// Tokens advanced, EOS included.
    len: usize,
    end: Option<End>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("len", &self.len).field("end", &self.end).finish_non_exhaustive()
    }
}

const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<Constraint>();
};

impl Constraint {
    pub(crate) fn new(matcher: Matcher, vocab: Vocabulary) -> Self {
        Self { matcher, vocab, mask: None, len: 0, end: None }
    }

    /// The vocabulary the grammar was compiled for.
    pub fn vocab(&self) -> &Vocabulary {
        &self.vocab
    }

    /// Number of tokens advanced (and not rolled back), EOS included.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token has been advanced.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn parser_error(&self) -> GrammarError {
        GrammarError::Parser(crate::error::brief(
            &self.matcher.get_error().unwrap_or_else(|| "unknown error".into()),
        ))
    }

    fn check_alive(&self) -> Result<(), GrammarError> {
        if self.matcher.is_error() {
            Err(self.parser_error())
        } else {
            Ok(())
        }
    }

    /// The tokens allowed next. Empty after an EOS; just the EOS ids once the grammar cannot
    /// go on. Computing it is the expensive step (tens of µs to ms, see the `mask_cost`
    /// example); it is cached until the next advance or rollback. A mask can also come out
    /// empty when no token of the vocabulary can spell what the grammar needs next; callers
    /// should treat that as a failed request.
    pub fn mask(&mut self) -> Result<&TokenMask, GrammarError> {
        if self.mask.is_none() {
            let mask = self.compute_mask()?;
            self.mask = Some(mask);
        }
        Ok(self.mask.as_ref().expect("just set"))
    }

    fn compute_mask(&mut self) -> Result<TokenMask, GrammarError> {
        self.check_alive()?;
        let size = self.vocab.size();
        if self.end.is_some() {
            return Ok(TokenMask::from_vob(SimpleVob::alloc(size), size));
        }
        if self.matcher.is_stopped() {
            let mut bits = self.vocab.trie().alloc_token_set();
            for &eos in self.vocab.eos() {
                bits.allow_token(eos);
            }
            return Ok(TokenMask::from_vob(bits, size));
        }
        let bits = self.matcher.compute_mask().map_err(|_| self.parser_error())?;
        Ok(TokenMask::from_vob(bits, size))
    }

    /// Write the mask as one bool per token (`out.len()` = vocabulary size).
    pub fn allowed(&mut self, out: &mut [bool]) -> Result<(), GrammarError> {
        self.mask()?.fill(out);
        Ok(())
    }

    /// Whether `token` may come next: exactly the mask (computed if not cached yet).
    pub fn is_allowed(&mut self, token: TokenId) -> Result<bool, GrammarError> {
        Ok(self.mask()?.contains(token))
    }

    /// A cheap byte-level pre-check that needs no mask: false means the grammar cannot take
    /// `token` here; true means it can take its bytes, though the mask may still refuse it
    /// (where the grammar forces text, the mask keeps only one tokenization of it). For
    /// pruning draft trees before scoring them, never for the target distribution.
    pub fn could_follow(&mut self, token: TokenId) -> bool {
        if let Some(mask) = &self.mask {
            return mask.contains(token);
        }
        if self.end.is_some() || self.matcher.is_error() || token as usize >= self.vocab.size() {
            return false;
        }
        if self.vocab.is_eos(token) {
            return self.is_accepting();
        }
        self.matcher.validate_tokens(&[token]).is_ok_and(|n| n == 1)
    }

    /// Take `token`. Refused (state unchanged) unless the mask allows it; the mask is computed
    /// first if needed, which is free in a decoding loop that masked the logits already.
    pub fn advance(&mut self, token: TokenId) -> Result<(), GrammarError> {
        if !self.is_allowed(token)? {
            return Err(GrammarError::Rejected { token });
        }
        self.take(token)
    }

    /// Take tokens the caller has already checked against the masks of the states they pass
    /// through (e.g. the accepted path of a verified draft tree, whose masks the verifier
    /// computed): no mask is computed, only llguidance's cheap byte-level check, which refuses
    /// (state unchanged from that token on) what the grammar cannot take at all. Taking a token
    /// outside its mask this way leaves the output valid for the grammar but off the
    /// constrained distribution, so use it only for checked tokens.
    pub fn commit(&mut self, tokens: &[TokenId]) -> Result<(), GrammarError> {
        for &token in tokens {
            if !self.could_follow(token) {
                return Err(GrammarError::Rejected { token });
            }
            self.take(token)?;
        }
        Ok(())
    }

    /// Move past an allowed `token`.
    fn take(&mut self, token: TokenId) -> Result<(), GrammarError> {
        if self.matcher.is_stopped() {
            // Only EOS is allowed here and llguidance takes nothing more: hold it ourselves.
            self.end = Some(End::Held);
        } else {
            self.matcher.consume_token(token).map_err(|_| self.parser_error())?;
            if self.vocab.is_eos(token) {
                self.end = Some(End::Parser);
            }
        }
        self.len += 1;
        self.mask = None;
        Ok(())
    }

    /// Take several tokens in order; stops at the first refused one (earlier ones stay taken)
    /// and returns its error.
    pub fn advance_all(&mut self, tokens: &[TokenId]) -> Result<(), GrammarError> {
        tokens.iter().try_for_each(|&t| self.advance(t))
    }

    /// Undo the last `n` advanced tokens.
    pub fn rollback(&mut self, n: usize) -> Result<(), GrammarError> {
        if n > self.len {
            return Err(GrammarError::Rollback { requested: n, available: self.len });
        }
        if n == 0 {
            return Ok(());
        }
        self.check_alive()?;
        let held = usize::from(self.end == Some(End::Held));
        self.matcher.rollback(n - held).map_err(|_| self.parser_error())?;
        self.end = None;
        self.len -= n;
        self.mask = None;
        Ok(())
    }

    /// The tokens the grammar fixes from here, at most `max`: each is the only token its
    /// state's mask allows, so as draft nodes they are accepted with probability 1 under the
    /// grammar-masked target distribution. May end with an EOS (when the grammar must end
    /// and the model has one EOS id). The state is left as it was (stepped and rolled back;
    /// the current mask stays cached).
    pub fn forced_tokens(&mut self, max: usize) -> Result<Vec<TokenId>, GrammarError> {
        let mut forced = Vec::new();
        let start_mask = self.mask()?.clone();
        while forced.len() < max {
            let Some(t) = self.mask()?.single() else { break };
            self.advance(t)?;
            forced.push(t);
        }
        self.rollback(forced.len())?;
        self.mask = Some(start_mask);
        Ok(forced)
    }

    /// Whether the grammar can end here (the mask allows EOS). False after an EOS.
    pub fn is_accepting(&mut self) -> bool {
        if self.end.is_some() || self.matcher.is_error() {
            return false;
        }
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }

    /// Whether the grammar cannot go on: only EOS is allowed, or an EOS was taken, or the
    /// parser failed.
    pub fn is_stopped(&self) -> bool {
        self.end.is_some() || self.matcher.is_stopped()
    }

    /// Whether an EOS has been advanced.
    pub fn is_finished(&self) -> bool {
        self.end.is_some()
    }

    /// An independent copy of this state (a shallow llguidance clone: the lexer caches are
    /// shared, the Earley rows copied). An alternative to advance/rollback for keeping the
    /// state of several tree branches at once; see the `mask_cost` example for its cost.
    pub fn fork(&self) -> Self {
        self.clone()
    }
}
