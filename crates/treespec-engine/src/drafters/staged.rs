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

use std::collections::VecDeque;
use std::sync::Arc;

use treespec_core::ngram::{ContextIndex, NgramTable};
use treespec_core::rng::{Stream, StreamRng};
use treespec_core::sampling::Sampler;
use treespec_core::tree::{TokenTree, ROOT};
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;

use super::sample::{draw_children, SampleMode};
use crate::drafter::{Drafter, ProposeContext};
use crate::error::{EngineError, Result};
use crate::extra_stats::{ExtraStats, StagedCounts};
use crate::model::{CausalLm, TreeBatch};

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

/// A proposal fed to the draft: its token, row and the draft's logits after it.
struct Proposal {
    token: TokenId,
    row: usize,
    logits: Vec<f32>,
}

/// The staged drafter: a draft model accelerated by an n-gram second stage.
pub struct StagedDrafter<M: CausalLm> {
    model: M,
    config: StagedConfig,
    index: ContextIndex,
    unfed: Vec<TokenId>,
    step: Option<StepRows>,
    forwards: u64,
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
            model: draft,
            config,
            index,
            unfed: Vec::new(),
            step: None,
            forwards: 0,
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
        let vocab = self.model.vocab_size();
        if let Some(i) = out.iter().position(|&t| t as usize >= vocab) {
            out.truncate(i);
        }
        out
    }

    /// Feed `batch` (whose nodes with logits are the first `1 + proposals.len()` rows requested)
    /// and split the result into the node's logits and the proposal queue.
    fn forward_with_proposals(
        &mut self,
        batch: &TreeBatch,
        proposals: &[TokenId],
        first_proposal_row: usize,
    ) -> Result<(Vec<f32>, VecDeque<Proposal>)> {
        self.forwards += 1;
        let logits = self.model.forward(batch)?;
        if logits.rows() != 1 + proposals.len() {
            return Err(EngineError::State(format!(
                "staged: draft returned {} logits rows for {} requested",
                logits.rows(),
                1 + proposals.len()
            )));
        }
        self.stats.proposed += proposals.len() as u64;
        let queue = proposals
            .iter()
            .enumerate()
            .map(|(i, &token)| Proposal {
                token,
                row: first_proposal_row + i,
                logits: logits.row(1 + i).to_vec(),
            })
            .collect();
        Ok((logits.row(0).to_vec(), queue))
    }
}

impl<M: CausalLm> Drafter for StagedDrafter<M> {
    fn name(&self) -> &str {
        "staged"
    }

    fn begin(&mut self, prompt: &[TokenId], _: &Sampler, seed: u64) -> Result<()> {
        let (last, head) = prompt.split_last().ok_or(EngineError::EmptyPrompt)?;
        self.rng = StreamRng::new(seed, Stream::Draft);
        self.stats = StagedStats::default();
        self.step = None;
        self.forwards = 0;
        self.index.clear();
        self.model.truncate(0)?;
        self.model.prefill(head)?;
        self.unfed = vec![*last];
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
        if self.unfed.is_empty() {
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
        let chain_len = self.unfed.len();
        let base = self.model.pending_len();
        let mut batch = TreeBatch::chain(&self.unfed, None, base, true);
        for (i, &t) in props.iter().enumerate() {
            batch.push(t, Some(base + chain_len - 1 + i), true);
        }
        let (mut logits, mut queue) = self.forward_with_proposals(&batch, &props, base + chain_len)?;
        let mut rows: Vec<Option<usize>> = vec![Some(base + chain_len - 1)];

        let mut at = ROOT;
        for d in 1..=depth {
            let mut width = if d <= self.config.branch_depths { self.config.branch_width } else { 1 };
            // Keep room for the rest of the chain: siblings are the first thing to give up.
            width = width.min(ctx.max_nodes - tree.drafted() - (depth - d)).max(1);
            let kids = draw_children(
                &mut tree,
                at,
                &logits,
                &path,
                width,
                SampleMode::WithoutReplacement,
                ctx.sampler,
                &mut self.rng,
            )?;
            let Some(&main) = kids.first() else { break };
            rows.resize(tree.len(), None);
            self.stats.chain_tokens += 1;
            self.stats.siblings += kids.len() as u64 - 1;
            let x = tree.node(main).token;
            path.push(x);
            // The draft chose the next proposal itself: its row is this node's, for free.
            if queue.front().is_some_and(|p| p.token == x) {
                let p = queue.pop_front().expect("checked non-empty");
                rows[main] = Some(p.row);
                logits = p.logits;
                self.stats.used += 1;
                at = main;
                continue;
            }
            queue.clear();
            if d == depth {
                break;
            }
            if room == 0 {
                // No room left to feed the node: the chain ends here.
                break;
            }
            // One forward: x under its parent's row, plus fresh proposals after x.
            let parent_row =
                rows[at].ok_or_else(|| EngineError::State("staged: chain parent not fed".into()))?;
            let props = self.proposals(&path, self.config.lookahead.min(depth - 1 - d).min(room - 1));
            room -= 1 + props.len();
            let base = self.model.pending_len();
            let batch = TreeBatch::chain(&[&[x][..], &props].concat(), Some(parent_row), base, false);
            let (l, q) = self.forward_with_proposals(&batch, &props, base + 1)?;
            logits = l;
            queue = q;
            rows[main] = Some(base);
            at = main;
        }
        self.step = Some(StepRows { chain_len, rows });
        Ok(tree)
    }

    fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) -> Result<()> {
        let Some(step) = self.step.take() else {
            // No forward this step: the root and everything emitted are still unfed.
            self.unfed.extend(outcome.accepted.iter().map(|&n| tree.node(n).token));
            self.unfed.push(outcome.bonus());
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
        self.model.commit(&keep)?;
        self.unfed = unfed;
        Ok(())
    }

    fn draft_forwards(&self) -> u64 {
        self.forwards
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
