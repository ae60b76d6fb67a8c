//! Prompt sets: JSON lines in the Spec-Bench / MT-Bench format (`question_id`, `category`,
//! `turns`), or plain `{"prompt": "..."}` lines; and the selection of a subset of them.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

/// Category given to lines that have none.
pub const DEFAULT_CATEGORY: &str = "uncategorized";

/// One benchmark prompt: the first user turn of a question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// `question_id` (or `id`) as text; the 1-based line number when the line has neither.
    pub id: String,
    /// `category`, or [`DEFAULT_CATEGORY`].
    pub category: String,
    /// The first turn (or `prompt`).
    pub text: String,
    /// `schema`: a JSON Schema the answer must follow (structured output; `bench --structured`
    /// constrains the generation to it).
    pub schema: Option<Value>,
}

/// Read a prompt file. Blank lines are skipped; any other line must be a JSON object with
/// `turns` (a non-empty list of strings; the first is used) or `prompt` (a string).
pub fn load_prompts(path: &Path) -> Result<Vec<Prompt>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read prompt file {}", path.display()))?;
    parse_prompts(&text).with_context(|| format!("in prompt file {}", path.display()))
}

/// Parse prompt lines (see [`load_prompts`]); errors name the 1-based line.
pub fn parse_prompts(text: &str) -> Result<Vec<Prompt>> {
    let mut out = Vec::new();
    let mut seen: HashMap<(String, String), usize> = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let lineno = i + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let p = parse_line(line, lineno).with_context(|| format!("line {lineno}"))?;
        if let Some(first) = seen.insert((p.category.clone(), p.id.clone()), lineno) {
            bail!(
                "line {lineno}: prompt id {} in category {} already used on line {first}",
                p.id,
                p.category
            );
        }
        out.push(p);
    }
    if out.is_empty() {
        bail!("no prompts (the file is empty)");
    }
    Ok(out)
}

fn parse_line(line: &str, lineno: usize) -> Result<Prompt> {
    let v: Value = serde_json::from_str(line).map_err(|e| {
        // serde_json appends "at line 1 column N" (the line is always 1 here): keep the column.
        let msg = e.to_string();
        let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
        anyhow!("malformed JSON at column {}: {msg}", e.column())
    })?;
    let obj = v.as_object().ok_or_else(|| anyhow!("expected a JSON object, found {}", kind(&v)))?;
    let text = match (obj.get("turns"), obj.get("prompt")) {
        (Some(turns), _) => {
            let turns = turns.as_array().ok_or_else(|| anyhow!("`turns` must be a list of strings"))?;
            let first = turns.first().ok_or_else(|| anyhow!("`turns` is empty"))?;
            first.as_str().ok_or_else(|| anyhow!("`turns` must be a list of strings"))?.to_string()
        }
        (None, Some(p)) => p.as_str().ok_or_else(|| anyhow!("`prompt` must be a string"))?.to_string(),
        (None, None) => bail!("a prompt line needs `turns` (a list of strings) or `prompt` (a string)"),
    };
    if text.trim().is_empty() {
        bail!("the prompt text is empty");
    }
    let id = match obj.get("question_id").or_else(|| obj.get("id")) {
        None | Some(Value::Null) => lineno.to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => bail!("`question_id` must be a number or a string, found {}", kind(other)),
    };
    let category = match obj.get("category") {
        None | Some(Value::Null) => DEFAULT_CATEGORY.to_string(),
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(other) => bail!("`category` must be a non-empty string, found {}", kind(other)),
    };
    let schema = match obj.get("schema") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Object(_)) => Some(v.clone()),
        Some(other) => bail!("`schema` must be a JSON Schema object, found {}", kind(other)),
    };
    Ok(Prompt { id, category, text, schema })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Which prompts of a file to run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Only these categories (all when `None`), each of which must occur in the file.
    pub categories: Option<Vec<String>>,
    /// At most this many prompts from each category (the first ones in file order).
    pub per_category: Option<usize>,
    /// At most this many prompts in all, taken round-robin over the categories (first prompt of
    /// each category in order of first appearance, then the second of each, …) so that a small
    /// limit still covers every category.
    pub limit: Option<usize>,
}

/// Categories in order of first appearance.
pub fn categories(prompts: &[Prompt]) -> Vec<String> {
    let mut seen = BTreeSet::new();
    prompts.iter().filter(|p| seen.insert(p.category.clone())).map(|p| p.category.clone()).collect()
}

