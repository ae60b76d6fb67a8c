//! [`GrammarSpec`]: what a request asks the output to look like, and its compilation into a
//! [`Grammar`] against one [`Vocabulary`].

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, TokenParser};
use serde_json::{json, Value};
use std::sync::OnceLock;

use crate::error::brief;
use crate::{schema_check, Constraint, GrammarError, Vocabulary};

/// Stack for llguidance's compiler, which recurses along the schema: [`schema_check`] bounds the
/// depth well within a default 2 MiB thread stack, this is the margin for what it cannot see.
const COMPILE_STACK: usize = 256 << 20;

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

    /// Compile against `vocab`. Errors name the problem in one sentence, without llguidance's
    /// internals: [`GrammarError::BadSchema`] for JSON specs, [`GrammarError::BadGrammar`] for
    /// Lark and regex. A JSON schema is checked first (`$ref`s recursing without end, depth and
    /// breadth that would blow the stack or the compile time: see `schema_check`), and the
    /// grammar must be able to start: its first mask is computed here, so a grammar that fails
    /// on its first token is refused now, not in the middle of a response.
    pub fn compile_with(&self, vocab: &Vocabulary, options: CompileOptions) -> Result<Grammar, GrammarError> {
        let top = match self {
            GrammarSpec::JsonObject => json_grammar(json!({"type": "object"}), options)?,
            GrammarSpec::JsonSchema(schema) => {
                schema_check::check(schema)?;
                json_grammar(schema.clone(), options)?
            }
            GrammarSpec::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
        };
        let build = move || -> Result<TokenParser, GrammarError> {
            let parser = vocab.factory().create_parser(top).map_err(|e| self.error(brief(&e.to_string())))?;
            let mut first = Matcher::new(Ok(parser.clone()));
            let started = if first.is_stopped() { Ok(()) } else { first.compute_mask().map(drop) };
            if started.is_err() || first.is_error() {
                let why = first.get_error().unwrap_or_default();
                return Err(self.error(if why.contains("NoExtensionBias") || why.is_empty() {
                    "no output can match it: it cannot produce even its first token".to_string()
                } else {
                    format!("decoding fails on its first token: {}", brief(&why))
                }));
            }
            Ok(parser)
        };
        let parser = std::thread::scope(|s| {
            match std::thread::Builder::new()
                .name("grammar-compile".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(s, build)
            {
                Ok(h) => {
                    h.join().unwrap_or_else(|_| Err(self.error("the grammar compiler failed on it".into())))
                }
                Err(_) => Err(self.error("no thread to compile it on".into())),
            }
        })?;
        Ok(Grammar { parser, vocab: vocab.clone() })
    }

    /// Check that this compiles and can start, against a small built-in vocabulary (every byte
    /// and an EOS), for callers without the model's: a server validating a request before
    /// anything is sent. What it refuses, [`compile`](Self::compile) refuses against any
    /// vocabulary (the model's may still fail later, e.g. when no token spells a needed byte).
    pub fn check(&self) -> Result<(), GrammarError> {
        static BYTES: OnceLock<Result<Vocabulary, GrammarError>> = OnceLock::new();
        let vocab = BYTES.get_or_init(|| {
            let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
            tokens.push(b"<|end|>".to_vec());
            Vocabulary::new(&tokens, &[256], &[])
        });
        self.compile(vocab.as_ref().map_err(Clone::clone)?).map(drop)
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
