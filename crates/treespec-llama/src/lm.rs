//! [`LlamaLm`]: a llama.cpp context over a loaded model, implementing [`CausalLm`].
//!
//! One unified KV cache holds the committed prefix and the pending tree; `kv.rs` decides which
//! sequence ids each node carries, this file applies that to llama.cpp. Every `forward` is exactly
//! one `llama_decode` call (llama.cpp may still split it into several physical batches of
//! `n_ubatch` tokens internally).
//!
//! Cell order matters for exactness. Attention sums over KV cells in cell-index order (flash
//! attention on CPU even accumulates in fp16), and the quantized matmuls that follow round their
//! inputs to 8 bits, so a last-bit change from summing in another order can flip a rounding step;
//! measured: up to 0.8 logit difference on SmolLM2, enough to change a greedy choice. Plain
//! decoding keeps cells in position order; so do we, by keeping this invariant: committed tokens
//! fill cells `0..committed` in position order and pending nodes the cells right above, in the
//! order they were fed (llama.cpp fills free cells upward from the lowest freed one). Dropping all
//! pending cells frees exactly the top region. A commit whose path is not already the first pending
//! nodes would leave holes (dropped siblings) below later tokens, so it *compacts*: the path's
//! cells are serialised (`state_seq_get`, a few KB per token), every pending cell is freed, and the
//! path is restored into the cells right above the prefix.

use std::num::NonZeroU32;
use std::sync::atomic::Ordering;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::session::LlamaStateSeqFlags;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;

use treespec_core::cost::shapes::ShapeBuckets;
use treespec_core::TokenId;
use treespec_engine::{CausalLm, EngineError, Logits, Result, TreeBatch};

use crate::backend;
use crate::kv::{PendingTree, Plan, Undo, BASE_SEQ};
use crate::load::{LlamaModel, DECODED};
use crate::memory::{check_fits, mem_available};
use crate::padding::{graph_reuses, Padding};

/// A decoding context over a [`LlamaModel`]: committed prefix plus pending token tree.
pub struct LlamaLm<'m> {
    model: &'m LlamaModel,
    ctx: LlamaContext<'m>,
    batch: BatchBuf,
    /// llama.cpp sequence ids: the committed prefix, the paths, and a scratch id for commits.
    n_seq: usize,
    n_ctx: usize,
    n_vocab: usize,
    committed: usize,
    tree: PendingTree,
    /// Told `(done, total)` prompt tokens as a prefill goes (`treespec generate`'s progress bar).
    prefill_progress: Option<PrefillProgress>,
    /// The shapes forwards are padded to, and the current forward's filler rows.
    padding: Padding,
}

/// What [`LlamaLm::set_prefill_progress`] calls.
pub type PrefillProgress = Box<dyn FnMut(usize, usize) + Send>;

impl std::fmt::Debug for LlamaLm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaLm")
            .field("model", &self.model.path())
            .field("n_ctx", &self.n_ctx)
            .field("committed", &self.committed)
            .field("pending", &self.tree.len())
            .finish_non_exhaustive()
    }
}

const INITIAL_BATCH: usize = 512;

// A context can move to another thread (one model, one worker per context).
const _: fn() = || {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<LlamaLm<'static>>();
    sync::<LlamaModel>();
};

pub(crate) fn backend_err(what: &str, e: impl std::fmt::Display) -> EngineError {
    let log = backend::captured();
    if log.is_empty() {
        EngineError::Backend(format!("{what}: {e}"))
    } else {
        EngineError::Backend(format!("{what}: {e} (llama.cpp: {log})"))
    }
}

