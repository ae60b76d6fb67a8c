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

/// `tagged_call_grammar` after a model's own `<tool_call>`: the envelope and keys are forced, the
/// call ends with the closing tag token, and nothing else is allowed inside.
#[test]
fn a_tagged_call_forces_its_envelope_and_ends_with_the_closing_tag() {
    let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let open = tokens.len() as treespec_grammar::TokenId;
    tokens.push(b"<tool_call>".to_vec());
    tokens.push(b"</tool_call>".to_vec());
    tokens.push(b"<|end|>".to_vec());
    let (close, eos) = (open + 1, open + 2);
    let vocab = treespec_grammar::Vocabulary::new(&tokens, &[eos], &[]).unwrap();
    let spec = treespec_grammar::tagged_call_grammar(&tools(), close).unwrap();
    let mut c = spec.compile(&vocab).unwrap().constraint();
    assert_eq!(vocab.decode(&c.forced_tokens(200).unwrap()), "\n{\"name\": \"");
    for b in "\n{\"name\": \"now\", \"arguments\": {}}\n".bytes() {
        assert!(c.is_allowed(b as u32).unwrap(), "{:?} refused", b as char);
        assert!(!c.is_allowed(eos).unwrap() && !c.is_allowed(open).unwrap(), "no end or new call inside");
        c.advance(b as u32).unwrap();
    }
    // The closing tag is forced (then the grammar's end, which `TaggedConstraint` cuts off: the
    // text after a call is free).
    assert_eq!(c.forced_tokens(4).unwrap(), vec![close, eos]);
    // The other tool's arguments are forced up to the first value.
    let mut c = spec.compile(&vocab).unwrap().constraint();
    for b in "\n{\"name\": \"get".bytes() {
        c.advance(b as u32).unwrap();
    }
    let forced = vocab.decode(&c.forced_tokens(200).unwrap());
    assert_eq!(forced, "_weather\", \"arguments\": {\"city\": \"");
    // A name no tool has, and a close before the call is complete, are refused.
    let mut c = spec.compile(&vocab).unwrap().constraint();
    for b in "\n{\"name\": \"".bytes() {
        c.advance(b as u32).unwrap();
    }
    assert!(!c.is_allowed(b'x' as u32).unwrap() && !c.is_allowed(close).unwrap());
}

/// `fenced_call_grammar` after an answer's opening ```json fence: one call of a declared tool,
/// the closing fence forced, then only the end.
#[test]
fn a_fenced_call_is_one_declared_call_then_the_closing_fence() {
    let (vocab, eos) = byte_vocab();
    let spec = treespec_grammar::fenced_call_grammar(&tools()).unwrap();
    let mut c = spec.compile(&vocab).unwrap().constraint();
    assert_eq!(vocab.decode(&c.forced_tokens(200).unwrap()), "{\"name\": \"");
    for b in "{\"name\": \"now\", \"arguments\": {}}".bytes() {
        assert!(c.is_allowed(b as u32).unwrap() && !c.is_allowed(eos).unwrap(), "{:?} refused", b as char);
        c.advance(b as u32).unwrap();
    }
    let rest = c.forced_tokens(200).unwrap();
    assert_eq!(vocab.decode(&rest[..rest.len() - 1]), "\n```");
    assert_eq!(rest.last(), Some(&eos), "nothing but the end after the fence");
}

#[test]
fn history_calls_are_shown_in_the_layout_the_fenced_grammar_forces() {
    let arguments = json!({"city": "Oslo", "days": [1, 2], "opts": {"unit": "c"}});
    let text = treespec_grammar::fenced_call_text("get_weather", &arguments);
    assert_eq!(
        text,
        "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": [1, 2], \"opts\": {\"unit\": \"c\"}}}\n```"
    );
    // The grammar accepts exactly that text, byte by byte, then only the end.
    let (vocab, eos) = byte_vocab();
    let tools =
        ToolFunction::from_openai_tools(&json!([{"type": "function", "function": {"name": "get_weather"}}]));
    let spec = treespec_grammar::fenced_call_grammar(&tools.unwrap()).unwrap();
    let mut c = spec.compile(&vocab).unwrap().constraint();
    let call = treespec_grammar::fenced_call_text("get_weather", &json!({}));
    for b in call.strip_prefix("```json\n").unwrap().bytes() {
        assert!(c.is_allowed(b as u32).unwrap(), "{:?} refused", b as char);
        c.advance(b as u32).unwrap();
    }
    assert_eq!(c.forced_tokens(4).unwrap(), vec![eos]);
}
