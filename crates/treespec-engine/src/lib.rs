//! treespec-engine: the model seam ([`CausalLm`]), drafters over models, the speculative
//! generation loop, and pure-Rust toy models for tests and demos.

pub mod error;
pub mod model;

pub use error::{EngineError, Result};
pub use model::{CausalLm, Logits, TreeBatch};
