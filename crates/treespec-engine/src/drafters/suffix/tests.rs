//! The suffix drafter's behaviour: what it drafts for strong and weak matches, how its prices
//! and the request's tallies learn, and how re-anchoring resumes a copy broken by an edit.

use std::sync::Arc;

use treespec_core::sampling::SamplingParams;
use treespec_core::suffix::{GlobalHistory, NodeFeatures, SuffixPricing, DEFAULT_CAP_TOKENS};

use super::calibration::{CALIBRATION_RANGE, NODE_DECAY};
use super::selection::EXPLORE_EXTRA;
use super::*;

/// Pricing that has seen exact copies accepted many times, at every match length and depth.
fn trained(shared: &SuffixShared) {
    trained_at(shared, 1);
}

/// Pricing that has seen exact copies at every match length and depth, one in `fail_every`
/// of them (drawn pseudo-randomly) rejected (1 = none).
fn trained_at(shared: &SuffixShared, fail_every: u64) {
    let mut p = shared.pricing();
    let mut i: u64 = 1;
    for _ in 0..40 {
        for match_len in [8, 12, 20, 40, 64] {
            for depth in 1..=64 {
                for global in [false, true] {
                    let f = NodeFeatures { match_len, depth, share: 1.0, support: 1, global };
                    i = i.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    p.record(&f, fail_every <= 1 || !(i >> 33).is_multiple_of(fail_every));
                }
            }
        }
    }
}

/// A text that quotes 40 distinct tokens after `head` and then, as its output so far, has
/// copied the first 20 of them: the quote and the text.
fn copying(head: &[TokenId]) -> (Vec<TokenId>, Vec<TokenId>) {
    let quote: Vec<TokenId> = (100..140).collect();
    let mut history = head.to_vec();
    history.extend(&quote);
    history.extend([3, 4]);
    history.extend(&quote[..20]);
    (quote, history)
}

/// Shared state whose prices start from the formula prior alone, not the shipped calibration.
fn uninformed() -> Arc<SuffixShared> {
    SuffixShared::with_pricing(GlobalHistory::new(DEFAULT_CAP_TOKENS).unwrap(), SuffixPricing::uninformed())
}

fn ctx<'a>(history: &'a [TokenId], sampler: &'a Sampler) -> ProposeContext<'a> {
    ProposeContext {
        history,
        max_nodes: 64,
        max_depth: 64,
        sampler,
        batch_rows: 0,
        batch_cut: false,
        eos: &[],
    }
}

#[test]
fn bad_configs_name_the_knob() {
    for (c, knob) in [
        (SuffixConfig { max_match: 1, ..Default::default() }, "max_match"),
        (SuffixConfig { occurrences: 0, ..Default::default() }, "occurrences"),
        (SuffixConfig { pessimism: f64::NAN, ..Default::default() }, "pessimism"),
        (SuffixConfig { min_value: 2.0, ..Default::default() }, "min_value"),
    ] {
        let e = SuffixDrafter::new(c).err().expect("invalid").to_string();
        assert!(e.contains(knob), "{e}");
    }
}

#[test]
fn a_long_copy_is_drafted_far_and_a_weak_match_not_at_all() {
    let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let shared = uninformed();
    let config = SuffixConfig { explore_every: 0, shared: shared.clone(), ..Default::default() };
    let mut d = SuffixDrafter::new(config).unwrap();
    // The prompt quotes 40 distinct tokens; the output has copied the first 20 of them.
    let (quote, history) = copying(&[1, 2]);
    d.begin(&history, &sampler, 0).unwrap();
    // Untrained, the pessimistic prior drafts a few tokens of the copy, not all of it.
    let cautious = d.propose(&ctx(&history, &sampler)).unwrap();
    assert!((1..20).contains(&cautious.max_depth()), "{}", cautious.max_depth());
    d.discard_proposal();
    trained(&shared);
    let tree = d.propose(&ctx(&history, &sampler)).unwrap();
    assert!(tree.max_depth() >= 20, "the rest of the quote, then what followed it");
    assert_eq!(tree.leaves().len(), 1);
    assert_eq!(tree.path_tokens(tree.leaves()[0])[..20], quote[20..]);
    // A 2-token match with a split continuation is not worth a row.
    let weak = vec![7, 8, 1, 7, 8, 2, 7, 8];
    d.begin(&weak, &sampler, 0).unwrap();
    assert_eq!(d.propose(&ctx(&weak, &sampler)).unwrap().drafted(), 0);
}

