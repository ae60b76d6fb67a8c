//! Constrained decoding (structured output): the seam between the generation loop and a grammar
//! engine (`treespec-grammar`, on llguidance), kept free of any grammar library.
//!
//! Losslessness is defined against *constrained* plain decoding: at every position the target's
//! distribution is the grammar-masked one. The loop masks each target row on the verifier's walk
//! by the grammar state after that node's path, so verification compares drafts against exactly
//! that distribution. Tokens the grammar forces (it allows exactly one) have probability 1 under
//! the masked target: the loop verifies them as a free chain of deterministic drafts.

use treespec_core::TokenId;

use crate::error::Result;

/// A per-request grammar state. "Committed" is the state after every emitted token; `path`
/// arguments are tokens past it (a tree node's path from the root, root excluded).
pub trait TokenConstraint: Send {
    /// Set to −∞ the logits of every token the grammar forbids after `path`.
    fn mask_logits(&mut self, path: &[TokenId], logits: &mut [f32]) -> Result<()>;
    /// Up to `max` tokens the grammar forces from the committed state, each the only token its
    /// mask allows (empty when the next token is a real choice).
    fn forced(&mut self, max: usize) -> Result<Vec<TokenId>>;
    /// Advance the committed state past emitted tokens (each allowed by its mask).
    fn commit(&mut self, tokens: &[TokenId]) -> Result<()>;
    /// Whether the grammar is complete and nothing but end-of-generation may follow.
    fn is_finished(&self) -> bool;
}

impl<T: TokenConstraint + ?Sized> TokenConstraint for Box<T> {
    fn mask_logits(&mut self, path: &[TokenId], logits: &mut [f32]) -> Result<()> {
        (**self).mask_logits(path, logits)
    }
    fn forced(&mut self, max: usize) -> Result<Vec<TokenId>> {
        (**self).forced(max)
    }
    fn commit(&mut self, tokens: &[TokenId]) -> Result<()> {
        (**self).commit(tokens)
    }
    fn is_finished(&self) -> bool {
        (**self).is_finished()
    }
}

/// A constraint whose forced tokens are not used as drafts: constrained plain decoding in the
/// strict sense, one target forward per token (the reference the forced drafts are measured
/// against; the output distribution is the same).
pub struct WithoutForcing<C>(pub C);

impl<C: TokenConstraint> TokenConstraint for WithoutForcing<C> {
    fn mask_logits(&mut self, path: &[TokenId], logits: &mut [f32]) -> Result<()> {
        self.0.mask_logits(path, logits)
    }
    fn forced(&mut self, _max: usize) -> Result<Vec<TokenId>> {
        Ok(Vec::new())
    }
    fn commit(&mut self, tokens: &[TokenId]) -> Result<()> {
        self.0.commit(tokens)
    }
    fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

/// Where a call grammar takes over from free text (see [`TaggedConstraint`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opening {
    /// The tokens that open a call: one token (a tag) anywhere in the text, or a sequence that
    /// must be the very start of the output (`at_start`, e.g. a ```` ```json ```` fence).
    pub tokens: Vec<TokenId>,
    /// Only at the start of the output.
    pub at_start: bool,
    /// The token that ends the call (the inner grammar's last token), after which the text is
    /// free again; `None`: the call runs to the end of the output.
    pub close: Option<TokenId>,
}

/// Makes a fresh inner grammar for a call that opens.
pub type NewInner<C> = Box<dyn FnMut() -> Result<C> + Send>;

/// Grammars that hold only inside calls the model opens itself, with free text around them:
/// a tool call under `tool_choice: "auto"` opened by a `<tool_call>` tag or by an answer that
/// starts with a ```` ```json ```` fence (what llama.cpp calls a lazy grammar). After an
/// opening, its inner grammar runs from its start, until the opening's closing token (or to the
/// end of the output).
///
/// The state is a function of the tokens alone, never of where steps began: a node's mask is
/// decided by scanning its path for openings and closes, so a call opened inside a draft tree
/// is masked the same as one opened at an earlier step, and speculative output keeps
/// constrained plain decoding's distribution.
pub struct TaggedConstraint<C> {
    openings: Vec<(Opening, NewInner<C>)>,
    /// The first committed tokens, as many as the longest at-start opening.
    head: Vec<TokenId>,
    head_max: usize,
    /// Tokens committed.
    committed: usize,
    /// The call open at the committed position: its opening and grammar.
    open: Option<(usize, C)>,
    /// A fresh inner grammar per opening, for calls a path opens (never committed).
    fresh: Vec<Option<C>>,
}

