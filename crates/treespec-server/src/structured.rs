//! Structured output fields (issue #14): `response_format` (`json_object`, `json_schema`) and
//! `tools` + `tool_choice`, checked without a model into an [`Output`]. The grammar is compiled
//! by the worker against the model's vocabulary (a schema llguidance refuses is a 400 there).
//!
//! * `response_format: {"type": "json_object"}` → any JSON object; `{"type": "json_schema",
//!   "json_schema": {"name", "schema", "strict"}}` → JSON valid for `schema` (enforced whether
//!   `strict` is set or not; OpenAI's strict-mode subset is not checked, llguidance's support
//!   decides).
//! * `tool_choice: "required"` or `{"type": "function", "function": {"name"}}` → the output is
//!   one call `{"name": .., "arguments": {..}}` (treespec-grammar's `tool_call_grammar`), which
//!   the routes turn into `message.tool_calls`. The tools are described to the model in a
//!   system message (the chat templates are rendered without tools).
//! * `tool_choice: "auto"` (the default with tools) and `"none"` leave the output free: plain
//!   text, and treespec does not parse free-form tool calls out of it (yet).
//!
//! A forced tool call wins over `response_format` (which is about `content`, null then).
//! History with `role: "tool"` messages or assistant `tool_calls` is refused by `validate`.

use serde_json::{json, Value};
use treespec_grammar::{tool_call_grammar, GrammarSpec, ToolChoice, ToolFunction};

use crate::api::CommonParams;
use crate::error::ApiError;
use crate::validate::Message;

/// What the output must look like.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Output {
    /// Free text.
    #[default]
    Text,
    /// Text following a grammar (`response_format`).
    Constrained(GrammarSpec),
    /// One tool call `{"name", "arguments"}`, following the tool-call grammar.
    ToolCall(GrammarSpec),
}

impl Output {
    /// The grammar to constrain decoding with, if any.
    pub fn grammar(&self) -> Option<&GrammarSpec> {
        match self {
            Output::Text => None,
            Output::Constrained(g) | Output::ToolCall(g) => Some(g),
        }
    }

    /// Whether the answer is a tool call (`message.tool_calls`, finish reason `tool_calls`).
    pub fn is_tool_call(&self) -> bool {
        matches!(self, Output::ToolCall(_))
    }

    /// The request field a grammar error is about.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            Output::Text => None,
            Output::Constrained(_) => Some("response_format"),
            Output::ToolCall(_) => Some("tools"),
        }
    }
}

/// The output format asked for, plus a system note describing the tools when a call is forced.
/// `chat`: only chat completions may ask for tool calls.
pub fn output(c: &CommonParams, chat: bool) -> Result<(Output, Option<String>), ApiError> {
    if let Some((grammar, note)) = tool_call(c, chat)? {
        return Ok((Output::ToolCall(grammar), Some(note)));
    }
    Ok((response_format(c.response_format.as_ref())?.map_or(Output::Text, Output::Constrained), None))
}

/// `response_format`: `text` (or absent) → None; `json_object`; `json_schema` with a schema.
pub fn response_format(v: Option<&Value>) -> Result<Option<GrammarSpec>, ApiError> {
    let bad = |m: &str| ApiError::invalid("response_format", m.to_string());
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(None) };
    let kind = v.get("type").and_then(Value::as_str).ok_or_else(|| {
        bad("`response_format` must be an object with a `type` (text, json_object, json_schema)")
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(GrammarSpec::JsonObject)),
        "json_schema" => {
            let js = v.get("json_schema").filter(|j| j.is_object()).ok_or_else(|| {
                bad("`response_format.json_schema` must be an object {\"name\", \"schema\", \"strict\"}")
            })?;
            if js.get("name").is_some_and(|n| !n.is_string()) {
                return Err(bad("`response_format.json_schema.name` must be a string"));
            }
            if js.get("strict").is_some_and(|s| !s.is_boolean() && !s.is_null()) {
                return Err(bad("`response_format.json_schema.strict` must be a boolean"));
            }
            match js.get("schema") {
                Some(s @ Value::Object(_)) => Ok(Some(GrammarSpec::JsonSchema(s.clone()))),
                None | Some(Value::Null) => Err(bad("`response_format.json_schema.schema` is required")),
                Some(_) => Err(bad("`response_format.json_schema.schema` must be a JSON Schema object")),
            }
        }
        other => {
            Err(bad(&format!("unknown response_format type '{other}' (text, json_object, json_schema)")))
        }
    }
}

