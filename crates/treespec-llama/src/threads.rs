//! The one rule for thread counts, shared by every command that runs llama.cpp kernels.
//!
//! llama.cpp's OpenMP workers spin while they wait for each other, so more threads than cores
//! does not just fail to help: on 2 cores, 1000 threads decode at 0.3 tokens/s. A count of 0
//! means nothing sensible either (llama.cpp would pick its own default for some calls and
//! divide by it in others). So 0 is refused and anything above the cores this process may use
//! is capped to them.

use treespec_engine::{EngineError, Result};

/// CPU cores this process may use (its affinity mask and cgroup quota included).
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The thread count to use for a request of `requested`: an error for 0, capped at
/// [`available_cores`].
pub fn effective_threads(requested: usize) -> Result<usize> {
    if requested == 0 {
        return Err(EngineError::InvalidRequest("the thread count must be at least 1".into()));
    }
    Ok(requested.min(available_cores()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_refused_and_excess_is_capped() {
        assert!(effective_threads(0).is_err());
        assert_eq!(effective_threads(1).unwrap(), 1);
        assert_eq!(effective_threads(100_000).unwrap(), available_cores());
    }
}
