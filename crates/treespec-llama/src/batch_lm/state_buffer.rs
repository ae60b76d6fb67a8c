//! [`StateBuffer`]: the host buffer a compaction passes the kept sequences' cells through.
//!
//! A compaction saves every live lane (and every cached prefix it keeps), clears the cells and
//! restores them contiguously. Through a fresh buffer per sequence (`state_seq_get`) that cost a
//! first touch of every page each time: 270 ms to move one 3,600-token lane of the 1.5B (100 MB)
//! on a Zen 5 VM, where restoring it from the same bytes took under 10 ms. One buffer, kept
//! between compactions, is touched once.

use std::ops::Range;

use llama_cpp_2::context::session::LlamaStateSeqFlags;
use llama_cpp_2::context::LlamaContext;

use treespec_engine::Result;

use crate::backend;
use crate::lm::backend_err;

/// A buffer larger than this is given back after the compaction that needed it (a long context
/// of a large model would otherwise keep a second copy of its cells in host memory for good).
const KEEP_BYTES: usize = 512 << 20;

/// Reused bytes for the sequences one compaction rewrites.
#[derive(Debug, Default)]
pub(super) struct StateBuffer {
    bytes: Vec<u8>,
}

/// The saved sequences: each sequence id and where its state lies in the buffer.
pub(super) type Saved = Vec<(i32, Range<usize>)>;

impl StateBuffer {
    /// Copy the cells of `seqs` into the buffer, one after the other.
    pub(super) fn save(&mut self, ctx: &LlamaContext<'_>, seqs: &[i32]) -> Result<Saved> {
        let flags = LlamaStateSeqFlags::empty();
        let mut saved = Vec::with_capacity(seqs.len());
        let mut end = 0;
        for &seq in seqs {
            let n = ctx.state_seq_get_size_ext(seq, flags);
            saved.push((seq, end..end + n));
            end += n;
        }
        if self.bytes.len() < end {
            self.bytes.resize(end, 0);
        }
        for (seq, at) in &saved {
            backend::clear_captured();
            // SAFETY: the buffer holds `at.len()` bytes from `at.start`: the size llama.cpp just
            // reported for this sequence's state, which is what it writes.
            let wrote =
                unsafe { ctx.state_seq_get_data_ext(self.bytes[at.clone()].as_mut_ptr(), *seq, flags) };
            if wrote != at.len() {
                return Err(backend_err(
                    "cannot save a sequence for compaction",
                    format!("wrote {wrote} of {} bytes", at.len()),
                ));
            }
        }
        Ok(saved)
    }

    /// Put the `saved` sequences back into the (cleared) cells, each into the lowest free
    /// ones, in order; then give a large buffer back.
    pub(super) fn restore(&mut self, ctx: &mut LlamaContext<'_>, saved: &Saved) -> Result<()> {
        let flags = LlamaStateSeqFlags::empty();
        for (seq, at) in saved {
            backend::clear_captured();
            // SAFETY: these bytes are the state llama.cpp wrote for this sequence of this
            // context in `save`, unchanged since.
            if !unsafe { ctx.state_seq_set_data_ext(&self.bytes[at.clone()], *seq, flags) } {
                return Err(backend_err(
                    "cannot restore a sequence after compaction",
                    "llama.cpp refused the state",
                ));
            }
        }
        if self.bytes.len() > KEEP_BYTES {
            self.bytes = Vec::new();
        }
        Ok(())
    }
}
