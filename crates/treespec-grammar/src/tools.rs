//! The tool-call grammar for OpenAI `tools` + `tool_choice`.
//!
//! A forced tool call is one JSON object,
//!
//! ```text
//! {"name": "<one of the function names>", "arguments": <an object valid for that function's parameters>}
//! ```
//!
//! with `name` first and no other keys. `arguments` is the JSON object itself, not the
//! JSON-encoded string OpenAI's wire format carries in `tool_calls[].function.arguments`; the
//! server re-encodes it (and wraps it in its chat-template envelope, if one is decided on
//! later). Parallel calls are not covered: one call per response.

use serde_json::{json, Map, Value};

use crate::{schema_check, GrammarError, GrammarSpec, TokenId};

/// One callable function of an OpenAI `tools` array.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolFunction {
    /// `function.name`.
    pub name: String,
    /// `function.parameters`, a JSON schema for the arguments object. A tool without
    /// parameters takes exactly `{}` (an object with no properties and no extra keys).
    pub parameters: Value,
}

/// OpenAI `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// `"none"`: plain text, no call.
    None,
    /// `"auto"`: the model chooses between text and a call; not grammar-constrained here.
    Auto,
    /// `"required"`: some call, to any of the tools.
    Required,
    /// `{"type": "function", "function": {"name": ...}}`: a call to this function.
    Function(String),
}

impl ToolFunction {
    /// Read an OpenAI `tools` array: `[{"type": "function", "function": {"name", "parameters"}}]`.
    /// Errors on anything else, on missing or duplicate names.
    pub fn from_openai_tools(tools: &Value) -> Result<Vec<ToolFunction>, GrammarError> {
        let bad = |m: String| GrammarError::BadTools(m);
        let list = tools.as_array().ok_or_else(|| bad("`tools` must be an array".into()))?;
        let mut out: Vec<ToolFunction> = Vec::with_capacity(list.len());
        for (i, tool) in list.iter().enumerate() {
            if tool.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad(format!("tools[{i}]: only {{\"type\": \"function\"}} tools are supported")));
            }
            let function = tool.get("function").ok_or_else(|| bad(format!("tools[{i}]: no `function`")))?;
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| bad(format!("tools[{i}].function: no `name`")))?;
            if out.iter().any(|f| f.name == name) {
                return Err(bad(format!("tools[{i}]: duplicate function name {name:?}")));
            }
            let parameters = function.get("parameters").cloned().unwrap_or_else(no_parameters);
            out.push(ToolFunction { name: name.to_string(), parameters });
        }
        Ok(out)
    }
}

/// The schema of a function that takes no arguments: `{}` only.
fn no_parameters() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": false})
}

impl ToolChoice {
    /// Read an OpenAI `tool_choice` value (`"none"`, `"auto"`, `"required"` or a named
    /// function).
    pub fn from_openai(choice: &Value) -> Result<ToolChoice, GrammarError> {
        match choice {
            Value::String(s) if s == "none" => Ok(ToolChoice::None),
            Value::String(s) if s == "auto" => Ok(ToolChoice::Auto),
            Value::String(s) if s == "required" => Ok(ToolChoice::Required),
            Value::Object(o) => o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .map(|n| ToolChoice::Function(n.to_string()))
                .ok_or_else(|| GrammarError::BadTools("`tool_choice` object needs function.name".into())),
            other => Err(GrammarError::BadTools(format!("unknown `tool_choice` {other}"))),
        }
    }
}

/// The schema of one call to `f` (the `i`-th tool): `name` fixed to its name, `arguments` its
/// parameters.
///
/// The parameters sit inside this wrapper, but their local `$ref`s (`#`, `#/$defs/city`) mean
/// the parameters schema itself, as they do in `response_format`: so the parameters become a
/// resource of their own, with an `$id` (unless they have one), against which JSON Schema
/// resolves the references inside them.
fn call_schema(f: &ToolFunction, i: usize) -> Value {
    let mut parameters = f.parameters.clone();
    if let Value::Object(p) = &mut parameters {
        if !p.contains_key("$id") {
            p.insert("$id".into(), json!(format!("urn:treespec:tools:{i}")));
        }
    }
    let mut properties = Map::new();
    properties.insert("name".into(), json!({"const": f.name}));
    properties.insert("arguments".into(), parameters);
    json!({
        "type": "object",
        "properties": properties,
        "required": ["name", "arguments"],
        "additionalProperties": false,
    })
}

