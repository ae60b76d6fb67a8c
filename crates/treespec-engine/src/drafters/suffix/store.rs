//! One suffix state and the files that keep it between processes, loaded and saved the same way
//! by every front end (a `treespec generate` run, each tenant of a server): the history file
//! ([`HistoryFile`]) with the learned prices beside it, and — for a run that has no history file,
//! or whose history has no prices yet — the learned-prices cache ([`PricesFile`], one file per
//! tokenizer).
//!
//! **Where prices come from**: beside the history when it has them, else the cache, else the
//! prior shipped in the binary ([`SuffixPricing::new`]). Prices beside a history are the
//! history's, so a broken one is an error, as a broken history is; a cache that cannot be read
//! is a warning (the run starts from the prior).
//!
//! **When they are saved** ([`SuffixStore::save_changed`]): the history, with its prices, when
//! either changed since the last save or load, merged with what another process saved to the
//! file since ([`HistoryFile::save_merged`]); the cache when the prices learned anything.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use treespec_core::ngram::TokenizerId;
use treespec_core::suffix::{GlobalHistory, SuffixPricing};

use super::history_file::{HistoryFile, MergeState, PricesFile};

use super::SuffixShared;
use crate::error::Result;

/// Where a suffix state is kept.
#[derive(Debug, Clone, Default)]
pub struct StorePlaces {
    /// The history file (with its prices beside it), if the state is kept in one.
    pub history: Option<HistoryFile>,
    /// The learned-prices cache, if there is one.
    pub cache: Option<PricesFile>,
    /// Whether learned prices are read and written at all (off: the prior, nothing kept).
    pub prices: bool,
}

/// What one save wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSave {
    /// The history file, when it was written.
    pub history: Option<PathBuf>,
    /// Tokens in the history written.
    pub tokens: usize,
    /// Trials the learned prices have recorded.
    pub trials: u64,
    /// Documents another process had saved to the history file, merged into this history first.
    pub merged: usize,
    /// Whether the prices beside the history were left holding another process's prices (of
    /// more trials).
    pub prices_kept: bool,
    /// Why the history file could not be merged (damaged, another tokenizer's), when it was
    /// replaced.
    pub replaced: Option<String>,
    /// The prices files written: beside the history, then the cache.
    pub prices: Vec<PathBuf>,
    /// What could not be kept and was only warned about (the cache).
    pub warnings: Vec<String>,
}

/// One suffix state ([`SuffixShared`]) and where it is kept (see the module docs).
#[derive(Debug)]
pub struct SuffixStore {
    shared: Arc<SuffixShared>,
    /// The tokenizer the files are tagged with (None: kept nowhere, nothing to tag).
    tokenizer: Option<TokenizerId>,
    places: StorePlaces,
    /// What the history file held at the last save (or load), to merge another process's saves.
    merge: MergeState,
    /// The history's additions when it was last saved (or loaded).
    saved: u64,
    /// The prices' trials when they were last saved (or loaded).
    saved_trials: u64,
    /// Where the prices were loaded from, with the trials they had recorded.
    loaded: Option<(PathBuf, u64)>,
    /// What went wrong at load and was only warned about.
    warnings: Vec<String>,
}

impl SuffixStore {
    /// A state kept nowhere (it lives as long as the process), from the prior prices.
    pub fn in_memory(cap_tokens: usize) -> Result<Self> {
        let shared = SuffixShared::new(GlobalHistory::new(cap_tokens)?);
        Ok(Self {
            shared,
            tokenizer: None,
            places: StorePlaces::default(),
            merge: MergeState::default(),
            saved: 0,
            saved_trials: 0,
            loaded: None,
            warnings: Vec::new(),
        })
    }

