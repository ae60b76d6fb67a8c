//! How many nodes `auto`'s free policies (suffix, long match) may bet at a step of a request:
//! slow start, as TCP grows its window. The first bets are probes; what the target accepted
//! lets the bets grow; nothing makes them shrink within a request. Only the free policies' own
//! steps move it: a draft model's tree taken whole says the text is predictable, not that it
//! copies (a code answer whose 9-node model trees were accepted let a 22-node suffix bet through
//! that brought 2 tokens for 15 plain steps' time).

/// Most nodes a free policy bets at a step until a free policy's step in this request has
/// brought what it was predicted to: the first bets are probes. Prices learned on other text
/// over-value a policy's first bet on text that does not copy (a 15-node suffix trie priced at 6
/// tokens that brings 0–1), and the books can only learn from a bet once it is verified; a probe
/// of a few rows costs little more than a plain step where a failed full bet costs several,
/// while a copy that is real pays on the probe and drafts at full size a few steps later
/// ([`BET_GROWTH`]).
const PROBE_NODES: usize = 4;

/// How the bets grow within a request: once [`PAID_TO_GROW`] drafted steps in a row brought
/// what they were predicted to, the next bets may run to this many times the drafted tokens the
/// last of them accepted (a single paid step: [`FIRST_GROWTH`] times). A copy that keeps paying
/// reaches full size in a few steps (4, 8, 32, 64 nodes), while a bet is never more than this
/// many times the longest run this text has shown. Measured (Qwen 1.5B, a RAG answer quoting
/// its document, Zen 5): after a 3-token quote paid, the suffix draft bet 40 nodes priced at 22
/// tokens, the quote ended, and the 41-row forward took 398 ms for 1 token — 14 plain steps.
const BET_GROWTH: usize = 4;

/// Drafted steps in a row that must bring what they were predicted to before the bets may grow
/// by [`BET_GROWTH`]; one paid step grows them by [`FIRST_GROWTH`] only. One paid probe says
/// little in prose: an answer quotes three words of its question and moves on. Measured cold on
/// 15 prose prompts (Qwen 1.5B, Zen 5): 3-node probes brought 0.94 of their predicted tokens,
/// and the 7–12-node bets that one fully accepted probe licensed brought 0.76 (1, 3, 4 tokens
/// for 140–190 ms), on answers of 15–40 tokens where one such step is 5–13% of the whole; in
/// code completions the same bets brought 1.5 of their prediction. The copies of qa, math, rag
/// and translation answers went from 13.9 plain steps lost over 12 prompts to 3.8; three code
/// completions' copies saved 197 plain steps instead of 208.
const PAID_TO_GROW: u32 = 2;

/// How far one paid step (not yet [`PAID_TO_GROW`] in a row) lets the bets grow: to twice the
/// drafted tokens it accepted, so a copy that goes on still grows, at half the pace.
const FIRST_GROWTH: usize = 2;

/// How a bet taken whole grows the cap: once more than [`PAID_TO_GROW`] drafted steps in a row
/// paid, a step whose deepest draft the target accepted to its end multiplies the cap by this.
/// Growth by the accepted run alone has a trap: where the curve makes a short bet worth more
/// than a mid-sized one and a long one worth more than both (Zen 3, Qwen 1.5B at 715 tokens of
/// context: 2 nodes beat 8, 16 beat both), a copy that started on 2-node bets holds the cap at
/// 8, never bets more than 2 and is taken 3 tokens a step to its end (a whole-file edit turn:
/// 20 steps of 2-node chains on a 64-token match). A bet the target took whole is the copy
/// showing that it goes on; three such steps in a row are no three-word quote.
const WHOLE_GROWTH: usize = 2;

/// The most that doubling ([`WHOLE_GROWTH`]) takes the cap to: a long match drafts at most 64
/// tokens, and 128 nodes hold any tree a free policy builds.
const WHOLE_MAX: usize = 128;