impl LlamaModel {
    /// A fresh context (empty KV cache) sized by the model's [`LoadOptions`](crate::LoadOptions).
    /// Errors for architectures whose state is not a plain KV cache (recurrent, hybrid,
    /// encoder-decoder): sequence ids cannot express a token tree for them.
    pub fn new_lm(&self) -> Result<LlamaLm<'_>> {
        let o = self.options();
        let n_seq = o.n_seq_max + 2;
        let ctx = self.new_context(o.ctx_size, n_seq)?;
        // The size asked for (the context may hold more cells, see `new_context`).
        let n_ctx = (ctx.n_ctx() as usize).min(o.ctx_size);
        let n_vocab = self.vocab_size();
        Ok(LlamaLm {
            model: self,
            ctx,
            batch: BatchBuf::new(n_seq),
            n_seq,
            n_ctx,
            n_vocab,
            committed: 0,
            tree: PendingTree::new(o.n_seq_max),
            prefill_progress: None,
            padding: Padding::default(),
        })
    }

    /// A llama.cpp context of `ctx_size` cells shared by `n_seq` sequence ids (one unified KV
    /// cache), with the model's threads, batch and exact-mode settings. Errors for architectures
    /// whose state is not a plain KV cache (recurrent, hybrid, encoder-decoder): sequence ids
    /// cannot express a token tree for them.
    pub(crate) fn new_context(&self, ctx_size: usize, n_seq: usize) -> Result<LlamaContext<'_>> {
        // SAFETY: live model pointer, plain getter.
        let has_encoder = unsafe { llama_cpp_sys_2::llama_model_has_encoder(self.raw_ptr()) };
        if self.inner.is_recurrent() || self.inner.is_hybrid() || has_encoder {
            return Err(EngineError::Backend(format!(
                "{}: architecture '{}' keeps recurrent or encoder state; tree decoding needs a plain KV cache",
                self.path().display(),
                self.architecture().unwrap_or_default()
            )));
        }
        let o = self.options();
        // Every context allocates its own cache: check each against what is left now.
        // A quantized cache is sized as Q8_0 (an upper bound for every quantized type).
        let cache = o.kv_cache_in_use();
        check_fits(self.path(), &self.gguf_facts().hparams, ctx_size, cache.quantized(), 0, mem_available())?;
        // llama.cpp reserves an output row per sequence id and caps output rows at n_batch, which
        // it caps at n_ctx: a context smaller than its sequence count aborts. Such a context gets
        // n_seq cells (a few KB each); callers keep to the size asked for.
        let ctx_size = u32::try_from(ctx_size.max(n_seq))
            .map_err(|_| EngineError::InvalidRequest("ctx_size too large".into()))?;
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(ctx_size))
            // n_batch bounds the tokens of one llama_decode: make it the whole context so any
            // forward that fits the context is one call.
            .with_n_batch(ctx_size)
            .with_n_ubatch(o.n_ubatch.min(ctx_size as usize) as u32)
            .with_n_seq_max(n_seq as u32)
            .with_kv_unified(true)
            // Full-size sliding-window caches, so truncate/commit can always go back (gemma3).
            .with_swa_full(true)
            .with_n_threads(o.threads as i32)
            .with_n_threads_batch(o.threads_batch.unwrap_or(o.threads) as i32)
            .with_flash_attention_policy(o.flash_attn.param());
        // Exact mode: ggml's flash attention over an F16/F32 KV cache takes a split-KV path for a
        // single-row batch once the cache holds ≥ 512 cells (each thread sums a slice of the KV,
        // then the partial softmaxes are merged), so a token decoded alone gets different logits
        // from the same token inside a tree — measured: plain decoding and chain decoding of
        // SmolLM2 part ways after 23 tokens of a long prompt with 2 threads. A Q8_0 cache goes
        // through the one generic kernel for every batch shape, which makes attention
        // batch-invariant (plain decoding in exact mode uses the same cache type, so exact mode
        // is compared with itself).
        let params = params.with_type_k(cache.k.param()).with_type_v(cache.v.param());
        let params = o.rope.apply(params);
        let backend = backend::backend()?;
        backend::clear_captured();
        let ctx = {
            let _guard = backend::CONTEXT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
            self.inner
                .new_context(backend, params)
                .map_err(|e| backend_err("cannot create llama.cpp context", e))?
        };
        // Every model's repacked weights and this context's KV cache are in anonymous memory now:
        // the one place they are moved onto huge pages (nothing decodes before a context exists).
        crate::huge_pages::back_large_mappings();
        Ok(ctx)
    }
}

impl<'m> LlamaLm<'m> {
    /// Report each prefill's progress to `progress` as `(done, total)` prompt tokens (None:
    /// stop reporting). With a reporter, a prefill runs one `llama_decode` per `n_ubatch` tokens
    /// — the micro-batches llama.cpp splits one call into anyway, so the cache and every logit
    /// stay the same — and reports after each.
    pub fn set_prefill_progress(&mut self, progress: Option<PrefillProgress>) {
        self.prefill_progress = progress;
    }

