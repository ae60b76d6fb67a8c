//! Memory checks made before llama.cpp allocates anything.
//!
//! llama.cpp sizes a context's KV cache from the context length and allocates (and clears) all of
//! it up front: `--ctx 1000000000` on a 135M model asks for terabytes, and the process grows until
//! the kernel kills it, with no output and no message. So the size is computed here from the GGUF
//! metadata (layers, KV heads, head sizes) and the cache type, and compared with what the system
//! can still give (`MemAvailable` in `/proc/meminfo`) before the model or a context is made.

use std::path::Path;

use treespec_engine::{EngineError, Result};

use crate::hparams::Hparams;

/// llama.cpp rounds a context up to a multiple of this many cells (`GGML_PAD(n_ctx, 256)`).
const CTX_PAD: u64 = 256;

/// Bytes of KV cache for a context of `ctx_size` tokens: llama.cpp keeps one unified cache of
/// `ctx_size` cells (rounded up to 256) whatever the number of sequences, each cell holding every
/// layer's keys and values; F16 (2 bytes an element) by default, Q8_0 (34 bytes per 32) in exact
/// mode. None when the metadata does not say enough.
pub fn kv_cache_bytes(hparams: &Hparams, ctx_size: usize, exact: bool) -> Option<u64> {
    let cells = (ctx_size as u64).div_ceil(CTX_PAD).saturating_mul(CTX_PAD);
    let elements = hparams.kv_elements_per_token()?.saturating_mul(cells);
    Some(if exact { elements / 32 * 34 } else { elements.saturating_mul(2) })
}

/// `MemAvailable` from a `/proc/meminfo` text, in bytes.
pub fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb.saturating_mul(1024))
}

/// Memory the system can still give this process (None where `/proc/meminfo` cannot be read).
pub fn mem_available() -> Option<u64> {
    parse_mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// Bytes as a short human-readable size.
pub fn human_bytes(b: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    if b as f64 >= GIB {
        format!("{:.1} GiB", b as f64 / GIB)
    } else {
        format!("{:.1} MiB", b as f64 / MIB)
    }
}

/// Refuse a context of `ctx_size` tokens whose KV cache, plus `extra` bytes (the weights, when
/// the model is not loaded yet), does not fit in `available` bytes.
pub fn check_fits(
    path: &Path,
    hparams: &Hparams,
    ctx_size: usize,
    exact: bool,
    extra: u64,
    available: Option<u64>,
) -> Result<()> {
    let (Some(kv), Some(available)) = (kv_cache_bytes(hparams, ctx_size, exact), available) else {
        return Ok(());
    };
    if kv.saturating_add(extra) <= available {
        return Ok(());
    }
    let weights = if extra > 0 { format!(" plus {} of weights", human_bytes(extra)) } else { String::new() };
    Err(EngineError::InvalidRequest(format!(
        "{}: a context of {ctx_size} tokens needs a {} KV cache ({} layers, {} {} values per token){weights}, \
         but only {} of memory is available (MemAvailable); lower the context size (--ctx)",
        path.display(),
        human_bytes(kv),
        hparams.n_layer.unwrap_or(0),
        hparams.kv_elements_per_token().unwrap_or(0),
        if exact { "Q8_0" } else { "F16" },
        human_bytes(available),
    )))
}

/// A warning when `ctx_size` exceeds the context the model was trained with (llama.cpp runs it,
/// but positions past it were never seen in training and output quality drops).
pub fn training_context_warning(hparams: &Hparams, ctx_size: usize) -> Option<String> {
    let train = hparams.n_ctx_train.filter(|&t| t > 0)?;
    ((ctx_size as u64) > train).then(|| {
        format!(
            "a context of {ctx_size} tokens is more than the {train} this model was trained with; \
             output past {train} tokens may degrade"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hparams::PerLayer;

    fn smollm2() -> Hparams {
        Hparams {
            n_layer: Some(30),
            n_ctx_train: Some(8192),
            n_embd: Some(576),
            n_head: PerLayer::All(9),
            n_head_kv: PerLayer::All(3),
            ..Hparams::default()
        }
    }

    #[test]
    fn kv_cache_size_matches_llama_cpp() {
        // llama.cpp logs "llama_kv_cache: size = 90.00 MiB (4096 cells, 30 layers, …)" for SmolLM2.
        assert_eq!(kv_cache_bytes(&smollm2(), 4096, false), Some(90 << 20));
        // Rounded up to 256 cells; Q8_0 in exact mode.
        assert_eq!(kv_cache_bytes(&smollm2(), 4000, false), kv_cache_bytes(&smollm2(), 4096, false));
        assert_eq!(kv_cache_bytes(&smollm2(), 4096, true), Some((90 << 20) / 64 * 34));
        assert_eq!(kv_cache_bytes(&Hparams::default(), 4096, false), None);
    }

    #[test]
    fn contexts_beyond_available_memory_are_refused() {
        let p = Path::new("m.gguf");
        let h = smollm2();
        assert!(check_fits(p, &h, 4096, false, 0, Some(1 << 30)).is_ok());
        let e = check_fits(p, &h, 1_000_000_000, false, 0, Some(22 << 30)).unwrap_err().to_string();
        assert!(e.contains("KV cache") && e.contains("MemAvailable") && e.contains("--ctx"), "{e}");
        // The weights count when the model is not loaded yet.
        assert!(check_fits(p, &h, 4096, false, 1 << 30, Some(1 << 30)).is_err());
        // Unknown memory or unknown shape: no refusal.
        assert!(check_fits(p, &h, 1 << 30, false, 0, None).is_ok());
        assert!(check_fits(p, &Hparams::default(), 1 << 30, false, 0, Some(1)).is_ok());
    }

    #[test]
    fn meminfo_and_training_context() {
        let info = "MemTotal:       24000000 kB\nMemFree:        1000 kB\nMemAvailable:   23000000 kB\n";
        assert_eq!(parse_mem_available(info), Some(23_000_000 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        assert!(training_context_warning(&smollm2(), 8192).is_none());
        let w = training_context_warning(&smollm2(), 8193).unwrap();
        assert!(w.contains("8192"), "{w}");
    }
}
