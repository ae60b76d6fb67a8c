//! Timing a model's forwards: the start-up profile behind `treespec profile` and the measured cost
//! curves (`treespec costs`) that the cost-aware drafters in [`crate::auto_budget`] decide on.

use std::cell::Cell;
use std::time::{Duration, Instant};

use treespec_core::cost::fit::{agree, fit_samples, Fitted};
use treespec_core::cost::CostCurve;

use crate::backend::{CausalLm, TreeBatch};
use crate::error::{EngineError, Result};
use crate::measure::cpu_time::{others_busy_cores, process_cpu_ms};
use crate::measure::serving_gate;

/// Batch sizes a start-up profile times (sizes in between are interpolated, larger ones
/// extrapolated), out to 64 rows since suffix drafts of long exact copies reach that far.
///
/// The curve is not smooth, and a sparse grid misprices it badly. llama.cpp's repacked
/// quantized kernels multiply 4 rows at a time and the remainder row by row, so T climbs by a
/// row's full cost from 4k to 4k + 3 rows and drops at 4k + 4; multiples of 16 run lower still.
/// Measured on the 1.5B target (2 AMD cores): T(15) = 178 ms, T(16) = 140 ms, T(31) = 267 ms,
/// T(32) = 240 ms — an interpolated T(15) read 148. So every size up to 24 is timed, and beyond
/// it both ends of each 4-row step (4k − 1 and 4k), between which the climb is linear, and the
/// row after each multiple of 16, where the climb starts from the dip.
pub const PROFILE_SIZES: &[usize] = &[
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 27, 28, 31, 32,
    33, 35, 36, 39, 40, 43, 44, 47, 48, 49, 51, 52, 55, 56, 59, 60, 63, 64,
];

/// Committed tokens under the timed batches (a realistic, short KV length).
const PROFILE_PREFIX: usize = 64;

/// The longer cache the context cost is measured on (or what the context allows, if at least
/// [`MIN_CONTEXT_SPAN`] tokens above [`PROFILE_PREFIX`]).
const CONTEXT_PREFIX: usize = 1024;

/// The least span between the two caches for a context cost worth fitting.
const MIN_CONTEXT_SPAN: usize = 256;

/// Batch sizes timed again on the long cache, for the context cost.
const CONTEXT_SIZES: &[usize] = &[1, 4, 8, 16];

/// What a profile times: one forward of `n` new tokens (a chain) for each `n` in `sizes`, on top
/// of `prefix` committed tokens, `repeat` times each (in rounds over all sizes).
#[derive(Debug, Clone, Copy)]
pub struct ProfileSpec<'a> {
    /// Batch sizes.
    pub sizes: &'a [usize],
    /// Timed runs per size.
    pub repeat: usize,
    /// Committed tokens under the timed batches.
    pub prefix: usize,
    /// Logits for the last row only (a prompt batch) instead of every row (a verify batch).
    pub last_only: bool,
    /// Threads the model computes with (to tell a forward that had its cores from one that
    /// shared them).
    pub threads: usize,
    /// Time every size as a step whose size repeats: after [`SAME_SHAPE_LEAD_IN`] untimed forwards
    /// of that size (see [`LmTimer::with_repeated_shapes`]).
    pub repeated_shapes: bool,
}

/// The timing of one batch size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimedSize {
    /// Tokens in the batch.
    pub n: usize,
    /// Median milliseconds.
    pub median_ms: f64,
    /// Fastest run.
    pub min_ms: f64,
}

/// One timed forward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// Wall milliseconds.
    pub ms: f64,
    /// The share of those milliseconds our threads ran on a CPU (the process's CPU time ÷ (wall
    /// time × threads)): about 1 when the forward had its cores, about ½ when another busy
    /// process shared each of them. None where the platform does not say, or where a device
    /// computed the forward ([`CausalLm::computes_on_cpu`]).
    pub on_cpu: Option<f64>,
}

/// The only way a profile reads time: one timed forward of `n` rows. [`LmTimer`] runs them on
/// a [`CausalLm`]; tests put a synthetic machine (spikes, a busy neighbour) behind it.
pub trait ForwardTimer {
    /// Time one forward of `n` rows.
    fn time(&mut self, n: usize) -> Result<Timing>;

    /// Wait, at most `max_ms`, until no other process keeps the cores busy; the milliseconds
    /// waited. (A synthetic machine advances its clock instead.)
    fn wait_for_cores(&mut self, max_ms: f64) -> f64;

    /// The machine's 1-minute load average, if it reports one. A synthetic machine says its
    /// own, so that what a test checks does not hang on how busy the host running it is.
    fn load_average(&self) -> Option<f64> {
        load_average()
    }
}

/// Times chain forwards on a model, on top of a committed prefix (after a warm-up: on a CPU of
/// the smallest and largest size, whose first decodes allocate buffers; on a device of every
/// size). Call [`LmTimer::finish`] to leave the model's cache empty.
pub struct LmTimer<'a> {
    lm: &'a mut dyn CausalLm,
    tail: Vec<u32>,
    last_only: bool,
    threads: usize,
    /// Whether the forward's threads are this process's CPU threads ([`CausalLm::computes_on_cpu`]):
    /// only then does their CPU time tell a shared core.
    on_cpu: bool,
    /// Every size timed after untimed forwards of its own size, not only one row on a device.
    repeated_shapes: bool,
    /// Milliseconds paused so far while this process served requests (see [`serving_gate`]).
    paused_ms: f64,
}

