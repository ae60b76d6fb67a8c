//! Prompt lookup / context n-gram drafting: no draft model at all.
//!
//! The last `max_ngram` … `min_ngram` tokens of the history (prompt + generated) are looked up in a
//! hash index of the history's own n-grams ([`ContextIndex`]); what followed earlier occurrences is
//! proposed as a chain of up to `max_tokens` tokens. With `branches > 1` the best distinct
//! continuations are proposed together as a trie (shared prefixes drafted once). An optional
//! static [`NgramTable`] fills in when the history has no match (or too few), and extends a
//! continuation cut short by the end of the history.
//!
//! Lossless: every node is `Draw::Deterministic` (nothing is sampled), verified as a point mass
//! (family 3), which is exact whatever the n-grams propose. Draft forwards: 0.

use std::sync::Arc;

use treespec_core::ngram::{ContextIndex, NgramTable};
use treespec_core::sampling::Sampler;
use treespec_core::tree::{Draw, TokenTree, ROOT};
use treespec_core::verify::VerifyOutcome;
use treespec_core::TokenId;

use crate::drafter::{Drafter, ProposeContext, Provenance};
use crate::error::{EngineError, Result};
use crate::method_kind::MethodKind;

/// Prompt-lookup knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupConfig {
    /// Longest n-gram matched against the history. Default 3.
    pub max_ngram: usize,
    /// Shortest n-gram matched (shorter matches are tried only when longer ones fail). Default 1.
    pub min_ngram: usize,
    /// Tokens per proposed continuation (chain length; capped by the tokens still wanted).
    /// Default 8.
    pub max_tokens: usize,
    /// Distinct continuations proposed as separate branches of one tree. Default 1.
    pub branches: usize,
}

impl Default for LookupConfig {
    fn default() -> Self {
        Self { max_ngram: 3, min_ngram: 1, max_tokens: 8, branches: 1 }
    }
}

impl LookupConfig {
    /// Check every knob's domain; the message names the knob.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::InvalidRequest(format!("lookup {m}")));
        for (name, v) in [
            ("min_ngram", self.min_ngram),
            ("max_ngram", self.max_ngram),
            ("max_tokens", self.max_tokens),
            ("branches", self.branches),
        ] {
            if v == 0 {
                return bad(format!("{name} must be ≥ 1"));
            }
            // Sizes of per-step tables and trees: far beyond any useful draft, a stall or an
            // allocation failure.
            if v > MAX_KNOB {
                return bad(format!("{name} must be ≤ {MAX_KNOB}, got {v}"));
            }
        }
        if self.min_ngram > self.max_ngram {
            return bad(format!(
                "min_ngram ({}) must not exceed max_ngram ({})",
                self.min_ngram, self.max_ngram
            ));
        }
        Ok(())
    }
}

/// Largest value of any lookup size knob.
const MAX_KNOB: usize = 1024;

/// Per-generation counters of a [`LookupDrafter`] (reset by `begin`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LookupStats {
    /// `propose` calls.
    pub steps: u64,
    /// Steps where the history had a match.
    pub context_hits: u64,
    /// Steps where the static table contributed tokens.
    pub table_steps: u64,
    /// Nodes proposed, summed over steps.
    pub proposed: u64,
    /// Proposed nodes accepted.
    pub accepted: u64,
}

/// Drafts continuations of the history's own n-grams (see the module docs).
pub struct LookupDrafter {
    config: LookupConfig,
    index: ContextIndex,
    table: Option<Arc<NgramTable>>,
    stats: LookupStats,
}

impl LookupDrafter {
    /// A prompt-lookup drafter; errors on an invalid config.
    pub fn new(config: LookupConfig) -> Result<Self> {
        config.validate()?;
        let index = ContextIndex::new(config.min_ngram, config.max_ngram)?;
        Ok(Self { config, index, table: None, stats: LookupStats::default() })
    }

    /// A prompt-lookup drafter backed by a static n-gram table (which must belong to the target's
    /// tokenizer: the caller loads it with that tokenizer's [`treespec_core::ngram::TokenizerId`]).
    pub fn with_table(config: LookupConfig, table: Arc<NgramTable>) -> Result<Self> {
        let mut d = Self::new(config)?;
        d.table = Some(table);
        Ok(d)
    }

    /// The configuration.
    pub fn config(&self) -> &LookupConfig {
        &self.config
    }

    /// Counters since the last `begin`.
    pub fn stats(&self) -> &LookupStats {
        &self.stats
    }

