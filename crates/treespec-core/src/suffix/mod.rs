//! Suffix drafting's pure parts: where the text's suffix occurred before, what followed it, and
//! what such a continuation is worth.
//!
//! * [`index`] — a match index over a growing token store: the earlier occurrences of the longest
//!   suffixes of a query (up to 64 tokens), in O(1) per appended token;
//! * [`history`] — the global history: earlier requests' text, bounded, evicting the oldest
//!   (saved and loaded across runs by treespec-engine's `drafters::history_file`: the file, its
//!   lock and its format are I/O, not algorithms);
//! * [`trie`] — the continuations of several occurrences merged into one speculation trie whose
//!   nodes carry their match length, depth, vote share and source;
//! * [`anchor`] — the anchor of a long copy of the request's own text, and where the copy may
//!   resume once an edit breaks it (grafted onto the trie as extra branches);
//! * [`pricing`] — online, pessimistic acceptance estimates per feature cell.
//!
//! The drafter that puts them together (and its losslessness argument) lives in
//! `treespec_engine::drafters::suffix`.

pub mod anchor;
pub mod history;
pub mod index;
pub mod pricing;
pub mod trie;

pub use anchor::{AnchorTracker, Resume, ResumeKind, STRONG_MATCH};
pub use history::{prompt_key, GlobalHistory, DEFAULT_CAP_TOKENS};
pub use index::{LookupLimits, Occurrence, SuffixIndex, BREAK};
pub use pricing::{SuffixPricing, PRICING_GRID};
pub use trie::{
    continuation_trie, graft_resumes, AnchorFeatures, AsFeatures, Features, Matches, NodeFeatures, TrieNode,
};