/// A token that ends generation ends the copy: it may be drafted (the answer may end there) but
/// nothing under it.
#[test]
fn nothing_is_drafted_under_a_token_that_ends_generation() {
    let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let shared = uninformed();
    trained(&shared);
    let config = SuffixConfig { explore_every: 0, shared, ..Default::default() };
    let mut d = SuffixDrafter::new(config).unwrap();
    // After the quote come 3 and 4: with 3 an end token, the copy stops at it.
    let (quote, history) = copying(&[1, 2]);
    d.begin(&history, &sampler, 0).unwrap();
    let under_3 = |tree: &TokenTree| {
        tree.nodes().iter().filter(|n| n.parent.is_some_and(|p| p != ROOT && tree.node(p).token == 3)).count()
    };
    let through = d.propose(&ctx(&history, &sampler)).unwrap();
    d.discard_proposal();
    assert!(under_3(&through) > 0, "without an end token the copy runs on past 3");
    let ends = [3];
    let tree = d.propose(&ProposeContext { eos: &ends, ..ctx(&history, &sampler) }).unwrap();
    assert_eq!(under_3(&tree), 0);
    let path = tree.path_tokens(tree.leaves()[0]);
    assert_eq!(path[..20], quote[20..]);
    assert_eq!(path[20..], [3]);
    // The pricing features stay one per node.
    assert_eq!(d.cuttable().map_or(tree.drafted(), |c| c.values.len()), tree.drafted());
}

#[test]
fn prices_carried_to_new_shared_state_draft_the_long_copy_at_once() {
    let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let learned = SuffixShared::empty();
    trained(&learned);
    // What a later process starts with: an empty history, the saved prices.
    let warm = SuffixShared::with_pricing(
        GlobalHistory::new(DEFAULT_CAP_TOKENS).unwrap(),
        learned.pricing_snapshot(),
    );
    assert_eq!(*warm.pricing(), *learned.pricing());
    let (_, history) = copying(&[1, 2]);
    let depth = |shared: &Arc<SuffixShared>| {
        let config = SuffixConfig { explore_every: 0, shared: shared.clone(), ..Default::default() };
        let mut d = SuffixDrafter::new(config).unwrap();
        d.begin(&history, &sampler, 0).unwrap();
        d.propose(&ctx(&history, &sampler)).unwrap().max_depth()
    };
    assert!(depth(&warm) >= 20, "the learned prices draft the rest of the quote");
    assert!(depth(&uninformed()) < 20, "the formula prior is cautious");
    // A fresh start takes the copy at once too: the shipped prior is calibrated.
    assert!(depth(&SuffixShared::empty()) >= 20, "the shipped prior drafts the rest of the quote");
    // set_pricing replaces the prices of state already shared.
    let cold = uninformed();
    cold.set_pricing(learned.pricing_snapshot());
    assert!(depth(&cold) >= 20);
}

#[test]
fn a_long_context_makes_the_same_copy_verify_fewer_rows() {
    use crate::auto_budget::{CostModel, SharedCosts};
    use treespec_core::cost::CostCurve;
    let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    // The 1.5B target's short-cache shape, and 40 µs per row per committed token (steep, so
    // that the test does not hinge on a near-tie).
    let curve = CostCurve::from_points(&[(1, 25.0), (4, 67.0), (8, 112.0), (16, 136.0), (32, 244.0)])
        .unwrap()
        .with_context_cost(0.04, 64)
        .unwrap();
    let drafted = |filler: usize| {
        let shared = SuffixShared::empty();
        // Copies right 19 times in 20: near-certain copies pay at any context (the context
        // surcharge is on plain decoding's row too), these are worth fewer rows as rows get dear.
        trained_at(&shared, 20);
        let costs = SharedCosts::new(CostModel::new(curve.clone(), None));
        let config = SuffixConfig { explore_every: 0, shared, costs: Some(costs), ..Default::default() };
        let mut d = SuffixDrafter::new(config).unwrap();
        // The same quote and copy, after `filler` tokens of unrelated prompt.
        let unrelated: Vec<TokenId> = (0..filler as TokenId).map(|i| 1000 + i).collect();
        let (_, history) = copying(&unrelated);
        d.begin(&history, &sampler, 0).unwrap();
        d.propose(&ctx(&history, &sampler)).unwrap().drafted()
    };
    let (short, long) = (drafted(0), drafted(1500));
    assert!(short >= 15, "a trained copy on a short cache rides the curve to 16 rows: {short}");
    assert!(long < short, "every row costs 60 ms more at 1,500 tokens: {long} vs {short}");
}

