//! Pricing a step's trie and choosing what to verify: every node priced at a lower confidence
//! bound of its learned acceptance, bent by the request's calibration and its bets; the
//! value-ordered prefix with the best gain on the target's cost curve kept (or, without curves,
//! the nodes worth at least `min_value`). Exploration steps price little-tried cells
//! optimistically so that a pessimistic price cannot lock them out forever.

use treespec_core::budget::value_order;
use treespec_core::suffix::Features;
use treespec_core::tree::{TokenTree, ROOT};

use super::SuffixDrafter;

/// Most nodes an exploration step verifies beyond what the pessimistic prices would: this many,
/// plus as many again as they keep. Doubling lets a long copy reach, within a few exploration
/// steps, the depths its pessimistic price never lets it verify (an untried cell is priced near
/// 0.89 however good its prior, and 16 such nodes in a row are worth almost nothing), while a
/// weak match costs at most a few extra rows.
pub(super) const EXPLORE_EXTRA: usize = 4;

/// What [`SuffixDrafter::select`] chose.
pub(super) struct Selection {
    /// The trie's nodes in value order.
    pub(super) order: Vec<usize>,
    /// How many of them to verify.
    pub(super) keep: usize,
    /// The expected gain of verifying them.
    pub(super) gain: f64,
    /// Every trie node's path value, and its posterior mean acceptance under the shared prices.
    pub(super) value: Vec<f64>,
    pub(super) means: Vec<f64>,
}

impl SuffixDrafter {
    /// The step's choice among the nodes of `tree` (at most `room`): the pessimistic one, or on
    /// an exploration step (`explore`) the optimistic order, keeping a few nodes past the
    /// cautious choice. Gain, values and means stay the pessimistic ones.
    pub(super) fn choose(
        &self,
        tree: &TokenTree,
        features: &[Features],
        room: usize,
        explore: bool,
    ) -> Selection {
        let Selection { mut order, mut keep, gain, value, means } = self.select(tree, features, room, false);
        if explore {
            // Little-tried cells at their optimistic price, a few nodes past the cautious choice.
            let optimistic = self.select(tree, features, room, true);
            (order, keep) = (optimistic.order, optimistic.keep.min(2 * keep + EXPLORE_EXTRA));
        }
        Selection { order, keep, gain, value, means }
    }

    /// The nodes of `tree` in value order and how many of them to verify (at most `room`): every
    /// node priced pessimistically, or on an exploration step (`explore`) little-tried cells
    /// optimistically.
    fn select(&self, tree: &TokenTree, features: &[Features], room: usize, explore: bool) -> Selection {
        let pricing = self.config.shared.pricing();
        let z = self.config.pessimism;
        let mut value = vec![1.0; tree.len()];
        let mut means = vec![1.0; tree.len()];
        for (id, node) in tree.nodes().iter().enumerate().skip(1) {
            let f = &features[id];
            let price = if explore { pricing.exploration_price(f, z) } else { pricing.price(f, z) };
            let price = self.calibration.adjust(price);
            value[id] = value[node.parent.unwrap_or(ROOT)] * price;
            means[id] = pricing.posterior(f).0;
        }
        drop(pricing);
        // A request whose verified steps fell short of what their values promised has every
        // path value scaled down by as much (never up: the node prices already rose with it).
        let shortfall = self.bets.ratio().min(1.0);
        for v in value.iter_mut().skip(1) {
            *v *= shortfall;
        }
        let order = value_order(tree, &value);
        let values: Vec<f64> = order.iter().take(room).map(|&n| value[n]).collect();
        let (keep, gain) = match &self.budget {
            Some(b) => b.economics().best_prefix(&values),
            None => (values.iter().take_while(|&&v| v >= self.config.min_value).count(), 0.0),
        };
        Selection { order, keep, gain, value, means }
    }
}
