//! The bounded wait in front of the model's lanes.
//!
//! A request waits here until a lane takes it; beyond `capacity` waiting requests a
//! new one gets a 503. A request whose client has gone (its event receiver was dropped: see
//! `routes::first_event`) must not hold a place: it leaves the queue and stops counting toward
//! the bound as soon as that is seen — when the model thread looks between steps
//! ([`JobQueue::prune`]) and, without waiting for a step, when a new request finds the queue full.
//! A channel could not do this: what sits in it can only be taken in order.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::error::ApiError;
use crate::intake::validate::CheckedBody;
use crate::metrics::Metrics;
use crate::scheduling::job::Job;
use crate::tenant::Tenant;

/// A waiting job and its number (to tell whether the job at the front is still the one a
/// preparation was made for).
struct Waiting {
    id: u64,
    job: Job,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Waiting>,
    /// No more jobs will come (the backend's handle was dropped).
    closed: bool,
    /// The server is stopping: the requests decoding end now ([`JobQueue::stop`]).
    stopping: bool,
}

/// The waiting requests of one backend.
pub struct JobQueue {
    state: Mutex<State>,
    arrived: Condvar,
    capacity: usize,
    next_id: AtomicU64,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for JobQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobQueue").field("waiting", &self.len()).field("capacity", &self.capacity).finish()
    }
}

