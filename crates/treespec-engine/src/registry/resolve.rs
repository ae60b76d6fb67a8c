//! [`MethodSpec`] → [`Method`]: the one place where a method's name and knobs become the
//! drafter configuration, with every default applied. The CLI, the server, the benchmark and the
//! demo all come through here, so a method means the same thing everywhere.

use std::path::Path;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use treespec_core::cost::CostCurve;
use treespec_core::disco::DiscoModel;
use treespec_core::ngram::{NgramTable, TokenizerId};
use treespec_core::suffix::{GlobalHistory, DEFAULT_CAP_TOKENS};

use super::{Budget, MethodKind, MethodKnobs};
use crate::auto_budget::{CostModel, SharedCosts};
use crate::drafters::{
    history_file, AutoConfig, DiscoConfig, DiscoMode, DySpecConfig, Eagle2Config, GsdConfig, LookupConfig,
    SequoiaConfig, StagedConfig, SuffixConfig, SuffixShared,
};
use crate::error::{EngineError, Result};
use crate::measure::offline::AcceptanceVector;
use crate::methods::Method;
use crate::toy::{ToyLm, ToyModel};

/// Drafted nodes of [`MethodSpec::without_costs`]'s suffix drafts: the drafter still keeps only
/// nodes whose learned value clears its floor, so this caps a long copy, not a weak guess.
pub const FIXED_SUFFIX_NODES: usize = 16;
/// Drafted nodes of [`MethodSpec::without_costs`]'s DySpec: a small tree, which pays on every
/// machine this project has measured.
pub const FIXED_DYSPEC_NODES: usize = 8;

/// Sequoia's positional acceptance vector when none is given: measured by `treespec calibrate`
/// on the Qwen2.5-Coder 1.5B/0.5B pair, greedy (`bench/results/qwen-pair.accept.json`), rounded. A
/// calibration file for the pair at hand (`--calibration`) is better.
pub const DEFAULT_SEQUOIA_ACCEPTANCE: [f32; 4] = [0.8, 0.1, 0.05, 0.01];

/// What resolving a method may need from the loaded models; asked only when the method needs it
/// (so a plain run never profiles or fingerprints anything).
pub trait MethodContext {
    /// The target tokenizer's fingerprint (n-gram tables and saved histories must match it).
    fn tokenizer(&self) -> Result<TokenizerId>;
    /// The measured cost curves: the target's, and the draft's when a draft is loaded.
    fn costs(&self) -> Result<CostModel>;
    /// Suffix state shared by every method of the process (a server's global history), if any.
    fn suffix_shared(&self) -> Option<Arc<SuffixShared>> {
        None
    }
}

/// A context with fixed answers (toy backends, tests, knob checks).
#[derive(Debug, Clone, Default)]
pub struct FixedContext {
    /// The tokenizer fingerprint, if there is one.
    pub tokenizer: Option<TokenizerId>,
    /// The cost curves, if known.
    pub costs: Option<CostModel>,
    /// Shared suffix state, if any.
    pub suffix: Option<Arc<SuffixShared>>,
}

impl MethodContext for FixedContext {
    fn tokenizer(&self) -> Result<TokenizerId> {
        self.tokenizer.ok_or_else(|| invalid("an n-gram table or saved history needs the target's tokenizer"))
    }
    fn costs(&self) -> Result<CostModel> {
        self.costs.clone().ok_or_else(|| invalid("this method needs the measured cost curves"))
    }
    fn suffix_shared(&self) -> Option<Arc<SuffixShared>> {
        self.suffix.clone()
    }
}

/// A method by name with its knobs: the typed configuration every front end produces.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MethodSpec {
    /// The method.
    pub method: MethodKind,
    /// Its knobs (absent = default).
    #[serde(flatten)]
    pub knobs: MethodKnobs,
}

fn invalid(m: impl Into<String>) -> EngineError {
    EngineError::InvalidRequest(m.into())
}