    /// Load the state kept at `places` (a history file not written yet: an empty history).
    pub fn open(places: StorePlaces, tokenizer: TokenizerId, cap_tokens: usize) -> Result<Self> {
        let (history, merge) = match &places.history {
            Some(file) => file.load_for_merging(tokenizer, cap_tokens)?,
            None => (GlobalHistory::new(cap_tokens)?, MergeState::default()),
        };
        let mut warnings = Vec::new();
        let mut loaded = None;
        let mut pricing = None;
        if places.prices {
            if let Some(file) = &places.history {
                pricing = file.load_pricing(tokenizer)?;
                loaded = pricing.as_ref().map(|p| (file.prices_path(), p.total_trials()));
            }
            if let (None, Some(cache)) = (&pricing, &places.cache) {
                match cache.load(tokenizer) {
                    Ok(p) => {
                        loaded = p.as_ref().map(|p| (cache.path().to_path_buf(), p.total_trials()));
                        pricing = p;
                    }
                    Err(e) => warnings.push(format!("ignoring {e}; starting from the prior")),
                }
            }
        }
        let pricing = pricing.unwrap_or_else(SuffixPricing::new);
        let (saved, saved_trials) = (additions(&history), pricing.total_trials());
        let shared = SuffixShared::with_pricing(history, pricing);
        Ok(Self { shared, tokenizer: Some(tokenizer), places, merge, saved, saved_trials, loaded, warnings })
    }

    /// The learned-prices cache of `tokenizer` in `dir`: `<dir>/<fingerprint>-<vocabulary>.json`,
    /// the folder made if missing.
    pub fn cache_file(dir: &Path, tokenizer: TokenizerId) -> Result<PricesFile> {
        std::fs::create_dir_all(dir).map_err(|e| {
            crate::error::EngineError::Backend(format!(
                "creating the learned-prices cache {}: {e}",
                dir.display()
            ))
        })?;
        let name = format!("{:016x}-{}.json", tokenizer.fingerprint, tokenizer.vocab);
        Ok(PricesFile::open(dir.join(name))?)
    }

    /// The state every drafter of the method shares.
    pub fn shared(&self) -> &Arc<SuffixShared> {
        &self.shared
    }

    /// The history file, if the state is kept in one.
    pub fn history_file(&self) -> Option<&HistoryFile> {
        self.places.history.as_ref()
    }

    /// Where the prices were loaded from, with the trials they had recorded (None: the prior).
    pub fn loaded(&self) -> Option<&(PathBuf, u64)> {
        self.loaded.as_ref()
    }

    /// What went wrong at load and was only warned about (taken once).
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// Save what changed since the last save or load (see the module docs); None when nothing
    /// did or the state is kept nowhere.
    pub fn save_changed(&mut self) -> Result<Option<StoreSave>> {
        let Some(tokenizer) = self.tokenizer else { return Ok(None) };
        // A copy of the prices, taken before the history's read lock (never both held).
        let pricing = self.shared.pricing_snapshot();
        let trials = pricing.total_trials();
        let history_changed = additions(&self.shared.history()) != self.saved;
        let prices_changed = self.places.prices && trials != self.saved_trials;
        if !history_changed && !prices_changed {
            return Ok(None);
        }
        let mut out = StoreSave {
            history: None,
            tokens: 0,
            trials,
            merged: 0,
            prices_kept: false,
            replaced: None,
            prices: Vec::new(),
            warnings: Vec::new(),
        };
        if let Some(file) = &self.places.history {
            let shared = &self.shared;
            let with_prices = self.places.prices.then_some(&pricing);
            let done = file.save_merged(
                &mut self.merge,
                tokenizer,
                with_prices,
                || shared.history(),
                |key, text| shared.add(key, text),
            )?;
            // What was written, merged documents included: they are not a change of this process's.
            self.saved = done.docs as u64 + done.evictions;
            out.history = Some(file.path().to_path_buf());
            out.tokens = done.tokens;
            out.merged = done.merged;
            out.prices_kept = done.prices_kept;
            out.replaced = done.replaced;
            if with_prices.is_some() {
                out.prices.push(file.prices_path());
            }
        } else {
            self.saved = additions(&self.shared.history());
        }
        if let (Some(cache), true) = (&self.places.cache, prices_changed) {
            match cache.save(&pricing, tokenizer) {
                Ok(()) => out.prices.push(cache.path().to_path_buf()),
                Err(e) => out.warnings.push(format!("{e}; what this run learned is not kept")),
            }
        }
        self.saved_trials = trials;
        Ok((out.history.is_some() || !out.prices.is_empty() || !out.warnings.is_empty()).then_some(out))
    }
}

/// Documents ever added to `h` (those held and those evicted): changes whenever a request adds.
fn additions(h: &GlobalHistory) -> u64 {
    h.docs() as u64 + h.evictions()
}

