//! `--method auto`: per step, the proposal with the best expected gain — a free suffix draft
//! (this request's and earlier requests' text), a long exact match's chain (llama.cpp's
//! ngram-mod kind, [`long_match`]), DySpec's cost-aware tree over the draft model, or nothing
//! (plain decoding) — each predicted on the measured cost curves and the learned prices, and
//! each prediction read through what that policy's steps really brought ([`PolicyBandit`]):
//! where the curve or the prices are wrong on this machine or this text, measured time and
//! tokens overrule them within the request (and, through the tenant's books, for the next).
//!
//! Every step the free proposals come first (they cost nothing); each is priced with its own
//! acceptance estimate and cut to its best prefix. The draft model runs only if an optimistic
//! bound on what it could add beats the best free one. Under greedy decoding the finished trees
//! are compared and the better one is verified. Under sampling the choice must not depend on the
//! model tree's own draws (that would bias them), so once the bound says the model may win, its
//! tree is verified whatever it turned out to be; free drafts are deterministic candidates,
//! exact in either case. The choice itself reads only earlier steps' outcomes, so it is lossless
//! whatever the books say. `--decision-trace FILE` writes each step's offers and outcome
//! ([`trace`]).

mod bet_cap;
mod long_match;
mod trace;

pub use trace::DecisionTrace;

use std::sync::Arc;
use std::time::{Duration, Instant};

use treespec_core::budget::Economics;
use treespec_core::policy_bandit::{Policy, PolicyBandit, Prediction, Realised};
use treespec_core::sampling::Sampler;
use treespec_core::tree::{Draw, TokenTree, ROOT};
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;

use self::bet_cap::BetCap;
use self::long_match::LongMatch;
use self::trace::{Offer, StepTrace};
use super::{DySpecConfig, DySpecDrafter, SuffixConfig, SuffixDrafter, SuffixShared};
use crate::auto_budget::SharedCosts;
use crate::backend::CausalLm;
use crate::drafter::{Cuttable, Drafter, ForwardCost, ProposeContext, Provenance};
use crate::error::{EngineError, Result};
use crate::extra_stats::{AutoChoices, ExtraStats};
use crate::method_kind::MethodKind;

/// Knobs of the `auto` method.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoConfig {
    /// The measured cost curves (required), shared with every drafter of this method.
    pub costs: Arc<SharedCosts>,
    /// The free proposal's knobs (its `costs` are set from `costs`).
    pub suffix: SuffixConfig,
    /// The model proposal's knobs (its `costs` are set from `costs`).
    pub dyspec: DySpecConfig,
    /// Where each step's decision is traced, if anywhere.
    pub trace: Option<DecisionTrace>,
}

/// Steps between chances for a gated-off draft model to show it pays after all.
const MODEL_RECHECK_EVERY: u64 = 64;

/// A step proposed and not yet observed: what was chosen and predicted, for the books.
struct Pending {
    policy: Policy,
    predicted: Prediction,
    /// The chosen proposal's node values, when a batch budget may cut it (the prediction is
    /// then re-read for the nodes kept).
    values: Option<Vec<f64>>,
    started: Instant,
    forward: Option<(usize, f64)>,
    graph_reused: Option<bool>,
    trace: Option<StepTrace>,
}

/// The `auto` drafter.
pub struct AutoDrafter<M: CausalLm> {
    suffix: SuffixDrafter,
    model: Option<DySpecDrafter<M>>,
    long: LongMatch,
    shared: Arc<SuffixShared>,
    bandit: PolicyBandit,
    pending: Option<Pending>,
    trace: Option<DecisionTrace>,
    choice: Policy,
    counts: [u64; 4],
    combined: u64,
    steps: u64,
    /// The most nodes a free policy may bet in this request now. One cap for both free
    /// policies: each copies the same text, so what one showed of it holds for the other.
    cap: BetCap,
    /// Serving in a continuous batch ([`Drafter::join_batch`]): a step is booked at its share
    /// of the batch's forward, not at its wall time.
    batched: bool,
    /// The curves are another machine's ([`crate::auto_budget::CostModel::elsewhere`]): a step
    /// is booked at the curve's time, not this machine's wall time, so the choices are the ones
    /// that machine would make.
    curve_time: bool,
}

