//! A helper's control socket as the daemon reads it: a Unix stream whose reads
//! also take the fds sent with the bytes (SCM_RIGHTS), kept in order until the
//! line they came with is handled ([`FdStream::take_fd`]).
//!
//! On a Unix stream socket the kernel hands fds over with the bytes they were
//! sent with, and a read that meets them stops at those bytes' end, so fds and
//! lines keep their order. A plain `read` would drop them (the kernel closes fds
//! nobody receives). Only the helper writes on this socket (host root, the
//! daemon's own process); the daemon still keeps no more than [`MAX_HELD`] of
//! them, closing any beyond.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;

/// Most fds held before their lines are read.
pub const MAX_HELD: usize = 4;
/// Most fds taken from one read.
const PER_READ: usize = 4;

/// A Unix stream that keeps the fds it receives.
pub struct FdStream {
    inner: UnixStream,
    fds: VecDeque<OwnedFd>,
}

impl FdStream {
    pub fn new(inner: UnixStream) -> FdStream {
        FdStream { inner, fds: VecDeque::new() }
    }

    /// The oldest fd received and not yet taken.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
    }
}

/// One `recvmsg` on `sock` into `buf`, without blocking: the bytes read, and the
/// fds that came with them (close-on-exec).
fn recv(sock: RawFd, buf: &mut [u8]) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut space = nix::cmsg_space!([RawFd; PER_READ]);
    let mut iov = [std::io::IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT)?;
    let mut fds = vec![];
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            // SAFETY: SCM_RIGHTS just installed these fds in our table; we own them.
            fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    Ok((msg.bytes, fds))
}

impl AsyncRead for FdStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        loop {
            match me.inner.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
            let unfilled = buf.initialize_unfilled();
            let sock = me.inner.as_raw_fd();
            match me.inner.try_io(tokio::io::Interest::READABLE, || recv(sock, unfilled)) {
                Ok((n, fds)) => {
                    let room = MAX_HELD.saturating_sub(me.fds.len());
                    // Beyond the room, dropped here: closed.
                    me.fds.extend(fds.into_iter().take(room));
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for FdStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isolate::channel::Channel;
    use crate::isolate::message::Event;
    use std::io::Write;

    fn send(sock: &std::os::unix::net::UnixStream, line: &[u8], fds: &[RawFd]) {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        let iov = [std::io::IoSlice::new(line)];
        let cmsg = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
        sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None).unwrap();
    }

    /// Lines and the fds sent with them come out in order, whatever was read ahead.
    #[tokio::test]
    async fn fds_come_with_their_lines_in_order() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let mut channel = Channel::new(FdStream::new(UnixStream::from_std(ours).unwrap()), 1024);
        let (r1, w1) = crate::isolate::process::pipe().unwrap();
        let (r2, w2) = crate::isolate::process::pipe().unwrap();
        send(&theirs, b"{\"event\":\"helper_started\",\"pid\":1}\n", &[]);
        send(&theirs, b"{\"event\":\"started\",\"init_pid\":2,\"listener\":true}\n", &[w1.as_raw_fd()]);
        send(&theirs, b"{\"event\":\"furnished\",\"listener\":true}\n", &[w2.as_raw_fd()]);
        drop((w1, w2));
        assert_eq!(channel.recv::<Event>().await.unwrap(), Some(Event::HelperStarted { pid: 1 }));
        let e = channel.recv::<Event>().await.unwrap().unwrap();
        assert!(e.carries_listener());
        let first = channel.get_mut().take_fd().unwrap();
        assert_eq!(channel.recv::<Event>().await.unwrap(), Some(Event::Furnished { listener: true }));
        let second = channel.get_mut().take_fd().unwrap();
        assert!(channel.get_mut().take_fd().is_none());
        // Each fd is the one sent with its line: the write end of its pipe.
        std::fs::File::from(first).write_all(b"1").unwrap();
        std::fs::File::from(second).write_all(b"2").unwrap();
        let mut byte = [0u8; 1];
        use std::io::Read;
        std::fs::File::from(r1).read_exact(&mut byte).unwrap();
        assert_eq!(&byte, b"1");
        std::fs::File::from(r2).read_exact(&mut byte).unwrap();
        assert_eq!(&byte, b"2");
    }

    /// More fds than it holds: the rest are closed, not kept.
    #[tokio::test]
    async fn no_more_fds_than_the_bound_are_held() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let mut channel = Channel::new(FdStream::new(UnixStream::from_std(ours).unwrap()), 1024);
        let pipes: Vec<_> = (0..MAX_HELD + 2).map(|_| crate::isolate::process::pipe().unwrap()).collect();
        for (_, w) in &pipes {
            send(&theirs, b"{\"event\":\"attached\"}\n", &[w.as_raw_fd()]);
        }
        for _ in 0..pipes.len() {
            assert_eq!(channel.recv::<Event>().await.unwrap(), Some(Event::Attached));
        }
        let mut held = 0;
        while channel.get_mut().take_fd().is_some() {
            held += 1;
        }
        assert_eq!(held, MAX_HELD);
    }
}
