//! Model metadata for display (a future `inspect` command) and for sanity checks.

use std::ffi::CStr;

use crate::load::LlamaModel;

/// A summary of a loaded model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// llama.cpp's one-line description, e.g. `llama ?B Q4_1 - Medium`.
    pub description: String,
    /// `general.architecture` (llama, qwen2, gemma3...).
    pub architecture: Option<String>,
    /// `general.name`, when the file has one.
    pub name: Option<String>,
    /// Quantization / file type as llama.cpp names it, e.g. `Q4_K - Medium`.
    pub file_type: String,
    /// Number of parameters.
    pub n_params: u64,
    /// Bytes of tensor data.
    pub tensor_bytes: u64,
    /// Size of the GGUF file in bytes.
    pub file_bytes: u64,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Embedding width.
    pub n_embd: usize,
    /// Attention heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when smaller than `n_head`).
    pub n_head_kv: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Tokenizer family.
    pub vocab_type: String,
    /// BOS / EOS / EOT ids.
    pub bos: Option<u32>,
    /// End of sequence.
    pub eos: Option<u32>,
    /// End of turn.
    pub eot: Option<u32>,
    /// Whether prompts start with BOS.
    pub add_bos: bool,
    /// Whether a chat template ships in the file.
    pub has_chat_template: bool,
}

impl LlamaModel {
    /// A metadata value rendered as a string by llama.cpp (arrays come back abbreviated or in
    /// full depending on the key), or `None` if the key is absent.
    pub fn meta(&self, key: &str) -> Option<String> {
        self.inner.meta_val_str(key).ok()
    }

    /// All metadata key/value pairs, in file order.
    pub fn metadata(&self) -> Vec<(String, String)> {
        (0..self.inner.meta_count().max(0))
            .filter_map(|i| {
                Some((self.inner.meta_key_by_index(i).ok()?, self.inner.meta_val_str_by_index(i).ok()?))
            })
            .collect()
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<String> {
        self.meta("general.architecture")
    }

    /// The chat template stored in the file (`tokenizer.chat_template`), if any.
    pub fn chat_template(&self) -> Option<String> {
        // SAFETY: live model; a null name asks for the default template; the returned string is
        // owned by the model.
        let p = unsafe { llama_cpp_sys_2::llama_model_chat_template(self.raw_ptr(), std::ptr::null()) };
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    /// Quantization / file type, as llama.cpp names it (e.g. `Q4_1`, `Q4_K - Medium`).
    pub fn file_type(&self) -> String {
        // SAFETY: live model; llama_ftype_name returns a static string.
        unsafe {
            let ftype = llama_cpp_sys_2::llama_model_ftype(self.raw_ptr());
            let p = llama_cpp_sys_2::llama_ftype_name(ftype);
            if p.is_null() {
                format!("ftype {ftype}")
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }

    /// llama.cpp's one-line model description.
    pub fn description(&self) -> String {
        let mut buf = vec![0u8; 256];
        // SAFETY: buffer and its length; llama.cpp NUL-terminates within it.
        let n =
            unsafe { llama_cpp_sys_2::llama_model_desc(self.raw_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        buf.truncate(n.clamp(0, 255) as usize);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Number of parameters.
    pub fn n_params(&self) -> u64 {
        self.inner.n_params()
    }

    /// Everything above in one struct.
    pub fn info(&self) -> ModelInfo {
        let raw = self.raw_ptr();
        let n = |v: i32| v.max(0) as usize;
        // SAFETY (getters below): live model pointer, plain integer getters.
        let (n_ctx_train, n_layer, n_embd, n_head, n_head_kv) = unsafe {
            (
                n(llama_cpp_sys_2::llama_model_n_ctx_train(raw)),
                n(llama_cpp_sys_2::llama_model_n_layer(raw)),
                n(llama_cpp_sys_2::llama_model_n_embd(raw)),
                n(llama_cpp_sys_2::llama_model_n_head(raw)),
                n(llama_cpp_sys_2::llama_model_n_head_kv(raw)),
            )
        };
        ModelInfo {
            description: self.description(),
            architecture: self.architecture(),
            name: self.meta("general.name"),
            file_type: self.file_type(),
            n_params: self.n_params(),
            tensor_bytes: self.inner.size(),
            file_bytes: self.gguf_facts().file_size,
            n_ctx_train,
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            vocab_size: self.vocab_size(),
            vocab_type: self.vocab_type(),
            bos: self.bos(),
            eos: self.eos(),
            eot: self.eot(),
            add_bos: self.add_bos(),
            has_chat_template: self.chat_template().is_some(),
        }
    }
}