    /// The continuations to propose, best first, each at most `len` tokens with a confidence in
    /// (0, 1) (how long a match it came from: `n / (max_ngram + 1)`, table guesses lowest);
    /// whether the history had a match; whether the table contributed.
    fn continuations(&self, history: &[TokenId], len: usize) -> (Vec<(Vec<TokenId>, f32)>, bool, bool) {
        let want = self.config.branches;
        let scale = (self.config.max_ngram + 1) as f32;
        let mut chains: Vec<(Vec<TokenId>, f32)> =
            self.index.lookup(len, want).into_iter().map(|c| (c.tokens, c.n as f32 / scale)).collect();
        let hit = !chains.is_empty();
        let Some(table) = &self.table else { return (chains, hit, false) };
        let mut used_table = false;
        // Continuations cut short by the end of the history: let the table finish them.
        for (chain, _) in &mut chains {
            if chain.len() < len {
                let mut ctx = history[history.len().saturating_sub(2)..].to_vec();
                ctx.extend_from_slice(chain);
                let more = table.greedy_chain(&ctx, len - chain.len());
                used_table |= !more.is_empty();
                chain.extend(more);
            }
        }
        if chains.len() < want {
            for (w, _) in table.top_next_after(history, want) {
                if chains.len() == want {
                    break;
                }
                if chains.iter().any(|(c, _)| c.first() == Some(&w)) {
                    continue;
                }
                let mut ctx = history[history.len().saturating_sub(1)..].to_vec();
                ctx.push(w);
                let mut chain = vec![w];
                chain.extend(table.greedy_chain(&ctx, len - 1));
                chains.push((chain, TABLE_CONFIDENCE));
                used_table = true;
            }
        }
        (chains, hit, used_table)
    }
}

/// Confidence score of a continuation guessed by the static table (below any context match).
const TABLE_CONFIDENCE: f32 = 0.1;

impl Drafter for LookupDrafter {
    fn kind(&self) -> MethodKind {
        MethodKind::Lookup
    }

    fn source(&self) -> Provenance {
        Provenance::Copied
    }

    /// Model-free and deterministic: the seed is unused.
    fn begin(&mut self, prompt: &[TokenId], _: &Sampler, _seed: u64) -> Result<()> {
        self.stats = LookupStats::default();
        self.index.clear();
        self.index.extend(prompt);
        Ok(())
    }

    fn propose(&mut self, ctx: &ProposeContext) -> Result<TokenTree> {
        self.stats.steps += 1;
        let mut tree = TokenTree::new(ctx.root());
        let len = self.config.max_tokens.min(ctx.max_depth);
        if len == 0 || ctx.max_nodes == 0 {
            return Ok(tree);
        }
        self.index.sync(ctx.history);
        let (chains, hit, used_table) = self.continuations(ctx.history, len);
        self.stats.context_hits += hit as u64;
        self.stats.table_steps += used_table as u64;
        // Insert as a trie: a shared prefix is one set of nodes, verified once.
        'chains: for (chain, confidence) in chains {
            let mut at = ROOT;
            for &t in &chain {
                if let Some(&c) = tree.children(at).iter().find(|&&c| tree.node(c).token == t) {
                    at = c;
                    continue;
                }
                if tree.drafted() >= ctx.max_nodes {
                    break 'chains;
                }
                at = tree.add(at, t, Draw::Deterministic, confidence)?;
            }
        }
        self.stats.proposed += tree.drafted() as u64;
        Ok(tree)
    }

    fn observe(&mut self, _tree: &TokenTree, outcome: &VerifyOutcome) -> Result<()> {
        // The index catches up from the history at the next propose.
        self.stats.accepted += outcome.accepted.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use treespec_core::sampling::SamplingParams;

    #[test]
    fn bad_configs_name_the_knob() {
        for (c, knob) in [
            (LookupConfig { max_ngram: 0, min_ngram: 0, ..Default::default() }, "min_ngram"),
            (LookupConfig { min_ngram: 4, ..Default::default() }, "min_ngram (4)"),
            (LookupConfig { max_tokens: 0, ..Default::default() }, "max_tokens"),
            (LookupConfig { branches: 0, ..Default::default() }, "branches"),
        ] {
            let e = LookupDrafter::new(c).err().expect("invalid").to_string();
            assert!(e.contains(knob), "{e}");
        }
    }

    #[test]
    fn branches_share_prefixes() {
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let mut d =
            LookupDrafter::new(LookupConfig { max_tokens: 3, branches: 3, ..Default::default() }).unwrap();
        let history = [5, 1, 2, 3, 9, 5, 1, 2, 4, 9, 5, 1, 7, 9, 5];
        d.begin(&history, &sampler, 0).unwrap();
        let ctx = ProposeContext {
            history: &history,
            max_nodes: 64,
            max_depth: 8,
            sampler: &sampler,
            batch_rows: 0,
            batch_cut: false,
            eos: &[],
        };
        let tree = d.propose(&ctx).unwrap();
        let mut paths: Vec<Vec<TokenId>> = tree.leaves().into_iter().map(|l| tree.path_tokens(l)).collect();
        paths.sort();
        // "9 5" was followed by "1 7 9" (newest) and "1 2 4"; "5" alone adds "1 2 3".
        assert_eq!(paths, vec![vec![1, 2, 3], vec![1, 2, 4], vec![1, 7, 9]]);
        assert_eq!(tree.drafted(), 6, "shared prefix 1 and 1 2 drafted once");
        // Room for two nodes only: the best chain's prefix.
        let small = ProposeContext { max_nodes: 2, ..ctx };
        assert_eq!(d.propose(&small).unwrap().drafted(), 2);
    }
}