/// The cap of one request (see the constants for why each rule is there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BetCap {
    nodes: usize,
    /// Drafted steps in a row that brought what they were predicted to.
    paid_in_a_row: u32,
}

impl BetCap {
    /// A request's cap before any step: [`PROBE_NODES`].
    pub(super) fn new() -> Self {
        Self { nodes: PROBE_NODES, paid_in_a_row: 0 }
    }

    /// The most nodes a free policy may bet now.
    pub(super) fn nodes(&self) -> usize {
        self.nodes
    }

    /// A verified step of a free policy that drafted: `accepted` drafted tokens taken, of a draft
    /// whose deepest path was `depth` nodes; `paid` when it brought at least its predicted tokens.
    pub(super) fn after_step(&mut self, accepted: usize, depth: usize, paid: bool) {
        if !paid {
            self.paid_in_a_row = 0;
            return;
        }
        self.paid_in_a_row += 1;
        let growth = if self.paid_in_a_row >= PAID_TO_GROW { BET_GROWTH } else { FIRST_GROWTH };
        self.nodes = self.nodes.max(growth * accepted);
        if self.paid_in_a_row > PAID_TO_GROW && depth > 0 && accepted >= depth {
            self.nodes = self.nodes.max((self.nodes * WHOLE_GROWTH).min(WHOLE_MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` steps of 2-node chains, each taken whole and paid.
    fn whole_pairs(cap: &mut BetCap, n: usize) -> Vec<usize> {
        (0..n)
            .map(|_| {
                cap.after_step(2, 2, true);
                cap.nodes()
            })
            .collect()
    }

    #[test]
    fn bets_start_as_probes_and_grow_by_the_accepted_run() {
        let mut cap = BetCap::new();
        assert_eq!(cap.nodes(), PROBE_NODES);
        cap.after_step(4, 4, true);
        assert_eq!(cap.nodes(), 8, "one paid step: twice its run");
        cap.after_step(8, 8, true);
        assert_eq!(cap.nodes(), 32, "two in a row: 4 times the run");
    }

    /// The trap: a copy taken in 2-node chains. By the accepted run alone the cap stops at 8;
    /// from the third whole step in a row on it doubles to the most any free bet needs.
    #[test]
    fn a_copy_taken_in_short_chains_outgrows_them() {
        let mut cap = BetCap::new();
        assert_eq!(whole_pairs(&mut cap, 7), vec![4, 8, 16, 32, 64, 128, 128]);
    }

    /// A three-word quote in prose: one or two paid steps, then a miss, again and again. The
    /// cap grows by the runs it saw and never doubles.
    #[test]
    fn quotes_that_end_do_not_double_the_cap() {
        let mut cap = BetCap::new();
        for _ in 0..10 {
            cap.after_step(3, 3, true);
            cap.after_step(3, 3, true);
            cap.after_step(0, 3, false);
        }
        assert_eq!(cap.nodes(), 12);
    }

    /// A step that paid but left its deepest path unfinished (a trie whose other branch was
    /// right, a chain cut by an edit that still beat its price) grows the cap by its run only.
    #[test]
    fn only_a_bet_taken_whole_doubles() {
        let mut cap = BetCap::new();
        whole_pairs(&mut cap, 2);
        assert_eq!(cap.nodes(), 8);
        cap.after_step(2, 6, true);
        cap.after_step(3, 8, true);
        assert_eq!(cap.nodes(), 12);
        cap.after_step(0, 0, true);
        assert_eq!(cap.nodes(), 12, "nothing drafted, nothing shown");
    }

    #[test]
    fn the_cap_never_shrinks() {
        let mut cap = BetCap::new();
        cap.after_step(50, 64, true);
        cap.after_step(60, 64, true);
        assert_eq!(cap.nodes(), 240);
        cap.after_step(64, 64, true);
        assert_eq!(cap.nodes(), 256, "doubling is bounded, growth by the run is not");
        cap.after_step(1, 64, false);
        whole_pairs(&mut cap, 5);
        assert_eq!(cap.nodes(), 256);
    }
}
