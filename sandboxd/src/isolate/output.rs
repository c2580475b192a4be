//! Reading a sandbox's stdout or stderr: capped while it is read (the rest is
//! drained and dropped, so a flood never grows the daemon), optionally streamed as
//! it arrives, and decoded lossily at the end.

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

pub use super::message::Stream;

/// A piece of output for streaming clients, already decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub stream: Stream,
    pub text: String,
}

/// What was kept of one stream.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    pub bytes: Vec<u8>,
    pub truncated: bool,
}

impl Captured {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Read `reader` to its end, keeping at most `limit` bytes.
pub async fn capture<R: AsyncRead + Unpin>(
    reader: Option<R>,
    stream: Stream,
    limit: usize,
    chunks: Option<mpsc::Sender<Chunk>>,
) -> Captured {
    let mut out = Captured::default();
    let Some(mut reader) = reader else { return out };
    let mut relay = chunks.map(|tx| Relay { tx, stream, backlog: String::new() });
    let mut buf = vec![0u8; 64 * 1024];
    // Bytes of an incomplete UTF-8 sequence held back from the last chunk.
    let mut pending: Vec<u8> = vec![];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let room = limit.saturating_sub(out.bytes.len());
        let keep = n.min(room);
        if keep < n {
            out.truncated = true;
        }
        if keep == 0 {
            continue;
        }
        out.bytes.extend_from_slice(&buf[..keep]);
        if let Some(relay) = &mut relay {
            pending.extend_from_slice(&buf[..keep]);
            let text = take_complete_utf8(&mut pending, out.truncated);
            relay.push(text);
        }
    }
    if let Some(mut relay) = relay {
        relay.push(String::from_utf8_lossy(&pending).into_owned());
        relay.finish();
    }
    out
}

/// Hands output to a streaming client without ever waiting for it: a client that
/// stops reading (or reads slowly) must not hold the run, its session or its
/// close. What the client has not taken yet waits here, joined into one piece per
/// stream — bounded by the output limit, since only kept bytes are streamed — and
/// at the end goes out from a task of its own, which ends when the client has read
/// it or gone away. The order of the pieces is kept.
struct Relay {
    tx: mpsc::Sender<Chunk>,
    stream: Stream,
    backlog: String,
}

impl Relay {
    fn push(&mut self, text: String) {
        if text.is_empty() {
            return;
        }
        self.backlog.push_str(&text);
        let piece = Chunk { stream: self.stream, text: std::mem::take(&mut self.backlog) };
        match self.tx.try_send(piece) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(piece)) => self.backlog = piece.text,
            // The client went away: nothing more to keep for it.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    fn finish(self) {
        if self.backlog.is_empty() {
            return;
        }
        let Relay { tx, stream, backlog } = self;
        let piece = Chunk { stream, text: backlog };
        match tx.try_send(piece) {
            Err(mpsc::error::TrySendError::Full(piece)) => {
                tokio::spawn(async move {
                    let _ = tx.send(piece).await;
                });
            }
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }
}

/// Decode the longest prefix of `pending` that does not end inside a UTF-8
/// sequence (everything when `flush`), leaving the rest in `pending`.
pub fn take_complete_utf8(pending: &mut Vec<u8>, flush: bool) -> String {
    let cut = if flush {
        pending.len()
    } else {
        match std::str::from_utf8(pending) {
            Ok(_) => pending.len(),
            // An incomplete sequence at the very end is held back; anything else
            // invalid is decoded lossily now.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => pending.len(),
        }
    };
    let rest = pending.split_off(cut);
    let text = String::from_utf8_lossy(pending).into_owned();
    *pending = rest;
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keeps_only_the_limit_and_drains_the_rest() {
        let data = vec![b'x'; 300_000];
        let got = capture(Some(&data[..]), Stream::Stdout, 1000, None).await;
        assert_eq!(got.bytes.len(), 1000);
        assert!(got.truncated);
        let small = capture(Some(&b"hi"[..]), Stream::Stdout, 1000, None).await;
        assert_eq!(small.text(), "hi");
        assert!(!small.truncated);
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_never_holds_the_capture() {
        // 4000 pieces through a channel of 2 that nobody reads until the end.
        let (r, mut w) = tokio::io::duplex(16);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for i in 0..4000u32 {
                w.write_all(format!("{i},").as_bytes()).await.unwrap();
                w.flush().await.unwrap();
                tokio::task::yield_now().await;
            }
        });
        let (tx, mut rx) = mpsc::channel(2);
        let got = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            capture(Some(r), Stream::Stdout, 1 << 20, Some(tx)),
        )
        .await
        .expect("the capture ended although its client read nothing");
        writer.await.unwrap();
        let want: String = (0..4000u32).map(|i| format!("{i},")).collect();
        assert_eq!(got.text(), want);
        // Everything still reaches the client, in order, once it reads.
        let mut streamed = String::new();
        while let Some(c) = rx.recv().await {
            streamed.push_str(&c.text);
        }
        assert_eq!(streamed, want);
    }

    #[test]
    fn holds_back_a_split_utf8_sequence() {
        let snow = "☃".as_bytes();
        let mut pending = vec![b'a', snow[0], snow[1]];
        assert_eq!(take_complete_utf8(&mut pending, false), "a");
        pending.push(snow[2]);
        assert_eq!(take_complete_utf8(&mut pending, false), "☃");
        assert!(pending.is_empty());
    }

    #[test]
    fn invalid_bytes_decode_lossily() {
        let mut pending = vec![0xff, b'o', b'k'];
        assert_eq!(take_complete_utf8(&mut pending, false), "\u{fffd}ok");
    }
}
