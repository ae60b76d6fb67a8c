//! The CLI's side of the model runtime (`treespec_llama::ModelRuntime`): load what `ModelArgs`
//! names, and read from it what the chosen methods need.

use anyhow::Result;
use treespec_core::ngram::TokenizerId;
use treespec_engine::auto_budget::CostModel;
use treespec_llama::{ModelPaths, ModelRuntime};

use super::args::{MethodArgs, ModelArgs};

/// Load the target (and draft) named by `args`, each file once.
pub fn load_runtime(args: &ModelArgs) -> Result<ModelRuntime> {
    ModelRuntime::load(ModelPaths::new(args.model.clone(), args.draft.clone()), args.load_options())
}

/// What building the methods `names` with `knobs` needs from the models: the tokenizer fingerprint
/// and the measured cost curves (the draft's too when there is a draft), each only when one of the
/// methods needs it.
pub fn method_inputs(
    runtime: &ModelRuntime,
    knobs: &MethodArgs,
    names: &[&str],
) -> Result<(Option<TokenizerId>, Option<CostModel>)> {
    let tokenizer =
        if names.iter().any(|n| knobs.needs_tokenizer(n)) { Some(runtime.tokenizer_id()?) } else { None };
    let costs = if names.iter().any(|n| knobs.needs_costs(n)) {
        Some(runtime.cost_model(runtime.has_draft(), knobs.reprofile)?)
    } else {
        None
    };
    Ok((tokenizer, costs))
}
