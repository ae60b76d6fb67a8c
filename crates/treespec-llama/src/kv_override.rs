//! Model metadata overrides (llama.cpp's `--override-kv KEY=TYPE:VALUE`): a GGUF key read as the
//! given value instead of the file's, at load.

use std::os::raw::c_char;

use llama_cpp_sys_2::{llama_model_kv_override, llama_model_kv_override__bindgen_ty_1 as Value};

/// The longest key or string value llama.cpp takes (its fields hold 128 bytes with the NUL).
const MAX_BYTES: usize = 127;

/// One override's value.
#[derive(Debug, Clone, PartialEq)]
pub enum KvValue {
    /// `int:N`.
    Int(i64),
    /// `float:X` (finite).
    Float(f64),
    /// `bool:true|false`.
    Bool(bool),
    /// `str:TEXT` (at most 127 bytes).
    Str(String),
}

/// `KEY=TYPE:VALUE`.
#[derive(Debug, Clone, PartialEq)]
pub struct KvOverride {
    /// The GGUF key.
    pub key: String,
    /// What it reads as.
    pub value: KvValue,
}

/// Floats are finite (checked by [`KvOverride::parse`]), so equality is total.
impl Eq for KvOverride {}

impl KvOverride {
    /// `KEY=TYPE:VALUE` as llama.cpp spells it (TYPE: int, float, bool or str).
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!("--override-kv {text:?}: {why} (KEY=TYPE:VALUE, TYPE int, float, bool or str)")
        };
        let (key, typed) = text.split_once('=').ok_or_else(|| bad("no '='"))?;
        let (kind, raw) = typed.split_once(':').ok_or_else(|| bad("no ':' after the type"))?;
        if key.is_empty() || key.len() > MAX_BYTES || key.contains('\0') {
            return Err(bad("the key must have 1 to 127 bytes"));
        }
        let value = match kind {
            "int" => KvValue::Int(raw.parse().map_err(|_| bad("not an integer"))?),
            "float" => match raw.parse::<f64>() {
                Ok(v) if v.is_finite() => KvValue::Float(v),
                _ => return Err(bad("not a finite number")),
            },
            "bool" => match raw {
                "true" => KvValue::Bool(true),
                "false" => KvValue::Bool(false),
                _ => return Err(bad("a bool is true or false")),
            },
            "str" if raw.len() <= MAX_BYTES && !raw.contains('\0') => KvValue::Str(raw.to_owned()),
            "str" => return Err(bad("a string has at most 127 bytes")),
            _ => return Err(bad("unknown type")),
        };
        Ok(Self { key: key.to_owned(), value })
    }
}

/// `text` as a NUL-padded C array (checked to fit by [`KvOverride::parse`]).
fn c_array(text: &str) -> [c_char; 128] {
    let mut a = [0 as c_char; 128];
    for (slot, &b) in a.iter_mut().zip(text.as_bytes().iter().take(MAX_BYTES)) {
        *slot = b as c_char;
    }
    a
}

/// The overrides as `llama_model_params::kv_overrides` reads them: the array, ended by an entry
/// with an empty key. Empty when there are none (the params then keep a null pointer).
pub(crate) fn raw_overrides(list: &[KvOverride]) -> Vec<llama_model_kv_override> {
    if list.is_empty() {
        return Vec::new();
    }
    let entry = |o: &KvOverride| {
        let (tag, value) = match &o.value {
            KvValue::Int(v) => (llama_cpp_sys_2::LLAMA_KV_OVERRIDE_TYPE_INT, Value { val_i64: *v }),
            KvValue::Float(v) => (llama_cpp_sys_2::LLAMA_KV_OVERRIDE_TYPE_FLOAT, Value { val_f64: *v }),
            KvValue::Bool(v) => (llama_cpp_sys_2::LLAMA_KV_OVERRIDE_TYPE_BOOL, Value { val_bool: *v }),
            KvValue::Str(s) => (llama_cpp_sys_2::LLAMA_KV_OVERRIDE_TYPE_STR, Value { val_str: c_array(s) }),
        };
        llama_model_kv_override { key: c_array(&o.key), tag, __bindgen_anon_1: value }
    };
    let end = llama_model_kv_override { key: [0; 128], tag: 0, __bindgen_anon_1: Value { val_i64: 0 } };
    list.iter().map(entry).chain(std::iter::once(end)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpps_spelling_parses_and_bad_ones_say_why() {
        let o = KvOverride::parse("tokenizer.ggml.add_bos_token=bool:true").unwrap();
        assert_eq!(o.key, "tokenizer.ggml.add_bos_token");
        assert_eq!(o.value, KvValue::Bool(true));
        assert_eq!(KvOverride::parse("a=int:-3").unwrap().value, KvValue::Int(-3));
        assert_eq!(KvOverride::parse("a=float:0.5").unwrap().value, KvValue::Float(0.5));
        assert_eq!(KvOverride::parse("a=str:x=y:z").unwrap().value, KvValue::Str("x=y:z".into()));
        for bad in ["a", "a=int", "=int:1", "a=int:x", "a=float:nan", "a=bool:yes", "a=list:1"] {
            assert!(KvOverride::parse(bad).unwrap_err().contains("KEY=TYPE:VALUE"), "{bad}");
        }
        assert!(KvOverride::parse(&format!("a=str:{}", "x".repeat(128))).is_err());
    }

    #[test]
    fn the_raw_array_ends_with_an_empty_key() {
        assert!(raw_overrides(&[]).is_empty());
        let raw = raw_overrides(&[KvOverride::parse("ab=int:7").unwrap()]);
        assert_eq!(raw.len(), 2);
        assert_eq!((raw[0].key[0], raw[0].key[1], raw[0].key[2]), (b'a' as c_char, b'b' as c_char, 0));
        assert_eq!(raw[0].tag, llama_cpp_sys_2::LLAMA_KV_OVERRIDE_TYPE_INT);
        // SAFETY: the entry was written as an integer.
        assert_eq!(unsafe { raw[0].__bindgen_anon_1.val_i64 }, 7);
        assert_eq!(raw[1].key[0], 0);
    }
}
