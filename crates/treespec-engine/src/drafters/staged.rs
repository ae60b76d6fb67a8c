//! Staged speculative decoding (arXiv 2308.04623): the draft model's own generation is itself
//! sped up by a cheaper second-stage draft (draft²) of n-grams.
//!
//! The draft grows a chain of `depth` tokens, with extra siblings at the first `branch_depths`
//! depths (a tree-shaped batch where cumulative probability is highest). Every draft token is the
//! draft's own choice at its node — sampled from its processed distribution `q`, or its argmax
//! under greedy — exactly as if drafted one forward at a time, so the target verifies the usual
//! way: family 2 (draws without replacement, the first being the chain token) or argmax matching.
//!
//! What the second stage changes is only *how many draft forwards* that takes. Whenever the draft
//! must run on a new chain token `x`, draft² proposes up to `lookahead` tokens that may follow
//! (context n-grams of history + path, then the static Katz table) and they are fed in the SAME
//! forward as a chain under `x`. If the draft's next token equals the first proposal, that
//! proposal's logits row is already the draft's distribution at the new node: the chain advances
//! without a forward, and so on down the proposals. Proposals are never tokens of the tree; a
//! proposal only lends its computed row to a tree node whose token and path are identical.
//!
//! Draft KV: `DraftModel` maps *tree* nodes to the draft's pending rows and has no notion of fed
//! rows that are not tree nodes, so this drafter keeps its own bookkeeping over the `CausalLm`:
//! `rows[node]` is the pending row whose KV matches the node's exact path (its own forward, or a
//! proposal it took over), and `observe` commits the fed prefix of the accepted path, dropping
//! every unused proposal; unfed accepted tokens and the bonus token are queued and fed as a chain
//! at the start of the next step — in the same forward as that step's first proposals.

use std::sync::Arc;

use treespec_core::ngram::{ContextIndex, NgramTable};
use treespec_core::rng::{Stream, StreamRng};
use treespec_core::sampling::Sampler;
use treespec_core::tree::{TokenTree, ROOT};
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;

use super::sample::{draw_children, SampleMode};
use crate::backend::{CausalLm, Logits, TreeBatch};
use crate::drafter::{Drafter, ProposeContext};
use crate::error::{EngineError, Result};
use crate::extra_stats::{ExtraStats, StagedCounts};
use crate::method_kind::MethodKind;

/// Staged-drafting knobs.
#[derive(Debug, Clone)]
pub struct StagedConfig {
    /// Draft chain length (capped by the tokens still wanted). Default 6.
    pub depth: usize,
    /// Depths (from the root) that get extra siblings. 0 = a plain chain. Default 2.
    pub branch_depths: usize,
    /// Children per node at the branching depths, the chain token included (≥ 1). Default 2.
    pub branch_width: usize,
    /// Longest context n-gram the second stage matches. Default 3.
    pub ngram_max: usize,
    /// Second-stage tokens proposed per draft forward; 0 turns the second stage off. Default 4.
    pub lookahead: usize,
    /// Static Katz table backing the context n-grams (built from draft samples). Default none.
    pub table: Option<Arc<NgramTable>>,
}

impl Default for StagedConfig {
    fn default() -> Self {
        Self { depth: 6, branch_depths: 2, branch_width: 2, ngram_max: 3, lookahead: 4, table: None }
    }
}

impl StagedConfig {
    /// Check every knob's domain; the message names the knob.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in
            [("depth", self.depth), ("branch_width", self.branch_width), ("ngram_max", self.ngram_max)]
        {
            if v == 0 {
                return Err(EngineError::InvalidRequest(format!("staged {name} must be ≥ 1")));
            }
        }
        Ok(())
    }

    /// Children per node at depth `d` (from 1), the chain token included: `branch_width` at the
    /// branching depths, 1 below them.
    fn width_at(&self, d: usize) -> usize {
        if d <= self.branch_depths {
            self.branch_width
        } else {
            1
        }
    }
}

