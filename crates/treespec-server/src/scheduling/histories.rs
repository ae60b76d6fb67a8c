//! Each tenant's suffix state (global history and learned prices), and the files that keep the
//! histories across restarts.
//!
//! With `--suffix-history FILE` the shared tenant's history lives in `FILE` and each key's in
//! `FILE` with the tenant's file id before the extension (`h.bin` → `h.0123…cdef.bin`), so a
//! restart gives every tenant back its own history and nothing else. Every history is loaded at
//! start (a file that cannot be read, or a directory that cannot be written, stops the start,
//! not the shutdown) and saved whenever a request added to it: periodically and at shutdown,
//! whichever method the server defaults to.
//!
//! **Keyed file names** ([`HistoryNames`]). A tenant's file id is a keyed hash (BLAKE3 in keyed
//! mode, 128 bits in hex) of its tenant under a per-install secret: 32 random bytes in
//! `FILE.secret`, made (mode 0600) when a key's file is first named and read at every start
//! after. Without the secret a file name tells nothing of the key (an unkeyed hash of a guessable
//! key could be checked by guessing, and close keys gave close names); the same secret gives the
//! same names across restarts. Files an older build named by the key's unkeyed fingerprint
//! (`h.<fingerprint>.bin`) are renamed to their keyed name at start (with their prices), so the
//! operator keeps them.
//!
//! **Several servers on one file** merge rather than replace each other's histories: every save
//! re-reads the file under its lock and takes in what another server saved there since (see
//! [`HistoryFile::save_merged`]), so both keep what they learned, and this server drafts from the
//! other's documents too.
//!
//! Each tenant's learned prices travel with its history: loaded from the file's sibling
//! `<file>.prices.json` ([`HistoryFile::prices_path`]; none yet, as beside a history saved by an
//! older build, starts from the default pricing) and saved with the history, under its lock,
//! whenever either changed — unless the file holds prices of more trials (another server's, which
//! learned more: prices are not merged).

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::Context;
use treespec_core::ngram::TokenizerId;
use treespec_core::suffix::DEFAULT_CAP_TOKENS;
use treespec_engine::drafters::history_file::{HistoryFile, LOCK_SUFFIX, PRICES_SUFFIX};
use treespec_engine::drafters::{StorePlaces, SuffixShared, SuffixStore};

use crate::tenant::Tenant;

/// Bytes of the per-install secret that keys the tenants' file names.
const SECRET_BYTES: usize = 32;
/// Hex digits of a tenant's file id (128 bits of the keyed hash).
const FILE_ID_HEX: usize = 32;
/// What the secret file is named after the base file's name.
const SECRET_SUFFIX: &str = ".secret";
/// The keyed hash's input before the tenant: keeps these ids apart from any other use of the key.
const FILE_ID_CONTEXT: &[u8] = b"treespec tenant history file v1\0";

/// How the tenants' history files are named (see the module docs): the shared tenant's is the
/// base path itself, each key's carries its tenant's keyed file id before the extension.
#[derive(Debug)]
pub struct HistoryNames {
    base: PathBuf,
    /// The per-install secret, read (or made) when a key's file is first named: a server without
    /// keys never makes one.
    secret: OnceLock<[u8; SECRET_BYTES]>,
}

impl HistoryNames {
    /// The names of histories kept beside `base` (`--suffix-history FILE`).
    pub fn new(base: &Path) -> Self {
        Self { base: base.to_path_buf(), secret: OnceLock::new() }
    }

    /// The shared tenant's file.
    pub fn base(&self) -> &Path {
        &self.base
    }

    /// The file of the secret that keys the names: `FILE.secret`, beside the files it names.
    pub fn secret_path(&self) -> PathBuf {
        with_suffix(&self.base, SECRET_SUFFIX)
    }

