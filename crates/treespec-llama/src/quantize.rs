//! Cheaper drafts from existing GGUF files, through llama.cpp's own quantizer: a requantized
//! draft (`treespec draft quantize`, e.g. Q4_0, which llama.cpp runs with its repacked kernels)
//! and a layer-dropped self-draft cut from the target's own file (`treespec draft from-target`:
//! same tokenizer, no second download).

use std::ffi::CString;
use std::path::Path;

use llama_cpp_sys_2 as sys;
use treespec_engine::{EngineError, Result};

use crate::backend;
use crate::precheck::check_gguf;

/// Weight formats a draft can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftType {
    /// 4-bit, llama.cpp's fastest repacked CPU kernels.
    Q4_0,
    /// 8-bit.
    Q8_0,
    /// llama.cpp's usual 4-bit K-quant mix.
    Q4KM,
    /// Keep the tensors as they are (only pruning layers).
    Copy,
}

impl DraftType {
    /// Parse `q4_0`, `q8_0`, `q4_k_m` or `copy`.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "q4_0" => Self::Q4_0,
            "q8_0" => Self::Q8_0,
            "q4_k_m" => Self::Q4KM,
            "copy" => Self::Copy,
            other => {
                return Err(EngineError::InvalidRequest(format!(
                    "unknown draft type '{other}' (one of q4_0, q8_0, q4_k_m, copy)"
                )))
            }
        })
    }

    fn ftype(self) -> sys::llama_ftype {
        match self {
            Self::Q4_0 => sys::LLAMA_FTYPE_MOSTLY_Q4_0,
            Self::Q8_0 => sys::LLAMA_FTYPE_MOSTLY_Q8_0,
            Self::Q4KM | Self::Copy => sys::LLAMA_FTYPE_MOSTLY_Q4_K_M,
        }
    }
}

/// Write `output` from `input` in `kind`, leaving out the transformer blocks in `drop_layers`.
/// Requantizing an already quantized file is allowed on purpose: a draft trades accuracy for
/// speed, and the target verifies every token anyway.
pub fn write_draft(
    input: &Path,
    output: &Path,
    kind: DraftType,
    drop_layers: &[u32],
    threads: usize,
) -> Result<()> {
    check_gguf(input)?;
    if output.exists() && output.canonicalize().ok() == input.canonicalize().ok() {
        return Err(EngineError::InvalidRequest("the draft must be written to a new file".into()));
    }
    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            return Err(EngineError::InvalidRequest(format!("no such directory: {}", dir.display())));
        }
    }
    let path = |p: &Path| {
        CString::new(p.to_string_lossy().as_bytes())
            .map_err(|_| EngineError::InvalidRequest(format!("path contains a NUL byte: {}", p.display())))
    };
    let (cin, cout) = (path(input)?, path(output)?);
    let mut prune: Vec<i32> = drop_layers.iter().map(|&l| l as i32).collect();
    prune.sort_unstable();
    prune.dedup();
    prune.push(-1);
    backend::backend()?;
    backend::clear_captured();
    // SAFETY: the default params are plain data; every pointer we set (the prune list, the two
    // paths) outlives the call, and llama.cpp only reads them.
    let rc = unsafe {
        let mut params = sys::llama_model_quantize_default_params();
        params.nthread = threads.max(1) as i32;
        params.ftype = kind.ftype();
        params.allow_requantize = true;
        params.only_copy = kind == DraftType::Copy;
        if prune.len() > 1 {
            params.prune_layers = prune.as_ptr();
        }
        sys::llama_model_quantize(cin.as_ptr(), cout.as_ptr(), &params)
    };
    if rc != 0 {
        let _ = std::fs::remove_file(output);
        return Err(EngineError::Backend(format!(
            "llama.cpp could not write the draft {} from {}: {}",
            output.display(),
            input.display(),
            backend::captured()
        )));
    }
    Ok(())
}
