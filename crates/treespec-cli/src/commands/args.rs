//! Argument groups shared by `generate`, `bench` and `serve`: models, sampling, method knobs.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use treespec_core::sampling::SamplingParams;
use treespec_engine::registry::MethodKnobs;
use treespec_engine::{MethodKind, MethodSpec};
use treespec_llama::{GpuLayers, LoadOptions, Offload};

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
    #[arg(long = "draft", visible_alias = "md", alias = "model-draft")]
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
    #[arg(long = "n-gpu-layers-draft", visible_alias = "ngld", alias = "gpu-layers-draft", value_parser = GpuLayers::parse)]
    pub gpu_layers_draft: Option<GpuLayers>,
    /// The GPU to offload to, by the name `treespec devices` shows (llama.cpp's `-dev`; default:
    /// the first GPU).
    #[arg(long = "device", visible_alias = "dev")]
    pub device: Option<String>,
}

impl RuntimeArgs {
    /// Load options for both models.
    pub fn load_options(&self) -> LoadOptions {
        let offload = Offload { layers: self.gpu_layers.unwrap_or_default(), device: self.device.clone() };
        let draft_offload =
            self.gpu_layers_draft.map(|layers| Offload { layers, device: self.device.clone() });
        let mut o = LoadOptions {
            ctx_size: self.ctx,
            exact: self.exact,
            offload,
            draft_offload,
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
    #[arg(long = "temp", default_value_t = 0.0, allow_negative_numbers = true)]
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
