//! Transparent huge pages under the weights and the KV cache.
//!
//! A step of a small model on a CPU streams every weight once, so it runs at the memory's pace,
//! and on 4 KiB pages a gigabyte of weights is 262,144 page translations per step. llama.cpp
//! keeps the weights it repacks for its CPU kernels (most of a Q4_K model) and every KV cache
//! in anonymous memory from `malloc`, which the kernel backs with huge pages only where a
//! mapping asks for them when transparent huge pages are in `madvise` mode (the default of
//! Debian, Ubuntu and most distributions). Measured on a 2-vCPU Xeon VM (family 6 model 167),
//! Qwen2.5-Coder-1.5B Q4_K_M, 2 threads, 650-token prompt: plain decoding at 13.3 tok/s on
//! 4 KiB pages and 15.7 on huge pages (1.18×), llama.cpp's own `llama-completion` 13.5 against
//! 16.0 with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (docs/BENCHMARKS.md).
//!
//! So whenever a context has allocated its cache (its model's weights are loaded by then, and
//! nothing decodes before), every large private anonymous mapping of the process is advised `MADV_HUGEPAGE` (later faults and khugepaged
//! take huge pages) and collapsed at once with `MADV_COLLAPSE` (Linux 6.1 and later; older
//! kernels keep the advice only). The contents and so the numbers computed are unchanged:
//! only the page size under them. `TREESPEC_HUGE_PAGES=off` leaves the pages as they are (for
//! A/B runs); with transparent huge pages `never` there is nothing to ask for.

use std::sync::atomic::{AtomicU64, Ordering};

/// Mappings smaller than this are left alone: weights and caches run to hundreds of MiB, and
/// small mappings are thread stacks and allocator arenas.
const MIN_MAPPING: u64 = 32 << 20;

/// The huge page size transparent huge pages use on x86-64 and most arm64 kernels.
const HUGE_PAGE: u64 = 2 << 20;

/// Bytes this process has asked to back with huge pages so far, and how many of them the
/// kernel collapsed at once.
static ADVISED: AtomicU64 = AtomicU64::new(0);
static COLLAPSED: AtomicU64 = AtomicU64::new(0);

/// The environment variable that turns this off.
pub const HUGE_PAGES_ENV: &str = "TREESPEC_HUGE_PAGES";

/// Whether this process backs its large mappings with huge pages: not turned off by
/// [`HUGE_PAGES_ENV`], and transparent huge pages not `never` on this kernel.
pub fn enabled() -> bool {
    let off = std::env::var(HUGE_PAGES_ENV).is_ok_and(|v| matches!(v.trim(), "0" | "off" | "false" | "no"));
    !off && thp_mode().is_some_and(|m| m != "never")
}

/// The kernel's transparent huge page mode (`always`, `madvise`, `never`), None off Linux or
/// where the kernel has none.
fn thp_mode() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    parse_mode(&text)
}

/// The bracketed word of a sysfs choice line: `always [madvise] never` → `madvise`.
fn parse_mode(text: &str) -> Option<String> {
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(text[start..end].to_string())
}

/// MiB advised and MiB collapsed at once, over the process so far.
pub fn backed_mib() -> (u64, u64) {
    (ADVISED.load(Ordering::Relaxed) >> 20, COLLAPSED.load(Ordering::Relaxed) >> 20)
}

/// Advise and collapse every large private anonymous mapping (see the module docs). Cheap to
/// repeat: a range already on huge pages collapses without copying.
pub(crate) fn back_large_mappings() {
    if !enabled() {
        return;
    }
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return };
    for (start, end) in large_anonymous(&maps) {
        advise(start, end);
    }
}

/// The huge-page-aligned part of each private, writable, anonymous mapping of at least
/// [`MIN_MAPPING`] bytes in a `/proc/self/maps` text.
fn large_anonymous(maps: &str) -> Vec<(u64, u64)> {
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next()?;
            let perms = fields.next()?;
            let (_offset, _device, inode) = (fields.next()?, fields.next()?, fields.next()?);
            let named = fields.next().is_some();
            if named || inode != "0" || !perms.starts_with("rw") || !perms.ends_with('p') {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            let (a, b) = (u64::from_str_radix(a, 16).ok()?, u64::from_str_radix(b, 16).ok()?);
            let (start, end) = (a.div_ceil(HUGE_PAGE) * HUGE_PAGE, b / HUGE_PAGE * HUGE_PAGE);
            (b - a >= MIN_MAPPING && end > start).then_some((start, end))
        })
        .collect()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn advise(start: u64, end: u64) {
    // SAFETY (both calls): the range lies inside a mapping this process holds (read from
    // /proc/self/maps); the advice changes only the page size under it, never its contents or
    // protection. A mapping freed meanwhile makes the calls fail (ENOMEM), which is ignored.
    if unsafe { libc::madvise(start as *mut libc::c_void, (end - start) as usize, libc::MADV_HUGEPAGE) } != 0
    {
        return;
    }
    ADVISED.fetch_add(end - start, Ordering::Relaxed);
    // One huge page at a time: a call over the whole range stops at its first page the kernel
    // cannot collapse (not yet touched, no free huge page), leaving the rest on small pages.
    for page in (start..end).step_by(HUGE_PAGE as usize) {
        if unsafe { libc::madvise(page as *mut libc::c_void, HUGE_PAGE as usize, MADV_COLLAPSE) } == 0 {
            COLLAPSED.fetch_add(HUGE_PAGE, Ordering::Relaxed);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn advise(_start: u64, _end: u64) {}

/// `MADV_COLLAPSE` (Linux 6.1): the same number on every architecture.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MADV_COLLAPSE: libc::c_int = 25;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_is_the_bracketed_word() {
        assert_eq!(parse_mode("always [madvise] never\n").as_deref(), Some("madvise"));
        assert_eq!(parse_mode("[always] madvise never").as_deref(), Some("always"));
        assert_eq!(parse_mode("nothing chosen"), None);
    }

    #[test]
    fn only_large_private_anonymous_writable_mappings_are_taken_aligned_inward() {
        let maps = "\
7f0000001000-7f0004801000 rw-p 00000000 00:00 0 \n\
7f1000000000-7f1004000000 rw-p 00000000 00:00 0                          [heap]\n\
7f2000000000-7f2004000000 r--p 00000000 08:01 1234                       /models/q.gguf\n\
7f3000000000-7f3004000000 rw-s 00000000 00:05 77                         /dev/zero (deleted)\n\
7f4000000000-7f4004000000 r--p 00000000 00:00 0 \n\
7f5000000000-7f5000100000 rw-p 00000000 00:00 0 \n\
7f6000000000-7f6002000000 rw-p 00000000 00:00 0\n";
        // The first: 72 MiB from 4 KiB past a huge page, cut to whole huge pages inside it.
        assert_eq!(
            large_anonymous(maps),
            vec![(0x7f0000200000, 0x7f0004800000), (0x7f6000000000, 0x7f6002000000)]
        );
    }

    /// Advising a real mapping leaves its bytes as they were (the numbers a model computes
    /// cannot change), whatever the kernel does with the advice.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn advising_keeps_the_contents() {
        let data: Vec<u64> = (0..(40u64 << 20) / 8).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
        let base = data.as_ptr() as u64;
        let (start, end) =
            (base.div_ceil(HUGE_PAGE) * HUGE_PAGE, (base + (40 << 20)) / HUGE_PAGE * HUGE_PAGE);
        advise(start, end);
        assert!(data.iter().enumerate().all(|(i, &v)| v == (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    }
}
