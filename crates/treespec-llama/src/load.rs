//! Loading a GGUF model: options, file checks, exact mode.
//!
//! Exact mode exists because llama.cpp's CPU backend may *repack* quantized weights at load time
//! into layouts whose matmul kernels are picked by batch size. A token scored inside a 30-node tree
//! then goes through different arithmetic than the same token decoded alone, and the logits differ
//! (0.5 on Qwen2.5 Q4_K_M, enough to flip an argmax): speculative and plain decoding disagree at
//! temperature 0 with no bug anywhere. llama.cpp's model parameter `use_extra_bufts = false` turns
//! repacking off. llama-cpp-2 (0.1.160) has no setter for it and keeps its raw params private, so
//! we build the raw `llama_model_params` through llama-cpp-sys-2, load with
//! `llama_model_load_from_file`, and wrap the pointer in llama-cpp-2's `LlamaModel` (a
//! `#[repr(transparent)]` wrapper of that pointer; see [`wrap_raw_model`]). Everything else goes
//! through llama-cpp-2 as usual.
//!
//! Repacking is not the only batch-size dependent path: ggml's "tiled" matmul for K-quants takes
//! over from 8 rows up. Exact mode also turns that off, through the `GGML_CPU_TILED_MM` environment
//! variable, which ggml reads once per process (see [`disable_tiled_matmul`]). Measured on
//! Qwen2.5-Coder-1.5B Q4_K_M, trees of up to 16 nodes vs the same paths as chains: default mode
//! max |diff| 0.84 (4 argmax flips in 48 nodes); repacking off but tiled on 0.82 (3 flips); exact
//! mode 0. Exact mode costs about 20% decode speed and 35% on a 32-node tree step there.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;
use treespec_core::cost::shapes::PadShapes;

use treespec_engine::{EngineError, Result};

use crate::backend;
use crate::devices::{devices, DeviceList, GpuLayers, Offload};
use crate::kv_options::{CacheType, FlashAttn, KvCache};
use crate::kv_override::{raw_overrides, KvOverride};
use crate::memory::{check_fits, mem_available, training_context_warning};
use crate::precheck::{check_gguf, GgufFacts};
use crate::rope::RopeOptions;
use crate::threads::{available_cores, effective_threads};

/// llama.cpp's hard limit on sequence ids (`LLAMA_MAX_SEQ` = 256) minus the two we reserve: the
/// committed prefix and a scratch id used while committing.
pub const MAX_PATHS: usize = 254;

/// The KV cache of exact mode: Q8_0 keys and values go through one attention kernel whatever the
/// batch's shape (see `lm.rs`).
pub const EXACT_KV_CACHE: KvCache = KvCache { k: CacheType::Q8_0, v: CacheType::Q8_0 };

