//! Lines from streams that sandboxed code can write: a kernel's socket, a pooled
//! run's socket, a template's socket. Nothing read from them is trusted.
//!
//! [`LineReader`] reads one line of at most `max` bytes without ever holding more
//! than that (plus its fixed read buffer): it scans what the stream has for `'\n'`
//! and keeps only the line so far, so a peer that writes gigabytes without a
//! newline costs the daemon `max` bytes and then a [`Error::TooLong`]. [`parse`]
//! turns a line into a typed message, strictly; its errors carry no text of the
//! peer's but a short, escaped excerpt ([`excerpt`]) fit for an info log line.
//!
//! [`Channel`] is the one type the daemon talks to its processes through: typed
//! messages ([`super::message`]) as JSON lines, read with a [`LineReader`], and,
//! on a Unix socket, sent with fds ([`Channel::send_with_fds`]). The blocking side
//! (the slot, the helper, the init, a template's fork) uses [`read_line`] (the
//! blocking twin of [`LineReader`]), [`write_line`], [`send_datagram`],
//! [`recv_datagram`] and [`recv_fds`]; every message is encoded by [`encode`].

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

/// Bytes read from the stream at a time.
const READ_BUFFER: usize = 8 * 1024;
/// Bytes of a bad line shown in logs.
const EXCERPT: usize = 48;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a line longer than {0} bytes")]
    TooLong(usize),
    #[error("the stream ended in the middle of a line")]
    Truncated,
    #[error("the stream broke the protocol earlier")]
    Broken,
    #[error("reading: {0}")]
    Io(#[from] std::io::Error),
    /// `reason` is ours (serde's category and position), `excerpt` the peer's bytes,
    /// escaped and cut short.
    #[error("an unreadable message ({reason}), starting \"{excerpt}\"")]
    Malformed { reason: String, excerpt: String },
    #[error("encoding a message: {0}")]
    Encode(String),
    #[error("writing: {0}")]
    Write(std::io::Error),
    #[error("a message with {0} fds, not one of the counts expected")]
    Fds(usize),
}

impl Error {
    /// A protocol violation (as opposed to the stream ending or failing).
    pub fn is_violation(&self) -> bool {
        matches!(self, Error::TooLong(_) | Error::Malformed { .. } | Error::Broken)
    }
}

/// Reads bounded lines from `R`. After an error the stream is out of step and every
/// later read fails with [`Error::Broken`]: drop it.
pub struct LineReader<R> {
    inner: BufReader<R>,
    /// The line so far (cancel-safe: kept across dropped reads).
    line: Vec<u8>,
    max: usize,
    broken: bool,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    /// Lines of at most `max` bytes, the `'\n'` not counted.
    pub fn new(inner: R, max: usize) -> LineReader<R> {
        LineReader { inner: BufReader::with_capacity(READ_BUFFER, inner), line: vec![], max, broken: false }
    }

    pub fn get_ref(&self) -> &R {
        self.inner.get_ref()
    }

    pub fn get_mut(&mut self) -> &mut R {
        self.inner.get_mut()
    }

    /// Lines of at most `max` bytes from now on (the stream carries another
    /// protocol from here); what is buffered stays.
    pub fn set_max(&mut self, max: usize) {
        self.max = max;
    }

    /// Nothing read from the stream is waiting here (neither a part of a line nor
    /// buffered bytes).
    pub fn is_idle(&self) -> bool {
        self.line.is_empty() && self.inner.buffer().is_empty() && !self.broken
    }

    /// The next line, without its `'\n'`; `None` at a clean end of the stream.
    /// Cancel-safe: a read dropped half-way loses nothing.
    pub async fn next_line(&mut self) -> Result<Option<Vec<u8>>, Error> {
        if self.broken {
            return Err(Error::Broken);
        }
        let read = self.read_line().await;
        if read.is_err() {
            self.broken = true;
            self.line = vec![];
        }
        read
    }

    async fn read_line(&mut self) -> Result<Option<Vec<u8>>, Error> {
        loop {
            let buf = self.inner.fill_buf().await?;
            if buf.is_empty() {
                return if self.line.is_empty() { Ok(None) } else { Err(Error::Truncated) };
            }
            let newline = buf.iter().position(|b| *b == b'\n');
            let take = newline.unwrap_or(buf.len());
            if self.line.len() + take > self.max {
                return Err(Error::TooLong(self.max));
            }
            self.line.extend_from_slice(&buf[..take]);
            self.inner.consume(take + usize::from(newline.is_some()));
            if newline.is_some() {
                return Ok(Some(std::mem::take(&mut self.line)));
            }
        }
    }

