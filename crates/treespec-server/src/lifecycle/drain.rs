//! Between the first stop request and the stop (`--drain`).

use std::sync::Arc;
use std::time::Duration;

use super::Stops;
use crate::gateway::Lifecycle;
use crate::job::GenerationBackend;
use crate::metrics::{Metrics, View};

/// How a server drains before it stops.
pub struct Drain {
    /// Turned unready at the first stop request.
    pub lifecycle: Lifecycle,
    /// Where the queue is read.
    pub backend: Arc<dyn GenerationBackend>,
    /// Where the requests in flight are counted.
    pub metrics: Arc<Metrics>,
    /// Longest drain (zero: stop at the first request).
    pub most: Duration,
}

impl Drain {
    /// Resolves when the server should stop accepting connections: at the first stop request,
    /// after the server has drained — unready, refusing new requests, until nothing is queued or
    /// running (or `most` has passed, or a second request came).
    pub async fn after(self, mut stops: Stops) {
        stops.next().await;
        if self.most.is_zero() {
            return;
        }
        self.lifecycle.drain();
        eprintln!(
            "treespec serve: draining: unready, new requests refused; up to {} s for the requests in flight (signal again to stop now)",
            self.most.as_secs()
        );
        self.wait(&mut stops).await;
        match self.busy() {
            0 => eprintln!("treespec serve: drained"),
            n => eprintln!("treespec serve: stopping with {n} request(s) unfinished"),
        }
    }

    /// Until nothing is queued or running, `most` passed, or the next stop request.
    async fn wait(&self, stops: &mut Stops) {
        let deadline = tokio::time::Instant::now() + self.most;
        let mut second = std::pin::pin!(stops.next());
        while self.busy() > 0 && tokio::time::Instant::now() < deadline {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = &mut second => return,
            }
        }
    }

    fn busy(&self) -> usize {
        self.backend.queue_depth() + self.metrics.generations_in_flight(View::Server)
    }
}