/// How to load a model and size the contexts made from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOptions {
    /// CPU threads for decoding. Default: the machine's available parallelism. More than that is
    /// capped to it at load (see `threads.rs`).
    pub threads: usize,
    /// Context size in positions (committed tokens plus pending tree nodes). llama.cpp rounds it
    /// up to a multiple of 256. Default 4096.
    pub ctx_size: usize,
    /// Maximum number of root-to-leaf paths in a pending tree: each path is one llama.cpp
    /// sequence. At most [`MAX_PATHS`]. Default [`MAX_PATHS`] (a dynamic tree can have as many leaves as nodes).
    pub n_seq_max: usize,
    /// Physical batch size: how many tokens llama.cpp computes per graph. A `forward` of more nodes
    /// is still one `llama_decode` call, split internally. Bigger costs compute-buffer memory.
    /// Default 512.
    pub n_ubatch: usize,
    /// Turn off batch-size dependent kernels (weight repacking, tiled K-quant matmul) so a token's
    /// logits do not depend on how many other tokens share its batch. Slower on repackable
    /// quantizations (Q4_0, Q4_K, IQ4_NL...). Default false. CPU only: refused with GPU layers.
    pub exact: bool,
    /// Layers on a GPU and which one (default: none, the CPU runs everything).
    pub offload: Offload,
    /// The draft model's, when it differs from the target's (llama.cpp's `-ngld`).
    pub draft_offload: Option<Offload>,
    /// Flash attention (`-fa`; default: llama.cpp's `auto`).
    pub flash_attn: FlashAttn,
    /// The KV cache's element types (`-ctk`, `-ctv`; default F16). Exact mode needs Q8_0.
    pub kv_cache: KvCache,
    /// The draft model's (`-ctkd`, `-ctvd`), when it differs from the target's.
    pub draft_kv_cache: Option<KvCache>,
    /// Threads for prompt processing (`-tb`; default: `threads`).
    pub threads_batch: Option<usize>,
    /// Map the model file instead of reading it (llama.cpp's default; `--no-mmap` reads it).
    pub mmap: bool,
    /// Lock the weights in memory so the OS never swaps them out (`--mlock`).
    pub mlock: bool,
    /// Whether the target's verify forwards are padded to fixed shapes (`--pad-shapes`; default
    /// auto: where the target's measured shape times say it pays, see
    /// [`ModelRuntime::shape_padding`](crate::ModelRuntime::shape_padding)).
    pub pad_shapes: PadShapes,
    /// RoPE/YaRN overrides (`--rope-*`, `--yarn-*`; default: the model file's).
    pub rope: RopeOptions,
    /// Metadata read as given instead of the file's (`--override-kv`).
    pub kv_overrides: Vec<KvOverride>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            threads: available_cores(),
            ctx_size: 4096,
            n_seq_max: MAX_PATHS,
            n_ubatch: 512,
            exact: false,
            offload: Offload::default(),
            draft_offload: None,
            flash_attn: FlashAttn::Auto,
            kv_cache: KvCache::default(),
            draft_kv_cache: None,
            threads_batch: None,
            mmap: true,
            mlock: false,
            pad_shapes: PadShapes::Auto,
            rope: RopeOptions::default(),
            kv_overrides: Vec::new(),
        }
    }
}

impl LoadOptions {
    /// The KV cache a context is made with: exact mode's q8_0, else the one asked for.
    pub fn kv_cache_in_use(&self) -> KvCache {
        if self.exact {
            EXACT_KV_CACHE
        } else {
            self.kv_cache
        }
    }

    /// The options a draft model loads with: the target's, with the draft's offload.
    pub fn for_draft(&self) -> Self {
        let offload = self.draft_offload.clone().unwrap_or_else(|| self.offload.clone());
        let kv_cache = self.draft_kv_cache.unwrap_or(self.kv_cache);
        // Metadata overrides name the target file's keys.
        let kv_overrides = Vec::new();
        Self { offload, draft_offload: None, kv_cache, draft_kv_cache: None, kv_overrides, ..self.clone() }
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::InvalidRequest(m));
        if self.threads == 0 {
            return bad(format!("threads must be at least 1 (got {})", self.threads));
        }
        if self.ctx_size == 0 || self.ctx_size > i32::MAX as usize / 2 {
            return bad(format!("ctx_size must be between 1 and {} (got {})", i32::MAX / 2, self.ctx_size));
        }
        if self.n_seq_max == 0 || self.n_seq_max > MAX_PATHS {
            return bad(format!("n_seq_max must be between 1 and {MAX_PATHS} (got {})", self.n_seq_max));
        }
        if self.n_ubatch == 0 || self.n_ubatch > i32::MAX as usize {
            return bad(format!("n_ubatch must be at least 1 (got {})", self.n_ubatch));
        }
        if self.threads_batch == Some(0) {
            return bad("threads-batch must be at least 1 (got 0)".to_string());
        }
        for (cache, which) in [(Some(self.kv_cache), "-ctk/-ctv"), (self.draft_kv_cache, "-ctkd/-ctvd")] {
            let Some(cache) = cache else { continue };
            if self.exact && cache != KvCache::default() && cache != EXACT_KV_CACHE {
                return bad(format!(
                    "--exact keeps the KV cache as q8_0 (the one attention kernel for every batch shape); {which} {}/{} would change that",
                    cache.k, cache.v
                ));
            }
            let (in_use, whose) = if self.exact { (EXACT_KV_CACHE, "--exact's") } else { (cache, which) };
            if in_use.v.quantized() && self.flash_attn == FlashAttn::Off {
                return bad(format!(
                    "a quantized V cache ({whose} {}) needs flash attention, and -fa is off",
                    in_use.v
                ));
            }
        }
        if self.exact && self.offload.layers.any() {
            // Exactness needs one matmul path for every batch size; llama.cpp's GPU backends pick
            // kernels by batch size (MMVQ for one row, MMQ or cuBLAS beyond), so a token's logits
            // depend on the tree it is scored in there.
            return bad(
                "--exact is CPU-only: a GPU backend's kernels change with the batch size, so a tree row's \
                 logits would not equal plain decoding's; drop --exact or --n-gpu-layers"
                    .to_string(),
            );
        }
        Ok(())
    }
}

