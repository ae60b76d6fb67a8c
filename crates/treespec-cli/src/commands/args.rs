//! Argument groups shared by `generate`, `bench` and `serve`: models, sampling, method knobs.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use treespec_core::disco::DiscoModel;
use treespec_core::ngram::{NgramTable, TokenizerId};
use treespec_core::sampling::SamplingParams;
use treespec_core::suffix::{GlobalHistory, DEFAULT_CAP_TOKENS};
use treespec_engine::auto_budget::{CostModel, SharedCosts};
use treespec_engine::drafters::{
    AutoConfig, DiscoConfig, DiscoMode, DySpecConfig, DySpecMode, Eagle2Config, GsdConfig, LookupConfig,
    SequoiaConfig, StagedConfig, SuffixConfig, SuffixShared,
};
use treespec_engine::offline_measure::AcceptanceVector;
use treespec_engine::{Method, METHOD_NAMES};
use treespec_llama::{LlamaModel, LoadOptions};

/// Which model files to run and how.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// Target model (GGUF).
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Draft model (GGUF) for methods that need one; may be the target file itself.
    #[arg(long = "draft", visible_alias = "md")]
    pub draft: Option<PathBuf>,
    /// CPU threads (default: all cores; more are capped to them).
    #[arg(short = 't', long, value_parser = super::threads::threads_arg)]
    pub threads: Option<usize>,
    /// Context size in tokens.
    #[arg(long = "ctx", default_value_t = 4096)]
    pub ctx: usize,
    /// Batch-invariant kernels: a token's logits do not depend on the tree it is scored in, so
    /// greedy output equals plain decoding token for token (slower on repacked quantizations).
    #[arg(long)]
    pub exact: bool,
}

impl ModelArgs {
    /// Load options for both models.
    pub fn load_options(&self) -> LoadOptions {
        let mut o = LoadOptions { ctx_size: self.ctx, exact: self.exact, ..LoadOptions::default() };
        if let Some(t) = self.threads {
            o.threads = t;
        }
        o
    }
}

/// Sampling parameters.
#[derive(Debug, Clone, Args)]
pub struct SamplingArgs {
    /// Temperature (0 = greedy).
    #[arg(long = "temp", default_value_t = 0.0, allow_negative_numbers = true)]
    pub temp: f32,
    /// Keep only the k most likely tokens.
    #[arg(long = "top-k")]
    pub top_k: Option<usize>,
    /// Nucleus sampling threshold in (0, 1].
    #[arg(long = "top-p", default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Drop tokens below min-p × the top probability.
    #[arg(long = "min-p", default_value_t = 0.0, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Repetition penalty (1 = off) over the last 64 tokens.
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Seed for the draft and verifier random streams.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SamplingArgs {
    /// Validated sampling parameters.
    pub fn params(&self) -> Result<SamplingParams> {
        let p = SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            ..SamplingParams::default()
        };
        p.validate()?;
        Ok(p)
    }
}

/// DySpec's growth algorithm.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DySpecModeArg {
    /// Algorithm 1: heap of sampling events, a draft forward per expanded node.
    Heap,
    /// Algorithm 2: layer-wise, one batched draft forward per depth.
    Layer,
}