/// Untimed forwards of a size before that size is timed as a repeated shape: one row on a
/// device, every size with [`LmTimer::with_repeated_shapes`] (see [`LmTimer::time`]).
const SAME_SHAPE_LEAD_IN: usize = 2;

/// The most a measurement pauses, in all, for the requests of its own process: beyond it a server
/// that never idles is measured beside its requests (those forwards count as shared, so the
/// curve ends up provisional: used, refined, never cached).
const MAX_PAUSE_MS: f64 = 600_000.0;

impl<'a> LmTimer<'a> {
    /// Prefill `prefix` tokens and warm up for batches of up to `max_n` rows, on a model that
    /// computes with `threads` threads.
    pub fn new(
        lm: &'a mut dyn CausalLm,
        prefix: usize,
        max_n: usize,
        last_only: bool,
        threads: usize,
    ) -> Result<Self> {
        if max_n == 0 {
            return Err(EngineError::InvalidRequest("a cost profile needs batch sizes ≥ 1".into()));
        }
        if prefix + max_n >= lm.context_size() {
            return Err(EngineError::InvalidRequest(format!(
                "a cost profile up to {max_n} tokens on {prefix} committed ones needs a context above {}",
                prefix + max_n
            )));
        }
        let vocab = lm.vocab_size() as u32;
        // Ordinary ids spread over the vocabulary; their values do not change the cost.
        let mut tokens: Vec<u32> = (0..(prefix + max_n) as u32).map(|i| (i * 7919 + 13) % vocab).collect();
        let tail = tokens.split_off(prefix);
        lm.truncate(0)?;
        lm.prefill(&tokens)?;
        let on_cpu = lm.computes_on_cpu();
        let mut timer = Self {
            lm,
            tail,
            last_only,
            threads: threads.max(1),
            on_cpu,
            repeated_shapes: false,
            paused_ms: 0.0,
        };
        // A device loads each kernel on its first use (CUDA's lazy loading: a 2-row batch's
        // first forward on an H200 took 25 ms against 4 for the sizes around it), so every size
        // runs once before any is timed; a forward there takes milliseconds. On a CPU the
        // smallest and largest sizes allocate what the others reuse.
        let warm: Vec<usize> = if on_cpu { vec![1, max_n] } else { (1..=max_n).collect() };
        for n in warm {
            timer.time(n)?;
        }
        Ok(timer)
    }

    /// Time every size after [`SAME_SHAPE_LEAD_IN`] untimed forwards of that size: what a step
    /// costs where its size repeats from step to step, as it would if tree sizes were kept to
    /// a few buckets. A device that replays captured graphs for a repeated shape is priced at
    /// the replay; without this, only one row is timed so there (plain decoding repeats it).
    pub fn with_repeated_shapes(mut self) -> Self {
        self.repeated_shapes = true;
        self
    }

    /// Empty the model's cache.
    pub fn finish(self) -> Result<()> {
        self.lm.truncate(0)
    }
}

impl ForwardTimer for LmTimer<'_> {
    fn wait_for_cores(&mut self, max_ms: f64) -> f64 {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let spare = cpus.saturating_sub(self.threads) as f64 + FREE_CORES_SLACK;
        let t = Instant::now();
        let waited = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        while waited(t) < max_ms {
            match others_busy_cores(Duration::from_millis(WATCH_MS)) {
                Some(busy) if busy > spare => continue,
                Some(_) => break,
                // Nothing to watch: one plain pause.
                None => {
                    std::thread::sleep(Duration::from_millis(4 * WATCH_MS));
                    break;
                }
            }
        }
        waited(t)
    }

    fn time(&mut self, n: usize) -> Result<Timing> {
        let tokens = self.tail.get(..n).ok_or_else(|| {
            EngineError::InvalidRequest(format!(
                "{n} rows exceed the {} the timer was made for",
                self.tail.len()
            ))
        })?;
        let batch = TreeBatch::chain(tokens, None, 0, self.last_only);
        if self.repeated_shapes || (!self.on_cpu && n == 1) {
            // Plain decoding repeats the one-row shape every step, and a device replays a
            // captured graph for a shape it saw in the calls before (llama.cpp's CUDA backend
            // captures on the second call, replays from the third): one row is timed as that
            // steady state. A tree step's shape changes from step to step, so larger sizes are
            // timed as they come, after other sizes (on an H200: 2.15 ms for one row replayed,
            // 4.5 ms for four rows run directly), unless asked for as repeated shapes.
            for _ in 0..SAME_SHAPE_LEAD_IN {
                self.lm.forward(&batch)?;
                self.lm.commit(&[])?;
            }
        }
        loop {
            // In a gap between this process's requests: serving never pays for the measurement.
            let budget = Duration::from_secs_f64((MAX_PAUSE_MS - self.paused_ms).max(0.0) / 1e3);
            let (paused, gap) = serving_gate::wait_for_gap(budget);
            self.paused_ms += paused.as_secs_f64() * 1e3;
            let cpu = process_cpu_ms();
            let t = Instant::now();
            self.lm.forward(&batch)?;
            let ms = (t.elapsed().as_secs_f64() * 1e3).max(1e-6);
            let on_cpu = cpu
                .zip(process_cpu_ms())
                .filter(|_| self.on_cpu)
                .map(|(a, b)| (b - a) / (ms * self.threads as f64));
            self.lm.commit(&[])?;
            if gap.alone() {
                return Ok(Timing { ms, on_cpu });
            }
            // A request of ours ran beside the forward (its threads are ours, so the CPU time
            // cannot tell): timed again in the next gap, not counted as another process's load.
            // Once the pauses are spent, the forward counts as shared, as after another process.
            if self.paused_ms >= MAX_PAUSE_MS {
                return Ok(Timing { ms, on_cpu: Some(0.0) });
            }
        }
    }
}