/// The texts of a vocabulary's control (and unknown) tokens: what llama.cpp turns into special
/// tokens only when asked to parse them. Filled on first use by `prompt.rs`.
pub(crate) type ControlTexts = OnceLock<Vec<String>>;

/// A loaded GGUF model. Make contexts with [`LlamaModel::new_lm`]; tokenizer and metadata helpers
/// live in `vocab.rs` and `meta.rs`.
#[derive(Debug)]
pub struct LlamaModel {
    pub(crate) inner: llama_cpp_2::model::LlamaModel,
    /// The same pointer `inner` owns, for the few llama.h getters llama-cpp-2 does not wrap (or
    /// wraps with a panic). Never freed through this copy.
    raw: RawModel,
    path: PathBuf,
    options: LoadOptions,
    facts: GgufFacts,
    /// Texts of the control tokens, read on first use (`prompt.rs`).
    pub(crate) control_texts: ControlTexts,
    /// Where it runs (see [`LlamaModel::runs_on`]), told once at load: the devices are asked
    /// nothing after.
    runs_on: String,
}

// `wrap_raw_model` relies on this: llama-cpp-2's model is nothing but the pointer.
const _: () = assert!(
    std::mem::size_of::<llama_cpp_2::model::LlamaModel>()
        == std::mem::size_of::<NonNull<llama_cpp_sys_2::llama_model>>()
);

/// Wrap a model pointer loaded through llama-cpp-sys-2 in llama-cpp-2's safe type.
///
/// # Safety
/// `raw` must come from `llama_model_load_from_file` and not be owned elsewhere: the wrapper frees
/// it on drop (`llama_free_model`).
///
/// Soundness rests on llama-cpp-2 =0.1.160 (pinned in the workspace) declaring
/// `#[repr(transparent)] struct LlamaModel { model: Ptr<llama_model> }` with
/// `#[repr(transparent)] struct Ptr<T>(NonNull<T>)`, i.e. the same layout as `NonNull<llama_model>`
/// and no other state; the size assertion above catches a layout change at compile time. Re-check
/// both definitions before bumping the version.
unsafe fn wrap_raw_model(raw: NonNull<llama_cpp_sys_2::llama_model>) -> llama_cpp_2::model::LlamaModel {
    // SAFETY: identical layout (see above); ownership moves into the wrapper.
    unsafe {
        std::mem::transmute::<NonNull<llama_cpp_sys_2::llama_model>, llama_cpp_2::model::LlamaModel>(raw)
    }
}

/// A borrowed copy of the model pointer.
#[derive(Debug, Clone, Copy)]
struct RawModel(NonNull<llama_cpp_sys_2::llama_model>);

// SAFETY: a loaded llama_model is immutable and shareable across threads; llama-cpp-2 makes the
// same claim for its owning wrapper, which lives exactly as long as this copy (same struct).
unsafe impl Send for RawModel {}
// SAFETY: as above.
unsafe impl Sync for RawModel {}