/// The decoding method and its knobs (each applies to the methods named in its help).
#[derive(Debug, Clone, Args)]
pub struct MethodArgs {
    /// Decoding method.
    #[arg(long, default_value = "plain", value_parser = clap::builder::PossibleValuesParser::new(METHOD_NAMES))]
    pub method: String,
    /// chain: draft tokens per step.
    #[arg(short = 'k', long = "draft-max", default_value_t = 4)]
    pub k: usize,
    /// tree: children per node at each depth.
    #[arg(long, value_delimiter = ',', default_value = "2,2,1,1")]
    pub widths: Vec<usize>,
    /// specinfer: expansion vector <k1,…,km>.
    #[arg(long, value_delimiter = ',', default_value = "2,2,1,1")]
    pub expand: Vec<usize>,
    /// dyspec / sequoia / eagle2 (nodes kept) / gsd (DAG nodes): drafted nodes per step. `auto`
    /// (dyspec's default): sized every step from the measured cost curves and calibrated
    /// acceptance, down to nothing (plain decoding) where drafting does not pay.
    #[arg(long)]
    pub budget: Option<BudgetArg>,
    /// dyspec / auto with `--budget auto`: most drafted nodes a step may hold.
    #[arg(long = "budget-max", default_value_t = 16)]
    pub budget_max: usize,
    /// Re-measure the cost curves instead of reading the cache.
    #[arg(long)]
    pub reprofile: bool,
    /// dyspec / eagle2 / gsd / staged / sequoia: deepest draft.
    #[arg(long)]
    pub depth: Option<usize>,
    /// dyspec: growth algorithm.
    #[arg(long = "dyspec-mode", value_enum, default_value = "layer")]
    pub dyspec_mode: DySpecModeArg,
    /// dyspec (layer mode): expansion threshold on the path value (default 1/budget).
    #[arg(long = "dyspec-threshold")]
    pub dyspec_threshold: Option<f32>,
    /// eagle2: nodes expanded per depth and children per expanded node.
    #[arg(long = "eagle-top-k")]
    pub eagle_top_k: Option<usize>,
    /// sequoia: positional acceptance vector P[1..B], e.g. 0.6,0.15,0.05.
    #[arg(long, value_delimiter = ',')]
    pub acceptance: Option<Vec<f32>>,
    /// sequoia: acceptance vector file written by `treespec calibrate`.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// gsd: candidate children per expanded node.
    #[arg(long = "gsd-top-n")]
    pub gsd_top_n: Option<usize>,
    /// gsd: keep a candidate only if its probability ≥ ratio × the top one's.
    #[arg(long = "gsd-ratio")]
    pub gsd_ratio: Option<f32>,
    /// gsd: expand a node only if its probability ≥ this.
    #[arg(long = "gsd-parent-min")]
    pub gsd_parent_min: Option<f32>,
    /// gsd: context tokens in the merge key (0 or 1).
    #[arg(long = "gsd-r")]
    pub gsd_r: Option<usize>,
    /// staged: second-stage tokens proposed per draft forward (0 = off).
    #[arg(long)]
    pub lookahead: Option<usize>,
    /// staged: depths that branch.
    #[arg(long = "branch-depths")]
    pub branch_depths: Option<usize>,
    /// staged: children per node at the branching depths.
    #[arg(long = "branch-width")]
    pub branch_width: Option<usize>,
    /// lookup / staged: static n-gram table built by `treespec ngram build`.
    #[arg(long)]
    pub ngram: Option<PathBuf>,
    /// lookup: longest n-gram matched.
    #[arg(long = "lookup-ngram")]
    pub lookup_ngram: Option<usize>,
    /// lookup: most tokens proposed per branch.
    #[arg(long = "lookup-tokens")]
    pub lookup_tokens: Option<usize>,
    /// lookup: distinct continuations proposed as branches.
    #[arg(long = "lookup-branches")]
    pub lookup_branches: Option<usize>,
    /// suffix / auto: deepest suffix draft, in tokens.
    #[arg(long = "suffix-depth")]
    pub suffix_depth: Option<usize>,
    /// suffix / auto: most suffix-drafted nodes verified per step.
    #[arg(long = "suffix-nodes")]
    pub suffix_nodes: Option<usize>,
    /// suffix / auto: earlier occurrences (per index) merged into the suffix tree.
    #[arg(long = "suffix-occurrences")]
    pub suffix_occurrences: Option<usize>,
    /// suffix / auto: price suffix drafts this many standard deviations below their learned
    /// acceptance (0 = at the mean).
    #[arg(long = "suffix-pessimism")]
    pub suffix_pessimism: Option<f64>,
    /// suffix / auto: every N steps, try little-tried kinds of match optimistically (0 = never).
    #[arg(long = "suffix-explore")]
    pub suffix_explore: Option<u32>,
    /// suffix / auto: draft only from this request's own text, not from earlier requests'.
    #[arg(long = "no-global")]
    pub no_global: bool,
    /// suffix / auto: most tokens the global history of earlier requests keeps (oldest evicted).
    #[arg(long = "suffix-cap", default_value_t = DEFAULT_CAP_TOKENS)]
    pub suffix_cap: usize,
    /// suffix / auto: a file holding the global history: read at start if it exists, written
    /// back after the run, so earlier runs' text is drafted from.
    #[arg(long = "suffix-history")]
    pub suffix_history: Option<PathBuf>,
    /// disco: classifier file written by `treespec disco train` (default: confidence threshold).
    #[arg(long = "disco-model")]
    pub disco_model: Option<PathBuf>,
    /// disco: initial confidence threshold (re-fit online).
    #[arg(long = "disco-threshold")]
    pub disco_threshold: Option<f32>,
    /// disco: most tokens drafted per step.
    #[arg(long = "disco-max")]
    pub disco_max: Option<usize>,
    /// disco (classifier): stop when the predicted acceptance falls below this.
    #[arg(long = "disco-stop-prob")]
    pub disco_stop_prob: Option<f32>,
}

