//! A small HTTP/1 client for the daemon's API, over its Unix socket or TCP.
//! Used by `sandboxctl` (and its stdio MCP server). Requests and answers are the
//! daemon's own typed structs ([`crate::model`]), so a field the daemon renames
//! breaks the build, not a user.

use crate::model::check::Report;
use crate::model::error::Code;
use crate::model::files::FileEntry;
use crate::model::packages::{InstallRequest, InstallResult};
use crate::model::policy::PolicyLimits;
use crate::model::records::{RunPage, RunRecord};
use crate::model::run::{RunRequest, RunResult};
use crate::model::secrets::{SecretInfo, SecretRequest};
use crate::model::session::{CreateSessionRequest, SessionInfo, StatusAnswer};
use crate::names;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use std::path::PathBuf;

/// An API error's code: one this build knows, or the text of one it does not (a
/// newer daemon's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorCode {
    Known(Code),
    Unknown(String),
}

impl ErrorCode {
    pub fn parse(name: &str) -> ErrorCode {
        Code::parse(name).map(ErrorCode::Known).unwrap_or_else(|| ErrorCode::Unknown(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        match self {
            ErrorCode::Known(c) => c.as_str(),
            ErrorCode::Unknown(name) => name,
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach sandboxd at {0}: {1} (is the daemon running? see --socket / --url)")]
    Connect(String, std::io::Error),
    #[error("talking to sandboxd: {0}")]
    Http(String),
    #[error("{message} ({code})")]
    Api { status: u16, code: ErrorCode, message: String },
    #[error("{0}")]
    Local(String),
    /// The answer's body is larger than the caller accepts (nothing more was read).
    #[error("the answer is larger than {0} bytes")]
    TooLarge(usize),
}

/// Most bytes read of an answer whose caller gave no limit of its own.
const MAX_ANSWER: usize = 256 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
    url: Option<String>,
    token: Option<String>,
}

impl Client {
    pub fn new(socket: PathBuf, url: Option<String>, token: Option<String>) -> Client {
        Client { socket, url: url.map(|u| u.trim_end_matches('/').to_string()), token }
    }

    /// Send a request and return the answer with its body still to read.
    async fn open(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
        content_type: &str,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        self.open_with(method, path, body, content_type, &[]).await
    }

    /// [`Client::open`] with more request headers.
    pub async fn open_with(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
        content_type: &str,
        headers: &[(&str, &str)],
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let (host, mut sender) = match &self.url {
            Some(url) => {
                let authority = url
                    .strip_prefix("http://")
                    .ok_or_else(|| ClientError::Local(format!("--url {url}: only http:// URLs are supported")))?
                    .split('/')
                    .next()
                    .unwrap_or("")
                    .to_string();
                let stream = tokio::net::TcpStream::connect(&authority)
                    .await
                    .map_err(|e| ClientError::Connect(url.clone(), e))?;
                (authority, handshake(stream).await?)
            }
            None => {
                let stream = tokio::net::UnixStream::connect(&self.socket)
                    .await
                    .map_err(|e| ClientError::Connect(self.socket.display().to_string(), e))?;
                ("localhost".to_string(), handshake(stream).await?)
            }
        };
        let mut req =
            Request::builder().method(method).uri(path).header("host", host).header("content-type", content_type);
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = req.body(Full::new(Bytes::from(body))).map_err(|e| ClientError::Http(e.to_string()))?;
        sender.send_request(req).await.map_err(|e| ClientError::Http(e.to_string()))
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
        content_type: &str,
        limit: usize,
    ) -> Result<(u16, Bytes), ClientError> {
        let resp = self.open(method, path, body, content_type).await?;
        let status = resp.status().as_u16();
        // A body is read only up to `limit`: what a sandbox wrote may be any size.
        let declared = resp.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
        if status < 400 && declared.is_some_and(|n: u64| n > limit as u64) {
            return Err(ClientError::TooLarge(limit));
        }
        let bytes = match http_body_util::Limited::new(resp.into_body(), limit).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(ClientError::TooLarge(limit)),
            Err(e) => return Err(ClientError::Http(e.to_string())),
        };
        if status >= 400 {
            return Err(api_error(status, &bytes));
        }
        Ok((status, bytes))
    }

    /// Send a JSON body (or none) and parse the JSON answer as `T`.
    async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&impl serde::Serialize>,
    ) -> Result<T, ClientError> {
        let body = match body {
            Some(b) => serde_json::to_vec(b).map_err(|e| ClientError::Local(format!("encoding the request: {e}")))?,
            None => vec![],
        };
        let (_, bytes) = self.send(method, path, body, "application/json", MAX_ANSWER).await?;
        parse(&bytes, method, path)
    }

    pub async fn create_session(&self, req: &CreateSessionRequest) -> Result<SessionInfo, ClientError> {
        self.call("POST", "/v1/sessions", Some(req)).await
    }

    pub async fn get_session(&self, id: &str) -> Result<SessionInfo, ClientError> {
        self.call("GET", &format!("/v1/sessions/{}", segment(id)), NO_BODY).await
    }

    pub async fn list_sessions(&self) -> Result<Vec<SessionInfo>, ClientError> {
        self.call("GET", "/v1/sessions", NO_BODY).await
    }

    pub async fn close_session(&self, id: &str) -> Result<StatusAnswer, ClientError> {
        self.call("DELETE", &format!("/v1/sessions/{}", segment(id)), NO_BODY).await
    }

    pub async fn cancel_run(&self, id: &str) -> Result<StatusAnswer, ClientError> {
        self.call("DELETE", &format!("/v1/sessions/{}/run", segment(id)), NO_BODY).await
    }

    /// Up to `limit` of a session's run records, newest first, older than `before`.
    pub async fn list_runs(&self, id: &str, before: Option<&str>, limit: usize) -> Result<RunPage, ClientError> {
        let mut path = format!("/v1/sessions/{}/runs?limit={limit}", segment(id));
        if let Some(b) = before {
            path.push_str(&format!("&before={}", segment(b)));
        }
        self.call("GET", &path, NO_BODY).await
    }

    /// One run record of a session.
    pub async fn get_run(&self, id: &str, run_id: &str) -> Result<RunRecord, ClientError> {
        self.call("GET", &format!("/v1/sessions/{}/runs/{}", segment(id), segment(run_id)), NO_BODY).await
    }

    /// Install packages into a session's package layer.
    pub async fn install_packages(&self, id: &str, req: &InstallRequest) -> Result<InstallResult, ClientError> {
        self.call("POST", &format!("/v1/sessions/{}/packages", segment(id)), Some(req)).await
    }

    /// Set a session's own secret `name` (its value is never answered back).
    pub async fn set_secret(&self, id: &str, name: &str, req: &SecretRequest) -> Result<SecretInfo, ClientError> {
        self.call("PUT", &format!("/v1/sessions/{}/secrets/{}", segment(id), segment(name)), Some(req)).await
    }

    /// A session's secrets: names and hosts.
    pub async fn list_secrets(&self, id: &str) -> Result<Vec<SecretInfo>, ClientError> {
        self.call("GET", &format!("/v1/sessions/{}/secrets", segment(id)), NO_BODY).await
    }

    pub async fn delete_secret(&self, id: &str, name: &str) -> Result<StatusAnswer, ClientError> {
        self.call("DELETE", &format!("/v1/sessions/{}/secrets/{}", segment(id), segment(name)), NO_BODY).await
    }

    /// Run `req` (in `req.session_id`, or in a new session) and wait for its result.
    pub async fn run(&self, req: &RunRequest) -> Result<RunResult, ClientError> {
        self.call("POST", "/v1/runs", Some(req)).await
    }

    pub async fn policies(&self) -> Result<Vec<PolicyLimits>, ClientError> {
        self.call("GET", "/v1/policies", NO_BODY).await
    }

    pub async fn list_files(&self, id: &str) -> Result<Vec<FileEntry>, ClientError> {
        self.call("GET", &format!("/v1/sessions/{}/files", segment(id)), NO_BODY).await
    }

    /// Upload `data` to `path` in the session.
    pub async fn upload(&self, id: &str, path: &str, overwrite: bool, data: Vec<u8>) -> Result<FileEntry, ClientError> {
        let url = format!("{}{}", file_path(id, path), if overwrite { "?overwrite=true" } else { "" });
        let (_, bytes) = self.send("PUT", &url, data, "application/octet-stream", MAX_ANSWER).await?;
        parse(&bytes, "PUT", &url)
    }

    pub async fn delete_file(&self, id: &str, path: &str) -> Result<StatusAnswer, ClientError> {
        self.call("DELETE", &file_path(id, path), NO_BODY).await
    }

    /// A file's bytes, at most `limit` of them: a larger file is
    /// [`ClientError::TooLarge`], found without reading more than `limit` bytes.
    pub async fn read_file(&self, id: &str, path: &str, limit: usize) -> Result<Bytes, ClientError> {
        Ok(self.send("GET", &file_path(id, path), vec![], "application/octet-stream", limit).await?.1)
    }

    /// Start downloading a file: its declared size, and its bytes as they come
    /// ([`Download::chunk`]), so that no file is ever held whole in memory.
    pub async fn download(&self, id: &str, path: &str) -> Result<Download, ClientError> {
        let resp = self.open("GET", &file_path(id, path), vec![], "application/octet-stream").await?;
        let status = resp.status().as_u16();
        if status >= 400 {
            let bytes = match http_body_util::Limited::new(resp.into_body(), MAX_ERROR).collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => Bytes::new(),
            };
            return Err(api_error(status, &bytes));
        }
        let size = resp.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
        Ok(Download { size, body: resp.into_body() })
    }

