//! Property tests of the suffix match index against a brute-force matcher: on random texts over
//! small alphabets (many repeats, documents separated by breaks), the index must find exactly the
//! earlier occurrences a full scan finds, with the same match lengths, longest first.

use proptest::prelude::*;
use treespec_core::suffix::{GlobalHistory, LookupLimits, SuffixIndex, BREAK};
use treespec_core::TokenId;

/// Every position with a continuation and its match length against `query` (capped), by scan.
fn brute_force(store: &[TokenId], query: &[TokenId], max_match: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for end in 0..store.len() {
        if store[end] == BREAK {
            continue;
        }
        let len = store[..end]
            .iter()
            .rev()
            .zip(query.iter().rev())
            .take(max_match)
            .take_while(|(s, q)| s == q && **s != BREAK)
            .count();
        if len >= 2 {
            out.push((end, len));
        }
    }
    out
}

fn text() -> impl Strategy<Value = Vec<TokenId>> {
    // Alphabet of 3 plus rare breaks: long repeats are common.
    prop::collection::vec(prop_oneof![10 => 0u32..3, 1 => Just(BREAK)], 0..300)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn exhaustive_lookup_equals_a_full_scan(store in text(), query in prop::collection::vec(0u32..3, 0..40), max_match in 2usize..70) {
        let mut ix = SuffixIndex::new();
        ix.extend(&store);
        let limits = LookupLimits { want: usize::MAX, scan: usize::MAX, max_match };
        let mut got: Vec<(usize, usize)> = ix.lookup(&query, limits).iter().map(|o| (o.start, o.len)).collect();
        let mut want = brute_force(&store, &query, max_match.max(2));
        // Longest first, then most recent.
        for w in got.windows(2) {
            prop_assert!(w[0].1 > w[1].1 || (w[0].1 == w[1].1 && w[0].0 > w[1].0));
        }
        got.sort();
        want.sort();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn a_bounded_lookup_finds_the_longest_match(store in text(), cut in 0usize..300, want in 1usize..5) {
        // The query is the store's own text up to `cut` (as a request's history is), with the
        // default scan limits.
        let cut = cut.min(store.len());
        let mut history: Vec<TokenId> = store[..cut].iter().copied().filter(|&t| t != BREAK).collect();
        history.push(1);
        let mut ix = SuffixIndex::new();
        ix.extend(&history);
        let got = ix.lookup(&history, LookupLimits { want, ..LookupLimits::default() });
        let full = brute_force(&history, &history, 64);
        let best = full.iter().map(|&(_, l)| l).max();
        prop_assert_eq!(got.first().map(|o| o.len), best);
        prop_assert!(got.len() <= want);
        for o in &got {
            prop_assert!(full.contains(&(o.start, o.len)));
        }
    }

    #[test]
    fn the_global_history_never_passes_its_cap(docs in prop::collection::vec(prop::collection::vec(0u32..50, 0..40), 0..60), cap in 2usize..200) {
        let mut h = GlobalHistory::new(cap).unwrap();
        for (i, d) in docs.iter().enumerate() {
            h.add(i as u64, d);
            prop_assert!(h.tokens() <= cap, "{} tokens over a cap of {}", h.tokens(), cap);
        }
        // What is left is the newest documents, each followed by a break.
        if let Some(last) = docs.iter().rev().find(|d| !d.is_empty()) {
            let keep = last.len().min(cap - 1);
            let tail = &h.index().tokens()[h.tokens() - keep - 1..];
            prop_assert_eq!(&tail[..keep], &last[last.len() - keep..]);
            prop_assert_eq!(tail[keep], BREAK);
        }
    }
}
