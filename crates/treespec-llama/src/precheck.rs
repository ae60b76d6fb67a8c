//! Checks on a model file before llama.cpp loads it.
//!
//! llama.cpp answers every load failure with a null pointer (and a log line), and a few malformed
//! inputs are better refused before they reach it. So we check here, in order: the file exists and
//! is a regular file; it starts with the GGUF magic; ggml's own GGUF parser accepts its header,
//! metadata and tensor table (metadata only, no tensor data is read); the file is long enough
//! to hold every tensor the table promises, which catches the common truncated download with a
//! message that says exactly that; and the hyper-parameters, vocabulary and tensor shapes hold no
//! value that makes llama.cpp abort the process instead of failing (see `hparams.rs`).

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::Read;
use std::path::Path;

use treespec_engine::{EngineError, Result};

use crate::backend;
use crate::hparams::{duplicate_token, Hparams, MetaValue, LLAMA_MAX_LAYERS};

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
    /// The hyper-parameters read before loading (all `None` without an architecture).
    pub hparams: Hparams,
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
    let gguf = GgufGuard(ctx);
    let (facts, required) =
        gguf.facts(file_size).map_err(|why| fail(path, format!("unusable GGUF metadata: {why}")))?;
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
    /// Facts plus the minimum file size the tensor table implies; an error for metadata that
    /// would abort llama.cpp.
    fn facts(&self, file_size: u64) -> std::result::Result<(GgufFacts, u64), String> {
        let ctx = self.0;
        // SAFETY (whole block): `ctx` is a live gguf context and ids come from its own counts.
        let (version, n_tensors, end) = unsafe {
            let version = llama_cpp_sys_2::gguf_get_version(ctx);
            let n_tensors = llama_cpp_sys_2::gguf_get_n_tensors(ctx).max(0);
            let data_offset = llama_cpp_sys_2::gguf_get_data_offset(ctx) as u64;
            let mut end = data_offset;
            for id in 0..n_tensors {
                let off = llama_cpp_sys_2::gguf_get_tensor_offset(ctx, id) as u64;
                let size = llama_cpp_sys_2::gguf_get_tensor_size(ctx, id) as u64;
                end = end.max(data_offset.saturating_add(off).saturating_add(size));
            }
            (version, n_tensors as u64, end)
        };
        let architecture = match self.value("general.architecture") {
            Some(MetaValue::Str(s)) => Some(s),
            _ => None,
        };
        let hparams = match &architecture {
            Some(arch) => Hparams::read(arch, |key| self.value(key))?,
            None => Hparams::default(),
        };
        self.check_vocab()?;
        self.check_tensor_shapes()?;
        Ok((GgufFacts { file_size, version, n_tensors, architecture, hparams }, end))
    }

    fn key_id(&self, key: &str) -> Option<i64> {
        let key = CString::new(key).ok()?;
        // SAFETY: live context, NUL-terminated key.
        let id = unsafe { llama_cpp_sys_2::gguf_find_key(self.0, key.as_ptr()) };
        (id >= 0).then_some(id)
    }

    /// The value of `key`. The type is checked before every typed getter, which aborts on a
    /// mismatch; arrays longer than any per-layer array can be are not read.
    fn value(&self, key: &str) -> Option<MetaValue> {
        use llama_cpp_sys_2 as s;
        let id = self.key_id(key)?;
        let ctx = self.0;
        // SAFETY (whole block): live context, `id` found above, getters matched to the type, array
        // data read within the length gguf reports for it.
        unsafe {
            let int = |t: s::gguf_type| -> Option<i128> {
                Some(match t {
                    s::GGUF_TYPE_UINT8 => s::gguf_get_val_u8(ctx, id) as i128,
                    s::GGUF_TYPE_INT8 => s::gguf_get_val_i8(ctx, id) as i128,
                    s::GGUF_TYPE_UINT16 => s::gguf_get_val_u16(ctx, id) as i128,
                    s::GGUF_TYPE_INT16 => s::gguf_get_val_i16(ctx, id) as i128,
                    s::GGUF_TYPE_UINT32 => s::gguf_get_val_u32(ctx, id) as i128,
                    s::GGUF_TYPE_INT32 => s::gguf_get_val_i32(ctx, id) as i128,
                    s::GGUF_TYPE_UINT64 => s::gguf_get_val_u64(ctx, id) as i128,
                    s::GGUF_TYPE_INT64 => s::gguf_get_val_i64(ctx, id) as i128,
                    _ => return None,
                })
            };
            match s::gguf_get_kv_type(ctx, id) {
                s::GGUF_TYPE_STRING => {
                    let p = s::gguf_get_val_str(ctx, id);
                    (!p.is_null()).then(|| MetaValue::Str(CStr::from_ptr(p).to_string_lossy().into_owned()))
                }
                s::GGUF_TYPE_ARRAY => {
                    // gguf_get_arr_data asserts on string arrays: only per-layer integer arrays
                    // (the element types llama.cpp reads them as) are read.
                    let elem = s::gguf_get_arr_type(ctx, id);
                    let n = s::gguf_get_arr_n(ctx, id);
                    if !matches!(elem, s::GGUF_TYPE_UINT32 | s::GGUF_TYPE_INT32)
                        || n as u64 > LLAMA_MAX_LAYERS
                    {
                        return Some(MetaValue::Other);
                    }
                    let data = s::gguf_get_arr_data(ctx, id);
                    if data.is_null() {
                        return Some(MetaValue::Other);
                    }
                    let read = |i: usize| match elem {
                        s::GGUF_TYPE_UINT32 => data.cast::<u32>().add(i).read_unaligned() as i128,
                        _ => data.cast::<i32>().add(i).read_unaligned() as i128,
                    };
                    Some(MetaValue::Ints((0..n).map(read).collect()))
                }
                t => Some(int(t).map_or(MetaValue::Other, MetaValue::Int)),
            }
        }
    }

    /// ggml aborts while loading a tensor whose dimensions multiply past `i64::MAX`, even when
    /// another dimension is 0 (gguf's own parser lets that through: the product is 0).
    fn check_tensor_shapes(&self) -> std::result::Result<(), String> {
        use llama_cpp_sys_2 as s;
        let ctx = self.0;
        // SAFETY: live context, ids below its tensor count; `gguf_get_tensor_ne` points at the
        // tensor's GGML_MAX_DIMS (4) dimensions, copied before the next call.
        for id in 0..unsafe { s::gguf_get_n_tensors(ctx) } {
            let ne: [i64; 4] = unsafe { std::ptr::read_unaligned(s::gguf_get_tensor_ne(ctx, id).cast()) };
            if !elements_fit(&ne) {
                // SAFETY: as above; the name is copied at once.
                let name = unsafe {
                    CStr::from_ptr(s::gguf_get_tensor_name(ctx, id)).to_string_lossy().into_owned()
                };
                return Err(format!(
                    "tensor '{name}' has dimensions {ne:?}, more elements than ggml can count \
                     (llama.cpp would abort)"
                ));
            }
        }
        Ok(())
    }

    /// llama.cpp aborts on a vocabulary with a repeated token text (its text → id map comes out
    /// shorter than the vocabulary).
    fn check_vocab(&self) -> std::result::Result<(), String> {
        use llama_cpp_sys_2 as s;
        let Some(id) = self.key_id("tokenizer.ggml.tokens") else { return Ok(()) };
        let ctx = self.0;
        // SAFETY: live context; the array type is checked before reading strings, indices stay
        // below the length gguf reports, and each string is copied before the next call.
        let texts: Vec<Vec<u8>> = unsafe {
            if s::gguf_get_kv_type(ctx, id) != s::GGUF_TYPE_ARRAY
                || s::gguf_get_arr_type(ctx, id) != s::GGUF_TYPE_STRING
            {
                return Ok(());
            }
            (0..s::gguf_get_arr_n(ctx, id))
                .map(|i| {
                    let p = s::gguf_get_arr_str(ctx, id, i);
                    if p.is_null() {
                        Vec::new()
                    } else {
                        CStr::from_ptr(p).to_bytes().to_vec()
                    }
                })
                .collect()
        };
        match duplicate_token(texts.iter().map(Vec::as_slice)) {
            Some((a, b, text)) => Err(format!(
                "corrupt vocabulary: tokens {a} and {b} are both '{text}' (llama.cpp would abort)"
            )),
            None => Ok(()),
        }
    }
}