#[test]
fn exploration_tries_a_few_nodes_the_pessimistic_price_keeps_out() {
    let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let weak = vec![7, 8, 1, 7, 8, 2, 7, 8, 3, 4, 5, 6];
    let cautious = SuffixConfig { explore_every: 0, shared: uninformed(), ..Default::default() };
    let mut d = SuffixDrafter::new(cautious.clone()).unwrap();
    d.begin(&weak[..8], &sampler, 0).unwrap();
    assert_eq!(d.propose(&ctx(&weak[..8], &sampler)).unwrap().drafted(), 0);
    let mut d = SuffixDrafter::new(SuffixConfig { explore_every: 1, ..cautious }).unwrap();
    d.begin(&weak[..8], &sampler, 0).unwrap();
    let tree = d.propose(&ctx(&weak[..8], &sampler)).unwrap();
    assert!((1..=EXPLORE_EXTRA).contains(&tree.drafted()), "{}", tree.drafted());
    assert_eq!(d.stats().explore_steps, 1);
}

#[test]
fn exploring_a_long_copy_doubles_what_the_pessimistic_price_keeps() {
    let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let (_, history) = copying(&[1, 2]);
    let drafted = |explore_every: u32| {
        let config = SuffixConfig { explore_every, shared: uninformed(), ..Default::default() };
        let mut d = SuffixDrafter::new(config).unwrap();
        d.begin(&history, &sampler, 0).unwrap();
        d.propose(&ctx(&history, &sampler)).unwrap().drafted()
    };
    let (cautious, explored) = (drafted(0), drafted(1));
    assert!(cautious >= 1, "{cautious}");
    // Untried deep cells: the exploration step goes past the cautious cut by more than the
    // fixed extra, up to twice it plus the extra.
    assert!(explored > cautious + EXPLORE_EXTRA, "{explored} vs {cautious}");
    assert!(explored <= 2 * cautious + EXPLORE_EXTRA, "{explored} vs {cautious}");
}

#[test]
fn finished_requests_feed_the_next_ones_but_not_the_same_prompt_when_excluded() {
    let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let shared = SuffixShared::empty();
    trained(&shared);
    let config = SuffixConfig { shared: shared.clone(), explore_every: 0, ..Default::default() };
    let answer: Vec<TokenId> = (200..230).collect();
    let mut first = SuffixDrafter::new(config.clone()).unwrap();
    first.begin(&[1, 2, 3], &sampler, 0).unwrap();
    let mut text = vec![1, 2, 3];
    text.extend(&answer);
    first.finish(&text);
    assert_eq!(shared.history().docs(), 1);
    // Another prompt whose output starts like the earlier answer drafts the rest of it.
    let mut second = SuffixDrafter::new(config.clone()).unwrap();
    let mut history = vec![9, 9];
    history.extend(&answer[..12]);
    second.begin(&history, &sampler, 0).unwrap();
    let tree = second.propose(&ctx(&history, &sampler)).unwrap();
    assert!(tree.drafted() >= 10, "{}", tree.drafted());
    assert_eq!(second.stats().global_hits, 1);
    // The same prompt is kept from its own answer when the benchmark asks for it.
    let mut same = SuffixDrafter::new(SuffixConfig { exclude_same_prompt: true, ..config }).unwrap();
    let mut again = vec![1, 2, 3];
    same.begin(&again, &sampler, 0).unwrap();
    again.extend(&answer[..12]);
    assert_eq!(same.propose(&ctx(&again, &sampler)).unwrap().drafted(), 0);
}

