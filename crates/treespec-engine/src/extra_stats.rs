//! Method-specific statistics of one generation ([`Drafter::extra_stats`](crate::Drafter)), for
//! reports. A drafter fills the groups it has; serialised flat, one key per number (`gsd_merges`,
//! `suffix_drafting_steps`, …), as in `results.json`'s `extra` and `treespec generate --json`.

use serde::Serialize;

/// Every group a drafter may report; `None` groups are left out of the serialised form.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ExtraStats {
    /// The `auto` method's choice per step.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoChoices>,
    /// A cost-aware (`--budget auto`) drafter's decisions.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetDecisions>,
    /// A cost-aware drafter's calibrated acceptance at depths 1–3 (absent before any trial).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub calibrated: Option<CalibratedAcceptance>,
    /// The suffix drafter's counters.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub suffix: Option<SuffixCounts>,
    /// GSD's merging.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub gsd: Option<GsdCounts>,
    /// Staged drafting's second stage.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub staged: Option<StagedCounts>,
}

/// Steps of the `auto` method by the proposal it verified.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct AutoChoices {
    /// Plain decoding (nothing drafted).
    #[serde(rename = "auto_plain_steps")]
    pub plain_steps: u64,
    /// The suffix draft.
    #[serde(rename = "auto_suffix_steps")]
    pub suffix_steps: u64,
    /// A long exact match's chain (the ngram-mod kind).
    #[serde(rename = "auto_long_match_steps")]
    pub long_match_steps: u64,
    /// The draft model's tree (alone or with suffix drafts grafted on).
    #[serde(rename = "auto_model_steps")]
    pub model_steps: u64,
    /// Of the model steps, those that verified the model's tree with the suffix draft's nodes
    /// grafted on (greedy decoding, when the extra rows paid).
    #[serde(rename = "auto_combined_steps")]
    pub combined_steps: u64,
}

/// What a cost-aware drafter decided.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct BudgetDecisions {
    /// Steps that verified no drafted node, drafting skipped or pruned away.
    #[serde(rename = "auto_plain_steps")]
    pub plain_steps: u64,
    /// Steps that skipped the draft model entirely.
    #[serde(rename = "auto_skipped_drafts")]
    pub skipped_drafts: u64,
    /// Drafted nodes pruned before verification.
    #[serde(rename = "auto_pruned_nodes")]
    pub pruned_nodes: u64,
}

/// Calibrated acceptance at depths 1, 2 and 3.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CalibratedAcceptance {
    /// Depth 1.
    #[serde(rename = "calibrated_accept_d1", skip_serializing_if = "Option::is_none")]
    pub d1: Option<f64>,
    /// Depth 2.
    #[serde(rename = "calibrated_accept_d2", skip_serializing_if = "Option::is_none")]
    pub d2: Option<f64>,
    /// Depth 3.
    #[serde(rename = "calibrated_accept_d3", skip_serializing_if = "Option::is_none")]
    pub d3: Option<f64>,
}

/// The suffix drafter's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SuffixCounts {
    /// Steps whose match came from this request's text.
    #[serde(rename = "suffix_local_hit_steps")]
    pub local_hit_steps: u64,
    /// Steps whose match came from earlier requests' text.
    #[serde(rename = "suffix_global_hit_steps")]
    pub global_hit_steps: u64,
    /// Steps that proposed a draft.
    #[serde(rename = "suffix_drafting_steps")]
    pub drafting_steps: u64,
    /// Steps that drafted to explore (below the price).
    #[serde(rename = "suffix_explore_steps")]
    pub explore_steps: u64,
    /// Drafted nodes verified.
    #[serde(rename = "suffix_verified_nodes")]
    pub verified_nodes: u64,
    /// Of those, accepted.
    #[serde(rename = "suffix_accepted_nodes")]
    pub accepted_nodes: u64,
    /// Accepted ÷ verified (absent before any verified node).
    #[serde(rename = "suffix_node_accept_rate", skip_serializing_if = "Option::is_none")]
    pub node_accept_rate: Option<f64>,
}

/// GSD's merging.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct GsdCounts {
    /// Links added instead of drafting a new node.
    #[serde(rename = "gsd_merges")]
    pub merges: u64,
    /// DAG nodes drafted.
    #[serde(rename = "gsd_dag_nodes")]
    pub dag_nodes: u64,
    /// Proposed nodes reached through a link (draft rows not computed).
    #[serde(rename = "gsd_draft_rows_saved")]
    pub draft_rows_saved: u64,
}

/// Staged drafting's second stage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StagedCounts {
    /// Second-stage proposals the draft used ÷ proposals fed (0 before any).
    #[serde(rename = "staged_second_stage_acceptance")]
    pub second_stage_acceptance: f64,
}

impl ExtraStats {
    /// The flat `name → value` form (the serialised keys, sorted), for tables and JSON reports.
    pub fn to_map(&self) -> serde_json::Map<String, serde_json::Value> {
        match serde_json::to_value(self) {
            // Sorted explicitly: serde_json keeps insertion order when a crate in the build
            // (llguidance) turns on its `preserve_order` feature.
            Ok(serde_json::Value::Object(m)) => {
                let sorted: std::collections::BTreeMap<_, _> = m.into_iter().collect();
                sorted.into_iter().collect()
            }
            _ => serde_json::Map::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_flat_with_the_report_keys() {
        let gsd = GsdCounts { merges: 2, dag_nodes: 5, draft_rows_saved: 1 };
        let calibrated = CalibratedAcceptance { d1: Some(0.5), d2: None, d3: None };
        let m = ExtraStats { gsd: Some(gsd), calibrated: Some(calibrated), ..ExtraStats::default() }.to_map();
        let keys: Vec<&str> = m.keys().map(String::as_str).collect();
        assert_eq!(keys, ["calibrated_accept_d1", "gsd_dag_nodes", "gsd_draft_rows_saved", "gsd_merges"]);
        assert!(ExtraStats::default().to_map().is_empty());
    }
}
