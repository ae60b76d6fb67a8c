//! One draft model for every request of a continuous batch, its forwards batched across requests.
//!
//! A drafter drafts with a loop of its own (a chain: one draft forward per token; a tree: one per
//! layer or per expanded node), so the draft forwards of different requests cannot be listed in
//! advance the way the target's rows are. Instead the requests of a step propose *concurrently*,
//! each on its own thread, and every draft forward is a rendezvous: a proposer hands its rows to
//! the [`SharedDraft`] and waits; once every proposer still drafting is waiting, the step's own
//! thread runs ONE forward holding all of their rows ([`DraftLanes::forward`]) and hands each its
//! logits. A proposer that finishes drafting leaves, so the others no longer wait for it.
//!
//! Each request drafts through a [`DraftLane`], a [`CausalLm`] over its own sequence of the shared
//! draft context, so every drafter runs unchanged. Only the step's thread ever runs the backend
//! (llama.cpp's thread pool stays with one caller); outside a step's proposals — the prompt
//! backlogs' drain, a lone proposer's forwards, commits — a call runs at once on the caller's
//! thread.
//!
//! A lane's prompt prefill is not run when the drafter asks for it (at the request's start) but
//! kept as a backlog that each batched step drains a chunk of ([`SharedDraft::drain`]), beside the
//! target's own chunked prefill: a long prompt does not stall every request while the draft reads
//! it. Whatever is left is fed before the lane's first draft forward.
//!
//! Batching the draft changes which rows share its forwards, hence (without `--exact` on the
//! draft) the last bits of its logits, never what a request emits: the target verifies every
//! proposal exactly as before.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use treespec_core::TokenId;

use crate::backend::{CausalLm, DraftFeed, DraftLanes, LaneId, Logits, TreeBatch};
use crate::error::{EngineError, Result};

/// Draft forwards counted for reports and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DraftCounters {
    /// Forwards run (one backend call each).
    pub forwards: u64,
    /// Lane feeds they held (a forward holding k lanes counts k).
    pub feeds: u64,
    /// Rows they held.
    pub rows: u64,
}

/// A lane's feed waiting for the step's next draft forward.
enum OwnedFeed {
    Prefill(Vec<TokenId>),
    Tree(TreeBatch),
}

impl OwnedFeed {
    fn borrow(&self) -> DraftFeed<'_> {
        match self {
            OwnedFeed::Prefill(t) => DraftFeed::Prefill(t),
            OwnedFeed::Tree(b) => DraftFeed::Tree(b),
        }
    }
}

struct State<'m> {
    lm: Box<dyn DraftLanes + 'm>,
    /// Proposers of the current step still drafting (0: no step under way; a call runs at once).
    seats: usize,
    /// Feeds waiting for the next forward: (ticket, lane, feed).
    queue: Vec<(u64, LaneId, OwnedFeed)>,
    /// Results not yet collected, by ticket: the feed's logits rows, row-major.
    done: HashMap<u64, Result<Vec<f32>>>,
    next_ticket: u64,
    counters: DraftCounters,
    /// Prompt tokens each lane has asked to prefill and the draft has not read yet, oldest
    /// lane first.
    backlog: Vec<(LaneId, Vec<TokenId>)>,
}

impl State<'_> {
    fn backlog_len(&self, lane: LaneId) -> usize {
        self.backlog.iter().find(|(l, _)| *l == lane).map_or(0, |(_, t)| t.len())
    }

    fn take_backlog(&mut self, lane: LaneId) -> Vec<TokenId> {
        match self.backlog.iter().position(|(l, _)| *l == lane) {
            Some(k) => self.backlog.remove(k).1,
            None => Vec::new(),
        }
    }

    fn queue(&mut self, lane: LaneId, feed: OwnedFeed) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.queue.push((ticket, lane, feed));
        ticket
    }

    /// Run every queued feed in one forward and file each feed's rows under its ticket. A failed
    /// forward is retried feed by feed, so a lane's bad feed fails that lane only.
    fn run(&mut self) {
        let queue = std::mem::take(&mut self.queue);
        if queue.is_empty() {
            return;
        }
        let work: Vec<(LaneId, DraftFeed<'_>)> = queue.iter().map(|(_, l, f)| (*l, f.borrow())).collect();
        let rows: usize = work.iter().map(|(_, f)| f.rows()).sum();
        match self.lm.forward(&work) {
            Ok(logits) => {
                let mut at = 0;
                for ((ticket, _, _), (_, feed)) in queue.iter().zip(&work) {
                    let n = feed.logits_rows();
                    let own = logits.slice(at..at + n);
                    at += n;
                    self.done.insert(*ticket, Ok(own.row_data().to_vec()));
                }
                self.counters.forwards += 1;
                self.counters.feeds += work.len() as u64;
                self.counters.rows += rows as u64;
            }
            Err(e) if work.len() == 1 => {
                self.done.insert(queue[0].0, Err(e));
            }
            Err(_) => {
                for (ticket, lane, feed) in &queue {
                    let one = [(*lane, feed.borrow())];
                    let r = self.lm.forward(&one).map(|l| l.row_data().to_vec());
                    if r.is_ok() {
                        self.counters.forwards += 1;
                        self.counters.feeds += 1;
                        self.counters.rows += feed.borrow().rows() as u64;
                    }
                    self.done.insert(*ticket, r);
                }
            }
        }
    }
}

