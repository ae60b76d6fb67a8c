//! One generation as a step machine: validate → prefill (by the caller) → begin → { propose →
//! (the caller scores the tree) → complete } … → finish.
//!
//! The machine owns everything per request — sampler, verifier stream, history, the text and its
//! stop strings, statistics — and never touches the target: the caller feeds the tree to the target and commits
//! the path the step returns. So one loop serves both [`generate`](crate::generate()) (one request
//! on its own target) and a batching scheduler that scores many requests' trees in one forward;
//! the request's output and its random streams are the same either way. Each step's outcome carries
//! the text it released, in runs of one provenance, so front ends only forward text.

use std::time::{Duration, Instant};

use treespec_core::dist::Dist;
use treespec_core::rng::{Stream, StreamRng};
use treespec_core::sampling::Sampler;
use treespec_core::stats::DecodeStats;
use treespec_core::tree::{NodeId, TokenTree, ROOT};
use treespec_core::verify::{verify, Choice, TargetDists, VerifyOutcome};
use treespec_core::TokenId;

use crate::backend::Logits;
use crate::backend::TokenBytes;
use crate::constraint::TokenConstraint;
use crate::drafter::{Cuttable, Drafter, ForwardCost, ProposeContext, Provenance};
use crate::error::{EngineError, Result};
use crate::generation_io::{GenerateOutput, GenerateRequest};
use crate::graft::{graft, replay};
use crate::stop::{FinishReason, StopConditions};
use crate::text_stream::TextStream;

/// The state of one generation between steps.
#[derive(Debug)]
pub struct Generation {
    /// Seeds the drafter's stream, and under reproducible sampling the target's noise (else the
    /// verifier's coins come from `verify_rng`).
    seed: u64,
    stop: StopConditions,
    sampler: Sampler,
    context: usize,
    vocab: usize,
    max_new: usize,
    start: Instant,
    stats: DecodeStats,
    verify_rng: StreamRng,
    /// The prompt, then every token emitted.
    history: Vec<TokenId>,
    prompt_len: usize,
    out: Vec<TokenId>,
    /// The emitted tokens' text, cut at the first stop string (its scanner decides `Stop`).
    text: TextStream,
    finish: Option<FinishReason>,
    /// The last step ended on an end-of-generation token ([`GenerateOutput::end_token`]).
    end_token: bool,
    /// The tree proposed this step, waiting for its scores.
    proposed: Option<Proposed>,
    /// Report log-probabilities of the emitted tokens, with this many alternatives each.
    logprobs: Option<usize>,
}

/// The log-probability of an emitted token under the distribution it was drawn from, and the
/// most likely alternatives there (OpenAI `logprobs` / `top_logprobs`).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The emitted token.
    pub token: TokenId,
    /// Its natural log-probability.
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, best first.
    pub top: Vec<(TokenId, f32)>,
}

#[derive(Debug)]
struct Proposed {
    tree: TokenTree,
    /// Forced tokens at the top of the tree (a grammar's chain).
    forced: usize,
    /// Under a forced chain: the drafter's own proposal (what it learns from).
    drafted: Option<TokenTree>,
}

/// Where the next tree goes: the target's state and the batch around the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProposeAt {
    /// Tokens the target holds (the tree's root sits at this position).
    pub committed: usize,
    /// Rows of other requests already in the same forward (0 alone).
    pub batch_rows: usize,
    /// Most drafted nodes, besides the context's own limit.
    pub cap: usize,
    /// A batch budget will cut the proposal with the other requests' (the drafter may offer
    /// its [`Cuttable`] values).
    pub batch_cut: bool,
}

impl ProposeAt {
    /// A request alone on its target, which holds `committed` tokens.
    pub fn alone(committed: usize) -> Self {
        Self { committed, batch_rows: 0, cap: usize::MAX, batch_cut: false }
    }
}