    /// The model this context runs.
    pub fn model(&self) -> &'m LlamaModel {
        self.model
    }

    /// Maximum number of root-to-leaf paths a pending tree may have.
    pub fn max_paths(&self) -> usize {
        self.n_seq - 2
    }

    /// Sequence id used only inside `commit`, to move the kept path.
    fn scratch_seq(&self) -> i32 {
        self.n_seq as i32 - 1
    }

    fn check_tokens(&self, tokens: &[TokenId]) -> Result<()> {
        check_tokens(tokens, self.n_vocab)
    }

    /// The logits rows of the last decode of `rows`, lent from llama.cpp's output buffer (no
    /// copy: the caller reads only the rows it needs). llama.cpp stores the rows asked for
    /// contiguously in batch order (`llama_get_logits`); the first and last rows' addresses
    /// confirm it, and the rows are copied one by one should they ever not be.
    fn output_rows(&self, wanted: &[bool]) -> Logits<'_> {
        lend_rows(&self.ctx, self.n_vocab, wanted)
    }

    /// Drop every pending cell: only cells of the committed sequence survive.
    fn drop_pending(&mut self) {
        if self.tree.len() > 0 {
            self.ctx.llama_kv_cache_seq_keep(BASE_SEQ);
            self.tree.clear();
        }
    }
}

/// Every token of `tokens` is inside a vocabulary of `n_vocab` tokens.
pub(crate) fn check_tokens(tokens: &[TokenId], n_vocab: usize) -> Result<()> {
    match tokens.iter().position(|&t| t as usize >= n_vocab) {
        Some(i) => Err(EngineError::State(format!(
            "token {} at index {i} is outside the vocabulary of {} tokens",
            tokens[i], n_vocab
        ))),
        None => Ok(()),
    }
}

/// The logits rows of the last decode of `rows` (flags in batch order), lent from llama.cpp's
/// output buffer (no copy: the caller reads only the rows it needs). llama.cpp stores the rows
/// asked for contiguously in batch order (`llama_get_logits`); the first and last rows'
/// addresses confirm it, and the rows are copied one by one should they ever not be.
pub(crate) fn lend_rows<'c>(ctx: &'c LlamaContext<'_>, n_vocab: usize, wanted: &[bool]) -> Logits<'c> {
    let mut rows = wanted.iter().enumerate().filter(|(_, &w)| w).map(|(i, _)| i as i32);
    let (Some(first), last) = (rows.next(), rows.next_back()) else {
        return Logits::new(n_vocab, Vec::new());
    };
    let n = wanted.iter().filter(|&&w| w).count();
    let start = ctx.get_logits_ith(first).as_ptr();
    let end = ctx.get_logits_ith(last.unwrap_or(first)).as_ptr();
    if std::ptr::eq(end, start.wrapping_add((n - 1) * n_vocab)) {
        // SAFETY: rows `first..=last` are n rows of n_vocab floats each, contiguous (checked just
        // above), inside llama.cpp's output buffer, which stays untouched until the next decode,
        // and that needs `&mut` the context, which the returned borrow of it excludes.
        let data = unsafe { std::slice::from_raw_parts(start, n * n_vocab) };
        return Logits::borrowed(n_vocab, data);
    }
    let mut data = Vec::with_capacity(n * n_vocab);
    for (i, _) in wanted.iter().enumerate().filter(|(_, &w)| w) {
        data.extend_from_slice(ctx.get_logits_ith(i as i32));
    }
    Logits::new(n_vocab, data)
}

/// A llama.cpp batch reused between decodes, grown on demand (its seq-id arrays cost
/// `capacity × n_seq` ints).
pub(crate) struct BatchBuf {
    batch: LlamaBatch<'static>,
    capacity: usize,
    n_seq: usize,
    /// llama.cpp's count of decodes that reused the graph before, after the last decode.
    pub(crate) reuses: u64,
    /// Whether the last decode reused the graph of the one before.
    pub(crate) reused: bool,
}

impl BatchBuf {
    /// A batch for rows of up to `n_seq` sequence ids each.
    pub(crate) fn new(n_seq: usize) -> Self {
        Self {
            batch: LlamaBatch::new(INITIAL_BATCH, n_seq as i32),
            capacity: INITIAL_BATCH,
            n_seq,
            reuses: 0,
            reused: false,
        }
    }

