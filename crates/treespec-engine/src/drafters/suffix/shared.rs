//! What every drafter of one suffix method shares: the global history of earlier requests and the
//! learned prices. One request's drafter reads both each step and writes both as it learns and
//! finishes, so they live behind locks in one `Arc` handed to every drafter of the method (and
//! to the server, which saves and loads them).

use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use treespec_core::policy_bandit::PolicyBandit;
use treespec_core::suffix::{GlobalHistory, SuffixPricing, DEFAULT_CAP_TOKENS};
use treespec_core::TokenId;

/// What every drafter of one suffix method shares: the global history and the learned prices
/// (and, for `auto`, the books of how its policies' predictions bore out: per tenant, as the
/// rest).
#[derive(Debug)]
pub struct SuffixShared {
    history: RwLock<GlobalHistory>,
    pricing: Mutex<SuffixPricing>,
    policies: Mutex<PolicyBandit>,
}

impl SuffixShared {
    /// Shared state around a history (e.g. one loaded from a file).
    pub fn new(history: GlobalHistory) -> Arc<Self> {
        Self::with_pricing(history, SuffixPricing::new())
    }

    /// Shared state around a history and learned prices (e.g. both loaded from files).
    pub fn with_pricing(history: GlobalHistory, pricing: SuffixPricing) -> Arc<Self> {
        Arc::new(Self {
            history: RwLock::new(history),
            pricing: Mutex::new(pricing),
            policies: Mutex::new(PolicyBandit::new()),
        })
    }

    /// Shared state with an empty history of the default cap.
    pub fn empty() -> Arc<Self> {
        Self::new(GlobalHistory::new(DEFAULT_CAP_TOKENS).expect("the default cap is valid"))
    }

    /// Read access to the global history (e.g. to save it).
    pub fn history(&self) -> RwLockReadGuard<'_, GlobalHistory> {
        self.history.read().unwrap_or_else(|p| p.into_inner())
    }

    fn history_mut(&self) -> RwLockWriteGuard<'_, GlobalHistory> {
        self.history.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Add a finished request's text to the history (what a drafter does when its request ends).
    pub fn add(&self, prompt_key: u64, text: &[TokenId]) {
        self.history_mut().add(prompt_key, text);
    }

    /// The learned prices.
    pub fn pricing(&self) -> MutexGuard<'_, SuffixPricing> {
        self.pricing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A copy of the learned prices (e.g. to save them without holding the drafters up).
    pub fn pricing_snapshot(&self) -> SuffixPricing {
        self.pricing().clone()
    }

    /// `auto`'s books over the requests that finished (see [`PolicyBandit`]).
    pub fn policies(&self) -> MutexGuard<'_, PolicyBandit> {
        self.policies.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replace the learned prices (e.g. with prices saved by an earlier run).
    pub fn set_pricing(&self, pricing: SuffixPricing) {
        *self.pricing() = pricing;
    }
}

/// Two handles are equal when they share the same state.
impl PartialEq for SuffixShared {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}