    /// The next line as a `T` ([`parse`]); `None` at a clean end of the stream.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, Error> {
        match self.next_line().await? {
            Some(line) => parse(&line).map(Some).inspect_err(|_| self.broken = true),
            None => Ok(None),
        }
    }
}

/// The one channel type: typed JSON lines over `S`, each read bounded (see
/// [`LineReader`]), and for a Unix socket sent with fds.
pub struct Channel<S> {
    reader: LineReader<S>,
}

impl<S: AsyncRead + Unpin> Channel<S> {
    /// Messages of at most `max` bytes are read from `stream`.
    pub fn new(stream: S, max: usize) -> Channel<S> {
        Channel { reader: LineReader::new(stream, max) }
    }

    /// The next message as a `T`; `None` at a clean end of the stream. After an
    /// error the channel is out of step ([`Error::Broken`]): drop it.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<Option<T>, Error> {
        self.reader.next().await
    }

    /// Nothing received is waiting to be read here.
    pub fn is_idle(&self) -> bool {
        self.reader.is_idle()
    }

    pub fn get_ref(&self) -> &S {
        self.reader.get_ref()
    }

    pub fn get_mut(&mut self) -> &mut S {
        self.reader.get_mut()
    }

    /// Messages of at most `max` bytes from now on ([`LineReader::set_max`]).
    pub fn set_max(&mut self, max: usize) {
        self.reader.set_max(max);
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Channel<S> {
    /// Send `msg` as one JSON line.
    pub async fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), Error> {
        let line = encode(msg)?;
        self.get_mut().write_all(&line).await.map_err(Error::Write)
    }
}

