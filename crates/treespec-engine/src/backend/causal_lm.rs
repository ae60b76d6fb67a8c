//! One sequence: the committed prefix, pending tree nodes, and the logits a forward returns.
//!
//! A model holds a *committed* prefix (its KV cache) and, during a step, *pending* nodes: tokens
//! fed on top of the prefix as a tree, each attending only to the prefix and its own ancestors.
//! Pending nodes may be added over several calls (a draft growing its tree layer by layer); they
//! are numbered in the order they were fed, across calls, until the next `commit` or `truncate`.
//! `commit` keeps one root-to-node path of pending nodes (they sit at contiguous positions
//! already) and drops every other pending node.

use std::borrow::Cow;

use treespec_core::cost::shapes::ShapeBuckets;
use treespec_core::tree::TokenTree;
use treespec_core::TokenId;

use crate::error::Result;

/// Nodes to feed on top of the committed prefix and the already pending nodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TreeBatch {
    /// Token of each new node.
    pub tokens: Vec<TokenId>,
    /// Parent of each new node as a pending index (earlier calls' nodes, or earlier nodes of this
    /// batch offset by the pending count before the call); `None` = attached right after the
    /// committed prefix.
    pub parents: Vec<Option<usize>>,
    /// Whether logits are wanted for each new node.
    pub logits: Vec<bool>,
}

impl TreeBatch {
    /// A batch for a whole tree (rows in arena order, parents before children) fed on top of
    /// `pending_base` pending nodes (0 for a fresh step), with logits for every row. Only tokens
    /// and parent links: a backend derives positions and attention from the parents itself.
    pub fn from_tree(tree: &TokenTree, pending_base: usize) -> Self {
        let nodes = tree.nodes();
        Self {
            tokens: nodes.iter().map(|n| n.token).collect(),
            parents: nodes.iter().map(|n| n.parent.map(|p| p + pending_base)).collect(),
            logits: vec![true; nodes.len()],
        }
    }

    /// A chain of tokens: the first attached to `parent`, each next one to the previous.
    pub fn chain(
        tokens: &[TokenId],
        parent: Option<usize>,
        pending_base: usize,
        logits_last_only: bool,
    ) -> Self {
        let n = tokens.len();
        Self {
            tokens: tokens.to_vec(),
            parents: (0..n).map(|i| if i == 0 { parent } else { Some(pending_base + i - 1) }).collect(),
            logits: (0..n).map(|i| !logits_last_only || i + 1 == n).collect(),
        }
    }

    /// Append one node.
    pub fn push(&mut self, token: TokenId, parent: Option<usize>, logits: bool) {
        self.tokens.push(token);
        self.parents.push(parent);
        self.logits.push(logits);
    }

    /// Number of new nodes.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when the batch feeds nothing.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// Logits for the rows a batch asked for, in batch order: row-major, `vocab` floats a row.
///
/// A backend may lend its own output buffer (`Logits<'a>` borrows the model until dropped), so
/// a forward copies nothing and a reader touches only the rows it looks at. A caller that must
/// keep rows past the model's next call takes [`Logits::into_owned`] or copies the row it needs.
#[derive(Debug, Clone)]
pub struct Logits<'a> {
    vocab: usize,
    data: Cow<'a, [f32]>,
    /// Whether the forward that computed them reused the graph of the forward before (where the
    /// backend says).
    graph_reused: Option<bool>,
}

impl Logits<'static> {
    /// Wrap row-major logits of `data.len() / vocab` rows.
    pub fn new(vocab: usize, data: Vec<f32>) -> Self {
        debug_assert!(vocab > 0 && data.len().is_multiple_of(vocab));
        Self { vocab, data: Cow::Owned(data), graph_reused: None }
    }
}

impl<'a> Logits<'a> {
    /// Borrow row-major logits of `data.len() / vocab` rows.
    pub fn borrowed(vocab: usize, data: &'a [f32]) -> Self {
        debug_assert!(vocab > 0 && data.len().is_multiple_of(vocab));
        Self { vocab, data: Cow::Borrowed(data), graph_reused: None }
    }

    /// The same rows, owned (a copy when borrowed).
    pub fn into_owned(self) -> Logits<'static> {
        Logits {
            vocab: self.vocab,
            data: Cow::Owned(self.data.into_owned()),
            graph_reused: self.graph_reused,
        }
    }

    /// These rows, from a forward that did (or did not) reuse the graph of the one before.
    pub fn with_graph_reused(mut self, reused: bool) -> Self {
        self.graph_reused = Some(reused);
        self
    }

    /// Whether the forward reused the graph of the forward before (None: the backend does not say).
    pub fn graph_reused(&self) -> Option<bool> {
        self.graph_reused
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.data.len() / self.vocab
    }

    /// Rows `rows` as logits of their own, borrowed (one request's rows of a batched forward).
    pub fn slice(&self, rows: std::ops::Range<usize>) -> Logits<'_> {
        Logits::borrowed(self.vocab, &self.data[rows.start * self.vocab..rows.end * self.vocab])
    }

    /// Every row, row-major.
    pub fn row_data(&self) -> &[f32] {
        &self.data
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }
}