/// The forward that scored a step's tree.
#[derive(Debug, Clone, Copy)]
pub struct Scored<'l, 'a> {
    /// The target's logits for the tree, one row per node in node order.
    pub logits: &'l Logits<'a>,
    /// The whole forward (other requests' rows included when batched): cost-aware drafters
    /// learn the cost curve from it.
    pub forward: ForwardCost,
}

/// A run of released text whose tokens were produced the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextRun {
    /// How its tokens were produced.
    pub by: Provenance,
    /// The text.
    pub text: String,
    /// Tokens behind it (a token whose text was held back counts where its text comes out).
    pub tokens: usize,
}

/// What a completed step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutcome {
    /// Pending tree nodes the target must keep (`CausalLm::commit`): the accepted path, in tree
    /// arena order (node i of the tree is row i of the forward).
    pub path: Vec<usize>,
    /// Tokens emitted this step (after stop handling).
    pub emitted: Vec<TokenId>,
    /// True when the generation is over.
    pub done: bool,
    /// The emitted tokens' log-probabilities, when asked for ([`Generation::with_logprobs`]).
    pub logprobs: Vec<TokenLogprob>,
    /// The text this step released (whole characters, never the start of a possible stop
    /// string), in runs of one provenance; empty without token bytes.
    pub text: Vec<TextRun>,
}

impl StepOutcome {
    /// The text this step released, as one string.
    pub fn text(&self) -> String {
        self.text.iter().map(|r| r.text.as_str()).collect()
    }
}

impl Generation {
    /// Check `request` against a target of `context` positions and `vocab` tokens (and `bytes`,
    /// needed for stop strings) and set up its per-request state; the clock starts now.
    pub fn new(
        request: GenerateRequest,
        context: usize,
        vocab: usize,
        bytes: Option<&dyn TokenBytes>,
    ) -> Result<Self> {
        validate(context, vocab, &request, bytes)?;
        let GenerateRequest { prompt: history, max_new_tokens, sampling, seed, stop } = request;
        let sampler = Sampler::new(sampling)?;
        let max_new = max_new_tokens.min(context - history.len() + 1);
        let text = TextStream::new(&stop.stop_strings);
        Ok(Self {
            seed,
            stop,
            sampler,
            context,
            vocab,
            max_new,
            start: Instant::now(),
            stats: DecodeStats::default(),
            verify_rng: StreamRng::new(seed, Stream::Verify),
            prompt_len: history.len(),
            history,
            out: Vec::new(),
            text,
            finish: None,
            end_token: false,
            proposed: None,
            logprobs: None,
        })
    }

    /// Report each emitted token's log-probability and its `top` most likely alternatives. The
    /// distributions are the ones verification used (grammar mask and penalties included); this
    /// costs one pass over a row per emitted token.
    pub fn with_logprobs(mut self, top: usize) -> Self {
        self.logprobs = Some(top);
        self
    }

    /// What the target must hold before the first step: the prompt without its last token (the
    /// first tree's root).
    pub fn prompt_head(&self) -> &[TokenId] {
        &self.history[..self.prompt_len - 1]
    }

    /// The target read the prompt in `prefill` (counted as prefill time; a batched request's
    /// drafter begins before its prompt is in, see [`Generation::begin`]).
    pub fn prefilled(&mut self, prefill: Duration) {
        self.stats.times.prefill += prefill;
    }

    /// The prompt is in the target (it took `prefill` of its time), or (batched) on its way:
    /// start the drafter.
    pub fn begin(&mut self, drafter: &mut dyn Drafter, prefill: Duration) -> Result<()> {
        self.stats.times.prefill += prefill;
        let t = Instant::now();
        drafter.begin(&self.history[..self.prompt_len], &self.sampler, self.seed)?;
        self.stats.times.prefill += t.elapsed();
        Ok(())
    }

    /// True once the generation is over (length, end of generation, stop string, grammar).
    pub fn is_done(&self) -> bool {
        self.finish.is_some()
    }