    /// The file of `tenant`'s history (for a key's tenant, reading or making the secret).
    pub fn path_of(&self, tenant: Tenant) -> anyhow::Result<PathBuf> {
        if tenant.is_shared() {
            return Ok(self.base.clone());
        }
        Ok(self.tagged(&file_id(self.secret()?, tenant)))
    }

    /// The name an older build gave `tenant`'s file: its unkeyed fingerprint (see [`Self::migrate`]).
    fn legacy_path_of(&self, tenant: Tenant) -> PathBuf {
        self.tagged(&tenant.to_string())
    }

    /// The base path with `tag` before its extension (`h.bin` → `h.<tag>.bin`).
    fn tagged(&self, tag: &str) -> PathBuf {
        let stem = self.base.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let name = match self.base.extension() {
            Some(ext) => format!("{stem}.{tag}.{}", ext.to_string_lossy()),
            None => format!("{stem}.{tag}"),
        };
        self.base.with_file_name(name)
    }

    /// The secret, read from its file once (made first if there is none).
    fn secret(&self) -> anyhow::Result<&[u8; SECRET_BYTES]> {
        if let Some(secret) = self.secret.get() {
            return Ok(secret);
        }
        let secret = read_or_make_secret(&self.secret_path())?;
        Ok(self.secret.get_or_init(|| secret))
    }

    /// Give `tenant`'s history its keyed name when an older build left it under the unkeyed one
    /// and the keyed name is free, so an upgrade keeps every tenant's history: the file is renamed
    /// (a symlink as a link: its target, prices and lock stay where they are), and beside a
    /// regular file its prices follow it. Once no file has the old name, the old name's lock file
    /// is removed: an older build made one at every start for every key, and its name shows the
    /// unkeyed fingerprint. Another server doing the same at once is no error. Returns whether it
    /// moved the history.
    pub fn migrate(&self, tenant: Tenant) -> anyhow::Result<bool> {
        if tenant.is_shared() {
            return Ok(false);
        }
        let (old, new) = (self.legacy_path_of(tenant), self.path_of(tenant)?);
        let moved = move_legacy(&old, &new)?;
        if std::fs::symlink_metadata(&old).is_err() {
            // Unlocked: no server of this build saves under the old name.
            let _ = std::fs::remove_file(with_suffix(&old, LOCK_SUFFIX));
        }
        Ok(moved)
    }
}

/// Rename the history `old` (and the prices beside it, when it is a regular file) to `new`, if
/// `old` exists and `new` does not. Returns whether it did.
fn move_legacy(old: &Path, new: &Path) -> anyhow::Result<bool> {
    let Ok(meta) = std::fs::symlink_metadata(old) else { return Ok(false) };
    if std::fs::symlink_metadata(new).is_ok() {
        return Ok(false);
    }
    if !rename_if_there(old, new)? {
        return Ok(false);
    }
    if !meta.file_type().is_symlink() {
        // The old build wrote these with the umask's mode (often world-readable), and a save keeps
        // a file's mode: made private once, here, as the files this build creates are.
        make_private(new)?;
        let new_prices = with_suffix(new, PRICES_SUFFIX);
        if std::fs::symlink_metadata(&new_prices).is_err()
            && rename_if_there(&with_suffix(old, PRICES_SUFFIX), &new_prices)?
        {
            make_private(&new_prices)?;
        }
    }
    Ok(true)
}

/// Owner-only permissions on a file this build took over.
fn make_private(path: &Path) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("making {} private (0600)", path.display()))?;
    }
    Ok(())
}

/// `tenant`'s file id under `secret`: the first 128 bits of a keyed BLAKE3 hash of the tenant's
/// identity, in hex. Unrelated for close keys, and not computable without the secret.
fn file_id(secret: &[u8; SECRET_BYTES], tenant: Tenant) -> String {
    let mut message = FILE_ID_CONTEXT.to_vec();
    message.extend_from_slice(&tenant.scope().to_le_bytes());
    blake3::keyed_hash(secret, &message).to_hex()[..FILE_ID_HEX].to_string()
}

