//! Decisions corrected by what steps really took: a discounted bandit over the policies `auto`
//! chooses among, with the cost model's prediction as its prior.
//!
//! Each step, every policy on offer comes with a *prediction*: the tokens it should emit
//! (`1 + Σ` its nodes' acceptance) and the milliseconds it should take (the cost curve's
//! `T(n + 1)`). Predictions can be wrong in ways the model cannot see from inside: a curve
//! measured while the machine was quiet, host time the curve leaves out (verifying many rows,
//! drafting), acceptance prices learned on other work. Once a step is over its real tokens and
//! wall time are known, so each policy keeps books of predicted against realised, tokens and
//! time apart, and a step's decision reads every prediction through its policy's *corrections*:
//!
//! ```text
//! score(a) = E_a · min(1, c_tok(a) · (1 + bonus(a))) − λ · M_a · c_ms(a)   (c_tok < 1)
//!            E_a · c_tok(a) − λ · M_a · c_ms(a)                           (c_tok ≥ 1)
//! c_tok(a) = (tokens_a + k · E_a) / (predicted_tokens_a + k · E_a)
//! c_ms(a)  = (ms_a + k · M_a) / (predicted_ms_a + k · M_a)
//! ```
//!
//! with `λ` the rate to beat (Dinkelbach's rule, as in [`crate::budget`]). `k` pseudo-steps of
//! the prediction itself are the prior: a policy never tried is read as the curve says, and
//! a policy tried for many steps is read as it really went. The books decay by `DECAY` a
//! step it is followed (about 50 steps of memory): text changes character within a request (a
//! copy ends, free prose begins). The books of policies not followed decay too, more slowly
//! (`IDLE_DECAY`, a few hundred steps): a policy declined long ago returns to its prior and is
//! tried again when its prediction is good, but a policy that lost is not retried every few
//! dozen steps. The optimism `bonus(a) = β ·
//! √(ln(1 + N) / (k + n_a))` (n_a the policy's discounted steps, N all of them) is the upper
//! confidence bound of discounted UCB (Garivier & Moulines, "On upper-confidence bound policies
//! for switching bandit problems", 2011), whose regret against the best policy is O(√(T log T))
//! per stationary stretch; the tests show it on policies whose curve lies. It lifts a policy
//! whose record is below its prediction back toward the prediction, never above it: a policy
//! with little record is read at its prediction, the prior's own optimistic reading.
//!
//! Plain decoding's tokens are known (one per step), so it gets no token correction and no bonus;
//! its time correction is how much slower than the curve a step really is.
//!
//! Lossless whatever it decides: a step's choice depends only on earlier steps' outcomes, never
//! on the randomness that verifies this one.

use serde::{Deserialize, Serialize};

/// The policies `auto` chooses among.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Nothing drafted: one target row.
    Plain,
    /// The suffix drafter's priced trie (copies from this and earlier requests).
    Suffix,
    /// A long exact match's continuation, drafted as one chain (llama.cpp's ngram-mod kind).
    LongMatch,
    /// The draft model's cost-aware tree.
    Model,
}

impl Policy {
    /// Every policy, in book order.
    pub const ALL: [Policy; 4] = [Policy::Plain, Policy::Suffix, Policy::LongMatch, Policy::Model];

    /// The name in traces and reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            Policy::Plain => "plain",
            Policy::Suffix => "suffix",
            Policy::LongMatch => "long-match",
            Policy::Model => "model",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// What a step of a policy should bring: expected tokens emitted (bonus token included) and
/// milliseconds on the cost curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Prediction {
    /// Expected tokens emitted, `1 + Σ` acceptance of the verified nodes.
    pub tokens: f64,
    /// Predicted milliseconds (the target's curve for the rows verified).
    pub ms: f64,
}

/// What the step really brought.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Realised {
    /// Tokens emitted (accepted nodes and the bonus token).
    pub tokens: f64,
    /// Milliseconds the step took.
    pub ms: f64,
}