impl<M: CausalLm> AutoDrafter<M> {
    /// An `auto` drafter; `draft` is optional (free drafts or plain decoding only without it).
    pub fn new(draft: Option<M>, config: AutoConfig) -> Result<Self> {
        let shared = config.suffix.shared.clone();
        let curve_time = config.costs.initial().elsewhere;
        let suffix = SuffixDrafter::new(SuffixConfig { costs: Some(config.costs.clone()), ..config.suffix })?;
        let model = match draft {
            Some(d) => {
                if config.costs.initial().draft.is_none() {
                    return Err(EngineError::InvalidRequest(
                        "auto: a draft model needs its measured cost curve".into(),
                    ));
                }
                let dyspec = DySpecConfig { costs: Some(config.costs.clone()), ..config.dyspec };
                Some(DySpecDrafter::new(d, dyspec)?)
            }
            None => None,
        };
        Ok(Self {
            suffix,
            model,
            long: LongMatch::new(),
            shared,
            bandit: PolicyBandit::new(),
            pending: None,
            trace: config.trace,
            choice: Policy::Plain,
            counts: [0; 4],
            combined: 0,
            steps: 0,
            cap: BetCap::new(),
            batched: false,
            curve_time,
        })
    }

    /// The free offers of this step, plain decoding first: (policy, tree, prediction, values).
    fn free_offers(&mut self, ctx: &ProposeContext, suffix_tree: TokenTree) -> Result<Vec<Candidate>> {
        let econ = self.suffix.economics().expect("auto's suffix drafter has the cost curves");
        let mut offers = vec![Candidate {
            policy: Policy::Plain,
            tree: TokenTree::new(ctx.root()),
            predicted: Prediction { tokens: 1.0, ms: econ.ms(0) },
            values: Some(Vec::new()),
            probe: false,
        }];
        if suffix_tree.drafted() > 0 {
            let values = self.suffix.cuttable().map(|c| c.values.to_vec());
            let ms = econ.ms(suffix_tree.drafted());
            let tokens = values
                .as_ref()
                .map_or(self.suffix.last_gain() + econ.rate * ms, |v| 1.0 + v.iter().sum::<f64>());
            let predicted = Prediction { tokens, ms };
            let offer =
                Candidate { policy: Policy::Suffix, tree: suffix_tree, predicted, values, probe: false };
            offers.extend(self.capped(offer, &econ)?);
        }
        let room = ctx.max_depth.min(ctx.max_nodes);
        let (chain, values) = self.long.propose(ctx.history, room, ctx.eos);
        let (n, _) = econ.best_prefix(&values);
        if n > 0 {
            let mut tree = TokenTree::new(ctx.root());
            for (i, &t) in chain[..n].iter().enumerate() {
                tree.add(i, t, Draw::Deterministic, values[i] as f32)?;
            }
            let tokens = 1.0 + values[..n].iter().sum::<f64>();
            let predicted = Prediction { tokens, ms: econ.ms(n) };
            let offer = Candidate {
                policy: Policy::LongMatch,
                tree,
                predicted,
                values: Some(values[..n].to_vec()),
                probe: false,
            };
            offers.extend(self.capped(offer, &econ)?);
        }
        Ok(offers)
    }

    /// `offer` as this request may bet it: whole when it fits the free policies' cap here
    /// (`cap`), else cut to its best prefix of at most that many nodes on the curve (None
    /// when not even that pays). Its nodes are in value order, parents first, so a prefix is a
    /// tree.
    fn capped(&self, mut offer: Candidate, econ: &Economics<'_>) -> Result<Option<Candidate>> {
        let Some(values) = offer.values.as_ref() else { return Ok(Some(offer)) };
        let allowed = self.cap.nodes();
        if values.len() <= allowed {
            return Ok(Some(offer));
        }
        let (n, _) = econ.best_prefix(&values[..allowed]);
        if n == 0 {
            return Ok(None);
        }
        offer.tree.truncate(n + 1)?;
        let kept = values[..n].to_vec();
        offer.predicted = Prediction { tokens: 1.0 + kept.iter().sum::<f64>(), ms: econ.ms(n) };
        offer.values = Some(kept);
        offer.probe = true;
        Ok(Some(offer))
    }