/// Apply a selection. The result is grouped by category (categories in order of first
/// appearance, prompts in file order within each). Errors on an unknown category, a zero limit
/// and an empty result.
pub fn select(prompts: &[Prompt], sel: &Selection) -> Result<Vec<Prompt>> {
    let all = categories(prompts);
    let wanted: Vec<String> = match &sel.categories {
        None => all.clone(),
        Some(list) => {
            let mut wanted = Vec::new();
            for c in list {
                let c = c.trim();
                if c.is_empty() {
                    continue;
                }
                if !all.iter().any(|a| a == c) {
                    bail!("unknown category '{c}' (this prompt file has: {})", all.join(", "));
                }
                if !wanted.iter().any(|w| w == c) {
                    wanted.push(c.to_string());
                }
            }
            if wanted.is_empty() {
                bail!("--categories names no category (this prompt file has: {})", all.join(", "));
            }
            wanted
        }
    };
    if sel.per_category == Some(0) || sel.limit == Some(0) {
        bail!("empty selection: --limit and --per-category must be at least 1");
    }
    let mut groups: Vec<Vec<&Prompt>> = wanted
        .iter()
        .map(|c| {
            let g = prompts.iter().filter(|p| &p.category == c);
            g.take(sel.per_category.unwrap_or(usize::MAX)).collect()
        })
        .collect();
    if let Some(limit) = sel.limit {
        // Round-robin: how many each category keeps.
        let mut keep = vec![0usize; groups.len()];
        let mut left = limit;
        let mut round = 0;
        while left > 0 && groups.iter().any(|g| g.len() > round) {
            for (k, g) in keep.iter_mut().zip(&groups) {
                if left > 0 && g.len() > round {
                    *k += 1;
                    left -= 1;
                }
            }
            round += 1;
        }
        for (g, k) in groups.iter_mut().zip(keep) {
            g.truncate(k);
        }
    }
    let out: Vec<Prompt> = groups.into_iter().flatten().cloned().collect();
    if out.is_empty() {
        bail!("empty selection: no prompts left after the category and limit filters");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"{"question_id": 1, "category": "a", "turns": ["one", "one again"]}
{"question_id": 2, "category": "b", "turns": ["two"]}

{"question_id": 3, "category": "a", "turns": ["three"]}
{"question_id": "x4", "category": "c", "turns": ["four"]}
{"prompt": "plain five"}
"#;

    #[test]
    fn parses_both_formats_and_uses_the_first_turn() {
        let p = parse_prompts(FILE).unwrap();
        assert_eq!(p.len(), 5);
        assert_eq!(p[0], Prompt { id: "1".into(), category: "a".into(), text: "one".into(), schema: None });
        assert_eq!(p[3].id, "x4");
        assert_eq!(
            p[4],
            Prompt {
                id: "6".into(),
                category: DEFAULT_CATEGORY.into(),
                text: "plain five".into(),
                schema: None
            }
        );
    }

    #[test]
    fn bad_lines_name_their_line_number() {
        let e = format!("{:#}", parse_prompts("{\"prompt\": \"ok\"}\n{\"turns\": [\"x\"\n").unwrap_err());
        assert!(e.contains("line 2") && e.contains("malformed JSON"), "{e}");
        let e = format!("{:#}", parse_prompts("{\"category\": \"a\"}").unwrap_err());
        assert!(e.contains("line 1") && e.contains("`turns`"), "{e}");
        let e = format!("{:#}", parse_prompts("[1, 2]").unwrap_err());
        assert!(e.contains("expected a JSON object"), "{e}");
        let e = format!("{:#}", parse_prompts("{\"turns\": []}").unwrap_err());
        assert!(e.contains("empty"), "{e}");
        let e = format!(
            "{:#}",
            parse_prompts("{\"id\": 1, \"prompt\": \"a\"}\n{\"id\": 1, \"prompt\": \"b\"}").unwrap_err()
        );
        assert!(e.contains("already used on line 1"), "{e}");
        assert!(parse_prompts("\n\n").is_err());
        let e = format!("{:#}", load_prompts(Path::new("/nonexistent/q.jsonl")).unwrap_err());
        assert!(e.contains("cannot read prompt file /nonexistent/q.jsonl"), "{e}");
    }

    #[test]
    fn selection_filters_limits_round_robin_and_rejects_bad_input() {
        let p = parse_prompts(FILE).unwrap();
        let ids = |s: &Selection| select(&p, s).unwrap().iter().map(|p| p.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&Selection::default()), ["1", "3", "2", "x4", "6"]);
        let cats = Some(vec!["a".to_string(), "c".to_string()]);
        assert_eq!(ids(&Selection { categories: cats.clone(), ..Default::default() }), ["1", "3", "x4"]);
        assert_eq!(ids(&Selection { per_category: Some(1), ..Default::default() }), ["1", "2", "x4", "6"]);
        // Round-robin: a small limit covers categories before taking second prompts.
        assert_eq!(ids(&Selection { limit: Some(3), ..Default::default() }), ["1", "2", "x4"]);
        assert_eq!(
            ids(&Selection { categories: cats, limit: Some(3), ..Default::default() }),
            ["1", "3", "x4"]
        );
        let e = select(&p, &Selection { categories: Some(vec!["zzz".into()]), ..Default::default() });
        assert!(format!("{:#}", e.unwrap_err()).contains("unknown category 'zzz'"));
        assert!(select(&p, &Selection { limit: Some(0), ..Default::default() }).is_err());
    }
}
