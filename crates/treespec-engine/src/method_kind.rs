//! The method names: one typed enum, one spelling table, used by every front end.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A decoding method by name (`--method NAME`, a request's `"treespec": {"method": NAME}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MethodKind {
    /// One target forward per token.
    Plain,
    /// A chain of `k` draft tokens.
    Chain,
    /// A fixed tree, children drawn without replacement.
    Tree,
    /// SpecInfer's static expansion tree, i.i.d. children.
    #[serde(rename = "specinfer")]
    SpecInfer,
    /// Sequoia's DP-optimal tree.
    Sequoia,
    /// DySpec's dynamic tree (cost-aware budget unless given a number).
    #[serde(rename = "dyspec")]
    DySpec,
    /// EAGLE-2's dynamic tree.
    Eagle2,
    /// Graph-structured drafts.
    Gsd,
    /// Staged drafting with an n-gram second stage.
    Staged,
    /// Prompt lookup / context n-grams (model-free).
    Lookup,
    /// Suffix drafting over this and earlier requests' text (model-free).
    Suffix,
    /// Dynamic speculation lookahead.
    Disco,
    /// Per step, the best of suffix drafts, DySpec and plain decoding on the measured costs.
    Auto,
}

impl MethodKind {
    /// Whether the method drafts from suffix state (a global history and learned prices) that
    /// outlives a request, and so may be kept in files ([`crate::drafters::SuffixStore`]).
    pub fn keeps_suffix_state(self) -> bool {
        matches!(self, MethodKind::Suffix | MethodKind::Auto)
    }

    /// Every method, in the order reports list them.
    pub const ALL: [MethodKind; 13] = [
        MethodKind::Plain,
        MethodKind::Chain,
        MethodKind::Tree,
        MethodKind::SpecInfer,
        MethodKind::Sequoia,
        MethodKind::DySpec,
        MethodKind::Eagle2,
        MethodKind::Gsd,
        MethodKind::Staged,
        MethodKind::Lookup,
        MethodKind::Suffix,
        MethodKind::Disco,
        MethodKind::Auto,
    ];

    /// The method's name, as typed on the command line and in requests.
    pub const fn as_str(self) -> &'static str {
        match self {
            MethodKind::Plain => "plain",
            MethodKind::Chain => "chain",
            MethodKind::Tree => "tree",
            MethodKind::SpecInfer => "specinfer",
            MethodKind::Sequoia => "sequoia",
            MethodKind::DySpec => "dyspec",
            MethodKind::Eagle2 => "eagle2",
            MethodKind::Gsd => "gsd",
            MethodKind::Staged => "staged",
            MethodKind::Lookup => "lookup",
            MethodKind::Suffix => "suffix",
            MethodKind::Disco => "disco",
            MethodKind::Auto => "auto",
        }
    }

    /// Whether the method cannot run without a draft model.
    pub const fn needs_draft(self) -> bool {
        !matches!(self, MethodKind::Plain | MethodKind::Lookup | MethodKind::Suffix | MethodKind::Auto)
    }

    /// Whether the method runs a draft model when one is loaded (`auto` uses one if offered).
    pub const fn uses_draft(self) -> bool {
        self.needs_draft() || matches!(self, MethodKind::Auto)
    }
}

/// Every method name, in [`MethodKind::ALL`] order.
pub const METHOD_NAMES: &[&str] = &NAMES;

const NAMES: [&str; 13] = {
    let mut names = [""; 13];
    let mut i = 0;
    while i < 13 {
        names[i] = MethodKind::ALL[i].as_str();
        i += 1;
    }
    names
};

impl fmt::Display for MethodKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for MethodKind {
    type Err = String;

    /// Names are matched exactly (lower case), as llama.cpp's `common_speculative_type_from_name`.
    fn from_str(s: &str) -> Result<Self, String> {
        MethodKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown method '{s}' (one of {})", METHOD_NAMES.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_text_and_json() {
        for k in MethodKind::ALL {
            assert_eq!(k.as_str().parse::<MethodKind>().unwrap(), k);
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.as_str()));
            assert_eq!(serde_json::from_str::<MethodKind>(&json).unwrap(), k);
        }
        let e = "magic".parse::<MethodKind>().unwrap_err();
        assert!(e.contains("unknown method 'magic'") && e.contains("dyspec"), "{e}");
        assert!("Chain".parse::<MethodKind>().is_err());
    }
}
