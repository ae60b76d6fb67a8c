//! Finished lanes' prefixes kept in host memory instead of in the context's cells.
//!
//! A cached prefix left in the cells costs every later forward: the rows of the live lanes scan
//! its cells (masked, but scanned), and llama.cpp's one-row attention splits the occupied cells
//! into one contiguous slice per thread, so a prefix below a live lane leaves one thread little
//! to do while the other scans the live context alone. Measured on the 1.5B target (2 Zen 5
//! cores, multi-turn sessions one at a time): plain decoding ran 0.88× `llama-server`'s rate on
//! the turns right after another session's prefix stayed in the cells, 1.0× once it was gone.
//! So a compaction moves the prefixes it no longer keeps in the cells here, as sequence states
//! (`llama_state_seq_get`: a few tens of KB a token), and a lane that reuses one restores it
//! into its own cells (a copy, bit for bit what was saved, so exactness holds). What is kept
//! here is bounded by bytes; the oldest goes first.

use std::collections::VecDeque;

use llama_cpp_2::context::session::SeqState;
use treespec_core::TokenId;

/// Host memory the saved prefixes may hold by default (`treespec serve --cache-ram`; llama-server
/// keeps up to 8 GiB of prompt states by default, this a quarter of that; 0 keeps none).
pub const SAVED_PREFIX_BYTES: usize = 2 << 30;

/// One saved prefix.
#[derive(Debug)]
pub(super) struct SavedPrefix {
    pub tokens: Vec<TokenId>,
    pub scope: u64,
    pub state: SeqState,
}

/// The saved prefixes, oldest first.
#[derive(Debug)]
pub(super) struct SavedPrefixes {
    entries: VecDeque<SavedPrefix>,
    bytes: usize,
    budget: usize,
}

impl SavedPrefixes {
    pub(super) fn new(budget: usize) -> Self {
        keep_large_blocks_mapped();
        Self { entries: VecDeque::new(), bytes: 0, budget }
    }

    /// Keep `prefix` (the newest); the oldest leave while the bytes exceed the budget. Returns
    /// how many left.
    pub(super) fn push(&mut self, prefix: SavedPrefix) -> usize {
        self.bytes += prefix.state.byte_len();
        self.entries.push_back(prefix);
        self.set_budget(self.budget)
    }

    /// The saved prefix of `scope` sharing the longest start with `prompt`: its index and the
    /// tokens shared.
    pub(super) fn best(&self, prompt: &[TokenId], scope: u64) -> Option<(usize, usize)> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, p)| p.scope == scope)
            .map(|(i, p)| (i, super::common_prefix(&p.tokens, prompt)))
            .max_by_key(|&(_, n)| n)
    }

    /// Take entry `i` out (to restore it; a lane that takes it over does not put it back: its
    /// own tokens carry it on).
    pub(super) fn take(&mut self, i: usize) -> Option<SavedPrefix> {
        let p = self.entries.remove(i)?;
        self.bytes -= p.state.byte_len();
        Some(p)
    }

    /// A new bound (the oldest leave now if they exceed it); returns how many left.
    pub(super) fn set_budget(&mut self, budget: usize) -> usize {
        self.budget = budget;
        let mut evicted = 0;
        while self.bytes > self.budget {
            let Some(old) = self.entries.pop_front() else { break };
            self.bytes -= old.state.byte_len();
            evicted += 1;
        }
        evicted
    }

    /// Bytes held.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Make glibc map every block of 128 KiB or more on its own and unmap it when freed. Sequence
/// states (megabytes each, saved and freed as prefixes come and go, beside the ones kept) are
/// otherwise served from the heap once glibc's adaptive threshold has risen past their size,
/// and the heap fragments: a soak of 323 requests in 20 s with 16 MiB of saved prefixes grew
/// the server's resident memory by 50% (by 11% with this setting, 6% with no prefixes saved).
fn keep_large_blocks_mapped() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: mallopt only changes allocator parameters; a fixed threshold also turns off
        // the adaptive one. Called once, before any state is saved.
        ONCE.call_once(|| unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        });
    }
}
