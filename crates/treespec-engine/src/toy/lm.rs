//! A toy model behind the [`CausalLm`] seam, with the same committed/pending semantics a real
//! backend has, so the generation loop and drafters are exercised exactly as on llama.cpp.

use std::time::Duration;

use treespec_core::cost::shapes::ShapeBuckets;
use treespec_core::TokenId;

use super::model::ToyModel;
use crate::backend::{CausalLm, Logits, TreeBatch};
use crate::error::{EngineError, Result};

/// A toy model with a "KV cache": the committed tokens and the pending tree.
#[derive(Debug, Clone)]
pub struct ToyLm {
    model: ToyModel,
    context: usize,
    committed: Vec<TokenId>,
    /// Pending nodes: (token, parent pending index).
    pending: Vec<(TokenId, Option<usize>)>,
    /// How long a forward of n rows takes (none: as fast as it computes).
    forward_time: Option<fn(usize) -> Duration>,
    /// On a simulated device (see [`ToyLm::on_device`]): how long a forward of n rows takes after
    /// so many forwards of n rows in a row.
    device_time: Option<fn(usize, usize) -> Duration>,
    /// The rows of the last forward, and how many forwards in a row had them.
    last_shape: (usize, usize),
    /// The shapes forwards are padded to (see [`CausalLm::pad_shapes`]).
    padding: Option<ShapeBuckets>,
}

impl ToyLm {
    /// Wrap a toy model with a context window of `context` positions.
    pub fn new(model: ToyModel, context: usize) -> Self {
        Self {
            model,
            context,
            committed: Vec::new(),
            pending: Vec::new(),
            forward_time: None,
            device_time: None,
            last_shape: (0, 0),
            padding: None,
        }
    }

    /// A toy on a simulated machine: each forward of n rows takes at least `time(n)` (a test of
    /// what a drafter does where the cost curve it is given is not the machine's).
    pub fn with_forward_time(mut self, time: fn(usize) -> Duration) -> Self {
        self.forward_time = Some(time);
        self
    }

    /// A toy on a simulated device: its forwards do not compute on this process's CPU threads
    /// ([`CausalLm::computes_on_cpu`] is false), and a forward of n rows takes
    /// `time(n, repeats)`, `repeats` being how many forwards of n rows came right before it (a
    /// device replays a captured graph for a shape that repeats). A test of cost measurement on
    /// a GPU.
    pub fn on_device(mut self, time: fn(usize, usize) -> Duration) -> Self {
        self.device_time = Some(time);
        self
    }

    /// The conditionals.
    pub fn model(&self) -> &ToyModel {
        &self.model
    }

    /// The committed tokens.
    pub fn committed(&self) -> &[TokenId] {
        &self.committed
    }

    /// Back to `committed` committed tokens and `pending` pending nodes (a batched draft forward
    /// that failed takes back what it fed).
    pub(crate) fn take_back(&mut self, committed: usize, pending: usize) {
        self.committed.truncate(committed);
        self.pending.truncate(pending);
    }

    /// Feed `n` filler rows above pending node `top` (attached to the prefix), compute them as
    /// a backend would, and take them out again: nothing of them may reach the caller.
    fn compute_filler(&mut self, top: usize, n: usize) {
        for _ in 0..n {
            self.pending.push((0, None));
            let mut ctx = self.committed.clone();
            ctx.push(0);
            std::hint::black_box(self.model.logits(&ctx));
        }
        self.pending.truncate(top);
    }

    fn depth(&self, idx: usize) -> usize {
        let mut d = 0;
        let mut at = self.pending[idx].1;
        while let Some(p) = at {
            d += 1;
            at = self.pending[p].1;
        }
        d
    }

    fn path_tokens(&self, idx: usize) -> Vec<TokenId> {
        let mut path = Vec::new();
        let mut at = Some(idx);
        while let Some(i) = at {
            path.push(self.pending[i].0);
            at = self.pending[i].1;
        }
        path.reverse();
        path
    }
}

