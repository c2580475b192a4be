//! Requests the proxy sees whole, forwarded one at a time: a sandbox's plain
//! `http://` requests ([`plain`]), and the requests inside a TLS tunnel the proxy
//! terminated for a secret's host or the package cache's ([`serve_inside`]).
//!
//! Each request goes to the host it was checked for, at an address that was
//! checked, with its `Host` header set to that host (a tunnel to an allowed host
//! cannot ask it for another); hop-by-hop and proxy headers are dropped; the
//! session's secrets are put in for their hosts and a placeholder for any other
//! host refuses the request ([`super::secrets`]): in the request line, every
//! header and the body (read whole up to [`WHOLE_BODY`], rewritten as it streams
//! beyond). An answer from a secret's host gets the placeholder back wherever it
//! shows the value. The package cache's files are served from the cache, or kept
//! as they stream from the index ([`super::cache`]).

use super::bodies::{Body, BoxError, Refused, Rewritten, Watched};
use super::cache::{self, Digest32};
use super::conn::Conn;
use super::connect;
use super::pages;
use super::rules::{code, Host, Refusal};
use super::secrets::{Rewriter, Secrets};
use crate::model::policy::SecretPlace;
use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

/// Bodies up to this size are read whole before they are forwarded (their
/// placeholders replaced, their length set again); larger ones are rewritten as
/// they stream.
pub const WHOLE_BODY: u64 = 1024 * 1024;
/// The longest a body read whole may take.
const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest a request inside a tunnel may take to arrive.
const INSIDE_HEAD_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a checked request goes.
#[derive(Debug, Clone)]
pub struct Target {
    pub host: Host,
    pub port: u16,
    /// Checked addresses, the only ones connected to (also through the daemon's
    /// outbound proxy).
    pub addrs: Vec<SocketAddr>,
    /// Over TLS (to the real server, verified).
    pub tls: bool,
}

impl Target {
    fn shown(&self) -> String {
        format!("{}:{}", self.host.text(), self.port)
    }

    /// The `Host` header of a request to it.
    fn host_header(&self) -> String {
        let default = if self.tls { 443 } else { 80 };
        if self.port == default {
            self.host.text()
        } else {
            self.shown()
        }
    }
}

fn full(text: impl Into<Bytes>) -> Body {
    Full::new(text.into()).map_err(|e| match e {}).boxed()
}

/// A plain `http://` request of the sandbox's, to `target` (over TLS for a
/// package host's TLS port: [`super::plain`]).
pub async fn plain(conn: &Arc<Conn>, kept: &Kept, target: Target, req: Request<Incoming>) -> Response<Body> {
    let shown = target.shown();
    let prepared = match prepare(conn, &target, req).await {
        Ok(p) => p,
        Err(why) => return conn.refuse(&shown, why),
    };
    conn.reached(&shown, target.tls);
    let page = prepared.page.is_some();
    // The connection to the host is kept for the connection's next request to it.
    let upstream = kept.to(&shown);
    let mut upstream = upstream.lock().await;
    let answer = answer(conn, &target, &mut upstream, prepared).await;
    match target.tls {
        true => super::plain::answer(&conn.egress, &conn.tenant, answer, page),
        false => answer,
    }
}

/// Serve the requests inside a tunnel the proxy terminated (`stream`: the TLS
/// connection the sandbox made to the proxy's certificate for `target`).
pub async fn serve_inside<S>(conn: Arc<Conn>, target: Target, stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let upstream = Arc::new(tokio::sync::Mutex::new(Upstream::default()));
    let service = {
        let conn = conn.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let (conn, target, upstream) = (conn.clone(), target.clone(), upstream.clone());
            async move {
                let shown = target.shown();
                let answer = match prepare(&conn, &target, req).await {
                    Err(why) => conn.refuse(&shown, why),
                    Ok(prepared) => answer(&conn, &target, &mut *upstream.lock().await, prepared).await,
                };
                Ok::<_, std::convert::Infallible>(answer)
            }
        })
    };
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(INSIDE_HEAD_TIMEOUT)
        .max_buf_size(64 * 1024)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(session_id = %conn.tenant.session, run_id = %conn.run_id, error = %e, "a looked-into egress connection ended with an error");
    }
}

/// The answer to a prepared request: from the package cache, from the index's
/// pages in memory, or from `target` itself.
async fn answer(conn: &Arc<Conn>, target: &Target, upstream: &mut Upstream, prepared: Prepared) -> Response<Body> {
    match from_cache(conn, target, &prepared).await {
        Some(cached) => cached,
        None => match from_pages(conn, target, &prepared) {
            Some(page) => page,
            None => send(conn, target, upstream, prepared).await,
        },
    }
}

