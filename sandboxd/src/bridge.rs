//! `sandboxctl mcp`: a stdio MCP client's bridge to the daemon's one MCP server,
//! `/mcp` (streamable HTTP), over sandboxctl's Unix socket or `--url`.
//!
//! Each JSON-RPC line read from stdin is POSTed to `/mcp` (with the token as
//! `Authorization: Bearer`, and the protocol session's `Mcp-Session-Id` and
//! `MCP-Protocol-Version` once `initialize` has answered them); what comes back,
//! one JSON answer or the messages of an event stream as they arrive (progress
//! notifications before the result), is written to stdout one message per line;
//! a 202 writes nothing. `initialize` is answered before the next line is read;
//! every other request goes on in a task of its own, so a cancellation can pass
//! a call in flight. A request the daemon refused in plain HTTP gets a JSON-RPC
//! error answer, so the client is never left waiting. At the end of stdin, once
//! the requests in flight have answered, the protocol session is deleted.
//! Everything read is bounded: a line, an answer, an event.

use crate::client::{Client, ClientError};
use http_body_util::BodyExt;
use hyper::body::Bytes;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Longest line read from stdin: rmcp refuses a request body over 4 MiB.
pub const MAX_LINE: usize = 4 * 1024 * 1024 + 1024;
/// Longest answer or event read from the daemon (a tool result fits 1 MiB;
/// this leaves room for whatever else a future daemon sends).
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;

const ACCEPT: &str = "application/json, text/event-stream";

/// What `initialize` told the bridge: the protocol session and version.
#[derive(Default)]
struct Session {
    id: Option<String>,
    version: Option<String>,
}

/// Bridge stdin and stdout to the daemon's `/mcp` until stdin ends.
pub async fn run(client: Client) -> Result<(), String> {
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(64);
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(mut line) = out_rx.recv().await {
            line.push(b'\n');
            if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    let session = Arc::new(Mutex::new(Session::default()));
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let mut in_flight = tokio::task::JoinSet::new();
    loop {
        let line = match read_line(&mut stdin).await {
            Ok(Some(Line::Message(l))) => l,
            Ok(Some(Line::TooLong)) => {
                eprintln!("sandboxctl mcp: a message longer than {MAX_LINE} bytes was skipped");
                continue;
            }
            Ok(None) => break,
            Err(e) => {
                eprintln!("sandboxctl mcp: reading stdin: {e}");
                break;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let message: Value = match serde_json::from_slice(&line) {
            Ok(v) => v,
            Err(e) => {
                let answer = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": format!("parse error: {e}")}});
                let _ = out_tx.send(answer.to_string().into_bytes()).await;
                continue;
            }
        };
        let exchange = forward(client.clone(), session.clone(), message.clone(), line, out_tx.clone());
        if message.get("method").and_then(Value::as_str) == Some("initialize") {
            exchange.await;
        } else {
            in_flight.spawn(exchange);
        }
        // Finished tasks are reaped as they go.
        while in_flight.try_join_next().is_some() {}
    }
    while in_flight.join_next().await.is_some() {}
    let id = session.lock().map(|s| s.id.clone()).unwrap_or_default();
    if let Some(id) = id {
        let headers = [("mcp-session-id", id.as_str())];
        if let Err(e) = client.open_with("DELETE", "/mcp", vec![], "application/json", &headers).await {
            eprintln!("sandboxctl mcp: closing the protocol session: {e}");
        }
    }
    drop(out_tx);
    let _ = writer.await;
    Ok(())
}

enum Line {
    Message(Vec<u8>),
    TooLong,
}

/// One line of stdin (without its newline), at most [`MAX_LINE`] bytes kept: a
/// longer one is read away and reported. None at the end of stdin.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> std::io::Result<Option<Line>> {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            if line.is_empty() && !too_long {
                return Ok(None);
            }
            break;
        }
        let (part, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (&buf[..i], i + 1),
            None => (buf, buf.len()),
        };
        let ended = done > part.len();
        if !too_long {
            if line.len() + part.len() > MAX_LINE {
                too_long = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(part);
            }
        }
        r.consume(done);
        if ended {
            break;
        }
    }
    Ok(Some(if too_long { Line::TooLong } else { Line::Message(line) }))
}

/// POST one message to `/mcp` and write what comes back.
async fn forward(
    client: Client,
    session: Arc<Mutex<Session>>,
    message: Value,
    body: Vec<u8>,
    out: mpsc::Sender<Vec<u8>>,
) {
    let id = message.get("id").cloned().filter(|_| message.get("method").is_some());
    let (sid, version) = match session.lock() {
        Ok(s) => (s.id.clone(), s.version.clone()),
        Err(_) => (None, None),
    };
    let mut headers = vec![("accept", ACCEPT)];
    if let Some(sid) = &sid {
        headers.push(("mcp-session-id", sid));
    }
    if let Some(v) = &version {
        headers.push(("mcp-protocol-version", v));
    }
    let initialize = message.get("method").and_then(Value::as_str) == Some("initialize");
    let answered = exchange(&client, body, &headers, &out, &session, initialize).await;
    if let Err(e) = answered {
        // A request gets an answer whatever happened; a notification nothing.
        if let Some(id) = id {
            let answer =
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": format!("sandboxd: {e}")}});
            let _ = out.send(answer.to_string().into_bytes()).await;
        } else {
            eprintln!("sandboxctl mcp: {e}");
        }
    }
}

