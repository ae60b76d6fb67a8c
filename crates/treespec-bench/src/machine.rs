//! What machine and build a result set came from.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

/// A model file used by the benchmark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelFile {
    /// "target" or "draft".
    pub role: String,
    /// File name.
    pub name: String,
    /// Path as given.
    pub path: String,
    /// Size in bytes (0 when unreadable).
    pub size_bytes: u64,
}

impl ModelFile {
    /// Describe the file at `path`.
    pub fn new(role: &str, path: &Path) -> Self {
        Self {
            role: role.to_string(),
            name: path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            path: path.display().to_string(),
            size_bytes: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        }
    }
}

/// The machine, build and models of a result set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineInfo {
    /// CPU model name (/proc/cpuinfo), or "unknown".
    pub cpu: String,
    /// CPU family / model / stepping numbers, when known (VMs often report a bare model name).
    pub cpu_id: Option<String>,
    /// Logical CPUs available to this process.
    pub logical_cpus: usize,
    /// Threads the backend was told to use.
    pub threads: usize,
    /// SIMD extensions of interest the CPU reports (avx2, avx512f, …).
    pub simd: Vec<String>,
    /// Total memory in GiB (0 when unknown).
    pub memory_gib: f64,
    /// Operating system (os-release PRETTY_NAME, or the Rust target OS).
    pub os: String,
    /// Kernel release, when known.
    pub kernel: Option<String>,
    /// CPU architecture.
    pub arch: String,
    /// treespec version.
    pub treespec_version: String,
    /// `git rev-parse HEAD`, when run inside the repository.
    pub git_commit: Option<String>,
    /// Whether the work tree had uncommitted changes, when known.
    pub git_dirty: Option<bool>,
    /// Model files.
    pub models: Vec<ModelFile>,
    /// 1-minute load average when the benchmark started (other work on the machine = noise).
    pub load_average_start: Option<f64>,
    /// 1-minute load average when it ended.
    pub load_average_end: Option<f64>,
    /// Where the models ran (`CPU`, or a GPU and its layers); absent in older results.
    #[serde(default)]
    pub device: Option<String>,
}

/// The 1-minute load average, read where the cost-curve measurement reads it.
pub use treespec_engine::measure::profile::load_average;

const SIMD: &[&str] = &["avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "neon"];

impl MachineInfo {
    /// Gather what can be known about this machine; never fails (unknowns stay empty). Call it
    /// before the benchmark (it records the load average as `load_average_start`) and set
    /// `load_average_end` from [`load_average`] after.
    pub fn collect(threads: usize, models: Vec<ModelFile>) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpuinfo.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().to_string())
            })
        };
        let cpu = field("model name").or_else(|| field("Model")).unwrap_or_else(|| "unknown".into());
        let cpu_id = match (field("cpu family"), field("model"), field("stepping")) {
            (Some(f), Some(m), s) => Some(format!(
                "family {f}, model {m}{}",
                s.map_or(String::new(), |s| format!(", stepping {s}"))
            )),
            _ => None,
        };
        let flags = field("flags").or_else(|| field("Features")).unwrap_or_default();
        let flags: Vec<&str> = flags.split_whitespace().collect();
        let simd = SIMD.iter().filter(|f| flags.contains(f)).map(|f| f.to_string()).collect();
        let memory_gib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                let line = m.lines().find(|l| l.starts_with("MemTotal:"))?.to_string();
                line.split_whitespace().nth(1)?.parse::<f64>().ok()
            })
            .map_or(0.0, |kib| (kib / (1024.0 * 1024.0) * 10.0).round() / 10.0);
        let os = std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("PRETTY_NAME=").map(|v| v.trim_matches('"').to_string()))
            })
            .unwrap_or_else(|| std::env::consts::OS.to_string());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_string());
        let (git_commit, git_dirty) = git_state();
        Self {
            cpu,
            cpu_id,
            logical_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            threads,
            simd,
            memory_gib,
            os,
            kernel,
            arch: std::env::consts::ARCH.to_string(),
            treespec_version: env!("CARGO_PKG_VERSION").to_string(),
            git_commit,
            git_dirty,
            models,
            load_average_start: load_average(),
            load_average_end: None,
            device: None,
        }
    }
}

/// The commit and dirtiness of the repository around the working directory, or of the one this
/// crate was built from; `None` when git is missing or neither is a repository.
fn git_state() -> (Option<String>, Option<bool>) {
    let build_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for dir in [std::env::current_dir().ok(), Some(build_dir)].into_iter().flatten() {
        let Some(commit) = git(&dir, &["rev-parse", "HEAD"]) else { continue };
        let dirty = git(&dir, &["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty());
        return (Some(commit), dirty);
    }
    (None, None)
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}
