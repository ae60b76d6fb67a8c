//! Whether the server still takes new requests: the switch SIGTERM turns to draining (see
//! [`super::gateway`]). Its own file because the routes' shared state carries it and the gateway's
//! handlers read that state: kept with either, the two would import each other.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::ApiError;

/// Whether the server still takes new requests. Shared by the routes and the front end that
/// catches the stop signal.
#[derive(Debug, Clone, Default)]
pub struct Draining {
    draining: Arc<AtomicBool>,
}

impl Draining {
    /// Stop taking new requests: `/health` turns 503 and new generations are refused (retryably).
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether the server is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// The refusal of a new request while draining.
    pub fn check(&self) -> Result<(), ApiError> {
        match self.is_draining() {
            true => Err(ApiError::draining()),
            false => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draining_refuses_new_requests_retryably() {
        let l = Draining::default();
        assert!(l.check().is_ok());
        l.clone().drain();
        let e = l.check().unwrap_err();
        assert_eq!(e.status.as_u16(), 503);
        assert!(e.retry_after.is_some());
    }
}
