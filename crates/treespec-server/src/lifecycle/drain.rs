//! Between the first stop request and the stop (`--drain`).

use std::sync::Arc;
use std::time::Duration;

use super::Stops;
use crate::job::GenerationBackend;
use crate::metrics::{Metrics, View};
use crate::Draining;

/// How a server drains before it stops.
pub struct Drain {
    /// Turned unready at the first stop request.
    pub draining: Draining,
    /// Told to stop when the drain ends.
    pub backend: Arc<dyn GenerationBackend>,
    /// Where the requests in flight are counted.
    pub metrics: Arc<Metrics>,
    /// Longest drain (zero: stop at the first request).
    pub most: Duration,
}

impl Drain {
    /// Resolves when the server should stop accepting connections. From the first stop request
    /// the server is unready and refuses new requests retryably while the queued and running
    /// ones finish — until none is left, `most` has passed, or a second request came. Then the
    /// backend stops: what still runs ends at its next step with what it has (finish reason
    /// `shutdown`), what still waits is refused.
    pub async fn after(self, mut stops: Stops) {
        stops.next().await;
        self.draining.drain();
        if !self.most.is_zero() {
            eprintln!(
                "treespec serve: draining: unready, new requests refused; up to {} s for the requests in flight (signal again to stop now)",
                self.most.as_secs_f64()
            );
            self.wait(&mut stops).await;
        }
        match self.busy() {
            0 => eprintln!("treespec serve: drained"),
            n => {
                eprintln!("treespec serve: stopping now: {n} request(s) end with finish_reason \"shutdown\"")
            }
        }
        self.backend.stop();
    }

    /// Until nothing is queued or running, `most` passed, or the next stop request.
    async fn wait(&self, stops: &mut Stops) {
        let deadline = tokio::time::Instant::now() + self.most;
        let mut second = std::pin::pin!(stops.next());
        while self.busy() > 0 && tokio::time::Instant::now() < deadline {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                _ = &mut second => return,
            }
        }
    }

    fn busy(&self) -> usize {
        self.backend.queue_depth() + self.metrics.generations_in_flight(View::Server)
    }
}