    fn offer(&self, c: &Candidate, rate: f64) -> Offer {
        Offer {
            policy: c.policy,
            nodes: c.tree.drafted(),
            predicted: c.predicted,
            correction: self.bandit.correction(c.policy, c.predicted),
            score: self.bandit.score(c.policy, c.predicted, rate),
            probe: c.probe,
        }
    }

    /// What the verified step cost this request, in ms: alone, its wall time from proposal to
    /// verification (the curve's time when the curves are another machine's); in a batch, its
    /// predicted share of the forward scaled by how the whole forward's time compared with the
    /// curve. The curve is read at the request's context, as the prediction was: read on the
    /// profiled short cache, a forward on a long one looked slower than the curve by the
    /// context's whole share (16 rows at 800 tokens: 176 ms against 144 on Zen 5, where the
    /// curve at that context says 168), which a batch booked as every policy's steps running
    /// late, and the trace showed as a curve that was wrong.
    fn step_ms(&self, pending: &Pending, predicted_ms: f64) -> (f64, usize, f64, f64) {
        let (rows, forward_ms) = pending.forward.unwrap_or((0, 0.0));
        let curve_ms = self.suffix.economics().map_or(0.0, |e| e.forward_ms(rows.max(1)));
        let ms = if self.curve_time {
            predicted_ms
        } else if self.batched && curve_ms > 0.0 {
            predicted_ms * forward_ms / curve_ms
        } else {
            pending.started.elapsed().as_secs_f64() * 1e3
        };
        (ms, rows, forward_ms, curve_ms)
    }

    /// Choice among the free offers (ties go to the earlier offer: plain decoding, then the
    /// suffix draft), keeping the suffix draft's tree for a graft when it lost.
    fn choose_free(&self, mut offers: Vec<Candidate>, rate: f64) -> FreeChoice {
        let on_offer: Vec<_> = offers.iter().map(|c| (c.policy, c.predicted)).collect();
        let best_free = self.bandit.choose(&on_offer, rate);
        let traced: Vec<Offer> = match self.trace {
            Some(_) => offers.iter().map(|c| self.offer(c, rate)).collect(),
            None => Vec::new(),
        };
        let best = offers.swap_remove(best_free);
        let suffix_tree = offers.into_iter().find(|c| c.policy == Policy::Suffix).map(|c| c.tree);
        FreeChoice { best, suffix_tree, traced }
    }

    /// The model's tree, drafted to beat `bar` (the best free offer's gain), or None while the
    /// model sits idle. A draft model that cannot pay even along its best chain (in a batch: on
    /// the batch's rate, which its drafting time holds up for every request) stays idle, apart
    /// from a rare step that lets its calibration see whether the text got easier (its own step
    /// declines where not even a perfect draft could pay, catch-up of a deferred start included).
    fn model_offer(&mut self, ctx: &ProposeContext, bar: f64) -> Result<Option<Candidate>> {
        if let Some(m) = self.model.as_mut() {
            m.set_forward(ctx.batch_rows, ctx.history.len());
        }
        let steps = self.steps;
        let model =
            self.model.as_mut().filter(|m| m.chain_can_pay() || steps.is_multiple_of(MODEL_RECHECK_EVERY));
        let Some(m) = model else { return Ok(None) };
        m.set_bar(bar);
        let tree = m.propose(ctx)?;
        let ms = self.suffix.economics().map_or(0.0, |e| e.ms(tree.drafted()));
        let predicted = Prediction { tokens: m.last_expected(), ms };
        Ok(Some(Candidate { policy: Policy::Model, predicted, tree, values: None, probe: false }))
    }

