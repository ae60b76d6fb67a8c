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
//!   only while saving, so two servers on one file both keep running and the file always holds
//!   the history of the last one that saved. It is taken on a fresh descriptor for every save, so
//!   it also orders two threads of one process. The lock file is left in place after a save
//!   (removing it would let a third saver lock a new file while the second still holds the old).
//!
//! The lock file sits beside the resolved target, so two symlinks to one file share it. The
//! symlink is resolved once, at open.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::history::GlobalHistory;
use crate::ngram::TokenizerId;
use crate::{Error, Result};

/// How long a save waits for another process's save by default.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// Symlinks followed before giving up (as Linux's `ELOOP` limit).
const MAX_SYMLINKS: usize = 40;

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
}

impl HistoryFile {
    /// Resolve `path` (following symlinks) and check that a history can be saved there: the
    /// directory exists and is writable, the target is a regular file or does not exist yet, and
    /// the lock file can be opened (it is created if missing; the history file itself is not).
    /// Every problem is an error naming the path and the reason. Saving blocks (file I/O, and up
    /// to [`Self::lock_timeout`] for the lock): async callers should save on a blocking thread.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let bad = |why: String| Error::Invalid(format!("suffix history {}: {why}", path.display()));
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
            lock: dir.join(format!("{name}.lock")),
            dir,
            name,
            path: path.clone(),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        };
        // Writable: a temporary file of the kind a save makes can be created there (and is
        // removed again). Checked by trying, as permissions alone do not tell (root, ACLs,
        // read-only mounts).
        file.temp_file()
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

    /// The saved history capped at `cap_tokens` (see [`GlobalHistory::from_bytes`]), or an empty
    /// one when the file does not exist yet. A malformed file is an error naming the path.
    pub fn load(&self, tokenizer: TokenizerId, cap_tokens: usize) -> Result<GlobalHistory> {
        let bytes = match std::fs::read(&self.target) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == ErrorKind::NotFound => return GlobalHistory::new(cap_tokens),
            Err(e) => return Err(Error::Invalid(format!("reading {}: {e}", self.describe()))),
        };
        GlobalHistory::from_bytes(&bytes, tokenizer, cap_tokens)
            .map_err(|e| Error::Invalid(format!("suffix history {}: {e}", self.describe())))
    }

    /// Save `history` (tagged with `tokenizer`) atomically under the lock (see the module docs).
    pub fn save(&self, history: &GlobalHistory, tokenizer: TokenizerId) -> Result<()> {
        self.save_bytes(&history.to_bytes(tokenizer), &mut |_| Ok(()))
    }

    /// Write `bytes` over the target; `before_rename` runs on the synced temporary file just
    /// before it is renamed (tests stop a save there).
    fn save_bytes(
        &self,
        bytes: &[u8],
        before_rename: &mut dyn FnMut(&Path) -> std::io::Result<()>,
    ) -> Result<()> {
        let io = |what: &str, e: std::io::Error| {
            Error::Invalid(format!("saving the suffix history {}: {what}: {e}", self.describe()))
        };
        let _lock = self.take_lock()?;
        let mut tmp = self.temp_file().map_err(|e| io("creating a temporary file", e))?;
        #[cfg(unix)]
        if let Ok(meta) = std::fs::metadata(&self.target) {
            // Keep the mode of the file being replaced.
            tmp.as_file().set_permissions(meta.permissions()).map_err(|e| io("copying permissions", e))?;
        }
        tmp.write_all(bytes).map_err(|e| io("writing", e))?;
        tmp.as_file().sync_all().map_err(|e| io("syncing", e))?;
        before_rename(tmp.path()).map_err(|e| io("before renaming", e))?;
        tmp.persist(&self.target).map_err(|e| io("renaming the temporary file over it", e.error))?;
        sync_dir(&self.dir).map_err(|e| io("syncing its directory", e))
    }

    /// A new temporary file beside the target, removed when dropped unless persisted. Created
    /// with the mode a plain `File::create` would give (0666 less the umask).
    fn temp_file(&self) -> std::io::Result<tempfile::NamedTempFile> {
        let mut b = tempfile::Builder::new();
        let prefix = format!(".{}.", self.name);
        b.prefix(&prefix).suffix(".tmp");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            b.permissions(std::fs::Permissions::from_mode(0o666));
        }
        b.tempfile_in(&self.dir)
    }

    fn open_lock(&self) -> std::io::Result<File> {
        OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&self.lock)
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
        let stopped = file.save_bytes(&new.to_bytes(TOK), &mut |tmp| {
            // The new bytes are complete and synced in a file of their own, the target untouched.
            seen = Some((std::fs::read(tmp)?, std::fs::read(file.target())?));
            Err(std::io::Error::other("simulated crash"))
        });
        assert!(stopped.unwrap_err().to_string().contains("simulated crash"));
        let (tmp_bytes, target_bytes) = seen.expect("the hook ran");
        assert_eq!(tmp_bytes, new.to_bytes(TOK));
        assert_eq!(target_bytes, old.to_bytes(TOK));
        assert_eq!(file.load(TOK, 1000).unwrap().index().tokens(), old.index().tokens());
        // The failed save removed its temporary file.
        assert_eq!(others(dir.path(), &["h.bin", "h.bin.lock"]), Vec::<String>::new());
        file.save(&new, TOK).unwrap();
        assert_eq!(file.load(TOK, 1000).unwrap().index().tokens(), new.index().tokens());
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
}
