//! Filler rows that pad a forward up to a fixed shape (see `treespec_core::cost::shapes`), so
//! that llama.cpp reuses the graph of the forward before, and a device replays it.
//!
//! llama.cpp reuses a graph when the new batch has the same token count, output count and number
//! of distinct sequence ids as the last one, and the same KV span (`n_kv`, padded to 256 cells).
//! A tree uses one sequence id per root-to-leaf path, so its count of ids changes with its shape.
//! The filler rows carry every id the real rows leave unused plus a spare one, which fixes the
//! count; they ask for logits like the tree rows, which fixes the outputs; and they sit at the
//! context's last position, where no real row can be, so that:
//! - no real row attends to them (a query sees only cells of its own first id, and no real row
//!   carries a filler's ids), so every real row's logits are what they are unpadded;
//! - llama.cpp's batch checks pass (the filler's ids hold no cells, so they are "coupled" with
//!   equal, empty ranges, and their one position is trivially consecutive);
//! - one removal by position takes them all out after the decode, leaving the cells as an
//!   unpadded forward would: the filler cells lie above every real row's, so freeing them frees
//!   the top of the cache, and the next rows fill from there in order.

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::timing::LlamaTimings;

use treespec_core::cost::shapes::ShapeBuckets;
use treespec_core::TokenId;
use treespec_engine::{EngineError, Result};

/// The buckets a context pads to, and the filler rows of its current forward.
#[derive(Debug, Default)]
pub(crate) struct Padding {
    buckets: Option<ShapeBuckets>,
    /// Sequence ids of this forward's filler rows (a spare id and every unused path id).
    seqs: Vec<i32>,
    /// Filler rows in this forward (0: not padded).
    rows: usize,
    token: TokenId,
    pos: usize,
}

impl Padding {
    /// Pad to `buckets` from the next forward on (None: stop).
    pub(crate) fn set(&mut self, buckets: Option<&ShapeBuckets>) {
        self.buckets = buckets.cloned();
    }

    /// Plan the filler rows of a forward of `real` rows into a context of `n_ctx` cells that
    /// holds `used` cells before it: none when not padding, for one row, beyond the largest
    /// bucket, or when the filler would not fit. `spare` is an id no row or cell uses during the
    /// forward, `unused` the path ids no real row of it uses, `token` any token of the vocabulary.
    /// Returns the forward's total rows.
    pub(crate) fn plan(
        &mut self,
        real: usize,
        used: usize,
        n_ctx: usize,
        spare: i32,
        unused: &[i32],
        token: TokenId,
    ) -> usize {
        self.rows = 0;
        let Some(b) = &self.buckets else { return real };
        let shape = b.shape(real);
        // Real rows sit below `used + real`; the filler's position must be above all of them.
        if shape <= real || used + shape > n_ctx {
            return real;
        }
        self.rows = shape - real;
        self.seqs.clear();
        self.seqs.push(spare);
        self.seqs.extend_from_slice(unused);
        self.token = token;
        self.pos = n_ctx - 1;
        shape
    }

    /// The planned filler rows as batch rows: (token, position, sequence ids, logits wanted).
    pub(crate) fn rows(&self) -> impl Iterator<Item = (TokenId, usize, &[i32], bool)> + '_ {
        std::iter::repeat_n((self.token, self.pos, self.seqs.as_slice(), true), self.rows)
    }

    /// Filler rows in the planned forward.
    #[cfg(test)]
    fn filler(&self) -> usize {
        self.rows
    }

    /// Take the planned filler rows' cells back out after the decode (or after it failed).
    pub(crate) fn remove(&mut self, ctx: &mut LlamaContext<'_>) -> Result<()> {
        if std::mem::take(&mut self.rows) == 0 {
            return Ok(());
        }
        match ctx.clear_kv_cache_seq(None, Some(self.pos as u32), None) {
            Ok(true) => Ok(()),
            Ok(false) => Err(EngineError::Backend("llama.cpp refused to remove the filler rows".into())),
            Err(e) => Err(EngineError::Backend(format!("cannot remove the filler rows: {e}"))),
        }
    }
}

/// llama.cpp's count of decodes that reused the graph of the one before (`n_reused` of
/// `llama_perf_context`), since the context was made.
pub(crate) fn graph_reuses(ctx: &mut LlamaContext<'_>) -> u64 {
    reuses_of(ctx.timings())
}

/// `n_reused` out of llama-cpp-2's timings, which hold it but have no getter for it.
fn reuses_of(timings: LlamaTimings) -> u64 {
    // SAFETY: `LlamaTimings` is a struct of exactly one field, the C struct (`transmute` checks
    // the sizes at compile time; the test below checks that the field reads back).
    let raw: llama_cpp_sys_2::llama_perf_context_data = unsafe { std::mem::transmute(timings) };
    raw.n_reused.max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reuse_count_reads_back_from_llama_cpp_2s_timings() {
        assert_eq!(reuses_of(LlamaTimings::new(1.0, 2.0, 3.0, 4.0, 5, 6, 7)), 7);
        assert_eq!(reuses_of(LlamaTimings::new(0.0, 0.0, 0.0, 0.0, 0, 0, -1)), 0);
    }

    #[test]
    fn filler_is_planned_only_where_a_bucket_has_room_above_the_real_rows() {
        let mut p = Padding::default();
        assert_eq!(p.plan(5, 100, 4096, 9, &[3, 4], 1), 5, "not padding");
        p.set(Some(&ShapeBuckets::new(&[8, 16]).unwrap()));
        assert_eq!(p.plan(5, 100, 4096, 9, &[3, 4], 1), 8);
        assert_eq!(p.filler(), 3);
        let rows: Vec<_> = p.rows().collect();
        assert_eq!(rows.len(), 3);
        assert!(rows.iter().all(|r| r.1 == 4095 && r.2 == [9, 3, 4] && r.3));
        assert_eq!(p.plan(1, 100, 4096, 9, &[], 1), 1, "one row keeps its own shape");
        assert_eq!(p.filler(), 0);
        assert_eq!(p.plan(16, 100, 4096, 9, &[], 1), 16, "beyond the buckets");
        assert_eq!(p.plan(5, 4090, 4096, 9, &[], 1), 5, "no room for the filler");
        assert_eq!(p.filler(), 0);
    }
}
