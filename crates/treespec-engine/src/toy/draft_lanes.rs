//! [`ToyDraftLanes`]: toy draft models behind the [`DraftLanes`] seam — one [`ToyLm`] per lane,
//! so a [`SharedDraft`](crate::SharedDraft)'s rendezvous and batched draft forwards are exercised
//! (and proven lossless by χ²) exactly as on llama.cpp, where the lanes share one KV cache.

use super::slots::ToySlots;
use super::ToyModel;
use crate::backend::{CausalLm, DraftFeed, DraftLanes, LaneId, Logits};
use crate::error::{EngineError, Result};

/// Up to `lanes` toy draft sequences of `context` positions each.
#[derive(Debug, Clone)]
pub struct ToyDraftLanes {
    slots: ToySlots,
    /// The most lanes one forward held.
    pub widest: usize,
}

impl ToyDraftLanes {
    /// `lanes` lanes over `model`, each with a context of `context` positions.
    pub fn new(model: ToyModel, context: usize, lanes: usize) -> Self {
        Self { slots: ToySlots::new(model, context, lanes), widest: 0 }
    }
}

impl DraftLanes for ToyDraftLanes {
    fn vocab_size(&self) -> usize {
        self.slots.model.vocab
    }

    fn context_size(&self) -> usize {
        self.slots.context
    }

    fn free_paths(&self) -> usize {
        usize::MAX
    }

    fn open(&mut self) -> Result<LaneId> {
        self.slots.open()
    }

    fn close(&mut self, lane: LaneId) {
        self.slots.close(lane);
    }

    fn committed_len(&self, lane: LaneId) -> usize {
        self.slots.get(lane).map_or(0, |l| l.committed_len())
    }

    fn pending_len(&self, lane: LaneId) -> usize {
        self.slots.get(lane).map_or(0, |l| l.pending_len())
    }

    fn forward(&mut self, work: &[(LaneId, DraftFeed<'_>)]) -> Result<Logits<'_>> {
        // Every lane is checked before any is fed, so a failed forward leaves nothing behind.
        for (i, (lane, _)) in work.iter().enumerate() {
            self.slots.get(*lane)?;
            if work[..i].iter().any(|(l, _)| l == lane) {
                return Err(EngineError::State(format!("draft lane {lane} fed twice in one forward")));
            }
        }
        self.widest = self.widest.max(work.len());
        let mut data = Vec::new();
        let mut fed: Vec<(LaneId, usize, usize)> = Vec::new(); // (lane, committed, pending) before
        for &(lane, feed) in work {
            let lm = self.slots.get_mut(lane)?;
            fed.push((lane, lm.committed_len(), lm.pending_len()));
            let out = match feed {
                DraftFeed::Prefill(tokens) => lm.prefill(tokens).map(|()| Vec::new()),
                DraftFeed::Tree(batch) => lm.forward(batch).map(|l| l.row_data().to_vec()),
            };
            match out {
                Ok(rows) => data.extend(rows),
                Err(e) => {
                    // Take back what this forward fed to the lanes before.
                    for (lane, committed, pending) in fed.drain(..) {
                        if let Ok(lm) = self.slots.get_mut(lane) {
                            lm.take_back(committed, pending);
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(Logits::new(self.slots.model.vocab, data))
    }

    fn commit(&mut self, lane: LaneId, path: &[usize]) -> Result<()> {
        self.slots.get_mut(lane)?.commit(path)
    }

    fn truncate(&mut self, lane: LaneId, len: usize) -> Result<()> {
        self.slots.get_mut(lane)?.truncate(len)
    }
}
