//! The on-disk side of the global history: one file that several runs (and several processes at
//! once) load from and save to.
//!
//! * **Checked at open.** [`HistoryFile::open`] follows a symlink to its target (a save replaces
//!   the target, never the link), then checks that the target's directory exists and is writable
//!   (by creating and removing a temporary file there) and that the target, when it exists, is a
//!   regular file. Nothing is created for the user: a missing directory is an error naming it,
//!   reported when the process starts rather than when it saves at shutdown.
//! * **Atomic saves.** [`HistoryFile::save`] writes a temporary file with a unique name
//!   (`.<name>.XXXXXX.tmp`) in the target's directory, syncs it, renames it over the target and
//!   syncs the directory. Readers see the old file or the new one, whole; a crash leaves the old
//!   file and, at worst, a stray temporary file; two savers never share a temporary file.
//! * **Savers take turns.** A save holds an advisory lock on the sidecar file `<target>.lock`
//!   (`flock` on Unix, `LockFileEx` on Windows, through the `fs4` crate), waiting for it at most
//!   [`HistoryFile::lock_timeout`] (an error after that, naming the lock file). The lock is held
//!   only while saving, so two servers on one file both keep running. It is taken on a fresh
//!   descriptor for every save, so it also orders two threads of one process. The lock file is
//!   left in place after a save (removing it would let a third saver lock a new file while the
//!   second still holds the old). A plain [`HistoryFile::save`] replaces the file with its history.
//! * **Merging saves.** [`HistoryFile::save_merged`] (what the server uses) re-reads the file under
//!   the lock and merges what another saver put there since into the history in memory before
//!   writing it, so two servers on one file both keep what they learned (see [`MergeState`]):
//!   documents are told apart by a hash of their tokens, a document already in memory is never
//!   added twice, one this history evicted is not brought back, and the merged history stays
//!   within its cap by its own eviction (the merged documents count as the newest). Learned
//!   prices are not merged (decayed counts cannot be added without counting twice what both
//!   savers loaded): the prices file keeps whichever prices recorded more trials.
//! * **Private files.** Every file created here — the temporary file renamed over the target (so
//!   a new history or prices file), the lock file — is created `0600` on Unix (less the umask); a
//!   save over an existing file keeps that file's mode (the operator's choice).
//! * **An empty file is an empty history.** A 0-byte history or prices file (one `touch`ed to set
//!   its permissions before the first start) loads as no history, no prices, and is saved over.
//!
//! The lock file sits beside the resolved target, so two symlinks to one file share it. The
//! symlink is resolved once, at open.
//!
//! **Learned prices beside the history.** The suffix drafter's [`SuffixPricing`] is kept in a
//! sibling file, `<target>.prices.json` ([`HistoryFile::prices_path`]), written by the same
//! procedure under the same lock ([`HistoryFile::save_with_pricing`] writes the prices, then the
//! history, holding the lock once). The history's binary format is unchanged: a history saved
//! before prices were kept simply has no sibling and loads with the default pricing. A
//! [`PricesFile`] is such a prices file on its own (the CLI's learned-prices cache).
//!
//! The prices file is JSON, tagged like the history with the tokenizer its prices were learned
//! with (prices learned on one tokenizer's tokens mean nothing for another's, so another
//! tokenizer's file is refused):
//!
//! ```json
//! { "format": "treespec suffix prices", "version": 1, "grid": 2,
//!   "tokenizer": { "fingerprint": "0x00000000deadbeef", "vocab": 49152 },
//!   "pricing": { "accepted": ["0.0", "12.5", ...], "trials": [...], "total": 1234 } }
//! ```
//!
//! Every floating-point number of the pricing is written as the text of its shortest exact
//! decimal (Rust's `{:?}`) and parsed back by Rust, so the prices read back bit for bit (a JSON
//! number read by `serde_json` without its `float_roundtrip` feature can be one ulp off).
//!
//! `grid` is the version of the pricing's cell layout ([`PRICING_GRID`]; a file without one was
//! written before it was kept: grid 1, the suffix-match cells alone). A file of an older grid
//! whose cells this build's extend is read into those cells (the others start from their
//! prior); a file of any other grid is taken as no prices at all — the run starts from the prior
//! and its next save replaces it — rather than an error that would stop a server whose prices
//! an older or newer build wrote. A file whose pricing does not have its own grid's shape is
//! damaged, and refused.

use std::cell::{Ref, RefCell};
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, RandomState};
use std::io::{ErrorKind, Write};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Map, Number, Value};

use treespec_core::ngram::TokenizerId;
use treespec_core::suffix::{GlobalHistory, SuffixPricing, PRICING_GRID};
use treespec_core::{Error, Result, TokenId};

pub mod format;

/// How long a save waits for another process's save by default.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// Symlinks followed before giving up (as Linux's `ELOOP` limit).
const MAX_SYMLINKS: usize = 40;

/// The `format` tag of a prices file.
pub const PRICES_FORMAT: &str = "treespec suffix prices";
/// The version of the prices file format this build writes and reads.
pub const PRICES_VERSION: u64 = 1;
/// What a history's prices file is named after the history's file name.
pub const PRICES_SUFFIX: &str = ".prices.json";
/// What a file's lock file is named after the file's name.
pub const LOCK_SUFFIX: &str = ".lock";
/// The mode of every file created here (Unix): the history holds the tenants' text.
#[cfg(unix)]
const PRIVATE_MODE: u32 = 0o600;

/// Where a global history is saved: a resolved, checked path and its lock (see the module docs).
#[derive(Debug, Clone)]
pub struct HistoryFile {
    /// The path as given.
    path: PathBuf,
    /// The file a save replaces: `path` with its symlinks followed, in an absolute directory.
    target: PathBuf,
    /// The target's directory (absolute).
    dir: PathBuf,
    /// The sidecar lock file, `<target>.lock`.
    lock: PathBuf,
    /// The target's file name, for temporary files' names.
    name: String,
    lock_timeout: Duration,
    /// What the file holds, for messages ("suffix history", "learned prices").
    what: &'static str,
}