/// `--budget`: a fixed number of drafted nodes, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetArg {
    /// Sized from the cost model every step.
    Auto,
    /// This many drafted nodes.
    Nodes(usize),
}

impl std::str::FromStr for BudgetArg {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(BudgetArg::Auto);
        }
        s.parse::<usize>()
            .map(BudgetArg::Nodes)
            .map_err(|_| format!("'{s}' is neither `auto` nor a number of drafted nodes"))
    }
}

impl MethodArgs {
    /// Whether method `name` needs the measured cost curves (`auto`, and dyspec and suffix unless
    /// given a numeric budget).
    pub fn needs_costs(&self, name: &str) -> bool {
        name == "auto"
            || (matches!(name, "dyspec" | "suffix") && !matches!(self.budget, Some(BudgetArg::Nodes(_))))
    }

    /// Whether the method's drafts need the target's tokenizer fingerprint (an n-gram table or a
    /// saved suffix history must belong to it).
    pub fn needs_tokenizer(&self, name: &str) -> bool {
        self.ngram.is_some() || (self.suffix_history.is_some() && matches!(name, "suffix" | "auto"))
    }

    /// The suffix drafter's knobs: its global history (loaded from `--suffix-history` when the
    /// file exists) and the cost curves, if the method is cost-aware.
    fn suffix(
        &self,
        tokenizer: Option<TokenizerId>,
        costs: Option<Arc<SharedCosts>>,
    ) -> Result<SuffixConfig> {
        let history = match (&self.suffix_history, tokenizer) {
            (Some(path), Some(id)) if path.exists() => GlobalHistory::load(path, id, self.suffix_cap)?,
            (Some(_), None) => bail!("--suffix-history needs the target model's tokenizer"),
            _ => GlobalHistory::new(self.suffix_cap)?,
        };
        let d = SuffixConfig::default();
        let config = SuffixConfig {
            max_depth: self.suffix_depth.unwrap_or(d.max_depth),
            max_nodes: match self.budget {
                Some(BudgetArg::Nodes(n)) => n,
                _ => self.suffix_nodes.unwrap_or(d.max_nodes),
            },
            occurrences: self.suffix_occurrences.unwrap_or(d.occurrences),
            pessimism: self.suffix_pessimism.unwrap_or(d.pessimism),
            explore_every: self.suffix_explore.unwrap_or(d.explore_every),
            global: !self.no_global,
            costs,
            shared: SuffixShared::new(history),
            ..d
        };
        config.validate()?;
        Ok(config)
    }

    /// A numeric budget; `auto` is refused for the methods that have no cost-aware sizing.
    fn nodes(&self, method: &str, default: usize) -> Result<usize> {
        match self.budget {
            None => Ok(default),
            Some(BudgetArg::Nodes(n)) => Ok(n),
            Some(BudgetArg::Auto) => {
                bail!("--budget auto applies to dyspec and auto; give {method} a number of nodes")
            }
        }
    }

