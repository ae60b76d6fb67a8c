//! Can a draft model propose tokens for a target model?
//!
//! Speculative decoding compares token ids across the two models, so their tokenizers must agree.
//! This follows llama.cpp's own check (`common_speculative_are_compatible`): same tokenizer type,
//! same BOS/EOS ids and add-BOS/add-EOS flags, vocabulary sizes within 128 of each other (the
//! tail may hold extra padding or special tokens), and identical token text for every id from 5 up
//! to the smaller vocabulary (the first few ids are special tokens that often differ harmlessly).

use std::ffi::CStr;

use treespec_engine::{EngineError, Result};

use crate::load::LlamaModel;

/// Largest vocabulary size difference llama.cpp accepts between draft and target.
pub const MAX_VOCAB_SIZE_DIFFERENCE: usize = 128;
/// First token id whose text must match.
pub const CHECK_START_TOKEN_ID: usize = 5;

fn token_text(model: &LlamaModel, id: usize) -> String {
    // SAFETY: live vocab, id below its size; the returned string is owned by the vocab.
    let p = unsafe { llama_cpp_sys_2::llama_vocab_get_text(model.raw_vocab(), id as i32) };
    if p.is_null() {
        String::new()
    } else {
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// `Ok(())` when `draft` can draft for `target`; otherwise [`EngineError::Incompatible`] naming
/// the first difference found.
pub fn check_compatible(draft: &LlamaModel, target: &LlamaModel) -> Result<()> {
    let bad = |m: String| Err(EngineError::Incompatible(m));
    if draft.vocab_type_id() != target.vocab_type_id() {
        return bad(format!(
            "tokenizer types differ: draft {} vs target {}",
            draft.vocab_type(),
            target.vocab_type()
        ));
    }
    let fmt = |t: Option<u32>| t.map_or_else(|| "none".to_string(), |t| t.to_string());
    if draft.bos() != target.bos() {
        return bad(format!("BOS ids differ: draft {} vs target {}", fmt(draft.bos()), fmt(target.bos())));
    }
    if draft.eos() != target.eos() {
        return bad(format!("EOS ids differ: draft {} vs target {}", fmt(draft.eos()), fmt(target.eos())));
    }
    if draft.add_bos() != target.add_bos() {
        return bad(format!(
            "add-BOS flags differ: draft {} vs target {}",
            draft.add_bos(),
            target.add_bos()
        ));
    }
    if draft.add_eos() != target.add_eos() {
        return bad(format!(
            "add-EOS flags differ: draft {} vs target {}",
            draft.add_eos(),
            target.add_eos()
        ));
    }
    let (nd, nt) = (draft.vocab_size(), target.vocab_size());
    if nd.abs_diff(nt) > MAX_VOCAB_SIZE_DIFFERENCE {
        return bad(format!(
            "vocabulary sizes differ by more than {MAX_VOCAB_SIZE_DIFFERENCE}: draft {nd} vs target {nt}"
        ));
    }
    for id in CHECK_START_TOKEN_ID..nd.min(nt) {
        let (a, b) = (token_text(draft, id), token_text(target, id));
        if a != b {
            return bad(format!("token {id} differs: draft {a:?} vs target {b:?}"));
        }
    }
    Ok(())
}
