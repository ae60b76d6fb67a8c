//! The gaps between requests: when a cost curve is measured in the background of a server (a
//! cost-aware default whose curves this machine has not measured yet), its forwards and the
//! requests' forwards must not share the cores. Sharing costs the requests (a measurement beside
//! them made one served run 30% slower) and spoils the curve (it times how busy the process was).
//! So the servers hold a [`Serving`] guard while a request decodes, and
//! a measurement run [`in_background`] ([`crate::measure::profile::LmTimer`]) times a forward only while
//! none is in flight, and times it again when one began meanwhile. One process, one set of
//! cores: a process-wide gate. A measurement a request itself needs (a method resolved inside
//! it) does not wait: it would wait for itself.

use std::cell::Cell;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

struct State {
    /// Requests in flight.
    active: usize,
    /// Requests ever started: a forward during which it moved shared its cores.
    started: u64,
}

static STATE: Mutex<State> = Mutex::new(State { active: 0, started: 0 });
static IDLE: Condvar = Condvar::new();

thread_local! {
    /// This thread measures in the background of a server (see [`in_background`]).
    static BACKGROUND: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` (a cost measurement) as the background of this process's requests: its forwards
/// wait for the gaps between them.
pub fn in_background<R>(f: impl FnOnce() -> R) -> R {
    let before = BACKGROUND.with(|b| b.replace(true));
    let out = f();
    BACKGROUND.with(|b| b.set(before));
    out
}

fn lock() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// One request in flight, from [`Serving::begin`] until dropped — also when the thread serving it
/// unwinds, so the gate never stays shut behind a request that is gone.
#[derive(Debug)]
pub struct Serving(());

impl Serving {
    /// A request began decoding.
    pub fn begin() -> Self {
        let mut s = lock();
        s.active += 1;
        s.started += 1;
        Self(())
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let mut s = lock();
        s.active = s.active.saturating_sub(1);
        if s.active == 0 {
            IDLE.notify_all();
        }
    }
}

/// A mark to compare after a forward: [`Mark::alone`] tells whether no request was served at
/// any moment since (always, outside [`in_background`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark(Option<u64>);

impl Mark {
    /// Whether no request was in flight when the mark was made or began since.
    pub fn alone(self) -> bool {
        let Some(started) = self.0 else { return true };
        let s = lock();
        s.active == 0 && s.started == started
    }
}

/// In the background ([`in_background`]): wait, at most `max`, until no request is in flight;
/// the time waited and a [`Mark`] made at that moment. Elsewhere at once.
pub fn wait_for_gap(max: Duration) -> (Duration, Mark) {
    if !BACKGROUND.with(Cell::get) {
        return (Duration::ZERO, Mark(None));
    }
    let t = Instant::now();
    let s = lock();
    let (s, _) = IDLE.wait_timeout_while(s, max, |s| s.active > 0).unwrap_or_else(|p| p.into_inner());
    // A mark made while a request is still in flight (the wait ran out) never reads alone.
    let mark = if s.active == 0 { s.started } else { s.started.wrapping_sub(1) };
    (t.elapsed(), Mark(Some(mark)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test for the whole gate: it is process-wide, and tests run in parallel.
    #[test]
    fn a_measurement_waits_for_the_gap_and_sees_requests_that_began() {
        let serving = Serving::begin();
        let (waited, mark) = wait_for_gap(Duration::from_secs(5));
        assert!(waited.is_zero() && mark.alone(), "outside the background nothing waits");
        drop(serving);
        in_background(background);
    }

    fn background() {
        let (_, mark) = wait_for_gap(Duration::from_secs(5));
        assert!(mark.alone());
        let serving = Serving::begin();
        assert!(!mark.alone(), "a request began since the mark");
        let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ended.clone();
        let ender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            drop(serving);
        });
        let (_, mark) = wait_for_gap(Duration::from_secs(30));
        assert!(ended.load(std::sync::atomic::Ordering::SeqCst), "the wait ended before the request did");
        ender.join().unwrap();
        assert!(mark.alone());
        let serving = Serving::begin();
        let (waited, mark) = wait_for_gap(Duration::from_millis(30));
        assert!(waited >= Duration::from_millis(30) && !mark.alone(), "the wait ran out while serving");
        drop(serving);
        assert!(!mark.alone(), "a mark made while serving never reads alone");
    }
}
