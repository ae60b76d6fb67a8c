//! The drafter seam: a begin / propose / observe lifecycle (as llama.cpp's common/speculative
//! and vLLM's proposers use), so every method — model drafts, n-gram lookups, dynamic trees —
//! plugs into the same loop.

use std::time::Duration;

use treespec_core::cost::CostCurve;
use treespec_core::sampling::Sampler;
use treespec_core::tree::{NodeId, TokenTree};
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;

use crate::error::Result;
use crate::extra_stats::ExtraStats;
use crate::method_kind::MethodKind;

/// The target forward that scored a step's tree: what the step waited for, and what a
/// cost-aware drafter learns from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ForwardCost {
    /// Rows in the whole forward, root included (other requests' rows too, when batched).
    pub rows: usize,
    /// Of them, rows of prompt chunks read in the same forward (the batch scheduler's).
    pub prompt_rows: usize,
    /// How long the forward took: the step waited that long.
    pub time: Duration,
    /// Whether the forward reused the graph of the forward before (where the backend says):
    /// on a device, a replay.
    pub graph_reused: Option<bool>,
}

impl ForwardCost {
    /// A forward of `rows` tree rows and nothing else, taking `ms` (replays, tests).
    pub fn trees(rows: usize, ms: f64) -> Self {
        Self { rows, prompt_rows: 0, time: Duration::from_secs_f64(ms / 1e3), graph_reused: None }
    }

    /// The forward's time in ms.
    pub fn ms(&self) -> f64 {
        self.time.as_secs_f64() * 1e3
    }

    /// The size whose T(n) this forward timed, or `None` when prompt chunks rode it: their rows
    /// compute no logits (the output layer is about 15% of a row of the 1.5B target, 27% of the
    /// 0.5B draft), so such a forward runs faster than T(rows), and counted as T(rows) it
    /// dragged the curve's larger sizes down at the fast weight while a server read prompts.
    pub fn timed_rows(&self) -> Option<usize> {
        (self.prompt_rows == 0).then_some(self.rows)
    }
}

/// How an emitted token was produced: accepted from a draft copied out of earlier text, from a
/// draft model's draft, from the grammar's forced tokens, or sampled by the target itself (each
/// step's bonus token, and every token of plain decoding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Provenance {
    /// A model-free draft: copied from the prompt, the output or earlier requests.
    Copied,
    /// A draft model's draft.
    Drafted,
    /// Forced by the grammar (drafted for free).
    Forced,
    /// The target's own token.
    Target,
}

impl Provenance {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Provenance::Copied => "copied",
            Provenance::Drafted => "drafted",
            Provenance::Forced => "forced",
            Provenance::Target => "target",
        }
    }
}

/// What a drafter knows when it proposes.
#[derive(Debug, Clone, Copy)]
pub struct ProposeContext<'a> {
    /// Every token so far (prompt + generated). The last one is the tree root: emitted but not
    /// yet consumed by the target.
    pub history: &'a [TokenId],
    /// Most drafted nodes the step may hold (context room; a method's own budget may be lower).
    pub max_nodes: usize,
    /// Deepest useful draft: tokens still wanted minus the bonus token.
    pub max_depth: usize,
    /// The sampling configuration shared with the target.
    pub sampler: &'a Sampler,
    /// Rows other requests already hold in the same target forward (0 when decoding alone). A
    /// cost-aware drafter prices its nodes at their marginal cost on top of these, so
    /// speculation shrinks as a batch fills the cheap part of the cost curve.
    pub batch_rows: usize,
    /// True when a batch budget will cut [`Drafter::cuttable`] proposals across every request of
    /// the forward: such a proposal is priced as if alone and the batch keeps what pays.
    pub batch_cut: bool,
    /// Tokens that end generation. A copy that reaches one stops there: nothing after it can be
    /// emitted, so a chain drafted through it (a prompt's end of turn, say) bets rows that cannot
    /// pay.
    pub eos: &'a [TokenId],
}

impl ProposeContext<'_> {
    /// The root token (last token of the history).
    pub fn root(&self) -> TokenId {
        *self.history.last().expect("history always holds the root")
    }

    /// The tail of the history the sampler reads (the repetition penalty's window; empty
    /// without a penalty, so nothing is copied then).
    pub fn history_window(&self) -> &[TokenId] {
        &self.history[self.history.len().saturating_sub(self.sampler.context_window())..]
    }

    /// The context a draft row of `node` is processed with: the history window, then the
    /// tree's path to `node`. Empty (no allocation) without a repetition penalty.
    pub fn node_context(&self, tree: &TokenTree, node: NodeId) -> Vec<TokenId> {
        if self.sampler.context_window() == 0 {
            return Vec::new();
        }
        let mut c = self.history_window().to_vec();
        c.extend(tree.path_tokens(node));
        c
    }
}

