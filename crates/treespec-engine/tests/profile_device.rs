//! Cost measurement of a model whose layers a GPU computes. There the process's CPU time during
//! a forward is the host thread waiting for the device, not a sign that another process took
//! the cores: read as one, every forward was judged shared and timed again until the
//! measurement's whole waiting budget (four minutes) was spent — what `treespec profile -ngl
//! all` did on an H200, for each model. The sleeping toy below stands in for the device: its
//! forwards take wall time and no CPU time.

use std::time::{Duration, Instant};

use treespec_core::TokenId;
use treespec_engine::backend::{CausalLm, Logits, TreeBatch};
use treespec_engine::measure::profile::{time_rounds, LmTimer, MeasureOptions};
use treespec_engine::toy::{ToyLm, ToyModel};
use treespec_engine::Result;

/// A toy whose forwards sleep (1 ms plus 0.1 ms a row), on the CPU or "on a device".
struct Sleeper {
    lm: ToyLm,
    on_device: bool,
}

fn sleep(rows: usize) -> Duration {
    Duration::from_micros(1_000 + 100 * rows as u64)
}

impl Sleeper {
    fn new(on_device: bool) -> Self {
        let model = ToyModel::new(16, 2, 7);
        Self { lm: ToyLm::new(model, 256).with_forward_time(sleep), on_device }
    }
}

impl CausalLm for Sleeper {
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
        self.lm.prefill(tokens)
    }
    fn forward(&mut self, batch: &TreeBatch) -> Result<Logits<'_>> {
        self.lm.forward(batch)
    }
    fn commit(&mut self, path: &[usize]) -> Result<()> {
        self.lm.commit(path)
    }
    fn truncate(&mut self, len: usize) -> Result<()> {
        self.lm.truncate(len)
    }
    fn computes_on_cpu(&self) -> bool {
        !self.on_device
    }
}

/// Many threads, so that whatever CPU the other tests of this process burn meanwhile stays far
/// under the share a forward that had its cores shows.
const THREADS: usize = 64;

fn measure(lm: &mut dyn CausalLm, max_wait_ms: f64) -> (treespec_engine::measure::profile::Timed, Duration) {
    let sizes: Vec<usize> = (1..=8).collect();
    let opts =
        MeasureOptions { rounds: 3, extra_rounds: 0, threads: THREADS, max_wait_ms, ..Default::default() };
    let t = Instant::now();
    let mut timer = LmTimer::new(lm, 16, 8, false, THREADS).unwrap();
    let timed = time_rounds(&mut timer, &sizes, &opts, &mut |_| {}).unwrap();
    timer.finish().unwrap();
    (timed, t.elapsed())
}

#[test]
fn a_device_forward_is_not_judged_shared_by_the_cpu_time_of_its_host_thread() {
    let mut lm = Sleeper::new(true);
    // A generous waiting budget: judged shared, the forwards would spend it (seconds).
    let (timed, took) = measure(&mut lm, 30_000.0);
    let noise = &timed.interference;
    assert_eq!(noise.shared, 0, "forwards judged shared on a device: {noise:?}");
    assert_eq!(noise.waited_ms, 0.0, "waited for cores on a device: {noise:?}");
    assert!(!noise.noisy(), "{}", noise.describe());
    assert!(took < Duration::from_secs(10), "a 24-forward measurement took {took:?}");
    for (n, times) in &timed.samples {
        assert_eq!(times.len(), 3, "size {n}: {times:?}");
        let fastest = times.iter().copied().fold(f64::INFINITY, f64::min);
        assert!(fastest >= sleep(*n).as_secs_f64() * 1e3, "size {n} faster than its forward: {times:?}");
    }
}

#[test]
fn the_same_forwards_on_the_cpu_still_count_as_shared() {
    // The rule the device is exempt from still holds on the CPU: threads that ran for no CPU time
    // during a forward did not have their cores. (A 1 ms budget keeps the waits short.)
    let mut lm = Sleeper::new(false);
    let (timed, _) = measure(&mut lm, 1.0);
    assert!(timed.interference.shared > 0, "{:?}", timed.interference);
}
