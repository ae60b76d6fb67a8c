//! Every method knob as one serde struct: what `--flags`, a request's `treespec` object and a
//! benchmark's method list all produce. Absent knobs take the method's documented default when
//! the spec is resolved ([`super::resolve`]), so a default lives in exactly one place.

use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::drafters::DySpecMode;

/// `budget`: a number of drafted nodes, or `auto` (sized each step from the measured costs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// Sized from the cost model every step.
    Auto,
    /// This many drafted nodes.
    Nodes(usize),
}

impl FromStr for Budget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(Budget::Auto);
        }
        s.parse::<usize>()
            .map(Budget::Nodes)
            .map_err(|_| format!("'{s}' is neither `auto` nor a number of drafted nodes"))
    }
}

/// JSON form: a number, or the string `"auto"`.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum BudgetJson {
    Nodes(usize),
    Word(String),
}

impl Serialize for Budget {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Budget::Auto => BudgetJson::Word("auto".into()),
            Budget::Nodes(n) => BudgetJson::Nodes(*n),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Budget {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match BudgetJson::deserialize(d)
            .map_err(|_| serde::de::Error::custom("`budget` must be a number of drafted nodes or \"auto\""))?
        {
            BudgetJson::Nodes(n) => Ok(Budget::Nodes(n)),
            BudgetJson::Word(w) => w.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl FromStr for DySpecMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "heap" => Ok(DySpecMode::Heap),
            "layer" => Ok(DySpecMode::Layer),
            other => Err(format!("unknown dyspec mode '{other}' (heap, layer)")),
        }
    }
}

/// Every method's knobs; each applies to the methods its doc names and is ignored by the
/// others (a benchmark runs several methods with one set of knobs). `None` = the default.
///
/// With the `clap` feature the same struct is the CLI's flag group, so a flag and a request knob
/// are one field with one help text.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct MethodKnobs {
    /// chain: draft tokens per step (default 4). llama.cpp: `--spec-draft-n-max`.
    #[serde(alias = "draft_max")]
    #[cfg_attr(feature = "clap", arg(short = 'k', long = "draft-max", visible_alias = "spec-draft-n-max"))]
    pub k: Option<usize>,
    /// tree: children per node at each depth (default 2,2,1,1).
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
    pub widths: Option<Vec<usize>>,
    /// specinfer: expansion vector <k1,…,km> (default 2,2,1,1).
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
    pub expand: Option<Vec<usize>>,
    /// dyspec / suffix: drafted nodes per step, or `auto` (their default: sized from the measured
    /// costs). sequoia / eagle2 / gsd: drafted nodes (a number; defaults 16 / 16 / 32).
    #[cfg_attr(feature = "clap", arg(long))]
    pub budget: Option<Budget>,
    /// dyspec / auto with a cost-aware budget: most drafted nodes a step may hold (default 16).
    #[cfg_attr(feature = "clap", arg(long))]
    pub budget_max: Option<usize>,
    /// dyspec / eagle2 / gsd / staged / sequoia / auto: deepest draft.
    #[cfg_attr(feature = "clap", arg(long))]
    pub depth: Option<usize>,
    /// dyspec: growth algorithm, `heap` or `layer` (default layer).
    #[serde(with = "dyspec_mode_text", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long))]
    pub dyspec_mode: Option<DySpecMode>,
    /// dyspec (layer mode): expansion threshold on the path value (default 1/budget).
    #[cfg_attr(feature = "clap", arg(long))]
    pub dyspec_threshold: Option<f32>,
    /// eagle2: nodes expanded per depth and children per expanded node.
    #[cfg_attr(feature = "clap", arg(long))]
    pub eagle_top_k: Option<usize>,
    /// sequoia: positional acceptance vector P[1..B] (default [`super::DEFAULT_SEQUOIA_ACCEPTANCE`]).
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
    pub acceptance: Option<Vec<f32>>,
    /// sequoia: acceptance vector file written by `treespec calibrate` (a server-side file).
    #[cfg_attr(feature = "clap", arg(long))]
    pub calibration: Option<PathBuf>,
    /// gsd: candidate children per expanded node.
    #[cfg_attr(feature = "clap", arg(long))]
    pub gsd_top_n: Option<usize>,
    /// gsd: keep a candidate only if its probability ≥ ratio × the top one's.
    #[cfg_attr(feature = "clap", arg(long))]
    pub gsd_ratio: Option<f32>,
    /// gsd: expand a node only if its probability ≥ this.
    #[cfg_attr(feature = "clap", arg(long))]
    pub gsd_parent_min: Option<f32>,
    /// gsd: context tokens in the merge key (0 or 1).
    #[cfg_attr(feature = "clap", arg(long))]
    pub gsd_r: Option<usize>,
    /// staged: second-stage tokens proposed per draft forward (0 = off).
    #[cfg_attr(feature = "clap", arg(long))]
    pub lookahead: Option<usize>,
    /// staged: depths that branch.
    #[cfg_attr(feature = "clap", arg(long))]
    pub branch_depths: Option<usize>,
    /// staged: children per node at the branching depths.
    #[cfg_attr(feature = "clap", arg(long))]
    pub branch_width: Option<usize>,
    /// lookup / staged: static n-gram table built by `treespec ngram build` (a server-side file).
    #[cfg_attr(feature = "clap", arg(long))]
    pub ngram: Option<PathBuf>,
    /// lookup: longest n-gram matched.
    #[cfg_attr(feature = "clap", arg(long))]
    pub lookup_ngram: Option<usize>,
    /// lookup: most tokens proposed per branch.
    #[cfg_attr(feature = "clap", arg(long))]
    pub lookup_tokens: Option<usize>,
    /// lookup: distinct continuations proposed as branches.
    #[cfg_attr(feature = "clap", arg(long))]
    pub lookup_branches: Option<usize>,
    /// suffix / auto: deepest suffix draft, in tokens.
    #[cfg_attr(feature = "clap", arg(long))]
    pub suffix_depth: Option<usize>,
    /// suffix / auto: most suffix-drafted nodes verified per step.
    #[cfg_attr(feature = "clap", arg(long))]
    pub suffix_nodes: Option<usize>,
    /// suffix / auto: earlier occurrences (per index) merged into the suffix tree.
    #[cfg_attr(feature = "clap", arg(long))]
    pub suffix_occurrences: Option<usize>,
    /// suffix / auto: price drafts this many standard deviations below their learned acceptance.
    #[cfg_attr(feature = "clap", arg(long))]
    pub suffix_pessimism: Option<f64>,
    /// suffix / auto: every N steps, try little-tried kinds of match optimistically (0 = never).
    #[cfg_attr(feature = "clap", arg(long))]
    pub suffix_explore: Option<u32>,
    /// suffix / auto: re-anchor copies broken by an edit (draft where the copy may resume):
    /// `on` (default) or `off` (JSON: `true` / `false`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            value_name = "on|off",
            hide_possible_values = true,
            value_parser = clap::builder::BoolishValueParser::new()
        )
    )]
    pub suffix_reanchor: Option<bool>,
    /// suffix / auto: `--no-global` drafts only from this request's own text, not from earlier
    /// requests' (JSON: `"global": false`).
    #[cfg_attr(feature = "clap", arg(long = "no-global", num_args = 0, default_missing_value = "false"))]
    pub global: Option<bool>,
    /// suffix / auto: most tokens the global history keeps (a process-wide setting).
    #[cfg_attr(feature = "clap", arg(long))]
    pub suffix_cap: Option<usize>,
    /// suffix / auto: the global history's file, read at start and written back (server-side).
    #[cfg_attr(feature = "clap", arg(long))]
    pub suffix_history: Option<PathBuf>,
    /// disco: classifier file written by `treespec disco train` (a server-side file).
    #[cfg_attr(feature = "clap", arg(long))]
    pub disco_model: Option<PathBuf>,
    /// disco: initial confidence threshold (re-fit online).
    #[cfg_attr(feature = "clap", arg(long))]
    pub disco_threshold: Option<f32>,
    /// disco: most tokens drafted per step.
    #[cfg_attr(feature = "clap", arg(long))]
    pub disco_max: Option<usize>,
    /// disco (classifier): stop when the predicted acceptance falls below this.
    #[cfg_attr(feature = "clap", arg(long))]
    pub disco_stop_prob: Option<f32>,
}