/// Time forwards as `spec` says, in `spec.repeat` rounds over all sizes (so a burst of load
/// slows one round of a few sizes, not every repeat of one size). The model's cache is left
/// empty.
pub fn time_forwards(lm: &mut dyn CausalLm, spec: ProfileSpec) -> Result<Vec<TimedSize>> {
    check_sizes(spec.sizes, spec.repeat)?;
    let max_n = spec.sizes.iter().copied().max().unwrap_or(0);
    let mut timer = LmTimer::new(lm, spec.prefix, max_n, spec.last_only, spec.threads)?;
    if spec.repeated_shapes {
        timer = timer.with_repeated_shapes();
    }
    let opts = MeasureOptions {
        rounds: spec.repeat,
        extra_rounds: 0,
        threads: spec.threads,
        ..MeasureOptions::default()
    };
    let timed = time_rounds(&mut timer, spec.sizes, &opts, &mut |_| {})?;
    timer.finish()?;
    Ok(timed
        .samples
        .into_iter()
        .map(|(n, mut times)| {
            times.sort_by(f64::total_cmp);
            TimedSize { n, median_ms: times[times.len() / 2], min_ms: times[0] }
        })
        .collect())
}

fn check_sizes(sizes: &[usize], rounds: usize) -> Result<()> {
    if sizes.is_empty() || rounds == 0 || sizes.contains(&0) {
        return Err(EngineError::InvalidRequest(
            "a cost profile needs batch sizes ≥ 1 and repeat ≥ 1".into(),
        ));
    }
    Ok(())
}

/// How a cost curve is measured on a machine that may be busy.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasureOptions {
    /// Rounds over every size (each round times each size once: the first in order, the others
    /// in a shuffled order of their own, so a slow drift does not bias one end of the curve and a
    /// burst of load at the turn of two rounds never hits the same neighbours twice).
    pub rounds: usize,
    /// At most this many extra rounds over the sizes whose repeats disagree or whose time the
    /// fit judged a spike.
    pub extra_rounds: usize,
    /// The two fastest repeats of a size must agree within this fraction.
    pub agree: f64,
    /// Threads the model computes with: a 1-minute load average above this + 0.5 means other
    /// processes compete for the cores.
    pub threads: usize,
    /// A forward whose threads ran on a CPU for less than this share of its wall time (see
    /// [`Timing::on_cpu`]) shared its cores and is timed again once they are free.
    pub min_on_cpu: f64,
    /// The most milliseconds a whole measurement spends waiting for its cores (pauses, and the
    /// forwards that shared them); after that a forward that shared them is kept, and the
    /// curve is reported noisy.
    pub max_wait_ms: f64,
}

impl Default for MeasureOptions {
    fn default() -> Self {
        Self { rounds: 3, extra_rounds: 4, agree: 0.05, threads: 1, min_on_cpu: 0.8, max_wait_ms: 240_000.0 }
    }
}

/// How long [`LmTimer`] watches the machine at a time while it waits for its cores: a
/// forward is timed again after the first window in which other processes kept less than
/// [`FREE_CORES_SLACK`] cores busy beyond those our threads leave over.
const WATCH_MS: u64 = 200;

/// See [`WATCH_MS`].
const FREE_CORES_SLACK: f64 = 0.3;

/// A machine is busy when more than one forward in this many shared its cores
/// ([`Interference::busy`]).
const BUSY_SHARE: usize = 20;

/// Where a measurement stands, for a progress display.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Forwards timed so far, weighted by their rows (plus [`OVERHEAD_ROWS`] each): a forward of
    /// 64 rows takes about 30 of 1 row, so this is what an ETA should extrapolate.
    pub work_done: usize,
    /// The same for every forward planned so far (it grows when extra rounds are needed).
    pub work_total: usize,
    /// Sizes timed in the current round.
    pub sizes_done: usize,
    /// Sizes in the current round.
    pub sizes: usize,
    /// The current round (1-based); rounds beyond [`MeasureOptions::rounds`] are extra ones.
    pub round: usize,
    /// Rounds planned so far.
    pub rounds: usize,
    /// Which part of the profile: "short cache" or "long cache".
    pub phase: &'static str,
    /// Milliseconds spent so far waiting for the cores (another process was using them).
    pub waited_ms: f64,
}