/// A request ready to go: the request, and how its answer is rewritten (the
/// session's secrets' values back to their placeholders).
struct Prepared {
    request: Request<Body>,
    /// The session's secrets as the request was prepared.
    secrets: Arc<Secrets>,
    incoming: Option<Rewriter>,
    /// The cache's digest of the file asked for (a GET of the cache's host).
    digest: Option<Digest32>,
    /// A `Range` was asked: the answer is not the whole file.
    ranged: bool,
    head: bool,
    /// The sandbox's share of bodies held whole, while this one is.
    held: Option<tokio::sync::OwnedSemaphorePermit>,
    /// An index page's key ([`pages`]), and the sandbox's own `If-None-Match`
    /// (the request goes without it, so that its answer can be kept).
    page: Option<(pages::Key, HeaderMap)>,
}

/// The sandbox's request as it goes to `target`: see the module's notes.
async fn prepare(conn: &Arc<Conn>, target: &Target, req: Request<Incoming>) -> Result<Prepared, Refusal> {
    let secrets = conn.tenant.secrets();
    let (host, tls) = (&target.host, target.tls);
    let carries = secrets.for_host(host);
    let refused = |place: SecretPlace| {
        let secrets = secrets.clone();
        move |name: String| secrets.refusal(&name, host, place, tls)
    };
    let (parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let path =
        secrets.outgoing(host, SecretPlace::Url, tls).whole(path.as_bytes()).map_err(refused(SecretPlace::Url))?;
    let path = String::from_utf8(path.into_owned())
        .map_err(|_| Refusal::new(code::BAD_REQUEST, "the request's path is not text"))?;
    let uri: hyper::Uri =
        path.parse().map_err(|_| Refusal::new(code::BAD_REQUEST, "the request's path is not a valid one"))?;

    let page = match conn.egress.pages_for(&conn.tenant, host, target.port) {
        Some((_, prefix)) if !carries => pages::key(&parts.method, tls, &target.shown(), &path, prefix, &parts.headers),
        _ => None,
    };
    let mut headers = HeaderMap::new();
    let mut in_headers = secrets.outgoing(host, SecretPlace::Headers, tls);
    let mut skip = hop_by_hop(&parts.headers);
    skip.push(header::HOST);
    let mut conditional = HeaderMap::new();
    if page.is_some() {
        // The index is asked what the key says and nothing else: an answer any
        // session could be given. The sandbox's own conditions are answered here.
        for name in [header::IF_NONE_MATCH, header::CACHE_CONTROL, header::PRAGMA] {
            for value in parts.headers.get_all(&name) {
                conditional.append(name.clone(), value.clone());
            }
        }
    }
    if carries {
        // A part of an answer is a part of what the host holds, which may be a
        // value it was sent: a secret's host answers whole, and rewritten whole.
        skip.extend([header::RANGE, header::IF_RANGE]);
    }
    for (name, value) in &parts.headers {
        if skip.contains(name) {
            continue;
        }
        // Looked at for placeholders whether it goes or not.
        let value = in_headers.whole(value.as_bytes()).map_err(refused(SecretPlace::Headers))?;
        let value = HeaderValue::from_bytes(&value)
            .map_err(|_| Refusal::new(code::BAD_REQUEST, format!("the header {name} cannot carry its value")))?;
        headers.append(name.clone(), value);
    }
    if let Some(key) = &page {
        headers = key.upstream_headers();
    }
    let host_header = HeaderValue::from_str(&target.host_header())
        .map_err(|_| Refusal::new(code::BAD_REQUEST, "the host cannot be a Host header"))?;
    headers.insert(header::HOST, host_header);
    if carries {
        // An answer the proxy rewrites must come as it is written.
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }

    let mut in_body = secrets.outgoing(host, SecretPlace::Body, tls);
    let length = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    // A small body is read whole (so a refusal comes before any of it went) when
    // the sandbox's share of such bodies has room for it.
    let held = match length {
        Some(n) if n <= WHOLE_BODY && !in_body.is_empty() => {
            conn.tenant.bodies.clone().try_acquire_many_owned(n.div_ceil(1024).max(1) as u32).ok()
        }
        _ => None,
    };
    let body: Body = if in_body.is_empty() {
        // The session has no secrets: nothing to look for.
        body.map_err(BoxError::from).boxed()
    } else if held.is_some() {
        let collected = tokio::time::timeout(BODY_TIMEOUT, body.collect())
            .await
            .map_err(|_| Refusal::new(code::BAD_REQUEST, "the request's body did not arrive in time"))?
            .map_err(|e| Refusal::new(code::BAD_REQUEST, format!("reading the request's body: {e}")))?
            .to_bytes();
        let rewritten = in_body.whole(&collected).map_err(refused(SecretPlace::Body))?.into_owned();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(rewritten.len()));
        full(rewritten)
    } else {
        if carries {
            // Replacing changes the length: it streams chunked.
            headers.remove(header::CONTENT_LENGTH);
        }
        Rewritten::new(body.map_err(BoxError::from).boxed(), in_body).boxed()
    };

    let digest = (conn.egress.caches(host)
        && (parts.method == hyper::Method::GET || parts.method == hyper::Method::HEAD))
        .then(|| cache::digest_of(uri.path()))
        .flatten()
        .filter(|_| uri.query().is_none());
    let ranged = parts.headers.contains_key(header::RANGE);
    let head = parts.method == hyper::Method::HEAD;
    let mut request = Request::new(body);
    *request.method_mut() = parts.method;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    let incoming = secrets.incoming(host);
    let page = page.map(|key| (key, conditional));
    Ok(Prepared { request, secrets, incoming, digest, ranged, head, held, page })
}

