//! The model hyper-parameters that must be sane before llama.cpp sees a file, as read from GGUF
//! metadata by the pre-check (`precheck.rs`).
//!
//! llama.cpp answers most bad metadata with an exception, which becomes a null model and a clear
//! error here. A few values instead hit a `GGML_ASSERT` in `llama_model::load_hparams` (layer and
//! expert counts, the RoPE scaling type), and an assert aborts the whole process: a server would
//! die on a user's upload, and a CLI user gets SIGABRT instead of a message. So [`Hparams::read`]
//! refuses exactly those values first, mirroring the asserts of the llama.cpp that
//! llama-cpp-sys-2 0.1.161 vendors (re-check them when bumping it). The same values size the KV
//! cache before any context is made (`memory.rs`).

/// llama.cpp's `LLAMA_MAX_LAYERS` (llama-hparams.h): more transformer blocks abort the load.
pub const LLAMA_MAX_LAYERS: u64 = 512;
/// llama.cpp's `LLAMA_MAX_EXPERTS` (llama-hparams.h).
pub const LLAMA_MAX_EXPERTS: u64 = 1024;
/// The names `llama_rope_scaling_type_from_string` knows; any other string aborts the load.
const ROPE_SCALING_TYPES: [&str; 4] = ["none", "linear", "yarn", "longrope"];

/// A metadata value, as far as these checks care.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// Any integer type.
    Int(i128),
    /// An array of integers (per-layer values).
    Ints(Vec<i128>),
    /// A string.
    Str(String),
    /// Anything else (floats, bools, other arrays): llama.cpp refuses a wrong type itself.
    Other,
}

/// A hyper-parameter that is one value for every layer or an array with one value per layer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PerLayer {
    /// Absent from the file.
    #[default]
    Absent,
    /// The same for every layer.
    All(u64),
    /// One value per layer.
    Each(Vec<u64>),
}

impl PerLayer {
    /// The value at layer `il` (None when absent or out of range).
    pub fn at(&self, il: usize) -> Option<u64> {
        match self {
            PerLayer::Absent => None,
            PerLayer::All(v) => Some(*v),
            PerLayer::Each(v) => v.get(il).copied(),
        }
    }
}

/// What the pre-check knows about the model before llama.cpp loads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hparams {
    /// `{arch}.block_count`: transformer blocks.
    pub n_layer: Option<u64>,
    /// `{arch}.context_length`: the context the model was trained with.
    pub n_ctx_train: Option<u64>,
    /// `{arch}.embedding_length`.
    pub n_embd: Option<u64>,
    /// `{arch}.attention.head_count`.
    pub n_head: PerLayer,
    /// `{arch}.attention.head_count_kv` (defaults to `n_head`).
    pub n_head_kv: PerLayer,
    /// `{arch}.attention.key_length` (defaults to `n_embd / n_head`).
    pub key_length: Option<u64>,
    /// `{arch}.attention.value_length` (defaults to `n_embd / n_head`).
    pub value_length: Option<u64>,
}

/// A non-negative integer, or None for other types (llama.cpp refuses those with an exception).
fn uint(v: Option<MetaValue>, key: &str) -> Result<Option<u64>, String> {
    match v {
        Some(MetaValue::Int(i)) => u64::try_from(i).map(Some).map_err(|_| format!("{key} is negative ({i})")),
        _ => Ok(None),
    }
}

fn per_layer(v: Option<MetaValue>, key: &str) -> Result<PerLayer, String> {
    match v {
        Some(MetaValue::Ints(a)) => a
            .into_iter()
            .map(|i| u64::try_from(i).map_err(|_| format!("{key} holds a negative value ({i})")))
            .collect::<Result<Vec<_>, _>>()
            .map(PerLayer::Each),
        other => Ok(uint(other, key)?.map_or(PerLayer::Absent, PerLayer::All)),
    }
}

fn max_of(p: &PerLayer) -> u64 {
    match p {
        PerLayer::Absent => 0,
        PerLayer::All(v) => *v,
        PerLayer::Each(v) => v.iter().copied().max().unwrap_or(0),
    }
}