    /// Propose this step's tree where `at` says the target and the batch stand. When the grammar
    /// forces tokens the tree is their chain, with what the drafter proposed past them grafted
    /// under it (`graft.rs`). `None` when the
    /// generation is over (nothing left to emit, or the grammar is complete). Row i of the
    /// returned tree is node i.
    pub fn propose(
        &mut self,
        drafter: &mut dyn Drafter,
        constraint: Option<&mut (dyn TokenConstraint + '_)>,
        at: ProposeAt,
    ) -> Result<Option<&TokenTree>> {
        if self.finish.is_some() {
            return Ok(None);
        }
        if self.out.len() >= self.max_new {
            self.finish = Some(FinishReason::Length);
            return Ok(None);
        }
        // Positions left after the root (which sits at `committed`).
        let room = self.context.saturating_sub(at.committed + 1).min(at.cap);
        let ctx = ProposeContext {
            history: &self.history,
            max_nodes: room,
            max_depth: (self.max_new - self.out.len() - 1).min(room),
            sampler: &self.sampler,
            batch_rows: at.batch_rows,
            batch_cut: at.batch_cut,
            eos: &self.stop.eos,
        };
        let Some(proposed) = propose(drafter, constraint, &ctx, &mut self.stats)? else {
            self.finish = Some(FinishReason::Eos);
            return Ok(None);
        };
        Ok(Some(&self.proposed.insert(proposed).tree))
    }

    /// The proposed tree as a batch budget may cut it: the drafter's [`Cuttable`] values, when
    /// it offers them for exactly this tree (never for a grammar's forced chain).
    pub fn cuttable<'d>(&self, drafter: &'d dyn Drafter) -> Option<Cuttable<'d>> {
        let proposed = self.proposed.as_ref().filter(|p| p.forced == 0)?;
        drafter.cuttable().filter(|c| c.values.len() == proposed.tree.drafted())
    }

    /// Keep only the proposed tree's first `drafted` drafted nodes (a batch budget's cut of a
    /// [`cuttable`](Self::cuttable) proposal).
    pub fn cut(&mut self, drafted: usize) -> Result<()> {
        let proposed = self
            .proposed
            .as_mut()
            .ok_or_else(|| EngineError::State("cut() without a proposed tree".into()))?;
        proposed.tree.truncate(drafted + 1)?;
        Ok(())
    }

    /// Committed tokens (prompt and accepted output) the next step's rows attend to.
    pub fn context_len(&self) -> usize {
        self.history.len()
    }

    /// The proposed tree (after any cut), waiting for its scores.
    pub fn proposed(&self) -> Option<&TokenTree> {
        self.proposed.as_ref().map(|p| &p.tree)
    }

    /// Finish the step on the forward that `scored` the proposed tree: verify, learn, emit the
    /// accepted tokens up to a stop, and release their text (decoded with `bytes`).
    pub fn complete(
        &mut self,
        drafter: &mut dyn Drafter,
        mut constraint: Option<&mut (dyn TokenConstraint + '_)>,
        scored: Scored<'_, '_>,
        bytes: Option<&dyn TokenBytes>,
    ) -> Result<StepOutcome> {
        let Scored { logits, forward } = scored;
        let Proposed { tree, forced, drafted } = self
            .proposed
            .take()
            .ok_or_else(|| EngineError::State("complete() without a proposed tree".into()))?;
        self.stats.times.target += forward.time;
        self.stats.graph_reuses += u64::from(forward.graph_reused == Some(true));
        drafter.observe_cost(forward);
        if logits.rows() != tree.len() || logits.vocab() != self.vocab {
            return Err(EngineError::State(format!(
                "target returned {} rows of {} logits for a tree of {} nodes",
                logits.rows(),
                logits.vocab(),
                tree.len()
            )));
        }
        let t = Instant::now();
        let mut rows = TreeRows {
            tree: &tree,
            logits,
            sampler: &self.sampler,
            history: &self.history,
            constraint: constraint.as_mut().map(|c| &mut **c as &mut dyn TokenConstraint),
        };
        // Seeded: the target's token at each position is fixed by (seed, position), so every
        // method emits plain decoding's tokens (`Choice::Seeded`).
        let choice = Choice::for_sampler(&self.sampler, self.seed, self.history.len(), &mut self.verify_rng);
        let outcome = verify(&tree, &mut rows, choice)?;
        let logprobs = match self.logprobs {
            Some(top) => token_logprobs(&mut rows, &outcome, top)?,
            None => Vec::new(),
        };
        self.stats.record_step(tree.drafted(), &outcome);
        self.stats.forced += forced as u64;
        self.stats.times.verify += t.elapsed();

        let source = drafter.source();
        let t = Instant::now();
        learn(drafter, constraint, &tree, &outcome, drafted.as_ref(), &self.stop.eos)?;
        self.history.extend_from_slice(&outcome.tokens);
        let by = |j: usize| match j {
            j if j < forced.min(outcome.accepted.len()) => Provenance::Forced,
            j if j < outcome.accepted.len() => source,
            _ => Provenance::Target,
        };
        let room = self.max_new - self.out.len();
        let Emitted { tokens: emitted, reason, text } =
            emit(&outcome.tokens, by, &self.stop.eos, bytes, &mut self.text, room);
        self.out.extend_from_slice(&emitted);
        self.end_token = reason == FinishReason::Eos;
        if reason != FinishReason::Length || self.out.len() >= self.max_new {
            self.finish = Some(reason);
        }
        self.stats.times.overhead += t.elapsed();
        let mut logprobs = logprobs;
        logprobs.truncate(emitted.len());
        Ok(StepOutcome { path: outcome.path(), emitted, done: self.finish.is_some(), logprobs, text })
    }

    /// End the generation: the drafter learns the text (prompt and emitted tokens).
    pub fn finish(mut self, drafter: &mut dyn Drafter) -> GenerateOutput {
        // The history may hold tokens past a stop (the rest of the last step).
        self.history.truncate(self.prompt_len + self.out.len());
        drafter.finish(&self.history);
        let mut stats = self.stats;
        stats.new_tokens = self.out.len() as u64;
        stats.draft_forwards = drafter.draft_forwards();
        stats.wall = self.start.elapsed();
        let tail = self.text.finish();
        GenerateOutput {
            tokens: self.out,
            finish_reason: self.finish.unwrap_or(FinishReason::Length),
            end_token: self.end_token,
            text_cut: self.text.cut_at(),
            text: self.text.released(),
            tail,
            stopped_by: self.text.stopped_by().map(String::from),
            stats,
        }
    }

    /// End a cancelled generation (the drafter still learns what was emitted).
    pub fn cancel(self, drafter: &mut dyn Drafter) {
        let _ = self.finish(drafter);
    }
}

