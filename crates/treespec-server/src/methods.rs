//! The server's methods: the default, and each request's `treespec` spec resolved through the
//! engine's registry on the loaded models — exactly as the CLI resolves its flags.
//!
//! Resolved methods are kept per spec, so the state a method learns across requests (refined
//! cost curves, calibrated acceptance, suffix prices) carries over to the next request asking for
//! the same thing, and every suffix drafter shares one global history of earlier requests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use treespec_core::ngram::TokenizerId;
use treespec_core::suffix::{GlobalHistory, DEFAULT_CAP_TOKENS};
use treespec_engine::auto_budget::CostModel;
use treespec_engine::drafters::SuffixShared;
use treespec_engine::registry::MethodContext;
use treespec_engine::{EngineError, Method, MethodSpec};

use crate::error::ApiError;

/// A [`MethodContext`] that worker threads share.
pub type SharedContext = Arc<dyn MethodContext + Send + Sync>;

/// The default method and the per-request ones, resolved once per distinct spec.
pub struct ServerMethods {
    default: Method,
    context: ServerContext,
    resolved: Mutex<HashMap<String, Method>>,
}

/// The models' context, with the process-wide suffix state added.
struct ServerContext {
    models: SharedContext,
    suffix: Arc<SuffixShared>,
}

impl MethodContext for ServerContext {
    fn tokenizer(&self) -> treespec_engine::Result<TokenizerId> {
        self.models.tokenizer()
    }
    fn costs(&self) -> treespec_engine::Result<CostModel> {
        self.models.costs()
    }
    fn suffix_shared(&self) -> Option<Arc<SuffixShared>> {
        Some(self.suffix.clone())
    }
}

impl ServerMethods {
    /// `default` serves requests that name no method; `context` resolves the others (the cost
    /// curves are measured on the first request that needs them, if the default did not).
    pub fn new(default: Method, context: SharedContext) -> Self {
        let suffix = default.suffix_shared().cloned().unwrap_or_else(|| {
            SuffixShared::new(GlobalHistory::new(DEFAULT_CAP_TOKENS).expect("the default cap is valid"))
        });
        Self {
            default,
            context: ServerContext { models: context, suffix },
            resolved: Mutex::new(HashMap::new()),
        }
    }

    /// The default method.
    pub fn default_method(&self) -> &Method {
        &self.default
    }

    /// The method for a request: its spec resolved (once per distinct spec), or the default.
    pub fn for_request(&self, spec: Option<&MethodSpec>) -> Result<Method, ApiError> {
        let Some(spec) = spec else { return Ok(self.default.clone()) };
        let key = serde_json::to_string(spec).unwrap_or_default();
        if let Some(m) = self.resolved.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(m.clone());
        }
        // Resolved outside the lock: a first cost profile takes seconds.
        let method = spec.resolve(&self.context).map_err(|e| match e {
            EngineError::InvalidRequest(m) => ApiError::invalid("treespec", m),
            e => ApiError::internal(format!("could not prepare method '{}': {e}", spec.method)),
        })?;
        let mut map = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
        Ok(map.entry(key).or_insert(method).clone())
    }
}
