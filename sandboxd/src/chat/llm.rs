//! The operator's LLM, as an OpenAI-compatible Chat Completions endpoint (LM
//! Studio, Ollama, llama.cpp's server, vLLM, OpenAI itself): one request per
//! model turn, streamed (`stream: true`), its text passed on as it comes and its
//! tool calls put together from their pieces. An endpoint that answers in one
//! piece (`application/json`) is read too.
//!
//! Everything it sends is bounded: the answer ([`MAX_ANSWER`] bytes, each line of
//! the stream [`MAX_LINE`]), each wait for a piece of it (the configured timeout),
//! the whole answer's time ([`ANSWER_TIMEOUTS`] times that), the tool calls
//! ([`MAX_CALLS`]). A chunk is read into the few typed fields the turn uses, so
//! whatever else a line holds is skipped, never built into a tree. Every failure
//! is an [`LlmError`] that says what to do.

use super::wire;
use crate::model::chat::ToolCall;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Most bytes of one answer of the model (its stream, all pieces).
pub const MAX_ANSWER: usize = 8 * 1024 * 1024;
/// Most bytes of one line of a streamed answer (one chunk of it).
pub const MAX_LINE: usize = 1024 * 1024;
/// Most tool calls one answer may make; more are refused to the model.
pub const MAX_CALLS: usize = 16;
/// A whole answer (or model list) must end within this many times the timeout
/// for one piece of it: an endpoint that trickles never holds a turn for ever.
pub const ANSWER_TIMEOUTS: u32 = 4;
/// Most bytes of an error answer or a model list read.
const MAX_SMALL: usize = 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the model gave no answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LlmError {
    #[error("cannot reach the model endpoint {url} ({why}): start the model's server (LM Studio: Developer, Start Server; Ollama: `ollama serve`), or set llm_url to where it listens")]
    Unreachable { url: String, why: String },
    #[error("the model endpoint {url} sent nothing for {secs} s: the model may still be loading, or be too slow for this machine; retry, or raise llm_timeout_s")]
    Timeout { url: String, secs: u64 },
    #[error("the model endpoint {url} did not finish its answer within {secs} s ({ANSWER_TIMEOUTS} times llm_timeout_s): ask for a shorter answer, or raise llm_timeout_s")]
    TooSlow { url: String, secs: u64 },
    #[error("the model endpoint answered {status}: {message}")]
    Status { status: u16, message: String },
    #[error("the model endpoint's answer is not an OpenAI chat completion ({0}): check that llm_url names an OpenAI-compatible API (its /v1)")]
    Malformed(String),
    #[error("the model's answer is more than {} MiB: ask for a shorter one", MAX_ANSWER / (1024 * 1024))]
    TooLarge,
}

/// Where the model is, parsed from `llm_url` once, at start.
#[derive(Clone)]
pub struct Endpoint {
    url: String,
    host: String,
    port: u16,
    /// `host[:port]`, as the Host header says it.
    authority: String,
    /// The URL's path, without a trailing slash (`/v1`).
    base: String,
    api_key: Option<String>,
    /// Some for https.
    tls: Option<tokio_rustls::TlsConnector>,
    timeout: Duration,
}

/// Why `llm_url` cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("llm_url {url:?}: {why}")]
pub struct BadUrl {
    pub url: String,
    pub why: String,
}