/// Whether ggml can make a tensor of dimensions `ne`: `ggml_new_tensor` asserts, aborting the
/// process, unless each dimension above 1 leaves the running product below `i64::MAX / dimension`.
fn elements_fit(ne: &[i64]) -> bool {
    let Some((&first, rest)) = ne.split_first() else { return true };
    let mut n = first;
    for &d in rest.iter().filter(|&&d| d > 1) {
        if i64::MAX / d <= n {
            return false;
        }
        n *= d;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::elements_fit;

    #[test]
    fn a_tensor_fits_exactly_when_ggml_would_make_it() {
        assert!(elements_fit(&[4096, 151_936, 1, 1]));
        assert!(elements_fit(&[0, 1, 1, 1]));
        // The fuzzer's file: a zero dimension does not save it, ggml skips dimensions of 0 and 1.
        assert!(!elements_fit(&[1024, 0, u32::MAX as i64, u32::MAX as i64]));
        assert!(!elements_fit(&[i64::MAX, 2, 1, 1]));
        // ggml's bound is strict: a product that would just fit is refused all the same.
        let d = 3;
        assert!(!elements_fit(&[i64::MAX / d, d, 1, 1]));
        assert!(elements_fit(&[i64::MAX / d - 1, d, 1, 1]));
    }
}
