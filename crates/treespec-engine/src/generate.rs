//! The speculative generation loop: prefill → propose → score → verify → commit → emit.
//!
//! One step: the drafter proposes a token tree rooted at the last emitted token; the target scores
//! the whole tree in ONE forward pass; the verifier walks it and returns the accepted path plus a
//! bonus token; both models keep only the accepted path; the emitted tokens are checked against
//! the stop conditions and streamed out. Plain decoding is the same loop with an empty tree.

use std::time::Instant;

use treespec_core::dist::Dist;
use treespec_core::rng::{Stream, StreamRng};
use treespec_core::sampling::{Sampler, SamplingParams};
use treespec_core::stats::DecodeStats;
use treespec_core::tree::{Draw, NodeId, TokenTree, ROOT};
use treespec_core::verify::{verify, TargetDists, VerifyOutcome};
use treespec_core::TokenId;

use crate::constraint::TokenConstraint;
use crate::drafter::{Drafter, ProposeContext};
use crate::error::{EngineError, Result};
use crate::model::{CausalLm, Logits, TreeBatch};
use crate::stop::{FinishReason, StopConditions, StopScanner, TokenBytes};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Prompt tokens (already templated/tokenized).
    pub prompt: Vec<TokenId>,
    /// Most new tokens to emit (≥ 1).
    pub max_new_tokens: usize,
    /// Sampling parameters shared by draft and target.
    pub sampling: SamplingParams,
    /// Seed for the draft and verifier streams.
    pub seed: u64,
    /// When to stop.
    pub stop: StopConditions,
}

/// The result of one generation.
#[derive(Debug, Clone)]
pub struct GenerateOutput {
    /// Emitted token ids (without the end-of-generation token).
    pub tokens: Vec<TokenId>,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// With a stop string: the byte length the decoded text must be cut to.
    pub text_cut: Option<usize>,
    /// Statistics.
    pub stats: DecodeStats,
}

/// Run one generation. `on_tokens` receives each step's newly emitted tokens and returns false
/// to cancel. `bytes` is needed only for stop strings.
pub fn generate(
    target: &mut dyn CausalLm,
    drafter: &mut dyn Drafter,
    request: &GenerateRequest,
    bytes: Option<&dyn TokenBytes>,
    on_tokens: &mut dyn FnMut(&[TokenId]) -> bool,
) -> Result<GenerateOutput> {
    generate_constrained(target, drafter, request, None, bytes, on_tokens)
}

