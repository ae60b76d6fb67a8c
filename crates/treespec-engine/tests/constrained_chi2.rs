//! Constrained decoding is lossless (issue #14): under a grammar, the first L tokens that
//! `generate_constrained` emits with a speculative drafter have exactly the joint distribution of
//! constrained plain decoding — every conditional the target's processed distribution masked to
//! the grammar — and trees that contain grammar-forced tokens keep it. The toy grammar is an
//! enumerable automaton with a forced stretch; the exact joint is the product of the masked
//! conditionals, chi-square tested against many seeded runs (Bonferroni across configurations).
//! Greedy: speculative output equals constrained plain output token for token. The same holds
//! for a grammar that applies only between tags (`TaggedConstraint`, a tool call the model opens
//! itself), whose calls open and close inside draft trees.

#[path = "../../treespec-core/tests/common/mod.rs"]
mod common;

use common::{gof_failure, FAMILY_ALPHA};
use treespec_core::sampling::{Sampler, SamplingParams};
use treespec_core::TokenId;
use treespec_engine::drafters::{ChainDrafter, SuffixConfig, SuffixDrafter, SuffixShared, TreeDrafter};
use treespec_engine::toy::{ToyLm, ToyModel};
use treespec_engine::{
    generate_constrained, DfaConstraint, Drafter, GenerateRequest, Opening, PlainDrafter, TaggedConstraint,
    TokenConstraint,
};

const CTX: usize = 64;
const V: usize = 5;

/// States: 0 allows {0, 1} → 1 and 2 → 2; 1 allows {1, 3, 4} → 0; then 2 forces 3 and 3 forces 4
/// back to 0 — so after token 2 the next two tokens are forced drafts.
fn grammar() -> DfaConstraint {
    let mut next = vec![vec![None; V]; 4];
    next[0][0] = Some(1);
    next[0][1] = Some(1);
    next[0][2] = Some(2);
    next[1][1] = Some(0);
    next[1][3] = Some(0);
    next[1][4] = Some(0);
    next[2][3] = Some(3);
    next[3][4] = Some(0);
    DfaConstraint::new(next).unwrap()
}

/// Free text until token 4 opens a call (2 forced, then 0 or 1, then the closing 3 forced), or
/// an output that starts with 1 1, which is then calls to its end (2, 0 or 1, 3, again).
fn tagged() -> TaggedConstraint<DfaConstraint> {
    let mut next = vec![vec![None; V]; 4];
    next[0][2] = Some(1);
    next[1][0] = Some(2);
    next[1][1] = Some(2);
    next[2][3] = Some(3);
    let call = DfaConstraint::new(next.clone()).unwrap();
    next[2][3] = Some(0);
    let calls = DfaConstraint::new(next).unwrap();
    TaggedConstraint::new(vec![
        (Opening { tokens: vec![4], at_start: false, close: Some(3) }, Box::new(move || Ok(call.clone()))),
        (Opening { tokens: vec![1, 1], at_start: true, close: None }, Box::new(move || Ok(calls.clone()))),
    ])
    .unwrap()
}

/// The grammars under test, fresh for every run.
#[derive(Clone, Copy, Debug)]
enum Grammar {
    Whole,
    Tagged,
}

impl Grammar {
    fn make(self) -> Box<dyn TokenConstraint> {
        match self {
            Grammar::Whole => Box::new(grammar()),
            Grammar::Tagged => Box::new(tagged()),
        }
    }

    /// The token whose emission exercises the grammar's forced tokens.
    fn forcing(self) -> TokenId {
        match self {
            Grammar::Whole => 2,
            Grammar::Tagged => 4,
        }
    }
}

/// The exact joint over V^len continuations: the masked, processed conditionals multiplied.
fn exact_joint(g: Grammar, model: &ToyModel, sampler: &Sampler, prompt: &[TokenId], len: usize) -> Vec<f64> {
    struct Walk<'a> {
        grammar: Grammar,
        model: &'a ToyModel,
        sampler: &'a Sampler,
        prompt: &'a [TokenId],
        out: Vec<f64>,
    }
    impl Walk<'_> {
        fn rec(&mut self, path: &mut Vec<TokenId>, left: usize, prob: f64, index: usize) {
            if left == 0 {
                self.out[index] = prob;
                return;
            }
            let ctx: Vec<TokenId> = self.prompt.iter().chain(path.iter()).copied().collect();
            let mut logits = self.model.logits(&ctx);
            self.grammar.make().mask_logits(path, &mut logits).unwrap();
            let dist = self.sampler.distribution(&logits, &ctx).unwrap();
            for t in 0..V as TokenId {
                let p = dist.prob(t) as f64;
                if p > 0.0 {
                    path.push(t);
                    self.rec(path, left - 1, prob * p, index * V + t as usize);
                    path.pop();
                }
            }
        }
    }
    let mut walk = Walk { grammar: g, model, sampler, prompt, out: vec![0.0; V.pow(len as u32)] };
    walk.rec(&mut Vec::new(), len, 1.0, 0);
    walk.out
}