/// The outcome of a step that verified `accepted` (drafted node ids, root's child first) and
/// then emitted `bonus`.
fn outcome(tree: &TokenTree, accepted: &[usize], bonus: TokenId) -> VerifyOutcome {
    let mut tokens: Vec<TokenId> = accepted.iter().map(|&n| tree.node(n).token).collect();
    tokens.push(bonus);
    VerifyOutcome { accepted: accepted.to_vec(), tokens, depths: Vec::new() }
}

#[test]
fn priced_out_children_are_learned_from_the_text_that_followed() {
    let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let shared = SuffixShared::empty();
    let config = SuffixConfig { explore_every: 0, shared: shared.clone(), ..Default::default() };
    let mut d = SuffixDrafter::new(config).unwrap();
    // After [7, 8] the text went on once with 1 and once with 2: a split vote, not verified.
    let mut text = vec![7, 8, 1, 7, 8, 2, 7, 8];
    d.begin(&text, &sampler, 0).unwrap();
    let tree = d.propose(&ctx(&text, &sampler)).unwrap();
    assert_eq!(tree.drafted(), 0);
    d.observe(&tree, &outcome(&tree, &[], 1)).unwrap();
    assert_eq!(shared.pricing().total_trials(), 0, "nothing was verified");
    // The text took 1: at the next step both priced-out children are scored, for free.
    text.push(1);
    d.propose(&ctx(&text, &sampler)).unwrap();
    assert_eq!(shared.pricing().total_trials(), 2);
    // One hit (the child 1) and one miss, against what their prices expected.
    assert!((d.calibration.hits - 1.0).abs() < 0.05 && d.calibration.expected > 0.0);
}

#[test]
fn verified_nodes_are_learned_once() {
    let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let shared = SuffixShared::empty();
    trained(&shared);
    let config = SuffixConfig { explore_every: 0, shared: shared.clone(), ..Default::default() };
    let mut d = SuffixDrafter::new(config).unwrap();
    let (_, mut history) = copying(&[1, 2]);
    d.begin(&history, &sampler, 0).unwrap();
    let tree = d.propose(&ctx(&history, &sampler)).unwrap();
    assert!(tree.drafted() >= 5 && tree.leaves().len() == 1, "one long chain");
    let before = shared.pricing().total_trials();
    // The target took the chain's first three tokens and then another than the fourth.
    let step = outcome(&tree, &[1, 2, 3], 9999);
    d.observe(&tree, &step).unwrap();
    assert_eq!(shared.pricing().total_trials(), before + 4, "three accepted, one rejected");
    // The next step scores the trie along the same path: every node on it was verified.
    history.extend(&step.tokens);
    d.propose(&ctx(&history, &sampler)).unwrap();
    assert_eq!(shared.pricing().total_trials(), before + 4);
}

#[test]
fn a_request_calibration_bends_prices_toward_what_its_text_showed() {
    let neutral = RequestCalibration::NEUTRAL;
    assert!((neutral.adjust(0.6) - 0.6).abs() < 1e-12);
    let (mut leaving, mut following) = (neutral, neutral);
    for _ in 0..30 {
        leaving.record(0.0, 0.7, 1.0, NODE_DECAY);
        following.record(1.0, 0.5, 1.0, NODE_DECAY);
    }
    assert!(leaving.ratio() < 1.0 && following.ratio() > 1.0);
    assert!(leaving.ratio() >= CALIBRATION_RANGE.0 && following.ratio() <= CALIBRATION_RANGE.1);
    for c in [leaving, following] {
        assert_eq!(c.adjust(0.0), 0.0);
        assert!(c.adjust(0.3) < c.adjust(0.6) && c.adjust(0.6) < c.adjust(1.0), "order is kept");
    }
    assert_eq!((leaving.adjust(1.0), following.adjust(1.0)), (leaving.ratio(), 1.0));
    assert!(leaving.adjust(0.6) < 0.6 && following.adjust(0.6) > 0.6 && following.adjust(0.6) < 1.0);
    // Below 1 the ratio scales the price itself: a third as many hits, a third of the price.
    assert!((leaving.adjust(0.9) - 0.9 * leaving.ratio()).abs() < 1e-12);
    // A copy priced 0.8 a node that came true every time: its misses' ratio, not its hits',
    // prices it (hits alone could not lift it past 0.8 × 1.25).
    let mut copying = neutral;
    for _ in 0..30 {
        copying.record(1.0, 0.8, 1.0, NODE_DECAY);
    }
    assert!(copying.ratio() < 1.25 && copying.adjust(0.8) > 0.9, "{}", copying.adjust(0.8));
    // A few nodes move the ratio only a little.
    let mut one = neutral;
    one.record(0.0, 0.9, 1.0, NODE_DECAY);
    assert!(one.ratio() > 0.7);
}