/// Set once any context has decoded: from then on ggml has read `GGML_CPU_TILED_MM`.
pub(crate) static DECODED: AtomicBool = AtomicBool::new(false);

/// Models loaded by [`LlamaModel::load`] in this process (see [`models_loaded`]).
static MODELS_LOADED: AtomicUsize = AtomicUsize::new(0);

/// How many models [`LlamaModel::load`] has loaded in this process so far (failed loads do not
/// count). A diagnostic: loading a GGUF file maps and reads gigabytes, so the runtime promises to
/// load each file once, and `treespec serve` and the tests check that promise with this counter.
pub fn models_loaded() -> usize {
    MODELS_LOADED.load(Ordering::Relaxed)
}

use crate::kernels::TILED_ENV;

/// Exact mode needs ggml's tiled K-quant matmul off. ggml reads `GGML_CPU_TILED_MM` once, at the
/// first matmul of the process, so this must happen before any decode; we refuse otherwise rather
/// than silently run inexact. If the user already set it, `0` is accepted and anything else refused.
fn disable_tiled_matmul() -> Result<()> {
    match std::env::var(TILED_ENV) {
        Ok(v) if v.trim() == "0" => Ok(()),
        Ok(v) => Err(EngineError::InvalidRequest(format!(
            "exact mode needs ggml's tiled matmul off, but {TILED_ENV}={v} is set in the environment"
        ))),
        Err(_) if DECODED.load(Ordering::SeqCst) => Err(EngineError::InvalidRequest(format!(
            "exact mode must be requested before the first decode of the process (ggml reads {TILED_ENV} \
             once); load exact models first, or start the process with {TILED_ENV}=0"
        ))),
        Err(_) => {
            crate::kernels::turn_tiled_off();
            Ok(())
        }
    }
}

/// Where a model loaded with `offload` runs, in words: `CPU`, or the GPU (its name and the
/// driver's description) and how many of the model's `layers` went there.
fn describe_offload(offload: &Offload, layers: Option<u64>) -> String {
    if !offload.layers.any() {
        return "CPU".to_string();
    }
    let gpu = devices().ok().and_then(|all| {
        all.into_iter()
            .filter(|d| d.takes_layers())
            .find(|d| offload.device.as_ref().is_none_or(|n| d.name.eq_ignore_ascii_case(n)))
    });
    let name = gpu.map_or_else(|| "GPU".to_string(), |d| format!("{} ({})", d.name, d.description));
    match (offload.layers, layers) {
        (GpuLayers::Count(n), Some(layers)) if u64::from(n) <= layers => {
            format!("{name}, {n} of {layers} layers")
        }
        _ => format!("{name}, every layer"),
    }
}