/// The grammar a tool call must follow, or `None` where `tool_choice` leaves the output free
/// (`none`, `auto`). `Required` allows a call to any tool (`anyOf` of the calls: once the name
/// is written, only that function's arguments are allowed); a named function fixes the whole
/// `{"name": "f", "arguments": ` prefix, which then comes out as forced tokens.
pub fn tool_call_grammar(
    tools: &[ToolFunction],
    choice: &ToolChoice,
) -> Result<Option<GrammarSpec>, GrammarError> {
    let calls: Vec<Value> = match choice {
        ToolChoice::None | ToolChoice::Auto => return Ok(None),
        ToolChoice::Required => tools.iter().enumerate().map(|(i, f)| call_schema(f, i)).collect(),
        ToolChoice::Function(name) => {
            let i = tools.iter().position(|f| &f.name == name).ok_or_else(|| {
                GrammarError::BadTools(format!("`tool_choice` names {name:?}, which is not in `tools`"))
            })?;
            vec![call_schema(&tools[i], i)]
        }
    };
    any_call(calls).map(|schema| Some(GrammarSpec::JsonSchema(schema)))
}

/// One of `calls` (call schemas): the schema itself when there is one, else their `anyOf`.
fn any_call(mut calls: Vec<Value>) -> Result<Value, GrammarError> {
    match calls.len() {
        0 => Err(GrammarError::BadTools("`tool_choice` is \"required\" but `tools` is empty".into())),
        1 => Ok(calls.remove(0)),
        _ => Ok(json!({"anyOf": calls})),
    }
}

/// The opening and closing tags of a tool call in the chat templates that write calls as
/// `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>` (Qwen2.5, Qwen3, Hermes): one token
/// each in their vocabularies.
pub const CALL_TAGS: (&str, &str) = ("<tool_call>", "</tool_call>");

/// How a call inside a Markdown fence opens and closes (Qwen2.5-Coder answers a call this way).
pub const FENCED_CALL: (&str, &str) = ("```json\n", "\n```");

/// What follows a model's own opening tag under `tool_choice: "auto"`: a newline, one call of
/// any of `tools` (as [`tool_call_grammar`] with `Required` allows, spaced JSON), a newline and
/// the closing tag token `close_tag`. Decoded with treespec-engine's `TaggedConstraint`, so the
/// text around calls stays free while a call's envelope and keys come out as forced tokens.
pub fn tagged_call_grammar(tools: &[ToolFunction], close_tag: TokenId) -> Result<GrammarSpec, GrammarError> {
    let call = spaced_call(tools)?;
    Ok(GrammarSpec::Lark(format!("start: \"\\n\" %json {call} \"\\n\" <[{close_tag}]>\n")))
}

/// What follows an answer's opening ```` ```json ```` fence under `tool_choice: "auto"`: one call
/// of any of `tools` (spaced JSON) and the closing fence, the end of the answer.
pub fn fenced_call_grammar(tools: &[ToolFunction]) -> Result<GrammarSpec, GrammarError> {
    let call = spaced_call(tools)?;
    let close = serde_json::to_string(FENCED_CALL.1).unwrap_or_default();
    Ok(GrammarSpec::Lark(format!("start: %json {call} {close}\n")))
}

/// The schema of a call of any of `tools`, laid out as spaced JSON (`{"name": "f", …}`).
fn spaced_call(tools: &[ToolFunction]) -> Result<Value, GrammarError> {
    let mut schema = any_call(tools.iter().enumerate().map(|(i, f)| call_schema(f, i)).collect())?;
    schema_check::check(&schema)?;
    if let Value::Object(map) = &mut schema {
        map.insert(
            "x-guidance".into(),
            json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false}),
        );
    }
    Ok(schema)
}

/// A call as the model is shown it in the conversation's history: inside the fence
/// [`fenced_call_grammar`] decodes, laid out as that grammar forces (`{"name": "f", "arguments":
/// {"a": 1}}`), so a later call copies the form of the earlier ones.
pub fn fenced_call_text(name: &str, arguments: &Value) -> String {
    let call = json!({"name": name, "arguments": arguments});
    format!("{}{}{}", FENCED_CALL.0, spaced_json(&call), FENCED_CALL.1)
}

/// `v` laid out as [`JsonWhitespace::Spaced`](crate::JsonWhitespace) grammars force it: one
/// space after `:` and `,`, keys in their order (Python's `json.dumps` layout).
pub fn spaced_json(v: &Value) -> String {
    struct Spaced;
    /// `, ` before every item but the first.
    fn separator<W: ?Sized + std::io::Write>(w: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    impl serde_json::ser::Formatter for Spaced {
        fn begin_array_value<W: ?Sized + std::io::Write>(
            &mut self,
            w: &mut W,
            first: bool,
        ) -> std::io::Result<()> {
            separator(w, first)
        }
        fn begin_object_key<W: ?Sized + std::io::Write>(
            &mut self,
            w: &mut W,
            first: bool,
        ) -> std::io::Result<()> {
            separator(w, first)
        }
        fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
            w.write_all(b": ")
        }
    }
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Spaced);
    // Serializing a `Value` into memory cannot fail.
    let _ = serde::Serialize::serialize(v, &mut ser);
    String::from_utf8(out).unwrap_or_default()
}