/// A proposal a batch budget may cut to any arena prefix ([`Drafter::cuttable`]).
#[derive(Debug, Clone, Copy)]
pub struct Cuttable<'a> {
    /// Expected acceptance of each drafted node (the probability that its whole path is
    /// accepted), for nodes 1.. in arena order, non-increasing.
    pub values: &'a [f64],
    /// The target cost curve the values were priced against.
    pub target: &'a CostCurve,
}

/// A speculative drafting method. `Send`: in a continuous batch, requests propose concurrently,
/// each on its own thread, so their draft-model forwards can meet in one batched draft forward
/// ([`SharedDraft`](crate::SharedDraft)).
pub trait Drafter: Send {
    /// The method this drafter runs (its registry entry: the name on the command line, in a
    /// request's `treespec` object and in statistics).
    fn kind(&self) -> MethodKind;

    /// The method's name (as on the command line).
    fn name(&self) -> &'static str {
        self.kind().as_str()
    }

    /// Where the drafted nodes of the last proposal came from: copied from earlier text
    /// ([`Provenance::Copied`]: suffix and lookup drafts) or drafted by a model (the default).
    /// Shown per token to a client that asks (the server's chat page colours by it).
    fn source(&self) -> Provenance {
        Provenance::Drafted
    }

    /// Start a new generation after `prompt` (the last prompt token is the first root). `seed`
    /// seeds the drafter's own random stream, never shared with the verifier.
    fn begin(&mut self, prompt: &[TokenId], sampler: &Sampler, seed: u64) -> Result<()>;

    /// This drafter's requests will share every forward with other requests (continuous
    /// batching; called before `begin`). Work it does on its own — a draft model's prompt
    /// prefill — then holds up every request of the step, so it may defer such work until it
    /// pays.
    fn join_batch(&mut self) {}

    /// Propose a token tree whose root is `ctx.root()`.
    fn propose(&mut self, ctx: &ProposeContext) -> Result<TokenTree>;

    /// Learn the outcome of verifying the last proposed tree: accepted nodes and emitted tokens
    /// (accepted + bonus). The bonus token is the next root.
    fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) -> Result<()>;

    /// The forward that scored the last proposed tree, reported before `observe`. Cost-aware
    /// drafters count its time in their achieved rate and refine their cost curve with it when
    /// it timed a size of the curve ([`ForwardCost::timed_rows`]).
    fn observe_cost(&mut self, _forward: ForwardCost) {}

    /// The last proposal as a batch budget may cut it, or `None` when it may not be cut (the
    /// default; trees with sampled nodes never may: a sampled node's presence must not depend on
    /// its own draw). `Some` promises that every arena prefix of the proposed tree is an equally
    /// exact proposal, and that `observe` accepts the prefix the batch kept.
    fn cuttable(&self) -> Option<Cuttable<'_>> {
        None
    }

    /// The generation is over: `text` is its prompt and every emitted token. Drafters that learn
    /// from finished text (the suffix drafter's global history) take it here.
    fn finish(&mut self, _text: &[TokenId]) {}

    /// Forward calls made on a draft model so far in this generation (0 if model-free).
    fn draft_forwards(&self) -> u64 {
        0
    }

    /// Method-specific statistics for reports (e.g. GSD merges, staged second-stage acceptance).
    fn extra_stats(&self) -> ExtraStats {
        ExtraStats::default()
    }
}

/// Plain decoding expressed as a drafter that never drafts: every step verifies the root only,
/// which is exactly one target forward per token.
#[derive(Debug, Default, Clone)]
pub struct PlainDrafter;

impl Drafter for PlainDrafter {
    fn kind(&self) -> MethodKind {
        MethodKind::Plain
    }
    fn begin(&mut self, _: &[TokenId], _: &Sampler, _: u64) -> Result<()> {
        Ok(())
    }
    fn propose(&mut self, ctx: &ProposeContext) -> Result<TokenTree> {
        Ok(TokenTree::new(ctx.root()))
    }
    fn observe(&mut self, _: &TokenTree, _: &VerifyOutcome) -> Result<()> {
        Ok(())
    }
}
