//! The llama.cpp models behind the benchmark runner's `Backend` seam, and `--dump-prompts`.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;
use treespec_bench::{Backend, Prompt, Session};
use treespec_core::TokenId;
use treespec_engine::CausalLm;
use treespec_llama::{LlamaLm, ModelRuntime};
use treespec_request::{
    prepare, request_tokens, GenerationAsk, PrepareError, Prompt as PromptText, RequestPrompt,
};

/// `--dump-prompts`: each prompt's tokens as the benchmark builds them, spelled back to text with
/// the special tokens written out, so that another tool tokenizing it (special tokens parsed)
/// decodes after the same prompt; with their count (`prompt_tokens`), which the side-by-side runs
/// check the other tool read as well.
pub fn dump_prompts(models: &ModelRuntime, prompts: &[Prompt], chat: bool, path: &Path) -> Result<()> {
    let mut out = String::new();
    for p in prompts {
        let mut bytes = Vec::new();
        let tokens = models.prompt_tokens(PromptText::text_or_user(&p.text, chat))?;
        for &t in &tokens {
            bytes.extend(models.target().token_to_bytes(t, true)?);
        }
        let text = String::from_utf8_lossy(&bytes);
        let mut line =
            json!({ "id": p.id, "category": p.category, "text": text, "prompt_tokens": tokens.len() });
        if let Some(schema) = &p.schema {
            line["schema"] = schema.clone();
        }
        out.push_str(&line.to_string());
        out.push('\n');
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("[bench] wrote {} chat-formatted prompts to {}", prompts.len(), path.display());
    Ok(())
}

/// The llama.cpp models behind the runner's seam: one target context and one draft context,
/// made once and reused by every run (`generate` and the drafters truncate them at the start).
/// Each run is prepared by treespec-request's one preparation (prompt tokens, room, stops, the
/// method's drafter and draft-model check, the schema's grammar), as for `generate` and the
/// server.
pub struct LlamaBackend<'m> {
    models: &'m ModelRuntime,
    target: LlamaLm<'m>,
    draft: Option<LlamaLm<'m>>,
    chat: bool,
}

impl<'m> LlamaBackend<'m> {
    pub fn new(models: &'m ModelRuntime, chat: bool) -> Result<Self> {
        let mut target = models.target().new_lm()?;
        if let Some(buckets) = models.shape_padding() {
            target.pad_shapes(Some(&buckets));
        }
        let draft = models.draft().map(|d| d.new_lm()).transpose()?;
        Ok(Self { models, target, draft, chat })
    }
}

impl Backend for LlamaBackend<'_> {
    fn prompt_tokens(&mut self, prompt: &Prompt) -> Result<Vec<TokenId>> {
        let text = RequestPrompt::Formatted(PromptText::text_or_user(&prompt.text, self.chat));
        Ok(request_tokens(self.models, text)?)
    }
    fn context_size(&self) -> usize {
        self.target.context_size()
    }
    fn session(&mut self, spec: &GenerationAsk<'_>) -> Result<Session<'_>> {
        // `auto` uses a draft model when one is given and does without otherwise.
        let prepared = prepare(self.models, spec, self.draft.as_mut()).map_err(|e| match e {
            PrepareError::Grammar(g) => anyhow::Error::new(g).context("compiling the prompt's schema"),
            e => e.into(),
        })?;
        Ok(Session { target: Box::new(&mut self.target), prepared })
    }
}
