//! The tool-call grammar: OpenAI `tools` parsing, named and required choices.

mod common;

use common::{byte_vocab, random_walk};
use serde_json::{json, Value};
use treespec_grammar::{tool_call_grammar, GrammarError, ToolChoice, ToolFunction};

fn tools() -> Vec<ToolFunction> {
    let tools = json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"],
                "additionalProperties": false
            }
        }},
        {"type": "function", "function": {"name": "now"}}
    ]);
    ToolFunction::from_openai_tools(&tools).unwrap()
}

#[test]
fn openai_tools_and_choices_parse() {
    let t = tools();
    assert_eq!(t.len(), 2);
    assert_eq!(t[1].parameters, json!({"type": "object", "properties": {}, "additionalProperties": false}));
    assert_eq!(ToolChoice::from_openai(&json!("required")).unwrap(), ToolChoice::Required);
    assert_eq!(
        ToolChoice::from_openai(&json!({"type": "function", "function": {"name": "now"}})).unwrap(),
        ToolChoice::Function("now".into())
    );
    assert!(ToolChoice::from_openai(&json!("sometimes")).is_err());
    let dup = json!([{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}]);
    assert!(
        matches!(ToolFunction::from_openai_tools(&dup), Err(GrammarError::BadTools(m)) if m.contains("duplicate"))
    );
    assert!(ToolFunction::from_openai_tools(&json!([{"type": "retrieval"}])).is_err());
    assert_eq!(tool_call_grammar(&t, &ToolChoice::Auto).unwrap(), None);
    assert_eq!(tool_call_grammar(&t, &ToolChoice::None).unwrap(), None);
    assert!(tool_call_grammar(&t, &ToolChoice::Function("nope".into())).is_err());
    assert!(tool_call_grammar(&[], &ToolChoice::Required).is_err());
}

#[test]
fn a_named_function_forces_the_envelope() {
    let (vocab, _) = byte_vocab();
    let spec = tool_call_grammar(&tools(), &ToolChoice::Function("get_weather".into())).unwrap().unwrap();
    let mut c = spec.compile(&vocab).unwrap().constraint();
    let forced = c.forced_tokens(200).unwrap();
    assert_eq!(vocab.decode(&forced), r#"{"name": "get_weather", "arguments": {"city": ""#);
}

#[test]
fn required_calls_are_valid_calls_to_some_tool() {
    let (vocab, _) = byte_vocab();
    let spec = tool_call_grammar(&tools(), &ToolChoice::Required).unwrap().unwrap();
    let grammar = spec.compile(&vocab).unwrap();
    let mut names = Vec::new();
    for seed in 0..30 {
        let path = random_walk(&mut grammar.constraint(), seed, 600);
        let text = vocab.decode(&path);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["name", "arguments"], "{text}");
        let args = v["arguments"].as_object().unwrap_or_else(|| panic!("{text}"));
        match v["name"].as_str().unwrap() {
            "get_weather" => {
                assert!(args["city"].as_str().is_some_and(|c| c.chars().count() <= 10), "{text}");
                assert!(["c", "f"].contains(&args["unit"].as_str().unwrap()), "{text}");
                assert_eq!(args.len(), 2, "{text}");
            }
            "now" => assert!(args.is_empty(), "{text}"),
            other => panic!("unknown tool {other}: {text}"),
        }
        names.push(v["name"].as_str().unwrap().to_string());
    }
    assert!(names.iter().any(|n| n == "now") && names.iter().any(|n| n == "get_weather"));
}