impl Endpoint {
    /// `url` (http:// or https://, with the API's path, e.g.
    /// `http://127.0.0.1:1234/v1`); https servers are verified against the CA
    /// certificates of `ca_bundle` (PEM).
    pub fn new(
        url: &str,
        api_key: Option<String>,
        ca_bundle: &std::path::Path,
        timeout: Duration,
    ) -> Result<Endpoint, BadUrl> {
        let bad = |why: &str| BadUrl { url: url.to_string(), why: why.to_string() };
        let uri: hyper::Uri = url.parse().map_err(|e| bad(&format!("not a URL ({e})")))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(bad("use an http:// or https:// URL, e.g. http://127.0.0.1:1234/v1")),
        };
        let host = uri.host().ok_or_else(|| bad("it names no host"))?.trim_matches(['[', ']']).to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        if uri.query().is_some() {
            return Err(bad("drop the query: give the API's base URL, e.g. http://127.0.0.1:1234/v1"));
        }
        let authority = uri.authority().map(|a| a.as_str().to_string()).unwrap_or_default();
        if authority.contains('@') {
            return Err(bad("put credentials in llm_api_key, not in the URL"));
        }
        let tls = match https {
            false => None,
            true => {
                let bundle = std::fs::read(ca_bundle)
                    .map_err(|e| bad(&format!("reading the CA bundle {} for https: {e}", ca_bundle.display())))?;
                let config = crate::egress::tls::client_config(&bundle, &ca_bundle.display().to_string())
                    .map_err(|e| bad(&e.to_string()))?;
                Some(tokio_rustls::TlsConnector::from(Arc::new(config)))
            }
        };
        Ok(Endpoint {
            url: url.to_string(),
            host,
            port,
            authority,
            base: uri.path().trim_end_matches('/').to_string(),
            api_key: api_key.filter(|k| !k.is_empty()),
            tls,
            timeout,
        })
    }

    /// The URL as configured.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn unreachable(&self, why: impl std::fmt::Display) -> LlmError {
        LlmError::Unreachable { url: self.url.clone(), why: why.to_string() }
    }

    fn timed_out(&self) -> LlmError {
        LlmError::Timeout { url: self.url.clone(), secs: self.timeout.as_secs() }
    }

    /// Send `body` (JSON; None: a GET) to `path` under the base, and wait for the
    /// answer's head.
    async fn send(&self, path: &str, body: Option<Vec<u8>>) -> Result<hyper::Response<Incoming>, LlmError> {
        let stream =
            tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect((self.host.as_str(), self.port)))
                .await
                .map_err(|_| self.unreachable(format!("no connection within {} s", CONNECT_TIMEOUT.as_secs())))?
                .map_err(|e| self.unreachable(e))?;
        let mut req = Request::builder()
            .method(if body.is_some() { "POST" } else { "GET" })
            .uri(format!("{}{path}", self.base))
            .header("host", &self.authority)
            .header("accept", "text/event-stream, application/json")
            .header("user-agent", concat!("sandboxd/", env!("CARGO_PKG_VERSION")));
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        if let Some(key) = &self.api_key {
            req = req.header("authorization", format!("Bearer {key}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| self.unreachable(format!("the request could not be made: {e}")))?;
        let answer = async {
            match &self.tls {
                None => exchange(stream, req).await,
                Some(tls) => {
                    let name = rustls_pki_types::ServerName::try_from(self.host.clone())
                        .map_err(|e| format!("{}: not a TLS server name ({e})", self.host))?;
                    let stream = tls.connect(name, stream).await.map_err(|e| format!("TLS: {e}"))?;
                    exchange(stream, req).await
                }
            }
        };
        match tokio::time::timeout(self.timeout, answer).await {
            Err(_) => Err(self.timed_out()),
            Ok(Err(why)) => Err(self.unreachable(why)),
            Ok(Ok(r)) => Ok(r),
        }
    }

    /// The next piece of `body`, within the timeout.
    async fn frame(&self, body: &mut Incoming) -> Result<Option<Bytes>, LlmError> {
        loop {
            match tokio::time::timeout(self.timeout, body.frame()).await {
                Err(_) => return Err(self.timed_out()),
                Ok(None) => return Ok(None),
                Ok(Some(Err(e))) => return Err(self.unreachable(format!("the answer broke off: {e}"))),
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    /// All of `body`, up to `max` bytes.
    async fn whole(&self, body: &mut Incoming, max: usize) -> Result<Vec<u8>, LlmError> {
        let mut all = vec![];
        while let Some(data) = self.frame(body).await? {
            if all.len() + data.len() > max {
                return Err(LlmError::TooLarge);
            }
            all.extend_from_slice(&data);
        }
        Ok(all)
    }

    /// A failed answer's status and the message its body gives.
    async fn failed(&self, answer: hyper::Response<Incoming>) -> LlmError {
        let status = answer.status().as_u16();
        let mut body = answer.into_body();
        let bytes = self.whole(&mut body, MAX_SMALL).await.unwrap_or_default();
        LlmError::Status { status, message: error_message(status, &bytes) }
    }

    /// The ids of the models the endpoint offers (`GET /models`).
    pub async fn models(&self) -> Result<Vec<String>, LlmError> {
        self.within_deadline(self.list_models()).await
    }

    /// `work` within [`ANSWER_TIMEOUTS`] times the timeout.
    async fn within_deadline<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, LlmError>>,
    ) -> Result<T, LlmError> {
        let deadline = self.timeout.saturating_mul(ANSWER_TIMEOUTS);
        tokio::time::timeout(deadline, work)
            .await
            .unwrap_or_else(|_| Err(LlmError::TooSlow { url: self.url.clone(), secs: deadline.as_secs() }))
    }

    async fn list_models(&self) -> Result<Vec<String>, LlmError> {
        let answer = self.send("/models", None).await?;
        if !answer.status().is_success() {
            return Err(self.failed(answer).await);
        }
        let bytes = self.whole(&mut answer.into_body(), MAX_SMALL).await?;
        let list: wire::Models =
            serde_json::from_slice(&bytes).map_err(|e| LlmError::Malformed(format!("GET /models: {e}")))?;
        Ok(list.data.into_iter().map(|m| m.id).collect())
    }

    /// One model turn: `request` (a Chat Completions request; `stream` is set
    /// here) answered, its text sent to `text` piece by piece as it comes.
    pub async fn complete(&self, request: Value, text: mpsc::Sender<String>) -> Result<Completion, LlmError> {
        self.within_deadline(self.answer(request, text)).await
    }

    async fn answer(&self, mut request: Value, text: mpsc::Sender<String>) -> Result<Completion, LlmError> {
        request["stream"] = Value::Bool(true);
        let body = serde_json::to_vec(&request).map_err(|e| LlmError::Malformed(e.to_string()))?;
        let answer = self.send("/chat/completions", Some(body)).await?;
        if !answer.status().is_success() {
            return Err(self.failed(answer).await);
        }
        let streamed = answer
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut body = answer.into_body();
        let mut acc = Accumulated::default();
        if !streamed {
            let bytes = self.whole(&mut body, MAX_ANSWER).await?;
            acc.whole(&wire::read::<wire::Whole>(&bytes).map_err(malformed)?)?;
            if !acc.text.is_empty() {
                let _ = text.send(acc.text.clone()).await;
            }
            return acc.done();
        }
        let mut lines = Lines::default();
        while let Some(data) = self.frame(&mut body).await? {
            lines.total += data.len();
            if lines.total > MAX_ANSWER {
                return Err(LlmError::TooLarge);
            }
            lines.push(&data);
            while let Some(line) = lines.next()? {
                match sse_data(&line) {
                    None => {}
                    Some("[DONE]") => return acc.done(),
                    Some(json) => {
                        if let Some(piece) =
                            acc.chunk(&wire::read::<wire::Chunk>(json.as_bytes()).map_err(malformed)?)?
                        {
                            let _ = text.send(piece).await;
                        }
                    }
                }
            }
        }
        acc.done()
    }
}

/// Send `req` over `stream` (HTTP/1.1) and wait for the answer's head.
async fn exchange<S>(stream: S, req: Request<Full<Bytes>>) -> Result<hyper::Response<Incoming>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    sender.send_request(req).await.map_err(|e| e.to_string())
}

/// The text an error answer gives: OpenAI's `{"error": {"message"}}`, a plain
/// `{"error": "..."}`, or the start of the body; with what to do where a common
/// cause is known.
fn error_message(status: u16, body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Failed {
        error: Option<wire::ErrorField>,
        message: Option<String>,
    }
    let parsed: Option<Failed> = serde_json::from_slice(body).ok();
    let said = parsed
        .and_then(|f| f.error.and_then(|e| e.0).or(f.message))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(512)]).trim().to_string());
    explain(status, said)
}

