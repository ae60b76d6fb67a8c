//! The model pair behind a runtime: the target, and a draft that is either its own file or the
//! target's weights (two contexts, one copy of the weights), plus what prompts and token text
//! need from the target's vocabulary.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use treespec_core::TokenId;
use treespec_engine::TokenBytes;

use crate::compat::check_compatible;
use crate::load::{LlamaModel, LoadOptions};

/// Which files to load: the target, and the draft if any (it may be the target file itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelPaths {
    /// Target GGUF.
    pub model: PathBuf,
    /// Draft GGUF; the target's weights are shared when it is the same file.
    pub draft: Option<PathBuf>,
}

impl ModelPaths {
    /// The target `model` with an optional `draft`.
    pub fn new(model: impl Into<PathBuf>, draft: Option<PathBuf>) -> Self {
        Self { model: model.into(), draft }
    }
}

/// The loaded files.
#[derive(Debug)]
pub(crate) struct ModelPair {
    pub(crate) target: LlamaModel,
    /// A separately loaded draft (None when absent or the same file as the target).
    separate_draft: Option<LlamaModel>,
    /// Whether a draft was given at all.
    has_draft: bool,
}

impl ModelPair {
    /// Load the target, and the draft unless it is the target file, checking that it can draft
    /// for the target (same tokenizer).
    pub(crate) fn load(paths: &ModelPaths, options: &LoadOptions) -> Result<Self> {
        let target = LlamaModel::load(&paths.model, options.clone())
            .with_context(|| format!("loading target model {}", paths.model.display()))?;
        let mut separate_draft = None;
        if let Some(path) = &paths.draft {
            if !same_file(path, &paths.model) {
                let d = LlamaModel::load(path, options.for_draft())
                    .with_context(|| format!("loading draft model {}", path.display()))?;
                check_compatible(&d, &target)?;
                separate_draft = Some(d);
            }
        }
        Ok(Self { target, separate_draft, has_draft: paths.draft.is_some() })
    }

    /// The draft model: the target itself when the draft is the same file.
    pub(crate) fn draft(&self) -> Option<&LlamaModel> {
        self.has_draft.then(|| self.separate_draft.as_ref().unwrap_or(&self.target))
    }

    /// Whether a draft was given and it is the target's own weights.
    pub(crate) fn draft_is_target(&self) -> bool {
        self.has_draft && self.separate_draft.is_none()
    }
}

/// End-of-generation tokens of `model` (EOS and end-of-turn, deduplicated).
pub(crate) fn eos_tokens(model: &LlamaModel) -> Vec<TokenId> {
    let mut v: Vec<TokenId> = [model.eos(), model.eot()].into_iter().flatten().collect();
    v.dedup();
    v
}

/// Whether two paths name the same file (a symlink or a relative path counts as the same file).
pub(crate) fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// Token → bytes through the model's vocabulary (special tokens render as nothing).
#[derive(Debug, Clone, Copy)]
pub struct ModelBytes<'a>(pub &'a LlamaModel);

impl TokenBytes for ModelBytes<'_> {
    fn token_bytes(&self, token: TokenId) -> Vec<u8> {
        self.0.token_to_bytes(token, false).unwrap_or_default()
    }
}