#[test]
fn a_request_that_keeps_leaving_its_matches_drafts_less_of_the_same_copy() {
    let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let shared = SuffixShared::empty();
    trained(&shared);
    let config = SuffixConfig { explore_every: 0, shared, ..Default::default() };
    let (_, history) = copying(&[1, 2]);
    let drafted = |calibration: RequestCalibration| {
        let mut d = SuffixDrafter::new(config.clone()).unwrap();
        d.begin(&history, &sampler, 0).unwrap();
        d.calibration = calibration;
        d.propose(&ctx(&history, &sampler)).unwrap().drafted()
    };
    let mut leaving = RequestCalibration::NEUTRAL;
    for _ in 0..50 {
        leaving.record(0.0, 0.9, 1.0, NODE_DECAY);
    }
    let (neutral, bent) = (drafted(RequestCalibration::NEUTRAL), drafted(leaving));
    assert!(neutral >= 20 && bent < neutral, "{bent} vs {neutral}");
}

/// A drafter on `trained` prices, begun on a request that copies a 40-token quote (no
/// exploration steps).
fn copying_drafter() -> (SuffixDrafter, Sampler, Vec<TokenId>) {
    let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let shared = SuffixShared::empty();
    trained(&shared);
    let config = SuffixConfig { explore_every: 0, shared, ..Default::default() };
    let mut d = SuffixDrafter::new(config).unwrap();
    let (_, history) = copying(&[1, 2]);
    d.begin(&history, &sampler, 0).unwrap();
    (d, sampler, history)
}

/// Three verified long chains, each rejected at the root's child.
fn fail_three_bets(d: &mut SuffixDrafter, sampler: &Sampler, history: &[TokenId]) {
    for _ in 0..3 {
        let tree = d.propose(&ctx(history, sampler)).unwrap();
        d.observe(&tree, &outcome(&tree, &[], 9999)).unwrap();
    }
}

#[test]
fn a_long_bet_that_falls_short_scales_the_next_ones_down() {
    let (mut d, sampler, history) = copying_drafter();
    let first = d.propose(&ctx(&history, &sampler)).unwrap();
    assert!(first.drafted() >= 20);
    // Three verified long chains each rejected at the root's child: the per-node prices barely
    // move (three misses), the step tally sees some 60 promised tokens and none delivered.
    fail_three_bets(&mut d, &sampler, &history);
    assert!(d.bets.ratio() <= 0.3, "{}", d.bets.ratio());
    let after = d.propose(&ctx(&history, &sampler)).unwrap();
    assert!(after.drafted() < first.drafted(), "{} vs {}", after.drafted(), first.drafted());
}

#[test]
fn a_request_that_stopped_betting_after_a_failed_bet_drafts_again_later() {
    let (mut d, sampler, history) = copying_drafter();
    fail_three_bets(&mut d, &sampler, &history);
    // The failed bets price everything out; the steps that bet nothing let the tally fade.
    let mut idle = 0;
    loop {
        let tree = d.propose(&ctx(&history, &sampler)).unwrap();
        if tree.drafted() > 0 {
            break;
        }
        d.observe(&tree, &outcome(&tree, &[], 9999)).unwrap();
        idle += 1;
        assert!(idle < 60, "still locked out: {}", d.bets.ratio());
    }
    assert!(idle >= 1, "the failed bets held it back for a while");
}

