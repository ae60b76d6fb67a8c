//! The deadline of a request's body (`--timeout`, llama-server's `-to`): a client that sends its
//! body a byte at a time holds a connection and a task for as long as it likes unless the body as
//! a whole has a deadline. Per-read timeouts do not cut it (each byte comes in time), so the
//! deadline runs from the moment the headers are read to the body's last byte. The headers have
//! hyper's own bound (`serve.rs`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use tokio::time::Sleep;

use crate::error::BodyTimedOut;
use crate::http::state::AppState;

/// A body that fails once `deadline` has passed since it was made.
struct DeadlineBody {
    inner: Body,
    sleep: Pin<Box<Sleep>>,
    deadline: Duration,
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut(this.deadline))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Middleware: every request's body must arrive within the server's body deadline.
pub async fn body_deadline(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let deadline = s.body_timeout;
    let req = req.map(|inner| {
        Body::new(DeadlineBody { inner, sleep: Box::pin(tokio::time::sleep(deadline)), deadline })
    });
    next.run(req).await
}