    /// Fill the batch with the `n` `rows` (token, position, sequence ids, logits wanted) and run
    /// one `llama_decode` on `ctx` (of `n_ctx` cells: the batch grows to that at most, unless
    /// more rows are given).
    pub(crate) fn decode<'r>(
        &mut self,
        ctx: &mut LlamaContext<'_>,
        n_ctx: usize,
        n: usize,
        rows: impl Iterator<Item = (TokenId, usize, &'r [i32], bool)>,
    ) -> Result<()> {
        if n > self.capacity {
            let cap = n.next_power_of_two().min(n_ctx.max(n));
            self.batch = LlamaBatch::new(cap, self.n_seq as i32);
            self.capacity = cap;
        }
        self.batch.clear();
        for (token, pos, seqs, logits) in rows {
            debug_assert!(seqs.len() <= self.n_seq);
            self.batch
                .add(LlamaToken(token as i32), pos as i32, seqs, logits)
                .map_err(|e| EngineError::Backend(format!("cannot fill llama.cpp batch: {e}")))?;
        }
        DECODED.store(true, Ordering::SeqCst);
        backend::clear_captured();
        ctx.decode(&mut self.batch).map_err(|e| backend_err("llama_decode failed", e))?;
        let reuses = graph_reuses(ctx);
        self.reused = reuses > self.reuses;
        self.reuses = reuses;
        Ok(())
    }
}

/// Remove sequence `seq` from the cells at positions `from..to` (None: from the start, to the
/// end).
pub(crate) fn seq_rm(
    ctx: &mut LlamaContext<'_>,
    seq: i32,
    from: Option<usize>,
    to: Option<usize>,
) -> Result<()> {
    let ok = ctx
        .clear_kv_cache_seq(Some(seq as u32), from.map(|p| p as u32), to.map(|p| p as u32))
        .map_err(|e| EngineError::Backend(format!("KV cache removal failed: {e}")))?;
    if ok {
        Ok(())
    } else {
        Err(EngineError::Backend(format!(
            "llama.cpp refused to remove positions {from:?}..{to:?} of sequence {seq}"
        )))
    }
}

/// Take a failed batch's planned paths back out of the cache (best effort: the decode error is
/// what gets reported).
pub(crate) fn undo_plan(ctx: &mut LlamaContext<'_>, plan: &Plan) {
    for u in plan.undo.iter().rev() {
        let _ = match *u {
            Undo::DropSeq(s) => seq_rm(ctx, s, None, None),
            Undo::TrimSeq { seq, from } => seq_rm(ctx, seq, Some(from), None),
        };
    }
}

