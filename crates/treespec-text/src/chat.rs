//! Chat templates: the Jinja template a GGUF file carries (`tokenizer.chat_template`), rendered
//! with minijinja the way Hugging Face transformers renders it (trim_blocks, lstrip_blocks,
//! Python-style string methods, `raise_exception`, `strftime_now`, `tojson` as `json.dumps`,
//! mappings in the order they were given).

use minijinja::{context, Environment, Error as JinjaError, ErrorKind};
use serde::Serialize;
use thiserror::Error;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` (or `tool`).
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

/// Template problems, reported with the template's own words where it raised them.
#[derive(Debug, Error)]
pub enum TemplateError {
    /// The model file has no chat template.
    #[error("this model has no chat template (tokenizer.chat_template is missing): give one with --chat-template NAME|JINJA or --chat-template-file FILE, or send a plain prompt (/v1/completions, /completion; `generate` without --chat)")]
    Missing,
    /// The template does not parse.
    #[error("the model's chat template does not parse: {0}")]
    Parse(String),
    /// Rendering failed (including the template's own raise_exception).
    #[error("rendering the chat template failed: {0}")]
    Render(String),
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    /// The template reads a `tools` variable (Qwen2.5's, Llama 3.1's, …).
    renders_tools: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bos", &self.bos).field("eos", &self.eos).finish()
    }
}

impl ChatTemplate {
    /// Compile `source` (None → [`TemplateError::Missing`]). `bos`/`eos` are the texts of the
    /// model's special tokens, which templates reference as `bos_token`/`eos_token`.
    pub fn new(source: Option<&str>, bos: &str, eos: &str) -> Result<Self, TemplateError> {
        let source = source.ok_or(TemplateError::Missing)?;
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // Python's json.dumps, as the templates' authors render them (see `tojson`).
        env.add_filter("tojson", crate::tojson::tojson);
        env.add_function("raise_exception", |msg: String| -> Result<String, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| -> Result<String, JinjaError> {
            Ok(format_now(&fmt))
        });
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| TemplateError::Parse(e.to_string()))?;
        let renders_tools = source.contains("tools");
        Ok(Self { env, bos: bos.to_string(), eos: eos.to_string(), renders_tools })
    }

    /// Whether the template describes tools itself (it reads a `tools` variable).
    pub fn renders_tools(&self) -> bool {
        self.renders_tools
    }

    /// Render `messages`; with `add_generation_prompt` the text ends where the assistant's reply
    /// starts.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        self.render_with_tools(messages, add_generation_prompt, None)
    }

    /// [`render`](Self::render) with OpenAI-style `tools` declarations passed to the template
    /// as its `tools` variable.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let tmpl = self.env.get_template("chat").map_err(|e| TemplateError::Parse(e.to_string()))?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos,
            eos_token => self.eos,
            tools => tools,
        })
        .map_err(|e| TemplateError::Render(render_error(&e)))
    }
}

fn render_error(e: &JinjaError) -> String {
    match e.detail() {
        Some(d) => d.to_string(),
        None => e.to_string(),
    }
}

/// `strftime_now` for templates that print today's date (Llama 3 style). Supports the common
/// `%d %b %Y`-like codes through a tiny civil-date conversion of the system clock (UTC).
fn format_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let days = secs.div_euclid(86_400);
    // Howard Hinnant's days-from-civil inverse.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + (month <= 2) as i64;
    const MONTHS: [&str; 12] =
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    const LONG: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let m = (month - 1) as usize;
    fmt.replace("%d", &format!("{day:02}"))
        .replace("%m", &format!("{month:02}"))
        .replace("%Y", &year.to_string())
        .replace("%b", MONTHS[m])
        .replace("%B", LONG[m])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_broken_templates_are_errors() {
        assert!(matches!(ChatTemplate::new(None, "", ""), Err(TemplateError::Missing)));
        assert!(matches!(ChatTemplate::new(Some("{% for %}"), "", ""), Err(TemplateError::Parse(_))));
        let t = ChatTemplate::new(Some("{{ raise_exception('no system role') }}"), "", "").unwrap();
        let err = t.render(&[], true).unwrap_err().to_string();
        assert!(err.contains("no system role"), "{err}");
    }

    #[test]
    fn strftime_now_formats_a_date() {
        let s = format_now("%d %b %Y");
        assert_eq!(s.len(), 11, "{s}");
    }
}
