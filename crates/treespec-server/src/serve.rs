//! The accept loop: HTTP/1 connections served by hyper with half-close allowed.
//!
//! `axum::serve` hides hyper's settings, and hyper's HTTP/1 default closes a connection as soon as
//! its read side reaches end-of-file, even when a complete request is waiting for its answer: a
//! client that sends a request and then shuts down its write side (`shutdown(SHUT_WR)`, as
//! `curl`-like tools and some proxies do) got no response at all. With `half_close(true)` the
//! request is answered and the connection closed afterwards. Shutdown is graceful: the listener
//! stops, every connection finishes its current response, and then `serve` returns.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serve `app` on `listener` until `shutdown` resolves, then wait for open connections to finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Connections hold a receiver: a sent value asks them to finish, and `closed()` resolves once
    // every one of them is gone.
    let (stop_tx, stop_rx) = watch::channel(());
    let mut shutdown = pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Per-connection failures (reset before accept) and resource exhaustion (too many
                // open files) must not end the server: wait a little and go on.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(app.clone());
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut builder = http1::Builder::new();
            builder.half_close(true);
            let mut conn = pin!(builder.serve_connection(TokioIo::new(stream), service));
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stop.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.as_mut().await;
                }
            }
            drop(stop);
        });
    }
    drop(listener);
    let _ = stop_tx.send(());
    drop(stop_rx);
    stop_tx.closed().await;
    Ok(())
}