struct Inner<'m> {
    state: Mutex<State<'m>>,
    /// Signalled when a feed is queued, a forward ran, or a proposer left.
    turn: Condvar,
    vocab: usize,
    context: usize,
}

impl<'m> Inner<'m> {
    fn lock(&self) -> MutexGuard<'_, State<'m>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'g>(&self, guard: MutexGuard<'g, State<'m>>) -> MutexGuard<'g, State<'m>> {
        self.turn.wait(guard).unwrap_or_else(|p| p.into_inner())
    }

    /// Score `feed` for `lane`: at once outside a step, else in the step's next batched forward.
    fn submit(&self, lane: LaneId, feed: OwnedFeed) -> Result<Vec<f32>> {
        let mut st = self.lock();
        let ticket = st.queue(lane, feed);
        if st.seats == 0 {
            st.run();
        } else {
            self.turn.notify_all();
        }
        loop {
            if let Some(r) = st.done.remove(&ticket) {
                return r;
            }
            st = self.wait(st);
        }
    }
}

/// One draft model shared by every request of a continuous batch (cheap to clone: a handle).
#[derive(Clone)]
pub struct SharedDraft<'m> {
    inner: Arc<Inner<'m>>,
}

impl std::fmt::Debug for SharedDraft<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedDraft").field("counters", &self.counters()).finish_non_exhaustive()
    }
}

/// A proposer's place in a step's rendezvous: the step's draft forwards wait for it until it is
/// dropped (when its proposal is done, or its thread unwinds).
pub struct Seat<'m> {
    inner: Arc<Inner<'m>>,
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        let mut st = self.inner.lock();
        st.seats -= 1;
        drop(st);
        self.inner.turn.notify_all();
    }
}

impl<'m> SharedDraft<'m> {
    /// Share `lm` among requests.
    pub fn new(lm: impl DraftLanes + 'm) -> Self {
        let (vocab, context) = (lm.vocab_size(), lm.context_size());
        let state = State {
            lm: Box::new(lm),
            seats: 0,
            queue: Vec::new(),
            done: HashMap::new(),
            next_ticket: 0,
            counters: DraftCounters::default(),
            backlog: Vec::new(),
        };
        Self { inner: Arc::new(Inner { state: Mutex::new(state), turn: Condvar::new(), vocab, context }) }
    }

    /// A lane of its own for one request (closed when dropped).
    pub fn lane(&self) -> Result<DraftLane<'m>> {
        let lane = self.inner.lock().lm.open()?;
        Ok(DraftLane { inner: self.inner.clone(), lane, rows: Vec::new() })
    }

    /// Paths the pending trees may still open together (a step caps each proposer's tree at its
    /// share).
    pub fn free_paths(&self) -> usize {
        self.inner.lock().lm.free_paths()
    }

    /// Read up to `max_tokens` of the lanes' prompt backlogs, oldest lane first, in one forward
    /// (call between steps' proposals, on the step's thread). A lane whose chunk fails keeps it,
    /// so its next draft forward reports the error.
    pub fn drain(&self, max_tokens: usize) {
        let mut st = self.inner.lock();
        if st.seats > 0 || st.backlog.is_empty() || max_tokens == 0 {
            return;
        }
        let mut left = max_tokens;
        let mut chunks: Vec<(LaneId, Vec<TokenId>)> = Vec::new();
        for (lane, tokens) in st.backlog.iter_mut() {
            if left == 0 {
                break;
            }
            let n = tokens.len().min(left);
            left -= n;
            chunks.push((*lane, tokens.drain(..n).collect()));
        }
        let taken: Vec<(u64, LaneId, Vec<TokenId>)> = chunks
            .into_iter()
            .map(|(lane, c)| (st.queue(lane, OwnedFeed::Prefill(c.clone())), lane, c))
            .collect();
        st.run();
        for (ticket, lane, chunk) in taken {
            if st.done.remove(&ticket).is_some_and(|r| r.is_err()) {
                if let Some((_, tokens)) = st.backlog.iter_mut().find(|(l, _)| *l == lane) {
                    tokens.splice(0..0, chunk);
                }
            }
        }
        st.backlog.retain(|(_, t)| !t.is_empty());
    }

    /// The forwards run so far.
    pub fn counters(&self) -> DraftCounters {
        self.inner.lock().counters
    }

    /// A seat for one proposer of the step about to run. Take every seat before the first
    /// proposer starts, then [`serve`](Self::serve) on the step's thread.
    pub fn seat(&self) -> Seat<'m> {
        self.inner.lock().seats += 1;
        Seat { inner: self.inner.clone() }
    }

    /// Run the step's draft forwards until every seat is gone: each time every seated proposer
    /// waits on a feed, one forward holds all of them.
    pub fn serve(&self) {
        let mut st = self.inner.lock();
        loop {
            if !st.queue.is_empty() && st.queue.len() >= st.seats {
                st.run();
                self.inner.turn.notify_all();
            } else if st.seats == 0 {
                return;
            } else {
                st = self.inner.wait(st);
            }
        }
    }
}