/// Where a path leaves a [`TaggedConstraint`].
enum TagState {
    /// Outside any call.
    Free,
    /// Inside the call of this opening, open at the committed position.
    Committed(usize),
    /// Inside a call of this opening that the path opened; its tokens start at this index.
    Opened(usize, usize),
}

impl<C: TokenConstraint> TaggedConstraint<C> {
    /// Free text until one of `openings`; then its inner grammar. An opening that may come
    /// anywhere must be one token (an error otherwise).
    pub fn new(openings: Vec<(Opening, NewInner<C>)>) -> Result<Self> {
        if let Some((o, _)) =
            openings.iter().find(|(o, _)| o.tokens.is_empty() || (!o.at_start && o.tokens.len() != 1))
        {
            return Err(crate::EngineError::InvalidRequest(format!(
                "a call opening anywhere must be one token, not {:?}",
                o.tokens
            )));
        }
        let head_max =
            openings.iter().filter(|(o, _)| o.at_start).map(|(o, _)| o.tokens.len()).max().unwrap_or(0);
        let fresh = openings.iter().map(|_| None).collect();
        Ok(Self { openings, head: Vec::new(), head_max, committed: 0, open: None, fresh })
    }

    /// The opening that `t`, at output position `pos` after `before` (the output's tokens from
    /// its start, when `pos` is within the longest at-start opening), completes.
    fn opens(&self, t: TokenId, pos: usize, before: impl Fn(usize) -> TokenId) -> Option<usize> {
        self.openings.iter().position(|(o, _)| {
            let n = o.tokens.len();
            if o.at_start {
                pos + 1 == n && o.tokens[n - 1] == t && (0..n - 1).all(|j| before(j) == o.tokens[j])
            } else {
                o.tokens[0] == t
            }
        })
    }

    fn closes(&self, which: usize, t: TokenId) -> bool {
        self.openings[which].0.close == Some(t)
    }

    fn scan(&self, path: &[TokenId]) -> TagState {
        let mut state = match &self.open {
            Some((w, _)) => TagState::Committed(*w),
            None => TagState::Free,
        };
        for (i, &t) in path.iter().enumerate() {
            let pos = self.committed + i;
            state = match state {
                TagState::Free => {
                    // Output position j < pos: committed (in `head`, when j is that early) or
                    // on the path.
                    let before =
                        |j: usize| if j < self.committed { self.head[j] } else { path[j - self.committed] };
                    match self.opens(t, pos, before) {
                        Some(w) => TagState::Opened(w, i + 1),
                        None => TagState::Free,
                    }
                }
                TagState::Committed(w) | TagState::Opened(w, _) if self.closes(w, t) => TagState::Free,
                s => s,
            };
        }
        state
    }

    fn fresh(&mut self, which: usize) -> Result<&mut C> {
        if self.fresh[which].is_none() {
            self.fresh[which] = Some((self.openings[which].1)()?);
        }
        Ok(self.fresh[which].as_mut().expect("made above"))
    }
}

impl<C: TokenConstraint> TokenConstraint for TaggedConstraint<C> {
    fn mask_logits(&mut self, path: &[TokenId], logits: &mut [f32]) -> Result<()> {
        match self.scan(path) {
            TagState::Free => Ok(()),
            TagState::Committed(_) => self.open.as_mut().expect("a call is open").1.mask_logits(path, logits),
            TagState::Opened(w, k) => self.fresh(w)?.mask_logits(&path[k..], logits),
        }
    }

    fn forced(&mut self, max: usize) -> Result<Vec<TokenId>> {
        let Some((w, inner)) = self.open.as_mut() else { return Ok(Vec::new()) };
        let close = self.openings[*w].0.close;
        let mut forced = inner.forced(max)?;
        // Past the closing token the text is free: what the inner grammar says of it is not forced.
        if let Some(i) = forced.iter().position(|&t| Some(t) == close) {
            forced.truncate(i + 1);
        }
        Ok(forced)
    }