fn drafter(kind: &str, draft: &ToyModel) -> Box<dyn Drafter> {
    let lm = ToyLm::new(draft.clone(), CTX);
    match kind {
        "plain" => Box::new(PlainDrafter),
        "chain" => Box::new(ChainDrafter::new(lm, 3).unwrap()),
        // Copies of the text so far, every node verified: grafted under forced chains.
        "suffix" => Box::new(
            SuffixDrafter::new(SuffixConfig {
                global: false,
                costs: None,
                min_value: 0.0,
                shared: SuffixShared::empty(),
                ..Default::default()
            })
            .unwrap(),
        ),
        _ => Box::new(TreeDrafter::new(lm, vec![2, 2, 1]).unwrap()),
    }
}

fn request(prompt: &[TokenId], len: usize, sampling: &SamplingParams, seed: u64) -> GenerateRequest {
    GenerateRequest::new(prompt.to_vec(), len, sampling.clone(), seed)
}

fn run(g: Grammar, target: &mut ToyLm, d: &mut dyn Drafter, req: &GenerateRequest) -> (Vec<TokenId>, u64) {
    let mut c = g.make();
    let out = generate_constrained(target, d, req, Some(&mut *c), None, &mut |_| true).unwrap();
    (out.tokens, out.stats.target_forwards)
}

#[test]
fn sampled_constrained_outputs_keep_the_masked_target_distribution() {
    let configs = [
        (Grammar::Whole, "plain", 1.0, None, 1u64),
        (Grammar::Whole, "chain", 1.0, None, 2),
        (Grammar::Whole, "tree", 1.0, None, 3),
        (Grammar::Whole, "chain", 0.7, Some(3), 4),
        (Grammar::Whole, "tree", 1.3, None, 5),
        (Grammar::Tagged, "plain", 1.0, None, 6),
        (Grammar::Tagged, "chain", 1.0, None, 7),
        (Grammar::Tagged, "tree", 1.3, None, 8),
        (Grammar::Tagged, "suffix", 1.0, None, 9),
    ];
    let (len, runs) = (5, 40_000u64);
    let alpha = FAMILY_ALPHA / configs.len() as f64;
    let (mut failures, mut at_start) = (Vec::new(), 0);
    for (i, &(g, kind, t, top_k, seed)) in configs.iter().enumerate() {
        let target_model = ToyModel::new(V, 2, seed);
        let draft = target_model.draft(1.0, seed + 100);
        let sampling = SamplingParams { temperature: t, top_k, ..Default::default() };
        let sampler = Sampler::new(sampling.clone()).unwrap();
        let prompt = vec![1, 3];
        let probs = exact_joint(g, &target_model, &sampler, &prompt, len);
        assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-4);
        let mut target = ToyLm::new(target_model, CTX);
        let mut d = drafter(kind, &draft);
        let mut counts = vec![0u64; probs.len()];
        let (mut forwards, mut forced_runs) = (0, 0);
        for r in 0..runs {
            let (tokens, f) =
                run(g, &mut target, d.as_mut(), &request(&prompt, len, &sampling, (i as u64) << 32 | r));
            assert_eq!(tokens.len(), len);
            counts[tokens.iter().fold(0, |a, &t| a * V + t as usize)] += 1;
            forwards += f;
            forced_runs += tokens.contains(&g.forcing()) as u64;
            at_start += matches!(g, Grammar::Tagged) as u64 * tokens.starts_with(&[1, 1]) as u64;
        }
        assert!(forced_runs > runs / 10, "{g:?} {kind}: the forced stretch must be exercised");

        let name = format!("{g:?} {kind} T{t} top-k {top_k:?} ({forwards} forwards)");
        failures.extend(gof_failure(&name, &counts, &probs, alpha));
    }
    assert!(at_start > runs * 3 / 100, "calls at the start must be exercised ({at_start})");
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn forced_tokens_are_free_and_greedy_output_equals_constrained_plain() {
    let target_model = ToyModel::new(V, 2, 9);
    let draft = target_model.draft(0.5, 19);
    let greedy = SamplingParams::with_temperature(0.0);
    for prompt in [vec![0, 1], vec![2, 3], vec![4, 4], vec![1, 2, 3]] {
        let req = request(&prompt, 24, &greedy, 0);
        let mut target = ToyLm::new(target_model.clone(), CTX);
        let (plain, plain_forwards) =
            run(Grammar::Whole, &mut target, drafter("plain", &draft).as_mut(), &req);
        // Every emitted sequence is a walk of the grammar.
        let mut g = grammar();
        g.commit(&plain).unwrap();
        for kind in ["chain", "tree"] {
            let (spec, _) = run(Grammar::Whole, &mut target, drafter(kind, &draft).as_mut(), &req);
            assert_eq!(spec, plain, "{kind} on {prompt:?}");
        }
        // Plain decoding under the grammar still verifies forced tokens as free chains.
        let forced = plain.iter().filter(|&&t| t == 2).count() as u64;
        assert!(
            plain_forwards <= 24 - forced,
            "{plain_forwards} forwards for 24 tokens with {forced} forced pairs"
        );
    }
}

