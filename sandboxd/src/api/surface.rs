//! What a request must look like before any route sees it.
//!
//! On HTTP a browser can reach the daemon: a page on any site can POST to
//! `127.0.0.1`, and a DNS-rebinding name can read the answers. So HTTP requests
//! must name a `Host` the daemon serves (the loopback names and the bind address
//! with its port, and the host of `public_url`), and a present `Origin` must be one
//! of those origins. On both listeners a JSON route's body must be sent as
//! `application/json` (a browser cannot send that type cross-origin without a
//! preflight, which the daemon never grants). A request must have one `Host`
//! header at most (two could be read two ways). Every request body is read with an
//! idle timeout, and a JSON body with a deadline for the whole of it. A request
//! refused before its handler has its body taken in first ([`refuse`]), so that
//! its kept-alive connection serves the next request.

use super::error::ApiError;
use super::Listener;
use crate::model::error::Code;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// One origin the daemon serves: scheme, host (lowercase, IPv6 in brackets), port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Served {
    scheme: String,
    host: String,
    port: u16,
}

/// The names and origins one listener accepts, and its body timeout.
#[derive(Debug, Clone)]
pub struct Surface {
    listener: Listener,
    served: Vec<Served>,
    body_timeout: Duration,
    /// Cancelled when the daemon starts draining (see [`Surface::draining`]).
    drain: Option<tokio_util::sync::CancellationToken>,
}

/// Seconds a client is told to wait (`Retry-After`) when the daemon is draining.
pub const RETRY_AFTER_S: u64 = 5;

impl Surface {
    /// For the HTTP listener bound at `bound` (its real port), with `public_url`.
    pub fn http(bound: SocketAddr, public_url: &str, body_timeout: Duration) -> Surface {
        let mut served: Vec<Served> = LOOPBACK_NAMES
            .iter()
            .map(|h| Served { scheme: "http".into(), host: (*h).into(), port: bound.port() })
            .collect();
        if !bound.ip().is_unspecified() {
            let host = match bound {
                SocketAddr::V4(a) => a.ip().to_string(),
                SocketAddr::V6(a) => format!("[{}]", a.ip()),
            };
            served.push(Served { scheme: "http".into(), host, port: bound.port() });
        }
        if let Some(public) = parse_origin(public_url) {
            if !served.contains(&public) {
                served.push(public);
            }
        }
        Surface { listener: Listener::Http, served, body_timeout, drain: None }
    }

    /// For the Unix socket: no browser reaches it, so only the body rules apply.
    pub fn unix(body_timeout: Duration) -> Surface {
        Surface { listener: Listener::Unix, served: Vec::new(), body_timeout, drain: None }
    }

    /// Once `drain` is cancelled (the daemon is stopping), every request but
    /// `GET /v1/health` is answered 503 `unavailable` with `Retry-After`, while the
    /// listener keeps accepting until the runs in flight have ended.
    pub fn draining(mut self, drain: tokio_util::sync::CancellationToken) -> Surface {
        self.drain = Some(drain);
        self
    }

    fn is_draining(&self) -> bool {
        self.drain.as_ref().is_some_and(|d| d.is_cancelled())
    }

    pub fn listener(&self) -> Listener {
        self.listener
    }