/// A policy's discounted books: steps, and predicted against realised tokens and time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyBook {
    /// Discounted steps that followed the policy.
    pub steps: f64,
    /// Σ predicted tokens over those steps.
    pub predicted_tokens: f64,
    /// Σ tokens really emitted.
    pub tokens: f64,
    /// Σ predicted ms.
    pub predicted_ms: f64,
    /// Σ ms really taken.
    pub ms: f64,
}

impl PolicyBook {
    fn scale(&mut self, f: f64) {
        self.steps *= f;
        self.predicted_tokens *= f;
        self.tokens *= f;
        self.predicted_ms *= f;
        self.ms *= f;
    }

    fn add(&mut self, other: &PolicyBook) {
        self.steps += other.steps;
        self.predicted_tokens += other.predicted_tokens;
        self.tokens += other.tokens;
        self.predicted_ms += other.predicted_ms;
        self.ms += other.ms;
    }
}

/// How a policy's prediction is read this step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Correction {
    /// Realised ÷ predicted tokens (shrunk toward 1).
    pub tokens: f64,
    /// Realised ÷ predicted ms (shrunk toward 1).
    pub ms: f64,
    /// The optimism added to the token correction (0 for plain decoding).
    pub bonus: f64,
}

impl Correction {
    /// The token correction the decision reads: a policy whose steps brought less than predicted
    /// is read up to `(1 + bonus)` times its record, but never above its own prediction — the
    /// prediction is already the prior's optimistic reading of a policy with little record, and
    /// a cold request must not bet past it (a 15-row copy priced at a small gain would become a
    /// sure one); one that brought more is read as it went.
    pub fn optimistic_tokens(&self) -> f64 {
        match self.tokens < 1.0 {
            true => (self.tokens * (1.0 + self.bonus)).min(1.0),
            false => self.tokens,
        }
    }
}

/// Pseudo-steps of the prediction itself that every policy's books start with.
pub const PRIOR_STEPS: f64 = 2.0;
/// Per-step discount of the books of the policy a step followed.
pub const DECAY: f64 = 0.98;
/// Per-step discount of the books of every other policy: slower, so a policy that lost is not
/// tried again at every turn of the books, but is after a few hundred steps.
pub const IDLE_DECAY: f64 = 0.995;
/// Weight of the optimism bonus.
pub const EXPLORE: f64 = 0.15;
/// Most steps of a tenant's books a new request starts from: its own steps outweigh them soon.
pub const CARRIED_STEPS: f64 = 16.0;

/// The books of every policy (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyBandit {
    books: [PolicyBook; 4],
}

impl PolicyBandit {
    /// Empty books: every prediction read as made.
    pub fn new() -> Self {
        Self::default()
    }

    /// A request's books, starting from what its tenant's earlier requests learned, scaled down
    /// to at most [`CARRIED_STEPS`] steps a policy so the request's own steps decide soon.
    pub fn carried_from(tenant: &PolicyBandit) -> Self {
        let mut books = tenant.books;
        for b in &mut books {
            if b.steps > CARRIED_STEPS {
                b.scale(CARRIED_STEPS / b.steps);
            }
        }
        Self { books }
    }

    /// Fold a finished request's books into its tenant's (older requests fade by the same
    /// discount over the request's steps).
    pub fn merge_into(&self, tenant: &mut PolicyBandit) {
        let steps: f64 = self.books.iter().map(|b| b.steps).sum();
        let fade = DECAY.powf(steps.min(1e4));
        for (t, b) in tenant.books.iter_mut().zip(&self.books) {
            t.scale(fade);
            t.add(b);
        }
    }

    /// A policy's books.
    pub fn book(&self, policy: Policy) -> &PolicyBook {
        &self.books[policy.index()]
    }