fn load_error(what: &str, path: &Path, e: impl std::fmt::Display) -> EngineError {
    invalid(format!("loading {what} {}: {e}", path.display()))
}

impl MethodSpec {
    /// A method with default knobs.
    pub fn new(method: MethodKind) -> Self {
        Self { method, knobs: MethodKnobs::default() }
    }

    /// The same knobs for another method (a benchmark runs several methods with one set).
    pub fn with_method(&self, method: MethodKind) -> Self {
        Self { method, knobs: self.knobs.clone() }
    }

    /// Parse a JSON object `{"method": NAME, knob: value, …}`; unknown knobs are refused. `None`
    /// when the object names no method and sets no knob.
    pub fn from_json(value: Value) -> Result<Option<Self>> {
        let Value::Object(mut map) = value else {
            return Err(invalid("the method must be a JSON object such as {\"method\": \"dyspec\"}"));
        };
        let method = map.remove("method").filter(|v| !v.is_null());
        let knobs: MethodKnobs =
            serde_json::from_value(Value::Object(map)).map_err(|e| invalid(e.to_string()))?;
        let Some(method) = method else {
            if knobs.is_empty() {
                return Ok(None);
            }
            return Err(invalid("knobs need a `method` to apply to"));
        };
        let method: MethodKind = serde_json::from_value(method.clone()).map_err(|_| {
            invalid(match method.as_str() {
                Some(s) => s.parse::<MethodKind>().err().unwrap_or_default(),
                None => "`method` must be a string".into(),
            })
        })?;
        Ok(Some(Self { method, knobs }))
    }

    /// Whether resolving needs the measured cost curves: `auto`, and `dyspec` and `suffix` unless
    /// given a numeric budget.
    pub fn needs_costs(&self) -> bool {
        match self.method {
            MethodKind::Auto => true,
            MethodKind::DySpec | MethodKind::Suffix => !matches!(self.knobs.budget, Some(Budget::Nodes(_))),
            _ => false,
        }
    }

    /// The nearest spec that needs no cost curve, for the time until this machine's is measured:
    /// the cost-aware suffix and DySpec budgets become fixed ones, `auto` becomes suffix drafting
    /// on a fixed budget (its free half); the others are themselves.
    pub fn without_costs(&self) -> MethodSpec {
        if !self.needs_costs() {
            return self.clone();
        }
        let (method, nodes) = match self.method {
            MethodKind::DySpec => (MethodKind::DySpec, FIXED_DYSPEC_NODES),
            _ => (MethodKind::Suffix, FIXED_SUFFIX_NODES),
        };
        let mut knobs = if method == self.method { self.knobs.clone() } else { MethodKnobs::default() };
        knobs.budget = Some(Budget::Nodes(nodes));
        MethodSpec { method, knobs }
    }

    /// Whether resolving needs the target tokenizer's fingerprint (an n-gram table or a saved
    /// suffix history must belong to it).
    pub fn needs_tokenizer(&self) -> bool {
        let k = &self.knobs;
        (k.ngram.is_some() && matches!(self.method, MethodKind::Lookup | MethodKind::Staged))
            || (k.suffix_history.is_some() && self.method.keeps_suffix_state())
    }

    /// Check every knob's domain without loading anything: the method is resolved on
    /// placeholder costs with its files left out, and its drafter built on a tiny toy pair.
    pub fn validate(&self) -> Result<()> {
        let mut dry = self.clone();
        let k = &mut dry.knobs;
        (k.ngram, k.suffix_history, k.disco_model, k.calibration) = (None, None, None, None);
        let curve = |base, per| CostCurve::linear(base, per, 32).expect("valid linear curve");
        let ctx = FixedContext {
            costs: Some(CostModel::new(curve(10.0, 1.0), Some(curve(1.0, 0.5)))),
            ..Default::default()
        };
        let method = dry.resolve(&ctx)?;
        let toy = ToyLm::new(ToyModel::new(4, 1, 1), 64);
        method.build(Some(toy)).map(|_| ())
    }