    /// The model's tree against the best free offer: under greedy decoding the better of the
    /// two; under sampling the model's whenever it drafted (it ran only because its bound beat
    /// the bar: its tree is verified as drawn). A losing model tree is discarded.
    fn model_or_free(
        &mut self,
        ctx: &ProposeContext,
        best: Candidate,
        model: Candidate,
        suffix_tree: Option<TokenTree>,
        rate: f64,
    ) -> Result<Candidate> {
        let pair = [(best.policy, best.predicted), (Policy::Model, model.predicted)];
        let model_wins =
            model.tree.drafted() > 0 && (!ctx.sampler.is_greedy() || self.bandit.choose(&pair, rate) == 1);
        if !model_wins {
            self.model.as_mut().expect("the model proposed").discard_proposal(model.tree.len());
            return Ok(best);
        }
        let suffix_tree = if best.policy == Policy::Suffix { Some(best.tree) } else { suffix_tree };
        match suffix_tree.filter(|_| ctx.sampler.is_greedy()) {
            Some(suffix_tree) => self.grafted(model, &suffix_tree, rate),
            None => Ok(model),
        }
    }

    /// Greedy: the model's tree with the suffix draft's nodes grafted on, if they pay.
    fn grafted(&mut self, mut best: Candidate, suffix_tree: &TokenTree, rate: f64) -> Result<Candidate> {
        let gain = best.predicted.tokens - rate * best.predicted.ms;
        if let Some((combined, _)) = graft(&best.tree, gain, suffix_tree, &self.suffix)? {
            best.predicted.ms = self.suffix.economics().map_or(0.0, |e| e.ms(combined.drafted()));
            best.tree = combined;
            self.combined += 1;
        }
        Ok(best)
    }

    /// The chosen proposal counted and held as pending (with its trace) until [`Self::book`]
    /// reads its outcome; returns its tree.
    fn book_choice(
        &mut self,
        ctx: &ProposeContext,
        best: Candidate,
        offers: Vec<Offer>,
        rate: f64,
        started: Instant,
        catch_up: Duration,
    ) -> TokenTree {
        if best.policy != Policy::Suffix {
            self.suffix.discard_proposal();
        }
        self.choice = best.policy;
        self.counts[best.policy as usize] += 1;
        let trace = self.trace.as_ref().map(|_| StepTrace {
            step: self.steps,
            context: ctx.history.len(),
            batch_rows: ctx.batch_rows,
            rate,
            long_match_chain: self.long.last_chain_len(),
            long_match_acceptance: self.long.acceptance(),
            bet_cap: self.cap.nodes(),
            offers,
            chosen: best.policy,
            verified_nodes: 0,
            emitted: 0,
            forward_rows: 0,
            forward_ms: 0.0,
            curve_ms: 0.0,
            step_ms: 0.0,
            catch_up_ms: catch_up.as_secs_f64() * 1e3,
            graph_reused: None,
        });
        self.pending = Some(Pending {
            policy: best.policy,
            predicted: best.predicted,
            values: best.values,
            started,
            forward: None,
            graph_reused: None,
            trace,
        });
        best.tree
    }

    /// Book the verified step for its policy (and trace it).
    fn book(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) {
        let Some(mut pending) = self.pending.take() else { return };
        let drafted = tree.drafted();
        let predicted = match (&pending.values, self.suffix.economics()) {
            (Some(v), Some(econ)) if drafted <= v.len() => {
                Prediction { tokens: 1.0 + v[..drafted].iter().sum::<f64>(), ms: econ.ms(drafted) }
            }
            _ => pending.predicted,
        };
        let (ms, rows, forward_ms, curve_ms) = self.step_ms(&pending, predicted.ms);
        let realised = Realised { tokens: outcome.tokens.len() as f64, ms };
        self.bandit.record(pending.policy, predicted, realised);
        // A model tree taken whole says the text is predictable, not that it is a copy: only the
        // free policies' own steps move their cap.
        if drafted > 0 && pending.policy != Policy::Model {
            let accepted = outcome.tokens.len().saturating_sub(1);
            self.cap.after_step(accepted, tree.max_depth(), realised.tokens >= predicted.tokens);
        }
        if let (Some(trace), Some(mut step)) = (self.trace.as_ref(), pending.trace.take()) {
            step.verified_nodes = drafted;
            step.emitted = outcome.tokens.len();
            step.forward_rows = rows;
            step.forward_ms = forward_ms;
            step.curve_ms = curve_ms;
            step.step_ms = ms;
            step.graph_reused = pending.graph_reused;
            trace.write(&step);
        }
    }
}

