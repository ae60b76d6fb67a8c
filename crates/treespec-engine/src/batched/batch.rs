//! [`Batch`]: the requests decoding together, the one core every batched loop runs on (the tests'
//! and benchmarks' [`run_batched`](super::run_batched), a server's scheduler).

use super::phases::step_lanes;
use super::{Lane, LaneStep, StepLimits, StepReport};
use crate::backend::BatchedLm;
use crate::backend::TokenBytes;
use crate::constraint::TokenConstraint;
use crate::drafter::Drafter;
use crate::error::Result;
use crate::generation::Generation;
use crate::generation_io::GenerateOutput;
use crate::shared_draft::SharedDraft;

/// The requests decoding together on one [`BatchedLm`], in the order they joined: each a
/// [`Lane`] with its owner's data `T` beside it (what the owner reports to, its job's index…),
/// so a loop keeps no vectors in parallel with the lanes. Member `k` is the `k`-th request still
/// in the batch: [`step`](Self::step)'s results come in member order, and a member that
/// [`leave`](Self::leave)s shifts the later ones down by one.
#[derive(Debug)]
pub struct Batch<'d, T> {
    members: Vec<(Lane<'d>, T)>,
}

impl<T> Default for Batch<'_, T> {
    fn default() -> Self {
        Self { members: Vec::new() }
    }
}

impl<'d, T> Batch<'d, T> {
    /// No requests.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests in the batch.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True when no request is in the batch.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Add a request as the last member: open a lane of `lm` for its prompt head (reusing a
    /// cached prefix of the same `scope` only) and keep `data` beside it. Returns how many prompt
    /// tokens the lane already held. When no lane opens, the request does not join (its
    /// generation, drafter and `data` are dropped).
    pub fn join(
        &mut self,
        lm: &mut dyn BatchedLm,
        generation: Generation,
        drafter: Box<dyn Drafter + 'd>,
        constraint: Option<Box<dyn TokenConstraint + 'd>>,
        scope: u64,
        data: T,
    ) -> Result<usize> {
        let (lane, cached) = lm.open(generation.prompt_head(), scope)?;
        self.members.push((Lane::new(lane, generation, drafter, constraint, cached), data));
        Ok(cached)
    }

    /// One step over every member (the phases of `phases.rs`): what it did for each, in member order,
    /// and what it cost.
    pub fn step(
        &mut self,
        lm: &mut dyn BatchedLm,
        limits: StepLimits,
        bytes: Option<&dyn TokenBytes>,
        draft: Option<&SharedDraft<'_>>,
    ) -> (Vec<LaneStep>, StepReport) {
        let mut lanes: Vec<&mut Lane<'d>> = self.members.iter_mut().map(|(lane, _)| lane).collect();
        step_lanes(lm, &mut lanes, limits, bytes, draft)
    }

    /// Member `k`'s lane.
    pub fn lane(&self, k: usize) -> &Lane<'d> {
        &self.members[k].0
    }

    /// Member `k`'s data.
    pub fn data(&self, k: usize) -> &T {
        &self.members[k].1
    }

    /// Member `k`'s data, to change.
    pub fn data_mut(&mut self, k: usize) -> &mut T {
        &mut self.members[k].1
    }

    /// Every member's lane and data, in member order.
    pub fn iter(&self) -> impl Iterator<Item = (&Lane<'d>, &T)> + '_ {
        self.members.iter().map(|(lane, data)| (lane, data))
    }

    /// Member `k` leaves: its lane of `lm` is closed, and its generation ends — `finished`, with
    /// its output (the drafter learns the text); else cancelled (the drafter still learns what
    /// was emitted), with none. Returns its data and output.
    pub fn leave(&mut self, lm: &mut dyn BatchedLm, k: usize, finished: bool) -> (T, Option<GenerateOutput>) {
        let (mut lane, data) = self.members.remove(k);
        lm.close(lane.lane);
        if finished {
            (data, Some(lane.generation.finish(lane.drafter.as_mut())))
        } else {
            lane.generation.cancel(lane.drafter.as_mut());
            (data, None)
        }
    }

    /// Member `k` is dropped with its lane closed, its generation neither finished nor cancelled
    /// (its drafter learns nothing): for a loop that gives up on every request at once.
    pub fn abandon(&mut self, lm: &mut dyn BatchedLm, k: usize) -> T {
        let (lane, data) = self.members.remove(k);
        lm.close(lane.lane);
        data
    }

    /// The member whose lane holds the most committed context (the last of equals), if any: the
    /// one to end when the shared cache is full and no request can add a row.
    pub fn longest(&self, lm: &dyn BatchedLm) -> Option<usize> {
        (0..self.members.len()).max_by_key(|&k| lm.committed_len(self.members[k].0.lane))
    }
}