/// Why a message got no answer from the daemon.
#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("HTTP {status}: {text}")]
    Refused { status: u16, text: String },
    #[error("receiving the answer: {0}")]
    Body(String),
    #[error("an answer larger than {MAX_MESSAGE} bytes was left out")]
    TooLarge,
}

async fn exchange(
    client: &Client,
    body: Vec<u8>,
    headers: &[(&str, &str)],
    out: &mpsc::Sender<Vec<u8>>,
    session: &Mutex<Session>,
    initialize: bool,
) -> Result<(), Failed> {
    let resp = client.open_with("POST", "/mcp", body, "application/json", headers).await?;
    let status = resp.status().as_u16();
    if initialize {
        if let Some(sid) = resp.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()) {
            if let Ok(mut s) = session.lock() {
                s.id = Some(sid.to_string());
            }
        }
    }
    if status == 202 {
        return Ok(());
    }
    let event_stream = resp
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    let mut body = resp.into_body();
    if event_stream && status < 400 {
        let mut events = Events::default();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| Failed::Body(e.to_string()))?;
            let Ok(data) = frame.into_data() else { continue };
            for event in events.push(&data)? {
                emit(event, out, session, initialize).await;
            }
        }
        return Ok(());
    }
    let bytes = match http_body_util::Limited::new(body, MAX_MESSAGE).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(Failed::TooLarge),
        Err(e) => return Err(Failed::Body(e.to_string())),
    };
    // A JSON-RPC answer goes through, whatever its status; anything else (the
    // API's error envelope, rmcp's plain text) is the request's failure.
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(v) if v.get("jsonrpc").is_some() => {
            emit(bytes, out, session, initialize).await;
            Ok(())
        }
        Ok(v) if v["error"]["message"].is_string() => Err(Failed::Refused {
            status,
            text: format!(
                "{} ({})",
                v["error"]["message"].as_str().unwrap_or(""),
                v["error"]["code"].as_str().unwrap_or("")
            ),
        }),
        _ => Err(Failed::Refused { status, text: String::from_utf8_lossy(&bytes).trim().chars().take(500).collect() }),
    }
}

/// Write one message as one line (re-encoded compact: a line is the framing);
/// `initialize`'s answer also names the protocol version for later requests.
async fn emit(message: Bytes, out: &mpsc::Sender<Vec<u8>>, session: &Mutex<Session>, initialize: bool) {
    let Ok(value) = serde_json::from_slice::<Value>(&message) else {
        eprintln!("sandboxctl mcp: the daemon sent a message that is not JSON; skipped");
        return;
    };
    if initialize {
        if let Some(v) = value["result"]["protocolVersion"].as_str() {
            if let Ok(mut s) = session.lock() {
                s.version = Some(v.to_string());
            }
        }
    }
    let _ = out.send(value.to_string().into_bytes()).await;
}

/// Server-sent events, parsed as they arrive: each event's `data` lines joined.
/// Events without data (rmcp's priming events) are skipped.
#[derive(Default)]
struct Events {
    pending: Vec<u8>,
}

impl Events {
    /// The events completed by `chunk`.
    fn push(&mut self, chunk: &[u8]) -> Result<Vec<Bytes>, Failed> {
        self.pending.extend_from_slice(chunk);
        let mut done = vec![];
        while let Some((end, skip)) = event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..end + skip).take(end).collect();
            let mut data = Vec::new();
            for line in event.split(|b| *b == b'\n') {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                if let Some(rest) = line.strip_prefix(b"data:") {
                    if !data.is_empty() {
                        data.push(b'\n');
                    }
                    data.extend_from_slice(rest.strip_prefix(b" ").unwrap_or(rest));
                }
            }
            if !data.iter().all(u8::is_ascii_whitespace) {
                done.push(Bytes::from(data));
            }
        }
        if self.pending.len() > MAX_MESSAGE {
            return Err(Failed::TooLarge);
        }
        Ok(done)
    }
}

/// Where the first event in `buf` ends (a blank line), and the separator's length.
fn event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_as_they_complete_and_priming_ones_skipped() {
        let mut events = Events::default();
        assert!(events.push(b"id: 0\nretry: 3000\ndata:\n\n").unwrap().is_empty());
        assert!(events.push(b"data: {\"a\":").unwrap().is_empty());
        let got = events.push(b"1}\n\ndata: {\"b\":2}\r\n\r\nda").unwrap();
        assert_eq!(got, vec![Bytes::from_static(b"{\"a\":1}"), Bytes::from_static(b"{\"b\":2}")]);
        assert_eq!(events.pending, b"da");
    }

    #[tokio::test]
    async fn lines_are_bounded() {
        let long = vec![b'x'; MAX_LINE + 1];
        let mut input = Vec::new();
        input.extend_from_slice(b"{\"a\":1}\n");
        input.extend_from_slice(&long);
        input.extend_from_slice(b"\nlast");
        let mut r = tokio::io::BufReader::with_capacity(1024, &input[..]);
        assert!(matches!(read_line(&mut r).await.unwrap(), Some(Line::Message(l)) if l == b"{\"a\":1}"));
        assert!(matches!(read_line(&mut r).await.unwrap(), Some(Line::TooLong)));
        assert!(matches!(read_line(&mut r).await.unwrap(), Some(Line::Message(l)) if l == b"last"));
        assert!(read_line(&mut r).await.unwrap().is_none());
    }
}
