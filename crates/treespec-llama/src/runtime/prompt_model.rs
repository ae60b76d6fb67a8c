//! The loaded target as request preparation sees it ([`PromptModel`]): treespec-request's one
//! preparation then serves the CLI, the benchmark and the server on llama.cpp's models.

use treespec_core::TokenId;
use treespec_request::{PrepareError, Prompt, PromptModel, TokenTable, VocabularyCache};
use treespec_text::ChatMessage;

use super::ModelRuntime;
use crate::load::LlamaModel;

impl PromptModel for ModelRuntime {
    fn prompt_tokens(&self, prompt: Prompt<'_>) -> treespec_engine::Result<Vec<TokenId>> {
        ModelRuntime::prompt_tokens(self, prompt)
    }

    fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> treespec_engine::Result<Vec<TokenId>> {
        self.target().tokenize(text, add_special, parse_special)
    }

    fn token_piece(&self, token: TokenId) -> treespec_engine::Result<Vec<u8>> {
        self.target().token_to_bytes(token, true)
    }

    fn prompt_text(&self, prompt: Prompt<'_>) -> Result<String, PrepareError> {
        let user;
        let (messages, tools) = match prompt {
            Prompt::Text(t) => return Ok(t.to_string()),
            Prompt::User(t) => {
                user = [ChatMessage::new("user", t)];
                (&user[..], None)
            }
            Prompt::Messages(m) => (m, None),
            Prompt::MessagesWithTools(m, tools) => (m, Some(tools)),
        };
        let template = self.chat_template().map_err(|e| PrepareError::Template(e.to_string()))?;
        template
            .render_with_tools(messages, true, tools)
            .map_err(|e| PrepareError::Template(format!("the chat template refused the messages: {e}")))
    }

    fn model_path(&self) -> String {
        self.paths().model.display().to_string()
    }

    fn chat_template_source(&self) -> Option<String> {
        ModelRuntime::chat_template_source(self)
    }

    fn renders_tools(&self) -> bool {
        self.chat_template().map(|t| t.renders_tools()).unwrap_or(false)
    }

    fn vocab_size(&self) -> usize {
        self.target().vocab_size()
    }

    fn eos_tokens(&self) -> &[TokenId] {
        ModelRuntime::eos_tokens(self)
    }

    fn has_draft(&self) -> bool {
        ModelRuntime::has_draft(self)
    }

    fn token_table(&self) -> Result<&TokenTable, PrepareError> {
        ModelRuntime::token_table(self).map_err(|e| PrepareError::Internal(format!("token table: {e}")))
    }

    fn vocabulary_cache(&self) -> &VocabularyCache {
        &self.grammar_vocabulary
    }
}

/// Every token's bytes read off a loaded model (≈0.1 s for 50k tokens; the runtime keeps it):
/// a token's plain text, or its special text for a control token.
pub fn read_token_table(model: &LlamaModel) -> treespec_engine::Result<TokenTable> {
    let n = model.vocab_size() as TokenId;
    let mut tokens = Vec::with_capacity(n as usize);
    let mut special = Vec::new();
    for t in 0..n {
        let plain = model.token_to_bytes(t, false)?;
        if plain.is_empty() {
            let text = model.token_to_bytes(t, true)?;
            if !text.is_empty() {
                special.push(t);
            }
            tokens.push(text);
        } else {
            tokens.push(plain);
        }
    }
    let eos = (0..n).filter(|&t| model.is_eog(t)).collect();
    Ok(TokenTable { tokens, eos, special })
}
