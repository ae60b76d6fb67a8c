//! The accept loop: HTTP/1 connections served by hyper with half-close allowed.
//!
//! `axum::serve` hides hyper's settings, and hyper's HTTP/1 default closes a connection as soon as
//! its read side reaches end-of-file, even when a complete request is waiting for its answer: a
//! client that sends a request and then shuts down its write side (`shutdown(SHUT_WR)`, as
//! `curl`-like tools and some proxies do) got no response at all. With `half_close(true)` the
//! request is answered and the connection closed afterwards. Shutdown is graceful: the listener
//! stops, every connection finishes its current response, and then `serve` returns.
//!
//! Half-closing is also how a client that went away looks from here (both send FIN), and hyper
//! does not read a half-closing connection while a request is in flight; so every request
//! carries a [`PeerClosed`] that peeks at its socket and resolves once the read side has ended:
//! a non-streamed answer then probes whether anybody still reads (see `routes`), so an abandoned
//! request lets go of its lane instead of running to `max_tokens`. Behind TLS ([`super::tls`]) the
//! same holds through the probes' failed writes.

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::tls::HANDSHAKE_TIMEOUT;

/// Longest wait, once the server stops, for its connections to send their last bytes (every
/// request has had its final event by then; only a client that does not read holds one open).
pub const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Serve `app` on `listener` until `shutdown` resolves, then wait for open connections to finish
/// their current response, at most [`CLOSE_WAIT`]: a client that stopped reading must not hold
/// the process (what is left of its connection is dropped).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, app, shutdown, None).await
}

/// [`serve`], each connection a TLS session first when `tls` is given ([`super::tls`]).
pub async fn serve_with(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    tls: Option<TlsAcceptor>,
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
        let stream = Arc::new(stream);
        let peer = PeerClosed(stream.clone());
        let stream = SharedSocket(stream);
        let service = TowerToHyperService::new(app.clone().layer(axum::Extension(peer)));
        let stop = stop_rx.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => connection(stream, service, stop).await,
                // A failed or stalled handshake drops the connection; nothing was asked yet.
                Some(tls) => {
                    if let Ok(Ok(stream)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await
                    {
                        connection(stream, service, stop).await;
                    }
                }
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(());
    drop(stop_rx);
    let _ = tokio::time::timeout(CLOSE_WAIT, stop_tx.closed()).await;
    Ok(())
}

/// Serve one connection's requests until it closes, or finish its current response once `stop`
/// says so.
async fn connection<I>(io: I, service: TowerToHyperService<Router>, mut stop: watch::Receiver<()>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = http1::Builder::new();
    builder.half_close(true);
    // With a timer hyper bounds the wait for a request's headers (its default, 30 s): a client
    // trickling header bytes is cut off. The body's bound is `deadline.rs`'s.
    builder.timer(hyper_util::rt::TokioTimer::new());
    let mut conn = pin!(builder.serve_connection(TokioIo::new(io), service));
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.as_mut().await;
        }
    }
}

/// A request's connection, to tell whether its client is still there: [`PeerClosed::closed`]
/// resolves when the read side has ended (end-of-file or an error): the client half-closed or
/// went away. It only peeks, so a pipelined next request stays for hyper.
#[derive(Debug, Clone)]
pub struct PeerClosed(Arc<TcpStream>);

impl PeerClosed {
    /// Resolves once the client has closed its side (never while it is merely quiet).
    pub async fn closed(&self) {
        let mut byte = [0u8; 1];
        loop {
            match self.0.peek(&mut byte).await {
                Ok(0) | Err(_) => return,
                // A pipelined request waits: look again a little later.
                Ok(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }
}

/// The connection's socket as hyper's I/O, shared with the requests' [`PeerClosed`].
struct SharedSocket(Arc<TcpStream>);

impl AsyncRead for SharedSocket {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            match self.0.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for SharedSocket {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                written => return Poll::Ready(written),
            }
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                written => return Poll::Ready(written),
            }
        }
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(socket2::SockRef::from(&*self.0).shutdown(std::net::Shutdown::Write))
    }
}
