//! Each tenant's suffix state (global history and learned prices), and the files that keep the
//! histories across restarts.
//!
//! With `--suffix-history FILE` the shared tenant's history lives in `FILE` and each key's in
//! `FILE` with the tenant's fingerprint before the extension (`h.bin` → `h.0123…cdef.bin`), so a
//! restart gives every tenant back its own history and nothing else. Every history is loaded at
//! start (a file that cannot be read, or a directory that cannot be written, stops the start,
//! not the shutdown) and saved whenever a request added to it: periodically and at shutdown,
//! whichever method the server defaults to.
//!
//! Each tenant's learned prices travel with its history: loaded from the file's sibling
//! `<file>.prices.json` ([`HistoryFile::prices_path`]; none yet, as beside a history saved by an
//! older build, starts from the default pricing) and saved with the history, under its lock,
//! whenever either changed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use treespec_core::ngram::TokenizerId;
use treespec_core::suffix::{GlobalHistory, HistoryFile, SuffixPricing, DEFAULT_CAP_TOKENS};
use treespec_engine::drafters::SuffixShared;

use crate::tenant::Tenant;

/// One tenant's suffix state, its file, and what of it is saved.
struct Scope {
    shared: Arc<SuffixShared>,
    file: Option<HistoryFile>,
    /// The history's additions when it was last saved (or loaded).
    saved: u64,
    /// The prices' trials when they were last saved (or loaded).
    saved_trials: u64,
}

/// Documents ever added to `h` (those held and those evicted): changes whenever a request adds.
fn additions(h: &GlobalHistory) -> u64 {
    h.docs() as u64 + h.evictions()
}

/// Every tenant's suffix state.
pub struct TenantHistories {
    scopes: Mutex<HashMap<Tenant, Scope>>,
    files: Option<(PathBuf, TokenizerId)>,
    cap: usize,
}

impl std::fmt::Debug for TenantHistories {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantHistories")
            .field("tenants", &self.lock().len())
            .field("files", &self.files.as_ref().map(|(p, _)| p))
            .finish()
    }
}

/// What one save wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// The file.
    pub path: PathBuf,
    /// Tokens in the history.
    pub tokens: usize,
    /// Trials the learned prices saved with it have recorded.
    pub trials: u64,
}

impl TenantHistories {
    /// Histories in memory only (tests, servers without `--suffix-history`).
    pub fn in_memory() -> Arc<Self> {
        Arc::new(Self { scopes: Mutex::new(HashMap::new()), files: None, cap: DEFAULT_CAP_TOKENS })
    }

