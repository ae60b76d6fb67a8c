//! A forced tool call's text, `{"name": "f", "arguments": {..}}` (treespec-grammar's tool-call
//! grammar, spaced JSON), as OpenAI's `tool_calls`: the name from the header, the arguments as
//! the model wrote them (a JSON-encoded string on the wire), without the call's closing `}`.
//!
//! [`ToolCallText`] works on streamed text: once the header `{"name": "f", "arguments":` is
//! complete it yields a first delta (id, type, name), then argument text as it comes, always
//! holding back the last non-blank character (it may be the call's own `}`). Joining the
//! deltas' arguments gives [`ToolCallText::finish`]'s arguments, so streamed and whole answers
//! agree. A call inside a ```` ```json ```` fence ([`ToolCallText::fenced`], the text after the
//! opening) also holds back trailing backticks, and its closing fence is not an argument.

use serde_json::Value;

use crate::api::{FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta};

/// The state of one tool call's text.
#[derive(Debug, Clone)]
pub struct ToolCallText {
    id: String,
    buf: String,
    /// The function name and where the arguments start in `buf`, once the header is complete.
    header: Option<(String, usize)>,
    /// Bytes of `buf` already sent as arguments.
    sent: usize,
    /// The call closes with a fence (```` ``` ````) after its own `}`.
    fenced: bool,
}

impl ToolCallText {
    /// A call to be answered under `id` (`call_…`).
    pub fn new(id: String) -> Self {
        Self { id, buf: String::new(), header: None, sent: 0, fenced: false }
    }

    /// A call inside a ```` ```json ```` fence, fed the text after the opening.
    pub fn fenced(id: String) -> Self {
        Self { fenced: true, ..Self::new(id) }
    }

    /// The function name, once the header is complete.
    pub fn name(&self) -> Option<&str> {
        self.header.as_ref().map(|(name, _)| name.as_str())
    }

    /// `buf` without what may still turn out to be the call's closing: trailing blanks, and
    /// trailing backticks in a fenced call.
    fn body(&self) -> &str {
        match self.fenced {
            true => self.buf.trim_end_matches(|c: char| c.is_whitespace() || c == '`'),
            false => self.buf.trim_end(),
        }
    }

    /// Add generated text; returns the deltas it completes (none until the header is whole).
    pub fn push(&mut self, text: &str) -> Vec<ToolCallDelta> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        if self.header.is_none() {
            let Some((name, start)) = parse_header(&self.buf) else { return out };
            out.push(ToolCallDelta {
                index: 0,
                id: Some(self.id.clone()),
                kind: Some("function"),
                function: FunctionCallDelta { name: Some(name.clone()), arguments: String::new() },
            });
            self.header = Some((name, start));
            self.sent = start;
        }
        // Hold back the last non-blank character and what follows it.
        let end = self.body().len();
        let held = self.buf[..end].char_indices().next_back().map_or(end, |(i, _)| i);
        if let Some(delta) = self.arguments_until(held) {
            out.push(delta);
        }
        out
    }

    /// Argument text from what was sent up to `end`, if any.
    fn arguments_until(&mut self, end: usize) -> Option<ToolCallDelta> {
        if end <= self.sent {
            return None;
        }
        let arguments = self.buf[self.sent..end].to_string();
        self.sent = end;
        Some(ToolCallDelta {
            index: 0,
            id: None,
            kind: None,
            function: FunctionCallDelta { name: None, arguments },
        })
    }

    /// The end of the text: the last argument delta (if any) and the whole call, or None when
    /// the header never completed (the text is then answered as plain content).
    pub fn finish(&mut self) -> Option<(Option<ToolCallDelta>, ToolCall)> {
        let (name, start) = self.header.clone()?;
        let body = self.buf.trim_end();
        let body = match self.fenced {
            true => body.strip_suffix("```").map_or(body, str::trim_end),
            false => body,
        };
        let end = match body.strip_suffix('}') {
            Some(inner) if start <= inner.len() => inner.trim_end().len(),
            _ => body.len(),
        };
        let last = self.arguments_until(end.max(self.sent));
        let arguments = self.buf[start..self.sent].to_string();
        let call =
            ToolCall { id: self.id.clone(), kind: "function", function: FunctionCall { name, arguments } };
        Some((last, call))
    }

    /// The raw text so far.
    pub fn text(&self) -> &str {
        &self.buf
    }
}

