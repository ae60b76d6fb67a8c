//! Loading the target/draft pair, building prompts, and mapping tokens to text.

use anyhow::{Context, Result};
use treespec_core::TokenId;
use treespec_engine::TokenBytes;
use treespec_llama::{check_compatible, LlamaModel};
use treespec_text::{ChatMessage, ChatTemplate};

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

/// Tokenize `text` for `model`; with `chat`, render it as one user turn with the model's chat
/// template first (special tokens in the template are parsed, in user text they are not).
pub fn prompt_tokens(model: &LlamaModel, text: &str, chat: bool) -> Result<Vec<TokenId>> {
    if !chat {
        return Ok(model.tokenize(text, model.add_bos(), false)?);
    }
    let bos = model.bos().map(|t| model.token_text(t)).transpose()?.unwrap_or_default();
    let eos = model.eos().map(|t| model.token_text(t)).transpose()?.unwrap_or_default();
    let template = ChatTemplate::new(model.chat_template().as_deref(), &bos, &eos)?;
    let rendered = template.render(&[ChatMessage::new("user", text)], true)?;
    // Templates that print the BOS text themselves must not get a second BOS from the tokenizer.
    let add_bos = model.add_bos() && (bos.is_empty() || !rendered.starts_with(&bos));
    Ok(model.tokenize(&rendered, add_bos, true)?)
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
