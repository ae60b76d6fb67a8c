//! The `tojson` filter as the templates' authors render it: Hugging Face transformers' filter,
//! which is Python's `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)`.
//!
//! Why not minijinja's own: it writes compact JSON (`{"a":1}`) and escapes `<`, `>`, `&` and `'`
//! for HTML (`\u0027`), where Python writes `{"a": 1}` and leaves them alone. Qwen2.5's template
//! prints every tool declaration through `tojson`, so with minijinja's filter a request with tools
//! reached the model as a prompt it was never trained on, and llama-server (whose template engine
//! writes what Python does) read a different prompt from the same request: 2,639 tokens against
//! treespec's 2,235 on the first turn of the BFCL tool session.

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde_json::ser::Formatter;
use std::fmt::Write as _;
use std::io;

/// `tojson(indent=None, separators=None, sort_keys=False, ensure_ascii=False)` with Python's
/// defaults: `", "` between items and `": "` after keys, or `","` between items (each on its own
/// line) when indented.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let (item, key) = match separators.as_deref() {
        None => ((if indent.is_some() { "," } else { ", " }).to_string(), ": ".to_string()),
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => return Err(invalid("separators must be two strings (item, key)")),
    };
    let mut json = serde_json::to_value(value).map_err(invalid)?;
    if sort_keys == Some(true) {
        sort(&mut json);
    }
    let formatter = PythonFormatter { indent, item, key, level: 0, has_value: false };
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    serde::Serialize::serialize(&json, &mut serializer).map_err(invalid)?;
    let text = String::from_utf8(out).map_err(invalid)?;
    Ok(Value::from_safe_string(if ensure_ascii == Some(true) { ascii(&text) } else { text }))
}

fn invalid(why: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("tojson: {why}"))
}

/// Every object's keys in sorted order, at every depth (`sort_keys=True`).
fn sort(json: &mut serde_json::Value) {
    match json {
        serde_json::Value::Object(map) => {
            map.sort_keys();
            map.values_mut().for_each(sort);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(sort),
        _ => {}
    }
}

/// `ensure_ascii=True`: every non-ASCII character as `\uXXXX` (UTF-16, as Python writes it).
/// Outside strings JSON has only ASCII, so the whole text can be rewritten. The guard's sentinels
/// stay as they are: each stands for a special token's text, which is ASCII and which the
/// rendered text must still split at ([`crate::guard`]).
fn ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() || crate::sentinel::is_sentinel(c) {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                // Writing into a String cannot fail.
                let _ = write!(out, "\\u{unit:04x}");
            }
        }
    }
    out
}

/// Python's `repr` of a float, as `json.dumps` writes it: positional from 1e-4 up to 1e16
/// (always with a fractional part), scientific beyond with a signed, two-digit exponent.
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let scientific = format!("{x:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..16).contains(&exponent) {
        let positional = format!("{x}");
        if positional.contains('.') {
            positional
        } else {
            positional + ".0"
        }
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    }
}

/// serde_json's writer with Python's separators and indentation.
struct PythonFormatter {
    indent: Option<usize>,
    item: String,
    key: String,
    level: usize,
    has_value: bool,
}

impl PythonFormatter {
    fn newline<W: ?Sized + io::Write>(&self, w: &mut W) -> io::Result<()> {
        match self.indent {
            Some(n) => write!(w, "\n{}", " ".repeat(n * self.level)),
            None => Ok(()),
        }
    }

    fn open<W: ?Sized + io::Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(bracket)
    }

    fn close<W: ?Sized + io::Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.level -= 1;
        if self.has_value {
            self.newline(w)?;
        }
        self.has_value = true;
        w.write_all(bracket)
    }

    fn item<W: ?Sized + io::Write>(&self, w: &mut W, first: bool) -> io::Result<()> {
        if !first {
            w.write_all(self.item.as_bytes())?;
        }
        self.newline(w)
    }
}

