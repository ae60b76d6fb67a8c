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

/// A deterministic finite automaton over token ids: the enumerable toy grammar of the χ² tests
/// (and a reference implementation of the trait). State 0 is the start; `next[s][t]` is the state
/// after token `t`, `None` where `t` is forbidden.
#[derive(Debug, Clone)]
pub struct DfaConstraint {
    next: Vec<Vec<Option<usize>>>,
    state: usize,
}

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
