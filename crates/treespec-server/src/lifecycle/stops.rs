//! Where stop requests come from: SIGTERM and Ctrl-C for the binary, a [`StopSender`] for tests
//! and embedders. The first request drains; the next one means now.

use tokio::sync::mpsc;

/// A stream of stop requests.
pub struct Stops(mpsc::UnboundedReceiver<()>);

/// Asks a server to stop ([`StopSender::stop`]); a second call skips the drain.
#[derive(Debug, Clone)]
pub struct StopSender(mpsc::UnboundedSender<()>);

impl StopSender {
    /// Ask once more.
    pub fn stop(&self) {
        let _ = self.0.send(());
    }
}

impl Stops {
    /// Stops that a [`StopSender`] asks for.
    pub fn channel() -> (StopSender, Self) {
        let (tx, rx) = mpsc::unbounded_channel();
        (StopSender(tx), Self(rx))
    }

    /// Stops on every SIGINT (Ctrl-C) and, on Unix, SIGTERM (what service managers, `kill` and
    /// orchestrators send). Call inside a Tokio runtime.
    pub fn os_signals() -> Self {
        let (tx, rx) = Self::channel();
        tokio::spawn(async move {
            loop {
                os_signal().await;
                tx.stop();
            }
        });
        rx
    }

    /// The next stop request (pending forever once every sender is gone).
    pub async fn next(&mut self) {
        if self.0.recv().await.is_none() {
            std::future::pending::<()>().await;
        }
    }
}

/// Resolves on Ctrl-C (SIGINT) or, on Unix, SIGTERM.
async fn os_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