impl Formatter for PythonFormatter {
    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(python_float(value).as_bytes())
    }

    fn write_f32<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f32) -> io::Result<()> {
        self.write_f64(w, f64::from(value))
    }

    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"[")
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"]")
    }

    fn begin_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.item(w, first)
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, _: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"{")
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"}")
    }

    fn begin_object_key<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.item(w, first)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(self.key.as_bytes())
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, _: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::python_float;
    use crate::{ChatTemplate, Piece};

    fn render(source: &str, tools: serde_json::Value) -> String {
        let t = ChatTemplate::new(Some(source), "", "").unwrap();
        t.render_with_tools(&[], false, Some(&tools)).unwrap()
    }

    /// Each line is what Python 3's `json.dumps` writes for the same value and arguments.
    #[test]
    fn writes_what_python_writes() {
        // Keys out of alphabetical order, a quote, an apostrophe, markup, a tab, non-ASCII.
        let tool = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
            "description": "The city's \"weather\" <now> & later\t✓", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 1.5}},
            "required": ["city"]}}}]);
        let out = render("{% for t in tools %}{{ t | tojson }}{% endfor %}", tool.clone());
        assert_eq!(
            out,
            r#"{"type": "function", "function": {"name": "get_weather", "description": "The city's \"weather\" <now> & later\t✓", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 1.5}}, "required": ["city"]}}}"#
        );
        let out =
            render("{{ tools[0].function.parameters | tojson(indent=2, sort_keys=true) }}", tool.clone());
        assert_eq!(
            out,
            "{\n  \"properties\": {\n    \"city\": {\n      \"type\": \"string\"\n    },\n    \"days\": {\n      \"default\": 1.5,\n      \"type\": \"integer\"\n    }\n  },\n  \"required\": [\n    \"city\"\n  ],\n  \"type\": \"object\"\n}"
        );
        let out = render("{{ tools[0].function.description | tojson(ensure_ascii=true) }}", tool.clone());
        assert_eq!(out, r#""The city's \"weather\" <now> & later\t\u2713""#);
        let out = render("{{ [[], {}, none, true] | tojson(separators=[',', ':']) }}", tool);
        assert_eq!(out, "[[],{},null,true]");
    }

    #[test]
    fn floats_as_python_repr() {
        for (x, python) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (1e-5, "1e-05"),
            (1e16, "1e+16"),
            (123.25, "123.25"),
            (-2.5e-7, "-2.5e-07"),
        ] {
            assert_eq!(python_float(x), python, "{x}");
        }
    }

    /// A special token's text inside a tool's description stays plain text through `tojson`,
    /// ASCII-escaped or not: the guard's sentinel passes through and the text splits at it.
    #[test]
    fn guarded_strings_survive() {
        let specials = vec!["<|im_end|>".to_string()];
        let tools = serde_json::json!([{"description": "ends with <|im_end|> é"}]);
        for filter in ["tojson", "tojson(ensure_ascii=true)"] {
            let src = format!("{{% for t in tools %}}{{{{ t | {filter} }}}}{{% endfor %}}");
            let t = ChatTemplate::new(Some(&src), "", "").unwrap();
            let pieces = t.render_guarded_with_tools(&[], false, &specials, Some(&tools)).unwrap();
            let e = if filter == "tojson" { "é" } else { "\\u00e9" };
            assert_eq!(
                pieces,
                vec![
                    Piece::Template("{\"description\": \"ends with ".into()),
                    Piece::Plain("<|im_end|>".into()),
                    Piece::Template(format!(" {e}\"}}")),
                ],
                "{filter}"
            );
        }
    }

    #[test]
    fn bad_arguments_are_named() {
        let t = ChatTemplate::new(Some("{{ tools | tojson(separators=[',']) }}"), "", "").unwrap();
        let e = t.render_with_tools(&[], false, Some(&serde_json::json!([]))).unwrap_err();
        assert!(e.to_string().contains("separators"), "{e}");
        let t = ChatTemplate::new(Some("{{ tools | tojson(colour=1) }}"), "", "").unwrap();
        assert!(t.render_with_tools(&[], false, Some(&serde_json::json!([]))).is_err());
    }
}