    /// The method's drafter configuration, with every default applied.
    pub fn resolve(&self, ctx: &dyn MethodContext) -> Result<Method> {
        // Each resolved method gets its own learned state (cost refinements, calibration).
        let costs = if self.needs_costs() { Some(SharedCosts::new(ctx.costs()?)) } else { None };
        let k = &self.knobs;
        Ok(match self.method {
            MethodKind::Plain => Method::Plain,
            MethodKind::Chain => Method::Chain { k: k.k.unwrap_or(4) },
            MethodKind::Tree => Method::Tree { widths: k.widths.clone().unwrap_or_else(|| vec![2, 2, 1, 1]) },
            MethodKind::SpecInfer => {
                Method::SpecInfer { expand: k.expand.clone().unwrap_or_else(|| vec![2, 2, 1, 1]) }
            }
            MethodKind::Sequoia => Method::Sequoia(self.sequoia()?),
            MethodKind::DySpec => Method::DySpec(self.dyspec(costs)?),
            MethodKind::Eagle2 => {
                let d = Eagle2Config::default();
                Method::Eagle2(Eagle2Config {
                    top_k: k.eagle_top_k.unwrap_or(d.top_k),
                    depth: k.depth.unwrap_or(d.depth),
                    total: self.nodes(d.total)?,
                })
            }
            MethodKind::Gsd => {
                let d = GsdConfig::default();
                Method::Gsd(GsdConfig {
                    top_n: k.gsd_top_n.unwrap_or(d.top_n),
                    ratio: k.gsd_ratio.unwrap_or(d.ratio),
                    parent_min: k.gsd_parent_min.unwrap_or(d.parent_min),
                    r: k.gsd_r.unwrap_or(d.r),
                    max_depth: k.depth.unwrap_or(d.max_depth),
                    budget: self.nodes(d.budget)?,
                    ..d
                })
            }
            MethodKind::Staged => {
                let d = StagedConfig::default();
                Method::Staged(StagedConfig {
                    depth: k.depth.unwrap_or(d.depth),
                    branch_depths: k.branch_depths.unwrap_or(d.branch_depths),
                    branch_width: k.branch_width.unwrap_or(d.branch_width),
                    lookahead: k.lookahead.unwrap_or(d.lookahead),
                    table: self.table(ctx)?,
                    ..d
                })
            }
            MethodKind::Lookup => {
                let d = LookupConfig::default();
                let config = LookupConfig {
                    max_ngram: k.lookup_ngram.unwrap_or(d.max_ngram),
                    max_tokens: k.lookup_tokens.unwrap_or(d.max_tokens),
                    branches: k.lookup_branches.unwrap_or(d.branches),
                    ..d
                };
                Method::Lookup { config, table: self.table(ctx)? }
            }
            MethodKind::Suffix => Method::Suffix(self.suffix(ctx, costs)?),
            MethodKind::Disco => Method::Disco(self.disco()?),
            MethodKind::Auto => {
                let costs = costs.expect("auto always needs costs");
                let d = DySpecConfig::default();
                let dyspec = DySpecConfig {
                    budget: k.budget_max.unwrap_or(d.budget),
                    max_depth: k.depth.unwrap_or(d.max_depth),
                    ..d
                };
                Method::Auto(AutoConfig { suffix: self.suffix(ctx, None)?, costs, dyspec, trace: None })
            }
        })
    }

    /// A numeric budget; `auto` is refused for the methods without cost-aware sizing.
    fn nodes(&self, default: usize) -> Result<usize> {
        match self.knobs.budget {
            None => Ok(default),
            Some(Budget::Nodes(n)) => Ok(n),
            Some(Budget::Auto) => Err(invalid(format!(
                "budget auto applies to dyspec, suffix and auto; give {} a number of nodes",
                self.method
            ))),
        }
    }