impl HistoryFile {
    /// Resolve `path` (following symlinks) and check that a history can be saved there: the
    /// directory exists and is writable, the target is a regular file or does not exist yet, and
    /// the lock file can be opened (it is created if missing; the history file itself is not).
    /// Every problem is an error naming the path and the reason. Saving blocks (file I/O, and up
    /// to [`Self::lock_timeout`] for the lock): async callers should save on a blocking thread.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let file = Self::open_as(path.as_ref(), "suffix history")?;
        // Best effort: a directory that cannot be listed was already found writable above, and
        // a lock another saver holds means its temporaries are not stale; both wait for the next
        // start.
        let _ = file.remove_stale_temporaries();
        Ok(file)
    }

    /// Remove the temporary files a save of this history or its prices left behind when its
    /// process was killed mid-save (`.<name>.XXXXXX.tmp`): under the lock, so a save in progress
    /// (which holds it from its temporary file's creation to its rename) is never touched.
    /// Returns how many were removed.
    pub fn remove_stale_temporaries(&self) -> Result<usize> {
        let _lock = self.take_lock()?;
        let ours = [format!(".{}.", self.name), format!(".{}.", self.prices_name())];
        let mut removed = 0;
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| Error::Invalid(format!("listing {}: {e}", self.dir.display())))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if ours.iter().any(|prefix| is_temporary_of(name, prefix))
                && std::fs::remove_file(entry.path()).is_ok()
            {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// [`Self::open`] for a file holding `what` (named so in messages).
    fn open_as(path: &Path, what: &'static str) -> Result<Self> {
        let path = path.to_path_buf();
        let bad = |why: String| Error::Invalid(format!("{what} {}: {why}", path.display()));
        let resolved = resolve_symlinks(&path).map_err(&bad)?;
        let name = match resolved.file_name().and_then(|n| n.to_str()) {
            Some(n) => n.to_string(),
            None => return Err(bad(format!("{} does not name a file", resolved.display()))),
        };
        let parent = match resolved.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let dir = std::fs::canonicalize(&parent).map_err(|e| {
            let why =
                if e.kind() == ErrorKind::NotFound { "does not exist".to_string() } else { e.to_string() };
            bad(format!("its directory {}: {why}", parent.display()))
        })?;
        if !dir.is_dir() {
            return Err(bad(format!("{} is not a directory", dir.display())));
        }
        let file = Self {
            target: dir.join(&name),
            lock: dir.join(format!("{name}{LOCK_SUFFIX}")),
            dir,
            name,
            path: path.clone(),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            what,
        };
        // Writable: a temporary file of the kind a save makes can be created there (and is
        // removed again). Checked by trying, as permissions alone do not tell (root, ACLs,
        // read-only mounts).
        file.temp_file(&file.name)
            .map_err(|e| bad(format!("its directory {} is not writable: {e}", file.dir.display())))?;
        file.open_lock().map_err(|e| bad(format!("lock file {}: {e}", file.lock.display())))?;
        Ok(file)
    }

    /// The same file with another bound on the wait for the lock.
    pub fn with_lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// The path as given to [`Self::open`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file a save replaces (symlinks followed).
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// The sidecar lock file.
    pub fn lock_path(&self) -> &Path {
        &self.lock
    }

    /// How long a save waits for the lock.
    pub fn lock_timeout(&self) -> Duration {
        self.lock_timeout
    }

    /// The saved history capped at `cap_tokens` (see [`format::from_bytes`]), or an empty
    /// one when the file does not exist yet or is empty (0 bytes: `touch`ed before the first
    /// start). A malformed file is an error naming the path.
    pub fn load(&self, tokenizer: TokenizerId, cap_tokens: usize) -> Result<GlobalHistory> {
        let bytes = self.read_target()?;
        self.parse_history(&bytes, tokenizer, cap_tokens)
    }

    /// [`Self::load`], with what a merging save ([`Self::save_merged`]) needs to know of the file
    /// as loaded: every document in it (those past the cap too, so they are not merged back).
    pub fn load_for_merging(
        &self,
        tokenizer: TokenizerId,
        cap_tokens: usize,
    ) -> Result<(GlobalHistory, MergeState)> {
        let bytes = self.read_target()?;
        let history = self.parse_history(&bytes, tokenizer, cap_tokens)?;
        let docs = saved_docs(&bytes, tokenizer)
            .map_err(|e| Error::Invalid(format!("suffix history {}: {e}", self.describe())))?;
        let mut state = MergeState::default();
        state.seen = docs.iter().map(|(_, text)| state.hash(text)).collect();
        Ok((history, state))
    }

    /// The target's bytes; none when it does not exist yet.
    fn read_target(&self) -> Result<Vec<u8>> {
        match std::fs::read(&self.target) {
            Ok(bytes) => Ok(bytes),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(Error::Invalid(format!("reading {}: {e}", self.describe()))),
        }
    }

    /// The history in `bytes` (none: an empty history, as a missing file).
    fn parse_history(
        &self,
        bytes: &[u8],
        tokenizer: TokenizerId,
        cap_tokens: usize,
    ) -> Result<GlobalHistory> {
        if bytes.is_empty() {
            return GlobalHistory::new(cap_tokens);
        }
        format::from_bytes(bytes, tokenizer, cap_tokens)
            .map_err(|e| Error::Invalid(format!("suffix history {}: {e}", self.describe())))
    }

    /// Save `history` (tagged with `tokenizer`) atomically under the lock (see the module docs).
    /// The prices file beside it is left as it is.
    pub fn save(&self, history: &GlobalHistory, tokenizer: TokenizerId) -> Result<()> {
        self.save_bytes(&format::to_bytes(history, tokenizer), &mut |_| Ok(()))
    }

    /// The file the learned prices of this history are kept in: `<target>.prices.json`, beside
    /// the resolved target.
    pub fn prices_path(&self) -> PathBuf {
        self.dir.join(self.prices_name())
    }

    fn prices_name(&self) -> String {
        format!("{}{PRICES_SUFFIX}", self.name)
    }

    /// The learned prices saved with this history, or None when there are none (no save with
    /// prices yet, e.g. a history written by an older treespec, or prices of a cell layout this
    /// build cannot read: start from the default pricing). A malformed prices file, or one for
    /// another tokenizer, is an error naming it.
    pub fn load_pricing(&self, tokenizer: TokenizerId) -> Result<Option<SuffixPricing>> {
        read_pricing(&self.prices_path(), tokenizer)
    }

    /// Save `history` and the learned `pricing` with it (both tagged with `tokenizer`), each
    /// atomically, under one hold of the lock: the prices first, then the history.
    pub fn save_with_pricing(
        &self,
        history: &GlobalHistory,
        pricing: &SuffixPricing,
        tokenizer: TokenizerId,
    ) -> Result<()> {
        let _lock = self.take_lock()?;
        let prices = self.prices_path();
        self.write_locked(&prices, &self.prices_name(), &pricing_to_bytes(pricing, tokenizer), &mut |_| {
            Ok(())
        })?;
        self.write_locked(&self.target, &self.name, &format::to_bytes(history, tokenizer), &mut |_| Ok(()))
    }

    /// Save the history that `read` gives (tagged with `tokenizer`) atomically under the lock,
    /// merged with what another saver put in the file since `state` last saw it (see the module
    /// docs and [`MergeState`]), and with it `pricing` unless the prices file holds prices of more
    /// trials. Under the lock: the file is read; its documents that are neither in the history
    /// nor known to `state` are handed to `add` (oldest first), which adds them to the history;
    /// then `read` is called again and what it gives is written. `read` is never held while `add`
    /// runs (an `RwLock`'s read guard may be what it returns), nor during the file's I/O. A file
    /// that cannot be parsed (damaged, another tokenizer's) is replaced, as a plain save would,
    /// and the reason reported in [`MergedSave::replaced`].
    pub fn save_merged<G: Deref<Target = GlobalHistory>>(
        &self,
        state: &mut MergeState,
        tokenizer: TokenizerId,
        pricing: Option<&SuffixPricing>,
        read: impl Fn() -> G,
        mut add: impl FnMut(u64, &[TokenId]),
    ) -> Result<MergedSave> {
        let _lock = self.take_lock()?;
        let (file_docs, replaced) = match saved_docs(&self.read_target()?, tokenizer) {
            Ok(docs) => (docs, None),
            Err(why) => (Vec::new(), Some(why)),
        };
        let file_hashes: Vec<u64> = file_docs.iter().map(|(_, text)| state.hash(text)).collect();
        let in_memory = state.hashes_of(&read());
        let foreign = state.foreign(&file_hashes, &in_memory);
        for &i in &foreign {
            let (key, text) = &file_docs[i];
            add(*key, text);
        }
        let (bytes, written, saved) = {
            let history = read();
            let saved = MergedSave {
                merged: foreign.len(),
                docs: history.docs(),
                tokens: history.tokens(),
                evictions: history.evictions(),
                prices_kept: false,
                replaced,
            };
            (format::to_bytes(&history, tokenizer), state.hashes_of(&history), saved)
        };
        let prices_kept = match pricing {
            Some(pricing) => self.write_prices_unless_richer(pricing, tokenizer)?,
            None => false,
        };
        self.write_locked(&self.target, &self.name, &bytes, &mut |_| Ok(()))?;
        state.remember(written, file_hashes);
        Ok(MergedSave { prices_kept, ..saved })
    }

    /// [`Self::save_merged`] for a history owned here (the merged documents are added to it).
    pub fn save_merging(
        &self,
        history: &mut GlobalHistory,
        state: &mut MergeState,
        tokenizer: TokenizerId,
        pricing: Option<&SuffixPricing>,
    ) -> Result<MergedSave> {
        let cell = RefCell::new(history);
        let read = || Ref::map(cell.borrow(), |h| &**h);
        self.save_merged(state, tokenizer, pricing, read, |key, text| cell.borrow_mut().add(key, text))
    }

    /// Write `pricing` over the prices file (the caller holds the lock) unless the file holds
    /// prices of this tokenizer that recorded more trials: another saver learned more, and its
    /// prices are kept rather than replaced by poorer ones. Returns whether they were kept.
    fn write_prices_unless_richer(&self, pricing: &SuffixPricing, tokenizer: TokenizerId) -> Result<bool> {
        let prices = self.prices_path();
        if let Ok(Some(theirs)) = read_pricing(&prices, tokenizer) {
            if theirs.total_trials() > pricing.total_trials() {
                return Ok(true);
            }
        }
        let bytes = pricing_to_bytes(pricing, tokenizer);
        self.write_locked(&prices, &self.prices_name(), &bytes, &mut |_| Ok(()))?;
        Ok(false)
    }

    /// Write `bytes` over the target under the lock; `before_rename` runs on the synced temporary
    /// file just before it is renamed (tests stop a save there).
    fn save_bytes(
        &self,
        bytes: &[u8],
        before_rename: &mut dyn FnMut(&Path) -> std::io::Result<()>,
    ) -> Result<()> {
        let _lock = self.take_lock()?;
        self.write_locked(&self.target, &self.name, bytes, before_rename)
    }

    /// Write `bytes` over `target` (named `name`, in the target's directory): a temporary file,
    /// synced, renamed over it, the directory synced. The caller holds the lock.
    fn write_locked(
        &self,
        target: &Path,
        name: &str,
        bytes: &[u8],
        before_rename: &mut dyn FnMut(&Path) -> std::io::Result<()>,
    ) -> Result<()> {
        let shown = if target == self.target { self.describe() } else { target.display().to_string() };
        let what = if target == self.target { self.what } else { "learned prices" };
        let io =
            |step: &str, e: std::io::Error| Error::Invalid(format!("saving the {what} {shown}: {step}: {e}"));
        let mut tmp = self.temp_file(name).map_err(|e| io("creating a temporary file", e))?;
        #[cfg(unix)]
        if let Ok(meta) = std::fs::metadata(target) {
            // Keep the mode of the file being replaced.
            tmp.as_file().set_permissions(meta.permissions()).map_err(|e| io("copying permissions", e))?;
        }
        tmp.write_all(bytes).map_err(|e| io("writing", e))?;
        tmp.as_file().sync_all().map_err(|e| io("syncing", e))?;
        before_rename(tmp.path()).map_err(|e| io("before renaming", e))?;
        tmp.persist(target).map_err(|e| io("renaming the temporary file over it", e.error))?;
        sync_dir(&self.dir).map_err(|e| io("syncing its directory", e))
    }

    /// A new temporary file for `name` in the target's directory, removed when dropped unless
    /// persisted. Created 0600 (less the umask): renamed over a target that did not exist, it is
    /// the new file, which holds the tenants' text (a save over an existing file gives it that
    /// file's mode first).
    fn temp_file(&self, name: &str) -> std::io::Result<tempfile::NamedTempFile> {
        let mut b = tempfile::Builder::new();
        let prefix = format!(".{name}.");
        b.prefix(&prefix).suffix(".tmp");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            b.permissions(std::fs::Permissions::from_mode(PRIVATE_MODE));
        }
        b.tempfile_in(&self.dir)
    }

    /// The lock file, created 0600 when missing (an existing one keeps its mode).
    fn open_lock(&self) -> std::io::Result<File> {
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(PRIVATE_MODE);
        }
        options.open(&self.lock)
    }

    /// The lock, held until the returned file is dropped; waits at most `lock_timeout`.
    fn take_lock(&self) -> Result<File> {
        let err = |why: String| Error::Invalid(format!("lock file {}: {why}", self.lock.display()));
        let file = self.open_lock().map_err(|e| err(e.to_string()))?;
        let deadline = Instant::now() + self.lock_timeout;
        let mut pause = Duration::from_millis(1);
        loop {
            // Called through the trait: std's `File::try_lock` is newer than the crate's MSRV.
            match fs4::FileExt::try_lock(&file) {
                Ok(()) => return Ok(file),
                Err(fs4::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Err(fs4::TryLockError::WouldBlock) => {
                    return Err(err(format!(
                        "still held by another saver of {} after {:?}",
                        self.describe(),
                        self.lock_timeout
                    )))
                }
                Err(fs4::TryLockError::Error(e)) => return Err(err(e.to_string())),
            }
        }
    }

    /// The path for messages: as given, and its target when a symlink led elsewhere.
    fn describe(&self) -> String {
        if self.path == self.target {
            self.path.display().to_string()
        } else {
            format!("{} (-> {})", self.path.display(), self.target.display())
        }
    }
}