/// Pricing that has seen exact copies (as `trained`) and every kind of resumed copy accepted
/// many times, the two interleaved (old trials are forgotten).
fn trained_with_resumes(shared: &SuffixShared) {
    use treespec_core::suffix::{AnchorFeatures, ResumeKind};
    let mut p = shared.pricing();
    for _ in 0..40 {
        for match_len in [8, 12, 20, 40, 64] {
            for depth in 1..=64 {
                for global in [false, true] {
                    p.record(&NodeFeatures { match_len, depth, share: 1.0, support: 1, global }, true);
                }
            }
        }
        for kind in ResumeKind::ALL {
            for evidence in 0..=3 {
                for depth in 1..=16 {
                    p.record(&AnchorFeatures { kind, evidence, depth }, true);
                }
            }
        }
    }
}

/// Whether `tokens` is a path of `tree` from the root.
fn has_chain(tree: &TokenTree, tokens: &[TokenId]) -> bool {
    let mut at = ROOT;
    for &t in tokens {
        match tree.children(at).iter().find(|&&c| tree.node(c).token == t) {
            Some(&c) => at = c,
            None => return false,
        }
    }
    true
}

/// The drafter on the quote being copied (`copying`), its prices trained on copies and
/// resumes, after the step that drafted the rest of the quote: the target rejected it and
/// emitted `edit` instead, one token a step (the bets' tally kept neutral). Returns the
/// drafter, the text and the proposal after the edit.
fn after_edit(reanchor: bool, edit: &[TokenId]) -> (SuffixDrafter, Vec<TokenId>, TokenTree) {
    let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let shared = SuffixShared::empty();
    trained_with_resumes(&shared);
    let config = SuffixConfig { explore_every: 0, reanchor, shared, ..Default::default() };
    let mut d = SuffixDrafter::new(config).unwrap();
    let (quote, mut history) = copying(&[1, 2]);
    d.begin(&history, &sampler, 0).unwrap();
    let mut tree = d.propose(&ctx(&history, &sampler)).unwrap();
    assert!(has_chain(&tree, &quote[20..30]), "the copy is drafted");
    for &t in edit {
        d.observe(&tree, &outcome(&tree, &[], t)).unwrap();
        // A long chain rejected at once scales every later path value down (the bets'
        // tally, tested above); here only where the copy resumes is under test.
        d.bets = RequestCalibration::NEUTRAL;
        history.push(t);
        tree = d.propose(&ctx(&history, &sampler)).unwrap();
    }
    (d, history, tree)
}

#[test]
fn an_edit_in_a_copy_is_resumed_at_once_with_re_anchoring_and_not_without() {
    let quote: Vec<TokenId> = copying(&[]).0;
    // The target's tokens instead of the copy's quote[20], where the copy goes on, and how
    // much of that at least is verified at once (the request's tally of the rejected nodes
    // before trims the chains).
    let cases: [(&str, Vec<TokenId>, &[TokenId], usize); 4] = [
        // 900 inserted: the copy resumes with quote[20].
        ("insertion", vec![900], &quote[20..30], 2),
        // 900 replaced quote[20]: it resumes with quote[21].
        ("replacement", vec![900], &quote[21..31], 2),
        // quote[20..23] deleted: the target emitted quote[23], the copy goes on after it.
        ("deletion", vec![quote[23]], &quote[24..34], 2),
        // Two tokens replaced two: after the second, the copy resumes past both.
        ("two-token replacement", vec![900, 901], &quote[22..32], 1),
    ];
    for (what, edit, resumed, verified) in cases {
        let (d, _, tree) = after_edit(true, &edit);
        assert!(has_chain(&tree, &resumed[..verified]), "{what}: the resumed copy is drafted");
        assert!(d.stats().anchored_nodes_proposed >= verified as u64, "{what}: {:?}", d.stats());
        // The whole resumed copy is in the trie, for the pricing to learn from.
        assert!(has_chain(&d.shadow.as_ref().unwrap().trie, resumed), "{what}");
        assert!(d.stats().reanchor_steps >= 1, "{what}");
        // Without re-anchoring, the edited text matches nothing: nothing is drafted.
        let (off, _, tree) = after_edit(false, &edit);
        assert!(!has_chain(&tree, &resumed[..1]), "{what}");
        assert_eq!(tree.drafted(), 0, "{what}");
        assert_eq!(off.stats().reanchor_steps + off.stats().anchored_nodes_proposed, 0, "{what}");
    }
}