    /// `GET /v1/health`, as the daemon answers it.
    pub async fn health(&self) -> Result<serde_json::Value, ClientError> {
        self.call("GET", "/v1/health", NO_BODY).await
    }

    /// `GET /v1/check`: the host's requirements.
    pub async fn check(&self) -> Result<Report, ClientError> {
        self.call("GET", "/v1/check", NO_BODY).await
    }
}

const NO_BODY: Option<&()> = None;

/// Most bytes read of an error answer's body (its envelope).
const MAX_ERROR: usize = 64 * 1024;

/// An error answer: its envelope's code and message (or the HTTP status alone).
fn api_error(status: u16, body: &[u8]) -> ClientError {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    ClientError::Api {
        status,
        code: ErrorCode::parse(v["error"]["code"].as_str().unwrap_or("http_error")),
        message: v["error"]["message"].as_str().map(str::to_string).unwrap_or_else(|| format!("HTTP {status}")),
    }
}

/// A file being downloaded ([`Client::download`]).
pub struct Download {
    /// What the daemon declared (`Content-Length`); the body may still differ.
    pub size: Option<u64>,
    body: hyper::body::Incoming,
}

impl Download {
    /// The next part of the file as it arrives, or None at its end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, ClientError> {
        while let Some(frame) = self.body.frame().await {
            let frame = frame.map_err(|e| ClientError::Http(format!("receiving the file: {e}")))?;
            if let Ok(data) = frame.into_data() {
                return Ok(Some(data));
            }
        }
        Ok(None)
    }
}