/// What a merging save ([`HistoryFile::save_merged`]) remembers of its file between saves: the
/// documents the file held when this history last loaded or saved it, and those it wrote, each by
/// a hash of its tokens. At the next save a document of the file that is neither in memory nor
/// remembered here was put there by another saver since, and is merged in; one remembered here
/// but no longer in memory was evicted by this history and stays out (merging it back would undo
/// every eviction, and two servers would hand old documents back and forth for ever).
#[derive(Debug, Clone, Default)]
pub struct MergeState {
    /// The hash's keys: random in each process, so a client cannot craft a document whose hash
    /// collides with another's to keep it from being merged.
    hasher: RandomState,
    /// Hashes of the documents the file held, or this history wrote there, at the last save.
    seen: HashSet<u64>,
}

impl MergeState {
    /// A document's identity: a hash of its tokens (the same text is one document, whatever
    /// prompt it came with).
    fn hash(&self, text: &[TokenId]) -> u64 {
        self.hasher.hash_one(text)
    }

    /// The hashes of the documents `history` holds.
    fn hashes_of(&self, history: &GlobalHistory) -> HashSet<u64> {
        history.documents().map(|(_, text)| self.hash(text)).collect()
    }

    /// Which of the file's documents (by their hashes, oldest first) to merge: those neither in
    /// memory nor seen before, each text once.
    fn foreign(&self, file: &[u64], in_memory: &HashSet<u64>) -> Vec<usize> {
        let mut taken = HashSet::new();
        (0..file.len())
            .filter(|&i| {
                !in_memory.contains(&file[i]) && !self.seen.contains(&file[i]) && taken.insert(file[i])
            })
            .collect()
    }

