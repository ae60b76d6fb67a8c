//! The cost-curve measurement on a synthetic machine whose timings are disturbed: spikes in
//! single forwards, bursts of load, a neighbour that never stops. The measured curve must come
//! out within 5% of the clean one at every size, the kernels' real drops must survive, and
//! the measurement must say when it could not get a clean curve.

use treespec_core::cost::CostCurve;
use treespec_engine::measure::profile::{
    round_order, time_rounds, ForwardTimer, MeasureOptions, Timed, Timing, PROFILE_SIZES,
};
use treespec_engine::Result;

/// The repacked kernels' shape (the 1.5B target on 2 AMD cores): 46 ms per 4 rows, 16 per
/// remainder row, 20 ms less at multiples of 16.
fn clean(n: usize) -> f64 {
    12.0 + 46.0 * (n / 4) as f64 + 16.0 * (n % 4) as f64 - if n.is_multiple_of(16) { 20.0 } else { 0.0 }
}

/// A deterministic xorshift generator in [0, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A machine with a synthetic clock: each forward takes its clean time plus up to 0.5%
/// jitter, times `slow` when another process takes the cores: with probability `spike_p` in
/// one forward, and for the whole of each burst (`bursts`: start and end on the clock, ms).
/// With `reports_cpu`, a forward slowed by a burst says so (our threads ran for only
/// 1/`burst` of its wall time), as a real one does through the process's CPU time; a spike
/// stays invisible (a page fault, a cache flush: the threads were on their cores).
struct Machine {
    rng: Rng,
    clock: f64,
    spike_p: f64,
    spike: f64,
    bursts: Vec<(f64, f64)>,
    burst: f64,
    reports_cpu: bool,
    calls: Vec<usize>,
    paused_ms: f64,
    /// The load average the machine reports (None: it reports none).
    load: Option<f64>,
}

impl Machine {
    fn new(seed: u64, spike_p: f64) -> Self {
        Self {
            rng: Rng(seed),
            clock: 0.0,
            spike_p,
            spike: 1.0,
            bursts: Vec::new(),
            burst: 1.0,
            reports_cpu: false,
            calls: Vec::new(),
            paused_ms: 0.0,
            load: None,
        }
    }
}

impl ForwardTimer for Machine {
    fn time(&mut self, n: usize) -> Result<Timing> {
        self.calls.push(n);
        let mut ms = clean(n) * (1.0 + 0.005 * self.rng.next());
        let mut on_cpu = 0.97;
        if self.rng.next() < self.spike_p {
            ms *= self.spike + 20.0 * self.rng.next();
        }
        if self.bursts.iter().any(|&(a, b)| (a..b).contains(&self.clock)) {
            ms *= self.burst;
            on_cpu /= self.burst;
        }
        self.clock += ms;
        Ok(Timing { ms, on_cpu: self.reports_cpu.then_some(on_cpu) })
    }

    fn wait_for_cores(&mut self, max_ms: f64) -> f64 {
        // Watch in windows of 200 ms until one sees no burst.
        let mut waited = 0.0;
        while waited < max_ms {
            let step = (max_ms - waited).min(200.0);
            let clock = self.clock;
            self.clock += step;
            waited += step;
            if !self.bursts.iter().any(|&(a, b)| a < clock + step && clock < b) {
                break;
            }
        }
        self.paused_ms += waited;
        waited
    }

    fn load_average(&self) -> Option<f64> {
        self.load
    }
}

fn curve(timed: &Timed) -> CostCurve {
    CostCurve::from_points(&timed.fitted().points).unwrap()
}

fn assert_within(c: &CostCurve, tolerance: f64) {
    for n in 1..=64 {
        let ratio = c.ms(n) / clean(n);
        assert!(
            (ratio - 1.0).abs() <= tolerance,
            "T({n}) = {:.1} ms, clean {:.1} (×{ratio:.3})",
            c.ms(n),
            clean(n)
        );
    }
    // The real drops survive.
    for (before, dip) in [(3, 4), (15, 16), (31, 32), (47, 48), (63, 64)] {
        assert!(c.ms(dip) < c.ms(before), "the drop from T({before}) to T({dip}) was smoothed away");
    }
}

