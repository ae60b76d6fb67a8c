//! `treespec calibrate` and `treespec disco train`: measurements on a model pair that the
//! `sequoia` and `disco` methods then load.
//!
//! * calibrate: the positional acceptance vector P[k] (probability that the k-th draft child,
//!   drawn without replacement, is the one accepted), which Sequoia's DP turns into a tree shape.
//! * disco train: oracle runs label every drafted token (1 while the draft agrees with the
//!   target), and a logistic-regression stop classifier is fitted to them.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use treespec_bench::prompts::{load_prompts, select, Selection};
use treespec_core::disco::DiscoModel;
use treespec_core::sampling::Sampler;
use treespec_core::TokenId;
use treespec_engine::measure::offline::{collect_training_data, measure_acceptance};
use treespec_llama::ModelRuntime;
use treespec_request::Prompt;

use super::args::{ModelArgs, SamplingArgs};
use super::models::load_runtime;

/// Which prompts to measure on.
#[derive(Debug, Clone, Args)]
pub struct PromptSetArgs {
    /// Prompt file (Spec-Bench JSON lines or {"prompt": …} lines).
    #[arg(long, default_value = "../shared/data/spec-bench/question.jsonl")]
    pub prompts: PathBuf,
    /// Only these categories.
    #[arg(long, value_delimiter = ',')]
    pub categories: Option<Vec<String>>,
    /// At most this many prompts, spread over the categories.
    #[arg(long, default_value_t = 12)]
    pub limit: usize,
    /// Tokens generated per prompt.
    #[arg(short = 'n', long, default_value_t = 64)]
    pub n: usize,
}

impl PromptSetArgs {
    fn tokens(&self, models: &ModelRuntime) -> Result<Vec<Vec<TokenId>>> {
        let all = load_prompts(&self.prompts)?;
        let sel =
            Selection { categories: self.categories.clone(), per_category: None, limit: Some(self.limit) };
        select(&all, &sel)?.iter().map(|p| Ok(models.prompt_tokens(Prompt::User(&p.text))?)).collect()
    }
}

/// Options of `treespec calibrate`.
#[derive(Debug, Args)]
pub struct CalibrateArgs {
    #[command(flatten)]
    pub models: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub prompts: PromptSetArgs,
    /// Children ranked per position (length of the vector).
    #[arg(long, default_value_t = 8)]
    pub width: usize,
    /// Output file (JSON), loaded by `--method sequoia --calibration FILE`.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
}

/// Run `calibrate`.
pub fn calibrate(args: CalibrateArgs) -> Result<()> {
    let models = load_runtime(&args.models)?;
    let Some(draft_model) = models.draft() else { bail!("calibrate needs a draft model (--draft FILE)") };
    let prompts = args.prompts.tokens(&models)?;
    let sampler = Sampler::new(args.sampling.params()?)?;
    let mut target = models.target().new_lm()?;
    let mut draft = draft_model.new_lm()?;
    let v = measure_acceptance(
        &mut target,
        &mut draft,
        &prompts,
        args.prompts.n,
        args.width,
        &sampler,
        args.sampling.seed(),
    )?
    .with_identity(
        args.models.model.display().to_string(),
        args.models.runtime.draft.as_ref().map(|d| d.display().to_string()).unwrap_or_default(),
    );
    v.save(&args.out).with_context(|| format!("writing {}", args.out.display()))?;
    let shown: Vec<String> = v.acceptance.iter().map(|p| format!("{p:.3}")).collect();
    eprintln!(
        "P[1..{}] = [{}] over {} positions → {}",
        args.width,
        shown.join(", "),
        v.positions,
        args.out.display()
    );
    Ok(())
}

/// Options of `treespec disco train`.
#[derive(Debug, Args)]
pub struct DiscoTrainArgs {
    #[command(flatten)]
    pub models: ModelArgs,
    #[command(flatten)]
    pub prompts: PromptSetArgs,
    /// Longest draft chain per position in the oracle runs.
    #[arg(long, default_value_t = 8)]
    pub max_tokens: usize,
    /// Output file (JSON), loaded by `--method disco --disco-model FILE`.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
}

/// Run `disco train`.
pub fn disco_train(args: DiscoTrainArgs) -> Result<()> {
    let models = load_runtime(&args.models)?;
    let Some(draft_model) = models.draft() else { bail!("disco train needs a draft model (--draft FILE)") };
    let prompts = args.prompts.tokens(&models)?;
    let mut target = models.target().new_lm()?;
    let mut draft = draft_model.new_lm()?;
    let data = collect_training_data(&mut target, &mut draft, &prompts, args.prompts.n, args.max_tokens)?;
    if data.is_empty() {
        bail!("the oracle runs produced no drafted tokens to learn from");
    }
    let (features, labels): (Vec<_>, Vec<_>) = data.into_iter().unzip();
    let positives = labels.iter().filter(|&&l| l).count();
    let model = DiscoModel::train(&features, &labels)?;
    model.save(&args.out).with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "trained on {} drafted tokens ({:.1}% accepted by the target) → {}",
        labels.len(),
        100.0 * positives as f64 / labels.len() as f64,
        args.out.display()
    );
    Ok(())
}