    /// How `policy`'s prediction `p` is read now.
    pub fn correction(&self, policy: Policy, p: Prediction) -> Correction {
        let b = &self.books[policy.index()];
        let ms = (b.ms + PRIOR_STEPS * p.ms) / (b.predicted_ms + PRIOR_STEPS * p.ms);
        if policy == Policy::Plain {
            return Correction { tokens: 1.0, ms, bonus: 0.0 };
        }
        let tokens = (b.tokens + PRIOR_STEPS * p.tokens) / (b.predicted_tokens + PRIOR_STEPS * p.tokens);
        let all: f64 = self.books.iter().map(|b| b.steps).sum();
        let bonus = EXPLORE * ((1.0 + all).ln() / (PRIOR_STEPS + b.steps)).sqrt();
        Correction { tokens, ms, bonus }
    }

    /// The corrected gain of following `policy` with prediction `p` at rate `rate` (tokens per
    /// ms): what the step's decision maximises.
    pub fn score(&self, policy: Policy, p: Prediction, rate: f64) -> f64 {
        let c = self.correction(policy, p);
        p.tokens * c.optimistic_tokens() - rate * p.ms * c.ms
    }

    /// Tokens per ms that `policy` with prediction `p` is read to bring (corrections applied).
    pub fn corrected_rate(&self, policy: Policy, p: Prediction) -> f64 {
        let c = self.correction(policy, p);
        p.tokens * c.optimistic_tokens() / (p.ms * c.ms).max(f64::MIN_POSITIVE)
    }

    /// The offer a step should follow at rate `rate`: the best corrected gain — unless no offer
    /// reaches `rate` (every gain negative: the rate achieved lately, inflated by a run of fully
    /// accepted copies, is out of reach this step), then the best corrected rate, as
    /// [`crate::budget::Economics::best_prefix`] does, so that a step in the middle of a copy
    /// does not fall back to plain decoding, the worst rate of all. Ties go to the earlier offer.
    pub fn choose(&self, offers: &[(Policy, Prediction)], rate: f64) -> usize {
        let best_by = |f: &dyn Fn(Policy, Prediction) -> f64| {
            let mut best = (0, f64::NEG_INFINITY);
            for (i, &(policy, p)) in offers.iter().enumerate() {
                let v = f(policy, p);
                if v > best.1 {
                    best = (i, v);
                }
            }
            best
        };
        let (i, gain) = best_by(&|policy, p| self.score(policy, p, rate));
        if gain >= 0.0 {
            return i;
        }
        best_by(&|policy, p| self.corrected_rate(policy, p)).0
    }

    /// A step that followed `policy`, predicted `p`, brought `r`: the policy's books decay one
    /// step and take it; every other policy's decay at the idle rate.
    pub fn record(&mut self, policy: Policy, p: Prediction, r: Realised) {
        if !(r.ms.is_finite() && r.ms > 0.0 && p.ms.is_finite() && p.ms > 0.0) {
            return;
        }
        for (i, b) in self.books.iter_mut().enumerate() {
            b.scale(if i == policy.index() { DECAY } else { IDLE_DECAY });
        }
        let b = &mut self.books[policy.index()];
        b.steps += 1.0;
        b.predicted_tokens += p.tokens;
        b.tokens += r.tokens;
        b.predicted_ms += p.ms;
        b.ms += r.ms;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Stream, StreamRng};

    /// A policy as the simulated machine really runs it, and as its curve predicts it.
    #[derive(Clone, Copy)]
    struct Arm {
        policy: Policy,
        predicted: Prediction,
        /// Mean tokens and ms a step really brings.
        tokens: f64,
        ms: f64,
    }