impl CausalLm for ToyLm {
    fn vocab_size(&self) -> usize {
        self.model.vocab
    }

    fn context_size(&self) -> usize {
        self.context
    }

    fn committed_len(&self) -> usize {
        self.committed.len()
    }

    fn pending_len(&self) -> usize {
        self.pending.len()
    }

    fn prefill(&mut self, tokens: &[TokenId]) -> Result<()> {
        if !self.pending.is_empty() {
            return Err(EngineError::State("prefill with pending nodes".into()));
        }
        if self.committed.len() + tokens.len() > self.context {
            return Err(EngineError::PromptTooLong {
                prompt: self.committed.len() + tokens.len(),
                context: self.context,
            });
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.model.vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "token {t} outside vocabulary of {}",
                self.model.vocab
            )));
        }
        self.committed.extend_from_slice(tokens);
        Ok(())
    }

    fn forward(&mut self, batch: &TreeBatch) -> Result<Logits<'_>> {
        if batch.tokens.len() != batch.parents.len() || batch.tokens.len() != batch.logits.len() {
            return Err(EngineError::State("batch fields of different lengths".into()));
        }
        let real = batch.tokens.len();
        // Padded, the forward runs as its shape (filler rows computed and dropped below), as
        // long as the filler fits the context.
        let rows = match &self.padding {
            Some(b) if self.committed.len() + self.pending.len() + b.shape(real) <= self.context => {
                b.shape(real)
            }
            _ => real,
        };
        if let Some(time) = self.forward_time {
            std::thread::sleep(time(rows));
        }
        let repeats = if self.last_shape.0 == rows { self.last_shape.1 } else { 0 };
        if let Some(time) = self.device_time {
            std::thread::sleep(time(rows, repeats));
        }
        self.last_shape = (rows, repeats + 1);
        let base = self.pending.len();
        let mut data = Vec::new();
        for (i, (&tok, &parent)) in batch.tokens.iter().zip(&batch.parents).enumerate() {
            if tok as usize >= self.model.vocab {
                return Err(EngineError::InvalidRequest(format!(
                    "token {tok} outside vocabulary of {}",
                    self.model.vocab
                )));
            }
            if let Some(p) = parent {
                if p >= base + i {
                    self.pending.truncate(base);
                    return Err(EngineError::State(format!(
                        "node {} names parent {p}, not fed before it",
                        base + i
                    )));
                }
            }
            self.pending.push((tok, parent));
            let pos = self.committed.len() + self.depth(base + i);
            if pos >= self.context {
                self.pending.truncate(base);
                return Err(EngineError::State(format!(
                    "position {pos} beyond the context of {}",
                    self.context
                )));
            }
            if batch.logits[i] {
                let mut ctx = self.committed.clone();
                ctx.extend(self.path_tokens(base + i));
                data.extend(self.model.logits(&ctx));
            }
        }
        self.compute_filler(base + real, rows - real);
        Ok(Logits::new(self.model.vocab, data))
    }

    fn commit(&mut self, path: &[usize]) -> Result<()> {
        let mut prev = None;
        for &i in path {
            let Some(&(tok, parent)) = self.pending.get(i) else {
                return Err(EngineError::State(format!(
                    "commit names pending node {i}, which does not exist"
                )));
            };
            if parent != prev {
                return Err(EngineError::State(format!("commit path is not a chain at pending node {i}")));
            }
            self.committed.push(tok);
            prev = Some(i);
        }
        self.pending.clear();
        Ok(())
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        self.pending.clear();
        self.committed.truncate(len);
        Ok(())
    }

    fn computes_on_cpu(&self) -> bool {
        self.device_time.is_none()
    }

    fn pad_shapes(&mut self, buckets: Option<&ShapeBuckets>) -> bool {
        self.padding = buckets.cloned();
        true
    }
}
