//! The server's methods: the default, and each request's `treespec` spec resolved through the
//! engine's registry on the loaded models — exactly as the CLI resolves its flags.
//!
//! Resolved methods are kept per tenant and spec, so the state a method learns across requests
//! (refined cost curves, calibrated acceptance, suffix prices) carries over to the tenant's next
//! request asking for the same thing, and every suffix drafter of a tenant shares the tenant's
//! global history of its earlier requests — never another tenant's ([`crate::tenant`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use treespec_core::ngram::TokenizerId;
use treespec_engine::auto_budget::CostModel;
use treespec_engine::drafters::SuffixShared;
use treespec_engine::registry::MethodContext;
use treespec_engine::{EngineError, Method, MethodSpec};

use crate::error::ApiError;
use crate::scheduling::histories::TenantHistories;
use crate::tenant::Tenant;

/// A [`MethodContext`] that worker threads share.
pub type SharedContext = Arc<dyn MethodContext + Send + Sync>;

/// The default method and the per-request ones, resolved once per tenant and distinct spec.
pub struct ServerMethods {
    default: RwLock<Method>,
    /// This machine's cost curves are being measured (in the background): meanwhile the methods
    /// that need them decode on a fixed budget ([`MethodSpec::without_costs`]).
    measuring: AtomicBool,
    models: SharedContext,
    histories: Arc<TenantHistories>,
    resolved: Mutex<HashMap<(Tenant, String), Method>>,
}

impl std::fmt::Debug for ServerMethods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerMethods")
            .field("default", &self.default_method().name())
            .field("measuring", &self.is_measuring())
            .finish()
    }
}

/// The models' context, with one tenant's suffix state added.
struct TenantContext<'a> {
    models: &'a SharedContext,
    suffix: Arc<SuffixShared>,
}

impl MethodContext for TenantContext<'_> {
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
    /// curves are measured on the first request that needs them, if the default did not). Every
    /// tenant's suffix drafts learn in its own state, in memory.
    pub fn new(default: Method, context: SharedContext) -> Self {
        Self::with_histories(default, context, TenantHistories::in_memory())
    }

    /// As [`ServerMethods::new`], with the tenants' suffix state in `histories` (which the
    /// server saves).
    pub fn with_histories(default: Method, context: SharedContext, histories: Arc<TenantHistories>) -> Self {
        Self {
            default: RwLock::new(default),
            measuring: AtomicBool::new(false),
            models: context,
            histories,
            resolved: Mutex::new(HashMap::new()),
        }
    }

    /// As [`ServerMethods::with_histories`], serving `meanwhile` by default (a method that needs
    /// no cost curve) until [`ServerMethods::measured`] installs the real default; requests that
    /// ask for a cost-aware method meanwhile get its fixed-budget neighbour.
    pub fn measuring(meanwhile: Method, context: SharedContext, histories: Arc<TenantHistories>) -> Self {
        let me = Self::with_histories(meanwhile, context, histories);
        me.measuring.store(true, Ordering::SeqCst);
        me
    }

    /// The cost curves are measured: `default` serves from now on, and cost-aware methods
    /// resolve on the curves.
    pub fn measured(&self, default: Method) {
        *self.default.write().unwrap_or_else(|p| p.into_inner()) = default;
        // Methods resolved meanwhile (the fixed-budget stand-ins) are forgotten.
        self.resolved.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.measuring.store(false, Ordering::SeqCst);
    }

    /// Whether the cost curves are still being measured.
    pub fn is_measuring(&self) -> bool {
        self.measuring.load(Ordering::SeqCst)
    }

    /// The default method.
    pub fn default_method(&self) -> Method {
        self.default.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The method for a request of `tenant`: its spec resolved (once per tenant and distinct
    /// spec), or the default; either way learning only from `tenant`'s own requests.
    pub fn for_request(&self, spec: Option<&MethodSpec>, tenant: Tenant) -> Result<Method, ApiError> {
        // While the curves are measured, a cost-aware request runs on a fixed budget instead.
        let stand_in = spec.filter(|s| s.needs_costs() && self.is_measuring()).map(MethodSpec::without_costs);
        let spec = stand_in.as_ref().or(spec);
        let key = (tenant, spec.map(|s| serde_json::to_string(s).unwrap_or_default()).unwrap_or_default());
        if let Some(m) = self.resolved.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(m.clone());
        }
        let suffix = self
            .histories
            .of(tenant)
            .map_err(|e| ApiError::internal(format!("the tenant's suffix history: {e:#}")))?;
        // Resolved outside the lock: a first cost profile takes seconds.
        let method = match spec {
            None => self.default_method().learning_apart(suffix),
            Some(spec) => {
                spec.resolve(&TenantContext { models: &self.models, suffix }).map_err(|e| match e {
                    EngineError::InvalidRequest(m) => ApiError::invalid("treespec", m),
                    e => ApiError::internal(format!("could not prepare method '{}': {e}", spec.method)),
                })?
            }
        };
        let mut map = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
        Ok(map.entry(key).or_insert(method).clone())
    }
}
