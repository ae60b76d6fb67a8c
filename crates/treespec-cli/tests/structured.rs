//! Structured output on the real binary and model (issue #14): `--json-schema` output parses and
//! validates; in `--exact` mode every speculative method's constrained greedy output equals
//! constrained plain decoding; forced tokens are counted; a bad schema is a clean error.

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(180);
const SCHEMA: &str = r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"},"maxItems":3}},"required":["name","age","tags"],"additionalProperties":false}"#;

#[test]
fn schema_output_validates_and_speculation_matches_constrained_plain() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let dir = scratch("structured");
    let schema = dir.join("schema.json");
    std::fs::write(&schema, SCHEMA).unwrap();
    let s = schema.to_str().unwrap();
    for prompt in ["Describe a cat owner as JSON.", "Give me a JSON profile of a programmer."] {
        let mut outputs = Vec::new();
        for method in ["plain", "chain", "tree", "suffix", "auto", "dyspec"] {
            let out = treespec_json(
                &[
                    "generate",
                    "-m",
                    m,
                    "-md",
                    m,
                    "--method",
                    method,
                    "--exact",
                    "--chat",
                    "-p",
                    prompt,
                    "--json-schema",
                    s,
                    "-n",
                    "96",
                    "-t",
                    "1",
                    "--json",
                ],
                LIMIT,
            );
            let text = out["text"].as_str().unwrap().to_string();
            if out["finish_reason"] == "eos" {
                let v: Value =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method}: {e}: {text}"));
                assert!(v["name"].is_string() && v["age"].is_i64() && v["tags"].is_array(), "{method}: {v}");
                assert_eq!(v.as_object().unwrap().len(), 3, "{method}: {v}");
            }
            assert!(out["stats"]["forced"].as_u64().unwrap() > 0, "{method}: the schema fixes keys: {out}");
            outputs.push((method, out["token_ids"].clone()));
        }
        for (method, tokens) in &outputs[1..] {
            assert_eq!(tokens, &outputs[0].1, "{method} differs from constrained plain on {prompt:?}");
        }
    }
    std::fs::write(&schema, r#"{"type": "strnig"}"#).unwrap();
    let run = treespec(&["generate", "-m", m, "-p", "x", "--json-schema", s, "-n", "4", "-t", "1"], LIMIT);
    assert!(run.exited_cleanly() && run.code != Some(0), "{run:#?}");
    assert!(run.stderr.contains("strnig"), "{run:#?}");
    std::fs::remove_dir_all(dir).unwrap();
}
