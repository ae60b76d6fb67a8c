//! Which of ggml's CPU matmul kernels this machine should run: measured once, with the curve.
//!
//! ggml's tiled K-quant matmul (`GGML_CPU_TILED_MM`, on by default) pays on some CPUs and not on
//! others: on a Zen 3 VM without VNNI, turning it off made verify batches of 8–12 rows 10–18%
//! cheaper (465 → 382 ms at n = 8) and left other sizes alone. ggml reads the switch once per
//! process, at its first matmul, so the two settings cannot be timed side by side in one
//! process: the first profile of a model on a CPU (no cached curve, no `GGML_CPU_TILED_MM` in the
//! environment) times a few batch sizes in child `treespec profile` processes under each setting,
//! interleaved, keeps the faster one for this process (before its first decode) and records it
//! in the cached curve; every later process reads it back when it loads the model, before any
//! decode, so the curve and the kernels it was measured with always agree. A setting the user
//! gave in the environment is never overridden, and exact mode turns the tiled path off anyway.

use std::path::Path;
use std::process::Command;

use serde::Deserialize;

/// ggml's switch (read once per process, at the first matmul that could take the tiled path).
pub(crate) const TILED_ENV: &str = "GGML_CPU_TILED_MM";

/// Batch sizes the probe times: where the tiled kernel is used (it is not for one row), up to
/// the sizes the drafters verify most.
const PROBE_SIZES: &str = "1,8,12,16,32";
/// Probe rounds per setting (each a child process; the settings alternate).
const PROBE_ROUNDS: usize = 2;
/// How much faster (a fraction of the summed time over the sizes of 8 rows and more) the
/// untiled path must be to be chosen over ggml's default: less is within a VM's jitter.
const MIN_GAIN: f64 = 0.05;

/// The kernel setting a curve was measured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TiledMatmul {
    /// ggml's default.
    On,
    /// `GGML_CPU_TILED_MM=0`, chosen by the probe.
    Off,
}

impl TiledMatmul {
    /// The value recorded in the cache file (`None` for the default, so older files read as it).
    pub(crate) fn recorded(self) -> Option<String> {
        match self {
            TiledMatmul::On => None,
            TiledMatmul::Off => Some(format!("{TILED_ENV}=0")),
        }
    }

    /// Read back what [`TiledMatmul::recorded`] wrote.
    pub(crate) fn from_recorded(kernels: Option<&str>) -> Self {
        match kernels {
            Some(k) if k.trim() == format!("{TILED_ENV}=0") => TiledMatmul::Off,
            _ => TiledMatmul::On,
        }
    }
}

/// ggml's tiled K-quant matmul in this process, in words (what `treespec profile` shows): the
/// environment says it, whether the user set it or this machine's first profile chose it.
pub fn tiled_matmul_state() -> String {
    match std::env::var(TILED_ENV) {
        Ok(v) if v.trim().parse::<i64>().is_ok_and(|n| n == 0) => {
            format!("off ({TILED_ENV}=0: set, or chosen by this model's first profile on this machine)")
        }
        Ok(v) => format!("on ({TILED_ENV}={v})"),
        Err(_) => "on (ggml's default)".to_string(),
    }
}

/// Whether the probe may choose for this process: nobody set the switch, no matmul has run yet,
/// and the running program is the `treespec` command (the children are `treespec profile`).
pub(crate) fn probe_allowed(decoded: bool) -> bool {
    std::env::var_os(TILED_ENV).is_none()
        && !decoded
        && std::env::current_exe()
            .ok()
            .and_then(|exe| exe.file_stem().map(|s| s == "treespec"))
            .unwrap_or(false)
}

/// Apply a recorded choice to this process (before its first matmul; never over the user's).
pub(crate) fn apply(choice: TiledMatmul, decoded: bool) {
    if choice == TiledMatmul::Off && std::env::var_os(TILED_ENV).is_none() && !decoded {
        turn_tiled_off();
    }
}

/// Turn ggml's tiled matmul off for this process: the one writer of [`TILED_ENV`], for the
/// recorded choice and for exact mode. Callers call it only before the process's first decode.
pub(crate) fn turn_tiled_off() {
    // Edition 2021: `set_var` is safe to call. No ggml thread has read the environment yet
    // (nothing has decoded), so nothing races with this write in practice.
    std::env::set_var(TILED_ENV, "0");
}

