//! A response body that holds its session while it is sent.
//!
//! A download streams from an open file in the session's workspace: the file
//! pins the workspace's mount (and its loop device and image) for as long as it
//! is open, so the body holds the session ([`crate::session::Use`]) for as long as
//! it lives. The session's teardown cuts it: the body ends with an error, and its
//! connection is cut ([`crate::serve::Connection::cut`]), which also ends a body
//! that hyper is not polling because its client stopped reading. The hold is
//! dropped with the body, and the teardown goes on.

use crate::serve::Connection;
use crate::session::Use;
use axum::body::{Body, Bytes};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio_util::sync::{CancellationToken, DropGuard, WaitForCancellationFutureOwned};

/// `inner`, holding `hold` until it ends or is dropped; cut (and `conn` with it)
/// when the session's teardown begins.
pub fn held(inner: Body, hold: Use, conn: Option<Connection>) -> Body {
    let cut = hold.cut();
    let done = CancellationToken::new();
    if let Some(conn) = conn {
        let (cut, done) = (cut.clone(), done.clone());
        // This answer's request: once it is answered, the connection serves others.
        let request = conn.request();
        tokio::spawn(async move {
            tokio::select! {
                () = cut.cancelled() => conn.cut_during(request),
                () = done.cancelled() => {}
            }
        });
    }
    Body::new(Held { inner, hold: Some(hold), cut: Box::pin(cut.cancelled_owned()), _done: done.drop_guard() })
}

struct Held {
    inner: Body,
    hold: Option<Use>,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Ends the watcher task with the body.
    _done: DropGuard,
}

/// The session of a body closed while it was sent.
#[derive(Debug, thiserror::Error)]
#[error("the session was closed while this response was sent")]
struct Cut;

impl HttpBody for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        if this.hold.is_some() && this.cut.as_mut().poll(cx).is_ready() {
            this.hold = None;
            return Poll::Ready(Some(Err(axum::Error::new(Cut))));
        }
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            // Sent whole: the session is free to go.
            this.hold = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