impl Hparams {
    /// Read the hyper-parameters of architecture `arch` through `get` (a metadata lookup by key),
    /// refusing every value that would make llama.cpp abort instead of fail.
    pub fn read(arch: &str, get: impl Fn(&str) -> Option<MetaValue>) -> Result<Self, String> {
        let key = |k: &str| format!("{arch}.{k}");
        let n_layer = uint(get(&key("block_count")), "block_count")?;
        if let Some(n) = n_layer {
            if n == 0 || n > LLAMA_MAX_LAYERS {
                return Err(format!(
                    "{} is {n}: llama.cpp needs between 1 and {LLAMA_MAX_LAYERS} transformer blocks",
                    key("block_count")
                ));
            }
        }
        let n_layer_all = n_layer.unwrap_or(0);
        let nextn = uint(get(&key("nextn_predict_layers")), "nextn_predict_layers")?.unwrap_or(0);
        if nextn > n_layer_all && n_layer.is_some() {
            return Err(format!(
                "{} is {nextn}, more than the model's {n_layer_all} blocks",
                key("nextn_predict_layers")
            ));
        }
        Self::check_experts(arch, &get)?;
        if let Some(MetaValue::Str(s)) = get(&key("rope.scaling.type")) {
            if !ROPE_SCALING_TYPES.contains(&s.as_str()) {
                return Err(format!(
                    "{} is '{s}': llama.cpp knows only {}",
                    key("rope.scaling.type"),
                    ROPE_SCALING_TYPES.join(", ")
                ));
            }
        }
        Ok(Self {
            n_layer,
            n_ctx_train: uint(get(&key("context_length")), "context_length")?,
            n_embd: uint(get(&key("embedding_length")), "embedding_length")?,
            n_head: per_layer(get(&key("attention.head_count")), "attention.head_count")?,
            n_head_kv: per_layer(get(&key("attention.head_count_kv")), "attention.head_count_kv")?,
            key_length: uint(get(&key("attention.key_length")), "attention.key_length")?,
            value_length: uint(get(&key("attention.value_length")), "attention.value_length")?,
        })
    }

    /// The expert-count asserts of `load_hparams`.
    fn check_experts(arch: &str, get: &impl Fn(&str) -> Option<MetaValue>) -> Result<(), String> {
        let key = |k: &str| format!("{arch}.{k}");
        let n_expert = uint(get(&key("expert_count")), "expert_count")?.unwrap_or(0);
        let used = max_of(&per_layer(get(&key("expert_used_count")), "expert_used_count")?);
        let groups = uint(get(&key("expert_group_count")), "expert_group_count")?.unwrap_or(0);
        let group_used = uint(get(&key("expert_group_used_count")), "expert_group_used_count")?.unwrap_or(0);
        let bad = |what: String| Err(format!("inconsistent mixture-of-experts metadata: {what}"));
        if n_expert > LLAMA_MAX_EXPERTS {
            return bad(format!("{n_expert} experts, llama.cpp allows at most {LLAMA_MAX_EXPERTS}"));
        }
        if used > n_expert {
            return bad(format!("{used} experts used per token out of {n_expert}"));
        }
        if n_expert > 0 {
            if used == 0 {
                return bad(format!("{n_expert} experts but none used per token"));
            }
            if groups >= n_expert {
                return bad(format!("{groups} expert groups for {n_expert} experts"));
            }
            if groups > 1 && (n_expert % groups != 0 || group_used == 0 || group_used >= groups) {
                return bad(format!(
                    "{n_expert} experts in {groups} groups with {group_used} groups used per token"
                ));
            }
        } else if groups != 0 {
            return bad(format!("{groups} expert groups without experts"));
        }
        Ok(())
    }

    /// KV-cache elements per cached token, summed over the layers: `n_head_kv × (key + value
    /// head size)` per layer, with llama.cpp's defaults for absent keys. None when the file lacks
    /// what is needed to tell.
    pub fn kv_elements_per_token(&self) -> Option<u64> {
        let n_layer = self.n_layer? as usize;
        let head_dim = |explicit: Option<u64>| -> Option<u64> {
            explicit.or_else(|| {
                let h = self.n_head.at(0)?;
                (h > 0).then(|| self.n_embd.map(|e| e / h)).flatten()
            })
        };
        let (k, v) = (head_dim(self.key_length)?, head_dim(self.value_length)?);
        let mut total: u64 = 0;
        for il in 0..n_layer {
            let kv_heads = self.n_head_kv.at(il).or_else(|| self.n_head.at(il))?;
            total = total.saturating_add(kv_heads.saturating_mul(k.saturating_add(v)));
        }
        Some(total)
    }
}

