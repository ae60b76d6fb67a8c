//! Toy sequences by lane id, for the toy batched target and the toy shared draft: one [`ToyLm`]
//! per open lane.

use super::{ToyLm, ToyModel};
use crate::backend::LaneId;
use crate::error::{EngineError, Result};

/// Up to a fixed number of toy sequences of `context` positions each.
#[derive(Debug, Clone)]
pub(crate) struct ToySlots {
    pub model: ToyModel,
    pub context: usize,
    lanes: Vec<Option<ToyLm>>,
    /// Free lanes, the lowest last (opened first).
    free: Vec<LaneId>,
}

impl ToySlots {
    /// `lanes` (at least one) free lanes over `model`.
    pub fn new(model: ToyModel, context: usize, lanes: usize) -> Self {
        let n = lanes.max(1);
        Self { model, context, lanes: vec![None; n], free: (0..n).rev().collect() }
    }

    /// How many lanes there are.
    pub fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Open the first free lane with an empty sequence.
    pub fn open(&mut self) -> Result<LaneId> {
        let free = self.free.pop().ok_or_else(|| EngineError::InvalidRequest("every lane is busy".into()))?;
        self.lanes[free] = Some(ToyLm::new(self.model.clone(), self.context));
        Ok(free)
    }

    /// Free a lane.
    pub fn close(&mut self, lane: LaneId) {
        if let Some(l) = self.lanes.get_mut(lane).filter(|l| l.is_some()) {
            *l = None;
            self.free.push(lane);
        }
    }

    /// An open lane's sequence.
    pub fn get(&self, lane: LaneId) -> Result<&ToyLm> {
        self.lanes.get(lane).and_then(Option::as_ref).ok_or_else(|| not_open(lane))
    }

    /// An open lane's sequence, to feed.
    pub fn get_mut(&mut self, lane: LaneId) -> Result<&mut ToyLm> {
        self.lanes.get_mut(lane).and_then(Option::as_mut).ok_or_else(|| not_open(lane))
    }
}

fn not_open(lane: LaneId) -> EngineError {
    EngineError::State(format!("lane {lane} is not open"))
}
