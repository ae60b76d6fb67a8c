//! llama.cpp's context settings a user sets on its tools' command lines: flash attention
//! (`-fa on|off|auto`) and the KV cache's element types (`-ctk`, `-ctv`), spelled as llama.cpp
//! spells them so a llama-server command line means the same here.

use std::fmt;

use llama_cpp_2::context::params::KvCacheType;

/// Flash attention (`-fa`): llama.cpp's `auto` lets the backend decide (on where it supports the
/// model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlashAttn {
    /// The backend decides.
    #[default]
    Auto,
    /// Always.
    On,
    /// Never.
    Off,
}

impl FlashAttn {
    /// `on`, `off` or `auto` (also llama.cpp's `1`/`0`, `true`/`false`, `enabled`/`disabled`).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" | "-1" => Ok(Self::Auto),
            "on" | "1" | "true" | "enabled" => Ok(Self::On),
            "off" | "0" | "false" | "disabled" => Ok(Self::Off),
            _ => Err(format!("flash attention is on, off or auto, not {s:?}")),
        }
    }

    /// `llama_context_params::flash_attn_type`.
    pub(crate) fn param(self) -> llama_cpp_sys_2::llama_flash_attn_type {
        match self {
            Self::Auto => llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_AUTO,
            Self::On => llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_ENABLED,
            Self::Off => llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_DISABLED,
        }
    }
}

/// A KV cache element type: the ones llama.cpp's `-ctk`/`-ctv` accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheType {
    /// 32-bit floats.
    F32,
    /// 16-bit floats (llama.cpp's default).
    #[default]
    F16,
    /// bfloat16.
    Bf16,
    /// 8-bit blocks.
    Q8_0,
    /// 4-bit blocks.
    Q4_0,
    /// 4-bit blocks with a minimum.
    Q4_1,
    /// 4-bit non-linear blocks.
    Iq4Nl,
    /// 5-bit blocks.
    Q5_0,
    /// 5-bit blocks with a minimum.
    Q5_1,
}

/// Every type with its name, in llama.cpp's order.
const NAMES: [(CacheType, &str); 9] = [
    (CacheType::F32, "f32"),
    (CacheType::F16, "f16"),
    (CacheType::Bf16, "bf16"),
    (CacheType::Q8_0, "q8_0"),
    (CacheType::Q4_0, "q4_0"),
    (CacheType::Q4_1, "q4_1"),
    (CacheType::Iq4Nl, "iq4_nl"),
    (CacheType::Q5_0, "q5_0"),
    (CacheType::Q5_1, "q5_1"),
];

impl CacheType {
    /// llama.cpp's name of a type (`q8_0`, `f16`, …).
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.to_ascii_lowercase();
        NAMES.iter().find(|(_, n)| *n == s).map(|(t, _)| *t).ok_or_else(|| {
            format!(
                "unknown KV cache type {s:?} (one of {})",
                NAMES.iter().map(|(_, n)| *n).collect::<Vec<_>>().join(", ")
            )
        })
    }

    /// Whether its elements are stored in quantized blocks (a quantized V cache needs flash
    /// attention in llama.cpp).
    pub fn quantized(self) -> bool {
        !matches!(self, Self::F32 | Self::F16 | Self::Bf16)
    }

    pub(crate) fn param(self) -> KvCacheType {
        match self {
            Self::F32 => KvCacheType::F32,
            Self::F16 => KvCacheType::F16,
            Self::Bf16 => KvCacheType::BF16,
            Self::Q8_0 => KvCacheType::Q8_0,
            Self::Q4_0 => KvCacheType::Q4_0,
            Self::Q4_1 => KvCacheType::Q4_1,
            Self::Iq4Nl => KvCacheType::IQ4_NL,
            Self::Q5_0 => KvCacheType::Q5_0,
            Self::Q5_1 => KvCacheType::Q5_1,
        }
    }
}

impl fmt::Display for CacheType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = NAMES.iter().find(|(t, _)| t == self).map_or("?", |(_, n)| n);
        f.write_str(name)
    }
}

/// The element types of one model's KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvCache {
    /// Keys (`-ctk`).
    pub k: CacheType,
    /// Values (`-ctv`).
    pub v: CacheType,
}

impl KvCache {
    /// Whether either half is quantized (the memory check then sizes it as Q8_0).
    pub fn quantized(self) -> bool {
        self.k.quantized() || self.v.quantized()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_as_llama_cpp_writes_them() {
        for (t, name) in NAMES {
            assert_eq!(CacheType::parse(name), Ok(t));
            assert_eq!(CacheType::parse(&name.to_uppercase()), Ok(t));
            assert_eq!(t.to_string(), name);
        }
        assert!(CacheType::parse("q3_k").unwrap_err().contains("q8_0"));
        assert_eq!(FlashAttn::parse("on"), Ok(FlashAttn::On));
        assert_eq!(FlashAttn::parse("0"), Ok(FlashAttn::Off));
        assert_eq!(FlashAttn::parse("AUTO"), Ok(FlashAttn::Auto));
        assert!(FlashAttn::parse("maybe").is_err());
        assert!(CacheType::Q8_0.quantized() && !CacheType::Bf16.quantized());
    }
}