/// The free offers' outcome: the best of them, the suffix draft's tree when it was not the best
/// (a model tree may still graft it), and the offers as traced.
struct FreeChoice {
    best: Candidate,
    suffix_tree: Option<TokenTree>,
    traced: Vec<Offer>,
}

/// One policy's proposal at a step.
struct Candidate {
    policy: Policy,
    tree: TokenTree,
    predicted: Prediction,
    values: Option<Vec<f64>>,
    /// Cut to what this request lets its policy bet (see [`BetCap`]).
    probe: bool,
}

impl<M: CausalLm> Drafter for AutoDrafter<M> {
    fn kind(&self) -> MethodKind {
        MethodKind::Auto
    }

    /// The proposal the last step verified: free ones are copies, the model's a draft.
    fn source(&self) -> Provenance {
        match self.choice {
            Policy::Model => Provenance::Drafted,
            _ => Provenance::Copied,
        }
    }

    fn join_batch(&mut self) {
        self.batched = true;
    }

    /// The draft model starts without the text, alone as in a batch: it gets it only when a
    /// step finds that the model's extra tokens over the tokens still to come (at most as many
    /// as the answer has had so far) pay for that prefill. In a batch the prefill would stall
    /// every other request's step; alone it delays the first token. A prefill at the start,
    /// whenever a perfect draft could pay, read a 1,700-token RAG prompt into a model that never
    /// drafted: the first token 2.4 s later on a 2-core Zen 5, where the 0.5B draft's perfect
    /// chain pays, but not enough to repay that prefill.
    fn begin(&mut self, prompt: &[TokenId], sampler: &Sampler, seed: u64) -> Result<()> {
        self.suffix.begin(prompt, sampler, seed)?;
        self.long.begin(prompt);
        self.bandit = PolicyBandit::carried_from(&self.shared.policies());
        self.pending = None;
        self.counts = [0; 4];
        self.combined = 0;
        self.steps = 0;
        self.cap = BetCap::new();
        if let Some(m) = self.model.as_mut() {
            m.set_forward(0, prompt.len());
            m.begin_deferred(seed, prompt.len());
        }
        Ok(())
    }

    /// One step in phases: the free offers and the choice among them, the model's tree when it
    /// may beat that choice (with the suffix draft grafted on under greedy decoding), then the
    /// choice booked as pending until its outcome is observed.
    fn propose(&mut self, ctx: &ProposeContext) -> Result<TokenTree> {
        let mut started = Instant::now();
        let suffix_tree = self.suffix.propose(ctx)?;
        self.steps += 1;
        let rate = self.suffix.economics().map_or(0.0, |e| e.rate);
        let offers = self.free_offers(ctx, suffix_tree)?;
        let FreeChoice { mut best, suffix_tree, mut traced } = self.choose_free(offers, rate);
        if let Some(model) = self.model_offer(ctx, best.predicted.tokens - rate * best.predicted.ms)? {
            if self.trace.is_some() && model.tree.drafted() > 0 {
                traced.push(self.offer(&model, rate));
            }
            best = self.model_or_free(ctx, best, model, suffix_tree, rate)?;
        }
        // A catch-up is a one-off that its rule priced over the steps left: the step is booked
        // (and the model's policy judged) without it.
        let catch_up = self.model.as_mut().map_or(Duration::ZERO, |m| m.take_catch_up());
        started += catch_up;
        Ok(self.book_choice(ctx, best, traced, rate, started, catch_up))
    }