    /// After a save: what was written and what the file held before are what the file is known
    /// to have held (bounded by two files' documents).
    fn remember(&mut self, written: HashSet<u64>, read: Vec<u64>) {
        self.seen = written;
        self.seen.extend(read);
    }

    /// Documents remembered (tests).
    pub fn remembered(&self) -> usize {
        self.seen.len()
    }
}

/// What a merging save ([`HistoryFile::save_merged`]) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergedSave {
    /// Documents another saver had put in the file, added to the history in memory.
    pub merged: usize,
    /// Documents of the history written.
    pub docs: usize,
    /// Tokens of the history written (breaks included).
    pub tokens: usize,
    /// Documents the written history had evicted until then (with `docs`: all it was ever given).
    pub evictions: u64,
    /// Whether the prices file was left as it was, holding prices of more trials than these.
    pub prices_kept: bool,
    /// Why the file could not be merged (damaged, another tokenizer's) when it was replaced.
    pub replaced: Option<String>,
}

/// The documents of a saved history (see [`format::documents_in`]), or why not. No bytes
/// (a file not written yet, or `touch`ed) hold no documents.
fn saved_docs(bytes: &[u8], tokenizer: TokenizerId) -> std::result::Result<Vec<(u64, Vec<TokenId>)>, String> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    format::documents_in(bytes, tokenizer).map_err(|e| e.to_string())
}

/// Learned prices on their own in a file (the CLI's learned-prices cache): the format of a
/// history's prices file (see the module docs), opened, checked, saved and locked as a
/// [`HistoryFile`] is (its lock is `<target>.lock`).
#[derive(Debug, Clone)]
pub struct PricesFile {
    file: HistoryFile,
}

impl PricesFile {
    /// Resolve and check `path` as [`HistoryFile::open`] does (the directory must exist).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Ok(Self { file: HistoryFile::open_as(path.as_ref(), "learned prices")? })
    }

    /// The same file with another bound on the wait for the lock.
    pub fn with_lock_timeout(self, timeout: Duration) -> Self {
        Self { file: self.file.with_lock_timeout(timeout) }
    }

    /// The path as given to [`Self::open`].
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The file a save replaces (symlinks followed).
    pub fn target(&self) -> &Path {
        self.file.target()
    }

    /// The saved prices, or None when the file does not exist yet or holds prices of a cell
    /// layout this build cannot read. A malformed file, or one for another tokenizer, is an
    /// error naming it.
    pub fn load(&self, tokenizer: TokenizerId) -> Result<Option<SuffixPricing>> {
        read_pricing(self.file.target(), tokenizer)
    }

    /// Save `pricing` (tagged with `tokenizer`) atomically under the lock.
    pub fn save(&self, pricing: &SuffixPricing, tokenizer: TokenizerId) -> Result<()> {
        self.file.save_bytes(&pricing_to_bytes(pricing, tokenizer), &mut |_| Ok(()))
    }
}

/// The prices in the file at `path`, None when it does not exist or is empty (`touch`ed).
fn read_pricing(path: &Path, tokenizer: TokenizerId) -> Result<Option<SuffixPricing>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) if bytes.is_empty() => return Ok(None),
        Ok(bytes) => bytes,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::Invalid(format!("reading the learned prices {}: {e}", path.display()))),
    };
    parse_pricing(&bytes, tokenizer)
        .map_err(|e| Error::Invalid(format!("learned prices {}: {e}", path.display())))
}

/// The bytes of a prices file (see the module docs) holding `pricing`, learned on `tokenizer`.
pub fn pricing_to_bytes(pricing: &SuffixPricing, tokenizer: TokenizerId) -> Vec<u8> {
    let pricing = serde_json::to_value(pricing).expect("the pricing serializes");
    let file = serde_json::json!({
        "format": PRICES_FORMAT,
        "version": PRICES_VERSION,
        "grid": PRICING_GRID,
        "tokenizer": {
            "fingerprint": format!("{:#018x}", tokenizer.fingerprint),
            "vocab": tokenizer.vocab,
        },
        "pricing": floats_as_text(pricing),
    });
    let mut bytes = serde_json::to_vec_pretty(&file).expect("a JSON value serializes");
    bytes.push(b'\n');
    bytes
}

/// Parse the bytes of a prices file written by [`pricing_to_bytes`] for `tokenizer`. Every
/// problem (not JSON, another format or version, another tokenizer, a pricing not of its grid's
/// shape, a number that is not finite and non-negative) is an error naming it. Prices of a
/// cell layout this build cannot read (see the module docs) are the default pricing: the run
/// starts from the prior.
pub fn pricing_from_bytes(bytes: &[u8], tokenizer: TokenizerId) -> Result<SuffixPricing> {
    parse_pricing(bytes, tokenizer).map(Option::unwrap_or_default)
}

/// [`pricing_from_bytes`], with `None` for prices of a cell layout this build cannot read.
fn parse_pricing(bytes: &[u8], tokenizer: TokenizerId) -> Result<Option<SuffixPricing>> {
    let bad = |why: String| Error::Invalid(why);
    let file: Value = serde_json::from_slice(bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    if file.get("format").and_then(Value::as_str) != Some(PRICES_FORMAT) {
        return Err(bad(format!("not a treespec prices file (no \"format\": \"{PRICES_FORMAT}\")")));
    }
    match file.get("version").and_then(Value::as_u64) {
        Some(PRICES_VERSION) => {}
        Some(v) => {
            return Err(bad(format!("format version {v}, but this treespec reads version {PRICES_VERSION}")))
        }
        None => return Err(bad("no format version".into())),
    }
    let found = file
        .get("tokenizer")
        .and_then(|t| {
            let hex = t.get("fingerprint")?.as_str()?.strip_prefix("0x")?;
            let fingerprint = u64::from_str_radix(hex, 16).ok()?;
            let vocab = u32::try_from(t.get("vocab")?.as_u64()?).ok()?;
            Some(TokenizerId { fingerprint, vocab })
        })
        .ok_or_else(|| bad("no valid \"tokenizer\" (a hex \"fingerprint\" and a \"vocab\")".into()))?;
    if found != tokenizer {
        return Err(bad(format!("written for the tokenizer with {found}, but the model's is {tokenizer}")));
    }
    // Without a grid: written before the layout was versioned, grid 1.
    let grid = match file.get("grid") {
        None => 1,
        Some(g) => g.as_u64().ok_or_else(|| bad(format!("\"grid\" is {g}, not a layout version")))?,
    };
    let Some(cells) = SuffixPricing::grid_cells(grid) else { return Ok(None) };
    let found = file.get("pricing").ok_or_else(|| bad("no \"pricing\"".into()))?;
    let mut want = serde_json::to_value(SuffixPricing::default()).expect("the pricing serializes");
    for counts in ["accepted", "trials"] {
        if let Some(Value::Array(a)) = want.get_mut(counts) {
            a.resize(cells, a.first().cloned().unwrap_or(Value::Null));
        }
    }
    let value = text_as_floats(&want, found, "pricing").map_err(bad)?;
    let saved: SuffixPricing = serde_json::from_value(value).map_err(|e| bad(format!("pricing: {e}")))?;
    SuffixPricing::from_grid(grid, saved)
        .map(Some)
        .ok_or_else(|| bad(format!("pricing is not of grid {grid}")))
}

/// `v` with every floating-point number replaced by the text of its shortest exact decimal.
fn floats_as_text(v: Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => Value::String(format!("{:?}", n.as_f64().expect("an f64"))),
        Value::Array(items) => Value::Array(items.into_iter().map(floats_as_text).collect()),
        Value::Object(fields) => {
            Value::Object(fields.into_iter().map(|(k, v)| (k, floats_as_text(v))).collect())
        }
        other => other,
    }
}