impl CausalLm for LlamaLm<'_> {
    fn vocab_size(&self) -> usize {
        self.n_vocab
    }

    fn context_size(&self) -> usize {
        self.n_ctx
    }

    fn committed_len(&self) -> usize {
        self.committed
    }

    fn pending_len(&self) -> usize {
        self.tree.len()
    }

    fn prefill(&mut self, tokens: &[TokenId]) -> Result<()> {
        if self.tree.len() > 0 {
            return Err(EngineError::State(format!(
                "prefill with {} pending nodes: commit or truncate first",
                self.tree.len()
            )));
        }
        if tokens.is_empty() {
            return Ok(());
        }
        if self.committed + tokens.len() > self.n_ctx {
            return Err(EngineError::PromptTooLong {
                prompt: self.committed + tokens.len(),
                context: self.n_ctx,
            });
        }
        self.check_tokens(tokens)?;
        let start = self.committed;
        // One call, or one per micro-batch when someone watches the progress.
        let chunk = match self.prefill_progress {
            Some(_) => self.model.options().n_ubatch.clamp(1, self.n_ctx),
            None => tokens.len(),
        };
        for (k, part) in tokens.chunks(chunk).enumerate() {
            let at = start + k * chunk;
            let rows = part.iter().enumerate().map(|(i, &t)| (t, at + i, &[BASE_SEQ][..], false));
            if let Err(e) = self.batch.decode(&mut self.ctx, self.n_ctx, part.len(), rows) {
                let _ = seq_rm(&mut self.ctx, BASE_SEQ, Some(start), None);
                self.committed = start;
                return Err(e);
            }
            self.committed = at + part.len();
            if let Some(report) = self.prefill_progress.as_mut() {
                report(self.committed - start, tokens.len());
            }
        }
        Ok(())
    }

    fn forward(&mut self, batch: &TreeBatch) -> Result<Logits<'_>> {
        if batch.is_empty() {
            return Ok(Logits::new(self.n_vocab, Vec::new()));
        }
        let used = self.committed + self.tree.len();
        if used + batch.len() > self.n_ctx {
            return Err(EngineError::InvalidRequest(format!(
                "feeding {} nodes on top of {} committed tokens and {} pending nodes exceeds the context of {} positions",
                batch.len(),
                self.committed,
                self.tree.len(),
                self.n_ctx
            )));
        }
        self.check_tokens(&batch.tokens)?;
        // The new nodes go straight into the pending tree; a batch llama.cpp rejects is taken
        // back out of the tree and the cache.
        let base = self.tree.len();
        let plan = self.tree.extend(batch, self.committed)?;
        for c in &plan.copies {
            if let Err(e) = self.ctx.copy_kv_cache_seq(c.src, c.dst, None, Some(c.end as u32)) {
                undo_plan(&mut self.ctx, &plan);
                self.tree.rollback(base, &plan);
                return Err(EngineError::Backend(format!("KV cache copy failed: {e}")));
            }
        }
        let spare = self.scratch_seq();
        let n =
            self.padding.plan(batch.len(), used, self.n_ctx, spare, self.tree.unused_ids(), batch.tokens[0]);
        let (committed, tree) = (self.committed, &self.tree);
        let rows = (0..batch.len()).map(|i| {
            let (depth, seqs) = tree.row(base + i);
            (batch.tokens[i], committed + depth, seqs, batch.logits[i])
        });
        let decoded = self.batch.decode(&mut self.ctx, self.n_ctx, n, rows.chain(self.padding.rows()));
        let removed = self.padding.remove(&mut self.ctx);
        if let Err(e) = decoded.and(removed) {
            undo_plan(&mut self.ctx, &plan);
            self.tree.rollback(base, &plan);
            return Err(e);
        }
        let reused = self.batch.reused;
        Ok(self.output_rows(&batch.logits).with_graph_reused(reused))
    }

    fn commit(&mut self, path: &[usize]) -> Result<()> {
        let Some(seq) = self.tree.path_seq(path)? else {
            self.drop_pending();
            return Ok(());
        };
        let start = self.committed;
        let end = start + path.len();
        let kv_err = |e: &dyn std::fmt::Display| EngineError::Backend(format!("KV cache copy failed: {e}"));
        // Pending node i sits in cell `committed + i` (see the module doc), so a path made of the
        // first nodes is already in place: its cells of `seq` at positions start..end just join
        // the committed sequence, and everything else goes.
        if path.iter().enumerate().all(|(k, &i)| k == i) {
            self.ctx
                .copy_kv_cache_seq(seq, BASE_SEQ, Some(start as u32), Some(end as u32))
                .map_err(|e| kv_err(&e))?;
            self.drop_pending();
            self.committed = end;
            return Ok(());
        }
        // Otherwise compact: park the path in the scratch sequence, save it, free every pending
        // cell, and restore it right above the prefix.
        let scratch = self.scratch_seq();
        self.ctx
            .copy_kv_cache_seq(seq, scratch, Some(start as u32), Some(end as u32))
            .map_err(|e| kv_err(&e))?;
        backend::clear_captured();
        let saved = self.ctx.state_seq_get(scratch, LlamaStateSeqFlags::empty());
        self.drop_pending();
        let saved = saved.map_err(|e| backend_err("cannot save the committed path", e))?;
        if let Err(e) = self.ctx.state_seq_set(&saved, scratch) {
            let _ = self.ctx.clear_kv_cache_seq(Some(scratch as u32), None, None);
            return Err(backend_err("cannot restore the committed path (it was dropped)", e));
        }
        self.ctx.copy_kv_cache_seq(scratch, BASE_SEQ, None, None).map_err(|e| kv_err(&e))?;
        self.ctx.llama_kv_cache_seq_keep(BASE_SEQ);
        self.committed = end;
        Ok(())
    }

    /// `len` at or beyond the committed length just drops the pending nodes.
    fn truncate(&mut self, len: usize) -> Result<()> {
        self.drop_pending();
        if len < self.committed {
            seq_rm(&mut self.ctx, BASE_SEQ, Some(len), None)?;
            self.committed = len;
        }
        Ok(())
    }

    fn computes_on_cpu(&self) -> bool {
        !self.model.options().offload.layers.any()
    }

    fn pad_shapes(&mut self, buckets: Option<&ShapeBuckets>) -> bool {
        self.padding.set(buckets);
        true
    }

    fn graph_reuses(&self) -> Option<u64> {
        Some(self.batch.reuses)
    }
}
