//! Loading the target/draft pair, building prompts, and mapping tokens to text.

use anyhow::{Context, Result};
use treespec_core::TokenId;
use treespec_engine::TokenBytes;
use treespec_llama::{check_compatible, LlamaModel};
use treespec_text::ChatMessage;

use super::args::ModelArgs;

/// The loaded models. The draft is `None` when not asked for, and shares the target's weights
/// when it is the same file (two contexts, one copy of the weights).
pub struct Models {
    /// The target.
    pub target: LlamaModel,
    /// A separately loaded draft (None when absent or the same file as the target).
    draft: Option<LlamaModel>,
    /// Whether a draft was given.
    has_draft: bool,
}

impl Models {
    /// Load the models named by `args`, checking that the draft can draft for the target.
    pub fn load(args: &ModelArgs) -> Result<Self> {
        let opts = args.load_options();
        let target = LlamaModel::load(&args.model, opts.clone())
            .with_context(|| format!("loading target model {}", args.model.display()))?;
        let mut draft = None;
        if let Some(path) = &args.draft {
            if !same_file(path, &args.model) {
                let d = LlamaModel::load(path, opts)
                    .with_context(|| format!("loading draft model {}", path.display()))?;
                check_compatible(&d, &target)?;
                draft = Some(d);
            }
        }
        Ok(Self { target, draft, has_draft: args.draft.is_some() })
    }

    /// The draft model, if one was given.
    pub fn draft(&self) -> Option<&LlamaModel> {
        if !self.has_draft {
            return None;
        }
        Some(self.draft.as_ref().unwrap_or(&self.target))
    }

    /// End-of-generation tokens of the target.
    pub fn eos_tokens(&self) -> Vec<TokenId> {
        let mut v: Vec<TokenId> = [self.target.eos(), self.target.eot()].into_iter().flatten().collect();
        v.dedup();
        v
    }

    /// Tokenize a prompt: with `chat`, as one user turn through the model's chat template.
    pub fn prompt_tokens(&self, text: &str, chat: bool) -> Result<Vec<TokenId>> {
        prompt_tokens(&self.target, text, chat)
    }
}

/// Tokenize `text` for `model`; with `chat`, as one user turn through the model's chat template
/// (special tokens in the template are parsed, in user text they are not: see
/// `LlamaModel::chat_prompt`).
pub fn prompt_tokens(model: &LlamaModel, text: &str, chat: bool) -> Result<Vec<TokenId>> {
    if !chat {
        return Ok(model.text_prompt(text)?);
    }
    let template = model.compiled_chat_template()?;
    Ok(model.chat_prompt(&template, &[ChatMessage::new("user", text)])?)
}

fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// Token → bytes through the model's vocabulary (special tokens render as nothing).
pub struct ModelBytes<'a>(pub &'a LlamaModel);

impl TokenBytes for ModelBytes<'_> {
    fn token_bytes(&self, token: TokenId) -> Vec<u8> {
        self.0.token_to_bytes(token, false).unwrap_or_default()
    }
}
