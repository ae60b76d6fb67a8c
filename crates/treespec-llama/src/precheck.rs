//! Checks on a model file before llama.cpp loads it.
//!
//! llama.cpp answers every load failure with a null pointer (and a log line), and a few malformed
//! inputs are better refused before they reach it. So we check here, in order: the file exists and
//! is a regular file; it starts with the GGUF magic; ggml's own GGUF parser accepts its header,
//! metadata and tensor table (metadata only, no tensor data is read); and the file is long enough
//! to hold every tensor the table promises, which catches the common truncated download with a
//! message that says exactly that.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::Read;
use std::path::Path;

use treespec_engine::{EngineError, Result};

use crate::backend;

/// What the pre-check learned about a GGUF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufFacts {
    /// File size in bytes.
    pub file_size: u64,
    /// GGUF format version.
    pub version: u32,
    /// Number of tensors in the tensor table.
    pub n_tensors: u64,
    /// `general.architecture`, when present and a string.
    pub architecture: Option<String>,
}

fn fail(path: &Path, what: impl std::fmt::Display) -> EngineError {
    EngineError::Backend(format!("{}: {what}", path.display()))
}

/// Describe the first bytes of a file that is not GGUF, to hint at what it is instead.
fn describe_magic(head: &[u8]) -> String {
    let hint = if head.starts_with(b"PK\x03\x04") {
        " (a zip archive: a wheel must be unpacked first, see scripts/fetch-models.sh)"
    } else if head.starts_with(b"vers") {
        " (text: perhaps a git-lfs pointer instead of the real file)"
    } else if head.starts_with(b"<") {
        " (text: perhaps an HTML error page)"
    } else {
        ""
    };
    let shown: String = head.iter().map(|&b| if b.is_ascii_graphic() { b as char } else { '.' }).collect();
    format!("starts with {head:02x?} \"{shown}\"{hint}")
}

/// Check that `path` is a complete GGUF file and return a few facts about it.
pub fn check_gguf(path: &Path) -> Result<GgufFacts> {
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            fail(path, "model file not found (run scripts/fetch-models.sh to download the models)")
        }
        _ => fail(path, format!("cannot read model file: {e}")),
    })?;
    if !meta.is_file() {
        return Err(fail(path, "not a regular file"));
    }
    let file_size = meta.len();

    let mut head = [0u8; 4];
    let mut file = File::open(path).map_err(|e| fail(path, format!("cannot open model file: {e}")))?;
    let mut got = 0;
    while got < head.len() {
        match file.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => return Err(fail(path, format!("cannot read model file: {e}"))),
        }
    }
    if got < head.len() {
        return Err(fail(path, format!("not a GGUF file: only {file_size} bytes long")));
    }
    if &head != b"GGUF" {
        return Err(fail(
            path,
            format!("not a GGUF file: {}, expected the magic \"GGUF\"", describe_magic(&head)),
        ));
    }
    drop(file);

    // Route ggml's parser complaints into our capture buffer.
    backend::backend()?;
    let cpath = path
        .to_str()
        .and_then(|s| CString::new(s).ok())
        .ok_or_else(|| fail(path, "path is not valid UTF-8 or contains a NUL byte"))?;
    backend::clear_captured();
    let params = llama_cpp_sys_2::gguf_init_params { no_alloc: true, ctx: std::ptr::null_mut() };
    // SAFETY: valid NUL-terminated path; with no_alloc and a null ctx only metadata is read.
    let ctx = unsafe { llama_cpp_sys_2::gguf_init_from_file(cpath.as_ptr(), params) };
    if ctx.is_null() {
        let why = backend::captured();
        let why = if why.is_empty() { "no details from ggml".to_string() } else { why };
        return Err(fail(
            path,
            format!("corrupt or truncated GGUF: its header/metadata cannot be parsed ({why})"),
        ));
    }
    let facts = GgufGuard(ctx).facts(file_size);
    let (facts, required) = facts;
    if file_size < required {
        return Err(fail(
            path,
            format!(
                "truncated GGUF: the file has {file_size} bytes but its {} tensors need {required} \
                 ({} bytes missing); download it again (scripts/fetch-models.sh)",
                facts.n_tensors,
                required - file_size
            ),
        ));
    }
    Ok(facts)
}

/// Frees the gguf context on every path.
struct GgufGuard(*mut llama_cpp_sys_2::gguf_context);

impl Drop for GgufGuard {
    fn drop(&mut self) {
        // SAFETY: created by gguf_init_from_file, freed once.
        unsafe { llama_cpp_sys_2::gguf_free(self.0) };
    }
}

impl GgufGuard {
    /// Facts plus the minimum file size the tensor table implies.
    fn facts(&self, file_size: u64) -> (GgufFacts, u64) {
        let ctx = self.0;
        // SAFETY (whole block): `ctx` is a live gguf context; ids come from its own counts, and the
        // value type is checked before the typed getter (which would abort on a mismatch).
        unsafe {
            let version = llama_cpp_sys_2::gguf_get_version(ctx);
            let n_tensors = llama_cpp_sys_2::gguf_get_n_tensors(ctx).max(0);
            let data_offset = llama_cpp_sys_2::gguf_get_data_offset(ctx) as u64;
            let mut end = data_offset;
            for id in 0..n_tensors {
                let off = llama_cpp_sys_2::gguf_get_tensor_offset(ctx, id) as u64;
                let size = llama_cpp_sys_2::gguf_get_tensor_size(ctx, id) as u64;
                end = end.max(data_offset.saturating_add(off).saturating_add(size));
            }
            let key = c"general.architecture";
            let kid = llama_cpp_sys_2::gguf_find_key(ctx, key.as_ptr());
            let architecture = (kid >= 0
                && llama_cpp_sys_2::gguf_get_kv_type(ctx, kid) == llama_cpp_sys_2::GGUF_TYPE_STRING)
                .then(|| {
                    let p = llama_cpp_sys_2::gguf_get_val_str(ctx, kid);
                    (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
                })
                .flatten();
            (GgufFacts { file_size, version, n_tensors: n_tensors as u64, architecture }, end)
        }
    }
}