fn parse<T: DeserializeOwned>(bytes: &[u8], method: &str, path: &str) -> Result<T, ClientError> {
    serde_json::from_slice(bytes).map_err(|e| ClientError::Http(format!("unreadable answer from {method} {path}: {e}")))
}

/// One path segment, percent-encoded whole: a session id never reaches another
/// route, whatever it holds (`S/files/x` is the id `S/files/x`, which the daemon
/// refuses as invalid).
fn segment(s: &str) -> String {
    let mut out = String::new();
    names::encode_segment(s.as_bytes(), false, &mut out);
    out
}

/// The URL path of `path` (in its text form, [`crate::names`]) in session `id`:
/// the raw bytes it stands for, percent-encoded.
fn file_path(id: &str, path: &str) -> String {
    format!("/v1/sessions/{}/files/{}", segment(id), names::url(&names::parse(path)))
}

async fn handshake<S>(stream: S) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, ClientError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ClientError::Http(e.to_string()))?;
    tokio::spawn(conn);
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_is_one_path_segment_whatever_it_holds() {
        assert_eq!(segment("abc-_9"), "abc-_9");
        assert_eq!(segment("S/files/x"), "S%2Ffiles%2Fx");
        assert_eq!(segment("../x"), "%2E%2E%2Fx");
        assert_eq!(segment("a b"), "a%20b");
        assert_eq!(file_path("S/x", "d/a b.txt"), "/v1/sessions/S%2Fx/files/d/a%20b.txt");
        let file = |path| file_path("s", path).trim_start_matches("/v1/sessions/s/files/").to_string();
        assert_eq!(file("a b/c#d.png"), "a%20b/c%23d.png");
        assert_eq!(file("../../x/./..y.z"), "%2E%2E/%2E%2E/x/%2E/..y.z");
        // A listing's text form reaches the raw bytes it stands for.
        assert_eq!(file("a\\xffb/c\\\\d"), "a%FFb/c%5Cd");
        assert_eq!(file("stray\\q"), "stray%5Cq");
    }

    #[test]
    fn error_codes_are_typed_and_unknown_ones_kept() {
        let body = br#"{"error":{"code":"session_busy","message":"busy"}}"#;
        match api_error(409, body) {
            ClientError::Api { status: 409, code: ErrorCode::Known(Code::SessionBusy), message } => {
                assert_eq!(message, "busy")
            }
            other => panic!("{other:?}"),
        }
        let newer = api_error(400, br#"{"error":{"code":"language_unavailable","message":"no ruby"}}"#);
        assert!(matches!(&newer, ClientError::Api { code: ErrorCode::Unknown(c), .. } if c == "language_unavailable"));
        assert_eq!(newer.to_string(), "no ruby (language_unavailable)");
        let failed = api_error(422, br#"{"error":{"code":"package_install_failed","message":"no wheel"}}"#);
        assert!(matches!(failed, ClientError::Api { code: ErrorCode::Known(Code::PackageInstallFailed), .. }));
        let bare = api_error(502, b"<html>");
        assert!(
            matches!(bare, ClientError::Api { code: ErrorCode::Unknown(c), message, .. } if c == "http_error" && message == "HTTP 502")
        );
    }
}