    fn commit(&mut self, tokens: &[TokenId]) -> Result<()> {
        for &t in tokens {
            let pos = self.committed;
            if self.head.len() < self.head_max {
                self.head.push(t);
            }
            self.committed += 1;
            match self.open.as_mut() {
                Some((w, inner)) => {
                    let w = *w;
                    inner.commit(&[t])?;
                    if self.closes(w, t) {
                        self.open = None;
                    }
                }
                None => {
                    if let Some(w) = self.opens(t, pos, |j| self.head[j]) {
                        let inner = match self.fresh[w].take() {
                            Some(c) => c,
                            None => (self.openings[w].1)()?,
                        };
                        self.open = Some((w, inner));
                    }
                }
            }
        }
        Ok(())
    }

    fn is_finished(&self) -> bool {
        // Free text may follow a call that closes; one that runs to the end of the output
        // finishes with its grammar.
        match &self.open {
            Some((w, inner)) => self.openings[*w].0.close.is_none() && inner.is_finished(),
            None => false,
        }
    }
}

/// A deterministic finite automaton over token ids: the enumerable toy grammar of the χ² tests
/// (and a reference implementation of the trait). State 0 is the start; `next[s][t]` is the state
/// after token `t`, `None` where `t` is forbidden. Test support: built for the crate's tests and
/// with the `test-support` feature.
#[cfg(any(test, feature = "test-support"))]
#[derive(Debug, Clone)]
pub struct DfaConstraint {
    next: Vec<Vec<Option<usize>>>,
    state: usize,
}

#[cfg(any(test, feature = "test-support"))]
impl DfaConstraint {
    /// An automaton from its transition table (every target state must exist).
    pub fn new(next: Vec<Vec<Option<usize>>>) -> Result<Self> {
        let n = next.len();
        if n == 0 || next.iter().flatten().flatten().any(|&s| s >= n) {
            return Err(crate::EngineError::InvalidRequest(
                "DFA transitions must name existing states".into(),
            ));
        }
        Ok(Self { next, state: 0 })
    }

    /// The state after `path` from the committed state (None: a forbidden token on the way).
    fn walk(&self, path: &[TokenId]) -> Option<usize> {
        path.iter().try_fold(self.state, |s, &t| self.next[s].get(t as usize).copied().flatten())
    }

    /// Whether `token` is allowed after `path`.
    pub fn allows(&self, path: &[TokenId], token: TokenId) -> bool {
        self.walk(path).is_some_and(|s| self.next[s].get(token as usize).copied().flatten().is_some())
    }
}