/// `path` with `suffix` after its file name (`h.bin` → `h.bin.lock`).
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().map(OsString::from).unwrap_or_default();
    name.push(suffix);
    path.with_file_name(name)
}

/// Rename `from` to `to`; `from` gone already (another server moved it first) is no error.
fn rename_if_there(from: &Path, to: &Path) -> anyhow::Result<bool> {
    match std::fs::rename(from, to) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("renaming {} to {}", from.display(), to.display())),
    }
}

/// The secret in `path`, made first when there is none (see [`make_secret`]).
fn read_or_make_secret(path: &Path) -> anyhow::Result<[u8; SECRET_BYTES]> {
    if let Some(secret) = read_secret(path)? {
        return Ok(secret);
    }
    make_secret(path)?;
    read_secret(path)?.with_context(|| format!("the history-name secret {} vanished", path.display()))
}

/// The secret in `path`, None when there is none. Any other length is an error: names keyed by
/// another secret would not find the tenants' files.
fn read_secret(path: &Path) -> anyhow::Result<Option<[u8; SECRET_BYTES]>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(e).with_context(|| format!("reading the history-name secret {}", path.display()))
        }
    };
    let secret = bytes.try_into().map_err(|b: Vec<u8>| {
        anyhow::anyhow!(
            "the history-name secret {} holds {} bytes, not {SECRET_BYTES} (restore it; removing it \
             renames every key's history file, and they start empty)",
            path.display(),
            b.len()
        )
    })?;
    Ok(Some(secret))
}

/// Write a new random secret to `path`, 0600, whole or not at all: into a temporary file that is
/// then moved to `path` unless a file is there already (another server starting at the same time
/// made one first: it is kept, and both read it).
fn make_secret(path: &Path) -> anyhow::Result<()> {
    use rand::TryRngCore;
    let mut secret = [0u8; SECRET_BYTES];
    rand::rngs::OsRng.try_fill_bytes(&mut secret).context("drawing the history-name secret")?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let what = || format!("writing the history-name secret {}", path.display());
    let mut builder = tempfile::Builder::new();
    builder.prefix(".treespec-secret.").suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o600));
    }
    let mut tmp = builder.tempfile_in(dir).with_context(what)?;
    tmp.write_all(&secret).with_context(what)?;
    tmp.as_file().sync_all().with_context(what)?;
    match tmp.persist_noclobber(path) {
        Ok(_) => {
            // Durable before any file is named by it (best effort: not every filesystem syncs a
            // directory).
            let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
            Ok(())
        }
        Err(e) if e.error.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e.error).with_context(what),
    }
}

/// Every tenant's suffix state.
pub struct TenantHistories {
    scopes: Mutex<HashMap<Tenant, SuffixStore>>,
    files: Option<(HistoryNames, TokenizerId)>,
    cap: usize,
}

impl std::fmt::Debug for TenantHistories {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantHistories")
            .field("tenants", &self.lock().len())
            .field("files", &self.files.as_ref().map(|(names, _)| names.base()))
            .finish()
    }
}

/// What one file-backed history holds ([`TenantHistories::held`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The history's file.
    pub path: PathBuf,
    /// Documents (requests' texts) in it.
    pub docs: usize,
    /// Tokens in it.
    pub tokens: usize,
}

