//! Argument groups shared by `generate`, `bench` and `serve`: models, sampling, method knobs.

use std::path::PathBuf;
use treespec_core::cost::shapes::PadShapes;

use anyhow::{Context, Result};
use clap::Args;
use treespec_core::sampling::SamplingParams;
use treespec_engine::registry::MethodKnobs;
use treespec_engine::{MethodKind, MethodSpec};
use treespec_llama::{CacheType, FlashAttn, GpuLayers, KvCache, LoadOptions, Offload};
use treespec_llama::{KvOverride, RopeOptions, RopeScaling};

/// Which model files to run and how.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// Target model (GGUF).
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

/// How the models run, and the draft beside the target (every command that loads models; `bench`
/// has its own, optional, target flag).
#[derive(Debug, Clone, Args)]
pub struct RuntimeArgs {
    /// Draft model (GGUF) for methods that need one; may be the target file itself. llama.cpp's
    /// `-md FILE` / `--model-draft FILE` also work.
    #[arg(long = "draft", visible_alias = "md", aliases = ["model-draft", "spec-draft-model"])]
    pub draft: Option<PathBuf>,
    /// CPU threads (default: all cores; more are capped to them).
    #[arg(short = 't', long, value_parser = super::threads::threads_arg)]
    pub threads: Option<usize>,
    /// Context size in tokens (llama.cpp: `-c`, `--ctx-size`).
    #[arg(short = 'c', long = "ctx", alias = "ctx-size", default_value_t = 4096)]
    pub ctx: usize,
    /// Batch-invariant kernels: a token's logits do not depend on the tree it is scored in, so
    /// greedy output, and sampled output with `--seed`, equals plain decoding's token for token
    /// (slower on repacked quantizations).
    #[arg(long)]
    pub exact: bool,
    /// Layers of the target on a GPU: a number, or `all` (llama.cpp's `-ngl`; default 0: the CPU).
    /// Needs a build with a GPU backend (docs/GPU.md); `treespec devices` lists what is there.
    #[arg(long = "n-gpu-layers", visible_alias = "ngl", alias = "gpu-layers", value_parser = GpuLayers::parse)]
    pub gpu_layers: Option<GpuLayers>,
    /// Layers of the draft model on a GPU (llama.cpp's `-ngld`; default: as the target's).
    #[arg(long = "n-gpu-layers-draft", visible_alias = "ngld", aliases = ["gpu-layers-draft", "spec-draft-ngl"], value_parser = GpuLayers::parse)]
    pub gpu_layers_draft: Option<GpuLayers>,
    /// The GPU to offload to, by the name `treespec devices` shows (llama.cpp's `-dev`; default:
    /// the first GPU).
    #[arg(long = "device", visible_alias = "dev")]
    pub device: Option<String>,
    /// Render chats with this template instead of the model file's: a built-in name (chatml,
    /// gemma, llama2, llama3, mistral-v7, phi3, vicuna, zephyr) or a Jinja text, as llama-server
    /// reads `--chat-template`. For a model that carries none (a base model), or a wrong one.
    #[arg(long = "chat-template", value_name = "NAME|JINJA", conflicts_with = "chat_template_file")]
    pub chat_template: Option<String>,
    /// Render chats with the Jinja template in FILE instead of the model file's.
    #[arg(long = "chat-template-file", value_name = "FILE")]
    pub chat_template_file: Option<PathBuf>,
    /// Chats are always rendered with the template's Jinja (llama-server's `--jinja`): accepted,
    /// nothing to do.
    #[arg(long = "jinja")]
    pub jinja: bool,
    /// Flash attention: on, off or auto (llama.cpp's `-fa`; auto: where the backend supports it).
    #[arg(long = "flash-attn", value_name = "on|off|auto", default_value = "auto", value_parser = FlashAttn::parse)]
    pub flash_attn: FlashAttn,
    /// The KV cache's key type: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 (llama.cpp's
    /// `-ctk`; exact mode keeps q8_0).
    #[arg(long = "cache-type-k", value_name = "TYPE", value_parser = CacheType::parse)]
    pub cache_type_k: Option<CacheType>,
    /// The KV cache's value type (llama.cpp's `-ctv`; a quantized one needs flash attention).
    #[arg(long = "cache-type-v", value_name = "TYPE", value_parser = CacheType::parse)]
    pub cache_type_v: Option<CacheType>,
    /// The draft model's KV cache key type (llama.cpp's `-ctkd`; default: the target's).
    #[arg(long = "cache-type-k-draft", alias = "spec-draft-type-k", value_name = "TYPE", value_parser = CacheType::parse)]
    pub cache_type_k_draft: Option<CacheType>,
    /// The draft model's KV cache value type (llama.cpp's `-ctvd`; default: the target's).
    #[arg(long = "cache-type-v-draft", alias = "spec-draft-type-v", value_name = "TYPE", value_parser = CacheType::parse)]
    pub cache_type_v_draft: Option<CacheType>,
    /// Threads for prompt processing (llama.cpp's `-tb`; default: -t).
    #[arg(long = "threads-batch", value_parser = super::threads::threads_arg)]
    pub threads_batch: Option<usize>,
    /// Tokens llama.cpp computes per graph (llama.cpp's `-ub`).
    #[arg(long = "ubatch-size", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub ubatch_size: u32,
    /// llama.cpp's logical batch (`-b`): accepted, nothing to do (a forward of any size that fits
    /// the context is one `llama_decode` here).
    #[arg(short = 'b', long = "batch-size", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: Option<u32>,
    /// Read the model file instead of mapping it (llama.cpp's `--no-mmap`).
    #[arg(long = "no-mmap")]
    pub no_mmap: bool,
    /// Lock the weights in memory so they are never swapped out (llama.cpp's `--mlock`).
    #[arg(long = "mlock")]
    pub mlock: bool,
    /// Pad the target's verify forwards to a few fixed shapes so a GPU replays them (docs/GPU.md):
    /// `auto` where the measured shape times say it pays (a device; never a CPU), `on` (8, 16,
    /// 32, 64 rows), `off`, or a list of row counts.
    #[arg(long = "pad-shapes", value_name = "auto|on|off|LIST", default_value = "auto", value_parser = parse_pad_shapes)]
    pub pad_shapes: PadShapes,
    #[command(flatten)]
    pub rope: RopeArgs,
    /// Read a metadata key of the target file as this value instead (llama.cpp's
    /// `--override-kv KEY=TYPE:VALUE`, TYPE int, float, bool or str; repeatable).
    #[arg(long = "override-kv", value_name = "KEY=TYPE:VALUE", value_parser = KvOverride::parse)]
    pub override_kv: Vec<KvOverride>,
}