/// One request's sequence of a [`SharedDraft`]: the draft model its drafter runs.
pub struct DraftLane<'m> {
    inner: Arc<Inner<'m>>,
    lane: LaneId,
    /// The logits rows of its last forward.
    rows: Vec<f32>,
}

impl std::fmt::Debug for DraftLane<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftLane").field("lane", &self.lane).finish_non_exhaustive()
    }
}

impl Drop for DraftLane<'_> {
    fn drop(&mut self) {
        let mut st = self.inner.lock();
        st.take_backlog(self.lane);
        st.lm.close(self.lane);
    }
}

/// Most prompt tokens one draft forward reads when a lane's backlog is fed at once.
const FLUSH_CHUNK: usize = 512;

impl DraftLane<'_> {
    /// Read the rest of the lane's prompt backlog (before its first draft forward).
    fn flush(&mut self) -> Result<()> {
        let backlog = self.inner.lock().take_backlog(self.lane);
        for chunk in backlog.chunks(FLUSH_CHUNK) {
            self.inner.submit(self.lane, OwnedFeed::Prefill(chunk.to_vec()))?;
        }
        Ok(())
    }
}

impl CausalLm for DraftLane<'_> {
    fn vocab_size(&self) -> usize {
        self.inner.vocab
    }

    fn context_size(&self) -> usize {
        self.inner.context
    }

    fn committed_len(&self) -> usize {
        let st = self.inner.lock();
        st.lm.committed_len(self.lane) + st.backlog_len(self.lane)
    }

    fn pending_len(&self) -> usize {
        self.inner.lock().lm.pending_len(self.lane)
    }

    fn prefill(&mut self, tokens: &[TokenId]) -> Result<()> {
        let pending = self.pending_len();
        if pending > 0 {
            return Err(EngineError::State(format!(
                "prefill with {pending} pending nodes: commit or truncate first"
            )));
        }
        if tokens.is_empty() {
            return Ok(());
        }
        let prompt = self.committed_len() + tokens.len();
        if prompt > self.inner.context {
            return Err(EngineError::PromptTooLong { prompt, context: self.inner.context });
        }
        let mut st = self.inner.lock();
        match st.backlog.iter_mut().find(|(l, _)| *l == self.lane) {
            Some((_, backlog)) => backlog.extend_from_slice(tokens),
            None => st.backlog.push((self.lane, tokens.to_vec())),
        }
        Ok(())
    }

    fn forward(&mut self, batch: &TreeBatch) -> Result<Logits<'_>> {
        if batch.is_empty() {
            return Ok(Logits::new(self.inner.vocab, Vec::new()));
        }
        self.flush()?;
        self.rows = self.inner.submit(self.lane, OwnedFeed::Tree(batch.clone()))?;
        Ok(Logits::borrowed(self.inner.vocab, &self.rows))
    }

    fn commit(&mut self, path: &[usize]) -> Result<()> {
        self.inner.lock().lm.commit(self.lane, path)
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        let mut st = self.inner.lock();
        let read = st.lm.committed_len(self.lane);
        let mut backlog = st.take_backlog(self.lane);
        backlog.truncate(len.saturating_sub(read));
        if !backlog.is_empty() {
            st.backlog.push((self.lane, backlog));
        }
        st.lm.truncate(self.lane, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toy::{ToyDraftLanes, ToyLm, ToyModel};

    /// Proposers feeding 1, 2 and 3 chain steps concurrently: every forward holds each proposer
    /// still drafting (3 forwards, 6 feeds), and each gets exactly the rows a lone model gives.
    #[test]
    fn concurrent_feeds_meet_in_one_forward_and_get_their_own_rows() {
        let model = ToyModel::new(7, 2, 5);
        let shared = SharedDraft::new(ToyDraftLanes::new(model.clone(), 32, 3));
        let mut lanes: Vec<DraftLane<'_>> = (0..3).map(|_| shared.lane().unwrap()).collect();
        for (k, lane) in lanes.iter_mut().enumerate() {
            lane.prefill(&[k as TokenId, 1]).unwrap();
        }
        let feeds = |lane: &mut dyn CausalLm, k: usize| -> Vec<Vec<f32>> {
            (0..=k)
                .map(|i| {
                    let parent = i.checked_sub(1);
                    let batch = TreeBatch::chain(&[(k + i) as TokenId % 7], parent, i, false);
                    lane.forward(&batch).unwrap().row(0).to_vec()
                })
                .collect()
        };
        // The prefills wait in the backlog until a lane's first forward.
        assert_eq!(shared.counters(), DraftCounters::default());
        assert_eq!(lanes[1].committed_len(), 2);
        let got: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
            let handles: Vec<_> = lanes
                .iter_mut()
                .enumerate()
                .map(|(k, lane)| {
                    let seat = shared.seat();
                    s.spawn(move || {
                        let _seat = seat;
                        feeds(lane, k)
                    })
                })
                .collect();
            shared.serve();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // One forward read the three backlogs, three more the trees.
        assert_eq!(shared.counters(), DraftCounters { forwards: 1 + 3, feeds: 3 + 6, rows: 6 + 6 });
        for (k, rows) in got.iter().enumerate() {
            let mut alone = ToyLm::new(model.clone(), 32);
            alone.prefill(&[k as TokenId, 1]).unwrap();
            assert_eq!(rows, &feeds(&mut alone, k), "proposer {k}");
        }
        // Outside a step a call runs at once; commits keep each lane's own path.
        lanes[2].commit(&[0, 1]).unwrap();
        assert_eq!((lanes[2].committed_len(), lanes[2].pending_len()), (4, 0));
        assert_eq!((lanes[0].committed_len(), lanes[0].pending_len()), (2, 1));
    }

    /// Between steps, `drain` reads the lanes' prompt backlogs a chunk at a time, oldest lane
    /// first, and a lane's first forward reads what is left: the rows equal a lone model's.
    #[test]
    fn prompt_backlogs_drain_in_chunks_and_the_rest_is_read_before_the_first_forward() {
        let model = ToyModel::new(7, 2, 5);
        let shared = SharedDraft::new(ToyDraftLanes::new(model.clone(), 64, 2));
        let (mut a, mut b) = (shared.lane().unwrap(), shared.lane().unwrap());
        let (pa, pb): (Vec<TokenId>, Vec<TokenId>) = ((0..10).map(|t| t % 7).collect(), vec![3, 4, 5]);
        a.prefill(&pa).unwrap();
        b.prefill(&pb).unwrap();
        shared.drain(4);
        assert_eq!(shared.counters(), DraftCounters { forwards: 1, feeds: 1, rows: 4 });
        shared.drain(8);
        assert_eq!(shared.counters(), DraftCounters { forwards: 2, feeds: 3, rows: 12 });
        assert_eq!((a.committed_len(), b.committed_len()), (10, 3));
        let batch = TreeBatch::chain(&[1], None, 0, false);
        let got = a.forward(&batch).unwrap().row(0).to_vec();
        let mut alone = ToyLm::new(model, 64);
        alone.prefill(&pa).unwrap();
        assert_eq!(got, alone.forward(&batch).unwrap().row(0));
        // a was read whole by the drains: its forward held its tree row only; b's last prompt
        // token is still to read.
        assert_eq!(shared.counters(), DraftCounters { forwards: 3, feeds: 4, rows: 13 });
        b.forward(&batch).unwrap();
        assert_eq!(shared.counters(), DraftCounters { forwards: 5, feeds: 6, rows: 15 });
    }

    /// A lane's bad feed fails that lane only: the forward is retried feed by feed.
    #[test]
    fn a_bad_feed_fails_only_its_own_lane() {
        let shared = SharedDraft::new(ToyDraftLanes::new(ToyModel::new(7, 2, 5), 32, 2));
        let mut good = shared.lane().unwrap();
        let mut bad = shared.lane().unwrap();
        let (ok, err) = std::thread::scope(|s| {
            let (a, b) = (shared.seat(), shared.seat());
            let ok = s.spawn(move || {
                let _seat = a;
                good.forward(&TreeBatch::chain(&[1], None, 0, false)).map(|l| l.rows())
            });
            let err = s.spawn(move || {
                let _seat = b;
                bad.forward(&TreeBatch::chain(&[99], None, 0, false)).map(|l| l.rows())
            });
            shared.serve();
            (ok.join().unwrap(), err.join().unwrap())
        });
        assert_eq!(ok.unwrap(), 1);
        assert!(err.is_err());
    }
}