impl PartialEq<Logits<'_>> for Logits<'_> {
    fn eq(&self, other: &Logits<'_>) -> bool {
        self.vocab == other.vocab && self.data[..] == other.data[..]
    }
}

/// A causal language model that can score token trees. Implemented by the llama.cpp backend and
/// the toy models. `Send`, as every [`Drafter`](crate::Drafter) that owns one is.
pub trait CausalLm: Send {
    /// Vocabulary size (length of each logits row).
    fn vocab_size(&self) -> usize;

    /// Maximum number of positions (committed + pending).
    fn context_size(&self) -> usize;

    /// Number of committed tokens.
    fn committed_len(&self) -> usize;

    /// Number of pending (fed, not yet committed) nodes.
    fn pending_len(&self) -> usize;

    /// Append tokens to the committed prefix without computing logits (prompt processing).
    /// Errors if nodes are pending.
    fn prefill(&mut self, tokens: &[TokenId]) -> Result<()>;

    /// Feed `batch` as pending nodes in ONE forward pass. Returns one logits row per node whose
    /// `logits` flag is set, in batch order, possibly borrowed from the model's output buffer
    /// (valid until the model's next mutable call).
    fn forward(&mut self, batch: &TreeBatch) -> Result<Logits<'_>>;

    /// Keep the pending nodes of `path` (pending indices; the first attached to the committed
    /// prefix, each next one a child of the previous) as committed tokens; drop all other pending
    /// nodes. An empty path just drops the pending nodes.
    fn commit(&mut self, path: &[usize]) -> Result<()>;

    /// Drop pending nodes and committed tokens beyond `len`.
    fn truncate(&mut self, len: usize) -> Result<()>;

    /// Whether a forward computes on this process's CPU threads (false: a GPU holds the
    /// model's layers). Cost measurement reads the CPU time of a forward's threads to tell
    /// that another process shared the cores; where a device computes, the host thread only
    /// waits for it, and that time says nothing about sharing.
    fn computes_on_cpu(&self) -> bool {
        true
    }

    /// Pad every later forward of two or more rows up to a shape of `buckets` with filler rows
    /// that change no returned row and leave nothing pending (see `treespec_core::cost::shapes`),
    /// so that consecutive forwards of one bucket have the same shape; None stops padding. False
    /// when this model cannot pad (nothing changes then).
    fn pad_shapes(&mut self, buckets: Option<&ShapeBuckets>) -> bool {
        let _ = buckets;
        false
    }

    /// Forwards so far that reused the computation graph of the forward before (llama.cpp's own
    /// count), where the backend keeps one.
    fn graph_reuses(&self) -> Option<u64> {
        None
    }
}

/// Forward every `CausalLm` method through a pointer type to the model it points at.
macro_rules! forward_causal_lm {
    ($($ptr:ty),*) => {$(
        impl<M: CausalLm + ?Sized> CausalLm for $ptr {
            fn vocab_size(&self) -> usize {
                (**self).vocab_size()
            }
            fn context_size(&self) -> usize {
                (**self).context_size()
            }
            fn committed_len(&self) -> usize {
                (**self).committed_len()
            }
            fn pending_len(&self) -> usize {
                (**self).pending_len()
            }
            fn prefill(&mut self, tokens: &[TokenId]) -> Result<()> {
                (**self).prefill(tokens)
            }
            fn forward(&mut self, batch: &TreeBatch) -> Result<Logits<'_>> {
                (**self).forward(batch)
            }
            fn commit(&mut self, path: &[usize]) -> Result<()> {
                (**self).commit(path)
            }
            fn truncate(&mut self, len: usize) -> Result<()> {
                (**self).truncate(len)
            }
            fn computes_on_cpu(&self) -> bool {
                (**self).computes_on_cpu()
            }
            fn pad_shapes(&mut self, buckets: Option<&ShapeBuckets>) -> bool {
                (**self).pad_shapes(buckets)
            }
            fn graph_reuses(&self) -> Option<u64> {
                (**self).graph_reuses()
            }
        }
    )*};
}

// A model borrowed mutably is a model: a drafter can own `&mut` a context that outlives it and is
// reused by the next generation (the benchmark and the server keep one draft context); a boxed
// one is too.
forward_causal_lm!(&mut M, Box<M>);