#[test]
fn spikes_and_bursts_do_not_reach_the_curve() {
    let opts = MeasureOptions { threads: 2, ..MeasureOptions::default() };
    for seed in 1..=20u64 {
        // One forward in five slowed 1.5–21.5×, and two bursts of 4× load, each about as
        // long as a fifth of a round.
        let mut m = Machine::new(seed * 7919, 0.2);
        m.spike = 1.5;
        m.bursts = vec![(3_000.0, 8_000.0), (20_000.0, 25_000.0)];
        m.burst = 4.0;
        let timed = time_rounds(&mut m, PROFILE_SIZES, &opts, &mut |_| {}).unwrap();
        assert_within(&curve(&timed), 0.05);
        let i = &timed.interference;
        assert!(i.unsettled.is_empty() && i.spikes.is_empty(), "seed {seed}: {i:?}");
        assert!(i.extra_rounds <= opts.extra_rounds);
    }
}

#[test]
fn the_rounds_interleave_the_sizes_and_extra_rounds_time_only_the_doubtful_ones() {
    let mut m = Machine::new(3, 0.0);
    let opts = MeasureOptions::default();
    let timed = time_rounds(&mut m, PROFILE_SIZES, &opts, &mut |_| {}).unwrap();
    let k = PROFILE_SIZES.len();
    // Quiet: exactly the planned rounds, each over every size once, the later ones shuffled
    // (each its own way, so no two sizes are neighbours in time in every round).
    assert_eq!(m.calls.len(), 3 * k);
    assert_eq!(m.calls[..k], *PROFILE_SIZES);
    for r in 1..3 {
        let mut seen = m.calls[r * k..(r + 1) * k].to_vec();
        assert_eq!(seen, round_order(PROFILE_SIZES, r + 1));
        seen.sort_unstable();
        assert_eq!(seen, PROFILE_SIZES, "round {r} times every size once");
    }
    assert_ne!(m.calls[k..2 * k], m.calls[2 * k..3 * k]);
    assert_ne!(m.calls[k..2 * k], *PROFILE_SIZES);
    assert_eq!(timed.interference.extra_rounds, 0);
    assert_within(&curve(&timed), 0.01);
    // Load through the whole second round and the first half of the third (3× slower) slows
    // two repeats of the sizes the third round times first: only those are timed again.
    let round: f64 = PROFILE_SIZES.iter().map(|&n| clean(n)).sum();
    let mut m = Machine::new(5, 0.0);
    m.bursts = vec![(round, round + 3.0 * round + 1.5 * round)];
    m.burst = 3.0;
    let timed = time_rounds(&mut m, PROFILE_SIZES, &opts, &mut |_| {}).unwrap();
    assert!(timed.interference.extra_rounds >= 1);
    let extra = &m.calls[3 * k..];
    assert!(!extra.is_empty() && extra.len() < k, "{extra:?}");
    assert_within(&curve(&timed), 0.05);
}

#[test]
fn a_machine_that_stays_noisy_is_reported_after_a_bounded_number_of_extra_rounds() {
    // Nine forwards in ten slowed 1.2–21×: the two fastest repeats of most sizes keep
    // disagreeing; the extra rounds are bounded.
    let opts = MeasureOptions { extra_rounds: 2, ..MeasureOptions::default() };
    let spiky = |seed| {
        let mut m = Machine::new(seed, 0.9);
        m.spike = 1.2;
        m
    };
    let mut m = spiky(11);
    let mut last = None;
    let timed = time_rounds(&mut m, PROFILE_SIZES, &opts, &mut |p| last = Some(*p)).unwrap();
    let i = &timed.interference;
    assert_eq!(i.extra_rounds, 2);
    assert!(i.unsettled.len() * 4 > i.sizes, "{i:?}");
    assert!(m.calls.len() <= 5 * PROFILE_SIZES.len());
    let p = last.unwrap();
    assert_eq!((p.round, p.rounds, p.work_done), (5, 5, p.work_total));
    // On a machine that says it is quiet this is a VM's steady jitter: no warning.
    assert!(!i.noisy(), "{i:?}");

    // The same spikes on a machine whose load average says others ran are reported.
    let mut m = spiky(11);
    m.load = Some(2.6);
    let i = time_rounds(&mut m, PROFILE_SIZES, &opts, &mut |_| {}).unwrap().interference;
    assert!(i.noisy() && i.describe().contains("load average 2.6"), "{i:?}");

    // So are they where the load average stays low but our threads were off their cores in
    // more than one forward in twenty (short bursts of another process): the spikes count then.
    let mut m = spiky(11);
    m.load = Some(0.9);
    m.bursts = duty_cycle(300.0, 3_000.0, 1e9);
    m.burst = 3.0;
    m.reports_cpu = true;
    let i = time_rounds(&mut m, PROFILE_SIZES, &opts, &mut |_| {}).unwrap().interference;
    assert!(!i.loaded() && i.busy() && i.kept_shared == 0, "{i:?}");
    assert!(i.noisy() && i.describe().contains("repeats disagree"), "{i:?}");
}