impl MethodKnobs {
    /// Knobs that name files or process-wide state: set on the command line that starts a
    /// process, never by a request (a client must not make the server read its files).
    pub fn process_wide(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        for (name, set) in [
            ("calibration", self.calibration.is_some()),
            ("ngram", self.ngram.is_some()),
            ("suffix_history", self.suffix_history.is_some()),
            ("suffix_cap", self.suffix_cap.is_some()),
            ("disco_model", self.disco_model.is_some()),
        ] {
            if set {
                v.push(name);
            }
        }
        v
    }

    /// Whether no knob is set.
    pub fn is_empty(&self) -> bool {
        *self == MethodKnobs::default()
    }
}

/// `dyspec_mode` as the text `heap` / `layer`.
mod dyspec_mode_text {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::drafters::DySpecMode;

    pub fn serialize<S: Serializer>(m: &Option<DySpecMode>, s: S) -> Result<S::Ok, S::Error> {
        match m {
            Some(DySpecMode::Heap) => s.serialize_str("heap"),
            Some(DySpecMode::Layer) => s.serialize_str("layer"),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DySpecMode>, D::Error> {
        Option::<String>::deserialize(d)?.map(|t| t.parse().map_err(serde::de::Error::custom)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_from_text_and_json() {
        assert_eq!("auto".parse::<Budget>().unwrap(), Budget::Auto);
        assert_eq!("12".parse::<Budget>().unwrap(), Budget::Nodes(12));
        assert!("x".parse::<Budget>().is_err());
        let k: MethodKnobs = serde_json::from_str(r#"{"budget": "auto", "dyspec_mode": "heap"}"#).unwrap();
        assert_eq!((k.budget, k.dyspec_mode), (Some(Budget::Auto), Some(DySpecMode::Heap)));
        let k: MethodKnobs = serde_json::from_str(r#"{"budget": 7}"#).unwrap();
        assert_eq!(k.budget, Some(Budget::Nodes(7)));
        let back: MethodKnobs = serde_json::from_str(&serde_json::to_string(&k).unwrap()).unwrap();
        assert_eq!(back, k);
        assert!(serde_json::from_str::<MethodKnobs>(r#"{"budget": -1}"#).is_err());
        assert!(serde_json::from_str::<MethodKnobs>(r#"{"budget": "many"}"#).is_err());
        assert!(serde_json::from_str::<MethodKnobs>(r#"{"kk": 3}"#).is_err());
        assert!(serde_json::from_str::<MethodKnobs>(r#"{"dyspec_mode": "wide"}"#).is_err());
    }

    #[test]
    fn file_knobs_are_process_wide() {
        let k = MethodKnobs { ngram: Some("t.bin".into()), k: Some(3), ..Default::default() };
        assert_eq!(k.process_wide(), vec!["ngram"]);
        assert!(MethodKnobs::default().is_empty() && !k.is_empty());
    }
}
