//! A [`Constraint`] as the generation loop's [`TokenConstraint`]: the verifier asks for masks at
//! tree nodes in walk order, so the constraint keeps the path it has advanced past the committed
//! state and moves to each new node by rolling back to the common prefix and advancing the rest
//! (rollback is ~0.1 µs in llguidance; a mask a few µs).

use treespec_engine::{EngineError, TokenConstraint};

use crate::{Constraint, GrammarError, TokenId};

/// A request's grammar state in the generation loop.
pub struct DecodingConstraint {
    inner: Constraint,
    /// Tokens advanced past the committed state (the last masked node's path).
    path: Vec<TokenId>,
}

fn engine(e: GrammarError) -> EngineError {
    EngineError::State(format!("grammar: {e}"))
}

impl DecodingConstraint {
    /// Wrap a fresh request constraint.
    pub fn new(inner: Constraint) -> Self {
        Self { inner, path: Vec::new() }
    }

    /// Put the state after `path`: roll back to the common prefix, advance the rest.
    fn seek(&mut self, path: &[TokenId]) -> Result<(), GrammarError> {
        let common = self.path.iter().zip(path).take_while(|(a, b)| a == b).count();
        self.inner.rollback(self.path.len() - common)?;
        self.path.truncate(common);
        for &t in &path[common..] {
            self.inner.advance(t)?;
            self.path.push(t);
        }
        Ok(())
    }
}

impl TokenConstraint for DecodingConstraint {
    fn mask_logits(&mut self, path: &[TokenId], logits: &mut [f32]) -> treespec_engine::Result<()> {
        if path.iter().any(|&t| self.inner.vocab().is_eos(t)) {
            // The path went through an end-of-generation token: what a tree drafts after it is
            // cut by the loop (and never committed), so its rows need no grammar.
            return Ok(());
        }
        self.seek(path).map_err(engine)?;
        let mask = self.inner.mask().map_err(engine)?;
        if mask.count() == 0 {
            return Err(EngineError::InvalidRequest(
                "the grammar allows no token here (no token of the vocabulary spells what it needs next)"
                    .into(),
            ));
        }
        mask.apply_to_logits(logits);
        Ok(())
    }

    fn forced(&mut self, max: usize) -> treespec_engine::Result<Vec<TokenId>> {
        self.seek(&[]).map_err(engine)?;
        self.inner.forced_tokens(max).map_err(engine)
    }

    fn commit(&mut self, tokens: &[TokenId]) -> treespec_engine::Result<()> {
        self.seek(&[]).map_err(engine)?;
        // Every token was drawn from its masked distribution: only the cheap check is needed.
        self.inner.commit(tokens).map_err(engine)
    }

    fn is_finished(&self) -> bool {
        self.path.is_empty() && self.inner.is_stopped()
    }
}