/// The step's tree: the drafter's proposal, under the grammar's forced chain when it forces
/// tokens ([`graft`]). `None` when the grammar is complete (nothing but end of generation may
/// follow).
fn propose(
    drafter: &mut dyn Drafter,
    constraint: Option<&mut (dyn TokenConstraint + '_)>,
    ctx: &ProposeContext,
    stats: &mut DecodeStats,
) -> Result<Option<Proposed>> {
    let forced = match constraint {
        Some(c) if c.is_finished() => return Ok(None),
        Some(c) => c.forced(ctx.max_depth.min(ctx.max_nodes))?,
        None => Vec::new(),
    };
    let t = Instant::now();
    let drafted = drafter.propose(ctx)?;
    let proposed = if forced.is_empty() {
        Proposed { tree: drafted, forced: 0, drafted: None }
    } else {
        Proposed { tree: graft(ctx.root(), &forced, &drafted)?, forced: forced.len(), drafted: Some(drafted) }
    };
    stats.times.draft += t.elapsed();
    check_tree(&proposed.tree, ctx)?;
    Ok(Some(proposed))
}

/// A step's emitted tokens, why they ended, and the text they released.
struct Emitted {
    tokens: Vec<TokenId>,
    reason: FinishReason,
    text: Vec<TextRun>,
}

/// The step's tokens up to the first stop: an end-of-generation token (not emitted), a stop
/// string (emitted up to its end; the text is cut there), or `room` tokens. Their bytes go into
/// `text` (when there are `bytes` to decode with), and what each run of one provenance (`by`
/// token index) releases is credited to it — text held back for a stop string or a split
/// character goes out with a later run.
fn emit(
    tokens: &[TokenId],
    by: impl Fn(usize) -> Provenance,
    eos: &[TokenId],
    bytes: Option<&dyn TokenBytes>,
    text: &mut TextStream,
    room: usize,
) -> Emitted {
    let mut out =
        Emitted { tokens: Vec::with_capacity(tokens.len()), reason: FinishReason::Length, text: Vec::new() };
    let mut unreleased = 0;
    for (j, &tok) in tokens.iter().enumerate() {
        if eos.contains(&tok) {
            out.reason = FinishReason::Eos;
            break;
        }
        if j > 0 && by(j) != by(j - 1) {
            release(text, by(j - 1), &mut unreleased, &mut out.text);
        }
        out.tokens.push(tok);
        unreleased += 1;
        if bytes.is_some_and(|b| text.push(&b.token_bytes(tok))) {
            out.reason = FinishReason::Stop;
            break;
        }
        if out.tokens.len() == room {
            break;
        }
    }
    if let Some(last) = out.tokens.len().checked_sub(1) {
        release(text, by(last), &mut unreleased, &mut out.text);
    }
    out
}

/// Take what `text` released and credit it, with the `unreleased` tokens behind it, to a run of
/// `by` (joined to the last run when that has the same provenance).
fn release(text: &mut TextStream, by: Provenance, unreleased: &mut usize, runs: &mut Vec<TextRun>) {
    let released = text.take();
    if released.is_empty() {
        return;
    }
    let tokens = std::mem::take(unreleased);
    match runs.last_mut() {
        Some(last) if last.by == by => {
            last.text.push_str(&released);
            last.tokens += tokens;
        }
        _ => runs.push(TextRun { by, text: released, tokens }),
    }
}

fn validate(
    context: usize,
    vocab: usize,
    request: &GenerateRequest,
    bytes: Option<&dyn TokenBytes>,
) -> Result<()> {
    if request.prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    if request.max_new_tokens == 0 {
        return Err(EngineError::InvalidRequest("the number of new tokens must be ≥ 1".into()));
    }
    if let Some(&t) = request.prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(EngineError::InvalidRequest(format!(
            "prompt token {t} is outside the vocabulary of size {vocab}"
        )));
    }
    if request.prompt.len() >= context {
        return Err(EngineError::PromptTooLong { prompt: request.prompt.len(), context });
    }
    if !request.stop.stop_strings.is_empty() && bytes.is_none() {
        return Err(EngineError::InvalidRequest("stop strings need a tokenizer to match against".into()));
    }
    Ok(())
}

