//! The process-wide llama.cpp backend and its log routing.
//!
//! llama.cpp's backend may be initialised only once per process (`LlamaBackend::init` errors the
//! second time), so it lives in a `OnceLock` shared by every model. Its logging is chatty (every
//! tensor, every context parameter) and goes to stderr by default, which would drown the CLI's
//! output; we install our own callback instead. It stays silent unless `TREESPEC_LLAMA_LOG` is set,
//! but it remembers the last warnings and errors of the current thread, so that a failed load can
//! say *why* llama.cpp refused the file (llama.cpp only returns a null pointer).

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::{Mutex, OnceLock};

use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_sys_2::ggml_log_level;

use treespec_engine::{EngineError, Result};

/// Environment variable: when set (to anything but `0`), llama.cpp's log lines go to stderr.
pub const LOG_ENV: &str = "TREESPEC_LLAMA_LOG";

/// How many recent warning/error lines each thread remembers.
const CAPTURE_LINES: usize = 16;

static BACKEND: OnceLock<std::result::Result<LlamaBackend, String>> = OnceLock::new();

/// Serialises context creation: llama.cpp may mutate the model while creating a context, which
/// llama-cpp-2 documents as unsound when done in parallel.
pub(crate) static CONTEXT_LOCK: Mutex<()> = Mutex::new(());

thread_local! {
    /// Recent WARN/ERROR lines from llama.cpp on this thread (loading happens on the caller's
    /// thread, so a load's complaints land here).
    static CAPTURED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    /// Level of the last line, so continuation fragments (`GGML_LOG_LEVEL_CONT`) join it.
    static LAST_LEVEL: RefCell<ggml_log_level> = const { RefCell::new(0) };
}

fn echo_enabled() -> bool {
    static ECHO: OnceLock<bool> = OnceLock::new();
    *ECHO.get_or_init(|| std::env::var(LOG_ENV).is_ok_and(|v| !v.is_empty() && v != "0"))
}

unsafe extern "C" fn log_callback(level: ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for the duration of the call.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    if echo_enabled() {
        eprint!("{text}");
    }
    let is_cont = level == llama_cpp_sys_2::GGML_LOG_LEVEL_CONT;
    let level = if is_cont {
        LAST_LEVEL.with(|l| *l.borrow())
    } else {
        LAST_LEVEL.with(|l| *l.borrow_mut() = level);
        level
    };
    if level != llama_cpp_sys_2::GGML_LOG_LEVEL_WARN && level != llama_cpp_sys_2::GGML_LOG_LEVEL_ERROR {
        return;
    }
    // `try_with`: the callback can run during thread teardown.
    let _ = CAPTURED.try_with(|c| {
        let mut c = c.borrow_mut();
        match c.last_mut() {
            Some(last) if is_cont => last.push_str(&text),
            _ => c.push(text.into_owned()),
        }
        let excess = c.len().saturating_sub(CAPTURE_LINES);
        c.drain(..excess);
    });
}

/// The shared backend, initialised (with our log callback) on first use.
pub(crate) fn backend() -> Result<&'static LlamaBackend> {
    BACKEND
        .get_or_init(|| {
            // Install the callback first so initialisation itself is quiet too.
            // SAFETY: `log_callback` has the C ABI llama.cpp expects and needs no user data.
            unsafe { llama_cpp_sys_2::llama_log_set(Some(log_callback), std::ptr::null_mut()) };
            // A build whose backends are libraries (`--features dynamic-backends`) loads the ones
            // this machine can run: beside the binary, in the working directory, or in
            // `GGML_BACKEND_PATH` (docs/GPU.md).
            // SAFETY: no arguments; ggml registers each library it can open and skips the rest.
            #[cfg(feature = "dynamic-backends")]
            unsafe {
                llama_cpp_sys_2::ggml_backend_load_all()
            };
            LlamaBackend::init().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| EngineError::Backend(format!("cannot initialise llama.cpp: {e}")))
}

/// Forget this thread's captured llama.cpp messages (call before an operation whose failure you
/// want to explain).
pub(crate) fn clear_captured() {
    let _ = CAPTURED.try_with(|c| c.borrow_mut().clear());
}

/// This thread's llama.cpp warnings/errors since the last [`clear_captured`], oldest first,
/// trimmed and joined with "; ".
pub(crate) fn captured() -> String {
    CAPTURED
        .try_with(|c| {
            c.borrow().iter().map(|l| l.trim()).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
        })
        .unwrap_or_default()
}
