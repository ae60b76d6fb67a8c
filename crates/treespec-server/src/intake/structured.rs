//! Structured output fields (issue #14): `response_format` (`json_object`, `json_schema`) and
//! `tools` + `tool_choice`, checked without a model into an [`Output`]: every schema and the
//! call grammar are compiled here against a byte vocabulary (a schema that cannot work is a 400
//! naming its field before anything is sent), then again by the worker against the model's
//! vocabulary (a failure there is a 400 too, before `Started`).
//!
//! * `response_format: {"type": "json_object"}` → any JSON object; `{"type": "json_schema",
//!   "json_schema": {"name", "schema", "strict"}}` → JSON valid for `schema` (enforced whether
//!   `strict` is set or not; OpenAI's strict-mode subset is not checked, llguidance's support
//!   decides).
//! * `tool_choice: "required"` or `{"type": "function", "function": {"name"}}` → the output is
//!   one call `{"name": .., "arguments": {..}}` (treespec-grammar's `tool_call_grammar`), which
//!   the routes turn into `message.tool_calls`. The tools are described to the model in a
//!   system message (the chat templates are rendered without tools).
//! * `tool_choice: "auto"` (the default with tools): the tools are described in the same system
//!   message, the output stays free, and an answer that is one call — `{"name", "arguments"}`
//!   with a declared name, also inside a ```json fence or `<tool_call>` tags — becomes
//!   `message.tool_calls` (see [`auto_call`]). While a streamed answer may still turn out to be a
//!   call (it starts with `{`, a fence or a tag) it is held back. `"none"`: plain text, no tools.
//!
//! A forced tool call wins over `response_format` (which is about `content`, null then).
//! In the history, an assistant's `tool_calls` become its content in the same `{"name",
//! "arguments"}` shape, and `role: "tool"` results keep the template's own `tool` role
//! (`validate`).

use serde_json::{json, Value};
use treespec_grammar::{tool_call_grammar, GrammarError, GrammarSpec, ToolChoice, ToolFunction};

use crate::api::CommonParams;
use crate::error::ApiError;
use crate::intake::prompt::Message;

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
    /// Free text that may be one call of these tools (`tool_choice: "auto"`); a call the model
    /// opens itself (a `<tool_call>` tag, or a ```` ```json ```` fence starting the answer)
    /// follows the call grammar to its close (treespec-llama's `tagged_calls`).
    ToolAuto(Vec<ToolFunction>),
}

impl Output {
    /// The grammar to constrain decoding with, if any.
    pub fn grammar(&self) -> Option<&GrammarSpec> {
        match self {
            Output::Text | Output::ToolAuto(_) => None,
            Output::Constrained(g) | Output::ToolCall(g) => Some(g),
        }
    }

    /// Whether the answer is a tool call (`message.tool_calls`, finish reason `tool_calls`).
    pub fn is_tool_call(&self) -> bool {
        matches!(self, Output::ToolCall(_))
    }

    /// The tools a free answer may call (`tool_choice: "auto"`).
    pub fn auto_tools(&self) -> Option<&[ToolFunction]> {
        match self {
            Output::ToolAuto(tools) => Some(tools),
            _ => None,
        }
    }

    /// The request field a grammar error is about.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            Output::Text => None,
            Output::Constrained(_) => Some("response_format"),
            Output::ToolCall(_) | Output::ToolAuto(_) => Some("tools"),
        }
    }
}

/// The output format asked for, plus a system note describing the tools when a call is forced
/// or may be made (`tool_choice: "auto"`).
/// `chat`: only chat completions may ask for tool calls.
///
/// Every schema is compiled here (treespec-grammar's check, against a byte vocabulary), before
/// anything is sent: a schema that cannot work is a 400 naming its field
/// (`response_format`, `tools[i].function.parameters`, or `tools` for the combined call
/// grammar), never an error in the middle of a response.
pub fn output(c: &CommonParams, chat: bool) -> Result<(Output, Option<String>), ApiError> {
    let declared = match c.tools.as_ref().filter(|t| !t.is_null()) {
        None => None,
        Some(t) => Some(tools(t)?),
    };
    if let Some((grammar, note)) = tool_call(c, declared.as_deref().unwrap_or_default(), chat)? {
        return Ok((Output::ToolCall(grammar), Some(note)));
    }
    if let Some(g) = response_format(c.response_format.as_ref())? {
        return Ok((Output::Constrained(g), None));
    }
    Ok(match auto_tools(c, declared, chat)? {
        Some((tools, note)) => (Output::ToolAuto(tools), Some(note)),
        None => (Output::Text, None),
    })
}