/// A drafter must return a tree rooted at the current root, within the room it was given.
fn check_tree(tree: &TokenTree, ctx: &ProposeContext) -> Result<()> {
    if tree.node(0).token != ctx.root() {
        return Err(EngineError::State(format!(
            "drafter returned a tree rooted at token {} instead of {}",
            tree.node(0).token,
            ctx.root()
        )));
    }
    if tree.drafted() > ctx.max_nodes || tree.max_depth() > ctx.max_depth {
        return Err(EngineError::State(format!(
            "drafter returned {} nodes / depth {} beyond the limit of {} nodes / depth {}",
            tree.drafted(),
            tree.max_depth(),
            ctx.max_nodes,
            ctx.max_depth
        )));
    }
    Ok(())
}

/// The grammar and the drafter take in the step's outcome. Nothing after an end-of-generation
/// token is emitted (a tree may draft past one), so the grammar never sees it; under a forced
/// chain the drafter learns from its own proposal `drafted` ([`replay`]).
fn learn(
    drafter: &mut dyn Drafter,
    constraint: Option<&mut (dyn TokenConstraint + '_)>,
    tree: &TokenTree,
    outcome: &VerifyOutcome,
    drafted: Option<&TokenTree>,
    eos: &[TokenId],
) -> Result<()> {
    if let Some(c) = constraint {
        let end = outcome.tokens.iter().position(|t| eos.contains(t));
        c.commit(&outcome.tokens[..end.map_or(outcome.tokens.len(), |i| i + 1)])?;
    }
    match drafted {
        Some(drafted) => replay(drafter, drafted, &outcome.tokens),
        None => drafter.observe(tree, outcome),
    }
}

/// Each emitted token's log-probability at the node it was drawn from: the root for the first
/// token, then each accepted node for the next one.
fn token_logprobs(
    rows: &mut TreeRows<'_, '_>,
    outcome: &VerifyOutcome,
    top: usize,
) -> Result<Vec<TokenLogprob>> {
    let mut out = Vec::with_capacity(outcome.tokens.len());
    for (j, &token) in outcome.tokens.iter().enumerate() {
        let node = if j == 0 { ROOT } else { outcome.accepted[j - 1] };
        let context = rows.context(node);
        let row = rows.row(node)?;
        let lp = rows.sampler.log_probs(&row, &context)?;
        let mut best: Vec<(TokenId, f32)> = Vec::new();
        if top > 0 {
            let mut order: Vec<usize> = (0..lp.len()).filter(|&i| lp[i].is_finite()).collect();
            let k = top.min(order.len());
            if k > 0 {
                order.select_nth_unstable_by(k - 1, |&a, &b| lp[b].total_cmp(&lp[a]));
                order.truncate(k);
                order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]));
            }
            best = order.into_iter().map(|i| (i as TokenId, lp[i])).collect();
        }
        out.push(TokenLogprob { token, logprob: lp[token as usize], top: best });
    }
    Ok(out)
}

