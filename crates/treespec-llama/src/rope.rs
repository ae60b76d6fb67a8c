//! RoPE and YaRN overrides (llama.cpp's `--rope-scaling`, `--rope-scale`, `--rope-freq-base`,
//! `--rope-freq-scale`, `--yarn-*`): what a llama-server command line that stretches a model's
//! context sets, applied to every context made from the model. Unset, llama.cpp reads the model
//! file's own settings.

use llama_cpp_2::context::params::{LlamaContextParams, RopeScalingType};

/// The RoPE frequency scaling method (`--rope-scaling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeScaling {
    /// No scaling.
    None,
    /// Linear (position interpolation).
    Linear,
    /// YaRN.
    Yarn,
}

impl RopeScaling {
    /// `none`, `linear` or `yarn`, as llama.cpp spells them.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "linear" => Ok(Self::Linear),
            "yarn" => Ok(Self::Yarn),
            _ => Err(format!("RoPE scaling is none, linear or yarn, not {s:?}")),
        }
    }
}

/// A setter of one float field of the context params.
type SetFloat = fn(LlamaContextParams, f32) -> LlamaContextParams;

/// The overrides; None leaves the model file's value.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RopeOptions {
    /// `--rope-scaling`.
    pub scaling: Option<RopeScaling>,
    /// `--rope-freq-base`: the base frequency.
    pub freq_base: Option<f32>,
    /// `--rope-freq-scale` (or `1 / --rope-scale`): the frequency scale factor.
    pub freq_scale: Option<f32>,
    /// `--yarn-orig-ctx`: the model's original training context.
    pub yarn_orig_ctx: Option<u32>,
    /// `--yarn-ext-factor`: extrapolation mix factor.
    pub yarn_ext_factor: Option<f32>,
    /// `--yarn-attn-factor`: attention magnitude scale.
    pub yarn_attn_factor: Option<f32>,
    /// `--yarn-beta-slow`: high correction dimension.
    pub yarn_beta_slow: Option<f32>,
    /// `--yarn-beta-fast`: low correction dimension.
    pub yarn_beta_fast: Option<f32>,
}

/// Every value is a finite number (checked where the options are made), so equality is total.
impl Eq for RopeOptions {}

impl RopeOptions {
    /// `params` with every override set.
    pub(crate) fn apply(&self, mut p: LlamaContextParams) -> LlamaContextParams {
        if let Some(s) = self.scaling {
            p = p.with_rope_scaling_type(match s {
                RopeScaling::None => RopeScalingType::None,
                RopeScaling::Linear => RopeScalingType::Linear,
                RopeScaling::Yarn => RopeScalingType::Yarn,
            });
        }
        let floats: [(Option<f32>, SetFloat); 6] = [
            (self.freq_base, LlamaContextParams::with_rope_freq_base),
            (self.freq_scale, LlamaContextParams::with_rope_freq_scale),
            (self.yarn_ext_factor, LlamaContextParams::with_yarn_ext_factor),
            (self.yarn_attn_factor, LlamaContextParams::with_yarn_attn_factor),
            (self.yarn_beta_slow, LlamaContextParams::with_yarn_beta_slow),
            (self.yarn_beta_fast, LlamaContextParams::with_yarn_beta_fast),
        ];
        for (value, set) in floats {
            if let Some(v) = value {
                p = set(p, v);
            }
        }
        match self.yarn_orig_ctx {
            Some(n) => p.with_yarn_orig_ctx(n),
            None => p,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_names_are_llama_cpps() {
        assert_eq!(RopeScaling::parse("yarn"), Ok(RopeScaling::Yarn));
        assert_eq!(RopeScaling::parse("linear"), Ok(RopeScaling::Linear));
        assert!(RopeScaling::parse("ntk").unwrap_err().contains("none, linear or yarn"));
    }

    #[test]
    fn overrides_reach_the_context_params_and_nothing_else_changes() {
        let base = LlamaContextParams::default();
        let same = RopeOptions::default().apply(LlamaContextParams::default());
        assert_eq!(format!("{same:?}"), format!("{base:?}"));
        let o = RopeOptions {
            scaling: Some(RopeScaling::Yarn),
            freq_base: Some(500_000.0),
            freq_scale: Some(0.25),
            yarn_orig_ctx: Some(8192),
            ..Default::default()
        };
        let p = o.apply(LlamaContextParams::default());
        assert_eq!(p.rope_scaling_type(), RopeScalingType::Yarn);
        assert_eq!(p.rope_freq_base(), 500_000.0);
        assert_eq!(p.rope_freq_scale(), 0.25);
        assert_eq!(p.yarn_orig_ctx(), 8192);
    }
}