/// Per-generation counters of a [`StagedDrafter`] (reset by `begin`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StagedStats {
    /// `propose` calls.
    pub steps: u64,
    /// Chain tokens drafted.
    pub chain_tokens: u64,
    /// Extra siblings drafted at the branching depths.
    pub siblings: u64,
    /// Second-stage tokens fed to the draft.
    pub proposed: u64,
    /// Second-stage tokens the draft then chose itself (their rows were used).
    pub used: u64,
}

/// The current step's pending rows.
struct StepRows {
    /// Rows of the unfed chain fed first (the root is its last row).
    chain_len: usize,
    /// Tree node → pending row holding its KV for exactly its path, if any.
    rows: Vec<Option<usize>>,
}

/// The draft model with this drafter's own bookkeeping over it (see the module docs: its
/// proposals are fed rows that are not tree nodes, which a `DraftModel` cannot map).
struct Draft<M: CausalLm> {
    model: M,
    /// Tokens the draft has not consumed: fed as a chain at the start of the next step, ending at
    /// the root.
    unfed: Vec<TokenId>,
    forwards: u64,
}

/// One forward's logits, lent by the draft model until its next call: the fed node's row first,
/// then one row per proposal fed after it, in chain order. The chain reads them in place.
struct Fed<'m> {
    logits: Logits<'m>,
    proposals: Vec<TokenId>,
    /// Pending row of the first proposal (the others follow it).
    first_row: usize,
    /// Proposals the chain took over: the node it is at has logits row `taken`.
    taken: usize,
}

impl Fed<'_> {
    /// The draft's logits at the node the chain is at.
    fn row(&self) -> &[f32] {
        self.logits.row(self.taken)
    }

    /// If the draft chose the next proposal (`token`) itself, the chain takes it over: returns
    /// its pending row, whose KV and logits row are the new node's, for free.
    fn take(&mut self, token: TokenId) -> Option<usize> {
        if self.proposals.get(self.taken) != Some(&token) {
            return None;
        }
        self.taken += 1;
        Some(self.first_row + self.taken - 1)
    }
}

impl<M: CausalLm> Draft<M> {
    /// The step's first forward: the unfed chain (ending at the root) plus `proposals` after
    /// the root. Returns its rows and the step's pending rows so far (the root's).
    fn feed_root(&mut self, proposals: Vec<TokenId>) -> Result<(Fed<'_>, StepRows)> {
        let chain_len = self.unfed.len();
        let base = self.model.pending_len();
        let mut batch = TreeBatch::chain(&self.unfed, None, base, true);
        for (i, &t) in proposals.iter().enumerate() {
            batch.push(t, Some(base + chain_len - 1 + i), true);
        }
        let step = StepRows { chain_len, rows: vec![Some(base + chain_len - 1)] };
        Ok((self.forward(&batch, proposals, base + chain_len)?, step))
    }

    /// One forward for chain token `x` under its parent's pending row, plus `proposals` after
    /// `x`. Returns its rows and `x`'s pending row.
    fn feed_node(
        &mut self,
        x: TokenId,
        parent_row: usize,
        proposals: Vec<TokenId>,
    ) -> Result<(Fed<'_>, usize)> {
        let base = self.model.pending_len();
        let batch = TreeBatch::chain(&[&[x][..], &proposals].concat(), Some(parent_row), base, false);
        Ok((self.forward(&batch, proposals, base + 1)?, base))
    }

    /// Feed `batch` (whose nodes with logits are the first `1 + proposals.len()` rows requested)
    /// and lend its rows: the node's, then the proposals'.
    fn forward(&mut self, batch: &TreeBatch, proposals: Vec<TokenId>, first_row: usize) -> Result<Fed<'_>> {
        self.forwards += 1;
        let logits = self.model.forward(batch)?;
        if logits.rows() != 1 + proposals.len() {
            return Err(EngineError::State(format!(
                "staged: draft returned {} logits rows for {} requested",
                logits.rows(),
                1 + proposals.len()
            )));
        }
        Ok(Fed { logits, proposals, first_row, taken: 0 })
    }
}