impl LlamaModel {
    /// Load a GGUF model. Errors (never panics) on a missing file, a file that is not GGUF, a
    /// truncated or corrupt file, an architecture this llama.cpp does not know, bad options, or a
    /// context whose KV cache cannot fit in the memory left. Warns on stderr when the context is
    /// longer than the model's training context.
    pub fn load(path: impl AsRef<Path>, mut options: LoadOptions) -> Result<Self> {
        let path = path.as_ref();
        options.validate()?;
        options.threads = effective_threads(options.threads)?;
        let facts = check_gguf(path)?;
        // Offloaded weights and cache live in the device's memory, which llama.cpp checks itself.
        if !options.offload.layers.any() {
            check_fits(
                path,
                &facts.hparams,
                options.ctx_size,
                options.kv_cache_in_use().quantized(),
                facts.file_size,
                mem_available(),
            )?;
        }
        if let Some(w) = training_context_warning(&facts.hparams, options.ctx_size) {
            eprintln!("warning: {}: {w}", path.display());
        }
        backend::backend()?;
        if options.exact {
            disable_tiled_matmul()?;
        }

        let cpath = path
            .to_str()
            .and_then(|s| CString::new(s).ok())
            .ok_or_else(|| EngineError::Backend(format!("{}: path is not valid UTF-8", path.display())))?;
        // SAFETY: plain C struct of defaults.
        let mut params = unsafe { llama_cpp_sys_2::llama_model_default_params() };
        params.use_extra_bufts = !options.exact;
        // llama.cpp's own choice unless asked otherwise (`--no-mmap`, `--mlock`).
        params.load_mode = match (options.mmap, options.mlock) {
            (true, false) => params.load_mode,
            (true, true) => llama_cpp_sys_2::LLAMA_LOAD_MODE_MMAP_MLOCK,
            (false, true) => llama_cpp_sys_2::LLAMA_LOAD_MODE_MLOCK,
            (false, false) => llama_cpp_sys_2::LLAMA_LOAD_MODE_NONE,
        };
        // The CPU unless layers are asked for, whatever the build (llama.cpp's own default would
        // offload everything in a GPU build).
        params.n_gpu_layers = options.offload.layers.param();
        let mut devices = DeviceList::for_offload(&options.offload)?;
        // The draft's layers are checked with the target's, so a `-ngld` no GPU can take fails
        // the same way `-ngl` does, whether or not a draft is loaded.
        if let Some(draft) = &options.draft_offload {
            DeviceList::for_offload_of(draft, "--n-gpu-layers-draft (-ngld)")?;
        }
        if let Some(d) = devices.as_mut() {
            params.devices = d.as_param();
        }
        // Kept alive until the load below has read it.
        let overrides = raw_overrides(&options.kv_overrides);
        if !overrides.is_empty() {
            params.kv_overrides = overrides.as_ptr();
        }

        backend::clear_captured();
        // SAFETY: valid path and params; llama.cpp catches its C++ exceptions and returns null.
        let raw = unsafe { llama_cpp_sys_2::llama_model_load_from_file(cpath.as_ptr(), params) };
        drop(devices);
        drop(overrides);
        let Some(raw) = NonNull::new(raw) else {
            return Err(load_error(path, &facts, &backend::captured()));
        };
        // SAFETY: fresh pointer from llama_model_load_from_file, owned by nobody else.
        let inner = unsafe { wrap_raw_model(raw) };
        MODELS_LOADED.fetch_add(1, Ordering::Relaxed);
        let runs_on = describe_offload(&options.offload, facts.hparams.n_layer);
        Ok(Self {
            inner,
            raw: RawModel(raw),
            path: path.to_path_buf(),
            options,
            facts,
            control_texts: ControlTexts::new(),
            runs_on,
        })
    }

    /// The raw model pointer, valid as long as `self`.
    pub(crate) fn raw_ptr(&self) -> *const llama_cpp_sys_2::llama_model {
        self.raw.0.as_ptr()
    }

    /// The raw vocabulary pointer, valid as long as `self`.
    pub(crate) fn raw_vocab(&self) -> *const llama_cpp_sys_2::llama_vocab {
        // SAFETY: live model pointer.
        unsafe { llama_cpp_sys_2::llama_model_get_vocab(self.raw_ptr()) }
    }

    /// The file this model was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where it runs, in words: `CPU`, or the GPU device and how many layers went there.
    pub fn runs_on(&self) -> &str {
        &self.runs_on
    }

    /// The options it was loaded with (contexts use them too).
    pub fn options(&self) -> &LoadOptions {
        &self.options
    }

    /// Facts from the GGUF pre-check (file size, format version, tensor count, architecture).
    pub fn gguf_facts(&self) -> &GgufFacts {
        &self.facts
    }
}

/// Turn llama.cpp's null return plus its captured complaints into an error naming the problem.
fn load_error(path: &Path, facts: &GgufFacts, log: &str) -> EngineError {
    let arch = facts.architecture.as_deref().unwrap_or("<none>");
    let details = if log.is_empty() { "no details from llama.cpp" } else { log };
    let msg = if log.contains("unknown model architecture") || facts.architecture.is_none() {
        format!("unsupported model architecture '{arch}' for this llama.cpp build ({details})")
    } else {
        format!("llama.cpp could not load this '{arch}' model; the file may be corrupt ({details})")
    };
    EngineError::Backend(format!("{}: {msg}", path.display()))
}
