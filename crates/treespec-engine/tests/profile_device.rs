//! Cost measurement of a model whose layers a GPU computes. There the process's CPU time during
//! a forward is the host thread waiting for the device, not a sign that another process took
//! the cores: read as one, every forward was judged shared and timed again until the
//! measurement's whole waiting budget (four minutes) was spent — what `treespec profile -ngl
//! all` did on an H200, for each model. The sleeping toy below stands in for the device: its
//! forwards take wall time and no CPU time. And a device replays a captured graph for a shape
//! that repeats, as plain decoding's one row does and a tree step's changing size does not: the
//! curve must price each as it runs.

use std::time::Duration;

use treespec_engine::backend::CausalLm;
use treespec_engine::measure::profile::{
    time_forwards, time_rounds, LmTimer, MeasureOptions, ProfileSpec, Timed,
};
use treespec_engine::toy::{ToyLm, ToyModel};

/// A forward of `rows` rows: 1 ms plus 0.1 ms a row.
fn sleep(rows: usize) -> Duration {
    Duration::from_micros(1_000 + 100 * rows as u64)
}

/// A device that replays a captured graph for a shape its two previous forwards had, as
/// llama.cpp's CUDA backend does: such a forward takes 0.5 ms, any other 8 ms more than usual
/// (margins no scheduler's wake-up delay bridges in every round).
const REPLAYED: Duration = Duration::from_micros(500);
const CAPTURE_MISS: Duration = Duration::from_millis(8);

fn with_graphs(rows: usize, repeats: usize) -> Duration {
    if repeats >= 2 {
        REPLAYED
    } else {
        sleep(rows) + CAPTURE_MISS
    }
}

fn toy() -> ToyLm {
    ToyLm::new(ToyModel::new(16, 2, 7), 256)
}

/// Forwards that take wall time and no CPU time: on a device, or (judged by the CPU rule) on
/// a CPU whose cores another process took.
fn sleeper(on_device: bool) -> ToyLm {
    if on_device {
        toy().on_device(|rows, _| sleep(rows))
    } else {
        toy().with_forward_time(sleep)
    }
}

/// Many threads, so that whatever CPU the other tests of this process burn meanwhile stays far
/// under the share a forward that had its cores shows.
const THREADS: usize = 64;

fn measure(lm: &mut dyn CausalLm, max_wait_ms: f64) -> Timed {
    let sizes: Vec<usize> = (1..=8).collect();
    let opts =
        MeasureOptions { rounds: 3, extra_rounds: 0, threads: THREADS, max_wait_ms, ..Default::default() };
    let mut timer = LmTimer::new(lm, 16, 8, false, THREADS).unwrap();
    let timed = time_rounds(&mut timer, &sizes, &opts, &mut |_| {}).unwrap();
    timer.finish().unwrap();
    timed
}

#[test]
fn a_device_forward_is_not_judged_shared_by_the_cpu_time_of_its_host_thread() {
    let mut lm = sleeper(true);
    // A generous waiting budget: judged shared, the forwards would spend it (seconds).
    let timed = measure(&mut lm, 30_000.0);
    let noise = &timed.interference;
    assert_eq!(noise.shared, 0, "forwards judged shared on a device: {noise:?}");
    assert_eq!(noise.waited_ms, 0.0, "waited for cores on a device: {noise:?}");
    assert!(!noise.noisy(), "{}", noise.describe());
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
    let mut lm = sleeper(false);
    let timed = measure(&mut lm, 1.0);
    assert!(timed.interference.shared > 0, "{:?}", timed.interference);
}

#[test]
fn one_row_is_timed_as_plain_decoding_replays_it_and_larger_sizes_as_tree_steps_run_them() {
    // Plain decoding repeats the one-row shape, so a device replays its graph; a tree step's size
    // changes from step to step, so it runs directly. The curve must price each as it runs.
    let mut lm = toy().on_device(with_graphs);
    let timed = measure(&mut lm, 30_000.0);
    let fastest = |n: usize| {
        let times = &timed.samples.iter().find(|s| s.0 == n).unwrap().1;
        times.iter().copied().fold(f64::INFINITY, f64::min)
    };
    let replayed = REPLAYED.as_secs_f64() * 1e3;
    let direct = |n: usize| (sleep(n) + CAPTURE_MISS).as_secs_f64() * 1e3;
    assert!(fastest(1) < direct(1), "one row timed at {:.2} ms, not as a replay ({replayed} ms)", fastest(1));
    for n in 2..=8 {
        assert!(
            fastest(n) >= direct(n),
            "{n} rows timed at {:.2} ms, below a direct run ({:.2})",
            fastest(n),
            direct(n)
        );
    }
}

#[test]
fn with_repeated_shapes_every_size_is_timed_as_a_replay() {
    // What tree steps would cost if their sizes repeated (kept to a few buckets): the lever a
    // device run measures with `treespec profile --repeated-shapes`.
    let mut lm = toy().on_device(with_graphs);
    let sizes: Vec<usize> = (1..=8).collect();
    let spec = ProfileSpec {
        sizes: &sizes,
        repeat: 3,
        prefix: 16,
        last_only: false,
        threads: THREADS,
        repeated_shapes: true,
    };
    let timed = time_forwards(&mut lm, spec).unwrap();
    let direct = (sleep(1) + CAPTURE_MISS).as_secs_f64() * 1e3;
    for size in &timed {
        assert!(size.min_ms < direct, "{} rows timed at {:.2} ms, not as a replay", size.n, size.min_ms);
    }
}
