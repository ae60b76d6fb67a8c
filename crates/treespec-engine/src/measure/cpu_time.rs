//! The CPU time this process has used, to tell a timed forward that had its cores from one that
//! shared them with another process.
//!
//! A forward's wall time on a busy machine says how busy the machine was, not what the forward
//! costs: llama.cpp's threads meet at a barrier after every operation, so one thread that loses
//! its core for a time slice holds up the others, and with two busy processes on two cores a
//! 30 ms forward was measured taking 240–1,200 ms. Our threads' CPU time over the forward's wall
//! time shows it directly: about 1 per thread when the forward ran alone (waiting threads spin),
//! about ½ when each core was shared with one other busy process.

/// Milliseconds of CPU time all threads of this process have used (None where the platform
/// does not say).
#[cfg(unix)]
pub fn process_cpu_ms() -> Option<f64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_PROCESS_CPUTIME_ID is supported by every
    // Unix this builds for, and a failure is reported through the return code.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6)
}

/// Milliseconds of CPU time all threads of this process have used (None where the platform
/// does not say).
#[cfg(not(unix))]
pub fn process_cpu_ms() -> Option<f64> {
    None
}

/// How many cores other processes kept busy while this thread slept for `window` (from
/// `/proc/stat`: busy jiffies of all CPUs, steal included, over the window; Linux only, None
/// elsewhere). Our own threads are idle meanwhile, so what it counts is the neighbours' load.
pub fn others_busy_cores(window: std::time::Duration) -> Option<f64> {
    let before = cpu_jiffies()?;
    std::thread::sleep(window);
    let after = cpu_jiffies()?;
    let total = after.0.checked_sub(before.0)?;
    let idle = after.1.checked_sub(before.1)?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    (total > 0).then(|| (total - idle) as f64 / total as f64 * cpus)
}

/// (all, idle + iowait) jiffies of the aggregate `cpu` line of `/proc/stat`.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).map_while(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let all = v.iter().take(8).sum();
    Some((all, v.get(3)? + v.get(4).copied().unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process's CPU time counts every thread, and the test harness runs other tests on
    /// threads of this process meanwhile: the test runs itself again in a process of its own.
    #[test]
    fn cpu_time_grows_with_work_and_not_with_sleep() {
        const ALONE: &str = "TREESPEC_CPU_TIME_TEST_ALONE";
        if std::env::var_os(ALONE).is_none() {
            // This test's path inside the crate (module_path! starts with the crate's name).
            let module = module_path!().split_once("::").map_or("", |(_, m)| m);
            let name = format!("{module}::cpu_time_grows_with_work_and_not_with_sleep");
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([name.as_str(), "--exact", "--test-threads=1", "--nocapture"])
                .env(ALONE, "1")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success() && text.contains("1 passed"), "{text}");
            return;
        }
        let Some(start) = process_cpu_ms() else { return };
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed().as_millis() < 30 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let busy = process_cpu_ms().unwrap() - start;
        assert!(busy > 5.0, "30 ms of spinning used {busy:.2} ms of CPU");
        let before = process_cpu_ms().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(60));
        let slept = process_cpu_ms().unwrap() - before;
        assert!(slept < 30.0, "60 ms asleep used {slept:.2} ms of CPU");
    }
}