/// `tools` + `tool_choice`: the tool-call grammar and the tools' description when a call is
/// forced; None when the output stays free (no tools, `auto`, `none`).
fn tool_call(c: &CommonParams, chat: bool) -> Result<Option<(GrammarSpec, String)>, ApiError> {
    let tools = match c.tools.as_ref().filter(|t| !t.is_null()) {
        None => Vec::new(),
        Some(t) => tools(t)?,
    };
    let choice = match c.tool_choice.as_ref().filter(|t| !t.is_null()) {
        None => ToolChoice::Auto,
        Some(v) => ToolChoice::from_openai(v).map_err(|e| ApiError::invalid("tool_choice", e.to_string()))?,
    };
    if tools.is_empty() && !matches!(choice, ToolChoice::None | ToolChoice::Auto) {
        return Err(ApiError::invalid("tool_choice", "`tool_choice` needs a non-empty `tools` list"));
    }
    let grammar =
        tool_call_grammar(&tools, &choice).map_err(|e| ApiError::invalid("tool_choice", e.to_string()))?;
    let Some(grammar) = grammar else { return Ok(None) };
    if !chat {
        return Err(ApiError::invalid("tools", "tool calls are only supported on /v1/chat/completions"));
    }
    Ok(Some((grammar, tools_note(c.tools.as_ref().unwrap_or(&Value::Null), &choice))))
}

/// Check an OpenAI `tools` array: function tools with OpenAI-style names and object schemas.
fn tools(v: &Value) -> Result<Vec<ToolFunction>, ApiError> {
    let bad = |m: String| ApiError::invalid("tools", m);
    let list = ToolFunction::from_openai_tools(v).map_err(|e| bad(e.to_string()))?;
    for (i, f) in list.iter().enumerate() {
        let ok_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        if f.name.len() > 64 || !f.name.chars().all(ok_char) {
            return Err(bad(format!(
                "tools[{i}].function.name {:?} must be 1-64 characters of a-z, A-Z, 0-9, _ and -",
                f.name
            )));
        }
        if !f.parameters.is_object() {
            return Err(bad(format!("tools[{i}].function.parameters must be a JSON Schema object")));
        }
    }
    Ok(list)
}

/// What the model is told about the tools when it must call one (the chat templates here
/// render no tools): their OpenAI declarations and the answer's shape.
fn tools_note(tools: &Value, choice: &ToolChoice) -> String {
    let which = match choice {
        ToolChoice::Function(name) => format!("the function `{name}`"),
        _ => "one of these functions".to_string(),
    };
    format!(
        "You have access to these functions:\n{tools}\nAnswer by calling {which}, as a JSON object \
         {example}.",
        tools = serde_json::to_string_pretty(tools).unwrap_or_default(),
        example = json!({"name": "<function name>", "arguments": {"<parameter>": "<value>"}}),
    )
}