/// [`generate`] under a grammar: every target distribution is the grammar-masked one, tokens the
/// grammar forces are verified as a free chain, and generation ends where the grammar does.
pub fn generate_constrained(
    target: &mut dyn CausalLm,
    drafter: &mut dyn Drafter,
    request: &GenerateRequest,
    mut constraint: Option<&mut dyn TokenConstraint>,
    bytes: Option<&dyn TokenBytes>,
    on_tokens: &mut dyn FnMut(&[TokenId]) -> bool,
) -> Result<GenerateOutput> {
    let start = Instant::now();
    let sampler = Sampler::new(request.sampling.clone())?;
    validate(target, request, bytes)?;
    let context = target.context_size();
    let max_new = request.max_new_tokens.min(context - request.prompt.len() + 1);
    let vocab = target.vocab_size();
    // Token bytes are only looked at for stop strings.
    let bytes = bytes.filter(|_| !request.stop.stop_strings.is_empty());

    let mut stats = DecodeStats::default();
    let (_, head) = request.prompt.split_last().ok_or(EngineError::EmptyPrompt)?;
    let t = Instant::now();
    target.truncate(0)?;
    target.prefill(head)?;
    drafter.begin(&request.prompt, &sampler, request.seed)?;
    stats.times.prefill = t.elapsed();

    let mut verify_rng = StreamRng::new(request.seed, Stream::Verify);
    let mut history = request.prompt.clone();
    let mut out: Vec<TokenId> = Vec::new();
    let mut scanner = StopScanner::default();
    let mut finish = FinishReason::Length;

    'steps: while out.len() < max_new {
        // Positions left after the root (which sits at committed_len).
        let room = context.saturating_sub(target.committed_len() + 1);
        let ctx = ProposeContext {
            history: &history,
            max_nodes: room,
            max_depth: (max_new - out.len() - 1).min(room),
            sampler: &sampler,
        };
        let Some((tree, forced)) = propose(drafter, constraint.as_deref_mut(), &ctx, &mut stats)? else {
            finish = FinishReason::Eos;
            break 'steps;
        };

        let logits = score(target, &tree, vocab, drafter, &mut stats)?;

        let t = Instant::now();
        let mut rows = TreeRows {
            tree: &tree,
            logits: &logits,
            sampler: &sampler,
            history: &history,
            constraint: constraint.as_mut().map(|c| &mut **c as &mut dyn TokenConstraint),
        };
        let outcome = verify(&tree, &mut rows, sampler.is_greedy(), &mut verify_rng)?;
        stats.record_step(tree.drafted(), &outcome);
        stats.forced += forced.len() as u64;
        stats.times.verify += t.elapsed();

        let t = Instant::now();
        target.commit(&outcome.path())?;
        learn(drafter, constraint.as_deref_mut(), &tree, &outcome, !forced.is_empty(), &request.stop.eos)?;
        history.extend_from_slice(&outcome.tokens);
        let (emitted, reason) =
            emitted_tokens(&outcome.tokens, &request.stop, bytes, &mut scanner, max_new - out.len());
        finish = reason;
        out.extend_from_slice(&emitted);
        stats.times.overhead += t.elapsed();
        if !on_tokens(&emitted) {
            drafter.finish(&history);
            return Err(EngineError::Cancelled);
        }
        if finish != FinishReason::Length {
            break 'steps;
        }
    }
    // The history may hold tokens past a stop (the rest of the last step): finish with what was
    // emitted.
    history.truncate(request.prompt.len() + out.len());
    drafter.finish(&history);
    stats.new_tokens = out.len() as u64;
    stats.draft_forwards = drafter.draft_forwards();
    stats.wall = start.elapsed();
    Ok(GenerateOutput { tokens: out, finish_reason: finish, text_cut: scanner.cut_at, stats })
}

/// The step's tree: the grammar's forced chain when it forces tokens, else the drafter's
/// proposal. `None` when the grammar is complete (nothing but end of generation may follow).
fn propose(
    drafter: &mut dyn Drafter,
    constraint: Option<&mut (dyn TokenConstraint + '_)>,
    ctx: &ProposeContext,
    stats: &mut DecodeStats,
) -> Result<Option<(TokenTree, Vec<TokenId>)>> {
    let forced = match constraint {
        Some(c) if c.is_finished() => return Ok(None),
        Some(c) => c.forced(ctx.max_depth.min(ctx.max_nodes))?,
        None => Vec::new(),
    };
    let t = Instant::now();
    let tree = if forced.is_empty() { drafter.propose(ctx)? } else { forced_chain(ctx.root(), &forced)? };
    stats.times.draft += t.elapsed();
    check_tree(&tree, ctx)?;
    Ok(Some((tree, forced)))
}

/// One target forward over the whole tree. Its rows stay in the target's output buffer: the
/// verifier reads the ones it walks.
fn score<'t>(
    target: &'t mut dyn CausalLm,
    tree: &TokenTree,
    vocab: usize,
    drafter: &mut dyn Drafter,
    stats: &mut DecodeStats,
) -> Result<Logits<'t>> {
    let t = Instant::now();
    let logits = target.forward(&TreeBatch::from_tree(tree, 0))?;
    let target_time = t.elapsed();
    stats.times.target += target_time;
    drafter.observe_cost(tree.len(), target_time.as_secs_f64() * 1e3);
    if logits.rows() != tree.len() || logits.vocab() != vocab {
        return Err(EngineError::State(format!(
            "target returned {} rows of {} logits for a tree of {} nodes",
            logits.rows(),
            logits.vocab(),
            tree.len()
        )));
    }
    Ok(logits)
}

