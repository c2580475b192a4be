//! A connection whose writes may not stay blocked: the daemon's side of a
//! minimum transfer rate.
//!
//! A response goes out as fast as its client takes it. A client that stops
//! reading fills its socket's buffers, and the daemon's next write then waits
//! (`Pending`) for room. [`SendTimeout`] lets a write (or flush, or shutdown) wait
//! at most `limit` for any progress: past that it fails with `TimedOut`, and hyper
//! closes the connection, dropping the response body and whatever it held (an
//! open file, its session's workspace, a run's output). Time spent with nothing to
//! write is not counted: an event stream waiting for a quiet run's next output is
//! never cut, only one whose client stopped taking its bytes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// `inner` with every blocked write limited to `limit` (see the module's notes).
pub struct SendTimeout<T> {
    inner: T,
    limit: Duration,
    timer: Pin<Box<Sleep>>,
    /// A write is waiting, and the timer is set for it.
    waiting: bool,
}

impl<T> SendTimeout<T> {
    pub fn new(inner: T, limit: Duration) -> SendTimeout<T> {
        SendTimeout { inner, limit, timer: Box::pin(tokio::time::sleep(limit)), waiting: false }
    }

    /// What a write call returned, with the time limit applied to `Pending`.
    fn watch<R>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        match polled {
            Poll::Ready(r) => {
                self.waiting = false;
                Poll::Ready(r)
            }
            Poll::Pending => {
                if !self.waiting {
                    self.timer.as_mut().reset(Instant::now() + self.limit);
                    self.waiting = true;
                }
                match self.timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client took no bytes for {} s (send_timeout_s)", self.limit.as_secs()),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SendTimeout<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SendTimeout<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const LIMIT: Duration = Duration::from_millis(300);

    #[tokio::test]
    async fn a_write_the_peer_does_not_take_fails_after_the_limit() {
        let (near, mut far) = tokio::io::duplex(1024);
        let mut conn = SendTimeout::new(near, LIMIT);
        // Room in the buffer: no waiting, however long the pause before.
        tokio::time::sleep(LIMIT * 2).await;
        conn.write_all(&[1; 1024]).await.unwrap();
        // Full: the next write waits, and fails once it has waited the limit.
        let started = Instant::now();
        let err = conn.write_all(&[2; 10]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= LIMIT && started.elapsed() < LIMIT * 5, "{:?}", started.elapsed());
        assert!(err.to_string().contains("send_timeout_s"), "{err}");
        // Reading is not limited.
        let mut got = [0u8; 1024];
        far.read_exact(&mut got).await.unwrap();
    }

    #[tokio::test]
    async fn a_slow_reader_that_keeps_taking_bytes_is_served() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut conn = SendTimeout::new(near, LIMIT);
        let reader = tokio::spawn(async move {
            let mut total = 0;
            let mut buf = [0u8; 64];
            while total < 64 * 8 {
                // Slow, but under the limit each time: 8 pauses add up to far more than it.
                tokio::time::sleep(LIMIT / 3).await;
                total += far.read(&mut buf).await.unwrap();
            }
            total
        });
        conn.write_all(&[7; 64 * 8]).await.unwrap();
        assert_eq!(reader.await.unwrap(), 64 * 8);
    }
}