/// What a forward costs beyond its rows, in rows, for [`Progress`]'s work units.
pub const OVERHEAD_ROWS: usize = 4;

/// Signs that the machine was busy while a curve was measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Interference {
    /// Threads the model computed with.
    pub threads: usize,
    /// Sizes measured.
    pub sizes: usize,
    /// The highest 1-minute load average seen (None where the platform does not report it).
    pub load: Option<f64>,
    /// Sizes whose two fastest repeats still disagreed after every extra round.
    pub unsettled: Vec<usize>,
    /// Sizes whose time the fit still judged a spike after every extra round.
    pub spikes: Vec<usize>,
    /// Extra rounds run.
    pub extra_rounds: usize,
    /// Forwards timed, alone or not.
    pub timed: usize,
    /// Forwards that shared their cores with another process (timed again after a pause).
    pub shared: usize,
    /// Of those, the ones kept because the wait for free cores ran out.
    pub kept_shared: usize,
    /// Milliseconds spent waiting for the cores.
    pub waited_ms: f64,
    /// Sizes no forward was timed alone for (interpolated from the others).
    pub unmeasured: Vec<usize>,
    /// Too few sizes were timed alone, and forwards that shared their cores stood in: the curve
    /// says how busy the machine was, not what a forward costs (use it for now, keep it not).
    pub stood_in: bool,
}

impl Interference {
    /// Whether the load average says other processes competed for the cores.
    pub fn loaded(&self) -> bool {
        self.load.is_some_and(|l| l > self.threads as f64 + 0.5)
    }

    /// Whether the machine itself says it was busy: the load average, or more than one forward
    /// in [`BUSY_SHARE`] whose threads were off their cores and had to be timed again. A VM's
    /// hypervisor takes a core away now and then with nothing else running (a quiet Zen 3 VM:
    /// one forward of about 200, twice in a row), which says nothing of the others.
    pub fn busy(&self) -> bool {
        self.loaded() || self.shared * BUSY_SHARE > self.timed
    }

    /// Whether the measurement is suspect: forwards kept although they shared their cores,
    /// sizes never timed alone, or a machine that says it was busy ([`Self::busy`]) and whose
    /// timings also show it. Sizes whose fastest repeats still differ by over 5%, and spikes
    /// the fit removed (it predicts those sizes from the curve's shape), are a VM's steady
    /// jitter — the curve's spread, not a fault — unless the machine also says it was busy: a
    /// quiet Zen 3 VM left 18 of 46 sizes unsettled at its first measurement and 25 of 64 at a
    /// `--reprofile`, and another fresh one 20 unsettled and 4 spikes of 46 (the draft model:
    /// 35 and 4), with nothing else running, and a warning nobody could act on followed every
    /// run. Then a spike, or many unsettled sizes (over a quarter), count.
    pub fn noisy(&self) -> bool {
        self.loaded()
            || (self.busy() && (self.unsettled.len() * 4 > self.sizes || !self.spikes.is_empty()))
            || self.kept_shared > 0
            || !self.unmeasured.is_empty()
    }

    /// Every sign of interference seen, in one line ("" when none); a warning shows it when
    /// [`Self::noisy`] says the signs count.
    pub fn describe(&self) -> String {
        let mut why = Vec::new();
        if self.loaded() {
            let load = self.load.unwrap_or(0.0);
            why.push(format!("load average {load:.1} with {} threads of ours", self.threads));
        }
        if self.shared > self.kept_shared {
            why.push(format!(
                "{} of {} forwards shared their cores with another process and were timed again",
                self.shared - self.kept_shared,
                self.timed
            ));
        }
        if !self.unsettled.is_empty() {
            why.push(format!("repeats disagree at n = {:?}", self.unsettled));
        }
        if !self.spikes.is_empty() {
            why.push(format!("spikes at n = {:?}", self.spikes));
        }
        if self.kept_shared > 0 {
            why.push(format!(
                "{} forwards shared their cores with another process after {:.0} s of waiting",
                self.kept_shared,
                self.waited_ms / 1e3
            ));
        }
        if !self.unmeasured.is_empty() {
            why.push(format!("never timed alone, interpolated: n = {:?}", self.unmeasured));
        }
        why.join("; ")
    }

    fn merge(&mut self, other: Interference) {
        self.load = match (self.load, other.load) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.unsettled.extend(other.unsettled);
        self.spikes.extend(other.spikes);
        self.extra_rounds += other.extra_rounds;
        self.timed += other.timed;
        self.shared += other.shared;
        self.kept_shared += other.kept_shared;
        self.waited_ms += other.waited_ms;
        self.unmeasured.extend(other.unmeasured);
        self.stood_in |= other.stood_in;
        self.sizes += other.sizes;
    }
}

