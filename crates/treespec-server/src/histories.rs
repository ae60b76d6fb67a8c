//! Each tenant's suffix state (global history and learned prices), and the files that keep the
//! histories across restarts.
//!
//! With `--suffix-history FILE` the shared tenant's history lives in `FILE` and each key's in
//! `FILE` with the tenant's fingerprint before the extension (`h.bin` → `h.0123…cdef.bin`), so a
//! restart gives every tenant back its own history and nothing else. Every history is loaded at
//! start (a file that cannot be read, or a directory that cannot be written, stops the start,
//! not the shutdown) and saved whenever a request added to it: periodically and at shutdown,
//! whichever method the server defaults to.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use treespec_core::ngram::TokenizerId;
use treespec_core::suffix::{GlobalHistory, HistoryFile, DEFAULT_CAP_TOKENS};
use treespec_engine::drafters::SuffixShared;

use crate::tenant::Tenant;

/// One tenant's suffix state, its file, and what of it is saved.
struct Scope {
    shared: Arc<SuffixShared>,
    file: Option<HistoryFile>,
    /// The history's additions when it was last saved (or loaded).
    saved: u64,
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
            return Ok(Scope { shared: SuffixShared::new(history), file: None, saved: 0 });
        };
        let path = Self::path_of(base, tenant);
        let file = HistoryFile::open(&path).with_context(|| format!("suffix history {}", path.display()))?;
        let history = file
            .load(*tokenizer, self.cap)
            .with_context(|| format!("loading the suffix history {}", path.display()))?;
        let saved = additions(&history);
        Ok(Scope { shared: SuffixShared::new(history), file: Some(file), saved })
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

    /// Save every history that changed since its last save; returns what was written. Every
    /// history is tried even when one fails; the first failure is returned after.
    pub fn save_changed(&self) -> anyhow::Result<Vec<Saved>> {
        let Some((_, tokenizer)) = &self.files else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        let mut first_error = None;
        let mut scopes = self.lock();
        for scope in scopes.values_mut() {
            let Some(file) = &scope.file else { continue };
            let history = scope.shared.history();
            let additions = additions(&history);
            if additions == scope.saved {
                continue;
            }
            match file.save(&history, *tokenizer) {
                Ok(()) => {
                    out.push(Saved { path: file.path().to_path_buf(), tokens: history.tokens() });
                    drop(history);
                    scope.saved = additions;
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