/// The headers a proxy does not pass on: hop-by-hop ones, proxy ones, and those
/// `Connection` names.
fn hop_by_hop(headers: &HeaderMap) -> Vec<HeaderName> {
    let mut names: Vec<HeaderName> = [
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ]
    .into_iter()
    .map(HeaderName::from_static)
    .collect();
    for value in headers.get_all(header::CONNECTION) {
        for name in value.to_str().unwrap_or_default().split(',') {
            if let Ok(n) = HeaderName::from_bytes(name.trim().as_bytes()) {
                names.push(n);
            }
        }
    }
    names
}

/// The connection to a real host that a sandbox's connection's plain requests
/// reuse while they go to that host: one, as a tunnel holds one (a request to
/// another host closes it), so a sandbox holds no more connections out than it
/// has in ([`super::MAX_CONNECTIONS`]).
#[derive(Default)]
pub struct Kept(std::sync::Mutex<Option<(String, Arc<tokio::sync::Mutex<Upstream>>)>>);

impl Kept {
    /// The connection kept to `shown` (`host:port`), or a place for one in its stead.
    fn to(&self, shown: &str) -> Arc<tokio::sync::Mutex<Upstream>> {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match &*kept {
            Some((host, upstream)) if host == shown => upstream.clone(),
            _ => {
                let upstream = Arc::new(tokio::sync::Mutex::new(Upstream::default()));
                *kept = Some((shown.to_string(), upstream.clone()));
                upstream
            }
        }
    }
}

/// The connection to the real host a tunnel's requests reuse.
#[derive(Default)]
struct Upstream {
    sender: Option<hyper::client::conn::http1::SendRequest<Body>>,
}

impl Upstream {
    /// A sender ready for the next request: the one held, or a new connection.
    async fn ready(
        &mut self,
        conn: &Conn,
        target: &Target,
    ) -> Result<&mut hyper::client::conn::http1::SendRequest<Body>, Refusal> {
        if let Some(sender) = self.sender.as_mut() {
            if sender.ready().await.is_err() {
                self.sender = None;
            }
        }
        if self.sender.is_none() {
            self.sender = Some(open(conn, target).await?);
        }
        self.sender.as_mut().ok_or_else(|| Refusal::new(code::CONNECT_FAILED, "no connection"))
    }
}

/// A new connection to `target` (over TLS when it is one), its driver running in
/// the background until the sender is dropped.
async fn open(conn: &Conn, target: &Target) -> Result<hyper::client::conn::http1::SendRequest<Body>, Refusal> {
    let failed = |why: String| Refusal::new(code::CONNECT_FAILED, format!("{}: {why}", target.shown()));
    let tcp = connect::open(&target.host, target.port, &target.addrs, &conn.egress.upstream, target.tls).await?;
    let builder = hyper::client::conn::http1::Builder::new();
    if target.tls {
        let name = match &target.host {
            Host::Name(n) => rustls_pki_types::ServerName::try_from(n.clone()).map_err(|e| failed(e.to_string()))?,
            Host::Ip(ip) => rustls_pki_types::ServerName::IpAddress((*ip).into()),
        };
        let tls = conn.egress.tls.connector().connect(name, tcp).await.map_err(|e| failed(format!("TLS: {e}")))?;
        let (sender, connection) = builder.handshake(TokioIo::new(tls)).await.map_err(|e| failed(e.to_string()))?;
        tokio::spawn(connection);
        Ok(sender)
    } else {
        let (sender, connection) = builder.handshake(TokioIo::new(tcp)).await.map_err(|e| failed(e.to_string()))?;
        tokio::spawn(connection);
        Ok(sender)
    }
}