/// The step's tokens up to the first stop: an end-of-generation token (not emitted), a stop
/// string (emitted up to its end; the text is cut later), or `room` tokens.
fn emitted_tokens(
    tokens: &[TokenId],
    stop: &StopConditions,
    bytes: Option<&dyn TokenBytes>,
    scanner: &mut StopScanner,
    room: usize,
) -> (Vec<TokenId>, FinishReason) {
    let mut emitted = Vec::with_capacity(tokens.len());
    for &tok in tokens {
        if stop.eos.contains(&tok) {
            return (emitted, FinishReason::Eos);
        }
        emitted.push(tok);
        if let Some(b) = bytes {
            if scanner.push(&b.token_bytes(tok), &stop.stop_strings) {
                return (emitted, FinishReason::Stop);
            }
        }
        if emitted.len() == room {
            break;
        }
    }
    (emitted, FinishReason::Length)
}

fn validate(target: &dyn CausalLm, request: &GenerateRequest, bytes: Option<&dyn TokenBytes>) -> Result<()> {
    if request.prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    if request.max_new_tokens == 0 {
        return Err(EngineError::InvalidRequest("the number of new tokens must be ≥ 1".into()));
    }
    let vocab = target.vocab_size();
    if let Some(&t) = request.prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(EngineError::InvalidRequest(format!(
            "prompt token {t} is outside the vocabulary of size {vocab}"
        )));
    }
    if request.prompt.len() >= target.context_size() {
        return Err(EngineError::PromptTooLong {
            prompt: request.prompt.len(),
            context: target.context_size(),
        });
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
/// token is emitted (a tree may draft past one), so the grammar never sees it; a forced chain was
/// not the drafter's proposal, so it learns the tokens as plain steps.
fn learn(
    drafter: &mut dyn Drafter,
    constraint: Option<&mut (dyn TokenConstraint + '_)>,
    tree: &TokenTree,
    outcome: &VerifyOutcome,
    forced: bool,
    eos: &[TokenId],
) -> Result<()> {
    if let Some(c) = constraint {
        let end = outcome.tokens.iter().position(|t| eos.contains(t));
        c.commit(&outcome.tokens[..end.map_or(outcome.tokens.len(), |i| i + 1)])?;
    }
    if forced {
        observe_as_plain_steps(drafter, &outcome.tokens)
    } else {
        drafter.observe(tree, outcome)
    }
}

/// The grammar's forced tokens as a chain of deterministic drafts under the root: each has
/// probability 1 under the masked target, so the whole chain is accepted and the bonus token is
/// sampled after it.
fn forced_chain(root: TokenId, forced: &[TokenId]) -> Result<TokenTree> {
    let mut tree = TokenTree::new(root);
    let mut at = ROOT;
    for &t in forced {
        at = tree.add(at, t, Draw::Deterministic, 1.0)?;
    }
    Ok(tree)
}

/// The drafter did not propose a forced chain: it learns the emitted tokens as plain steps (a
/// root-only tree each), so its draft model stays in step and its acceptance statistics are not
/// skewed by drafts it never made.
fn observe_as_plain_steps(drafter: &mut dyn Drafter, tokens: &[TokenId]) -> Result<()> {
    let mut root = None;
    for &t in tokens {
        let tree = TokenTree::new(root.unwrap_or(t));
        let outcome = VerifyOutcome { accepted: Vec::new(), tokens: vec![t], depths: Vec::new() };
        drafter.observe(&tree, &outcome)?;
        root = Some(t);
    }
    Ok(())
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
