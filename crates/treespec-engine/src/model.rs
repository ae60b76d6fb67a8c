//! The single-sequence model seam ([`CausalLm`], [`TreeBatch`], [`Logits`]), now part of
//! [`crate::backend`]; re-exported at this path for code that still imports it from here.

pub use crate::backend::{CausalLm, Logits, TreeBatch};