    /// The method with its knobs, for `name` (this struct's `--method` unless overridden, as the
    /// benchmark does). `tokenizer` identifies the target's tokenizer for n-gram files; `costs`
    /// are the measured curves, required where [`Self::needs_costs`] says so.
    pub fn method(
        &self,
        name: &str,
        tokenizer: Option<TokenizerId>,
        costs: Option<&CostModel>,
    ) -> Result<Method> {
        // Each method gets its own shared state: its drafters learn across requests, apart from
        // the other methods'.
        let costs = costs.map(|c| SharedCosts::new(c.clone()));
        let table = match (&self.ngram, tokenizer) {
            (Some(path), Some(id)) => Some(Arc::new(NgramTable::load(path, id)?)),
            (Some(_), None) => bail!("--ngram needs the target model's tokenizer"),
            _ => None,
        };
        Ok(match name {
            "plain" => Method::Plain,
            "chain" => Method::Chain { k: self.k },
            "tree" => Method::Tree { widths: self.widths.clone() },
            "specinfer" => Method::SpecInfer { expand: self.expand.clone() },
            "sequoia" => {
                let acceptance = match (&self.acceptance, &self.calibration) {
                    (Some(a), _) => a.clone(),
                    (None, Some(path)) => AcceptanceVector::load(path)?.acceptance,
                    (None, None) => bail!(
                        "sequoia needs a positional acceptance vector: --acceptance 0.6,0.2,… or \
                         --calibration FILE from `treespec calibrate`"
                    ),
                };
                let d = SequoiaConfig::default();
                Method::Sequoia(SequoiaConfig {
                    budget: self.nodes(name, d.budget)?,
                    max_depth: self.depth.or(d.max_depth),
                    acceptance,
                })
            }
            "dyspec" => {
                let d = DySpecConfig::default();
                let auto = self.needs_costs(name);
                let costs = match (auto, costs) {
                    (true, Some(c)) => Some(c),
                    (true, None) => bail!("dyspec --budget auto needs the measured cost curves"),
                    (false, _) => None,
                };
                Method::DySpec(DySpecConfig {
                    budget: if auto { self.budget_max } else { self.nodes(name, d.budget)? },
                    max_depth: self.depth.unwrap_or(d.max_depth),
                    mode: match self.dyspec_mode {
                        DySpecModeArg::Heap => DySpecMode::Heap,
                        DySpecModeArg::Layer => DySpecMode::Layer,
                    },
                    threshold: self.dyspec_threshold.or(d.threshold),
                    costs,
                })
            }
            "eagle2" => {
                let d = Eagle2Config::default();
                Method::Eagle2(Eagle2Config {
                    top_k: self.eagle_top_k.unwrap_or(d.top_k),
                    depth: self.depth.unwrap_or(d.depth),
                    total: self.nodes(name, d.total)?,
                })
            }
            "gsd" => {
                let d = GsdConfig::default();
                Method::Gsd(GsdConfig {
                    top_n: self.gsd_top_n.unwrap_or(d.top_n),
                    ratio: self.gsd_ratio.unwrap_or(d.ratio),
                    parent_min: self.gsd_parent_min.unwrap_or(d.parent_min),
                    r: self.gsd_r.unwrap_or(d.r),
                    max_depth: self.depth.unwrap_or(d.max_depth),
                    budget: self.nodes(name, d.budget)?,
                    ..d
                })
            }
            "staged" => {
                let d = StagedConfig::default();
                Method::Staged(StagedConfig {
                    depth: self.depth.unwrap_or(d.depth),
                    branch_depths: self.branch_depths.unwrap_or(d.branch_depths),
                    branch_width: self.branch_width.unwrap_or(d.branch_width),
                    lookahead: self.lookahead.unwrap_or(d.lookahead),
                    table,
                    ..d
                })
            }
            "lookup" => {
                let d = LookupConfig::default();
                Method::Lookup {
                    config: LookupConfig {
                        max_ngram: self.lookup_ngram.unwrap_or(d.max_ngram),
                        max_tokens: self.lookup_tokens.unwrap_or(d.max_tokens),
                        branches: self.lookup_branches.unwrap_or(d.branches),
                        ..d
                    },
                    table,
                }
            }
            "suffix" => Method::Suffix(self.suffix(tokenizer, costs)?),
            "disco" => {
                let d = DiscoConfig::default();
                let mode = match &self.disco_model {
                    Some(path) => DiscoMode::Classifier(Arc::new(
                        DiscoModel::load(path).with_context(|| format!("loading {}", path.display()))?,
                    )),
                    None => DiscoMode::Threshold,
                };
                Method::Disco(DiscoConfig {
                    mode,
                    max_tokens: self.disco_max.unwrap_or(d.max_tokens),
                    threshold: self.disco_threshold.unwrap_or(d.threshold),
                    stop_prob: self.disco_stop_prob.unwrap_or(d.stop_prob),
                })
            }
            "auto" => {
                let Some(costs) = costs else { bail!("the auto method needs the measured cost curves") };
                let d = DySpecConfig::default();
                Method::Auto(AutoConfig {
                    suffix: self.suffix(tokenizer, None)?,
                    costs,
                    dyspec: DySpecConfig {
                        budget: self.budget_max,
                        max_depth: self.depth.unwrap_or(d.max_depth),
                        ..d
                    },
                })
            }
            other => bail!("unknown method '{other}' (one of {})", METHOD_NAMES.join(", ")),
        })
    }
}

/// A fingerprint of a model's tokenizer: every token's text, hashed (FNV-1a), and the vocab size.
/// Identifies which tokenizer an n-gram table was built with.
pub fn tokenizer_id(model: &LlamaModel) -> Result<TokenizerId> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let n = model.vocab_size();
    for t in 0..n as u32 {
        for b in model.token_text(t)?.bytes().chain(std::iter::once(0xff)) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(TokenizerId { fingerprint: h, vocab: n as u32 })
}
