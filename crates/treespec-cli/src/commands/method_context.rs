//! What resolving a method may ask of the loaded models ([`MethodContext`]): the tokenizer
//! fingerprint and the measured cost curves, each computed only when a method needs it.

use std::cell::OnceCell;

use treespec_core::ngram::TokenizerId;
use treespec_engine::auto_budget::CostModel;
use treespec_engine::registry::MethodContext;
use treespec_engine::EngineError;

use super::args::{tokenizer_id, ModelArgs};
use super::costs::cost_model;
use super::models::Models;

/// The CLI's loaded models as a [`MethodContext`].
pub struct LoadedContext<'a> {
    models: &'a Models,
    args: &'a ModelArgs,
    reprofile: bool,
    tokenizer: OnceCell<TokenizerId>,
    costs: OnceCell<CostModel>,
}

impl<'a> LoadedContext<'a> {
    /// A context over `models` (loaded from `args`); `reprofile` re-measures the cost curves.
    pub fn new(models: &'a Models, args: &'a ModelArgs, reprofile: bool) -> Self {
        Self { models, args, reprofile, tokenizer: OnceCell::new(), costs: OnceCell::new() }
    }
}

fn backend(e: anyhow::Error) -> EngineError {
    EngineError::Backend(format!("{e:#}"))
}

impl MethodContext for LoadedContext<'_> {
    fn tokenizer(&self) -> treespec_engine::Result<TokenizerId> {
        if let Some(t) = self.tokenizer.get() {
            return Ok(*t);
        }
        let t = tokenizer_id(&self.models.target).map_err(backend)?;
        Ok(*self.tokenizer.get_or_init(|| t))
    }

    fn costs(&self) -> treespec_engine::Result<CostModel> {
        if let Some(c) = self.costs.get() {
            return Ok(c.clone());
        }
        let with_draft = self.args.draft.is_some();
        let c = cost_model(self.args, self.models, with_draft, self.reprofile).map_err(backend)?;
        Ok(self.costs.get_or_init(|| c).clone())
    }
}