impl JobQueue {
    /// A queue that holds at most `capacity` waiting jobs.
    pub fn new(capacity: usize, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::default()),
            arrived: Condvar::new(),
            capacity,
            next_id: AtomicU64::new(0),
            metrics,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue `job`, or a 503 when `capacity` live jobs wait already (jobs whose clients left are
    /// dropped first: they hold no place).
    pub fn push(&self, job: Job) -> Result<(), ApiError> {
        let mut state = self.lock();
        if state.closed {
            return Err(ApiError::internal("the model thread has stopped"));
        }
        if state.jobs.len() >= self.capacity {
            self.drop_abandoned(&mut state);
        }
        // Requests whose clients closed while waiting hold no place: gone, or half-closed (rare),
        // they are told apart only by a failed write, a moment later. Clients that half-close on
        // purpose and keep reading are still bounded: twice the queue in all.
        let live = state.jobs.iter().filter(|w| !w.job.peer_left()).count();
        if live >= self.capacity || state.jobs.len() >= 2 * self.capacity {
            return Err(ApiError::overloaded(self.capacity));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        state.jobs.push_back(Waiting { id, job });
        drop(state);
        self.arrived.notify_one();
        Ok(())
    }

    /// Drop every waiting job whose client has gone (each counted as cancelled while queued).
    pub fn prune(&self) {
        let mut state = self.lock();
        self.drop_abandoned(&mut state);
    }

    fn drop_abandoned(&self, state: &mut State) {
        state.jobs.retain(|w| {
            let gone = w.job.events.is_closed();
            if gone {
                self.metrics.cancelled(w.job.tenant, "queued");
            }
            !gone
        });
    }

    /// Jobs waiting.
    pub fn len(&self) -> usize {
        self.lock().jobs.len()
    }

    /// Whether no job waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Jobs of `tenant` waiting.
    pub fn len_of(&self, tenant: Tenant) -> usize {
        self.lock().jobs.iter().filter(|w| w.job.tenant == tenant).count()
    }

    /// Block until a job waits, the queue is closed, or `timeout` passed; true when a job waits.
    pub fn wait(&self, timeout: Duration) -> bool {
        let state = self.lock();
        let (state, _) = self
            .arrived
            .wait_timeout_while(state, timeout, |s| s.jobs.is_empty() && !s.closed)
            .unwrap_or_else(|p| p.into_inner());
        !state.jobs.is_empty()
    }

    /// Whether no job will come any more.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// No job will come any more: waiting takers wake (jobs already queued are still served).
    pub fn close(&self) {
        self.lock().closed = true;
        self.arrived.notify_all();
    }

    /// The server stops now (its drain is over, or it was told twice): no job will come, and
    /// the jobs still waiting are returned for the caller to refuse (retryably). The scheduler
    /// sees [`JobQueue::is_stopping`] before its next step and ends the requests it decodes.
    pub fn stop(&self) -> Vec<Job> {
        self.lock().stopping = true;
        self.close_and_take_all()
    }

    /// Whether the server stops now (see [`JobQueue::stop`]).
    pub fn is_stopping(&self) -> bool {
        self.lock().stopping
    }

    /// The first job's number.
    pub fn front_id(&self) -> Option<u64> {
        self.lock().jobs.front().map(|w| w.id)
    }

    /// Job `id`'s request and tenant while it is first (copied: it stays queued while it is
    /// prepared).
    pub fn front_request(&self, id: u64) -> Option<(CheckedBody, Tenant)> {
        let state = self.lock();
        state.jobs.front().filter(|w| w.id == id).map(|w| (w.job.spec.clone(), w.job.tenant))
    }

    /// Close the queue and take every waiting job (its model thread is gone: the caller answers
    /// them).
    pub fn close_and_take_all(&self) -> Vec<Job> {
        let mut state = self.lock();
        state.closed = true;
        let jobs = state.jobs.drain(..).map(|w| w.job).collect();
        drop(state);
        self.arrived.notify_all();
        jobs
    }

    /// Take the first job if it is still job `id`.
    pub fn take_front(&self, id: u64) -> Option<Job> {
        let mut state = self.lock();
        if state.jobs.front().is_some_and(|w| w.id == id) {
            state.jobs.pop_front().map(|w| w.job)
        } else {
            None
        }
    }

    /// Take the first job, blocking while none waits; None once closed and empty.
    pub fn take(&self) -> Option<Job> {
        let mut state = self.lock();
        loop {
            if let Some(w) = state.jobs.pop_front() {
                return Some(w.job);
            }
            if state.closed {
                return None;
            }
            state = self.arrived.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc::unbounded_channel;

    fn job(tenant: Tenant) -> (Job, tokio::sync::mpsc::UnboundedReceiver<crate::scheduling::job::Event>) {
        let (tx, rx) = unbounded_channel();
        let req = serde_json::from_value(serde_json::json!({"prompt": "hi"})).expect("a request");
        let spec = crate::intake::validate::completion(req, &crate::intake::validate::Limits::default())
            .expect("valid");
        (Job::new(spec, tenant, false, tx), rx)
    }

    #[test]
    fn a_full_queue_makes_room_for_a_live_request_by_dropping_the_abandoned() {
        let metrics = Arc::new(Metrics::default());
        let q = JobQueue::new(2, metrics.clone());
        let (a, rx_a) = job(Tenant::SHARED);
        let (b, _rx_b) = job(Tenant::SHARED);
        q.push(a).unwrap();
        q.push(b).unwrap();
        let (c, _rx_c) = job(Tenant::SHARED);
        assert_eq!(q.push(c).unwrap_err().status.as_u16(), 503, "two live requests fill it");
        drop(rx_a);
        let (d, _rx_d) = job(Tenant::SHARED);
        q.push(d).expect("the abandoned request holds no place");
        assert_eq!(q.len(), 2);
        assert!(metrics.render_server(0).contains("treespec_cancelled_total{method=\"queued\"} 1"));
    }

    #[test]
    fn a_request_whose_client_closed_holds_no_place_but_stays_queued() {
        let q = JobQueue::new(1, Arc::new(Metrics::default()));
        let (a, _rx_a) = job(Tenant::SHARED);
        let left = a.peer_left.clone();
        q.push(a).unwrap();
        let (b, _rx_b) = job(Tenant::SHARED);
        assert_eq!(q.push(b).unwrap_err().status.as_u16(), 503);
        left.store(true, std::sync::atomic::Ordering::Relaxed);
        let (c, _rx_c) = job(Tenant::SHARED);
        q.push(c).expect("a client that closed holds no place");
        assert_eq!(q.len(), 2, "it may have only half-closed: it is still served");
        let (d, _rx_d) = job(Tenant::SHARED);
        d.peer_left.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(q.push(d).unwrap_err().status.as_u16(), 503, "twice the bound in all");
    }

    #[test]
    fn a_closed_queue_refuses_and_hands_back_what_waited() {
        let q = JobQueue::new(4, Arc::new(Metrics::default()));
        let (a, _rx_a) = job(Tenant::SHARED);
        q.push(a).unwrap();
        assert_eq!(q.close_and_take_all().len(), 1);
        let (b, _rx_b) = job(Tenant::SHARED);
        assert_eq!(q.push(b).unwrap_err().status.as_u16(), 500);
        assert!(q.is_empty() && q.is_closed());
    }

    #[test]
    fn prune_drops_only_the_abandoned_and_keeps_the_order() {
        let q = JobQueue::new(8, Arc::new(Metrics::default()));
        let mut rxs = Vec::new();
        for _ in 0..4 {
            let (j, rx) = job(Tenant::SHARED);
            q.push(j).unwrap();
            rxs.push(Some(rx));
        }
        rxs[1] = None;
        rxs[2] = None;
        q.prune();
        assert_eq!(q.len(), 2);
        assert_eq!(q.front_id(), Some(0));
        assert!(q.front_request(0).is_some() && q.front_request(3).is_none());
        assert!(q.take_front(0).is_some());
        assert!(q.take_front(0).is_none(), "job 0 left");
        assert_eq!(q.front_id(), Some(3));
    }

    #[test]
    fn closing_wakes_a_blocked_taker() {
        let q = JobQueue::new(2, Arc::new(Metrics::default()));
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.take().is_none());
        std::thread::sleep(Duration::from_millis(20));
        q.close();
        assert!(t.join().unwrap());
        assert!(!q.wait(Duration::from_millis(1)));
    }
}