/// The 1-minute load average (Linux: /proc/loadavg; None elsewhere).
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// Every repeat of every size, and the signs of interference.
#[derive(Debug, Clone, PartialEq)]
pub struct Timed {
    /// `(n, repeats in ms)` in the order of `sizes`.
    pub samples: Vec<(usize, Vec<f64>)>,
    /// Signs of interference.
    pub interference: Interference,
}

impl Timed {
    /// The fitted points (see [`treespec_core::cost::fit`]).
    pub fn fitted(&self) -> Fitted {
        fit_samples(&self.samples)
    }
}

/// Time every size in `opts.rounds` interleaved rounds, then re-time the sizes whose two
/// fastest repeats disagree by more than `opts.agree`, or whose time the fit judges a spike, in
/// up to `opts.extra_rounds` further rounds; the load average is read before and after each
/// round. A forward that shared its cores with another process is timed again once they are
/// free (see [`time_alone`]). `progress` hears of every forward and every pause.
pub fn time_rounds(
    timer: &mut dyn ForwardTimer,
    sizes: &[usize],
    opts: &MeasureOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Timed> {
    time_rounds_in(timer, sizes, opts, "short cache", &mut |_| {}, progress)
}

fn time_rounds_in(
    timer: &mut dyn ForwardTimer,
    sizes: &[usize],
    opts: &MeasureOptions,
    phase: &'static str,
    plan: &mut dyn FnMut(usize),
    progress: &mut dyn FnMut(&Progress),
) -> Result<Timed> {
    check_sizes(sizes, opts.rounds)?;
    let work = |ns: &[usize]| ns.iter().map(|n| n + OVERHEAD_ROWS).sum::<usize>();
    let mut samples: Vec<(usize, Vec<f64>)> = sizes.iter().map(|&n| (n, Vec::new())).collect();
    let mut noise = Interference {
        threads: opts.threads,
        sizes: sizes.len(),
        load: timer.load_average(),
        ..Interference::default()
    };
    let mut p = Progress {
        work_done: 0,
        work_total: work(sizes) * opts.rounds,
        sizes_done: 0,
        sizes: sizes.len(),
        round: 0,
        rounds: opts.rounds,
        phase,
        waited_ms: 0.0,
    };
    plan(p.work_total);
    // Forwards kept although they shared their cores (once the wait for free cores is spent).
    let mut shared: Vec<(usize, Vec<f64>)> = sizes.iter().map(|&n| (n, Vec::new())).collect();
    let mut round = |timer: &mut dyn ForwardTimer,
                     which: &[usize],
                     p: &mut Progress,
                     samples: &mut Vec<(usize, Vec<f64>)>,
                     noise: &mut Interference|
     -> Result<()> {
        p.round += 1;
        p.sizes = which.len();
        p.sizes_done = 0;
        for n in round_order(which, p.round) {
            let timed = |s: &[(usize, Vec<f64>)]| s.iter().any(|s| s.0 == n && !s.1.is_empty());
            // Once the wait for free cores is spent, a size already timed is not timed again:
            // on cores that stay shared every forward takes many times its cost.
            if !((timed(samples) || timed(&shared)) && noise.waited_ms >= opts.max_wait_ms) {
                let (ms, alone) = time_alone(timer, n, opts, noise, p, progress)?;
                let into = if alone { &mut *samples } else { &mut shared };
                if let Some(s) = into.iter_mut().find(|s| s.0 == n) {
                    s.1.push(ms);
                }
            }
            p.work_done += n + OVERHEAD_ROWS;
            p.sizes_done += 1;
            progress(p);
        }
        Ok(())
    };
    for _ in 0..opts.rounds {
        round(&mut *timer, sizes, &mut p, &mut samples, &mut noise)?;
        noise.merge(Interference { load: timer.load_average(), ..Interference::default() });
    }
    let unsettled = |samples: &[(usize, Vec<f64>)]| -> Vec<usize> {
        let spikes = fit_samples(samples).spikes;
        samples.iter().filter(|(n, s)| !agree(s, opts.agree) || spikes.contains(n)).map(|(n, _)| *n).collect()
    };
    let mut redo = if opts.rounds >= 2 { unsettled(&samples) } else { Vec::new() };
    while !redo.is_empty() && noise.extra_rounds < opts.extra_rounds && noise.waited_ms < opts.max_wait_ms {
        noise.extra_rounds += 1;
        p.rounds += 1;
        p.work_total += work(&redo);
        plan(work(&redo));
        round(&mut *timer, &redo, &mut p, &mut samples, &mut noise)?;
        noise.merge(Interference { load: timer.load_average(), ..Interference::default() });
        redo = unsettled(&samples);
    }
    let spikes = fit_samples(&samples).spikes;
    noise.spikes = redo.iter().copied().filter(|n| spikes.contains(n)).collect();
    noise.unsettled = redo.into_iter().filter(|n| !noise.spikes.contains(n)).collect();
    noise.unmeasured = samples.iter().filter(|s| s.1.is_empty()).map(|s| s.0).collect();
    noise.stood_in = stand_in_shared(&mut samples, shared, noise.unmeasured.len());
    Ok(Timed { samples, interference: noise })
}

/// A size never timed alone is interpolated from the sizes that were; only when fewer than a
/// quarter were (`unmeasured` of them were not) do the times of forwards that shared their cores
/// stand in (the curve is then reported noisy anyway). Whether they did.
fn stand_in_shared(
    samples: &mut [(usize, Vec<f64>)],
    shared: Vec<(usize, Vec<f64>)>,
    unmeasured: usize,
) -> bool {
    let stand_in = (samples.len() - unmeasured) * 4 < samples.len();
    if stand_in {
        for (s, extra) in samples.iter_mut().zip(shared) {
            s.1.extend(extra.1);
        }
    }
    stand_in
}

/// Time one forward of `n` rows while the process has its cores. A forward whose threads ran
/// on a CPU for less than `opts.min_on_cpu` of its wall time shared them with another process,
/// and its time says how busy the machine was rather than what a forward costs (llama.cpp's
/// threads wait for each other after every operation, so a shared core slows a forward far more
/// than twice): it is timed again once the other processes leave the cores (see
/// [`ForwardTimer::wait_for_cores`]), until a forward runs alone or the measurement has spent
/// `opts.max_wait_ms` in all waiting and on shared forwards; then the shared time is returned,
/// marked (`false`: not alone), and counted in `noise`.
fn time_alone(
    timer: &mut dyn ForwardTimer,
    n: usize,
    opts: &MeasureOptions,
    noise: &mut Interference,
    p: &mut Progress,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(f64, bool)> {
    loop {
        let t = timer.time(n)?;
        noise.timed += 1;
        if t.on_cpu.is_none_or(|share| share >= opts.min_on_cpu) {
            return Ok((t.ms, true));
        }
        noise.shared += 1;
        if noise.waited_ms >= opts.max_wait_ms {
            noise.kept_shared += 1;
            return Ok((t.ms, false));
        }
        noise.waited_ms += t.ms;
        noise.waited_ms += timer.wait_for_cores((opts.max_wait_ms - noise.waited_ms).max(0.0));
        p.waited_ms = noise.waited_ms;
        progress(p);
    }
}

/// The order of round `round` (1-based) over `sizes`: the first as given, every later one a
/// shuffle of its own (Fisher–Yates on a fixed-seed generator, so a profile is reproducible).
pub fn round_order(sizes: &[usize], round: usize) -> Vec<usize> {
    let mut order = sizes.to_vec();
    if round <= 1 {
        return order;
    }
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (round as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    for i in (1..order.len()).rev() {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let r = state.wrapping_mul(0x2545_f491_4f6c_dd1d);
        order.swap(i, (r % (i as u64 + 1)) as usize);
    }
    order
}

/// A measured cost curve and how much to trust it.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// The fitted curve, with its context cost.
    pub curve: CostCurve,
    /// Signs that the machine was busy while it was measured.
    pub interference: Interference,
}

/// The verify-batch cost curve (logits on every row) of a model, measured so that a busy
/// machine cannot poison it: the sizes are timed in interleaved rounds, each size's fastest
/// repeat is kept, sizes whose repeats disagree or whose time does not fit the shape a batched
/// matmul allows are timed again (see [`time_rounds`]), and the points are fitted by
/// [`treespec_core::cost::fit`]. The cost of context (see [`CostCurve::row_surcharge`]) is
/// fitted from the sizes in [`CONTEXT_SIZES`] timed again on a cache of [`CONTEXT_PREFIX`]
/// tokens — 0 when the context is too small to measure it. `progress` hears of every forward.
pub fn measure_curve(
    lm: &mut dyn CausalLm,
    sizes: &[usize],
    opts: &MeasureOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Measured> {
    check_sizes(sizes, opts.rounds)?;
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let again: Vec<usize> = CONTEXT_SIZES.iter().copied().filter(|n| sizes.contains(n)).collect();
    let long_largest = again.iter().copied().max().unwrap_or(0);
    let long = CONTEXT_PREFIX.min(lm.context_size().saturating_sub(long_largest + 1));
    let with_long = !again.is_empty() && long >= PROFILE_PREFIX + MIN_CONTEXT_SPAN;
    // The long-cache phase is planned from the start, so the first ETA covers both phases.
    let long_work =
        if with_long { again.iter().map(|n| n + OVERHEAD_ROWS).sum::<usize>() * opts.rounds } else { 0 };
    let planned = Cell::new(long_work);
    let done = Cell::new(0);
    let plan = &mut |w: usize| planned.set(planned.get() + w);
    let mut report = |p: &Progress| {
        progress(&Progress { work_done: done.get() + p.work_done, work_total: planned.get(), ..*p });
    };
    let mut timer = LmTimer::new(lm, PROFILE_PREFIX, largest, false, opts.threads)?;
    let short = time_rounds_in(&mut timer, sizes, opts, "short cache", plan, &mut report);
    timer.finish()?;
    let short = short?;
    let fitted = short.fitted();
    let curve = CostCurve::from_points(&fitted.points)?;
    let mut interference = short.interference;
    if !with_long {
        return Ok(Measured { curve: curve.with_context_cost(0.0, PROFILE_PREFIX)?, interference });
    }
    // What the long phase planned ahead is re-planned by it.
    planned.set(planned.get() - long_work);
    done.set(short.samples.iter().map(|(n, s)| (n + OVERHEAD_ROWS) * s.len()).sum::<usize>());
    // One wait for free cores for the whole measurement.
    let long_opts =
        MeasureOptions { max_wait_ms: (opts.max_wait_ms - interference.waited_ms).max(0.0), ..opts.clone() };
    let mut timer = LmTimer::new(lm, long, long_largest, false, opts.threads)?;
    let long_timed = time_rounds_in(&mut timer, &again, &long_opts, "long cache", plan, &mut report);
    timer.finish()?;
    let long_timed = long_timed?;
    let long_points = long_timed.fitted().points;
    interference.merge(long_timed.interference);
    let slope = context_slope(&fitted.points, &long_points, long - PROFILE_PREFIX);
    Ok(Measured { curve: curve.with_context_cost(slope, PROFILE_PREFIX)?, interference })
}

/// How a cached curve compares with this machine now: per size, the cached T(n) and the time
/// measured now (fastest of interleaved repeats).
#[derive(Debug, Clone, PartialEq)]
pub struct CurveCheck {
    /// `(n, cached ms, measured ms)`.
    pub rows: Vec<(usize, f64, f64)>,
    /// Signs that the machine was busy during the check.
    pub interference: Interference,
}

impl CurveCheck {
    /// The measured/cached ratio farthest from 1.
    pub fn worst_ratio(&self) -> f64 {
        self.rows
            .iter()
            .map(|r| r.2 / r.1)
            .max_by(|a, b| (a - 1.0).abs().total_cmp(&(b - 1.0).abs()))
            .unwrap_or(1.0)
    }

    /// Whether every size measured within `tolerance` (a fraction) of the cached curve.
    pub fn matches(&self, tolerance: f64) -> bool {
        (self.worst_ratio() - 1.0).abs() <= tolerance
    }
}

/// Sizes `treespec profile --check` times again: both sides of the first steps and dips, and
/// the far end.
pub const CHECK_SIZES: &[usize] = &[1, 2, 4, 8, 15, 16, 31, 32, 64];

/// Time the [`CHECK_SIZES`] up to the curve's largest size on the profile's cache and compare
/// with `curve`.
pub fn check_curve(
    lm: &mut dyn CausalLm,
    curve: &CostCurve,
    opts: &MeasureOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<CurveCheck> {
    let sizes: Vec<usize> = CHECK_SIZES.iter().copied().filter(|&n| n <= curve.max_n()).collect();
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let mut timer = LmTimer::new(lm, curve.profiled_context().max(1), largest, false, opts.threads)?;
    let timed = time_rounds(&mut timer, &sizes, opts, progress);
    timer.finish()?;
    let timed = timed?;
    let rows = timed.fitted().points.iter().map(|&(n, ms)| (n, curve.ms(n), ms)).collect();
    Ok(CurveCheck { rows, interference: timed.interference })
}

/// The extra ms per row per committed token that best explains (least squares through the
/// origin) how much slower each size of `long` ran than the same size of `short`, on a cache
/// `span` tokens longer: `T_long(n) − T_short(n) ≈ n · span · slope`. Never negative (a timing
/// that came out faster on the longer cache is noise, not a discount).
pub fn context_slope(short: &[(usize, f64)], long: &[(usize, f64)], span: usize) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for &(n, long_ms) in long {
        if let Some(&(_, short_ms)) = short.iter().find(|s| s.0 == n) {
            let x = (n * span) as f64;
            num += x * (long_ms - short_ms);
            den += x * x;
        }
    }
    if den > 0.0 {
        (num / den).max(0.0)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_curve_on_a_model() {
        let mut lm = crate::toy::ToyLm::new(crate::toy::ToyModel::new(8, 1, 1), 256);
        let opts = MeasureOptions::default();
        let c = measure_curve(&mut lm, &[1, 2, 4], &opts, &mut |_| {}).unwrap().curve;
        assert_eq!(c.max_n(), 4);
        assert!(c.ms(3) > 0.0);
        assert_eq!(lm.committed_len(), 0);
        assert!(measure_curve(&mut lm, &[1, 300], &opts, &mut |_| {}).is_err(), "past the context");
        assert!(measure_curve(&mut lm, &[], &opts, &mut |_| {}).is_err());
        let zero = MeasureOptions { rounds: 0, ..MeasureOptions::default() };
        assert!(measure_curve(&mut lm, &[1], &zero, &mut |_| {}).is_err());
        // The check times the check sizes the curve covers, on the profile's cache.
        let check = check_curve(&mut lm, &c, &opts, &mut |_| {}).unwrap();
        assert_eq!(check.rows.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 2, 4]);
        assert_eq!(lm.committed_len(), 0);
        // 256 tokens of context leave no room for a long cache: no context cost.
        assert_eq!(c.row_ms_per_context_token(), 0.0);
    }

    #[test]
    fn the_profiled_sizes_pin_down_a_curve_of_four_row_kernels() {
        // The shape of the repacked kernels: 4 rows at a time cost 46 ms, each remainder row
        // 16 ms, and multiples of 16 rows 20 ms less (what the 1.5B target measures on 2 cores).
        let kernel = |n: usize| {
            12.0 + 46.0 * (n / 4) as f64 + 16.0 * (n % 4) as f64
                - if n.is_multiple_of(16) { 20.0 } else { 0.0 }
        };
        let points: Vec<(usize, f64)> = PROFILE_SIZES.iter().map(|&n| (n, kernel(n))).collect();
        let c = CostCurve::from_points(&points).unwrap();
        assert_eq!(c.max_n(), 64);
        for n in 1..=64 {
            assert!((c.ms(n) - kernel(n)).abs() < 1e-9, "T({n}) reads {} instead of {}", c.ms(n), kernel(n));
        }
    }

    fn timed(points: &[(usize, f64)]) -> Vec<(usize, f64)> {
        points.to_vec()
    }

    #[test]
    fn the_context_slope_fits_what_each_row_costs_per_committed_token() {
        // The 1.5B target on 2 AMD cores, 64 and 1,536 committed tokens.
        let short = timed(&[(1, 25.0), (4, 76.2), (8, 118.1), (16, 136.1)]);
        let long = timed(&[(1, 33.2), (4, 89.4), (8, 149.1), (16, 207.4)]);
        let slope = context_slope(&short, &long, 1472);
        assert!((0.0028..0.0032).contains(&slope), "{slope}");
        // Exactly linear timings give their slope back; sizes timed only once are ignored.
        let long = timed(&[(1, 25.0 + 0.5), (4, 76.2 + 2.0), (32, 999.0)]);
        assert!((context_slope(&short, &long, 100) - 0.005).abs() < 1e-12);
        // Faster on the long cache (noise) is no discount; nothing to compare is no slope.
        assert_eq!(context_slope(&short, &timed(&[(4, 70.0)]), 1000), 0.0);
        assert_eq!(context_slope(&short, &timed(&[(2, 70.0)]), 1000), 0.0);
        assert_eq!(context_slope(&short, &long, 0), 0.0);
    }

    #[test]
    fn a_context_long_enough_measures_the_context_cost() {
        let mut lm = crate::toy::ToyLm::new(crate::toy::ToyModel::new(8, 1, 1), 2048);
        let opts = MeasureOptions { rounds: 1, ..MeasureOptions::default() };
        let mut seen = Vec::new();
        let c = measure_curve(&mut lm, &[1, 2, 4], &opts, &mut |p| seen.push(*p)).unwrap().curve;
        // Progress covers both caches, ends at its total and never runs backwards.
        let last = seen.last().unwrap();
        assert_eq!(
            (last.phase, last.work_done, last.work_total),
            ("long cache", last.work_total, last.work_total)
        );
        assert!(seen.iter().any(|p| p.phase == "short cache"));
        assert!(seen.windows(2).all(|w| w[0].work_done < w[1].work_done));
        // The toy model's cost hardly grows with its cache; the slope is measured and ≥ 0.
        assert!(c.row_ms_per_context_token().is_finite() && c.row_ms_per_context_token() >= 0.0);
        assert_eq!(c.row_surcharge(64), 0.0, "no surcharge up to the profiled cache");
        assert_eq!(lm.committed_len(), 0);
    }

    #[test]
    fn unsettled_sizes_are_jitter_unless_the_machine_says_it_was_busy() {
        let noise =
            |unsettled: Vec<usize>| Interference { threads: 2, sizes: 46, unsettled, ..Default::default() };
        assert!(!noise((1..=11).collect()).noisy(), "11 of 46: a VM's jitter");
        assert!(!noise((1..=25).collect()).noisy(), "25 of 46 on a quiet VM: still its spread");
        let shared = |unsettled: Vec<usize>| Interference { shared: 3, ..noise(unsettled) };
        assert!(!shared((1..=11).collect()).noisy(), "a few, with forwards timed again: jitter");
        assert!(shared((1..=12).collect()).noisy(), "over a quarter while forwards shared their cores");
        assert!(Interference { sizes: 46, kept_shared: 1, ..Default::default() }.noisy());
        // Spikes the fit removed: jitter on a quiet machine, a fault on a busy one.
        let spikes = Interference { spikes: vec![8, 10, 13, 44], ..noise((1..=20).collect()) };
        assert!(!spikes.noisy(), "a fresh Zen 3 VM, nothing else running");
        assert!(
            Interference { shared: 1, ..spikes.clone() }.noisy(),
            "spikes while forwards shared their cores"
        );
        let timed = Interference { timed: 200, ..spikes.clone() };
        assert!(!Interference { shared: 1, ..timed.clone() }.noisy(), "one forward in 200: the hypervisor");
        assert!(Interference { shared: 11, ..timed }.noisy(), "one in 20: another process");
        assert!(Interference { load: Some(2.6), ..spikes }.noisy());
        assert!(Interference { threads: 2, sizes: 46, load: Some(2.6), ..Default::default() }.noisy());
    }
}
