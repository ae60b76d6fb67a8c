//! treespec-llama: the llama.cpp backend.
//!
//! [`LlamaModel::load`] reads a GGUF file (with clear errors for missing, non-GGUF, truncated or
//! unsupported files); [`LlamaModel::new_lm`] makes a [`LlamaLm`], which implements
//! [`treespec_engine::CausalLm`] by mapping token trees onto sequence ids of llama.cpp's unified
//! KV cache (see `kv.rs`). The model also carries the tokenizer and metadata helpers the CLI needs,
//! and [`check_compatible`] tells whether a draft model can draft for a target. [`ModelRuntime`]
//! (`runtime/`) is what the CLI, the benchmark and the server load: the pair, loaded once, with
//! prompts, token text, the tokenizer fingerprint and the measured cost curves derived from it.
//!
//! Environment: `TREESPEC_LLAMA_LOG=1` shows llama.cpp's own log on stderr (quiet otherwise).
//! Exact mode ([`LoadOptions::exact`]) sets `GGML_CPU_TILED_MM=0` for the process; see `load.rs`.

// Tests are exempt from the 80-line limit (clippy.toml): a test reads top to bottom as one story.
#![cfg_attr(test, allow(clippy::too_many_lines))]

mod backend;
mod batch_lm;
mod compat;
pub mod devices;
mod draft_lanes;
mod hparams;
pub mod huge_pages;
mod kernels;
mod kv;
mod kv_options;
mod kv_override;
mod lm;
mod load;
mod memory;
mod meta;
mod padding;
mod precheck;
mod prompt;
mod quantize;
mod rope;
pub mod runtime;
mod threads;
mod vocab;

pub use backend::LOG_ENV;
pub use batch_lm::{BatchCounters, LlamaBatchLm, KEEP_CACHED_ROWS, SAVED_PREFIX_BYTES};
pub use compat::{check_compatible, CHECK_START_TOKEN_ID, MAX_VOCAB_SIZE_DIFFERENCE};
pub use devices::{Device, DeviceKind, GpuLayers, Offload};
pub use draft_lanes::LlamaDraftLanes;
pub use hparams::{Hparams, PerLayer, LLAMA_MAX_LAYERS};
pub use kv_options::{CacheType, FlashAttn, KvCache};
pub use kv_override::{KvOverride, KvValue};
pub use lm::{LlamaLm, PrefillProgress};
pub use load::{models_loaded, LlamaModel, LoadOptions, MAX_PATHS};
pub use memory::{kv_cache_bytes, mem_available};
pub use meta::ModelInfo;
pub use precheck::{check_gguf, GgufFacts};
pub use quantize::{write_draft, DraftOptions, DraftType};
pub use rope::{RopeOptions, RopeScaling};
pub use runtime::{tiled_matmul_state, tokenizer_id, ModelBytes, ModelPaths, ModelRuntime};
pub use threads::{available_cores, effective_threads};
