//! Checks run on a JSON schema before llguidance sees it, for what llguidance does not bound
//! itself (it bounds the compiled size and the lexer's work, see [`crate::Vocabulary`]):
//!
//! - **Depth**, following `$ref`s: llguidance compiles a schema recursively, and a chain of a few
//!   hundred `$ref`s (a flat request body) overflows a thread's stack. Refused beyond
//!   [`MAX_DEPTH`] levels.
//! - **Breadth**: compile time grows with the square of an object's optional properties (about
//!   1.5 s for 5,000), and while decoding, llguidance's Earley parser holds about four items per
//!   optional property in one row, against a limit of 2,000 items a row: an object of 499
//!   optional properties compiled, then failed at its first key, mid-answer (found by
//!   `scripts/schema-fuzz.sh` on SmolLM2; 450 decoded). Refused beyond [`MAX_PROPERTIES`]
//!   properties in one object or
//!   [`MAX_BRANCHES`] branches in one `anyOf`/`oneOf`/`allOf`, and [`MAX_TOTAL`] of both in all.
//! - **Recursion without end**: a `$ref` that only leads back to itself (`{"$ref": "#"}`, a
//!   `$defs` cycle, a required property whose schema is the object itself) has no finite
//!   instance; llguidance would fail on the first token, or let the model nest forever.
//!
//! References are resolved the way JSON Schema does for local ones: `#`, `#/json/pointer` and
//! `#anchor` against the nearest enclosing resource (`$id`), and a URI naming an embedded `$id`.
//! Any other reference is left to llguidance (which has no retriever and refuses it).

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use crate::GrammarError;

/// Most nesting levels (each subschema and each `$ref` hop is one).
pub const MAX_DEPTH: usize = 64;
/// Most properties of one object schema (below the ~499 optional ones that overflow the
/// parser's row limit while decoding, see the module docs).
pub const MAX_PROPERTIES: usize = 400;
/// Most branches of one `anyOf`, `oneOf` or `allOf`.
pub const MAX_BRANCHES: usize = 1000;
/// Most properties and branches in the whole schema.
pub const MAX_TOTAL: usize = 5000;

/// Where the base URI of a subschema comes from.
const ROOT_URI: &str = "json-schema:///";

/// Keywords whose value is one subschema.
const ONE: &[&str] = &[
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
];
/// Keywords whose value is an array of subschemas.
const MANY: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems", "items"];
/// Keywords whose value maps names to subschemas.
const MAPS: &[&str] = &["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"];

fn bad(msg: String) -> GrammarError {
    GrammarError::BadSchema(msg)
}

fn endless(reference: &str) -> GrammarError {
    bad(format!("`$ref` {reference:?} recurses without end: no finite JSON value matches it"))
}

fn too_deep() -> GrammarError {
    bad(format!("the schema nests more than {MAX_DEPTH} levels deep (counting each `$ref` it follows)"))
}

/// Check `schema` (see the module doc). `Ok` does not mean llguidance will take it.
pub fn check(schema: &Value) -> Result<(), GrammarError> {
    let mut index = Index { ids: HashMap::new(), anchors: HashMap::new(), id_key: id_key(schema) };
    let root_base = match schema.get("$id").and_then(Value::as_str) {
        Some(id) => join(ROOT_URI, id),
        None => ROOT_URI.to_string(),
    };
    index.ids.insert(strip_fragment(&root_base).to_string(), schema);
    let mut total = 0;
    index.scan(schema, &root_base, 0, &mut total)?;
    let mut walk = Walk {
        index: &index,
        depth: HashMap::new(),
        productive: HashSet::new(),
        this_round: HashMap::new(),
        busy: Vec::new(),
        targets: Vec::new(),
    };
    walk.depth(schema, &root_base, 0)?;
    walk.productivity(schema, &root_base)
}

