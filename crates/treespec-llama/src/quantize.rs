//! Cheaper drafts from existing GGUF files, through llama.cpp's own quantizer: a requantized
//! draft (`treespec draft quantize`, e.g. Q4_0, which llama.cpp runs with its repacked kernels)
//! and a layer-dropped self-draft cut from the target's own file (`treespec draft from-target`:
//! same tokenizer, no second download).

use std::ffi::CString;
use std::path::{Path, PathBuf};

use llama_cpp_sys_2 as sys;
use treespec_engine::{EngineError, Result};

use crate::backend;
use crate::precheck::check_gguf;
use crate::threads::effective_threads;

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

/// How to write a draft.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftOptions {
    /// Weight type.
    pub kind: DraftType,
    /// Transformer blocks to leave out (each must exist; at least one must stay).
    pub drop_layers: Vec<u32>,
    /// Quantizer threads (0 refused, capped at the cores, as everywhere).
    pub threads: usize,
    /// Replace an existing output file.
    pub force: bool,
}

/// Write `output` from `input` as `options` say. Requantizing an already quantized file is allowed
/// on purpose: a draft trades accuracy for speed, and the target verifies every token anyway.
///
/// Refused before llama.cpp runs: an existing output without `force` (a typo must not destroy a
/// file), layers the model does not have, and dropping every layer (llama.cpp would write a
/// 0-layer file that aborts whatever loads it). The file is written under a temporary name next
/// to `output` and renamed into place only when complete, so a failure leaves no partial file and
/// never touches an existing one.
pub fn write_draft(input: &Path, output: &Path, options: &DraftOptions) -> Result<()> {
    let facts = check_gguf(input)?;
    let threads = effective_threads(options.threads)?;
    let bad = |m: String| Err(EngineError::InvalidRequest(m));
    if output.exists() && output.canonicalize().ok() == input.canonicalize().ok() {
        return bad("the draft must be written to a new file".into());
    }
    if output.exists() && !options.force {
        return bad(format!("{} already exists; pass --force to overwrite it", output.display()));
    }
    if output.is_dir() {
        return bad(format!("{} is a directory", output.display()));
    }
    let dir = match output.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) if !dir.is_dir() => return bad(format!("no such directory: {}", dir.display())),
        Some(dir) => dir.to_path_buf(),
        None => PathBuf::from("."),
    };
    let mut prune: Vec<i32> = options.drop_layers.iter().map(|&l| l as i32).collect();
    prune.sort_unstable();
    prune.dedup();
    check_layers(&prune, facts.hparams.n_layer)?;
    prune.push(-1);

    let name = output.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.partial", std::process::id()));
    let path = |p: &Path| {
        CString::new(p.to_string_lossy().as_bytes())
            .map_err(|_| EngineError::InvalidRequest(format!("path contains a NUL byte: {}", p.display())))
    };
    let (cin, ctmp) = (path(input)?, path(&tmp)?);
    backend::backend()?;
    backend::clear_captured();
    // SAFETY: the default params are plain data; every pointer we set (the prune list, the two
    // paths) outlives the call, and llama.cpp only reads them.
    let rc = unsafe {
        let mut params = sys::llama_model_quantize_default_params();
        params.nthread = threads as i32;
        params.ftype = options.kind.ftype();
        params.allow_requantize = true;
        params.only_copy = options.kind == DraftType::Copy;
        if prune.len() > 1 {
            params.prune_layers = prune.as_ptr();
        }
        sys::llama_model_quantize(cin.as_ptr(), ctmp.as_ptr(), &params)
    };
    if rc != 0 {
        let _ = std::fs::remove_file(&tmp);
        return Err(EngineError::Backend(format!(
            "llama.cpp could not write the draft {} from {}: {}",
            output.display(),
            input.display(),
            backend::captured()
        )));
    }
    std::fs::rename(&tmp, output).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        EngineError::Backend(format!("cannot move the draft into place at {}: {e}", output.display()))
    })
}

/// Every dropped layer must exist, and at least one layer must stay.
fn check_layers(sorted: &[i32], n_layer: Option<u64>) -> Result<()> {
    let Some(n) = n_layer else {
        return match sorted.is_empty() {
            true => Ok(()),
            false => Err(EngineError::InvalidRequest(
                "the model file does not say how many layers it has, so none can be dropped".into(),
            )),
        };
    };
    if let Some(&bad) = sorted.iter().find(|&&l| l < 0 || l as u64 >= n) {
        return Err(EngineError::InvalidRequest(format!(
            "layer {bad} does not exist: this model has {n} layers, numbered 0-{}",
            n - 1
        )));
    }
    if sorted.len() as u64 >= n {
        return Err(EngineError::InvalidRequest(format!(
            "dropping all {n} layers leaves no model: keep at least one of 0-{}",
            n - 1
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_layers;

    #[test]
    fn dropped_layers_must_exist_and_leave_one() {
        assert!(check_layers(&[0, 5, 29], Some(30)).is_ok());
        let e = check_layers(&(0..30).collect::<Vec<_>>(), Some(30)).unwrap_err().to_string();
        assert!(e.contains("all 30 layers"), "{e}");
        let e = check_layers(&[100, 200], Some(30)).unwrap_err().to_string();
        assert!(e.contains("layer 100") && e.contains("0-29"), "{e}");
        assert!(check_layers(&[], None).is_ok());
        assert!(check_layers(&[1], None).is_err());
    }
}
