//! treespec-core: the pure-Rust heart of treespec.
//!
//! Everything here is plain data and arithmetic, with no tensor library, so the
//! speculative machinery can be tested exhaustively in milliseconds:
//!
//! * [`tree`] — arena token trees built by drafters, and [`flatten`] which turns a tree into one
//!   verify batch (positions, parents, ancestor sets, root-to-leaf paths, additive mask);
//! * [`dag`] — graph-structured drafts whose merged nodes unroll into a tree (GSD);
//! * [`sampling`] — logits → the exact processed distribution used by draft and target;
//! * [`verify`] — the three lossless verification families of ALGORITHMS.md §2, plus greedy;
//! * [`rng`] — seeded, reproducible random streams;
//! * [`noise`] — noise fixed per (seed, position, token): sampling whose output a seed decides
//!   under every method;
//! * [`stats`] — per-step acceptance records and their aggregation;
//! * [`suffix`] — suffix drafting: match index, global history, continuation tries, pricing;
//! * [`ngram`] — context n-grams and static Katz tables for prompt lookup;
//! * [`budget`], [`cost`], [`online_calibration`] — cost-aware tree sizing on measured curves, with
//!   acceptance learned online from verified steps;
//! * [`policy_bandit`] — `auto`'s decisions corrected by the time and tokens steps really took;
//! * [`sequoia`], [`disco`] — method-specific planners and classifiers;
//! * [`dist`] — probability vectors (sampling, residuals, draws without replacement);
//! * [`error`] — the crate's error type.

// Tests are exempt from the 80-line limit (clippy.toml): a test reads top to bottom as one story.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod budget;
pub mod cost;
pub mod dag;
pub mod disco;
pub mod dist;
pub mod error;
pub mod flatten;
pub mod ngram;
pub mod noise;
pub mod online_calibration;
pub mod policy_bandit;
pub mod rng;
pub mod sampling;
pub mod sequoia;
pub mod stats;
pub mod suffix;
pub mod tree;
pub mod verify;

pub use dist::Dist;
pub use error::{Error, Result};

/// A token id in the model's vocabulary.
pub type TokenId = u32;