/// A grammar error as a 400 about `param`: one sentence, no parser internals (treespec-grammar
/// keeps its messages to that).
fn grammar_error(param: String, e: GrammarError) -> ApiError {
    ApiError { param: Some(param), ..ApiError::invalid(None, e.to_string()) }
}

/// `tools` with `tool_choice` `auto` (or absent) on a chat request: the tools a free answer may
/// call and their description.
fn auto_tools(
    c: &CommonParams,
    list: Option<Vec<ToolFunction>>,
    chat: bool,
) -> Result<Option<(Vec<ToolFunction>, String)>, ApiError> {
    let (Some(declared), Some(list)) = (c.tools.as_ref(), list) else { return Ok(None) };
    let auto = match c.tool_choice.as_ref().filter(|t| !t.is_null()) {
        None => true,
        Some(v) => matches!(
            ToolChoice::from_openai(v).map_err(|e| ApiError::invalid("tool_choice", e.to_string()))?,
            ToolChoice::Auto
        ),
    };
    if list.is_empty() || !auto || !chat {
        return Ok(None);
    }
    let note = format!(
        "You have access to these functions:\n{tools}\nIf calling one of them is the best answer, \
         answer with only a JSON object {example} and nothing else; otherwise answer normally.",
        tools = serde_json::to_string_pretty(declared).unwrap_or_default(),
        example = json!({"name": "<function name>", "arguments": {"<parameter>": "<value>"}}),
    );
    Ok(Some((list, note)))
}

/// The call a free answer makes, if it is exactly one call of a declared tool: a JSON object
/// `{"name", "arguments"}` (arguments an object, or a string holding one), alone or inside a
/// ```json fence or `<tool_call>` tags. Returns it as the canonical JSON the forced-call reader
/// takes.
pub fn auto_call(text: &str, names: &[String]) -> Option<String> {
    let mut t = text.trim();
    for (open, close) in [("<tool_call>", "</tool_call>"), ("```json", "```"), ("```", "```")] {
        if let Some(inner) = t.strip_prefix(open).and_then(|r| r.strip_suffix(close)) {
            t = inner.trim();
            break;
        }
    }
    let v: Value = serde_json::from_str(t).ok()?;
    let o = v.as_object()?;
    let name = o.get("name")?.as_str()?;
    if !names.iter().any(|n| n == name) || o.len() != 2 {
        return None;
    }
    let args = match o.get("arguments")? {
        Value::String(s) => serde_json::from_str::<Value>(s).ok()?,
        a => a.clone(),
    };
    args.is_object().then(|| json!({"name": name, "arguments": args}).to_string())
}