/// Another process busy on every core for seconds at a time, half of the time (an IDE
/// indexing, a browser, a build step): every forward in a burst is far slower.
fn duty_cycle(on_ms: f64, off_ms: f64, until_ms: f64) -> Vec<(f64, f64)> {
    let mut bursts = Vec::new();
    let mut t = 500.0;
    while t < until_ms {
        bursts.push((t, t + on_ms));
        t += on_ms + off_ms;
    }
    bursts
}

#[test]
fn forwards_that_shared_their_cores_are_timed_again_once_the_cores_are_free() {
    let opts = MeasureOptions { threads: 2, max_wait_ms: 600_000.0, ..MeasureOptions::default() };
    for seed in 1..=10u64 {
        // Three of every 4 s the cores are shared and each forward takes 8× its time: without
        // the CPU-time signal most sizes would see a slow repeat in most rounds.
        let mut m = Machine::new(seed * 104_729, 0.0);
        m.bursts = duty_cycle(3_000.0, 1_000.0, 1e9);
        m.burst = 8.0;
        m.reports_cpu = true;
        let timed = time_rounds(&mut m, PROFILE_SIZES, &opts, &mut |_| {}).unwrap();
        assert_within(&curve(&timed), 0.02);
        let i = &timed.interference;
        assert!(i.shared > 0 && i.kept_shared == 0, "seed {seed}: {i:?}");
        assert!(i.waited_ms > m.paused_ms && m.paused_ms > 0.0, "{i:?}");
        assert!(
            i.unsettled.is_empty() && i.spikes.is_empty() && i.unmeasured.is_empty() && !i.stood_in,
            "seed {seed}: {i:?}"
        );
        // Forwards timed again once the cores were free leave a clean curve: no warning.
        assert!(!i.noisy(), "seed {seed}: {i:?}");
    }
}

#[test]
fn a_neighbour_that_never_leaves_costs_a_bounded_wait_and_a_noisy_curve() {
    let opts = MeasureOptions { threads: 2, max_wait_ms: 30_000.0, ..MeasureOptions::default() };
    let mut m = Machine::new(17, 0.0);
    m.bursts = vec![(0.0, f64::INFINITY)];
    m.burst = 3.0;
    m.reports_cpu = true;
    let mut waits = Vec::new();
    let timed = time_rounds(&mut m, PROFILE_SIZES, &opts, &mut |p| waits.push(p.waited_ms)).unwrap();
    let i = &timed.interference;
    // The wait (pauses and shared forwards) stops at the budget, within one forward.
    assert!((30_000.0..30_000.0 + 3.0 * 800.0).contains(&i.waited_ms), "{i:?}");
    assert!(m.paused_ms > 0.0 && m.paused_ms < i.waited_ms);
    // Every size was still timed (the curve is complete) and the report says why it is noisy.
    assert_eq!(timed.samples.iter().filter(|(_, s)| s.is_empty()).count(), 0);
    assert!(i.kept_shared > 0 && i.noisy(), "{i:?}");
    // Nothing was timed alone: the shared times stand in, and the curve is provisional.
    assert!(i.stood_in && i.unmeasured.len() == PROFILE_SIZES.len(), "{i:?}");
    assert!(i.describe().contains("shared their cores"), "{}", i.describe());
    // Once the wait is spent, no size is timed twice more on shared cores: at most one round
    // beyond the forwards the wait covered.
    assert!(i.kept_shared <= PROFILE_SIZES.len(), "{i:?}");
    assert_eq!(i.extra_rounds, 0);
    // The progress display heard of the waiting.
    assert!(waits.last().is_some_and(|&w| w > 0.0 && w <= i.waited_ms));
}