/// Put `note` in front of the conversation: appended to a leading system message, or as a new
/// one.
pub fn add_system_note(messages: &mut Vec<Message>, note: String) {
    match messages.first_mut() {
        Some(m) if m.role == "system" => {
            m.content = if m.content.is_empty() { note } else { format!("{}\n\n{note}", m.content) };
        }
        _ => messages.insert(0, Message { role: "system".into(), content: note }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(v: Value) -> CommonParams {
        serde_json::from_value(v).unwrap()
    }

    fn out(v: Value) -> Result<Output, ApiError> {
        output(&params(v), true).map(|(o, _)| o)
    }

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
    }

    #[test]
    fn response_formats() {
        assert_eq!(out(json!({})).unwrap(), Output::Text);
        assert_eq!(out(json!({"response_format": {"type": "text"}})).unwrap(), Output::Text);
        assert_eq!(
            out(json!({"response_format": {"type": "json_object"}})).unwrap(),
            Output::Constrained(GrammarSpec::JsonObject)
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let o = out(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": schema, "strict": true}}}))
        .unwrap();
        assert_eq!(o, Output::Constrained(GrammarSpec::JsonSchema(schema)));
        assert_eq!(o.param(), Some("response_format"));
        for bad in [
            json!("json_object"),
            json!({"type": "yaml"}),
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"name": "x"}}),
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": "object"}}),
            json!({"type": "json_schema", "json_schema": {"name": 3, "schema": {}}}),
            json!({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}),
        ] {
            let e = out(json!({"response_format": bad})).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("response_format"), "{bad}: {e:?}");
        }
    }

    #[test]
    fn forced_tool_calls_get_a_grammar_and_a_note() {
        let (o, note) =
            output(&params(json!({"tools": weather(), "tool_choice": "required"})), true).unwrap();
        assert!(o.is_tool_call() && o.grammar().is_some());
        assert!(note.unwrap().contains("get_weather"));
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        assert!(out(json!({"tools": weather(), "tool_choice": named})).unwrap().is_tool_call());
        // A forced call wins over response_format.
        let o = out(json!({"tools": weather(), "tool_choice": "required",
            "response_format": {"type": "json_object"}}))
        .unwrap();
        assert!(o.is_tool_call());
        // auto / none / no choice: free text.
        for choice in [json!("auto"), json!("none"), Value::Null] {
            assert_eq!(out(json!({"tools": weather(), "tool_choice": choice})).unwrap(), Output::Text);
        }
        assert_eq!(out(json!({"tools": [], "tool_choice": "none"})).unwrap(), Output::Text);
        // Not on /v1/completions.
        let e = output(&params(json!({"tools": weather(), "tool_choice": "required"})), false).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools"));
    }

    #[test]
    fn bad_tools_and_choices() {
        let f = |name: Value, params: Value| json!([{"type": "function", "function": {"name": name, "parameters": params}}]);
        for (tools, choice, param) in [
            (json!([{"type": "function"}]), json!("required"), "tools"),
            (json!([{"type": "retrieval", "function": {"name": "a"}}]), json!("auto"), "tools"),
            (json!({"name": "a"}), json!("auto"), "tools"),
            (f(json!("has space"), json!({})), json!("auto"), "tools"),
            (f(json!("x".repeat(65)), json!({})), json!("auto"), "tools"),
            (f(json!("ok"), json!("object")), json!("auto"), "tools"),
            (weather(), json!("sometimes"), "tool_choice"),
            (weather(), json!({"type": "function"}), "tool_choice"),
            (weather(), json!({"type": "function", "function": {"name": "nope"}}), "tool_choice"),
            (json!([]), json!("required"), "tool_choice"),
        ] {
            let e = out(json!({"tools": tools, "tool_choice": choice})).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{tools} {choice}: {e:?}");
        }
        let e = out(json!({"tool_choice": "required"})).unwrap_err();
        assert!(e.message.contains("needs a non-empty `tools`"), "{}", e.message);
    }

    #[test]
    fn system_note_goes_first() {
        let m = |r: &str, c: &str| Message { role: r.into(), content: c.into() };
        let mut a = vec![m("user", "hi")];
        add_system_note(&mut a, "N".into());
        assert_eq!(a, vec![m("system", "N"), m("user", "hi")]);
        let mut b = vec![m("system", "be brief"), m("user", "hi")];
        add_system_note(&mut b, "N".into());
        assert_eq!(b[0], m("system", "be brief\n\nN"));
        assert_eq!(b.len(), 2);
    }
}