#[test]
fn a_resumed_copy_is_followed_and_then_drafted_by_its_long_match_again() {
    let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let quote: Vec<TokenId> = copying(&[]).0;
    // quote[20..23] deleted; the target emitted quote[23].
    let (mut d, mut history, tree) = after_edit(true, &[quote[23]]);
    // The target takes two tokens of the skip's chain, then the next copied token.
    let mut path = Vec::new();
    let mut at = ROOT;
    for &t in &quote[24..26] {
        at = *tree.children(at).iter().find(|&&c| tree.node(c).token == t).expect("on the chain");
        path.push(at);
    }
    let step = outcome(&tree, &path, quote[26]);
    d.observe(&tree, &step).unwrap();
    assert_eq!(d.stats().anchored_nodes_accepted, 2, "{:?}", d.stats());
    assert!(d.stats().anchored_nodes_verified >= 2, "{:?}", d.stats());
    history.extend(&step.tokens);
    // The copy agrees with its source again: the anchor follows it to quote[27] (the quote
    // starts after the 2-token head), and so does the trie. The 4-token match since the
    // deletion drafts the same chain: its nodes keep their match's price and teach the
    // follow cells too.
    d.propose(&ctx(&history, &sampler)).unwrap();
    assert_eq!(d.anchors.anchor(), Some((2 + 27, 0)));
    assert_eq!(d.anchors.offered()[0].kind, treespec_core::suffix::ResumeKind::Follow);
    let shadow = d.shadow.as_ref().unwrap();
    assert!(has_chain(&shadow.trie, &quote[27..37]), "the copy is followed");
    let first =
        *shadow.trie.children(ROOT).iter().find(|&&c| shadow.trie.node(c).token == quote[27]).unwrap();
    assert!(
        matches!(shadow.features[first], Features::Both(m, a) if m.match_len == 4
            && a.kind == treespec_core::suffix::ResumeKind::Follow && a.evidence == 3),
        "{:?}",
        shadow.features[first]
    );
    // Four more tokens of it: a strong match (8 tokens since the deletion) drafts it alone.
    history.extend(&quote[27..31]);
    let tree = d.propose(&ctx(&history, &sampler)).unwrap();
    assert!(d.anchors.offered().is_empty(), "{:?}", d.anchors.offered());
    assert!(has_chain(&tree, &quote[31..34]));
}

#[test]
fn resumes_are_learned_from_the_text_that_followed_like_every_node() {
    use treespec_core::suffix::{AnchorFeatures, ResumeKind};
    let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let shared = SuffixShared::empty();
    let config = SuffixConfig { explore_every: 0, shared: shared.clone(), ..Default::default() };
    let mut d = SuffixDrafter::new(config).unwrap();
    let (quote, mut history) = copying(&[1, 2]);
    d.begin(&history, &sampler, 0).unwrap();
    let tree = d.propose(&ctx(&history, &sampler)).unwrap();
    // 900 inserted: the resumes are in the trie, priced out by their cautious prior.
    d.observe(&tree, &outcome(&tree, &[], 900)).unwrap();
    history.push(900);
    let tree = d.propose(&ctx(&history, &sampler)).unwrap();
    assert_eq!(tree.drafted(), 0);
    assert!(d.stats().reanchor_steps == 1 && d.stats().anchored_nodes_proposed == 0);
    d.observe(&tree, &outcome(&tree, &[], quote[20])).unwrap();
    // The insertion ended: the stay's first node was right, the replacement's wrong.
    let stay = AnchorFeatures { kind: ResumeKind::Stay, evidence: 0, depth: 1 };
    let replace = AnchorFeatures { kind: ResumeKind::Replace, evidence: 0, depth: 1 };
    let fresh = SuffixPricing::new();
    history.push(quote[20]);
    d.propose(&ctx(&history, &sampler)).unwrap();
    let p = shared.pricing();
    assert!(p.posterior(&stay).0 > fresh.posterior(&stay).0);
    assert!(p.posterior(&replace).0 < fresh.posterior(&replace).0);
}
