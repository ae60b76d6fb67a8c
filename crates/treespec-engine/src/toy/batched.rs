//! [`ToyBatchLm`]: toy models behind the [`BatchedLm`] seam — one [`ToyLm`] per lane, so the
//! batching scheduler, its lanes and its interleaving are exercised (and proven lossless by χ²)
//! exactly as on llama.cpp, where the lanes share one KV cache.

use treespec_core::TokenId;

use super::slots::ToySlots;
use super::{ToyLm, ToyModel};
use crate::backend::{BatchRoom, BatchedLm, CausalLm, LaneId, LaneWork, Logits};
use crate::error::Result;

/// Up to `lanes` toy sequences of `context` positions each.
#[derive(Debug, Clone)]
pub struct ToyBatchLm {
    slots: ToySlots,
    /// Positions all lanes together may hold (admission control), when not every lane's whole
    /// context.
    capacity: Option<usize>,
    /// The most rows one forward held.
    pub widest: usize,
    /// With a prefix cache ([`ToyBatchLm::with_prefix_cache`]): each open lane's scope, and the
    /// text of finished lanes (most recent last), reused by a later lane of the same scope.
    prefix_cache: Option<PrefixCache>,
}

/// Finished lanes' text, for a later lane of the same scope to reuse (as llama.cpp's lanes keep
/// a finished request's cells).
#[derive(Debug, Clone, Default)]
struct PrefixCache {
    scopes: Vec<(LaneId, u64)>,
    finished: Vec<(u64, Vec<TokenId>)>,
}

/// Finished lanes' texts a prefix cache keeps.
const CACHED_PREFIXES: usize = 8;

impl ToyBatchLm {
    /// `lanes` lanes over `model`, each with a context of `context` positions.
    pub fn new(model: ToyModel, context: usize, lanes: usize) -> Self {
        Self { slots: ToySlots::new(model, context, lanes), capacity: None, widest: 0, prefix_cache: None }
    }

    /// Keep the text of finished lanes, and start a lane opened later with the same scope from
    /// the longest prefix of its prompt one of them holds (reported as reused, not prefilled).
    pub fn with_prefix_cache(mut self) -> Self {
        self.prefix_cache = Some(PrefixCache::default());
        self
    }

    /// Let all lanes together hold only `cells` positions, as lanes sharing one KV cache do
    /// (llama.cpp's), so that admission control has requests wait for room.
    pub fn with_capacity(mut self, cells: usize) -> Self {
        self.capacity = Some(cells);
        self
    }

    fn lane(&mut self, lane: LaneId) -> Result<&mut ToyLm> {
        self.slots.get_mut(lane)
    }
}

impl BatchedLm for ToyBatchLm {
    fn vocab_size(&self) -> usize {
        self.slots.model.vocab
    }

    fn context_size(&self) -> usize {
        self.slots.context
    }

    fn capacity(&self) -> usize {
        self.capacity.unwrap_or(self.slots.context * self.slots.len())
    }

    fn open(&mut self, prompt_head: &[TokenId], scope: u64) -> Result<(LaneId, usize)> {
        let lane = self.slots.open()?;
        let Some(cache) = self.prefix_cache.as_mut() else { return Ok((lane, 0)) };
        cache.scopes.push((lane, scope));
        let common = |t: &[TokenId]| t.iter().zip(prompt_head).take_while(|(a, b)| a == b).count();
        let reused = cache.finished.iter().filter(|(s, _)| *s == scope).map(|(_, t)| common(t)).max();
        let reused = reused.unwrap_or(0);
        if reused > 0 {
            self.slots.get_mut(lane)?.prefill(&prompt_head[..reused])?;
        }
        Ok((lane, reused))
    }

    fn committed_len(&self, lane: LaneId) -> usize {
        self.slots.get(lane).map_or(0, |l| l.committed_len())
    }

    fn room(&self) -> BatchRoom {
        BatchRoom { rows: usize::MAX / 2, paths: usize::MAX / 2 }
    }

    fn forward(&mut self, work: &[LaneWork<'_>]) -> Result<Logits<'_>> {
        let vocab = self.slots.model.vocab;
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
        if let Some(cache) = self.prefix_cache.as_mut() {
            let text = self.slots.get(lane).map(|l| l.committed().to_vec()).unwrap_or_default();
            if let Some(i) = cache.scopes.iter().position(|(l, _)| *l == lane) {
                let (_, scope) = cache.scopes.swap_remove(i);
                if !text.is_empty() {
                    cache.finished.push((scope, text));
                    if cache.finished.len() > CACHED_PREFIXES {
                        cache.finished.remove(0);
                    }
                }
            }
        }
        self.slots.close(lane);
    }
}