    /// A free proposal may be cut by a batch budget; a model tree may not (its nodes are
    /// sampled under sampling, and its drafter maps node ids to draft-model rows).
    fn cuttable(&self) -> Option<Cuttable<'_>> {
        match self.choice {
            // A probe's values are its kept prefix: a batch budget cuts within the probe.
            Policy::Suffix => {
                let c = self.suffix.cuttable()?;
                let kept = self.pending.as_ref()?.values.as_ref().map_or(c.values.len(), |v| v.len());
                Some(Cuttable { values: &c.values[..kept.min(c.values.len())], target: c.target })
            }
            Policy::LongMatch => {
                let values = self.pending.as_ref()?.values.as_deref().filter(|v| !v.is_empty())?;
                Some(Cuttable { values, target: self.suffix.cuttable_target()? })
            }
            _ => None,
        }
    }

    fn observe_cost(&mut self, forward: ForwardCost) {
        self.suffix.observe_cost(forward);
        if let Some(m) = self.model.as_mut() {
            m.observe_cost(forward);
        }
        if let Some(p) = self.pending.as_mut() {
            p.forward = Some((forward.rows, forward.ms()));
            p.graph_reused = forward.graph_reused;
        }
    }

    fn observe(&mut self, tree: &TokenTree, outcome: &VerifyOutcome) -> Result<()> {
        self.book(tree, outcome);
        self.long.learn(&outcome.tokens);
        self.suffix.observe(tree, outcome)?;
        if let Some(m) = self.model.as_mut() {
            m.observe(tree, outcome)?;
        }
        Ok(())
    }

    /// The text joins the global history; the request's books join its tenant's.
    fn finish(&mut self, text: &[TokenId]) {
        self.suffix.finish(text);
        self.bandit.merge_into(&mut self.shared.policies());
        self.bandit = PolicyBandit::new();
    }

    fn draft_forwards(&self) -> u64 {
        self.model.as_ref().map_or(0, |m| m.draft_forwards())
    }

    fn extra_stats(&self) -> ExtraStats {
        let auto = AutoChoices {
            plain_steps: self.counts[Policy::Plain as usize],
            suffix_steps: self.counts[Policy::Suffix as usize],
            long_match_steps: self.counts[Policy::LongMatch as usize],
            model_steps: self.counts[Policy::Model as usize],
            combined_steps: self.combined,
        };
        ExtraStats {
            auto: Some(auto),
            calibrated: self.model.as_ref().and_then(|m| m.extra_stats().calibrated),
            ..self.suffix.extra_stats()
        }
    }
}

/// The model's greedy tree `model_tree` (with its estimated gain) plus the suffix draft's nodes: each
/// suffix node joins under its parent's image, merged with a model node of the same token. The
/// model's nodes keep their ids (the draft model's bookkeeping and calibration rely on them);
/// suffix-only nodes come after. Returns the combined tree and its gain when the added nodes'
/// expected tokens (their suffix values, an upper bound where they are siblings of model nodes)
/// pay for the rows they add, else `None`.
fn graft(
    model_tree: &TokenTree,
    model_gain: f64,
    suffix_tree: &TokenTree,
    suffix: &SuffixDrafter,
) -> Result<Option<(TokenTree, f64)>> {
    let (Some(cut), Some(econ)) = (suffix.cuttable(), suffix.economics()) else { return Ok(None) };
    if cut.values.len() != suffix_tree.drafted() {
        return Ok(None);
    }
    let mut combined = model_tree.clone();
    let mut image = vec![ROOT; suffix_tree.len()];
    let mut added = 0.0;
    for (id, node) in suffix_tree.nodes().iter().enumerate().skip(1) {
        let parent = image[node.parent.unwrap_or(ROOT)];
        let same = combined.children(parent).iter().copied().find(|&c| combined.node(c).token == node.token);
        image[id] = match same {
            Some(c) => c,
            None => {
                added += cut.values[id - 1];
                combined.add(parent, node.token, Draw::Deterministic, cut.values[id - 1] as f32)?
            }
        };
    }
    if combined.len() == model_tree.len() {
        return Ok(None);
    }
    let extra_ms = econ.ms(combined.drafted()) - econ.ms(model_tree.drafted());
    let gain = model_gain + added - econ.rate * extra_ms;
    Ok((gain > model_gain).then_some((combined, gain)))
}