#[cfg(any(test, feature = "test-support"))]
impl TokenConstraint for DfaConstraint {
    fn mask_logits(&mut self, path: &[TokenId], logits: &mut [f32]) -> Result<()> {
        let state = self.walk(path);
        for (t, l) in logits.iter_mut().enumerate() {
            let ok = state.is_some_and(|s| self.next[s].get(t).copied().flatten().is_some());
            if !ok {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn forced(&mut self, max: usize) -> Result<Vec<TokenId>> {
        let mut out = Vec::new();
        let mut s = self.state;
        while out.len() < max {
            let mut allowed = self.next[s].iter().enumerate().filter_map(|(t, n)| n.map(|n| (t, n)));
            match (allowed.next(), allowed.next()) {
                (Some((t, n)), None) => {
                    out.push(t as TokenId);
                    s = n;
                }
                _ => break,
            }
        }
        Ok(out)
    }

    fn commit(&mut self, tokens: &[TokenId]) -> Result<()> {
        self.state = self.walk(tokens).ok_or_else(|| {
            crate::EngineError::State(format!("tokens {tokens:?} are not allowed by the grammar"))
        })?;
        Ok(())
    }

    fn is_finished(&self) -> bool {
        self.next[self.state].iter().all(Option::is_none)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens 0..5; the call opens with 4 and closes with 3. Inside: 2 forced, then 0 or 1,
    /// then 3 forced.
    fn tagged() -> TaggedConstraint<DfaConstraint> {
        let mut next = vec![vec![None; 5]; 4];
        next[0][2] = Some(1);
        next[1][0] = Some(2);
        next[1][1] = Some(2);
        next[2][3] = Some(3);
        let inner = DfaConstraint::new(next).unwrap();
        let (fenced, tagged) = (inner.clone(), inner);
        TaggedConstraint::new(vec![
            (
                Opening { tokens: vec![4], at_start: false, close: Some(3) },
                Box::new(move || Ok(tagged.clone())),
            ),
            (
                Opening { tokens: vec![1, 1], at_start: true, close: None },
                Box::new(move || Ok(fenced.clone())),
            ),
        ])
        .unwrap()
    }

    fn allowed(c: &mut TaggedConstraint<DfaConstraint>, path: &[TokenId]) -> Vec<TokenId> {
        let mut l = vec![0.0; 5];
        c.mask_logits(path, &mut l).unwrap();
        (0..5).filter(|&t| l[t as usize].is_finite()).collect()
    }

    #[test]
    fn a_tagged_grammar_holds_only_inside_its_tags_whatever_the_steps() {
        let mut c = tagged();
        assert_eq!(allowed(&mut c, &[]), vec![0, 1, 2, 3, 4], "free text before a call");
        assert_eq!(allowed(&mut c, &[0, 4]), vec![2], "a call opened inside the path");
        assert_eq!(allowed(&mut c, &[4, 2]), vec![0, 1]);
        assert_eq!(allowed(&mut c, &[4, 2, 1]), vec![3], "only the closing tag ends it");
        assert_eq!(allowed(&mut c, &[4, 2, 1, 3]), vec![0, 1, 2, 3, 4], "free again after it");
        assert_eq!(allowed(&mut c, &[4, 2, 1, 3, 4]), vec![2], "a second call");
        assert!(c.forced(8).unwrap().is_empty(), "nothing is forced outside a call");
        // Every split of one token sequence into commits and a path gives the same masks.
        for text in [&[0, 4, 2, 1, 3, 1, 4, 2, 0, 3, 0][..], &[1, 1, 2, 0, 3], &[1, 0, 1, 1, 4, 2, 1, 3]] {
            for split in 0..=text.len() {
                let mut c = tagged();
                c.commit(&text[..split]).unwrap();
                for end in split..text.len() {
                    let mut whole = tagged();
                    assert_eq!(
                        allowed(&mut c, &text[split..end]),
                        allowed(&mut whole, &text[..end]),
                        "{text:?}: committed {split}, path to {end}"
                    );
                }
            }
        }
        let mut c = tagged();
        c.commit(&[1, 4]).unwrap();
        assert_eq!(c.forced(8).unwrap(), vec![2], "the call's forced tokens");
        c.commit(&[2, 0]).unwrap();
        assert_eq!(c.forced(8).unwrap(), vec![3], "cut at the closing tag");
        c.commit(&[3]).unwrap();
        assert!(c.forced(8).unwrap().is_empty() && !c.is_finished());
        assert!(tagged().commit(&[4, 0]).is_err(), "a token the call forbids is refused");
        // An output that starts with 1 1 is one call to its end; 1 1 later is free text.
        let mut c = tagged();
        assert_eq!(allowed(&mut c, &[1]), vec![0, 1, 2, 3, 4]);
        assert_eq!(allowed(&mut c, &[1, 1]), vec![2]);
        assert_eq!(allowed(&mut c, &[1, 1, 2, 0, 3]), Vec::<TokenId>::new(), "nothing after it");
        assert_eq!(allowed(&mut c, &[0, 1, 1]), vec![0, 1, 2, 3, 4]);
        c.commit(&[1]).unwrap();
        assert_eq!(allowed(&mut c, &[1]), vec![2], "opened across the committed boundary");
        c.commit(&[1, 2, 0]).unwrap();
        assert_eq!(c.forced(8).unwrap(), vec![3]);
        assert!(!c.is_finished());
        c.commit(&[3]).unwrap();
        assert!(c.is_finished(), "a call to the end finishes with its grammar");
        let bad = TaggedConstraint::<DfaConstraint>::new(vec![(
            Opening { tokens: vec![1, 2], at_start: false, close: None },
            Box::new(|| unreachable!()),
        )]);
        assert!(bad.is_err(), "an opening anywhere is one token");
    }

    #[test]
    fn a_dfa_masks_forces_and_commits() {
        // 0 -a-> 1 (forced) -b|c-> 2 (end).
        let mut d = DfaConstraint::new(vec![
            vec![Some(1), None, None],
            vec![None, Some(2), Some(2)],
            vec![None, None, None],
        ])
        .unwrap();
        assert_eq!(d.forced(5).unwrap(), vec![0]);
        let mut l = vec![1.0; 3];
        d.mask_logits(&[0], &mut l).unwrap();
        assert_eq!(l, vec![f32::NEG_INFINITY, 1.0, 1.0]);
        assert!(d.commit(&[1]).is_err());
        d.commit(&[0, 2]).unwrap();
        assert!(d.is_finished());
        assert!(DfaConstraint::new(vec![vec![Some(3)]]).is_err());
    }
}