impl Channel<tokio::net::UnixStream> {
    /// Send `msg` as one JSON line with `fds` attached (SCM_RIGHTS).
    pub async fn send_with_fds<T: Serialize>(&self, msg: &T, fds: &[BorrowedFd<'_>]) -> Result<(), Error> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        let bytes = encode(msg)?;
        let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
        let stream = self.get_ref();
        loop {
            stream.writable().await.map_err(Error::Write)?;
            let sent = stream.try_io(tokio::io::Interest::WRITABLE, || {
                let iov = [std::io::IoSlice::new(&bytes)];
                let cmsg = [ControlMessage::ScmRights(&raw)];
                sendmsg::<()>(stream.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)
                    .map_err(std::io::Error::from)
            });
            match sent {
                Ok(n) if n == bytes.len() => return Ok(()),
                Ok(_) => return Err(Error::Write(std::io::Error::other("a short write"))),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(Error::Write(e)),
            }
        }
    }

    /// Has the process at the other end kept quiet, the stream open? It waits for
    /// the daemon: anything to read, or the end of the stream, means it died or
    /// misbehaved.
    pub fn quiet(&self) -> bool {
        let mut byte = [0u8; 1];
        self.is_idle()
            && matches!(self.get_ref().try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}

impl Channel<tokio::net::unix::pipe::Receiver> {
    /// Nothing written on the pipe yet, and its writer still there.
    pub fn quiet(&self) -> bool {
        let mut byte = [0u8; 1];
        self.is_idle()
            && matches!(self.get_ref().try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}

/// `msg` as one JSON line, with its `'\n'`: how every JSON message is put on a wire.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, Error> {
    let mut line = serde_json::to_vec(msg).map_err(|e| Error::Encode(e.to_string()))?;
    line.push(b'\n');
    Ok(line)
}

/// The next line of at most `max` bytes (the `'\n'` not counted) from a blocking
/// reader, without its `'\n'`; `None` at a clean end of the stream. Like
/// [`LineReader`], it takes no more than `max + 1` bytes of a longer line off the
/// stream (a peer that writes without end costs that much, then an
/// [`Error::TooLong`]); after an error the stream is out of step: stop reading it.
pub fn read_line<R: std::io::BufRead>(r: &mut R, max: usize) -> Result<Option<Vec<u8>>, Error> {
    use std::io::{BufRead, Read};
    let mut line = vec![];
    r.take(max as u64 + 1).read_until(b'\n', &mut line)?;
    match line.last().copied() {
        None => Ok(None),
        Some(b'\n') => {
            line.pop();
            Ok(Some(line))
        }
        Some(_) if line.len() > max => Err(Error::TooLong(max)),
        Some(_) => Err(Error::Truncated),
    }
}

/// Write `msg` as one JSON line on a blocking writer.
pub fn write_line<W: std::io::Write, T: Serialize>(w: &mut W, msg: &T) -> Result<(), Error> {
    let line = encode(msg)?;
    w.write_all(&line).map_err(Error::Write)
}

/// Send one datagram on a blocking SOCK_SEQPACKET socket: `msg` as JSON (without a
/// newline: the datagram is the frame).
pub fn send_datagram<T: Serialize>(sock: BorrowedFd<'_>, msg: &T) -> Result<(), Error> {
    let bytes = serde_json::to_vec(msg).map_err(|e| Error::Encode(e.to_string()))?;
    nix::sys::socket::send(sock.as_raw_fd(), &bytes, nix::sys::socket::MsgFlags::empty())
        .map_err(|e| Error::Write(e.into()))?;
    Ok(())
}

/// Receive one datagram of at most `max` bytes on a SOCK_SEQPACKET socket as a `T`.
pub fn recv_datagram<T: DeserializeOwned>(sock: BorrowedFd<'_>, max: usize) -> Result<T, Error> {
    let mut buf = vec![0u8; max];
    let n = nix::sys::socket::recv(sock.as_raw_fd(), &mut buf, nix::sys::socket::MsgFlags::empty())
        .map_err(|e| Error::Io(e.into()))?;
    if n == 0 {
        return Err(Error::Truncated);
    }
    parse(&buf[..n])
}

/// Send `bytes` with `fds` attached on a socket, without blocking.
pub fn send_fds(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), Error> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let iov = [std::io::IoSlice::new(bytes)];
    sendmsg::<()>(sock.as_raw_fd(), &iov, &[ControlMessage::ScmRights(&raw)], MsgFlags::MSG_DONTWAIT, None)
        .map_err(|e| Error::Write(e.into()))?;
    Ok(())
}

/// Receive one message's fds (at most `MAX` of them, its bytes ignored) on a
/// blocking socket, close-on-exec; `None` when the peer hung up. A message whose
/// fd count is not in `counts` is refused (its fds are closed).
pub fn recv_fds<const MAX: usize>(sock: BorrowedFd<'_>, counts: &[usize]) -> Result<Option<Vec<OwnedFd>>, Error> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; MAX]);
    let msg = recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(|e| Error::Io(e.into()))?;
    if msg.bytes == 0 {
        return Ok(None);
    }
    let mut fds: Vec<OwnedFd> = vec![];
    for cmsg in msg.cmsgs().map_err(|e| Error::Io(e.into()))? {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            // SAFETY: SCM_RIGHTS just installed these fds in our table; we own them.
            fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    if counts.contains(&fds.len()) {
        Ok(Some(fds))
    } else {
        Err(Error::Fds(fds.len()))
    }
}

/// `line` as a `T`, strictly. The error says what kind of mistake it was and where,
/// never the peer's words but in [`excerpt`].
pub fn parse<T: DeserializeOwned>(line: &[u8]) -> Result<T, Error> {
    serde_json::from_slice(line).map_err(|e| Error::Malformed {
        reason: format!("{:?} error at column {}", e.classify(), e.column()),
        excerpt: excerpt(line),
    })
}

/// The first bytes of `bytes`, escaped (no control characters, quotes or
/// backslashes left raw), for a log line.
pub fn excerpt(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(EXCERPT)];
    let mut text: String = String::from_utf8_lossy(cut).chars().flat_map(char::escape_default).collect();
    if bytes.len() > EXCERPT {
        text.push_str("...");
    }
    text
}

/// Cut `text` to at most `max` bytes, on a character boundary; true if it was cut.
pub fn clip(text: &mut String, max: usize) -> bool {
    if text.len() <= max {
        return false;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A stream that hands out `chunks` one read at a time, then ends.
    struct Chunks(std::collections::VecDeque<Vec<u8>>);

    impl AsyncRead for Chunks {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            if let Some(mut chunk) = self.0.pop_front() {
                let n = chunk.len().min(buf.remaining());
                buf.put_slice(&chunk[..n]);
                if n < chunk.len() {
                    self.0.push_front(chunk.split_off(n));
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    fn reader(chunks: &[&[u8]], max: usize) -> LineReader<Chunks> {
        LineReader::new(Chunks(chunks.iter().map(|c| c.to_vec()).collect()), max)
    }

    #[tokio::test]
    async fn a_line_of_exactly_the_limit_is_read_and_one_more_byte_is_refused() {
        let mut r = reader(&[b"abcd\nabcde\nok\n"], 4);
        assert_eq!(r.next_line().await.unwrap(), Some(b"abcd".to_vec()));
        assert!(matches!(r.next_line().await, Err(Error::TooLong(4))));
        // Out of step from here on: the rest is never taken for a line.
        assert!(matches!(r.next_line().await, Err(Error::Broken)));
    }

    #[tokio::test]
    async fn lines_split_across_reads_are_joined() {
        let mut r = reader(&[b"ab", b"c", b"\nde", b"f\n", b"\n"], 3);
        assert_eq!(r.next_line().await.unwrap(), Some(b"abc".to_vec()));
        assert_eq!(r.next_line().await.unwrap(), Some(b"def".to_vec()));
        assert_eq!(r.next_line().await.unwrap(), Some(vec![]));
        assert_eq!(r.next_line().await.unwrap(), None);
        assert!(r.is_idle());
    }

    #[tokio::test]
    async fn a_limit_crossed_across_reads_is_refused_without_keeping_more() {
        let mut r = reader(&[b"ab", b"cd", b"e"], 4);
        assert!(matches!(r.next_line().await, Err(Error::TooLong(4))));
        assert!(r.line.capacity() <= 4 + READ_BUFFER);
    }

    #[tokio::test]
    async fn a_stream_without_a_newline_costs_the_limit_and_no_more() {
        // 64 MiB without a newline, in 1 MiB reads: refused after the first 1 KiB.
        let big: Vec<Vec<u8>> = (0..64).map(|_| vec![b'x'; 1 << 20]).collect();
        let mut r = LineReader::new(Chunks(big.into()), 1024);
        assert!(matches!(r.next_line().await, Err(Error::TooLong(1024))));
        assert!(r.line.capacity() <= 1024 + READ_BUFFER);
        assert!(r.inner.get_ref().0.len() >= 62, "the rest of the stream was not read");
    }

    #[tokio::test]
    async fn the_end_of_the_stream_inside_a_line_is_not_a_line() {
        let mut r = reader(&[b"{\"a\":", b"1"], 100);
        let e = r.next_line().await.unwrap_err();
        assert!(matches!(e, Error::Truncated) && !e.is_violation());
        let mut r = reader(&[], 100);
        assert_eq!(r.next_line().await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_dropped_read_loses_nothing() {
        let (mut w, rd) = tokio::io::duplex(64);
        let mut r = LineReader::new(rd, 100);
        use tokio::io::AsyncWriteExt;
        w.write_all(b"hal").await.unwrap();
        let timed = tokio::time::timeout(std::time::Duration::from_millis(20), r.next_line()).await;
        assert!(timed.is_err(), "no line yet");
        w.write_all(b"f\n").await.unwrap();
        assert_eq!(r.next_line().await.unwrap(), Some(b"half".to_vec()));
    }

    #[test]
    fn a_blocking_line_of_exactly_the_limit_is_read_and_one_more_byte_is_refused() {
        let mut r = &b"abcd\n\nabcde\nok\n"[..];
        assert_eq!(read_line(&mut r, 4).unwrap(), Some(b"abcd".to_vec()));
        assert_eq!(read_line(&mut r, 4).unwrap(), Some(vec![]));
        assert!(matches!(read_line(&mut r, 4), Err(Error::TooLong(4))));
        let mut r = &b"ab\ncd"[..];
        assert_eq!(read_line(&mut r, 4).unwrap(), Some(b"ab".to_vec()));
        let e = read_line(&mut r, 4).unwrap_err();
        assert!(matches!(e, Error::Truncated) && !e.is_violation());
        assert_eq!(read_line(&mut r, 4).unwrap(), None);
    }

    #[test]
    fn a_blocking_stream_without_a_newline_costs_the_limit_and_no_more() {
        // A stream that never ends and never has a newline: refused after 1 KiB,
        // having taken at most that (and its reader's buffer) off the stream.
        let mut endless = std::io::BufReader::with_capacity(READ_BUFFER, std::io::repeat(b'x'));
        assert!(matches!(read_line(&mut endless, 1024), Err(Error::TooLong(1024))));
        // What the reader still holds of the stream is what it read past the line.
        assert_eq!(endless.buffer().len(), READ_BUFFER - 1025);
    }

    #[test]
    fn parse_errors_carry_only_an_escaped_excerpt() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct M {
            a: u8,
        }
        let evil = format!("{{\"evil\n\u{1b}[31m{}\": 1}}", "x".repeat(1000));
        let e = parse::<M>(evil.as_bytes()).unwrap_err();
        let text = e.to_string();
        assert!(e.is_violation());
        assert!(text.len() < 200, "{text}");
        assert!(!text.contains('\n') && !text.contains('\u{1b}'), "{text}");
        assert!(!text.contains("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"), "{text}");
        assert!(matches!(parse::<M>(b"{\"a\": 1}"), Ok(M { a: 1 })));
    }

    #[test]
    fn clip_cuts_on_a_character_boundary() {
        let mut s = "aé".to_string();
        assert!(clip(&mut s, 2));
        assert_eq!(s, "a");
        let mut s = "abc".to_string();
        assert!(!clip(&mut s, 3));
        assert_eq!(s, "abc");
    }
}