/// Draft-04 schemas name their resources `id`, later drafts `$id`.
fn id_key(schema: &Value) -> &'static str {
    match schema.get("$schema").and_then(Value::as_str) {
        Some(s) if s.contains("draft-04") || s.contains("draft-03") => "id",
        _ => "$id",
    }
}

/// Every embedded resource and anchor, by absolute URI; and the breadth limits.
struct Index<'a> {
    ids: HashMap<String, &'a Value>,
    anchors: HashMap<String, &'a Value>,
    id_key: &'static str,
}

impl<'a> Index<'a> {
    /// Record resources and anchors under `v` (whose base URI is `base`); count breadth. The
    /// JSON nesting is bounded here too, so the recursion is.
    fn scan(
        &mut self,
        v: &'a Value,
        base: &str,
        level: usize,
        total: &mut usize,
    ) -> Result<(), GrammarError> {
        if level > MAX_DEPTH {
            return Err(too_deep());
        }
        let Value::Object(o) = v else { return Ok(()) };
        let base = match o.get(self.id_key).and_then(Value::as_str) {
            Some(id) if level > 0 => {
                let uri = join(base, id);
                self.ids.insert(strip_fragment(&uri).to_string(), v);
                uri
            }
            _ => base.to_string(),
        };
        if let Some(a) = o.get("$anchor").and_then(Value::as_str) {
            self.anchors.insert(format!("{}#{a}", strip_fragment(&base)), v);
        }
        if let Some(Value::Object(p)) = o.get("properties") {
            if p.len() > MAX_PROPERTIES {
                return Err(bad(format!(
                    "an object schema lists {} properties, more than the {MAX_PROPERTIES} allowed",
                    p.len()
                )));
            }
            *total += p.len();
        }
        for k in ["anyOf", "oneOf", "allOf"] {
            if let Some(Value::Array(b)) = o.get(k) {
                if b.len() > MAX_BRANCHES {
                    return Err(bad(format!(
                        "`{k}` has {} branches, more than the {MAX_BRANCHES} allowed",
                        b.len()
                    )));
                }
                *total += b.len();
            }
        }
        if *total > MAX_TOTAL {
            return Err(bad(format!(
                "the schema has more than {MAX_TOTAL} properties and `anyOf`/`oneOf`/`allOf` branches in all"
            )));
        }
        for child in children(o) {
            self.scan(child, &base, level + 1, total)?;
        }
        Ok(())
    }

    /// The subschema `reference` names, seen from base URI `base`, with its own base URI.
    fn resolve(&self, base: &str, reference: &str) -> Option<(&'a Value, String)> {
        let uri = join(base, reference);
        let (doc, fragment) = match uri.split_once('#') {
            Some((d, f)) => (d, f),
            None => (uri.as_str(), ""),
        };
        let resource = *self.ids.get(doc)?;
        if fragment.is_empty() {
            return Some((resource, doc.to_string()));
        }
        if !fragment.starts_with('/') {
            return self.anchors.get(&format!("{doc}#{fragment}")).map(|v| (*v, doc.to_string()));
        }
        let mut at = resource;
        let mut at_base = doc.to_string();
        for raw in fragment[1..].split('/') {
            let token = percent_decode(raw).replace("~1", "/").replace("~0", "~");
            at = match at {
                Value::Object(o) => o.get(&token)?,
                Value::Array(a) => a.get(token.parse::<usize>().ok()?)?,
                _ => return None,
            };
            if let Some(id) = at.get(self.id_key).and_then(Value::as_str) {
                at_base = join(&at_base, id);
            }
        }
        Some((at, at_base))
    }
}

/// The subschemas directly under a schema object.
fn children(o: &Map<String, Value>) -> impl Iterator<Item = &Value> {
    let one = ONE.iter().filter_map(|k| o.get(*k)).filter(|v| v.is_object() || v.is_boolean());
    let many = MANY.iter().filter_map(|k| o.get(*k)).filter_map(Value::as_array).flatten();
    let maps = MAPS.iter().filter_map(|k| o.get(*k)).filter_map(Value::as_object).flat_map(Map::values);
    one.chain(many).chain(maps)
}

