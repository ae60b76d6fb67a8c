//! Hostile schemas (issue #29): `$ref`s that recurse without end, ref chains and nesting deep
//! enough to overflow llguidance's recursive compiler, schemas wide enough to take seconds, and
//! tools whose parameters use local `$ref`s. Each is refused at compile time with one sentence
//! (no parser state), or compiled and walked to a valid document.

mod common;

use std::time::{Duration, Instant};

use common::{byte_vocab, random_walk};
use serde_json::{json, Map, Value};
use treespec_grammar::{tool_call_grammar, GrammarError, GrammarSpec, ToolChoice, ToolFunction, MAX_DEPTH};

/// The error `check` gives, which `compile` against a vocabulary must give too.
fn refused(schema: Value) -> String {
    let spec = GrammarSpec::JsonSchema(schema);
    let t = Instant::now();
    let e = spec.check().expect_err("refused");
    assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
    let (vocab, _) = byte_vocab();
    assert_eq!(spec.compile(&vocab).map(drop).unwrap_err(), e);
    let GrammarError::BadSchema(msg) = &e else { panic!("{e:?}") };
    for internal in ["NoExtensionBias", "<state>", "Parser:", "\n", "Tokens:"] {
        assert!(!msg.contains(internal), "{internal:?} in {msg:?}");
    }
    assert!(msg.len() < 300, "{msg}");
    msg.clone()
}

fn accepted(schema: Value) {
    GrammarSpec::JsonSchema(schema.clone()).check().unwrap_or_else(|e| panic!("{schema}: {e}"));
}