/// `{"name": "f", "arguments":` → ("f", the index after it and its blanks), once complete.
fn parse_header(buf: &str) -> Option<(String, usize)> {
    let key = buf.find("\"arguments\"")?;
    let after_key = key + "\"arguments\"".len();
    let colon = after_key + buf[after_key..].find(|c: char| !c.is_whitespace())?;
    if buf.as_bytes()[colon] != b':' {
        return None;
    }
    let rest = &buf[colon + 1..];
    let start = colon + 1 + (rest.len() - rest.trim_start().len());
    if start == buf.len() {
        return None; // the arguments' first character has not come yet
    }
    let probe: Value = serde_json::from_str(&format!("{} null}}", &buf[..colon + 1])).ok()?;
    let name = probe.get("name")?.as_str()?.to_string();
    Some((name, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL: &str = r#"{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}"#;

    fn streamed(pieces: &[&str]) -> (Vec<ToolCallDelta>, ToolCall) {
        let mut t = ToolCallText::new("call_1".into());
        let mut deltas: Vec<ToolCallDelta> = pieces.iter().flat_map(|p| t.push(p)).collect();
        let (last, call) = t.finish().unwrap();
        deltas.extend(last);
        (deltas, call)
    }

    #[test]
    fn whole_and_streamed_calls_agree() {
        let (_, whole) = streamed(&[CALL]);
        assert_eq!(whole.function.name, "get_weather");
        assert_eq!(whole.function.arguments, r#"{"city": "Paris", "days": [1, 2]}"#);
        assert_eq!(whole.id, "call_1");
        // Every split point, one character at a time too.
        let chars: Vec<String> = CALL.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        for split in [vec![&CALL[..5], &CALL[5..40], &CALL[40..]], chars] {
            let (deltas, call) = streamed(&split);
            assert_eq!(call, whole);
            assert_eq!(deltas[0].id.as_deref(), Some("call_1"));
            assert_eq!(deltas[0].function.name.as_deref(), Some("get_weather"));
            let args: String = deltas.iter().map(|d| d.function.arguments.as_str()).collect();
            assert_eq!(args, whole.function.arguments);
            assert!(deltas[1..].iter().all(|d| d.id.is_none() && d.function.name.is_none()));
        }
    }

    #[test]
    fn a_fenced_call_streams_without_its_closing_fence() {
        let text = format!("{CALL}\n```");
        let (_, whole) = streamed(&[CALL]);
        let chars: Vec<String> = text.chars().map(String::from).collect();
        for split in [vec![text.clone()], vec![text[..30].to_string(), text[30..].to_string()], chars] {
            let mut t = ToolCallText::fenced("call_1".into());
            let mut deltas: Vec<ToolCallDelta> = split.iter().flat_map(|p| t.push(p)).collect();
            let (last, call) = t.finish().unwrap();
            deltas.extend(last);
            assert_eq!(call, whole, "{split:?}");
            let args: String = deltas.iter().map(|d| d.function.arguments.as_str()).collect();
            assert_eq!(args, whole.function.arguments);
            assert!(!args.contains('`'));
        }
        // Backticks inside the arguments are arguments, once more text follows them.
        let code = r#"{"name": "run", "arguments": {"cmd": "echo ```"}}"#;
        let mut t = ToolCallText::fenced("c".into());
        let mut args: String = t.push(code).iter().map(|d| d.function.arguments.clone()).collect();
        args.extend(t.push("\n```").iter().map(|d| d.function.arguments.clone()));
        let (last, call) = t.finish().unwrap();
        args.extend(last.map(|d| d.function.arguments));
        assert_eq!(call.function.arguments, r#"{"cmd": "echo ```"}"#);
        assert_eq!(args, call.function.arguments);
    }

    #[test]
    fn incomplete_calls() {
        let mut t = ToolCallText::new("c".into());
        assert!(t.push(r#"{"name": "f", "argu"#).is_empty());
        assert!(t.finish().is_none());
        assert_eq!(t.text(), r#"{"name": "f", "argu"#);
        // Cut inside the arguments (max_tokens): everything after the header is kept.
        let (_, call) = streamed(&[r#"{"name": "f", "arguments": {"a": [1"#]);
        assert_eq!(call.function.arguments, r#"{"a": [1"#);
        let (_, call) = streamed(&[r#"{"name": "f", "arguments": {"#]);
        assert_eq!(call.function.arguments, "{");
    }
}