fn malformed(e: serde_json::Error) -> LlmError {
    LlmError::Malformed(e.to_string())
}

/// What an answer's `error` says, with what to do where a common cause is known.
fn said(e: &wire::ErrorField) -> String {
    explain(200, e.0.clone().unwrap_or_default())
}

/// What an endpoint said of a failure, cut to 1000 characters, with what to do
/// where a common cause is known.
fn explain(status: u16, said: String) -> String {
    let said: String = said.chars().take(1000).collect();
    let lower = said.to_lowercase();
    let hint = if status == 401 || status == 403 {
        ": set llm_api_key to a key the endpoint accepts"
    } else if lower.contains("tool") {
        ": the model may not support tool calls; load one that does (its chat template takes tools)"
    } else if lower.contains("model") && (status == 404 || status == 400) {
        ": name a model the endpoint serves (GET its /models), in llm_model or the request's model"
    } else if lower.contains("context") || lower.contains("too long") || lower.contains("tokens") {
        ": the conversation is longer than the model takes; start a new conversation, or load the model with a longer context"
    } else {
        ""
    };
    if said.is_empty() {
        format!("(no message){hint}")
    } else {
        format!("{said}{hint}")
    }
}

/// The data of one server-sent event line, if it is one.
fn sse_data(line: &str) -> Option<&str> {
    line.strip_prefix("data:").map(str::trim)
}