/// Time both settings on `model` in child processes and say which is faster, with the times
/// (ms summed over the probed sizes of 8 rows and more, each size the fastest of its repeats).
/// `None` when a child could not run (the default is then kept).
pub(crate) fn probe(model: &Path, threads: usize, ctx: usize) -> Option<(TiledMatmul, f64, f64)> {
    let exe = std::env::current_exe().ok()?;
    let mut on: Vec<Vec<(usize, f64)>> = Vec::new();
    let mut off: Vec<Vec<(usize, f64)>> = Vec::new();
    for _ in 0..PROBE_ROUNDS {
        for (setting, into) in [("1", &mut on), ("0", &mut off)] {
            let output = Command::new(&exe)
                .args(["profile", "--json", "--repeat", "3", "--sizes", PROBE_SIZES])
                .arg("-m")
                .arg(model)
                .args(["-t", &threads.to_string(), "-c", &ctx.max(512).to_string()])
                .env(TILED_ENV, setting)
                .output()
                .ok()?;
            if !output.status.success() {
                return None;
            }
            into.push(parse_points(&output.stdout)?);
        }
    }
    let (on_ms, off_ms) = (fastest_sum(&on), fastest_sum(&off));
    Some((choose(on_ms, off_ms), on_ms, off_ms))
}

/// The faster setting: off only when it saves at least [`MIN_GAIN`].
pub(crate) fn choose(on_ms: f64, off_ms: f64) -> TiledMatmul {
    if on_ms.is_finite() && off_ms.is_finite() && off_ms < on_ms * (1.0 - MIN_GAIN) {
        TiledMatmul::Off
    } else {
        TiledMatmul::On
    }
}

#[derive(Deserialize)]
struct ProfileJson {
    points: Vec<ProfilePoint>,
}

#[derive(Deserialize)]
struct ProfilePoint {
    n: usize,
    min_ms: f64,
}

/// `treespec profile --json`'s points as (n, fastest ms).
fn parse_points(stdout: &[u8]) -> Option<Vec<(usize, f64)>> {
    let parsed: ProfileJson = serde_json::from_slice(stdout).ok()?;
    Some(parsed.points.into_iter().map(|p| (p.n, p.min_ms)).collect())
}

/// Over the rounds, each size's fastest time, summed over the sizes of 8 rows and more.
fn fastest_sum(rounds: &[Vec<(usize, f64)>]) -> f64 {
    let mut best: Vec<(usize, f64)> = Vec::new();
    for round in rounds {
        for &(n, ms) in round {
            match best.iter_mut().find(|b| b.0 == n) {
                Some(b) => b.1 = b.1.min(ms),
                None => best.push((n, ms)),
            }
        }
    }
    let sum: f64 = best.iter().filter(|b| b.0 >= 8).map(|b| b.1).sum();
    if best.iter().any(|b| b.0 >= 8) {
        sum
    } else {
        f64::NAN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untiled_is_chosen_only_when_clearly_faster() {
        assert_eq!(choose(465.0, 382.0), TiledMatmul::Off, "Zen 3's 18% at n = 8");
        assert_eq!(choose(400.0, 390.0), TiledMatmul::On, "2.5% is jitter");
        assert_eq!(choose(400.0, 420.0), TiledMatmul::On);
        assert_eq!(choose(f64::NAN, 100.0), TiledMatmul::On, "no measurement keeps the default");
    }

    #[test]
    fn rounds_keep_each_sizes_fastest_and_skip_single_rows() {
        let rounds = vec![vec![(1, 50.0), (8, 300.0), (16, 500.0)], vec![(1, 10.0), (8, 280.0), (16, 520.0)]];
        assert_eq!(fastest_sum(&rounds), 780.0);
        assert!(fastest_sum(&[vec![(1, 50.0)]]).is_nan());
        let json = br#"{"points":[{"n":1,"ms":51.0,"min_ms":50.0},{"n":8,"ms":310.0,"min_ms":300.0}]}"#;
        assert_eq!(parse_points(json), Some(vec![(1, 50.0), (8, 300.0)]));
        assert_eq!(parse_points(b"not json"), None);
    }

    #[test]
    fn the_choice_round_trips_through_the_cache_field() {
        for choice in [TiledMatmul::On, TiledMatmul::Off] {
            assert_eq!(TiledMatmul::from_recorded(choice.recorded().as_deref()), choice);
        }
        assert_eq!(
            TiledMatmul::from_recorded(None),
            TiledMatmul::On,
            "files from before read as the default"
        );
    }
}