/// llama.cpp's RoPE/YaRN overrides (default: the model file's settings).
#[derive(Debug, Clone, clap::Args)]
pub struct RopeArgs {
    /// RoPE frequency scaling: none, linear or yarn (llama.cpp's `--rope-scaling`).
    #[arg(long = "rope-scaling", value_name = "none|linear|yarn", value_parser = RopeScaling::parse)]
    pub rope_scaling: Option<RopeScaling>,
    /// Context scaling factor: the frequency scale is its inverse (llama.cpp's `--rope-scale`).
    #[arg(long = "rope-scale", value_name = "N", conflicts_with = "rope_freq_scale", value_parser = positive)]
    pub rope_scale: Option<f32>,
    /// RoPE base frequency (llama.cpp's `--rope-freq-base`).
    #[arg(long = "rope-freq-base", value_name = "N", value_parser = positive)]
    pub rope_freq_base: Option<f32>,
    /// RoPE frequency scale factor (llama.cpp's `--rope-freq-scale`).
    #[arg(long = "rope-freq-scale", value_name = "N", value_parser = positive)]
    pub rope_freq_scale: Option<f32>,
    /// YaRN: the model's original training context (llama.cpp's `--yarn-orig-ctx`).
    #[arg(long = "yarn-orig-ctx", value_name = "N")]
    pub yarn_orig_ctx: Option<u32>,
    /// YaRN extrapolation mix factor (llama.cpp's `--yarn-ext-factor`; -1: the model's).
    #[arg(long = "yarn-ext-factor", value_name = "N", allow_negative_numbers = true, value_parser = finite)]
    pub yarn_ext_factor: Option<f32>,
    /// YaRN attention magnitude scale (llama.cpp's `--yarn-attn-factor`).
    #[arg(long = "yarn-attn-factor", value_name = "N", allow_negative_numbers = true, value_parser = finite)]
    pub yarn_attn_factor: Option<f32>,
    /// YaRN high correction dimension (llama.cpp's `--yarn-beta-slow`).
    #[arg(long = "yarn-beta-slow", value_name = "N", allow_negative_numbers = true, value_parser = finite)]
    pub yarn_beta_slow: Option<f32>,
    /// YaRN low correction dimension (llama.cpp's `--yarn-beta-fast`).
    #[arg(long = "yarn-beta-fast", value_name = "N", allow_negative_numbers = true, value_parser = finite)]
    pub yarn_beta_fast: Option<f32>,
}

impl RopeArgs {
    /// The overrides as the llama backend takes them.
    pub fn options(&self) -> RopeOptions {
        RopeOptions {
            scaling: self.rope_scaling,
            freq_base: self.rope_freq_base,
            freq_scale: self.rope_freq_scale.or(self.rope_scale.map(|s| 1.0 / s)),
            yarn_orig_ctx: self.yarn_orig_ctx,
            yarn_ext_factor: self.yarn_ext_factor,
            yarn_attn_factor: self.yarn_attn_factor,
            yarn_beta_slow: self.yarn_beta_slow,
            yarn_beta_fast: self.yarn_beta_fast,
        }
    }
}

fn finite(text: &str) -> std::result::Result<f32, String> {
    match text.parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(format!("{text:?} is not a finite number")),
    }
}