/// Lines of a stream, as its pieces come: each byte is looked at once (a line
/// that comes a byte at a time costs its length, not its square), and a line past
/// [`MAX_LINE`] is refused.
#[derive(Default)]
struct Lines {
    pending: Vec<u8>,
    /// Where the lines not yet taken begin in `pending`.
    start: usize,
    /// How far from `start` is known to hold no newline.
    scanned: usize,
    total: usize,
}

impl Lines {
    /// A piece of the stream: the lines taken so far are let go first.
    fn push(&mut self, data: &[u8]) {
        self.pending.drain(..self.start);
        self.start = 0;
        self.pending.extend_from_slice(data);
    }

    fn next(&mut self) -> Result<Option<String>, LlmError> {
        let rest = &self.pending[self.start..];
        match rest[self.scanned..].iter().position(|&b| b == b'\n') {
            Some(at) => {
                let line = &rest[..self.scanned + at];
                let text = String::from_utf8_lossy(line).trim_end_matches('\r').to_string();
                self.start += self.scanned + at + 1;
                self.scanned = 0;
                Ok(Some(text))
            }
            None if rest.len() > MAX_LINE => {
                Err(LlmError::Malformed(format!("a line of the stream is longer than {} KiB", MAX_LINE / 1024)))
            }
            None => {
                self.scanned = rest.len();
                Ok(None)
            }
        }
    }
}

/// What the model said in one turn.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Completion {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    /// More tool calls than [`MAX_CALLS`] were made: the rest were dropped.
    pub calls_dropped: usize,
}

/// An answer being put together from its pieces.
#[derive(Debug, Default)]
struct Accumulated {
    text: String,
    calls: Vec<ToolCall>,
    /// Calls of a whole answer past [`MAX_CALLS`].
    dropped: usize,
    /// Calls begun in the stream, kept or not, and the id of the last one.
    started: usize,
    last_id: Option<String>,
}