/// Send `prepared` to `target` and answer with what it answers.
async fn send(conn: &Arc<Conn>, target: &Target, upstream: &mut Upstream, prepared: Prepared) -> Response<Body> {
    let shown = target.shown();
    let Prepared { request, secrets, incoming, digest, ranged, head, held, page } = prepared;
    let sender = match upstream.ready(conn, target).await {
        Ok(s) => s,
        Err(why) => return conn.refuse(&shown, why),
    };
    let sent = sender.send_request(request).await;
    drop(held);
    let answer = match sent {
        Ok(a) => a,
        Err(e) => {
            upstream.sender = None;
            // A placeholder where it may not go, found as the body streamed.
            let refused = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<Refused>()).map(|r| r.0.clone());
            let why = match refused {
                Some(name) => secrets.refusal(&name, &target.host, SecretPlace::Body, target.tls),
                None => Refusal::new(code::CONNECT_FAILED, format!("{shown}: {e}")),
            };
            return conn.refuse(&shown, why);
        }
    };
    let (mut parts, body) = answer.into_parts();
    if let Some(mut rewriter) = incoming {
        if let Err(why) = rewritable(&parts, target) {
            upstream.sender = None;
            return conn.refuse(&shown, why);
        }
        for name in hop_by_hop(&parts.headers) {
            parts.headers.remove(name);
        }
        let mut headers = HeaderMap::new();
        for (name, value) in &parts.headers {
            // A header named with a value is dropped (no answer needs one), as is
            // one whose value would not survive the rewriting.
            if !matches!(rewriter.whole(name.as_str().as_bytes()), Ok(Cow::Borrowed(_))) {
                continue;
            }
            if let Ok(Ok(v)) = rewriter.whole(value.as_bytes()).map(|v| HeaderValue::from_bytes(&v)) {
                headers.append(name.clone(), v);
            }
        }
        headers.remove(header::CONTENT_LENGTH);
        parts.headers = headers;
        // The status line's own words too (what `reason` shows in Python).
        if let Some(reason) = parts.extensions.remove::<hyper::ext::ReasonPhrase>() {
            let kept = rewriter
                .whole(reason.as_bytes())
                .ok()
                .and_then(|r| hyper::ext::ReasonPhrase::try_from(r.into_owned()).ok());
            if let Some(reason) = kept {
                parts.extensions.insert(reason);
            }
        }
        let body = Rewritten::new(body.map_err(BoxError::from).boxed(), rewriter).boxed();
        return Response::from_parts(parts, body);
    }
    for name in hop_by_hop(&parts.headers) {
        parts.headers.remove(name);
    }
    let mut body: Body = body.map_err(BoxError::from).boxed();
    if let Some(digest) = digest.filter(|_| !ranged && !head && parts.status == StatusCode::OK) {
        let identity = parts.headers.get(header::CONTENT_ENCODING).is_none_or(|v| v == "identity");
        let length = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
        if let Some(writer) = conn.egress.cache.as_ref().filter(|_| identity).and_then(|c| c.writer(digest, length)) {
            crate::metrics::global().package_cache(false);
            body = Watched::new(body, writer).boxed();
        }
    }
    if let (Some((key, _)), Some((pages, _))) = (page, conn.egress.pages_for(&conn.tenant, &target.host, target.port)) {
        crate::metrics::global().index_page(false);
        if let Some(fresh_for) = pages::freshness(parts.status, &parts.headers) {
            body = pages::kept(body, pages.clone(), key, &parts.headers, fresh_for).boxed();
        }
    }
    Response::from_parts(parts, body)
}

/// An index page answered from memory while fresh ([`pages`]).
fn from_pages(conn: &Conn, target: &Target, prepared: &Prepared) -> Option<Response<Body>> {
    let (key, conditional) = prepared.page.as_ref()?;
    let now = tokio::time::Instant::now();
    let (pages, _) = conn.egress.pages_for(&conn.tenant, &target.host, target.port)?;
    let page = pages.get(key, now, pages::oldest_wanted(conditional))?;
    let response = page.answer(conditional, now);
    let bytes = if response.status() == StatusCode::OK { page.len() as u64 } else { 0 };
    conn.usage.from_cache(bytes);
    crate::metrics::global().index_page(true);
    tracing::debug!(session_id = %conn.tenant.session, run_id = %conn.run_id, host = %target.host.text(), path = %prepared.request.uri().path(), status = response.status().as_u16(), bytes, "package index page answered from memory");
    Some(response)
}