    fn sequoia(&self) -> Result<SequoiaConfig> {
        let k = &self.knobs;
        let acceptance = match (&k.acceptance, &k.calibration) {
            (Some(a), _) => a.clone(),
            (None, Some(path)) => {
                AcceptanceVector::load(path).map_err(|e| load_error("calibration", path, e))?.acceptance
            }
            (None, None) => DEFAULT_SEQUOIA_ACCEPTANCE.to_vec(),
        };
        let d = SequoiaConfig::default();
        Ok(SequoiaConfig { budget: self.nodes(d.budget)?, max_depth: k.depth.or(d.max_depth), acceptance })
    }

    fn dyspec(&self, costs: Option<Arc<SharedCosts>>) -> Result<DySpecConfig> {
        let (k, d) = (&self.knobs, DySpecConfig::default());
        let budget = match costs {
            Some(_) => k.budget_max.unwrap_or(d.budget),
            None => self.nodes(d.budget)?,
        };
        Ok(DySpecConfig {
            budget,
            max_depth: k.depth.unwrap_or(d.max_depth),
            mode: k.dyspec_mode.unwrap_or(d.mode),
            threshold: k.dyspec_threshold.or(d.threshold),
            costs,
        })
    }

    fn table(&self, ctx: &dyn MethodContext) -> Result<Option<Arc<NgramTable>>> {
        let Some(path) = &self.knobs.ngram else { return Ok(None) };
        let table =
            NgramTable::load(path, ctx.tokenizer()?).map_err(|e| load_error("n-gram table", path, e))?;
        Ok(Some(Arc::new(table)))
    }

    /// The suffix drafter's knobs: the process-wide shared state when the context has one, else
    /// a history of its own (loaded from `suffix_history` when that file exists).
    fn suffix(&self, ctx: &dyn MethodContext, costs: Option<Arc<SharedCosts>>) -> Result<SuffixConfig> {
        let k = &self.knobs;
        let shared = match ctx.suffix_shared() {
            Some(s) => s,
            None => {
                let cap = k.suffix_cap.unwrap_or(DEFAULT_CAP_TOKENS);
                let history = match &k.suffix_history {
                    Some(path) if path.exists() => history_file::format::load(path, ctx.tokenizer()?, cap)
                        .map_err(|e| load_error("suffix history", path, e))?,
                    _ => GlobalHistory::new(cap)?,
                };
                SuffixShared::new(history)
            }
        };
        let d = SuffixConfig::default();
        let config = SuffixConfig {
            max_depth: k.suffix_depth.unwrap_or(d.max_depth),
            max_nodes: match k.budget {
                Some(Budget::Nodes(n)) => n,
                _ => k.suffix_nodes.unwrap_or(d.max_nodes),
            },
            occurrences: k.suffix_occurrences.unwrap_or(d.occurrences),
            pessimism: k.suffix_pessimism.unwrap_or(d.pessimism),
            explore_every: k.suffix_explore.unwrap_or(d.explore_every),
            reanchor: k.suffix_reanchor.unwrap_or(d.reanchor),
            global: k.global.unwrap_or(d.global),
            costs,
            shared,
            ..d
        };
        config.validate()?;
        Ok(config)
    }

    fn disco(&self) -> Result<DiscoConfig> {
        let (k, d) = (&self.knobs, DiscoConfig::default());
        let mode = match &k.disco_model {
            Some(path) => DiscoMode::Classifier(Arc::new(
                DiscoModel::load(path).map_err(|e| load_error("disco classifier", path, e))?,
            )),
            None => DiscoMode::Threshold,
        };
        Ok(DiscoConfig {
            mode,
            max_tokens: k.disco_max.unwrap_or(d.max_tokens),
            threshold: k.disco_threshold.unwrap_or(d.threshold),
            stop_prob: k.disco_stop_prob.unwrap_or(d.stop_prob),
        })
    }
}
