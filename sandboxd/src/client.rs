//! A small HTTP/1 client for the daemon's API, over its Unix socket or TCP.
//! Used by `sandboxctl`.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach sandboxd at {0}: {1} (is the daemon running? see --socket / --url)")]
    Connect(String, std::io::Error),
    #[error("talking to sandboxd: {0}")]
    Http(String),
    #[error("{message} ({code})")]
    Api { status: u16, code: String, message: String },
    #[error("{0}")]
    Local(String),
    /// The answer's body is larger than the caller accepts (nothing more was read).
    #[error("the answer is larger than {0} bytes")]
    TooLarge(usize),
}

/// Most bytes read of an answer whose caller gave no limit of its own.
const MAX_ANSWER: usize = 256 * 1024 * 1024;

pub struct Client {
    socket: PathBuf,
    url: Option<String>,
    token: Option<String>,
}

impl Client {
    pub fn new(socket: PathBuf, url: Option<String>, token: Option<String>) -> Client {
        Client { socket, url: url.map(|u| u.trim_end_matches('/').to_string()), token }
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
        content_type: &str,
        limit: usize,
    ) -> Result<(u16, Bytes), ClientError> {
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
        let req = req.body(Full::new(Bytes::from(body))).map_err(|e| ClientError::Http(e.to_string()))?;
        let resp = sender.send_request(req).await.map_err(|e| ClientError::Http(e.to_string()))?;
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
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            return Err(ClientError::Api {
                status,
                code: v["error"]["code"].as_str().unwrap_or("http_error").to_string(),
                message: v["error"]["message"].as_str().map(str::to_string).unwrap_or_else(|| format!("HTTP {status}")),
            });
        }
        Ok((status, bytes))
    }

    /// Send a JSON body (or none) and parse a JSON answer.
    pub async fn json(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, ClientError> {
        let body = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let (_, bytes) = self.send(method, path, body, "application/json", MAX_ANSWER).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Http(format!("unreadable answer: {e}")))
    }

    /// Send raw bytes and parse a JSON answer.
    pub async fn json_raw(&self, method: &str, path: &str, body: Vec<u8>) -> Result<serde_json::Value, ClientError> {
        let (_, bytes) = self.send(method, path, body, "application/octet-stream", MAX_ANSWER).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Http(format!("unreadable answer: {e}")))
    }

    /// The raw bytes of an answer.
    pub async fn bytes(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<Bytes, ClientError> {
        Ok(self.send(method, path, body.unwrap_or_default(), "application/octet-stream", usize::MAX).await?.1)
    }

    /// GET the raw bytes at `path`, at most `limit` of them: a larger answer is
    /// [`ClientError::TooLarge`], found without reading more than `limit` bytes.
    pub async fn bytes_limited(&self, path: &str, limit: usize) -> Result<Bytes, ClientError> {
        Ok(self.send("GET", path, vec![], "application/octet-stream", limit).await?.1)
    }
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
