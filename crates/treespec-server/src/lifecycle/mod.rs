//! The server's life from the listening socket to the exit: serve until told to stop, drain
//! within a bound, end what still runs, save what the tenants taught it ([`run`]). The
//! `treespec serve` binary and the tests drive the same code; only where the stop requests come
//! from differs ([`Stops`]: the OS's signals, or a test's sender).
//!
//! The bound is the point: orchestrators send SIGKILL when their grace period ends, so a server
//! that lets running streams finish on their own (minutes for a long answer) loses them and the
//! history since its last save. Here the drain waits at most `--drain` seconds, then the
//! scheduler ends every request still decoding with what it has (finish reason
//! [`SHUTDOWN`](crate::job::SHUTDOWN)), the connections close within [`CLOSE_WAIT`], and the
//! histories are saved. A second stop request skips the rest of the drain.
//!
//! A server starts itself too ([`Server`], `start.rs`): the tenants' histories loaded, the
//! backend on its models, on llama.cpp a cost-aware default measured in the background and
//! switched to when its curves are in (`curves.rs`); `treespec serve` only parses its flags.

mod curves;
mod drain;
mod saves;
mod start;
mod stops;

pub use drain::Drain;
pub use saves::{report_saves, PeriodicSave};
pub use start::{HistoryFiles, LlamaStart, Server, Start, Stopped};
pub use stops::{StopSender, Stops};

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

use crate::histories::TenantHistories;

pub use crate::http::serve::CLOSE_WAIT;

/// What [`run`] serves and keeps.
pub struct Serving {
    /// The application ([`crate::router`]).
    pub app: Router,
    /// How the stop is drained.
    pub drain: Drain,
    /// The tenants' histories, saved at the stop (and every `save_every` while serving).
    pub histories: Arc<TenantHistories>,
    /// How often to save the histories that changed (None: only at the stop).
    pub save_every: Option<Duration>,
    /// Each connection a TLS session first (`--ssl-cert-file`, `--ssl-key-file`); None: plain HTTP.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

/// Serve on `listener` until `stops` asks twice or the drain ends, then save the histories.
/// Returns once the connections are closed (or [`CLOSE_WAIT`] passed) and the save is done; a
/// failed save is the error.
pub async fn run(listener: TcpListener, serving: Serving, stops: Stops) -> anyhow::Result<()> {
    let Serving { app, drain, histories, save_every, tls } = serving;
    let saver = save_every.map(|every| PeriodicSave::start(histories.clone(), every));
    crate::http::serve::serve_with(listener, app, drain.after(stops), tls).await?;
    drop(saver);
    report_saves(histories.save_changed())
}
