//! The CLI's side of the model runtime (`treespec_llama::ModelRuntime`): load what `ModelArgs`
//! names, and resolve methods on it.

use std::sync::Arc;

use anyhow::Result;
use treespec_core::ngram::TokenizerId;
use treespec_engine::auto_budget::CostModel;
use treespec_engine::drafters::SuffixShared;
use treespec_engine::registry::MethodContext;
use treespec_engine::{Method, MethodSpec};
use treespec_llama::{ModelPaths, ModelRuntime};

use super::args::ModelArgs;

/// Load the target (and draft) named by `args`, each file once.
pub fn load_runtime(args: &ModelArgs) -> Result<ModelRuntime> {
    // The template is checked before minutes of loading are spent.
    let template = args.runtime.chat_template_source()?;
    let runtime = ModelRuntime::load(
        ModelPaths::new(args.model.clone(), args.runtime.draft.clone()),
        args.runtime.load_options(),
    )?;
    Ok(match template {
        Some(source) => runtime.with_chat_template(source),
        None => runtime,
    })
}

/// `spec` resolved on the loaded models, drafting suffix matches from `suffix` (a
/// [`treespec_engine::drafters::SuffixStore`]'s state) when given; with `reprofile`, a method
/// that needs the cost curves gets freshly measured ones (the runtime then holds them for every
/// later method).
pub fn resolve_with_suffix(
    runtime: &ModelRuntime,
    spec: &MethodSpec,
    reprofile: bool,
    suffix: Option<Arc<SuffixShared>>,
) -> Result<Method> {
    if reprofile && spec.needs_costs() {
        runtime.cost_model(runtime.has_draft(), true)?;
    }
    Ok(spec.resolve(&WithSuffix { runtime, suffix })?)
}

/// The runtime's context, with the suffix state a store keeps.
struct WithSuffix<'a> {
    runtime: &'a ModelRuntime,
    suffix: Option<Arc<SuffixShared>>,
}

impl MethodContext for WithSuffix<'_> {
    fn tokenizer(&self) -> treespec_engine::Result<TokenizerId> {
        MethodContext::tokenizer(self.runtime)
    }
    fn costs(&self) -> treespec_engine::Result<CostModel> {
        MethodContext::costs(self.runtime)
    }
    fn suffix_shared(&self) -> Option<Arc<SuffixShared>> {
        self.suffix.clone()
    }
}
