//! The egress proxy's end inside a sandbox: a TCP socket listening on the
//! sandbox's own `127.0.0.1` ([`super::spec::EGRESS_PORT`]), made by the sandbox's
//! helper (host root) in the sandbox's network namespace and handed to the daemon
//! ([`super::message::Event::Started`] or [`super::message::Event::Furnished`],
//! the fd attached). A socket belongs to the namespace it was made in, whoever
//! holds it: the sandbox connects to it on its loopback, the daemon accepts on it
//! from the host, and no relay process runs inside.
//!
//! Made before the sandbox's program can run (a cold sandbox: before its init is
//! released; a pooled fork: while it waits to be furnished), so a connection is
//! never refused for being early: it waits in the backlog until the daemon
//! accepts it.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};

#[derive(Debug, thiserror::Error)]
#[error("the egress listener in the sandbox's network namespace: {op}: {source}")]
pub struct Error {
    op: &'static str,
    source: std::io::Error,
}

fn err<E: Into<std::io::Error>>(op: &'static str) -> impl FnOnce(E) -> Error {
    move |e| Error { op, source: e.into() }
}

/// Connections a sandbox may have waiting to be accepted.
const BACKLOG: i32 = 64;

/// A socket listening on `127.0.0.1:port` in the network namespace `target` (one
/// of the caller's sandbox's processes', opened by the caller while it knew the
/// process), non-blocking and close-on-exec.
///
/// The caller must be single-threaded (the helper is): the whole process enters
/// the sandbox's namespace for the moment the socket is made, and is back in its
/// own when this returns. If it cannot get back, it must not go on (it would
/// reach the host's network through the sandbox's): it exits.
pub fn listen_in(target: &File, port: u16) -> Result<OwnedFd, Error> {
    let home = File::open("/proc/self/ns/net").map_err(err("open our own namespace"))?;
    nix::sched::setns(target.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).map_err(err("setns"))?;
    let made = listener(port);
    if nix::sched::setns(home.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).is_err() {
        // SAFETY: _exit ends the process at once; nothing of it may run on in the
        // sandbox's network namespace.
        unsafe { libc::_exit(3) }
    }
    made
}

/// A socket listening on `127.0.0.1:port` in the caller's network namespace.
fn listener(port: u16) -> Result<OwnedFd, Error> {
    use nix::sys::socket::{bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, SockaddrIn};
    let sock = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK, None)
        .map_err(err("socket"))?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&sock), &SockaddrIn::new(127, 0, 0, 1, port)).map_err(err("bind"))?;
    listen(&sock, Backlog::new(BACKLOG).map_err(err("backlog"))?).map_err(err("listen"))?;
    Ok(sock)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In the test's own namespace: a port anyone may take, accepting a connection.
    #[test]
    fn the_listener_listens_on_loopback_without_blocking() {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let sock = listener(port).unwrap();
        let listener = std::net::TcpListener::from(sock);
        let bound = listener.local_addr().unwrap();
        assert_eq!((bound.ip().to_string(), bound.port()), ("127.0.0.1".to_string(), port));
        // Non-blocking: nothing waiting is an error at once, not a wait.
        assert_eq!(listener.accept().unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
        let _client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut accepted = None;
        for _ in 0..100 {
            match listener.accept() {
                Ok(c) => {
                    accepted = Some(c);
                    break;
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
        assert!(accepted.is_some());
    }
}
