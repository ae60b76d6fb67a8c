//! Writing GGUF files byte by byte, for tests of the pre-check: well-formed headers with chosen
//! metadata, and the SmolLM2 file with one metadata value patched.
#![allow(dead_code)]

/// A metadata value.
#[derive(Debug, Clone)]
pub enum V {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    Bool(bool),
    Str(String),
    ArrU32(Vec<u32>),
    ArrI32(Vec<i32>),
    ArrStr(Vec<String>),
}

/// One tensor-table entry.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub offset: u64,
}

/// A GGUF file: header, metadata, tensor table, and `data` zero bytes after the aligned header.
#[derive(Debug, Clone, Default)]
pub struct Gguf {
    pub version: u32,
    pub kv: Vec<(String, V)>,
    pub tensors: Vec<TensorInfo>,
    pub data: usize,
}

fn string(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

fn value(b: &mut Vec<u8>, v: &V) {
    let (ty, body): (u32, Vec<u8>) = match v {
        V::U8(x) => (0, x.to_le_bytes().to_vec()),
        V::I8(x) => (1, x.to_le_bytes().to_vec()),
        V::U16(x) => (2, x.to_le_bytes().to_vec()),
        V::I16(x) => (3, x.to_le_bytes().to_vec()),
        V::U32(x) => (4, x.to_le_bytes().to_vec()),
        V::I32(x) => (5, x.to_le_bytes().to_vec()),
        V::F32(x) => (6, x.to_le_bytes().to_vec()),
        V::Bool(x) => (7, vec![*x as u8]),
        V::Str(s) => {
            let mut body = Vec::new();
            string(&mut body, s);
            (8, body)
        }
        V::ArrU32(a) => (9, array(4, a.len(), a.iter().flat_map(|x| x.to_le_bytes()))),
        V::ArrI32(a) => (9, array(5, a.len(), a.iter().flat_map(|x| x.to_le_bytes()))),
        V::ArrStr(a) => {
            let mut items = Vec::new();
            for s in a {
                string(&mut items, s);
            }
            (9, array(8, a.len(), items))
        }
        V::U64(x) => (10, x.to_le_bytes().to_vec()),
        V::I64(x) => (11, x.to_le_bytes().to_vec()),
    };
    b.extend(ty.to_le_bytes());
    b.extend(body);
}

fn array(elem_type: u32, n: usize, items: impl IntoIterator<Item = u8>) -> Vec<u8> {
    let mut body = elem_type.to_le_bytes().to_vec();
    body.extend((n as u64).to_le_bytes());
    body.extend(items);
    body
}

impl Gguf {
    /// A version-3 file with these metadata pairs and nothing else.
    pub fn with_kv(kv: &[(&str, V)]) -> Self {
        Self {
            version: 3,
            kv: kv.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            ..Self::default()
        }
    }

    /// The file's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(self.version.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            string(&mut b, k);
            value(&mut b, v);
        }
        for t in &self.tensors {
            string(&mut b, &t.name);
            b.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(t.ggml_type.to_le_bytes());
            b.extend(t.offset.to_le_bytes());
        }
        b.resize(b.len().div_ceil(32) * 32 + self.data, 0);
        b
    }
}

/// `bytes` (a GGUF file) with the `u32` value of metadata key `key` replaced by `value`.
pub fn patch_u32(bytes: &[u8], key: &str, value: u32) -> Vec<u8> {
    let mut needle = (key.len() as u64).to_le_bytes().to_vec();
    needle.extend(key.as_bytes());
    let at = bytes.windows(needle.len()).position(|w| w == needle).expect("key in file") + needle.len();
    assert_eq!(bytes[at..at + 4], 4u32.to_le_bytes(), "{key} is not a u32");
    let mut out = bytes.to_vec();
    out[at + 4..at + 8].copy_from_slice(&value.to_le_bytes());
    out
}