#[cfg(test)]
mod tests {
    use treespec_core::sampling::SamplingParams;
    use treespec_core::TokenId;

    use super::*;
    use crate::drafter::PlainDrafter;
    use crate::generation_io::GenerateRequest;
    use crate::stop::FinishReason;
    use crate::toy::{ToyBatchLm, ToyModel};

    fn join(
        batch: &mut Batch<'_, &'static str>,
        lm: &mut ToyBatchLm,
        prompt: &[TokenId],
        name: &'static str,
    ) {
        let request = GenerateRequest::new(prompt.to_vec(), 4, SamplingParams::greedy(), 7);
        let generation = Generation::new(request, lm.context_size(), lm.vocab_size(), None).unwrap();
        assert_eq!(batch.join(lm, generation, Box::new(PlainDrafter), None, 0, name).unwrap(), 0);
    }

    /// Members keep their data beside them in join order; the longest is the one holding the most
    /// context; one that leaves unfinished gives no output and the later members move down; the
    /// others run to their length.
    #[test]
    fn members_keep_their_data_through_steps_and_leaves() {
        let mut lm = ToyBatchLm::new(ToyModel::new(7, 2, 5), 64, 3);
        let mut batch: Batch<'_, &'static str> = Batch::new();
        join(&mut batch, &mut lm, &[1, 2], "a");
        join(&mut batch, &mut lm, &[3, 4, 5, 6], "b");
        join(&mut batch, &mut lm, &[0, 1, 2], "c");
        assert_eq!(batch.len(), 3);
        // The first step reads the prompt heads (1 + 3 + 2 rows) and, riding them, each request's
        // first tree (its root: 3 rows); the second decodes another token each.
        let (results, report) = batch.step(&mut lm, StepLimits::default(), None, None);
        assert!(results.iter().all(|r| matches!(r, LaneStep::Stepped(o) if o.emitted.len() == 1)));
        assert_eq!((report.rows, report.prefilled, report.decoding), (9, 6, 3));
        let (results, report) = batch.step(&mut lm, StepLimits::default(), None, None);
        assert!(results.iter().all(|r| matches!(r, LaneStep::Stepped(o) if o.emitted.len() == 1)));
        assert_eq!((report.rows, report.decoding), (3, 3));
        assert_eq!(batch.longest(&lm), Some(1));
        *batch.data_mut(2) = "c2";
        assert_eq!(batch.leave(&mut lm, 1, false).0, "b");
        assert_eq!(batch.iter().map(|(_, d)| *d).collect::<Vec<_>>(), ["a", "c2"]);
        assert!(batch.leave(&mut lm, 0, false).1.is_none());
        assert_eq!(*batch.data(0), "c2");
        // c emitted 2 of its 4 tokens: 2 more steps.
        for k in 0..2 {
            let (results, _) = batch.step(&mut lm, StepLimits::default(), None, None);
            assert!(matches!(&results[0], LaneStep::Stepped(o) if o.done == (k == 1)), "step {k}");
        }
        let (name, output) = batch.leave(&mut lm, 0, true);
        let output = output.unwrap();
        assert_eq!((name, output.tokens.len(), output.finish_reason), ("c2", 4, FinishReason::Length));
        assert!(batch.is_empty() && batch.longest(&lm).is_none());
    }
}
