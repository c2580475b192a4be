//! Serving a listener: hyper's HTTP/1 on each accepted connection, with the
//! daemon's limits on what one client can hold.
//!
//! - Headers must arrive within `header_timeout` (also the most a kept-alive
//!   connection idles between requests); bodies have their own timeouts in
//!   [`crate::api::surface`].
//! - Every write of a response may wait at most `send_timeout` for the client to
//!   take bytes ([`SendTimeout`]): a client that stops reading a download or an
//!   event stream loses its connection, and with it what the response held.
//! - Connections have places ([`Slots`]): anonymous ones give way to new ones,
//!   each token holds at most its share, and each can be cut at once
//!   ([`Connection::cut`]: a session's teardown ends the bodies that hold it).
//!
//! Every request carries its [`Connection`] as an extension, for `auth` to claim
//! and for bodies to be cut.

mod send_timeout;
mod slots;

pub use send_timeout::SendTimeout;
pub use slots::{Connection, Full, SlotLimits, Slots};

use std::time::Duration;
use tokio::sync::watch;

/// How a listener's connections are served.
#[derive(Debug, Clone)]
pub struct Limits {
    pub slots: SlotLimits,
    /// For a request's headers, and for the next request on a kept-alive connection.
    pub header_timeout: Duration,
    /// Longest a response's write may wait for the client to take bytes.
    pub send_timeout: Duration,
    /// After `stop`, how long connections get to finish before they are cut.
    pub drain: Duration,
}

/// At most one warning a second, with how many times it happened meanwhile.
struct Warnings {
    last: Option<tokio::time::Instant>,
    count: u64,
}

impl Warnings {
    fn new() -> Warnings {
        Warnings { last: None, count: 0 }
    }

    /// Count one; `Some(count)` when it is time to say so.
    fn note(&mut self) -> Option<u64> {
        self.count += 1;
        if self.last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            self.last = Some(tokio::time::Instant::now());
            return Some(std::mem::take(&mut self.count));
        }
        None
    }
}

/// Serve `app` on `listener` (HTTP/1, with [`Limits`]) until `stop` turns true,
/// then let requests in progress finish (for at most `limits.drain`) and close
/// idle connections.
pub fn serve_until_stopped<L>(
    servers: &mut tokio::task::JoinSet<std::io::Result<()>>,
    mut listener: L,
    name: &'static str,
    app: axum::Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) where
    L: axum::serve::Listener,
{
    servers.spawn(async move {
        let slots = Slots::new(limits.slots);
        let mut connections = tokio::task::JoinSet::new();
        let (mut refused, mut evicted) = (Warnings::new(), Warnings::new());
        loop {
            let io = tokio::select! {
                (io, _) = listener.accept() => io,
                _ = stop.wait_for(|s| *s) => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            };
            let mut admitted = slots.admit();
            while let Some(ripe) = admitted.later {
                // Every anonymous connection is within its grace: this one waits
                // (and so does the accepting of others) until one is not.
                tokio::select! {
                    () = tokio::time::sleep_until(ripe) => admitted = slots.admit(),
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
            if admitted.later.is_some() {
                break;
            }
            if admitted.evicted {
                if let Some(n) = evicted.note() {
                    tracing::info!(
                        listener = name,
                        max_anonymous_connections = limits.slots.anonymous,
                        closed = n,
                        "connections without a request from a known token are at their limit: closing the ones waiting longest (see max_anonymous_connections)"
                    );
                }
            }
            let Some(slot) = admitted.slot else {
                drop(io);
                if let Some(n) = refused.note() {
                    tracing::warn!(
                        listener = name,
                        max_connections = limits.slots.max,
                        refused = n,
                        "too many open connections: closing new ones at once (see max_connections)"
                    );
                }
                continue;
            };
            connections.spawn(serve_connection(io, slot, app.clone(), limits.clone(), stop.clone(), name));
            // Let the new connection read its request before the next accept: a
            // backlog of a flood's connections must not evict it first.
            tokio::task::yield_now().await;
        }
        drop(listener);
        let drained =
            tokio::time::timeout(limits.drain, async { while connections.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!(
                listener = name,
                open = connections.len(),
                "connections still open after the grace period: closing them"
            );
            connections.shutdown().await;
        }
        Ok(())
    });
}

/// A response body that ends its request's [`slots::InFlight`] when dropped.
struct Tracked {
    body: axum::body::Body,
    _in_flight: slots::InFlight,
}

impl hyper::body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// One connection, until it ends, is cut, or (after `stop`) finishes its request.
async fn serve_connection<I>(
    io: I,
    slot: slots::Slot,
    app: axum::Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
    name: &'static str,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use hyper::service::Service as _;
    let conn = slot.connection();
    let cut = conn.cut_token().clone();
    let tower = hyper_util::service::TowerToHyperService::new(app);
    let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        // In progress until its answer's body is sent (or dropped).
        let in_flight = conn.begin();
        req.extensions_mut().insert(conn.clone());
        let answer = tower.call(req);
        async move {
            let response = answer.await?;
            Ok::<_, std::convert::Infallible>(
                response.map(|body| axum::body::Body::new(Tracked { body, _in_flight: in_flight })),
            )
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    let io = hyper_util::rt::TokioIo::new(SendTimeout::new(io, limits.send_timeout));
    let served = builder.serve_connection(io, service);
    tokio::pin!(served);
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let ended = tokio::select! {
        r = served.as_mut() => r,
        () = cut.cancelled() => Ok(()),
        () = stopped => {
            served.as_mut().graceful_shutdown();
            tokio::select! {
                r = served.as_mut() => r,
                () = cut.cancelled() => Ok(()),
            }
        }
    };
    if let Err(e) = ended {
        tracing::debug!(listener = name, error = %e, "connection ended with an error");
    }
    if cut.is_cancelled() {
        tracing::debug!(listener = name, "connection cut");
    }
    // The connection (and the response body it was sending) is dropped here,
    // before its place (`slot`, a parameter) is freed.
}