/// The staged drafter: a draft model accelerated by an n-gram second stage.
pub struct StagedDrafter<M: CausalLm> {
    draft: Draft<M>,
    config: StagedConfig,
    index: ContextIndex,
    step: Option<StepRows>,
    rng: StreamRng,
    stats: StagedStats,
}

impl<M: CausalLm> StagedDrafter<M> {
    /// A staged drafter; errors on an invalid config or a table for another vocabulary.
    pub fn new(draft: M, config: StagedConfig) -> Result<Self> {
        config.validate()?;
        if let Some(t) = &config.table {
            if t.vocab() != draft.vocab_size() {
                return Err(EngineError::Incompatible(format!(
                    "staged n-gram table has a vocabulary of {} tokens, the draft model {}",
                    t.vocab(),
                    draft.vocab_size()
                )));
            }
        }
        let index = ContextIndex::new(1, config.ngram_max)?;
        Ok(Self {
            draft: Draft { model: draft, unfed: Vec::new(), forwards: 0 },
            config,
            index,
            step: None,
            rng: StreamRng::new(0, Stream::Draft),
            stats: StagedStats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &StagedConfig {
        &self.config
    }

    /// Counters since the last `begin`.
    pub fn stats(&self) -> &StagedStats {
        &self.stats
    }

    /// Second-stage acceptance: proposals the draft used / proposals fed (0 before any).
    pub fn second_stage_acceptance(&self) -> f64 {
        if self.stats.proposed == 0 {
            0.0
        } else {
            self.stats.used as f64 / self.stats.proposed as f64
        }
    }

    /// Draft² proposals after `context` (history + path): the history's n-gram continuation,
    /// finished by the static table.
    fn proposals(&self, context: &[TokenId], k: usize) -> Vec<TokenId> {
        if k == 0 {
            return Vec::new();
        }
        let mut out = self.index.lookup_after(context, k, 1).pop().map(|c| c.tokens).unwrap_or_default();
        if let (true, Some(t)) = (out.len() < k, &self.config.table) {
            let mut c = context[context.len().saturating_sub(2)..].to_vec();
            c.extend_from_slice(&out);
            out.extend(t.greedy_chain(&c, k - out.len()));
        }
        // History tokens outside the draft's vocabulary (a mismatched pair) cannot be fed.
        let vocab = self.draft.model.vocab_size();
        if let Some(i) = out.iter().position(|&t| t as usize >= vocab) {
            out.truncate(i);
        }
        out
    }
}

impl<M: CausalLm> Drafter for StagedDrafter<M> {
    fn kind(&self) -> MethodKind {
        MethodKind::Staged
    }

    fn begin(&mut self, prompt: &[TokenId], _: &Sampler, seed: u64) -> Result<()> {
        let (last, head) = prompt.split_last().ok_or(EngineError::EmptyPrompt)?;
        self.rng = StreamRng::new(seed, Stream::Draft);
        self.stats = StagedStats::default();
        self.step = None;
        self.draft.forwards = 0;
        self.index.clear();
        self.draft.model.truncate(0)?;
        self.draft.model.prefill(head)?;
        self.draft.unfed = vec![*last];
        Ok(())
    }

    fn propose(&mut self, ctx: &ProposeContext) -> Result<TokenTree> {
        self.stats.steps += 1;
        self.step = None;
        let mut tree = TokenTree::new(ctx.root());
        let depth = self.config.depth.min(ctx.max_depth).min(ctx.max_nodes);
        if depth == 0 {
            return Ok(tree);
        }
        if self.draft.unfed.is_empty() {
            return Err(EngineError::State("staged: draft has no root to feed".into()));
        }
        self.index.sync(ctx.history);
        // History + chain path: the n-gram query and the repetition penalty's context.
        let mut path = ctx.history.to_vec();
        // Rows fed beyond the unfed chain stay pending until observe: keep them within the room.
        let mut room = ctx.max_nodes;

        // First forward: the unfed chain (ending at the root) plus proposals after the root.
        let props = self.proposals(&path, self.config.lookahead.min(depth - 1).min(room));
        room -= props.len();
        let (mut fed, mut step) = self.draft.feed_root(props)?;
        self.stats.proposed += fed.proposals.len() as u64;

        let mut at = ROOT;
        for d in 1..=depth {
            // Keep room for the rest of the chain: siblings are the first thing to give up.
            let width = self.config.width_at(d).min(ctx.max_nodes - tree.drafted() - (depth - d)).max(1);
            let kids = draw_children(
                &mut tree,
                at,
                fed.row(),
                &path,
                width,
                SampleMode::WithoutReplacement,
                ctx.sampler,
                &mut self.rng,
            )?;
            let Some(&main) = kids.first() else { break };
            step.rows.resize(tree.len(), None);
            self.stats.chain_tokens += 1;
            self.stats.siblings += kids.len() as u64 - 1;
            let x = tree.node(main).token;
            path.push(x);
            // The draft chose the next proposal itself: its row is this node's, for free.
            if let Some(row) = fed.take(x) {
                step.rows[main] = Some(row);
                self.stats.used += 1;
                at = main;
                continue;
            }
            if d == depth {
                break;
            }
            if room == 0 {
                // No room left to feed the node: the chain ends here.
                break;
            }
            // One forward: x under its parent's row, plus fresh proposals after x.
            let parent_row =
                step.rows[at].ok_or_else(|| EngineError::State("staged: chain parent not fed".into()))?;
            let props = self.proposals(&path, self.config.lookahead.min(depth - 1 - d).min(room - 1));
            room -= 1 + props.len();
            let (next, row) = self.draft.feed_node(x, parent_row, props)?;
            self.stats.proposed += next.proposals.len() as u64;
            fed = next;
            step.rows[main] = Some(row);
            at = main;
        }
        self.step = Some(step);
        Ok(tree)
    }

    fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) -> Result<()> {
        let Some(step) = self.step.take() else {
            // No forward this step: the root and everything emitted are still unfed.
            self.draft.unfed.extend(outcome.accepted.iter().map(|&n| tree.node(n).token));
            self.draft.unfed.push(outcome.bonus());
            return Ok(());
        };
        // Keep the unfed chain and the fed prefix of the accepted path; the rest (an unfed leaf,
        // a sibling, a node after one) is queued with the bonus token for the next step.
        let mut keep: Vec<usize> = (0..step.chain_len).collect();
        let mut unfed = Vec::new();
        for &n in &outcome.accepted {
            match (unfed.is_empty(), step.rows.get(n).copied().flatten()) {
                (true, Some(row)) => keep.push(row),
                _ => unfed.push(tree.node(n).token),
            }
        }
        unfed.push(outcome.bonus());
        self.draft.model.commit(&keep)?;
        self.draft.unfed = unfed;
        Ok(())
    }

    fn draft_forwards(&self) -> u64 {
        self.draft.forwards
    }

    fn extra_stats(&self) -> ExtraStats {
        let staged = StagedCounts { second_stage_acceptance: self.second_stage_acceptance() };
        ExtraStats { staged: Some(staged), ..ExtraStats::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toy::{ToyLm, ToyModel};

    #[test]
    fn bad_configs_name_the_knob() {
        let lm = || ToyLm::new(ToyModel::new(8, 1, 0), 64);
        for (c, knob) in [
            (StagedConfig { depth: 0, ..StagedConfig::default() }, "depth"),
            (StagedConfig { branch_width: 0, ..StagedConfig::default() }, "branch_width"),
            (StagedConfig { ngram_max: 0, ..StagedConfig::default() }, "ngram_max"),
        ] {
            let e = StagedDrafter::new(lm(), c).err().expect("invalid").to_string();
            assert!(e.contains(knob), "{e}");
        }
        assert!(StagedDrafter::new(lm(), StagedConfig::default()).is_ok());
    }
}