fn positive(text: &str) -> std::result::Result<f32, String> {
    match finite(text)? {
        v if v > 0.0 => Ok(v),
        _ => Err(format!("{text:?} must be above 0")),
    }
}

fn parse_pad_shapes(text: &str) -> std::result::Result<PadShapes, String> {
    PadShapes::parse(text).map_err(|e| e.to_string())
}

impl RuntimeArgs {
    /// The operator's chat template source (`--chat-template`, `--chat-template-file`), if any:
    /// a bad name, an unreadable file or a template that does not parse is an error naming the
    /// flag.
    pub fn chat_template_source(&self) -> Result<Option<String>> {
        let source = match (&self.chat_template, &self.chat_template_file) {
            (Some(value), _) => treespec_text::template_source(value)?,
            (None, Some(path)) => std::fs::read_to_string(path)
                .with_context(|| format!("--chat-template-file {}: reading the template", path.display()))?,
            (None, None) => return Ok(None),
        };
        let flag = if self.chat_template.is_some() { "--chat-template" } else { "--chat-template-file" };
        treespec_text::ChatTemplate::new(Some(&source), "", "").context(flag)?;
        Ok(Some(source))
    }

    /// Load options for both models.
    pub fn load_options(&self) -> LoadOptions {
        let offload = Offload { layers: self.gpu_layers.unwrap_or_default(), device: self.device.clone() };
        let draft_offload =
            self.gpu_layers_draft.map(|layers| Offload { layers, device: self.device.clone() });
        let kv_cache =
            KvCache { k: self.cache_type_k.unwrap_or_default(), v: self.cache_type_v.unwrap_or_default() };
        let draft_kv_cache =
            (self.cache_type_k_draft.is_some() || self.cache_type_v_draft.is_some()).then(|| KvCache {
                k: self.cache_type_k_draft.unwrap_or(kv_cache.k),
                v: self.cache_type_v_draft.unwrap_or(kv_cache.v),
            });
        let mut o = LoadOptions {
            ctx_size: self.ctx,
            exact: self.exact,
            offload,
            draft_offload,
            n_ubatch: self.ubatch_size as usize,
            flash_attn: self.flash_attn,
            kv_cache,
            draft_kv_cache,
            threads_batch: self.threads_batch,
            mmap: !self.no_mmap,
            mlock: self.mlock,
            pad_shapes: self.pad_shapes.clone(),
            rope: self.rope.options(),
            kv_overrides: self.override_kv.clone(),
            ..LoadOptions::default()
        };
        if let Some(t) = self.threads {
            o.threads = t;
        }
        o
    }
}

/// Sampling parameters.
#[derive(Debug, Clone, Args)]
pub struct SamplingArgs {
    /// Temperature (0 = greedy).
    #[arg(long = "temp", alias = "temperature", default_value_t = 0.0, allow_negative_numbers = true)]
    pub temp: f32,
    /// Keep only the k most likely tokens.
    #[arg(long = "top-k")]
    pub top_k: Option<usize>,
    /// Nucleus sampling threshold in (0, 1].
    #[arg(long = "top-p", default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Drop tokens below min-p × the top probability.
    #[arg(long = "min-p", default_value_t = 0.0, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Repetition penalty (1 = off) over the last 64 tokens.
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Presence penalty in [-2, 2] (0 = off) over the last 64 tokens, as llama.cpp applies it.
    #[arg(long = "presence-penalty", default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Frequency penalty in [-2, 2] (0 = off) over the last 64 tokens, per occurrence.
    #[arg(long = "frequency-penalty", default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Seed of the sampling. Given, it decides the text: every method emits what plain decoding
    /// emits with it (reproducible sampling, docs/METHODS.md). Omitted, the streams are seeded
    /// with 0 and speculative methods verify by rejection sampling.
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// Validated sampling parameters.
    pub fn params(&self) -> Result<SamplingParams> {
        let p = SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            reproducible: self.seed.is_some(),
            ..SamplingParams::default()
        };
        p.validate()?;
        Ok(p)
    }

    /// The seed of the random streams (0 when none was given).
    pub fn seed(&self) -> u64 {
        self.seed.unwrap_or(0)
    }
}

/// The decoding method and its knobs: the engine's registry types, so a flag means what the same
/// knob means in a request's `treespec` object (each applies to the methods named in its help).
#[derive(Debug, Clone, Args)]
pub struct MethodArgs {
    /// Decoding method.
    #[arg(long, default_value = "plain", value_parser = method_kind)]
    pub method: MethodKind,
    #[command(flatten)]
    pub knobs: MethodKnobs,
    /// Re-measure the cost curves instead of reading the cache.
    #[arg(long)]
    pub reprofile: bool,
}

/// `--method NAME`, listing the names in `--help`.
fn method_kind(s: &str) -> std::result::Result<MethodKind, String> {
    s.parse()
}

impl MethodArgs {
    /// The method and knobs as the registry's spec.
    pub fn spec(&self) -> MethodSpec {
        MethodSpec { method: self.method, knobs: self.knobs.clone() }
    }
}