    /// Runs `steps` steps choosing by the bandit among `arms` (noise ±20% on every outcome) and
    /// returns the tokens and ms it spent, and how often each arm was chosen in the second half.
    fn run(arms: &[Arm], steps: usize, seed: u64) -> (f64, f64, Vec<usize>) {
        let mut bandit = PolicyBandit::new();
        let mut rng = StreamRng::new(seed, Stream::Verify);
        let (mut tokens, mut ms) = (0.0, 0.0);
        let mut late = vec![0; arms.len()];
        for step in 0..steps {
            let rate = if ms > 0.0 { tokens / ms } else { 0.0 };
            let offers: Vec<_> = arms.iter().map(|a| (a.policy, a.predicted)).collect();
            let best = bandit.choose(&offers, rate);
            let arm = arms[best];
            let noise = |rng: &mut StreamRng| 0.8 + 0.4 * rng.uniform();
            let r = Realised { tokens: arm.tokens * noise(&mut rng), ms: arm.ms * noise(&mut rng) };
            bandit.record(arm.policy, arm.predicted, r);
            tokens += r.tokens;
            ms += r.ms;
            if step >= steps / 2 {
                late[best] += 1;
            }
        }
        (tokens, ms, late)
    }

    fn arm(policy: Policy, predicted: (f64, f64), real: (f64, f64)) -> Arm {
        Arm {
            policy,
            predicted: Prediction { tokens: predicted.0, ms: predicted.1 },
            tokens: real.0,
            ms: real.1,
        }
    }

    /// The curve says a 16-row chain costs what one row does and three tokens come of it; on the
    /// real machine it costs 8 rows' time and brings 1.5 tokens. Plain decoding is really best.
    #[test]
    fn a_curve_that_lies_is_overruled_by_measured_time() {
        let arms = [
            arm(Policy::Plain, (1.0, 30.0), (1.0, 30.0)),
            arm(Policy::LongMatch, (3.0, 32.0), (1.5, 240.0)),
            arm(Policy::Suffix, (2.0, 35.0), (1.2, 90.0)),
        ];
        let steps = 2000;
        for seed in 1..=8 {
            let (tokens, ms, late) = run(&arms, steps, seed);
            assert!(late[0] as f64 >= 0.9 * (steps / 2) as f64, "late choices {late:?}");
            // Regret against always following the best policy (plain: 1 token per 30 ms), in
            // time to emit the same tokens: a few percent, not the 2–8× the lying curve costs.
            let best_ms = tokens * 30.0;
            eprintln!("seed {seed}: regret {:.3}, late {late:?}", ms / best_ms - 1.0);
            assert!(ms < 1.10 * best_ms, "spent {ms:.0} ms where plain would take {best_ms:.0}");
        }
    }

    /// The other way round: the prices say a long copy is a poor bet, the machine says it pays
    /// four-fold; the bandit takes it.
    #[test]
    fn a_pessimistic_price_is_overruled_by_measured_tokens() {
        let arms =
            [arm(Policy::Plain, (1.0, 30.0), (1.0, 30.0)), arm(Policy::LongMatch, (1.2, 60.0), (8.0, 60.0))];
        let (tokens, ms, late) = run(&arms, 400, 3);
        assert!(late[1] >= 190, "late choices {late:?}");
        assert!(tokens / ms > 0.9 * 8.0 / 60.0 * 0.5 + 0.5 * 1.0 / 30.0, "rate {}", tokens / ms);
    }

    /// Where the curve is right, the corrections stay near 1 and the decision is the curve's.
    #[test]
    fn a_right_curve_keeps_its_decision() {
        let arms =
            [arm(Policy::Plain, (1.0, 30.0), (1.0, 30.0)), arm(Policy::Suffix, (3.0, 45.0), (3.0, 45.0))];
        let (_, _, late) = run(&arms, 400, 11);
        assert_eq!(late[0], 0, "late choices {late:?}");
        let mut b = PolicyBandit::new();
        let p = Prediction { tokens: 3.0, ms: 45.0 };
        for _ in 0..50 {
            b.record(Policy::Suffix, p, Realised { tokens: 3.0, ms: 45.0 });
        }
        let c = b.correction(Policy::Suffix, p);
        assert!((c.tokens - 1.0).abs() < 1e-9 && (c.ms - 1.0).abs() < 1e-9);
    }