/// `found` read as a value of `want`'s shape (the same keys, the same array lengths) with the
/// texts standing for `want`'s floating-point numbers parsed back (each finite and ≥ 0), or what
/// differs, at `at` (a path such as `pricing.trials[3]`).
fn text_as_floats(want: &Value, found: &Value, at: &str) -> std::result::Result<Value, String> {
    match (want, found) {
        (Value::Number(w), Value::String(_) | Value::Number(_)) if w.is_f64() => {
            // The text of an exact decimal; a plain JSON number (a hand edit) is taken too.
            let x = match found {
                Value::String(s) => s.parse::<f64>().ok(),
                _ => found.as_f64(),
            };
            match x {
                Some(x) if x.is_finite() && x >= 0.0 => {
                    Ok(Value::Number(Number::from_f64(x).expect("finite")))
                }
                _ => Err(format!("{at} is {found}, not a finite non-negative number")),
            }
        }
        (Value::Number(w), Value::Number(n)) if w.is_u64() && n.is_u64() => Ok(found.clone()),
        (Value::Array(w), Value::Array(f)) => {
            if w.len() != f.len() {
                return Err(format!(
                    "{at} holds {} values where this treespec has {} (prices of another feature grid)",
                    f.len(),
                    w.len()
                ));
            }
            (0..w.len())
                .map(|i| text_as_floats(&w[i], &f[i], &format!("{at}[{i}]")))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map(Value::Array)
        }
        (Value::Object(w), Value::Object(f)) => {
            if let Some(k) = f.keys().find(|k| !w.contains_key(*k)) {
                return Err(format!("{at} has an unknown field {k:?}"));
            }
            let mut out = Map::new();
            for (k, wv) in w {
                let fv = f.get(k).ok_or_else(|| format!("{at} has no field {k:?}"))?;
                out.insert(k.clone(), text_as_floats(wv, fv, &format!("{at}.{k}"))?);
            }
            Ok(Value::Object(out))
        }
        _ => {
            let mut shown = found.to_string();
            if shown.len() > 40 {
                shown = format!("{}…", shown.chars().take(40).collect::<String>());
            }
            Err(format!("{at} is {shown}, not what a pricing holds there"))
        }
    }
}

/// `path` with every symlink in its last component followed (the target need not exist yet).
fn resolve_symlinks(path: &Path) -> std::result::Result<PathBuf, String> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_SYMLINKS {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let link =
                    std::fs::read_link(&p).map_err(|e| format!("reading the link {}: {e}", p.display()))?;
                // A relative link is relative to the link's directory (`join` keeps an absolute one).
                p = p.parent().map_or_else(|| link.clone(), |d| d.join(&link));
            }
            Ok(m) if m.is_file() => return Ok(p),
            Ok(m) if m.is_dir() => return Err(format!("{} is a directory", p.display())),
            Ok(_) => return Err(format!("{} is not a regular file", p.display())),
            // Not there yet: the first save creates it. (A missing directory is reported by the
            // caller, naming the directory.)
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(p),
            Err(e) => return Err(format!("{}: {e}", p.display())),
        }
    }
    Err(format!("more than {MAX_SYMLINKS} symlinks to follow"))
}

/// Make a rename in `dir` durable. Filesystems that cannot sync a directory (they answer
/// `EINVAL`) are let be.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    match File::open(dir)?.sync_all() {
        Err(e) if e.kind() == ErrorKind::InvalidInput => {}
        other => return other,
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Write `history` to `path`, tagged with the tokenizer its ids belong to: through a
/// [`HistoryFile`] (a symlink is followed, a unique temporary file is renamed over the target
/// under an advisory lock). A caller that saves more than once should keep a [`HistoryFile`].
pub fn save_history(history: &GlobalHistory, path: &Path, tokenizer: TokenizerId) -> Result<()> {
    HistoryFile::open(path)?.save(history, tokenizer)
}

