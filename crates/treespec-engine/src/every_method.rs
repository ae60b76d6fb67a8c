//! Every speculative method of the registry at small sizes, for the tests that check a property
//! of all of them at once (greedy and seeded output equal plain decoding's, on toys and on real
//! models). One list, so a method added to the registry is added to every such test.

use std::sync::Arc;

use crate::auto_budget::SharedCosts;
use crate::drafters::{
    AutoConfig, DiscoConfig, DySpecConfig, DySpecMode, Eagle2Config, GsdConfig, LookupConfig, SequoiaConfig,
    StagedConfig, SuffixConfig,
};
use crate::methods::Method;

/// Every speculative method (plain decoding is the reference), with trees of at most 12 nodes;
/// `costs` is the cost model of the cost-aware ones (a curve on which verifying is cheap makes
/// them draft).
pub fn speculative_methods(costs: &Arc<SharedCosts>) -> Vec<Method> {
    vec![
        Method::Chain { k: 4 },
        Method::Tree { widths: vec![2, 2, 1] },
        Method::SpecInfer { expand: vec![2, 1, 1] },
        Method::Sequoia(SequoiaConfig { budget: 8, max_depth: None, acceptance: vec![0.7, 0.15, 0.05] }),
        Method::DySpec(DySpecConfig { budget: 10, ..Default::default() }),
        Method::DySpec(DySpecConfig { budget: 6, mode: DySpecMode::Heap, ..Default::default() }),
        Method::Eagle2(Eagle2Config { top_k: 3, depth: 4, total: 10 }),
        Method::Gsd(GsdConfig { budget: 12, ..Default::default() }),
        Method::Staged(StagedConfig::default()),
        Method::Lookup { config: LookupConfig::default(), table: None },
        Method::Disco(DiscoConfig::default()),
        // Every node it finds, verified (the global history carries across requests).
        Method::Suffix(SuffixConfig { min_value: 0.0, max_nodes: 12, ..Default::default() }),
        Method::Suffix(SuffixConfig { costs: Some(costs.clone()), max_nodes: 12, ..Default::default() }),
        Method::Auto(AutoConfig {
            costs: costs.clone(),
            suffix: SuffixConfig { max_nodes: 12, ..Default::default() },
            dyspec: DySpecConfig::default(),
            trace: None,
        }),
    ]
}
