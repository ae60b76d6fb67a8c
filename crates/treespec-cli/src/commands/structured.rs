//! Structured output on the command line: `--json-schema FILE`, `--grammar FILE` (Lark, in
//! llguidance's syntax), `--regex RE` or `--json-object` constrain `generate` to a grammar
//! (decoded losslessly against constrained plain decoding, forced tokens as free drafts).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use treespec_grammar::GrammarSpec;

/// The output grammar (at most one).
#[derive(Debug, Clone, Args)]
#[group(multiple = false)]
pub struct StructuredArgs {
    /// Constrain the output to JSON valid for this JSON Schema file.
    #[arg(long = "json-schema", value_name = "FILE")]
    pub json_schema: Option<PathBuf>,
    /// Constrain the output to this Lark grammar file (llguidance's Lark dialect).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
    /// Constrain the output to this regular expression.
    #[arg(long, value_name = "RE")]
    pub regex: Option<String>,
    /// Constrain the output to any JSON object.
    #[arg(long = "json-object")]
    pub json_object: bool,
}

impl StructuredArgs {
    /// The grammar named by the flags, read and parsed (not yet compiled).
    pub fn spec(&self) -> Result<Option<GrammarSpec>> {
        let read =
            |p: &PathBuf| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
        Ok(if let Some(p) = &self.json_schema {
            let schema = serde_json::from_str(&read(p)?)
                .with_context(|| format!("{} is not JSON (a JSON Schema is expected)", p.display()))?;
            Some(GrammarSpec::JsonSchema(schema))
        } else if let Some(p) = &self.grammar {
            Some(GrammarSpec::Lark(read(p)?))
        } else if let Some(re) = &self.regex {
            Some(GrammarSpec::Regex(re.clone()))
        } else {
            self.json_object.then_some(GrammarSpec::JsonObject)
        })
    }
}