impl Accumulated {
    /// One streamed chunk: the text it adds, if any.
    fn chunk(&mut self, c: &wire::Chunk) -> Result<Option<String>, LlmError> {
        if let Some(e) = &c.error {
            return Err(LlmError::Status { status: 200, message: said(e) });
        }
        let Some(delta) = c.choices.first().and_then(|c| c.delta.as_ref()) else { return Ok(None) };
        for (pos, call) in delta.tool_calls.iter().flatten().enumerate() {
            let id = call.id.as_deref().filter(|s| !s.is_empty());
            // The index says which call a piece belongs to; a server that gives
            // none starts a new call with each new id.
            let index = match call.index {
                Some(i) => usize::try_from(i).unwrap_or(usize::MAX),
                None => match id {
                    Some(id) if self.last_id.as_deref() != Some(id) => self.started,
                    _ => self.started.saturating_sub(1).max(pos),
                },
            };
            if let Some(id) = id {
                self.last_id = Some(id.to_string());
            }
            self.started = self.started.max(index.saturating_add(1));
            if index >= MAX_CALLS {
                continue;
            }
            while self.calls.len() <= index {
                let n = self.calls.len();
                self.calls.push(ToolCall { id: format!("call_{n}"), name: String::new(), arguments: String::new() });
            }
            let c = &mut self.calls[index];
            if let Some(id) = id {
                c.id = id.to_string();
            }
            if let Some(f) = &call.function {
                if let Some(name) = &f.name {
                    c.name.push_str(name);
                }
                c.arguments.push_str(&f.arguments_text());
            }
        }
        match delta.content.as_deref() {
            Some(t) if !t.is_empty() => {
                self.text.push_str(t);
                Ok(Some(t.to_string()))
            }
            _ => Ok(None),
        }
    }

    /// A whole (not streamed) answer.
    fn whole(&mut self, w: &wire::Whole) -> Result<(), LlmError> {
        if let Some(e) = &w.error {
            return Err(LlmError::Status { status: 200, message: said(e) });
        }
        let message = w
            .choices
            .first()
            .and_then(|c| c.message.as_ref())
            .ok_or_else(|| LlmError::Malformed("it has no choices[0].message".into()))?;
        self.text = message.content.clone().unwrap_or_default();
        for (i, call) in message.tool_calls.iter().flatten().enumerate() {
            if i >= MAX_CALLS {
                self.dropped += 1;
                continue;
            }
            let f = call.function.as_ref();
            self.calls.push(ToolCall {
                id: call.id.clone().unwrap_or_else(|| format!("call_{i}")),
                name: f.and_then(|f| f.name.clone()).unwrap_or_default(),
                arguments: f.map(wire::Function::arguments_text).unwrap_or_default(),
            });
        }
        Ok(())
    }