    /// Histories kept in files named after `base` (see the module docs), for `tenants` (the
    /// shared tenant always): each file is opened (checked for writing, locked while saving) and
    /// loaded now.
    pub fn in_files(
        base: &Path,
        tokenizer: TokenizerId,
        cap: usize,
        tenants: impl IntoIterator<Item = Tenant>,
    ) -> anyhow::Result<Arc<Self>> {
        let me =
            Self { scopes: Mutex::new(HashMap::new()), files: Some((base.to_path_buf(), tokenizer)), cap };
        {
            let mut scopes = me.lock();
            for tenant in std::iter::once(Tenant::SHARED).chain(tenants) {
                if let std::collections::hash_map::Entry::Vacant(e) = scopes.entry(tenant) {
                    e.insert(me.open(tenant)?);
                }
            }
        }
        Ok(Arc::new(me))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Tenant, Scope>> {
        self.scopes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The file of `tenant`'s history.
    pub fn path_of(base: &Path, tenant: Tenant) -> PathBuf {
        if tenant.is_shared() {
            return base.to_path_buf();
        }
        let stem = base.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let name = match base.extension() {
            Some(ext) => format!("{stem}.{tenant}.{}", ext.to_string_lossy()),
            None => format!("{stem}.{tenant}"),
        };
        base.with_file_name(name)
    }

    fn open(&self, tenant: Tenant) -> anyhow::Result<Scope> {
        use anyhow::Context;
        let Some((base, tokenizer)) = &self.files else {
            let history = GlobalHistory::new(self.cap)?;
            return Ok(Scope { shared: SuffixShared::new(history), file: None, saved: 0, saved_trials: 0 });
        };
        let path = Self::path_of(base, tenant);
        let file = HistoryFile::open(&path).with_context(|| format!("suffix history {}", path.display()))?;
        let history = file
            .load(*tokenizer, self.cap)
            .with_context(|| format!("loading the suffix history {}", path.display()))?;
        let pricing = file
            .load_pricing(*tokenizer)
            .with_context(|| format!("loading the learned prices {}", file.prices_path().display()))?
            .unwrap_or_else(SuffixPricing::new);
        let (saved, saved_trials) = (additions(&history), pricing.total_trials());
        let shared = SuffixShared::with_pricing(history, pricing);
        Ok(Scope { shared, file: Some(file), saved, saved_trials })
    }

    /// `tenant`'s suffix state (a tenant first seen now starts empty, or from its file).
    pub fn of(&self, tenant: Tenant) -> anyhow::Result<Arc<SuffixShared>> {
        let mut scopes = self.lock();
        if let Some(s) = scopes.get(&tenant) {
            return Ok(s.shared.clone());
        }
        let scope = self.open(tenant)?;
        let shared = scope.shared.clone();
        scopes.insert(tenant, scope);
        Ok(shared)
    }

    /// Save every history whose text or learned prices changed since its last save, with its
    /// prices; returns what was written. Every history is tried even when one fails; the first
    /// failure is returned after.
    pub fn save_changed(&self) -> anyhow::Result<Vec<Saved>> {
        let Some((_, tokenizer)) = &self.files else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        let mut first_error = None;
        let mut scopes = self.lock();
        for scope in scopes.values_mut() {
            let Some(file) = &scope.file else { continue };
            // A copy of the prices, taken before the history's read lock (never both held).
            let pricing = scope.shared.pricing_snapshot();
            let trials = pricing.total_trials();
            let history = scope.shared.history();
            let additions = additions(&history);
            if additions == scope.saved && trials == scope.saved_trials {
                continue;
            }
            match file.save_with_pricing(&history, &pricing, *tokenizer) {
                Ok(()) => {
                    out.push(Saved { path: file.path().to_path_buf(), tokens: history.tokens(), trials });
                    drop(history);
                    scope.saved = additions;
                    scope.saved_trials = trials;
                }
                Err(e) => {
                    let e = anyhow::Error::new(e).context(format!("saving {}", file.path().display()));
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use treespec_core::suffix::NodeFeatures;

    const TOK: TokenizerId = TokenizerId { fingerprint: 0x5eed, vocab: 26 };

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("treespec-prices-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn learn(shared: &SuffixShared, trials: usize) {
        let mut p = shared.pricing();
        for i in 0..trials {
            let f = NodeFeatures {
                match_len: 4 + i % 30,
                depth: 1 + i % 5,
                share: 1.0,
                support: 1,
                global: false,
            };
            p.record(&f, i % 3 != 0);
        }
    }

    #[test]
    fn each_tenants_prices_are_saved_with_its_history_and_come_back() {
        let dir = scratch("tenants");
        let base = dir.join("h.bin");
        let a = Tenant::of_key("alpha");
        let histories = TenantHistories::in_files(&base, TOK, 1 << 16, [a]).unwrap();
        let shared = histories.of(a).unwrap();
        shared.add(1, &[3, 4, 5, 6]);
        learn(&shared, 500);
        let saved = histories.save_changed().unwrap();
        assert_eq!(saved.len(), 1);
        assert_eq!(saved[0].trials, 500);
        let file = HistoryFile::open(TenantHistories::path_of(&base, a)).unwrap();
        assert!(file.prices_path().exists(), "{}", file.prices_path().display());
        assert!(histories.save_changed().unwrap().is_empty(), "nothing changed");
        // Prices learned with no new text are saved too.
        learn(&shared, 7);
        assert_eq!(histories.save_changed().unwrap()[0].trials, 507);
        // A restart gives A its prices back exactly; the shared tenant starts from the prior.
        let again = TenantHistories::in_files(&base, TOK, 1 << 16, [a]).unwrap();
        assert_eq!(again.of(a).unwrap().pricing_snapshot(), shared.pricing_snapshot());
        assert_eq!(again.of(Tenant::SHARED).unwrap().pricing().total_trials(), 0);
        // Prices for another tokenizer stop the start, naming the prices file.
        let other = TokenizerId { fingerprint: 0x5eee, vocab: 26 };
        std::fs::write(
            file.prices_path(),
            treespec_core::suffix::history_file::pricing_to_bytes(&shared.pricing_snapshot(), other),
        )
        .unwrap();
        let e = TenantHistories::in_files(&base, TOK, 1 << 16, [a]).expect_err("another tokenizer's prices");
        assert!(format!("{e:#}").contains(".prices.json"), "{e:#}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_history_saved_without_prices_starts_from_the_default_pricing() {
        let dir = scratch("old");
        let base = dir.join("h.bin");
        let mut old = GlobalHistory::new(1 << 16).unwrap();
        old.add(9, &[1, 2, 3]);
        HistoryFile::open(&base).unwrap().save(&old, TOK).unwrap();
        let histories = TenantHistories::in_files(&base, TOK, 1 << 16, []).unwrap();
        let shared = histories.of(Tenant::SHARED).unwrap();
        assert_eq!(shared.history().docs(), 1);
        assert_eq!(shared.pricing_snapshot(), SuffixPricing::new());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