/// Whether a streamed free answer beginning with `text` may still turn out to be a call (what
/// [`auto_call`] takes): it is held back while it may. A fence of another language (```` ```python ````)
/// or tags followed by anything but JSON is released at once, so that code answers stream.
pub fn may_be_call(text: &str) -> bool {
    let t = text.trim_start();
    // What follows an opening: empty so far, or a JSON object.
    let json_or_nothing = |rest: &str| {
        let r = rest.trim_start();
        r.is_empty() || r.starts_with('{')
    };
    if t.starts_with('{') || "```".starts_with(t) || "<tool_call>".starts_with(t) {
        return true;
    }
    if let Some(rest) = t.strip_prefix("<tool_call>") {
        return json_or_nothing(rest);
    }
    let Some(rest) = t.strip_prefix("```") else { return false };
    match rest.split_once('\n') {
        // The info string is still being written.
        None => "json".starts_with(rest.trim_end()) || rest.trim_start().starts_with('{'),
        Some((info, body)) => matches!(info.trim(), "" | "json") && json_or_nothing(body),
    }
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
                Some(s @ Value::Object(_)) => {
                    let spec = GrammarSpec::JsonSchema(s.clone());
                    spec.check().map_err(|e| grammar_error("response_format".into(), e))?;
                    Ok(Some(spec))
                }
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
fn tool_call(
    c: &CommonParams,
    tools: &[ToolFunction],
    chat: bool,
) -> Result<Option<(GrammarSpec, String)>, ApiError> {
    let choice = match c.tool_choice.as_ref().filter(|t| !t.is_null()) {
        None => ToolChoice::Auto,
        Some(v) => ToolChoice::from_openai(v).map_err(|e| ApiError::invalid("tool_choice", e.to_string()))?,
    };
    if tools.is_empty() && !matches!(choice, ToolChoice::None | ToolChoice::Auto) {
        return Err(ApiError::invalid("tool_choice", "`tool_choice` needs a non-empty `tools` list"));
    }
    let grammar =
        tool_call_grammar(tools, &choice).map_err(|e| ApiError::invalid("tool_choice", e.to_string()))?;
    let Some(grammar) = grammar else { return Ok(None) };
    if !chat {
        return Err(ApiError::invalid("tools", "tool calls are only supported on /v1/chat/completions"));
    }
    // Each tool's parameters compiled (in `tools`); now the call grammar joining them.
    grammar.check().map_err(|e| grammar_error("tools".into(), e))?;
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
        // Compiled on their own, so that their local `$ref`s mean what they mean in
        // `response_format` (the call grammar keeps that meaning: treespec-grammar's tools).
        GrammarSpec::JsonSchema(f.parameters.clone())
            .check()
            .map_err(|e| grammar_error(format!("tools[{i}].function.parameters"), e))?;
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
    fn a_free_answer_is_a_call_only_when_it_is_exactly_one_declared_call() {
        let names = vec!["get_weather".to_string()];
        let call = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        let canonical = Some(r#"{"name":"get_weather","arguments":{"city":"Paris"}}"#.to_string());
        let parse =
            |t: &str| auto_call(t, &names).map(|c| serde_json::from_str::<Value>(&c).unwrap().to_string());
        assert_eq!(parse(call), canonical);
        assert_eq!(parse(&format!("  ```json\n{call}\n```  ")), canonical);
        assert_eq!(parse(&format!("<tool_call>\n{call}\n</tool_call>")), canonical);
        let as_string = r#"{"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}"#;
        assert_eq!(parse(as_string), canonical);
        for not_a_call in [
            "The weather is nice.",
            r#"{"name": "other", "arguments": {}}"#,
            r#"{"name": "get_weather", "arguments": [1]}"#,
            r#"{"name": "get_weather", "arguments": {}, "extra": 1}"#,
            r#"Sure: {"name": "get_weather", "arguments": {}}"#,
        ] {
            assert_eq!(auto_call(not_a_call, &names), None, "{not_a_call}");
        }
        for open in ["", "  ", "{", "`", "``", "```json\n{", "<tool", "<tool_call>{"] {
            assert!(may_be_call(open), "{open:?}");
        }
        for open in ["```js", "```\n", "```json", "```json\n", "<tool_call>\n", "```{"] {
            assert!(may_be_call(open), "{open:?}");
        }
        for text in ["The", "<b>", "`x`", "Sure", "```python", "```python\ndef", "```\nx = 1", "<tool_call>x"]
        {
            assert!(!may_be_call(text), "{text:?}");
        }
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
        // auto / no choice: free text that may be a call; none: free text.
        for choice in [json!("auto"), Value::Null] {
            let o = out(json!({"tools": weather(), "tool_choice": choice})).unwrap();
            assert_eq!(o.auto_tools().map(|n| n.len()), Some(1), "{o:?}");
        }
        assert_eq!(out(json!({"tools": weather(), "tool_choice": "none"})).unwrap(), Output::Text);
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

    /// Schemas that compile but cannot work, or would not compile against any vocabulary, are
    /// 400s naming the field, with one sentence and no parser internals.
    #[test]
    fn every_schema_is_compiled_during_validation() {
        let rf =
            |schema: Value| json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
        let tool = |parameters: Value| {
            json!([{"type": "function", "function": {"name": "f", "parameters": parameters}},
                {"type": "function", "function": {"name": "g"}}])
        };
        let cycle =
            json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}});
        for (body, param) in [
            (json!({"response_format": rf(json!({"$ref": "#"}))}), "response_format"),
            (json!({"response_format": rf(cycle.clone())}), "response_format"),
            (json!({"response_format": rf(json!({"type": "strnig"}))}), "response_format"),
            (
                json!({"tools": tool(json!({"$ref": "#"})), "tool_choice": "required"}),
                "tools[0].function.parameters",
            ),
            // Declared tools are checked whatever the choice.
            (json!({"tools": tool(cycle), "tool_choice": "auto"}), "tools[0].function.parameters"),
            (
                json!({"tools": tool(json!({"type": "object", "properties": {"c": {"$ref": "#/$defs/nope"}}}))}),
                "tools[0].function.parameters",
            ),
        ] {
            let e = out(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
            assert!(!e.message.contains("NoExtensionBias") && !e.message.contains('\n'), "{}", e.message);
        }
        // Local refs of a tool's parameters resolve against them, as in response_format.
        let city = json!({"type": "object", "properties": {"city": {"$ref": "#/$defs/city"}}, "required": ["city"],
            "$defs": {"city": {"type": "string"}}});
        assert!(out(json!({"response_format": rf(city.clone())})).is_ok());
        assert!(out(json!({"tools": tool(city), "tool_choice": "required"})).unwrap().is_tool_call());
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