#[test]
fn refs_that_recurse_without_end_are_refused() {
    let m = refused(json!({"$ref": "#"}));
    assert!(m.contains("\"#\"") && m.contains("recurses without end"), "{m}");
    let cycle =
        json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}});
    assert!(refused(cycle).contains("#/$defs/a"));
    // Productive-looking recursion that still has no finite instance: a required property
    // (or a non-empty array) of the object itself.
    refused(json!({"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}, "required": ["a"]}));
    refused(json!({"type": "object", "properties": {"k": {"$ref": "#"}}, "required": ["k"]}));
    refused(json!({"type": "array", "items": {"$ref": "#"}, "minItems": 1}));
    refused(json!({"anyOf": [{"$ref": "#/$defs/x"}], "$defs": {"x": {"allOf": [{"$ref": "#"}]}}}));
    // Percent-encoded and escaped pointers resolve too.
    refused(
        json!({"$ref": "#/$defs/a%20b", "$defs": {"a b": {"$ref": "#/$defs/c~1d"}, "c/d": {"$ref": "#"}}}),
    );
}

#[test]
fn recursion_with_a_way_out_is_fine() {
    // A tree: children optional.
    let tree = json!({"type": "object", "properties": {"v": {"type": "integer"},
        "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["v"]});
    accepted(tree.clone());
    let (vocab, _) = byte_vocab();
    let mut c = GrammarSpec::JsonSchema(tree).compile(&vocab).unwrap().constraint();
    let path = random_walk(&mut c, 3, 4000);
    let text = vocab.decode(&path);
    assert!(serde_json::from_str::<Value>(&text).unwrap()["v"].is_i64(), "{text}");
    // A base case in an anyOf, a linked list in $defs, a nullable self-reference.
    accepted(
        json!({"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}, "minItems": 1}]}),
    );
    accepted(json!({"$ref": "#/$defs/list", "$defs": {"list": {"type": "object",
        "properties": {"next": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/list"}]}}, "required": ["next"]}}}));
    accepted(json!({"type": ["object", "null"], "properties": {"k": {"$ref": "#"}}, "required": ["k"]}));
}

#[test]
fn deep_and_wide_schemas_are_refused_quickly_and_without_a_crash() {
    // A flat body whose refs chain 500 deep: llguidance's compiler would overflow the stack.
    let mut defs = Map::new();
    for i in 0..500 {
        defs.insert(
            format!("a{i}"),
            json!({"type": "array", "items": {"$ref": format!("#/$defs/a{}", i + 1)}}),
        );
    }
    defs.insert("a500".into(), json!({"type": "integer"}));
    let m = refused(json!({"$ref": "#/$defs/a0", "$defs": defs}));
    assert!(m.contains("levels deep"), "{m}");
    // Plain nesting beyond the limit, and just within it.
    let nest =
        |n: usize| (0..n).fold(json!({"type": "integer"}), |s, _| json!({"type": "array", "items": s}));
    refused(nest(MAX_DEPTH + 1));
    accepted(nest(MAX_DEPTH - 2));
    // 5,000 optional properties would take seconds to compile; so would huge anyOfs.
    let props: Map<String, Value> = (0..5000).map(|i| (format!("p{i}"), json!({"type": "string"}))).collect();
    assert!(refused(json!({"type": "object", "properties": props})).contains("properties"));
    let branches: Vec<Value> = (0..3000).map(|i| json!({"const": i})).collect();
    assert!(refused(json!({"anyOf": branches})).contains("anyOf"));
    // Many medium objects add up.
    let props: Map<String, Value> = (0..900).map(|i| (format!("p{i}"), json!({"type": "string"}))).collect();
    let objects: Map<String, Value> =
        (0..6).map(|i| (format!("o{i}"), json!({"type": "object", "properties": props.clone()}))).collect();
    refused(json!({"type": "object", "properties": objects}));
    // Exponential allOf/anyOf products are llguidance's own limit, one sentence too.
    let all: Vec<Value> = (0..40)
        .map(|i| {
            json!({"anyOf": [{"type": "object", "properties": {format!("a{i}"): {"type": "integer"}}},
            {"type": "object", "properties": {format!("b{i}"): {"type": "string"}}}]})
        })
        .collect();
    refused(json!({"allOf": all}));
}

fn tools(parameters: Value) -> Vec<ToolFunction> {
    ToolFunction::from_openai_tools(&json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": parameters}},
        {"type": "function", "function": {"name": "now"}}
    ]))
    .unwrap()
}

#[test]
fn tool_parameters_resolve_their_own_local_refs() {
    let params = json!({"type": "object", "properties": {"city": {"$ref": "#/$defs/city"}}, "required": ["city"],
        "additionalProperties": false, "$defs": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}});
    let (vocab, eos) = byte_vocab();
    for choice in [ToolChoice::Required, ToolChoice::Function("get_weather".into())] {
        let spec = tool_call_grammar(&tools(params.clone()), &choice).unwrap().unwrap();
        spec.check().unwrap();
        let grammar = spec.compile(&vocab).unwrap();
        for seed in 0..8 {
            let path = random_walk(&mut grammar.constraint(), seed, 400);
            assert_eq!(path.last(), Some(&eos));
            let call: Value = serde_json::from_str(&vocab.decode(&path)).unwrap();
            if call["name"] == "get_weather" {
                assert!(["Paris", "Oslo"].contains(&call["arguments"]["city"].as_str().unwrap()), "{call}");
            } else {
                assert_eq!(call, json!({"name": "now", "arguments": {}}));
            }
        }
    }
    // `#` is the parameters, not the wrapper: a self-reference has no end there either.
    for choice in [ToolChoice::Required, ToolChoice::Function("get_weather".into())] {
        let spec = tool_call_grammar(&tools(json!({"$ref": "#"})), &choice).unwrap().unwrap();
        let GrammarError::BadSchema(m) = spec.check().unwrap_err() else { panic!() };
        assert!(m.contains("recurses without end"), "{m}");
    }
    // A recursive parameter type with a way out is fine.
    let node = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 4},
        "children": {"type": "array", "items": {"$ref": "#/properties/children/items/$defs/x"}, "maxItems": 2}},
        "required": ["name"]});
    let spec = tool_call_grammar(&tools(node), &ToolChoice::Required).unwrap().unwrap();
    assert!(spec.check().is_err(), "a pointer to nowhere is refused");
    let node = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 4},
        "children": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}}, "required": ["name"]});
    tool_call_grammar(&tools(node), &ToolChoice::Required).unwrap().unwrap().check().unwrap();
}