/// What one tenant's save wrote (its `history` is the tenant's file).
pub use treespec_engine::drafters::StoreSave as Saved;

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
        let files = Some((HistoryNames::new(base), tokenizer));
        let me = Self { scopes: Mutex::new(HashMap::new()), files, cap };
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Tenant, SuffixStore>> {
        self.scopes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How the files are named (None: histories in memory only).
    pub fn names(&self) -> Option<&HistoryNames> {
        self.files.as_ref().map(|(names, _)| names)
    }

    fn open(&self, tenant: Tenant) -> anyhow::Result<SuffixStore> {
        let Some((names, tokenizer)) = &self.files else { return Ok(SuffixStore::in_memory(self.cap)?) };
        names.migrate(tenant).context("moving a suffix history to its keyed name")?;
        let path = names.path_of(tenant)?;
        let file = HistoryFile::open(&path).with_context(|| format!("suffix history {}", path.display()))?;
        let places = StorePlaces { history: Some(file), cache: None, prices: true };
        SuffixStore::open(places, *tokenizer, self.cap)
            .with_context(|| format!("loading the suffix history {} and its learned prices", path.display()))
    }

    /// `tenant`'s suffix state (a tenant first seen now starts empty, or from its file).
    pub fn of(&self, tenant: Tenant) -> anyhow::Result<Arc<SuffixShared>> {
        let mut scopes = self.lock();
        if let Some(s) = scopes.get(&tenant) {
            return Ok(s.shared().clone());
        }
        let store = self.open(tenant)?;
        let shared = store.shared().clone();
        scopes.insert(tenant, store);
        Ok(shared)
    }

    /// What every file-backed history holds now (its file, documents, tokens), in file order:
    /// what a start loaded, so a restarted replica can say its history came back.
    pub fn held(&self) -> Vec<Held> {
        let scopes = self.lock();
        let mut out: Vec<Held> = scopes
            .values()
            .filter_map(|store| {
                let path = store.history_file()?.path().to_path_buf();
                let history = store.shared().history();
                Some(Held { path, docs: history.docs(), tokens: history.tokens() })
            })
            .collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }

    /// Save every history whose text or learned prices changed since its last save, with its
    /// prices, merged with what another server saved to its file since (which this history then
    /// holds too); returns what was written. Every history is tried even when one fails; the
    /// first failure is returned after.
    pub fn save_changed(&self) -> anyhow::Result<Vec<Saved>> {
        let mut out = Vec::new();
        let mut first_error = None;
        let mut scopes = self.lock();
        for store in scopes.values_mut() {
            let path = store.history_file().map(|f| f.path().to_path_buf());
            match store.save_changed() {
                Ok(Some(done)) if done.history.is_some() => out.push(done),
                Ok(_) => {}
                Err(e) => {
                    let at = path.map(|p| p.display().to_string()).unwrap_or_default();
                    first_error.get_or_insert(anyhow::Error::new(e).context(format!("saving {at}")));
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
    use treespec_core::suffix::{GlobalHistory, NodeFeatures, SuffixPricing};

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
        let file = HistoryFile::open(histories.names().unwrap().path_of(a).unwrap()).unwrap();
        assert!(file.prices_path().exists(), "{}", file.prices_path().display());
        assert!(histories.save_changed().unwrap().is_empty(), "nothing changed");
        // Prices learned with no new text are saved too.
        learn(&shared, 7);
        assert_eq!(histories.save_changed().unwrap()[0].trials, 507);
        // A restart gives A its prices back exactly; the shared tenant starts from the prior.
        let again = TenantHistories::in_files(&base, TOK, 1 << 16, [a]).unwrap();
        assert_eq!(again.of(a).unwrap().pricing_snapshot(), shared.pricing_snapshot());
        // What the start loaded is reported: A's one document, the shared tenant's none.
        let held = again.held();
        assert_eq!(held.len(), 2, "{held:?}");
        let of_a = held.iter().find(|h| h.docs == 1).expect("A's history came back");
        assert_eq!(of_a.tokens, shared.history().tokens());
        assert!(held.iter().any(|h| h.docs == 0 && h.tokens == 0), "{held:?}");
        assert_eq!(again.of(Tenant::SHARED).unwrap().pricing().total_trials(), 0);
        // Prices for another tokenizer stop the start, naming the prices file.
        let other = TokenizerId { fingerprint: 0x5eee, vocab: 26 };
        std::fs::write(
            file.prices_path(),
            treespec_engine::drafters::history_file::pricing_to_bytes(&shared.pricing_snapshot(), other),
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
