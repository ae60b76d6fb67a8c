//! [`ToyBatchLm`]: toy models behind the [`BatchedLm`] seam — one [`ToyLm`] per lane, so the
//! batching scheduler, its lanes and its interleaving are exercised (and proven lossless by χ²)
//! exactly as on llama.cpp, where the lanes share one KV cache.

use treespec_core::TokenId;

use super::{ToyLm, ToyModel};
use crate::batched::{BatchRoom, BatchedLm, LaneId, LaneWork};
use crate::error::{EngineError, Result};
use crate::model::{CausalLm, Logits};

/// Up to `lanes` toy sequences of `context` positions each.
#[derive(Debug, Clone)]
pub struct ToyBatchLm {
    model: ToyModel,
    context: usize,
    lanes: Vec<Option<ToyLm>>,
    /// The most rows one forward held.
    pub widest: usize,
}

impl ToyBatchLm {
    /// `lanes` lanes over `model`, each with a context of `context` positions.
    pub fn new(model: ToyModel, context: usize, lanes: usize) -> Self {
        Self { model, context, lanes: vec![None; lanes.max(1)], widest: 0 }
    }

    fn lane(&mut self, lane: LaneId) -> Result<&mut ToyLm> {
        self.lanes
            .get_mut(lane)
            .and_then(Option::as_mut)
            .ok_or_else(|| EngineError::State(format!("lane {lane} is not open")))
    }
}

impl BatchedLm for ToyBatchLm {
    fn vocab_size(&self) -> usize {
        self.model.vocab
    }

    fn context_size(&self) -> usize {
        self.context
    }

    fn capacity(&self) -> usize {
        self.context * self.lanes.len()
    }

    fn open(&mut self, _prompt_head: &[TokenId]) -> Result<(LaneId, usize)> {
        let free = self
            .lanes
            .iter()
            .position(Option::is_none)
            .ok_or_else(|| EngineError::InvalidRequest("every lane is busy".into()))?;
        self.lanes[free] = Some(ToyLm::new(self.model.clone(), self.context));
        Ok((free, 0))
    }

    fn committed_len(&self, lane: LaneId) -> usize {
        self.lanes.get(lane).and_then(Option::as_ref).map_or(0, |l| l.committed_len())
    }

    fn room(&self) -> BatchRoom {
        BatchRoom { rows: usize::MAX / 2, paths: usize::MAX / 2 }
    }

    fn forward(&mut self, work: &[LaneWork<'_>]) -> Result<Logits<'_>> {
        let vocab = self.model.vocab;
        let mut data = Vec::new();
        let mut rows = 0;
        for w in work {
            match *w {
                LaneWork::Prefill { lane, tokens } => {
                    self.lane(lane)?.prefill(tokens)?;
                    rows += tokens.len();
                }
                LaneWork::Tree { lane, batch } => {
                    let logits = self.lane(lane)?.forward(batch)?;
                    for r in 0..logits.rows() {
                        data.extend_from_slice(logits.row(r));
                    }
                    rows += batch.len();
                }
            }
        }
        self.widest = self.widest.max(rows);
        Ok(Logits::new(vocab, data))
    }

    fn commit(&mut self, lane: LaneId, path: &[usize]) -> Result<()> {
        self.lane(lane)?.commit(path)
    }

    fn settle(&mut self) -> Result<()> {
        Ok(())
    }

    fn close(&mut self, lane: LaneId) {
        if let Some(l) = self.lanes.get_mut(lane) {
            *l = None;
        }
    }
}