/// The first token text that occurs twice in a vocabulary, with both indices. llama.cpp builds a
/// text → id map and asserts it is as long as the vocabulary, so a duplicate aborts the load. Empty
/// texts are renamed `[EMPTY_i]` by llama.cpp first, and are compared under that name here too.
pub fn duplicate_token<'a>(tokens: impl Iterator<Item = &'a [u8]>) -> Option<(usize, usize, String)> {
    let mut seen: std::collections::HashMap<Vec<u8>, usize> = std::collections::HashMap::new();
    for (i, t) in tokens.enumerate() {
        let text = if t.is_empty() { format!("[EMPTY_{i}]").into_bytes() } else { t.to_vec() };
        if let Some(&first) = seen.get(&text) {
            return Some((first, i, String::from_utf8_lossy(&text).into_owned()));
        }
        seen.insert(text, i);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(kv: &[(&str, MetaValue)]) -> Result<Hparams, String> {
        Hparams::read("llama", |k| kv.iter().find(|(key, _)| *key == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn layer_counts_llama_cpp_would_abort_on_are_refused() {
        for n in [0, 513, 1 << 40] {
            let e = read(&[("llama.block_count", MetaValue::Int(n))]).unwrap_err();
            assert!(e.contains("block_count") && e.contains("512"), "{e}");
        }
        assert!(read(&[("llama.block_count", MetaValue::Int(-1))]).is_err());
        assert_eq!(read(&[("llama.block_count", MetaValue::Int(512))]).unwrap().n_layer, Some(512));
        // A wrong type is left to llama.cpp, which refuses it with an exception.
        assert_eq!(read(&[("llama.block_count", MetaValue::Str("x".into()))]).unwrap().n_layer, None);
        let e = read(&[
            ("llama.block_count", MetaValue::Int(4)),
            ("llama.nextn_predict_layers", MetaValue::Int(5)),
        ])
        .unwrap_err();
        assert!(e.contains("nextn_predict_layers"), "{e}");
    }

    #[test]
    fn expert_and_rope_asserts_are_mirrored() {
        let n = |v| MetaValue::Int(v);
        assert!(read(&[("llama.expert_count", n(2000)), ("llama.expert_used_count", n(2))]).is_err());
        assert!(read(&[("llama.expert_count", n(8))]).is_err());
        assert!(read(&[("llama.expert_used_count", n(2))]).is_err());
        assert!(read(&[("llama.expert_count", n(8)), ("llama.expert_used_count", n(9))]).is_err());
        assert!(read(&[("llama.expert_count", n(8)), ("llama.expert_used_count", n(2))]).is_ok());
        assert!(read(&[
            ("llama.expert_count", n(8)),
            ("llama.expert_used_count", MetaValue::Ints(vec![2, 2])),
            ("llama.expert_group_count", n(3)),
            ("llama.expert_group_used_count", n(1)),
        ])
        .is_err());
        assert!(read(&[("llama.rope.scaling.type", MetaValue::Str("cubic".into()))]).is_err());
        assert!(read(&[("llama.rope.scaling.type", MetaValue::Str("yarn".into()))]).is_ok());
    }

    #[test]
    fn kv_elements_follow_llama_cpp_defaults() {
        // SmolLM2-135M: 30 layers, 9 heads of 64 (576 wide), 3 KV heads.
        let h = read(&[
            ("llama.block_count", MetaValue::Int(30)),
            ("llama.embedding_length", MetaValue::Int(576)),
            ("llama.attention.head_count", MetaValue::Int(9)),
            ("llama.attention.head_count_kv", MetaValue::Int(3)),
        ])
        .unwrap();
        assert_eq!(h.kv_elements_per_token(), Some(30 * 3 * (64 + 64)));
        // Per-layer KV heads (0 = a layer without attention), explicit head sizes.
        let h = read(&[
            ("llama.block_count", MetaValue::Int(3)),
            ("llama.attention.head_count", MetaValue::Int(8)),
            ("llama.attention.head_count_kv", MetaValue::Ints(vec![2, 0, 4])),
            ("llama.attention.key_length", MetaValue::Int(128)),
            ("llama.attention.value_length", MetaValue::Int(64)),
        ])
        .unwrap();
        assert_eq!(h.kv_elements_per_token(), Some((2 + 4) * (128 + 64)));
        assert_eq!(Hparams::default().kv_elements_per_token(), None);
    }

    #[test]
    fn duplicate_tokens_are_found() {
        let v: Vec<&[u8]> = vec![b"a", b"b", b"", b"a"];
        assert_eq!(duplicate_token(v.into_iter()), Some((0, 3, "a".into())));
        let v: Vec<&[u8]> = vec![b"[EMPTY_1]", b""];
        assert_eq!(duplicate_token(v.into_iter()).map(|d| (d.0, d.1)), Some((0, 1)));
        let v: Vec<&[u8]> = vec![b"a", b"", b""];
        assert_eq!(duplicate_token(v.into_iter()), None);
    }
}
