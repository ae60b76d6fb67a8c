//! [`GrammarSpec`]: what a request asks the output to look like, and its compilation into a
//! [`Grammar`] against one [`Vocabulary`].

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, TokenParser};
use serde_json::{json, Value};

use crate::{Constraint, GrammarError, Vocabulary};

/// The kind of structured output a request asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against this schema (OpenAI `json_schema` with `strict: true`, or the CLI's
    /// `--json-schema FILE`). Enforced as JSON Schema says: an object without
    /// `"additionalProperties": false` may carry extra keys (after the listed ones, which come
    /// in schema order). Whether the schema meets OpenAI's strict-mode rules is the server's
    /// check, not the compiler's.
    JsonSchema(Value),
    /// A grammar in llguidance's Lark dialect (the CLI's `--grammar FILE`); see
    /// <https://github.com/guidance-ai/llguidance/blob/main/docs/syntax.md>.
    Lark(String),
    /// The whole output matches this regular expression (Rust `regex` syntax).
    Regex(String),
}

/// Whitespace llguidance lets the model put between JSON tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JsonWhitespace {
    /// `{"a":1,"b":2}`: no whitespace at all.
    Compact,
    /// `{"a": 1, "b": 2}`: one space after `:` and `,`, as Python's `json.dumps` writes (the
    /// layout models have seen most). Keys and separators are forced text.
    #[default]
    Spaced,
    /// Any JSON whitespace between tokens. Fewer tokens are forced (whitespace could come
    /// anywhere), but the model keeps its own layout.
    Flexible,
}

/// Knobs for [`GrammarSpec::compile_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompileOptions {
    /// JSON layout (JSON specs only); a schema's own `x-guidance` key wins over it.
    pub json_whitespace: JsonWhitespace,
}

impl GrammarSpec {
    /// Compile against `vocab` with default options (spaced JSON).
    pub fn compile(&self, vocab: &Vocabulary) -> Result<Grammar, GrammarError> {
        self.compile_with(vocab, CompileOptions::default())
    }

    /// Compile against `vocab`. Errors name the problem: [`GrammarError::BadSchema`] for JSON
    /// specs, [`GrammarError::BadGrammar`] for Lark and regex.
    pub fn compile_with(&self, vocab: &Vocabulary, options: CompileOptions) -> Result<Grammar, GrammarError> {
        let top = match self {
            GrammarSpec::JsonObject => json_grammar(json!({"type": "object"}), options)?,
            GrammarSpec::JsonSchema(schema) => json_grammar(schema.clone(), options)?,
            GrammarSpec::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
        };
        let parser = vocab.factory().create_parser(top).map_err(|e| self.error(e.to_string()))?;
        Ok(Grammar { parser, vocab: vocab.clone() })
    }

    fn error(&self, msg: String) -> GrammarError {
        match self {
            GrammarSpec::JsonObject | GrammarSpec::JsonSchema(_) => GrammarError::BadSchema(msg),
            GrammarSpec::Lark(_) | GrammarSpec::Regex(_) => GrammarError::BadGrammar(msg),
        }
    }
}

/// A JSON-schema grammar with the layout options llguidance reads from the schema's
/// `x-guidance` key (kept when the caller already set one).
fn json_grammar(mut schema: Value, options: CompileOptions) -> Result<TopLevelGrammar, GrammarError> {
    let Value::Object(map) = &mut schema else {
        // `true` is a valid schema (anything) but has nowhere to carry options; wrap it.
        return match schema {
            Value::Bool(true) => json_grammar(json!({}), options),
            other => Err(GrammarError::BadSchema(format!("a schema must be an object or true, not {other}"))),
        };
    };
    if !map.contains_key("x-guidance") {
        let (item, key, flexible) = match options.json_whitespace {
            JsonWhitespace::Compact => (",", ":", false),
            JsonWhitespace::Spaced => (", ", ": ", false),
            JsonWhitespace::Flexible => (",", ":", true),
        };
        map.insert(
            "x-guidance".into(),
            json!({"item_separator": item, "key_separator": key, "whitespace_flexible": flexible}),
        );
    }
    Ok(TopLevelGrammar::from_json_schema(schema))
}

/// A compiled grammar: reusable for any number of requests on the same model (a server can
/// cache it per schema); each request takes its own [`Constraint`].
#[derive(Clone)]
pub struct Grammar {
    parser: TokenParser,
    vocab: Vocabulary,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").field("vocab", &self.vocab).finish_non_exhaustive()
    }
}

impl Grammar {
    /// A fresh constraint at the start of the output.
    pub fn constraint(&self) -> Constraint {
        Constraint::new(Matcher::new(Ok(self.parser.clone())), self.vocab.clone())
    }

    /// The vocabulary it was compiled for.
    pub fn vocab(&self) -> &Vocabulary {
        &self.vocab
    }
}
