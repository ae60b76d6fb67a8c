//! The llama.cpp models behind the benchmark runner's `Backend` seam, and `--dump-prompts`.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;
use treespec_bench::{Backend, Prompt, Session};
use treespec_core::TokenId;
use treespec_engine::{CausalLm, Method, StopConditions, TokenConstraint};
use treespec_grammar::GrammarSpec;
use treespec_llama::runtime::{Prompt as PromptText, RequestPrompt};
use treespec_llama::{LlamaLm, ModelRuntime};

/// `--dump-prompts`: each prompt's tokens as the benchmark builds them, spelled back to text with
/// the special tokens written out, so that another tool tokenizing it (special tokens parsed)
/// decodes after the same prompt.
pub fn dump_prompts(models: &ModelRuntime, prompts: &[Prompt], chat: bool, path: &Path) -> Result<()> {
    let mut out = String::new();
    for p in prompts {
        let mut bytes = Vec::new();
        for t in models.prompt_tokens(PromptText::text_or_user(&p.text, chat))? {
            bytes.extend(models.target().token_to_bytes(t, true)?);
        }
        let text = String::from_utf8_lossy(&bytes);
        let mut line = json!({ "id": p.id, "category": p.category, "text": text });
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
/// Each part of a request is prepared by the runtime's request preparation (prompt tokens,
/// grammar, the method's draft-model check), as for `generate` and the server.
pub struct LlamaBackend<'m> {
    models: &'m ModelRuntime,
    target: LlamaLm<'m>,
    draft: Option<LlamaLm<'m>>,
    chat: bool,
}

impl<'m> LlamaBackend<'m> {
    pub fn new(models: &'m ModelRuntime, chat: bool) -> Result<Self> {
        let target = models.target().new_lm()?;
        let draft = models.draft().map(|d| d.new_lm()).transpose()?;
        Ok(Self { models, target, draft, chat })
    }
}

impl Backend for LlamaBackend<'_> {
    fn prompt_tokens(&mut self, prompt: &Prompt) -> Result<Vec<TokenId>> {
        let text = RequestPrompt::Formatted(PromptText::text_or_user(&prompt.text, self.chat));
        Ok(self.models.request_tokens(text)?)
    }
    fn context_size(&self) -> usize {
        self.target.context_size()
    }
    fn stop(&self) -> StopConditions {
        StopConditions { eos: self.models.eos_tokens().to_vec(), stop_strings: Vec::new() }
    }
    fn session(&mut self, method: &Method) -> Result<Session<'_>> {
        // `auto` uses a draft model when one is given and does without otherwise.
        self.models.check_method(method)?;
        let drafter = method.build(self.draft.as_mut().filter(|_| method.uses_draft()))?;
        Ok(Session { target: Box::new(&mut self.target), drafter })
    }
    fn constraint(&mut self, prompt: &Prompt) -> Result<Option<Box<dyn TokenConstraint>>> {
        let Some(schema) = &prompt.schema else { return Ok(None) };
        let grammar = self
            .models
            .compile_grammar(&GrammarSpec::JsonSchema(schema.clone()))
            .with_context(|| format!("the schema of prompt {}", prompt.id))?;
        Ok(Some(Box::new(grammar)))
    }
}
