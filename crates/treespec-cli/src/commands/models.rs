//! The CLI's side of the model runtime (`treespec_llama::ModelRuntime`): load what `ModelArgs`
//! names, and resolve methods on it.

use anyhow::Result;
use treespec_engine::{Method, MethodSpec};
use treespec_llama::{ModelPaths, ModelRuntime};

use super::args::ModelArgs;

/// Load the target (and draft) named by `args`, each file once.
pub fn load_runtime(args: &ModelArgs) -> Result<ModelRuntime> {
    ModelRuntime::load(
        ModelPaths::new(args.model.clone(), args.runtime.draft.clone()),
        args.runtime.load_options(),
    )
}

/// `spec` resolved on the loaded models; with `reprofile`, a method that needs the cost curves
/// gets freshly measured ones (the runtime then holds them for every later method).
pub fn resolve(runtime: &ModelRuntime, spec: &MethodSpec, reprofile: bool) -> Result<Method> {
    if reprofile && spec.needs_costs() {
        runtime.cost_model(runtime.has_draft(), true)?;
    }
    Ok(spec.resolve(runtime)?)
}