#[cfg(test)]
mod tests {
    use super::*;
    use treespec_core::suffix::NodeFeatures;

    const TOK: TokenizerId = TokenizerId { fingerprint: 0x5eed, vocab: 26 };

    /// `trials` trials of one node kind, recorded in the shared prices.
    fn learn(shared: &SuffixShared, trials: usize) {
        let f = NodeFeatures { match_len: 8, depth: 2, share: 1.0, support: 1, global: false };
        (0..trials).for_each(|i| shared.pricing().record(&f, i % 2 == 0));
    }

    fn places(dir: &Path, history: bool, prices: bool) -> StorePlaces {
        StorePlaces {
            history: history.then(|| HistoryFile::open(dir.join("h.bin")).unwrap()),
            cache: Some(SuffixStore::cache_file(&dir.join("prices"), TOK).unwrap()),
            prices,
        }
    }

    /// Prices come from beside the history when it has them, else from the cache; the cache
    /// keeps what a run learned; nothing is written when nothing changed.
    #[test]
    fn prices_load_from_the_history_then_the_cache_and_save_only_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = SuffixStore::open(places(dir.path(), false, true), TOK, 1 << 12).unwrap();
        assert!(first.loaded().is_none(), "a fresh cache: the prior");
        assert_eq!(first.save_changed().unwrap(), None, "nothing learned, nothing written");
        learn(first.shared(), 40);
        let saved = first.save_changed().unwrap().expect("the cache is written");
        assert_eq!(saved.history, None);
        assert_eq!(saved.prices.len(), 1);
        assert_eq!(first.save_changed().unwrap(), None, "saved once");

        // With a history file that has no prices yet: the cache's; saved beside it after.
        let mut second = SuffixStore::open(places(dir.path(), true, true), TOK, 1 << 12).unwrap();
        assert_eq!(second.loaded().map(|(_, n)| *n), Some(40));
        second.shared().add(7, &[1, 2, 3, 4, 5]);
        let saved = second.save_changed().unwrap().expect("the history changed");
        assert_eq!(saved.history.as_deref(), Some(dir.path().join("h.bin").as_path()));
        assert_eq!(saved.prices, vec![HistoryFile::open(dir.path().join("h.bin")).unwrap().prices_path()]);

        // Now the history's prices come first, with its document.
        learn(second.shared(), 5);
        second.save_changed().unwrap();
        let third = SuffixStore::open(places(dir.path(), true, true), TOK, 1 << 12).unwrap();
        let (from, trials) = third.loaded().cloned().unwrap();
        assert!(from.ends_with("h.bin.prices.json"), "{from:?}");
        assert_eq!(trials, 45);
        assert_eq!(third.shared().history().docs(), 1);

        // Without prices: the prior, and the prices files are left alone.
        let mut off = SuffixStore::open(places(dir.path(), true, false), TOK, 1 << 12).unwrap();
        assert!(off.loaded().is_none());
        learn(off.shared(), 3);
        off.shared().add(8, &[9, 9, 9]);
        let saved = off.save_changed().unwrap().unwrap();
        assert!(saved.prices.is_empty(), "{saved:?}");
        let again = SuffixStore::open(places(dir.path(), true, true), TOK, 1 << 12).unwrap();
        assert_eq!(again.loaded().map(|(_, n)| *n), Some(45));
    }

    /// A cache that cannot be read is a warning (the prior); prices beside a history that cannot
    /// be read are an error, as a broken history is.
    #[test]
    fn a_broken_cache_warns_and_broken_history_prices_fail() {
        let dir = tempfile::tempdir().unwrap();
        let cache = SuffixStore::cache_file(&dir.path().join("prices"), TOK).unwrap();
        std::fs::write(cache.path(), b"{ not prices").unwrap();
        let mut store = SuffixStore::open(places(dir.path(), false, true), TOK, 1 << 12).unwrap();
        assert!(store.loaded().is_none());
        assert_eq!(store.take_warnings().len(), 1);
        let history = HistoryFile::open(dir.path().join("h.bin")).unwrap();
        std::fs::write(history.prices_path(), b"{ not prices").unwrap();
        assert!(SuffixStore::open(places(dir.path(), true, true), TOK, 1 << 12).is_err());
    }
}