/// Whether an answer of a secret's host can be looked through for the secrets'
/// values: only as it is written (asked with `Accept-Encoding: identity`; a
/// compressed body would carry a value past the rewriting), and with no transfer
/// coding but chunked.
fn rewritable(parts: &hyper::http::response::Parts, target: &Target) -> Result<(), Refusal> {
    // The server's own words are not repeated: they could hold a value.
    let coded = |name: HeaderName, plain: &'static str| {
        parts
            .headers
            .get_all(&name)
            .iter()
            .flat_map(|v| v.to_str().unwrap_or("?").split(','))
            .map(|c| c.trim().to_ascii_lowercase())
            .any(|c| !c.is_empty() && c != plain)
    };
    let encoded = coded(header::CONTENT_ENCODING, "identity");
    if encoded || coded(header::TRANSFER_ENCODING, "chunked") {
        let which = if encoded { "a content coding" } else { "a transfer coding other than chunked" };
        return Err(Refusal::new(
            code::ANSWER_REFUSED,
            format!(
                "{} answered with {which} though asked for identity; an answer of a secret's host is passed on only as written, so the proxy can take the secrets' values out of it",
                target.shown()
            ),
        ));
    }
    Ok(())
}

/// A file of the package cache, answered from the cache without asking the index.
async fn from_cache(conn: &Conn, target: &Target, prepared: &Prepared) -> Option<Response<Body>> {
    let digest = prepared.digest?;
    let cache = conn.egress.cache.as_ref()?;
    let (file, length) = cache.get(&digest)?;
    let range = match prepared.request.headers().get(header::RANGE) {
        None => None,
        Some(v) => Some(byte_range(v.to_str().ok()?, length)?),
    };
    let (start, end) = range.unwrap_or((0, length));
    let mut response = Response::new(if prepared.head {
        full(Bytes::new())
    } else {
        let mut file = tokio::fs::File::from_std(file);
        tokio::io::AsyncSeekExt::seek(&mut file, std::io::SeekFrom::Start(start)).await.ok()?;
        let stream = tokio_util::io::ReaderStream::new(tokio::io::AsyncReadExt::take(file, end - start));
        let frames = futures_util::StreamExt::map(stream, |chunk| chunk.map(Frame::data).map_err(BoxError::from));
        http_body_util::StreamBody::new(frames).boxed()
    });
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(end - start));
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if range.is_some() {
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{}/{length}", end.saturating_sub(1))) {
            response.headers_mut().insert(header::CONTENT_RANGE, v);
        }
    }
    if !prepared.head {
        conn.usage.from_cache(end - start);
    }
    crate::metrics::global().package_cache(true);
    tracing::debug!(session_id = %conn.tenant.session, run_id = %conn.run_id, host = %target.host.text(), path = %prepared.request.uri().path(), head = prepared.head, bytes = end - start, "package file served from the cache");
    Some(response)
}

/// One range of `Range: bytes=...` within `length`: `[start, end)`. `None` for
/// anything else (several ranges, a unit that is not bytes, out of bounds): the
/// request then goes to the index.
fn byte_range(value: &str, length: u64) -> Option<(u64, u64)> {
    let spec = value.trim().strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = match (a.is_empty(), b.is_empty()) {
        (true, false) => {
            let n: u64 = b.parse().ok()?;
            (length.saturating_sub(n), length)
        }
        (false, true) => (a.parse().ok()?, length),
        (false, false) => (a.parse().ok()?, b.parse::<u64>().ok()?.checked_add(1)?.min(length)),
        (true, true) => return None,
    };
    (start < end && start < length).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_byte_range_is_served_from_the_cache() {
        assert_eq!(byte_range("bytes=0-99", 1000), Some((0, 100)));
        assert_eq!(byte_range("bytes=900-", 1000), Some((900, 1000)));
        assert_eq!(byte_range("bytes=-100", 1000), Some((900, 1000)));
        assert_eq!(byte_range("bytes=990-2000", 1000), Some((990, 1000)));
        for bad in ["bytes=0-1,5-6", "items=0-1", "bytes=1000-", "bytes=5-4", "bytes=-", "bytes=a-b"] {
            assert_eq!(byte_range(bad, 1000), None, "{bad}");
        }
    }

    #[test]
    fn proxy_and_hop_by_hop_headers_are_not_passed_on() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, X-Private"));
        let names = hop_by_hop(&h);
        for n in ["connection", "proxy-authorization", "proxy-connection", "te", "x-private"] {
            assert!(names.contains(&HeaderName::from_static(n)), "{n}");
        }
        assert!(!names.contains(&header::AUTHORIZATION));
    }
}