/// Resolve `reference` against `base` (enough of RFC 3986 for schema ids: absolute URIs,
/// fragments, absolute paths and relative file names).
fn join(base: &str, reference: &str) -> String {
    let has_scheme = reference.split_once(':').is_some_and(|(s, _)| {
        !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    });
    if has_scheme {
        return reference.to_string();
    }
    let doc = strip_fragment(base);
    if reference.is_empty() || reference.starts_with('#') {
        return format!("{doc}{reference}");
    }
    if reference.starts_with('/') {
        // Same scheme and authority.
        let authority_end = doc.find("://").map(|i| i + 3).unwrap_or(0);
        let path_start = doc[authority_end..].find('/').map(|i| i + authority_end).unwrap_or(doc.len());
        return format!("{}{reference}", &doc[..path_start]);
    }
    match doc.rfind('/') {
        Some(i) => format!("{}{reference}", &doc[..=i]),
        None => reference.to_string(),
    }
}

fn strip_fragment(uri: &str) -> &str {
    uri.split_once('#').map_or(uri, |(d, _)| d)
}

fn percent_decode(s: &str) -> String {
    if !s.contains('%') {
        return s.to_string();
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = || {
            std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok().and_then(|h| u8::from_str_radix(h, 16).ok())
        };
        match (bytes[i], hex()) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A `$ref` target, by address (the index borrows the one schema).
type Key = *const Value;

/// Depth and productivity of `$ref` targets, memoised.
struct Walk<'i, 'a> {
    index: &'i Index<'a>,
    /// Deepest nesting under each target.
    depth: HashMap<Key, usize>,
    /// Targets known to have a finite instance (the least fixed point grows).
    productive: HashSet<Key>,
    /// Targets evaluated in this round of the fixed point.
    this_round: HashMap<Key, bool>,
    /// Targets being evaluated (a `$ref` back to one of them is a cycle).
    busy: Vec<Key>,
    /// Every target reached, with its base URI and a `$ref` naming it.
    targets: Vec<(&'a Value, String, String)>,
}

impl<'a> Walk<'_, 'a> {
    /// The nesting depth under `v`, `$ref`s followed (a cycle counts once); an error beyond
    /// [`MAX_DEPTH`].
    fn depth(&mut self, v: &'a Value, base: &str, level: usize) -> Result<usize, GrammarError> {
        if level > MAX_DEPTH {
            return Err(too_deep());
        }
        let Value::Object(o) = v else { return Ok(0) };
        let base = self.base_of(o, base, level);
        let mut deepest = 0;
        if let Some(r) = o.get("$ref").and_then(Value::as_str) {
            if let Some((target, target_base)) = self.index.resolve(&base, r) {
                let key = target as Key;
                let below = match self.depth.get(&key) {
                    Some(&d) => d,
                    None if self.busy.contains(&key) => 0,
                    None => {
                        self.targets.push((target, target_base.clone(), r.to_string()));
                        self.busy.push(key);
                        let d = self.depth(target, &target_base, level + 1);
                        self.busy.pop();
                        let d = d?;
                        self.depth.insert(key, d);
                        d
                    }
                };
                if level + 1 + below > MAX_DEPTH {
                    return Err(too_deep());
                }
                deepest = 1 + below;
            }
        }
        for child in children(o) {
            deepest = deepest.max(1 + self.depth(child, &base, level + 1)?);
        }
        Ok(deepest)
    }

    fn base_of(&self, o: &Map<String, Value>, base: &str, level: usize) -> String {
        match o.get(self.index.id_key).and_then(Value::as_str) {
            Some(id) if level > 0 => join(base, id),
            _ => base.to_string(),
        }
    }

    /// Refuse a schema with a `$ref` that recurses without end, wherever it is (in an `anyOf`
    /// it is a branch the model could take and never leave). A least fixed point: targets
    /// start unproductive and become productive when some instance of them is finite; a round
    /// that changes nothing settles it. Over-approximates what has an instance (keywords it
    /// does not model count as satisfiable), so it only refuses schemas that truly have none.
    fn productivity(&mut self, schema: &'a Value, base: &str) -> Result<(), GrammarError> {
        let targets = std::mem::take(&mut self.targets);
        for _round in 0..32 {
            let before = self.productive.len();
            self.this_round.clear();
            let mut culprit = None;
            let root = self.productive_schema(schema, base, 0, &mut culprit);
            for (target, target_base, _) in &targets {
                self.productive_ref(target, target_base, 0, &mut None);
            }
            if self.productive.len() > before {
                continue;
            }
            let dead = targets.iter().find(|(t, _, _)| !self.productive.contains(&(*t as Key)));
            return match (root, dead) {
                (false, _) => Err(endless(&culprit.unwrap_or_else(|| "#".to_string()))),
                (true, Some((_, _, r))) => Err(endless(r)),
                (true, None) => Ok(()),
            };
        }
        Ok(())
    }

    /// Whether `v` has a finite instance, given what is known of `$ref` targets. `culprit`: the
    /// first `$ref` found unproductive.
    fn productive_schema(
        &mut self,
        v: &'a Value,
        base: &str,
        level: usize,
        culprit: &mut Option<String>,
    ) -> bool {
        let Value::Object(o) = v else { return true };
        if level > 2 * MAX_DEPTH || o.contains_key("const") || o.contains_key("enum") {
            return true;
        }
        let base = self.base_of(o, base, level);
        if let Some(r) = o.get("$ref").and_then(Value::as_str) {
            if let Some((target, target_base)) = self.index.resolve(&base, r) {
                if !self.productive_ref(target, &target_base, level, culprit) {
                    culprit.get_or_insert_with(|| r.to_string());
                    return false;
                }
            }
        }
        let mut sub = |s: &'a Value, this: &mut Self| this.productive_schema(s, &base, level + 1, culprit);
        let list = |k: &str| o.get(k).and_then(Value::as_array).filter(|a| !a.is_empty());
        if let Some(all) = list("allOf") {
            if !all.iter().all(|s| sub(s, self)) {
                return false;
            }
        }
        for k in ["anyOf", "oneOf"] {
            if let Some(any) = list(k) {
                if !any.iter().any(|s| sub(s, self)) {
                    return false;
                }
            }
        }
        let types: Vec<&str> = match o.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => return true,
        };
        types.into_iter().any(|t| match t {
            "object" => {
                let required = o.get("required").and_then(Value::as_array).into_iter().flatten();
                let props = o.get("properties").and_then(Value::as_object);
                required
                    .filter_map(Value::as_str)
                    .filter_map(|name| props.and_then(|p| p.get(name)))
                    .all(|s| sub(s, self))
            }
            "array" => {
                let min = o.get("minItems").and_then(Value::as_u64).unwrap_or(0);
                let prefix = o.get("prefixItems").or(o.get("items")).and_then(Value::as_array);
                let items = o.get("items").filter(|i| i.is_object());
                (0..min.min(MAX_BRANCHES as u64) as usize).all(|i| match prefix.and_then(|p| p.get(i)) {
                    Some(s) => sub(s, self),
                    None => items.is_none_or(|s| sub(s, self)),
                })
            }
            _ => true,
        })
    }

    fn productive_ref(
        &mut self,
        target: &'a Value,
        base: &str,
        level: usize,
        culprit: &mut Option<String>,
    ) -> bool {
        let key = target as Key;
        if self.productive.contains(&key) {
            return true;
        }
        if let Some(&p) = self.this_round.get(&key) {
            return p;
        }
        if self.busy.contains(&key) {
            return false;
        }
        self.busy.push(key);
        let p = self.productive_schema(target, base, level + 1, culprit);
        self.busy.pop();
        self.this_round.insert(key, p);
        if p {
            self.productive.insert(key);
        }
        p
    }
}
