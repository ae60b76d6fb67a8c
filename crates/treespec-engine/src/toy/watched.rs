//! A toy model that shows a test what a drafter did to it: the prompt tokens it was given and
//! its committed text after every commit, in a log the test keeps a handle to (the drafter owns
//! the model itself).

use std::sync::{Arc, Mutex, MutexGuard};

use treespec_core::TokenId;

use super::ToyLm;
use crate::backend::{CausalLm, Logits, TreeBatch};
use crate::error::Result;

/// What a [`WatchedLm`] saw.
#[derive(Debug, Default)]
pub struct Watch {
    /// Tokens given by `prefill` (prompt processing), over the model's life.
    pub prefilled: usize,
    /// The committed tokens after each `commit`.
    pub commits: Vec<Vec<TokenId>>,
}

/// A [`ToyLm`] that records into a shared [`Watch`].
pub struct WatchedLm {
    lm: ToyLm,
    watch: Arc<Mutex<Watch>>,
}

impl WatchedLm {
    /// `lm`, and the handle to what it will see.
    pub fn new(lm: ToyLm) -> (Self, Arc<Mutex<Watch>>) {
        let watch = Arc::new(Mutex::new(Watch::default()));
        (Self { lm, watch: watch.clone() }, watch)
    }

    fn watch(&self) -> MutexGuard<'_, Watch> {
        self.watch.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl CausalLm for WatchedLm {
    fn vocab_size(&self) -> usize {
        self.lm.vocab_size()
    }
    fn context_size(&self) -> usize {
        self.lm.context_size()
    }
    fn committed_len(&self) -> usize {
        self.lm.committed_len()
    }
    fn pending_len(&self) -> usize {
        self.lm.pending_len()
    }
    fn prefill(&mut self, tokens: &[TokenId]) -> Result<()> {
        self.watch().prefilled += tokens.len();
        self.lm.prefill(tokens)
    }
    fn forward(&mut self, batch: &TreeBatch) -> Result<Logits<'_>> {
        self.lm.forward(batch)
    }
    fn commit(&mut self, path: &[usize]) -> Result<()> {
        self.lm.commit(path)?;
        let committed = self.lm.committed().to_vec();
        self.watch().commits.push(committed);
        Ok(())
    }
    fn truncate(&mut self, len: usize) -> Result<()> {
        self.lm.truncate(len)
    }
    fn computes_on_cpu(&self) -> bool {
        self.lm.computes_on_cpu()
    }
}