/// Whether `name` is a temporary file [`HistoryFile::temp_file`] makes for the file whose
/// temporaries start with `prefix` (`.<name>.`): the prefix, random letters and digits (no dot,
/// so `.h.bin.XXXXXX.tmp` is not taken for a temporary of `h`), `.tmp`.
fn is_temporary_of(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_suffix(".tmp"))
        .is_some_and(|random| !random.is_empty() && random.chars().all(|c| c.is_ascii_alphanumeric()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOK: TokenizerId = TokenizerId { fingerprint: 11, vocab: 100 };

    fn history(docs: &[&[u32]]) -> GlobalHistory {
        let mut h = GlobalHistory::new(1000).unwrap();
        for (i, d) in docs.iter().enumerate() {
            h.add(i as u64, d);
        }
        h
    }

    /// Files in `dir` other than `keep`.
    fn others(dir: &Path, keep: &[&str]) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !keep.contains(&n.as_str()))
            .collect()
    }

    #[test]
    fn a_save_stopped_before_its_rename_leaves_the_old_file_whole() {
        let dir = tempfile::tempdir().unwrap();
        let file = HistoryFile::open(dir.path().join("h.bin")).unwrap();
        let old = history(&[&[1, 2, 3]]);
        file.save(&old, TOK).unwrap();
        let new = history(&[&[4, 5, 6, 7], &[8, 9]]);
        let mut seen = None;
        let stopped = file.save_bytes(&format::to_bytes(&new, TOK), &mut |tmp| {
            // The new bytes are complete and synced in a file of their own, the target untouched.
            seen = Some((std::fs::read(tmp)?, std::fs::read(file.target())?));
            Err(std::io::Error::other("simulated crash"))
        });
        assert!(stopped.unwrap_err().to_string().contains("simulated crash"));
        let (tmp_bytes, target_bytes) = seen.expect("the hook ran");
        assert_eq!(tmp_bytes, format::to_bytes(&new, TOK));
        assert_eq!(target_bytes, format::to_bytes(&old, TOK));
        assert_eq!(file.load(TOK, 1000).unwrap().index().tokens(), old.index().tokens());
        // The failed save removed its temporary file.
        assert_eq!(others(dir.path(), &["h.bin", "h.bin.lock"]), Vec::<String>::new());
        file.save(&new, TOK).unwrap();
        assert_eq!(file.load(TOK, 1000).unwrap().index().tokens(), new.index().tokens());
    }

    #[test]
    fn a_kill_mid_save_leaves_temporaries_that_the_next_open_removes_and_no_other_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = HistoryFile::open(dir.path().join("h.bin")).unwrap();
        file.save(&history(&[&[1, 2, 3]]), TOK).unwrap();
        // What a SIGKILL between a temporary's creation and its rename leaves, for the history
        // and for its prices; beside them files that are not ours.
        let stale = [".h.bin.a1B2c3.tmp", ".h.bin.prices.json.Zz9Yy8.tmp"];
        let foreign = [".h.bin.notes", ".other.bin.a1B2c3.tmp", "h.bin.a1B2c3.tmp", ".h.x1.tmp.keep"];
        for name in stale.iter().chain(&foreign) {
            std::fs::write(dir.path().join(name), b"partial").unwrap();
        }
        let again = HistoryFile::open(dir.path().join("h.bin")).unwrap();
        let mut left = others(dir.path(), &["h.bin", "h.bin.lock"]);
        left.sort();
        let mut want: Vec<String> = foreign.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(left, want, "only the stale temporaries of this history are gone");
        assert_eq!(again.load(TOK, 1000).unwrap().index().tokens(), history(&[&[1, 2, 3]]).index().tokens());
        // While another saver holds the lock its temporaries are not stale: nothing is removed.
        std::fs::write(dir.path().join(stale[0]), b"in progress").unwrap();
        let held = again.take_lock().unwrap();
        let waiting = again.clone().with_lock_timeout(Duration::from_millis(20));
        assert!(waiting.remove_stale_temporaries().is_err());
        assert!(dir.path().join(stale[0]).exists());
        drop(held);
        assert_eq!(again.remove_stale_temporaries().unwrap(), 1);
    }

    #[test]
    fn lock_errors_name_the_lock_file_and_other_savers_wait() {
        let dir = tempfile::tempdir().unwrap();
        let file = HistoryFile::open(dir.path().join("h.bin")).unwrap().with_lock_timeout(Duration::ZERO);
        let held = file.take_lock().unwrap();
        let err = file.save(&history(&[&[1]]), TOK).unwrap_err().to_string();
        assert!(err.contains("h.bin.lock") && err.contains("still held"), "{err}");
        assert!(!file.target().exists());
        drop(held);
        file.save(&history(&[&[1]]), TOK).unwrap();
        assert_eq!(file.load(TOK, 1000).unwrap().docs(), 1);
    }

    fn trained_pricing() -> SuffixPricing {
        use treespec_core::suffix::NodeFeatures;
        let mut p = SuffixPricing::new();
        // Irregular decayed counts in many cells: floats that a lossy decimal would not keep.
        for i in 0..3000u64 {
            let f = NodeFeatures {
                match_len: (i % 70) as usize,
                depth: 1 + (i % 9) as usize,
                share: [0.3, 0.7, 1.0][(i % 3) as usize],
                support: 1 + (i % 2) as u32,
                global: i % 5 == 0,
            };
            p.record(&f, (i * 2_654_435_761) % 7 < 4);
        }
        p
    }

    #[test]
    fn prices_round_trip_exactly_beside_the_history() {
        let dir = tempfile::tempdir().unwrap();
        let file = HistoryFile::open(dir.path().join("h.bin")).unwrap();
        assert_eq!(file.prices_path(), file.target().with_file_name("h.bin.prices.json"));
        assert_eq!(file.load_pricing(TOK).unwrap(), None, "nothing saved yet");
        let h = history(&[&[1, 2, 3], &[4, 5]]);
        let p = trained_pricing();
        assert_eq!(p.total_trials(), 3000);
        file.save_with_pricing(&h, &p, TOK).unwrap();
        let back = file.load_pricing(TOK).unwrap().expect("saved prices");
        // Bit for bit: the derived equality compares every count exactly, and so does serde.
        assert_eq!(back, p);
        assert_eq!(serde_json::to_value(&back).unwrap(), serde_json::to_value(&p).unwrap());
        assert_eq!(file.load(TOK, 1000).unwrap().index().tokens(), h.index().tokens());
        // The history itself is still the binary format older builds read.
        assert!(std::fs::read(file.target()).unwrap().starts_with(b"TSSUFH01"));
        assert_eq!(others(dir.path(), &["h.bin", "h.bin.lock", "h.bin.prices.json"]), Vec::<String>::new());

        // The same through a prices file of its own.
        let alone = PricesFile::open(dir.path().join("p.json")).unwrap();
        assert_eq!(alone.load(TOK).unwrap(), None);
        alone.save(&p, TOK).unwrap();
        assert_eq!(alone.load(TOK).unwrap(), Some(p.clone()));
        assert_eq!(pricing_from_bytes(&pricing_to_bytes(&p, TOK), TOK).unwrap(), p);
        let fresh = SuffixPricing::new();
        assert_eq!(pricing_from_bytes(&pricing_to_bytes(&fresh, TOK), TOK).unwrap(), fresh);
    }

    #[test]
    fn another_tokenizers_prices_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = HistoryFile::open(dir.path().join("h.bin")).unwrap();
        file.save_with_pricing(&history(&[&[1, 2]]), &trained_pricing(), TOK).unwrap();
        for other in
            [TokenizerId { fingerprint: 12, vocab: 100 }, TokenizerId { fingerprint: 11, vocab: 101 }]
        {
            let err = file.load_pricing(other).unwrap_err().to_string();
            assert!(err.contains("tokenizer") && err.contains("h.bin.prices.json"), "{err}");
        }
        let alone = PricesFile::open(dir.path().join("p.json")).unwrap();
        alone.save(&trained_pricing(), TOK).unwrap();
        let err = alone.load(TokenizerId { fingerprint: 12, vocab: 100 }).unwrap_err().to_string();
        assert!(err.contains("tokenizer") && err.contains("p.json"), "{err}");
    }

    #[test]
    fn a_history_saved_without_prices_loads_with_the_default_pricing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.bin");
        // What a build before the prices wrote: the history alone.
        let h = history(&[&[7, 8, 9]]);
        std::fs::write(&path, format::to_bytes(&h, TOK)).unwrap();
        let file = HistoryFile::open(&path).unwrap();
        assert_eq!(file.load(TOK, 1000).unwrap().index().tokens(), h.index().tokens());
        assert_eq!(file.load_pricing(TOK).unwrap(), None);
        // A plain save still leaves the prices alone; a save with prices adds them.
        file.save(&h, TOK).unwrap();
        assert!(!file.prices_path().exists());
        file.save_with_pricing(&h, &trained_pricing(), TOK).unwrap();
        assert_eq!(file.load_pricing(TOK).unwrap(), Some(trained_pricing()));
    }

    #[test]
    fn malformed_prices_are_errors_naming_the_problem() {
        let good: Value = serde_json::from_slice(&pricing_to_bytes(&trained_pricing(), TOK)).unwrap();
        let check = |edit: &dyn Fn(&mut Value), want: &str| {
            let mut v = good.clone();
            edit(&mut v);
            let err = pricing_from_bytes(&serde_json::to_vec(&v).unwrap(), TOK).unwrap_err().to_string();
            assert!(err.contains(want), "{want}: {err}");
        };
        check(&|v| v["format"] = "something else".into(), "not a treespec prices file");
        check(&|v| v["version"] = 2.into(), "version 2");
        check(&|v| v["tokenizer"]["fingerprint"] = 11.into(), "tokenizer");
        check(&|v| drop(v["pricing"]["accepted"].as_array_mut().unwrap().pop()), "feature grid");
        check(&|v| v["pricing"]["trials"][3] = "-1.0".into(), "pricing.trials[3]");
        check(&|v| v["pricing"]["trials"][3] = "NaN".into(), "finite");
        check(&|v| v["pricing"]["total"] = "12".into(), "pricing.total");
        check(&|v| drop(v["pricing"].as_object_mut().unwrap().remove("trials")), "no field \"trials\"");
        check(&|v| v["pricing"]["extra"] = 1.into(), "unknown field");
        let bytes = pricing_to_bytes(&trained_pricing(), TOK);
        for cut in [0, 1, bytes.len() / 2, bytes.len() - 3] {
            assert!(pricing_from_bytes(&bytes[..cut], TOK).is_err(), "cut at {cut}");
        }
        // A hand-edited plain number is read.
        let mut v = good.clone();
        v["pricing"]["trials"][0] = 2.5.into();
        assert!(pricing_from_bytes(&serde_json::to_vec(&v).unwrap(), TOK).is_ok());
    }

    #[test]
    fn prices_of_another_grid_start_from_the_prior_or_keep_the_cells_that_mean_the_same() {
        use treespec_core::suffix::{AnchorFeatures, NodeFeatures, ResumeKind};
        let p = trained_pricing();
        let good: Value = serde_json::from_slice(&pricing_to_bytes(&p, TOK)).unwrap();
        assert_eq!(good["grid"], PRICING_GRID);
        let dir = tempfile::tempdir().unwrap();
        let alone = PricesFile::open(dir.path().join("p.json")).unwrap();
        let write = |v: &Value| std::fs::write(alone.target(), serde_json::to_vec(v).unwrap()).unwrap();
        // A file written before re-anchoring: no grid, the 112 match cells alone. They are read,
        // with the trials they recorded; the resumed-copy cells start from their prior.
        let cells = SuffixPricing::grid_cells(1).unwrap();
        let mut old = good.clone();
        old.as_object_mut().unwrap().remove("grid");
        for counts in ["accepted", "trials"] {
            old["pricing"][counts].as_array_mut().unwrap().truncate(cells);
        }
        write(&old);
        let read = alone.load(TOK).unwrap().expect("grid 1 prices are read");
        assert_eq!(read.total_trials(), p.total_trials());
        let f = NodeFeatures { match_len: 9, depth: 2, share: 1.0, support: 1, global: false };
        assert_eq!(read.posterior(&f), p.posterior(&f));
        let a = AnchorFeatures { kind: ResumeKind::Skip, evidence: 1, depth: 1 };
        assert_eq!(read.posterior(&a), SuffixPricing::new().posterior(&a));
        // An older build's file that says grid 1 explicitly is the same.
        let mut one = old.clone();
        one["grid"] = 1.into();
        assert_eq!(pricing_from_bytes(&serde_json::to_vec(&one).unwrap(), TOK).unwrap(), read);
        // A layout this build does not know (a newer build's): no prices, not an error, whether
        // as a cache file or beside a history.
        let mut newer = good.clone();
        newer["grid"] = 99.into();
        newer["pricing"]["accepted"].as_array_mut().unwrap().push("1.0".into());
        write(&newer);
        assert_eq!(alone.load(TOK).unwrap(), None);
        assert_eq!(
            pricing_from_bytes(&serde_json::to_vec(&newer).unwrap(), TOK).unwrap(),
            SuffixPricing::new()
        );
        let file = HistoryFile::open(dir.path().join("h.bin")).unwrap();
        std::fs::write(file.prices_path(), serde_json::to_vec(&newer).unwrap()).unwrap();
        assert_eq!(file.load_pricing(TOK).unwrap(), None);
        // A grid-1 file that does not hold grid 1's cells, or a grid that is not a number, is
        // damaged.
        let mut damaged = old.clone();
        damaged["pricing"]["trials"].as_array_mut().unwrap().pop();
        let err = pricing_from_bytes(&serde_json::to_vec(&damaged).unwrap(), TOK).unwrap_err().to_string();
        assert!(err.contains("feature grid"), "{err}");
        let mut word = good.clone();
        word["grid"] = "two".into();
        let err = pricing_from_bytes(&serde_json::to_vec(&word).unwrap(), TOK).unwrap_err().to_string();
        assert!(err.contains("grid"), "{err}");
        // Another tokenizer's prices are refused whatever their grid.
        write(&newer);
        assert!(alone.load(TokenizerId { fingerprint: 12, vocab: 100 }).is_err());
    }

    /// The texts `h` holds, oldest first.
    fn texts(h: &GlobalHistory) -> Vec<Vec<u32>> {
        h.documents().map(|(_, text)| text.to_vec()).collect()
    }

    /// A document of six tokens, a different one for each seed below 10,000.
    fn doc(seed: u32) -> Vec<u32> {
        vec![seed % TOK.vocab, seed / TOK.vocab % TOK.vocab, 1, 2, 3, 4]
    }

    #[test]
    fn two_savers_on_one_file_keep_both_histories() {
        let dir = tempfile::tempdir().unwrap();
        let file = HistoryFile::open(dir.path().join("h.bin")).unwrap();
        let (mut a, mut a_state) = file.load_for_merging(TOK, 1000).unwrap();
        let (mut b, mut b_state) = file.load_for_merging(TOK, 1000).unwrap();
        // Each serves different text and saves after every request, in turn.
        for round in 0..3u32 {
            a.add(1, &doc(round));
            let saved = file.save_merging(&mut a, &mut a_state, TOK, None).unwrap();
            assert_eq!(saved.merged, usize::from(round > 0), "B's document of the round before");
            b.add(2, &doc(100 + round));
            let saved = file.save_merging(&mut b, &mut b_state, TOK, None).unwrap();
            assert_eq!(saved.merged, 1, "A's document of this round");
            assert_eq!((saved.docs, saved.replaced), (2 * round as usize + 2, None));
        }
        // B's last save holds both; A holds B's documents in memory too (it drafts from them).
        let mut want: Vec<Vec<u32>> = (0..3).flat_map(|r| [doc(r), doc(100 + r)]).collect();
        want.sort();
        let sorted = |h: &GlobalHistory| {
            let mut t = texts(h);
            t.sort();
            t
        };
        assert_eq!(sorted(&b), want);
        assert_eq!(sorted(&a), want[..].iter().filter(|d| **d != doc(102)).cloned().collect::<Vec<_>>());
        // A third start on the file sees both servers' documents, each once.
        let third = file.load(TOK, 1000).unwrap();
        assert_eq!(sorted(&third), want);
        // A's next save brings B's last one into A, and writes every document once.
        file.save_merging(&mut a, &mut a_state, TOK, None).unwrap();
        assert_eq!(sorted(&a), want);
        assert_eq!(sorted(&file.load(TOK, 1000).unwrap()), want);
    }

    #[test]
    fn repeated_merging_saves_do_not_duplicate_documents() {
        let dir = tempfile::tempdir().unwrap();
        let file = HistoryFile::open(dir.path().join("h.bin")).unwrap();
        file.save(&history(&[&doc(1), &doc(2)]), TOK).unwrap();
        let (mut a, mut a_state) = file.load_for_merging(TOK, 1000).unwrap();
        let (mut b, mut b_state) = file.load_for_merging(TOK, 1000).unwrap();
        a.add(3, &doc(3));
        b.add(4, &doc(4));
        // The same text learned by both servers is one document.
        a.add(5, &doc(5));
        b.add(6, &doc(5));
        for _ in 0..10 {
            file.save_merging(&mut a, &mut a_state, TOK, None).unwrap();
            file.save_merging(&mut b, &mut b_state, TOK, None).unwrap();
        }
        for h in [&a, &b, &file.load(TOK, 1000).unwrap()] {
            assert_eq!(h.docs(), 5, "{:?}", texts(h));
        }
        // Nothing new: a save merges nothing and the file stays as it is.
        let before = std::fs::read(file.target()).unwrap();
        let saved = file.save_merging(&mut b, &mut b_state, TOK, None).unwrap();
        assert_eq!((saved.merged, saved.docs), (0, 5));
        assert_eq!(std::fs::read(file.target()).unwrap(), before);
        assert!(b_state.remembered() <= 10);
    }

    #[test]
    fn merged_histories_stay_within_the_cap_and_evicted_documents_stay_out() {
        let dir = tempfile::tempdir().unwrap();
        let file = HistoryFile::open(dir.path().join("h.bin")).unwrap();
        let cap = 50; // seven documents of six tokens and a break
        let (mut a, mut a_state) = file.load_for_merging(TOK, cap).unwrap();
        let (mut b, mut b_state) = file.load_for_merging(TOK, cap).unwrap();
        for i in 0..40u32 {
            let (h, state) = if i % 2 == 0 { (&mut a, &mut a_state) } else { (&mut b, &mut b_state) };
            h.add(u64::from(i), &doc(i));
            let saved = file.save_merging(h, state, TOK, None).unwrap();
            assert!(saved.tokens <= cap, "{} tokens after save {i}", saved.tokens);
            let on_disk = file.load(TOK, 1_000_000).unwrap();
            assert!(on_disk.tokens() <= cap, "{} tokens in the file after save {i}", on_disk.tokens());
        }
        // The newest documents are kept, the oldest gone for good (not handed back and forth).
        let last = texts(&file.load(TOK, 1_000_000).unwrap());
        assert!(last.contains(&doc(39)) && last.contains(&doc(38)), "{last:?}");
        for old in 0..20 {
            assert!(!last.contains(&doc(old)), "document {old} came back: {last:?}");
        }
    }

    #[test]
    fn a_merging_save_keeps_prices_of_more_trials_and_replaces_a_damaged_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = HistoryFile::open(dir.path().join("h.bin")).unwrap();
        let (mut a, mut state) = file.load_for_merging(TOK, 1000).unwrap();
        a.add(1, &doc(1));
        let rich = trained_pricing();
        assert!(!file.save_merging(&mut a, &mut state, TOK, Some(&rich)).unwrap().prices_kept);
        // A saver that learned less leaves the richer prices in place; its history is saved.
        a.add(2, &doc(2));
        let poor = SuffixPricing::new();
        let saved = file.save_merging(&mut a, &mut state, TOK, Some(&poor)).unwrap();
        assert!(saved.prices_kept);
        assert_eq!(file.load_pricing(TOK).unwrap(), Some(rich.clone()));
        assert_eq!(file.load(TOK, 1000).unwrap().docs(), 2);
        // A damaged history file (or prices file) is replaced, saying why.
        std::fs::write(file.target(), b"TSSUFH01\x01").unwrap();
        std::fs::write(file.prices_path(), b"{").unwrap();
        let saved = file.save_merging(&mut a, &mut state, TOK, Some(&poor)).unwrap();
        assert!(saved.replaced.as_deref().unwrap_or_default().contains("truncated"), "{saved:?}");
        assert!(!saved.prices_kept);
        assert_eq!(file.load(TOK, 1000).unwrap().docs(), 2);
        assert_eq!(file.load_pricing(TOK).unwrap(), Some(poor));
    }

    #[test]
    fn saved_docs_reads_what_to_bytes_writes() {
        let h = history(&[&[1, 2, 3], &[4], &[5, 6]]);
        let docs = saved_docs(&format::to_bytes(&h, TOK), TOK).unwrap();
        assert_eq!(docs, vec![(0, vec![1, 2, 3]), (1, vec![4]), (2, vec![5, 6])]);
        assert_eq!(saved_docs(&[], TOK).unwrap(), vec![]);
        let bytes = format::to_bytes(&h, TOK);
        for cut in [1, 7, 20, bytes.len() - 1] {
            assert!(saved_docs(&bytes[..cut], TOK).is_err(), "cut at {cut}");
            assert!(format::from_bytes(&bytes[..cut], TOK, 1000).is_err(), "cut at {cut}");
        }
        let err = saved_docs(&bytes, TokenizerId { fingerprint: 12, vocab: 100 }).unwrap_err();
        assert!(err.contains("tokenizer"), "{err}");
        let err = saved_docs(&bytes, TokenizerId { fingerprint: 11, vocab: 5 }).unwrap_err();
        assert!(err.contains("tokenizer"), "{err}");
    }

    #[test]
    fn an_empty_file_is_an_empty_history_and_is_saved_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.bin");
        // What an operator does before the first start: touch, then set the permissions.
        std::fs::write(&path, b"").unwrap();
        let file = HistoryFile::open(&path).unwrap();
        assert_eq!(file.load(TOK, 1000).unwrap().docs(), 0);
        std::fs::write(file.prices_path(), b"").unwrap();
        assert_eq!(file.load_pricing(TOK).unwrap(), None);
        let (mut h, mut state) = file.load_for_merging(TOK, 1000).unwrap();
        assert_eq!((h.docs(), state.remembered()), (0, 0));
        h.add(1, &doc(1));
        let saved = file.save_merging(&mut h, &mut state, TOK, Some(&trained_pricing())).unwrap();
        assert_eq!((saved.docs, saved.replaced), (1, None));
        assert_eq!(texts(&file.load(TOK, 1000).unwrap()), vec![doc(1)]);
        assert_eq!(file.load_pricing(TOK).unwrap(), Some(trained_pricing()));
    }

    #[cfg(unix)]
    #[test]
    fn files_created_here_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let dir = tempfile::tempdir().unwrap();
        let file = HistoryFile::open(dir.path().join("h.bin")).unwrap();
        assert_eq!(mode(file.lock_path()), 0o600, "the lock file");
        // The temporary file of a first save is 0600 from its creation: the new file's mode.
        let mut seen = None;
        let _ = file.save_bytes(&format::to_bytes(&history(&[&[3]]), TOK), &mut |tmp| {
            seen = Some(mode(tmp));
            Err(std::io::Error::other("stop"))
        });
        assert_eq!(seen, Some(0o600));
        file.save_with_pricing(&history(&[&[1, 2]]), &trained_pricing(), TOK).unwrap();
        assert_eq!(mode(file.target()), 0o600, "a new history");
        assert_eq!(mode(&file.prices_path()), 0o600, "a new prices file");
        let alone = PricesFile::open(dir.path().join("p.json")).unwrap();
        alone.save(&trained_pricing(), TOK).unwrap();
        assert_eq!(mode(alone.target()), 0o600, "a prices cache");
        // A file the operator made keeps the mode it was given.
        std::fs::set_permissions(file.target(), std::fs::Permissions::from_mode(0o640)).unwrap();
        file.save(&history(&[&[4]]), TOK).unwrap();
        assert_eq!(mode(file.target()), 0o640);
    }

    #[test]
    fn a_save_with_prices_waits_for_the_same_lock() {
        let dir = tempfile::tempdir().unwrap();
        let file = HistoryFile::open(dir.path().join("h.bin")).unwrap().with_lock_timeout(Duration::ZERO);
        let held = file.take_lock().unwrap();
        let err = file.save_with_pricing(&history(&[&[1]]), &trained_pricing(), TOK).unwrap_err();
        assert!(err.to_string().contains("h.bin.lock"), "{err}");
        assert!(!file.target().exists() && !file.prices_path().exists());
        drop(held);
        file.save_with_pricing(&history(&[&[1]]), &trained_pricing(), TOK).unwrap();
    }
}