/// The target's processed distributions for the rows of one verify batch, computed on demand
/// (grammar-masked under a constraint).
struct TreeRows<'a, 'c> {
    tree: &'a TokenTree,
    logits: &'a Logits<'a>,
    sampler: &'a Sampler,
    history: &'a [TokenId],
    constraint: Option<&'c mut (dyn TokenConstraint + 'c)>,
}

impl TreeRows<'_, '_> {
    /// The token history a row's distribution is conditioned on (for the repetition penalty):
    /// only the last `penalty_last_n` tokens of history + path, the ones the penalty looks at.
    fn context(&self, node: NodeId) -> Vec<TokenId> {
        let window = self.sampler.context_window();
        if window == 0 {
            return Vec::new();
        }
        let mut c = self.history[self.history.len().saturating_sub(window)..].to_vec();
        c.extend(self.tree.path_tokens(node));
        c
    }
}

impl<'a> TreeRows<'a, '_> {
    /// The node's target row, masked by the grammar state after its path when constrained.
    fn row(&mut self, node: NodeId) -> treespec_core::Result<std::borrow::Cow<'a, [f32]>> {
        let logits: &'a Logits<'a> = self.logits;
        let row = logits.row(node);
        let Some(c) = self.constraint.as_deref_mut() else { return Ok(std::borrow::Cow::Borrowed(row)) };
        let mut masked = row.to_vec();
        c.mask_logits(&self.tree.path_tokens(node), &mut masked)
            .map_err(|e| treespec_core::Error::Invalid(format!("grammar: {e}")))?;
        Ok(std::borrow::Cow::Owned(masked))
    }
}

impl TargetDists for TreeRows<'_, '_> {
    fn dist(&mut self, node: NodeId) -> treespec_core::Result<Dist> {
        let context = self.context(node);
        let row = self.row(node)?;
        self.sampler.distribution(&row, &context)
    }
    fn greedy(&mut self, node: NodeId) -> treespec_core::Result<TokenId> {
        let context = self.context(node);
        let row = self.row(node)?;
        self.sampler.greedy_token(&row, &context)
    }
}