    fn done(self) -> Result<Completion, LlmError> {
        let dropped = self.dropped + self.started.saturating_sub(MAX_CALLS);
        Ok(Completion { text: self.text, tool_calls: self.calls, calls_dropped: dropped })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chunk(v: Value) -> wire::Chunk {
        serde_json::from_value(v).unwrap()
    }

    fn whole(v: Value) -> wire::Whole {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn streamed_pieces_make_text_and_tool_calls() {
        let mut acc = Accumulated::default();
        let chunks = [
            json!({"choices": [{"delta": {"role": "assistant", "content": "Let me "}}]}),
            json!({"choices": [{"delta": {"content": "plot."}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "run_python", "arguments": ""}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"code\": "}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"print(1)\"}"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "list_files", "arguments": {}}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        ];
        let texts: Vec<String> = chunks.into_iter().filter_map(|c| acc.chunk(&chunk(c)).unwrap()).collect();
        assert_eq!(texts, ["Let me ", "plot."]);
        let done = acc.done().unwrap();
        assert_eq!(done.text, "Let me plot.");
        assert_eq!(
            done.tool_calls,
            [
                ToolCall { id: "c1".into(), name: "run_python".into(), arguments: "{\"code\": \"print(1)\"}".into() },
                ToolCall { id: "c2".into(), name: "list_files".into(), arguments: "{}".into() },
            ]
        );
    }

    #[test]
    fn calls_without_an_index_are_told_apart_by_their_ids_and_bounded() {
        let mut acc = Accumulated::default();
        for i in 0..(MAX_CALLS + 3) {
            let c = json!({"choices": [{"delta": {"tool_calls": [{"id": format!("x{i}"), "function": {"name": "list_files", "arguments": "{}"}}]}}]});
            acc.chunk(&chunk(c)).unwrap();
        }
        let done = acc.done().unwrap();
        assert_eq!(done.tool_calls.len(), MAX_CALLS);
        assert_eq!(done.tool_calls[3].id, "x3");
        assert_eq!(done.calls_dropped, 3);
    }

    #[test]
    fn a_whole_answer_and_errors_are_read() {
        let mut acc = Accumulated::default();
        acc.whole(&whole(json!({"choices": [{"message": {"content": null, "tool_calls": [
            {"id": "a", "function": {"name": "run_shell", "arguments": "{\"command\": \"ls\"}"}}]}}]})))
            .unwrap();
        let done = acc.done().unwrap();
        assert_eq!((done.text.as_str(), done.tool_calls[0].name.as_str()), ("", "run_shell"));
        assert!(matches!(Accumulated::default().whole(&whole(json!({"id": 1}))), Err(LlmError::Malformed(_))));
        let e = Accumulated::default().chunk(&chunk(json!({"error": {"message": "out of memory"}}))).unwrap_err();
        assert!(e.to_string().contains("out of memory"), "{e}");
    }

    #[test]
    fn error_answers_say_what_to_do() {
        let tools = error_message(400, br#"{"error": {"message": "This model does not support tools"}}"#);
        assert!(
            tools.starts_with("This model does not support tools: the model may not support tool calls"),
            "{tools}"
        );
        assert!(error_message(401, b"{}").contains("llm_api_key"));
        let plain = error_message(500, b"  upstream crashed \n");
        assert_eq!(plain, "upstream crashed");
        assert!(error_message(400, br#"{"error": "context length exceeded"}"#).contains("start a new conversation"));
    }

    #[test]
    fn lines_split_as_pieces_come() {
        let mut l = Lines::default();
        l.push(b"data: {\"a\"");
        assert_eq!(l.next().unwrap(), None);
        l.push(b": 1}\r\n\r\ndata: [DONE]\n");
        assert_eq!(l.next().unwrap().as_deref(), Some("data: {\"a\": 1}"));
        assert_eq!(l.next().unwrap().as_deref(), Some(""));
        assert_eq!(sse_data(&l.next().unwrap().unwrap()), Some("[DONE]"));
        assert_eq!(l.next().unwrap(), None);
        assert_eq!(sse_data(": keep-alive"), None);
    }

    #[test]
    fn a_line_that_never_ends_is_refused_and_each_byte_is_looked_at_once() {
        let mut l = Lines::default();
        l.push(b"data: ");
        // A byte at a time: the part known to hold no newline is not looked at again.
        for _ in 0..1000 {
            l.push(b"x");
            assert_eq!(l.next().unwrap(), None);
        }
        assert_eq!(l.scanned, 1006);
        l.push(b"\nnext");
        assert_eq!(l.next().unwrap().map(|s| s.len()), Some(1006));
        assert_eq!(l.next().unwrap(), None);
        let mut long = Lines::default();
        long.push(&vec![b'x'; MAX_LINE + 1]);
        assert!(matches!(long.next(), Err(LlmError::Malformed(m)) if m.contains("longer than 1024 KiB")));
    }

    #[test]
    fn urls_are_checked_at_start() {
        let ca = std::path::Path::new("/nonexistent");
        let e = |u: &str| Endpoint::new(u, None, ca, Duration::from_secs(1)).err().map(|e| e.why);
        let ok = Endpoint::new("http://127.0.0.1:1234/v1/", Some(String::new()), ca, Duration::from_secs(1)).unwrap();
        assert_eq!(
            (ok.host.as_str(), ok.port, ok.base.as_str(), ok.api_key.is_none()),
            ("127.0.0.1", 1234, "/v1", true)
        );
        let v6 = Endpoint::new("http://[::1]/v1", None, ca, Duration::from_secs(1)).unwrap();
        assert_eq!((v6.host.as_str(), v6.port, v6.authority.as_str()), ("::1", 80, "[::1]"));
        assert!(e("ftp://x/v1").unwrap().contains("http://"));
        assert!(e("http://u:p@x/v1").unwrap().contains("llm_api_key"));
        assert!(e("https://x/v1").unwrap().contains("CA bundle"));
        assert!(e("http://x/v1?a=1").unwrap().contains("query"));
    }
}
