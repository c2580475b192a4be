//! Reading a sandbox's stdout or stderr: capped while it is read (the rest is
//! drained and dropped, so a flood never grows the daemon), optionally streamed as
//! it arrives, and decoded lossily at the end.

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    Stdout,
    Stderr,
}

/// A piece of output for streaming clients, already decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub stream: StreamKind,
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
    stream: StreamKind,
    limit: usize,
    chunks: Option<mpsc::Sender<Chunk>>,
) -> Captured {
    let mut out = Captured::default();
    let Some(mut reader) = reader else { return out };
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
        if let Some(tx) = &chunks {
            pending.extend_from_slice(&buf[..keep]);
            let text = take_complete_utf8(&mut pending, out.truncated);
            if !text.is_empty() {
                // A client that went away must not stop the run from being read.
                let _ = tx.send(Chunk { stream, text }).await;
            }
        }
    }
    if let Some(tx) = &chunks {
        if !pending.is_empty() {
            let _ = tx.send(Chunk { stream, text: String::from_utf8_lossy(&pending).into_owned() }).await;
        }
    }
    out
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
        let got = capture(Some(&data[..]), StreamKind::Stdout, 1000, None).await;
        assert_eq!(got.bytes.len(), 1000);
        assert!(got.truncated);
        let small = capture(Some(&b"hi"[..]), StreamKind::Stdout, 1000, None).await;
        assert_eq!(small.text(), "hi");
        assert!(!small.truncated);
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