#[test]
fn tagged_calls_are_free_where_forced_and_greedy_output_equals_constrained_plain() {
    let target_model = ToyModel::new(V, 2, 11);
    let draft = target_model.draft(0.5, 21);
    let greedy = SamplingParams::with_temperature(0.0);
    let mut calls = 0;
    for prompt in [vec![0, 1], vec![2, 3], vec![4, 4], vec![1, 2, 3], vec![3, 4], vec![0, 0, 4]] {
        let req = request(&prompt, 24, &greedy, 0);
        let mut target = ToyLm::new(target_model.clone(), CTX);
        let (plain, plain_forwards) =
            run(Grammar::Tagged, &mut target, drafter("plain", &draft).as_mut(), &req);
        // The text is a valid run of tagged calls: committing it whole is accepted.
        tagged().commit(&plain).unwrap();
        for kind in ["chain", "tree", "suffix"] {
            let (spec, _) = run(Grammar::Tagged, &mut target, drafter(kind, &draft).as_mut(), &req);
            assert_eq!(spec, plain, "{kind} on {prompt:?}");
        }
        // Inside a call the 2 after the opening tag and the closing 3 are forced: plain decoding
        // verifies each as a free draft, so a completed call costs two forwards fewer.
        let opened = plain.iter().filter(|&&t| t == 4).count();
        let closed = plain.windows(3).filter(|w| w[0] == 2 && w[2] == 3).count();
        calls += closed;
        assert!(
            plain_forwards as usize + opened + closed <= 24 + 1,
            "{plain_forwards} forwards for 24 tokens with {opened} calls opened, {closed} closed: {plain:?}"
        );
    }
    assert!(calls >= 2, "the greedy runs must complete calls ({calls})");
}

/// Under a call the grammar forces 2; a suffix draft copying an earlier call (4 2 1 3) holds the
/// forced token as its first node, so what it copies past it is verified in the same forward:
/// the step's tree is the forced chain with the copy grafted under it.
#[test]
fn a_copy_past_the_forced_tokens_is_grafted_under_them() {
    use treespec_engine::{Generation, ProposeAt};
    let draft = ToyModel::new(V, 2, 1);
    let mut suffix = drafter("suffix", &draft);
    let prompt = vec![0, 4, 2, 1, 3, 0, 4];
    let greedy = SamplingParams::with_temperature(0.0);
    let mut g = Generation::new(request(&prompt, 8, &greedy, 0), CTX, V, None).unwrap();
    g.begin(suffix.as_mut(), std::time::Duration::ZERO).unwrap();
    // The output opened a call: 2 is forced next.
    let mut c = tagged();
    c.commit(&[4]).unwrap();
    assert_eq!(c.forced(8).unwrap(), vec![2]);
    let at = ProposeAt { committed: prompt.len() - 1, batch_rows: 0, cap: 16, batch_cut: false };
    let tree = g.propose(suffix.as_mut(), Some(&mut c), at).unwrap().unwrap().clone();
    let deepest = (0..tree.len()).max_by_key(|&i| tree.node(i).depth).unwrap();
    let path = tree.path_tokens(deepest);
    assert!(path.starts_with(&[2, 1, 3]), "the forced 2, then the copied 1 3: {path:?}");
}