    /// The host names served, for MCP's own Host check.
    pub fn host_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for s in &self.served {
            let name = s.host.trim_start_matches('[').trim_end_matches(']').to_string();
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    fn describe(&self) -> String {
        self.served.iter().map(|s| format!("{}:{}", s.host, s.port)).collect::<Vec<_>>().join(", ")
    }

    fn host_allowed(&self, value: &str) -> bool {
        let Ok(authority) = value.parse::<axum::http::uri::Authority>() else { return false };
        if authority.as_str() != value || value.contains('@') {
            return false;
        }
        let host = authority.host().to_ascii_lowercase();
        let port = authority.port_u16();
        self.served.iter().any(|s| s.host == host && port.is_none_or(|p| p == s.port))
    }

    fn origin_allowed(&self, value: &str) -> bool {
        // An origin is `scheme://host[:port]`, nothing after it.
        let bare = value.split_once("://").is_some_and(|(_, rest)| !rest.contains('/'));
        bare && parse_origin(value).is_some_and(|o| self.served.contains(&o))
    }

    /// One `Host` at most (both listeners), then the browser rules (HTTP only).
    fn check(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let hosts = headers.get_all(header::HOST).iter().count();
        if hosts > 1 {
            return Err(ApiError::new(
                Code::InvalidRequest,
                format!("the request has {hosts} `Host` headers: send exactly one (the name and port the daemon is reached by)"),
            ));
        }
        if self.listener == Listener::Http {
            let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
            if !self.host_allowed(host) {
                return Err(ApiError::new(
                    Code::Forbidden,
                    format!(
                        "Host {host:?} is not a name this daemon serves ({}): connect by one of those, or set `public_url` to the URL clients use to reach the daemon",
                        self.describe()
                    ),
                ));
            }
            if let Some(origin) = headers.get(header::ORIGIN) {
                let origin = origin.to_str().unwrap_or("(not text)");
                if !self.origin_allowed(origin) {
                    return Err(ApiError::new(
                        Code::Forbidden,
                        format!(
                            "requests from web pages at origin {origin:?} are refused: the daemon serves only {}; a page that should call it must be served from one of those, or from the origin set as `public_url`",
                            self.describe()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A route layer (it runs only for a method a route takes, so that a POST to a
/// route without one is a 405, not a 415): a JSON route's body must be sent as
/// `application/json`.
pub async fn json_type(req: Request, next: Next) -> Response {
    let (method, path) = (req.method(), req.uri().path());
    if json_route(method, path) && !json_body_allowed(path, req.headers()) {
        let e = ApiError::new(
            Code::UnsupportedMediaType,
            format!(
                "{method} {path} takes a JSON body: send it with `Content-Type: application/json` (curl --json, or -H 'Content-Type: application/json')"
            ),
        );
        tracing::info!(method = %method, path = %path, code = e.code.as_str(), "request refused at the surface");
        return refuse(req, e.into_response()).await;
    }
    next.run(req).await
}

/// Routes whose body is JSON: every POST of the v1 API, and the PUT of a
/// session's secret (a file's PUT is raw bytes).
fn json_route(method: &Method, path: &str) -> bool {
    let secret = || {
        let parts: Vec<&str> = path.split('/').collect();
        parts.len() == 6 && parts[1] == "v1" && parts[2] == "sessions" && parts[4] == "secrets"
    };
    path.starts_with("/v1/") && (method == Method::POST || (method == Method::PUT && secret()))
}

fn json_body_allowed(path: &str, headers: &HeaderMap) -> bool {
    match headers.get(header::CONTENT_TYPE) {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|t| t.split(';').next())
            .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json")),
        // Every field of a new session is optional: an empty body needs no type.
        None => path == "/v1/sessions" && declared_empty(headers),
    }
}

fn declared_empty(headers: &HeaderMap) -> bool {
    !headers.contains_key(header::TRANSFER_ENCODING)
        && headers
            .get(header::CONTENT_LENGTH)
            .is_none_or(|v| v.to_str().ok().and_then(|n| n.trim().parse::<u64>().ok()) == Some(0))
}

/// `scheme://host[:port]` (a trailing path is ignored), lowercased, port defaulted.
fn parse_origin(value: &str) -> Option<Served> {
    let (scheme, rest) = value.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let authority_text = rest.split('/').next().unwrap_or("");
    if authority_text.contains('@') {
        return None;
    }
    let authority = authority_text.parse::<axum::http::uri::Authority>().ok()?;
    let host = authority.host().to_ascii_lowercase();
    if host.is_empty() {
        return None;
    }
    Some(Served { scheme, host, port: authority.port_u16().unwrap_or(default_port) })
}

/// The middleware: refuse what [`Surface::check`] refuses, and give the body its timeouts.
pub async fn guard(State(surface): State<Arc<Surface>>, mut req: Request, next: Next) -> Response {
    // Which listener: `GET /v1/health` answers by who asks where.
    req.extensions_mut().insert(surface.listener());
    if let Err(e) = surface.check(req.headers()) {
        tracing::info!(method = %req.method(), path = %req.uri().path(), code = e.code.as_str(), "request refused at the surface");
        return refuse(req, e.into_response()).await;
    }
    if surface.is_draining() && !(req.method() == Method::GET && req.uri().path() == "/v1/health") {
        let answer = with_retry_after(
            ApiError::new(
                Code::Unavailable,
                format!(
                    "the daemon is shutting down and takes no new requests (this one was not carried out): retry in {RETRY_AFTER_S} s, once it is back"
                ),
            )
            .into_response(),
        );
        return refuse(req, answer).await;
    }
    let deadline = json_route(req.method(), req.uri().path()).then(|| Instant::now() + surface.body_timeout);
    let (parts, body) = req.into_parts();
    let body = Body::new(TimedBody::new(body, surface.body_timeout, deadline));
    let response = next.run(Request::from_parts(parts, body)).await;
    if response.status() == axum::http::StatusCode::SERVICE_UNAVAILABLE {
        // Refused by the service itself (a run that came in as the drain began).
        return with_retry_after(response);
    }
    response
}

/// Most of a refused request's body taken in before the answer, and for how long.
const REFUSED_BODY: usize = 1024 * 1024;
const REFUSED_BODY_WAIT: Duration = Duration::from_secs(1);

/// Answer a request refused before its handler (here, in `auth`, or by the
/// router's fallbacks) with `answer`, once its body (up to [`REFUSED_BODY`], for
/// at most [`REFUSED_BODY_WAIT`]) is taken in: a connection closed on bytes it has
/// not read is reset, and the client loses the answer (and, kept alive, its next
/// request too).
pub(crate) async fn refuse(req: Request, answer: Response) -> Response {
    // Nothing to keep an anonymous connection for (see `serve::Slots`).
    if let Some(conn) = req.extensions().get::<crate::serve::Connection>() {
        conn.refusing();
    }
    let _ = tokio::time::timeout(REFUSED_BODY_WAIT, axum::body::to_bytes(req.into_body(), REFUSED_BODY)).await;
    answer
}

/// `Retry-After` on a 503 answer, unless it has one.
fn with_retry_after(mut response: Response) -> Response {
    response.headers_mut().entry(header::RETRY_AFTER).or_insert(axum::http::HeaderValue::from(RETRY_AFTER_S));
    response
}

/// A request body that stalled, or did not arrive whole before its deadline.
#[derive(Debug, thiserror::Error)]
pub enum BodyTimeout {
    #[error("the request body stalled: nothing arrived for {0} s; send it without pauses")]
    Idle(u64),
    #[error("the request body did not arrive whole within {0} s; send it at once")]
    Deadline(u64),
}

/// Whether `err` (or what caused it) is a [`BodyTimeout`].
pub fn is_body_timeout(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.is::<BodyTimeout>() {
            return true;
        }
        cur = e.source();
    }
    false
}

/// A body read with an idle timeout (counted only while its reader waits) and an
/// optional deadline for the whole of it.
struct TimedBody {
    inner: Body,
    idle: Duration,
    deadline: Option<Instant>,
    started: Instant,
    timer: Pin<Box<Sleep>>,
    /// The timer is set for the frame being waited for.
    armed: bool,
    failed: bool,
}

impl TimedBody {
    fn new(inner: Body, idle: Duration, deadline: Option<Instant>) -> TimedBody {
        let now = Instant::now();
        TimedBody {
            inner,
            idle,
            deadline,
            started: now,
            timer: Box::pin(tokio::time::sleep_until(now + idle)),
            armed: false,
            failed: false,
        }
    }
}

impl HttpBody for TimedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        if !this.armed {
            let idle_end = Instant::now() + this.idle;
            let end = this.deadline.map_or(idle_end, |d| d.min(idle_end));
            this.timer.as_mut().reset(end);
            this.armed = true;
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.armed = false;
                Poll::Ready(frame)
            }
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.failed = true;
                    let err = match this.deadline {
                        Some(d) if Instant::now() >= d => {
                            BodyTimeout::Deadline(d.duration_since(this.started).as_secs().max(1))
                        }
                        _ => BodyTimeout::Idle(this.idle.as_secs().max(1)),
                    };
                    Poll::Ready(Some(Err(axum::Error::new(err))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn surface() -> Surface {
        Surface::http("127.0.0.1:8181".parse().unwrap(), "https://Sandbox.example.org", Duration::from_secs(5))
    }

    #[test]
    fn hosts_are_the_served_names_with_or_without_the_port() {
        let s = surface();
        for ok in [
            "localhost",
            "localhost:8181",
            "127.0.0.1:8181",
            "[::1]:8181",
            "[::1]",
            "sandbox.example.org",
            "sandbox.example.org:443",
            "LOCALHOST:8181",
        ] {
            assert!(s.host_allowed(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8181",
            "localhost:8182",
            "127.0.0.1:80",
            "",
            "localhost.:8181",
            "sandbox.example.org:8181",
            "a@localhost:8181",
            "localhost:8181/x",
        ] {
            assert!(!s.host_allowed(bad), "{bad}");
        }
    }

    #[test]
    fn origins_must_match_scheme_host_and_port() {
        let s = surface();
        for ok in [
            "http://localhost:8181",
            "http://127.0.0.1:8181",
            "http://[::1]:8181",
            "https://sandbox.example.org",
            "https://sandbox.example.org:443",
        ] {
            assert!(s.origin_allowed(ok), "{ok}");
        }
        for bad in [
            "http://evil.example",
            "null",
            "http://localhost:3000",
            "https://localhost:8181",
            "http://sandbox.example.org",
            "file://",
            "http://localhost:8181.evil.example",
            "http://x@localhost:8181",
        ] {
            assert!(!s.origin_allowed(bad), "{bad}");
        }
    }

    #[test]
    fn json_routes_need_the_json_type() {
        let mut h = HeaderMap::new();
        assert!(json_body_allowed("/v1/sessions", &h));
        assert!(!json_body_allowed("/v1/runs", &h));
        h.insert(header::CONTENT_LENGTH, "2".parse().unwrap());
        assert!(!json_body_allowed("/v1/sessions", &h));
        h.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert!(!json_body_allowed("/v1/runs", &h));
        h.insert(header::CONTENT_TYPE, "Application/JSON; charset=utf-8".parse().unwrap());
        assert!(json_body_allowed("/v1/runs", &h));
        h.insert(header::CONTENT_TYPE, "application/jsonp".parse().unwrap());
        assert!(!json_body_allowed("/v1/runs", &h));
        // Every POST of the API, and a secret's PUT; a file's PUT is raw bytes.
        assert!(json_route(&Method::POST, "/v1/sessions/s/packages"));
        assert!(json_route(&Method::PUT, "/v1/sessions/s/secrets/API_KEY"));
        assert!(!json_route(&Method::PUT, "/v1/sessions/s/files/secrets/x"));
        assert!(!json_route(&Method::PUT, "/v1/sessions/s/files/a"));
        assert!(!json_route(&Method::GET, "/v1/sessions/s/secrets"));
    }

    #[test]
    fn an_unspecified_bind_address_is_not_a_host_name() {
        let s = Surface::http("0.0.0.0:9000".parse().unwrap(), "", Duration::from_secs(5));
        assert!(s.host_allowed("localhost:9000"));
        assert!(!s.host_allowed("0.0.0.0:9000"));
    }
}