    /// A change within the run: the copy that paid for 100 steps stops paying; within the books'
    /// memory (about 50 steps) plain decoding takes over.
    #[test]
    fn books_forget_a_policy_that_stopped_paying() {
        let mut b = PolicyBandit::new();
        let p = Prediction { tokens: 4.0, ms: 60.0 };
        let plain = Prediction { tokens: 1.0, ms: 30.0 };
        for _ in 0..100 {
            b.record(Policy::LongMatch, p, Realised { tokens: 4.0, ms: 60.0 });
        }
        let rate = 1.0 / 30.0;
        assert!(b.score(Policy::LongMatch, p, rate) > b.score(Policy::Plain, plain, rate));
        let mut switched = None;
        for step in 0..100 {
            if b.score(Policy::LongMatch, p, rate) < b.score(Policy::Plain, plain, rate) {
                switched = Some(step);
                break;
            }
            b.record(Policy::LongMatch, p, Realised { tokens: 1.0, ms: 60.0 });
        }
        let switched = switched.expect("never switched to plain decoding");
        assert!(switched <= 60, "switched after {switched} losing steps");
    }

    /// In the middle of a copy the rate achieved lately is out of every offer's reach; the step
    /// still takes the offer of the best rate, not plain decoding.
    #[test]
    fn an_unreachable_rate_chooses_the_best_rate_on_offer() {
        let b = PolicyBandit::new();
        let offers = [
            (Policy::Plain, Prediction { tokens: 1.0, ms: 25.0 }),
            (Policy::Suffix, Prediction { tokens: 2.9, ms: 58.0 }),
            (Policy::LongMatch, Prediction { tokens: 2.0, ms: 45.0 }),
        ];
        // 32 tokens in 270 ms lately: no offer reaches it.
        let rate = 32.0 / 270.0;
        assert!(offers.iter().all(|&(p, o)| b.score(p, o, rate) < 0.0));
        assert_eq!(b.choose(&offers, rate), 1);
        // Where an offer reaches the rate, the gain decides (here: the suffix's 1.9 extra tokens
        // are worth its 33 extra ms at plain decoding's rate).
        assert_eq!(b.choose(&offers, 1.0 / 25.0), 1);
        assert_eq!(b.choose(&offers[..1], rate), 0);
    }

    #[test]
    fn a_tenants_books_carry_into_a_request_scaled_down() {
        let mut request = PolicyBandit::new();
        let p = Prediction { tokens: 2.0, ms: 50.0 };
        for _ in 0..200 {
            request.record(Policy::Suffix, p, Realised { tokens: 1.0, ms: 50.0 });
        }
        let mut tenant = PolicyBandit::new();
        request.merge_into(&mut tenant);
        let next = PolicyBandit::carried_from(&tenant);
        assert!(next.book(Policy::Suffix).steps <= CARRIED_STEPS + 1e-9);
        let c = next.correction(Policy::Suffix, p);
        assert!(c.tokens < 0.8, "the tenant's lesson is lost: {c:?}");
        // Ratios survive the scaling.
        let (t, n) = (tenant.book(Policy::Suffix), next.book(Policy::Suffix));
        assert!((t.tokens / t.predicted_tokens - n.tokens / n.predicted_tokens).abs() < 1e-9);
    }

    #[test]
    fn plain_decoding_gets_no_token_correction_and_nonsense_steps_are_ignored() {
        let mut b = PolicyBandit::new();
        let p = Prediction { tokens: 1.0, ms: 30.0 };
        b.record(Policy::Plain, p, Realised { tokens: 1.0, ms: f64::NAN });
        b.record(Policy::Plain, p, Realised { tokens: 1.0, ms: 0.0 });
        assert_eq!(b.book(Policy::Plain).steps, 0.0);
        for _ in 0..20 {
            b.record(Policy::Plain, p, Realised { tokens: 1.0, ms: 60.0 });
        }
        let c = b.correction(Policy::Plain, p);
        assert_eq!((c.tokens, c.bonus), (1.0, 0.0));
        assert!(c.ms > 1.5, "{c:?}");
    }
}
