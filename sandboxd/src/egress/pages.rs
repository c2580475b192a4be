//! The package index's pages, kept in the daemon's memory while the index says
//! they are fresh, so that a session's install does not ask the index over the
//! network for a page another session's install fetched moments ago.
//!
//! An installer asks the index for a project's page (`GET /simple/<name>/`) on
//! every pass: uv revalidates its own copy each time, which from a sandbox is a
//! round trip to the index through the proxy (~50-90 ms here) per page per pass.
//! The proxy ends TLS for a session's package index (its policy's `index_url`:
//! that host and port, over TLS, when the policy installs packages), as it does for
//! the package cache's file host, and answers a page
//! it holds while fresh: for at most what the index's `Cache-Control: max-age` says
//! (PyPI: 600 s), [`HEURISTIC_FRESH`] when the answer says nothing of it (a mirror
//! or proxy in front of the index may strip it), and never more than [`MAX_FRESH`].
//!
//! Kept only what any session would get for the same request: a `GET` over TLS
//! without credentials or cookies, keyed by its host, path and `Accept`; fetched
//! by the daemon itself (without the sandbox's conditional headers, as
//! `identity`), and kept only if its answer is a `200` that does not say it may not
//! be (`private`, `no-store`, `no-cache`, an `Expires` without `max-age`; no `Set-Cookie`; no `Vary`
//! beyond `Accept` and `Accept-Encoding`) and it came whole within
//! [`PAGE_MAX`]. A session's secrets' hosts are never answered from here. All pages
//! together hold at most [`HELD_MAX`]; the oldest go first.

use super::forward::{Body, BoxError};
use bytes::{Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Response, StatusCode};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// The longest a page is answered from memory, whatever the index says.
pub const MAX_FRESH: Duration = Duration::from_secs(600);
/// How long a page whose answer says nothing of its freshness is kept.
pub const HEURISTIC_FRESH: Duration = Duration::from_secs(60);
/// The largest page kept (numpy's JSON page is ~1 MiB).
pub const PAGE_MAX: usize = 8 << 20;
/// What all pages together may hold.
pub const HELD_MAX: usize = 64 << 20;

/// The answer headers a kept page is answered with.
const KEPT_HEADERS: [header::HeaderName; 3] = [header::CONTENT_TYPE, header::ETAG, header::LAST_MODIFIED];

/// What a page is kept under: what could change the index's answer (its host and
/// port, path and query, and `Accept`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    host: String,
    path: String,
    accept: String,
}

/// The key of a request that may be answered from memory, and its answer kept:
/// a `GET` over TLS with no credentials, cookies or ranges.
pub fn key(method: &Method, tls: bool, host: &str, path: &str, headers: &HeaderMap) -> Option<Key> {
    let personal = [header::AUTHORIZATION, header::COOKIE, header::RANGE, header::IF_RANGE];
    if method != Method::GET || !tls || personal.iter().any(|h| headers.contains_key(h)) {
        return None;
    }
    let accept = headers.get_all(header::ACCEPT).iter().map(|v| String::from_utf8_lossy(v.as_bytes())).collect();
    Some(Key { host: host.to_ascii_lowercase(), path: path.into(), accept })
}

/// How long an answer with these `status` and `headers` may be kept: what its
/// `Cache-Control` allows, within [`MAX_FRESH`]; `None` when it may not be.
pub fn freshness(status: StatusCode, headers: &HeaderMap) -> Option<Duration> {
    if status != StatusCode::OK || headers.contains_key(header::SET_COOKIE) {
        return None;
    }
    let coded = headers.get(header::CONTENT_ENCODING).is_some_and(|v| v.as_bytes() != b"identity");
    let varies = headers.get_all(header::VARY).iter().flat_map(|v| v.to_str().unwrap_or("*").split(',')).any(|v| {
        let v = v.trim();
        !v.is_empty() && !v.eq_ignore_ascii_case("accept") && !v.eq_ignore_ascii_case("accept-encoding")
    });
    if coded || varies {
        return None;
    }
    let mut max_age = None;
    for directive in headers.get_all(header::CACHE_CONTROL).iter().flat_map(|v| v.to_str().unwrap_or("").split(',')) {
        let directive = directive.trim().to_ascii_lowercase();
        match directive.split_once('=') {
            Some(("max-age", n)) => max_age = n.trim_matches('"').parse::<u64>().ok(),
            None if matches!(directive.as_str(), "private" | "no-store" | "no-cache") => return None,
            _ => {}
        }
    }
    let age: u64 = headers.get(header::AGE).and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(0);
    let max_age = match max_age {
        Some(n) => n,
        // An `Expires` date alone is not read: not kept.
        None if headers.contains_key(header::EXPIRES) => return None,
        // No word on freshness (a mirror or proxy in front of the index may strip
        // it): a 200 may be given a heuristic one (RFC 9111, 4.2.2).
        None => HEURISTIC_FRESH.as_secs(),
    };
    let left = max_age.checked_sub(age)?;
    (left > 0).then(|| Duration::from_secs(left).min(MAX_FRESH))
}

/// A page kept: its body, the headers it is answered with, and until when.
pub struct Page {
    body: Bytes,
    headers: Vec<(header::HeaderName, HeaderValue)>,
    until: Instant,
}

impl Page {
    /// The answer to a request with `request` headers: `304` when its
    /// `If-None-Match` names the page's tag, else the page whole.
    pub fn answer(&self, request: &HeaderMap, now: Instant) -> Response<Body> {
        let tag = self.headers.iter().find(|(n, _)| n == header::ETAG).map(|(_, v)| v.as_bytes());
        let matches = tag.is_some_and(|tag| {
            request.get_all(header::IF_NONE_MATCH).iter().flat_map(|v| v.as_bytes().split(|b| *b == b',')).any(|t| {
                let t = t.trim_ascii();
                t == b"*" || t == tag || t.strip_prefix(b"W/") == Some(tag) || tag.strip_prefix(b"W/") == Some(t)
            })
        });
        let (status, body) =
            if matches { (StatusCode::NOT_MODIFIED, Bytes::new()) } else { (StatusCode::OK, self.body.clone()) };
        let mut response = Response::new(Full::new(body).map_err(|e| match e {}).boxed());
        *response.status_mut() = status;
        let headers = response.headers_mut();
        for (name, value) in &self.headers {
            headers.append(name.clone(), value.clone());
        }
        let left = self.until.saturating_duration_since(now).as_secs();
        if let Ok(v) = HeaderValue::from_str(&format!("max-age={left}")) {
            headers.insert(header::CACHE_CONTROL, v);
        }
        if !matches {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(self.body.len()));
        }
        response
    }

    /// The bytes its answer carries.
    pub fn len(&self) -> usize {
        self.body.len()
    }
}

/// The pages kept, by key.
#[derive(Default)]
pub struct Pages {
    inner: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    pages: HashMap<Key, (Arc<Page>, Instant)>,
    bytes: usize,
}

impl Pages {
    /// The page kept for `key`, if it is still fresh (a stale one goes).
    pub fn get(&self, key: &Key, now: Instant) -> Option<Arc<Page>> {
        let mut held = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (page, _) = held.pages.get(key)?;
        if page.until > now {
            return Some(page.clone());
        }
        if let Some((gone, _)) = held.pages.remove(key) {
            held.bytes -= gone.body.len();
        }
        None
    }

    /// Keep `page` under `key` (instead of any earlier one), within [`HELD_MAX`]:
    /// the pages kept longest ago go first.
    fn insert(&self, key: Key, page: Page, now: Instant) {
        let mut held = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let len = page.body.len();
        if let Some((old, _)) = held.pages.remove(&key) {
            held.bytes -= old.body.len();
        }
        while held.bytes + len > HELD_MAX {
            let Some(oldest) = held.pages.iter().min_by_key(|(_, (_, at))| *at).map(|(k, _)| k.clone()) else {
                break;
            };
            if let Some((gone, _)) = held.pages.remove(&oldest) {
                held.bytes -= gone.body.len();
            }
        }
        held.bytes += len;
        held.pages.insert(key, (Arc::new(page), now));
    }
}

/// An index page streaming to the sandbox, kept as it passes if it comes whole
/// within [`PAGE_MAX`].
pub struct Kept {
    inner: Body,
    pending: Option<Pending>,
}

struct Pending {
    pages: Arc<Pages>,
    key: Key,
    headers: Vec<(header::HeaderName, HeaderValue)>,
    fresh_for: Duration,
    body: BytesMut,
}

impl Kept {
    /// `inner`, the index's answer to `key` with `headers`, which may be kept for
    /// `fresh_for` ([`freshness`]).
    pub fn new(inner: Body, pages: Arc<Pages>, key: Key, headers: &HeaderMap, fresh_for: Duration) -> Kept {
        let headers = KEPT_HEADERS
            .iter()
            .flat_map(|name| headers.get_all(name).iter().map(move |v| (name.clone(), v.clone())))
            .collect();
        Kept { inner, pending: Some(Pending { pages, key, headers, fresh_for, body: BytesMut::new() }) }
    }

    fn keep(&mut self) {
        if let Some(p) = self.pending.take() {
            let now = Instant::now();
            let page = Page { body: p.body.freeze(), headers: p.headers, until: now + p.fresh_for };
            p.pages.insert(p.key, page, now);
        }
    }
}

impl HttpBody for Kept {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let fits = self.pending.as_ref().is_some_and(|p| p.body.len() + data.len() <= PAGE_MAX);
                    match self.pending.as_mut() {
                        Some(p) if fits => p.body.extend_from_slice(data),
                        _ => self.pending = None,
                    }
                }
                if self.inner.is_end_stream() {
                    self.keep();
                }
            }
            Poll::Ready(None) => self.keep(),
            Poll::Ready(Some(Err(_))) => self.pending = None,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(header::HeaderName::from_bytes(n.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn only_a_get_over_tls_without_credentials_has_a_key() {
        let plain = headers(&[("accept", "application/vnd.pypi.simple.v1+json")]);
        let k = key(&Method::GET, true, "PyPI.org", "/simple/six/", &plain).unwrap();
        assert_eq!(k, key(&Method::GET, true, "pypi.org", "/simple/six/", &plain).unwrap());
        assert_ne!(
            k,
            key(&Method::GET, true, "pypi.org", "/simple/six/", &headers(&[("accept", "text/html")])).unwrap()
        );
        assert_ne!(k, key(&Method::GET, true, "pypi.org", "/simple/tabulate/", &plain).unwrap());
        assert!(key(&Method::HEAD, true, "pypi.org", "/simple/six/", &plain).is_none());
        assert!(key(&Method::POST, true, "pypi.org", "/simple/six/", &plain).is_none());
        assert!(key(&Method::GET, false, "pypi.org", "/simple/six/", &plain).is_none());
        for personal in ["authorization", "cookie", "range", "if-range"] {
            let h = headers(&[("accept", "*/*"), (personal, "x")]);
            assert!(key(&Method::GET, true, "pypi.org", "/simple/six/", &h).is_none(), "{personal}");
        }
        // Conditional headers are the sandbox's own business: they do not split pages.
        let conditional = headers(&[("accept", "application/vnd.pypi.simple.v1+json"), ("if-none-match", "\"a\"")]);
        assert_eq!(key(&Method::GET, true, "pypi.org", "/simple/six/", &conditional), Some(k));
    }

    #[test]
    fn the_index_says_how_long_a_page_may_be_kept() {
        let ok = StatusCode::OK;
        let secs = |n| Some(Duration::from_secs(n));
        // PyPI's simple pages.
        assert_eq!(
            freshness(ok, &headers(&[("cache-control", "max-age=600, public"), ("vary", "Accept, Accept-Encoding")])),
            secs(600)
        );
        assert_eq!(freshness(ok, &headers(&[("cache-control", "max-age=600"), ("age", "590")])), secs(10));
        assert_eq!(freshness(ok, &headers(&[("cache-control", "max-age=600"), ("age", "600")])), None);
        assert_eq!(freshness(ok, &headers(&[("cache-control", "max-age=31536000, immutable")])), Some(MAX_FRESH));
        // Nothing said (a mirror that strips it): the heuristic freshness.
        assert_eq!(freshness(ok, &headers(&[])), Some(HEURISTIC_FRESH));
        assert_eq!(freshness(ok, &headers(&[("cache-control", "public")])), Some(HEURISTIC_FRESH));
        assert_eq!(freshness(ok, &headers(&[("age", "61")])), None);
        for refused in [
            &[("cache-control", "max-age=600, private")][..],
            &[("cache-control", "no-store, max-age=600")],
            &[("cache-control", "no-cache, max-age=600")],
            &[("expires", "Sat, 28 Nov 2026 17:00:00 GMT")],
            &[("cache-control", "max-age=600"), ("set-cookie", "a=b")],
            &[("cache-control", "max-age=600"), ("vary", "Cookie")],
            &[("cache-control", "max-age=600"), ("vary", "*")],
            &[("cache-control", "max-age=600"), ("content-encoding", "gzip")],
        ] {
            assert_eq!(freshness(ok, &headers(refused)), None, "{refused:?}");
        }
        assert_eq!(freshness(StatusCode::NOT_FOUND, &headers(&[("cache-control", "max-age=600")])), None);
    }

    #[tokio::test]
    async fn a_page_is_answered_while_fresh_and_goes_when_stale() {
        let pages = Arc::new(Pages::default());
        let k = key(&Method::GET, true, "pypi.org", "/simple/six/", &HeaderMap::new()).unwrap();
        let answer = headers(&[("content-type", "application/json"), ("etag", "\"v1\""), ("set-cookie", "x=y")]);
        let inner: Body = Full::new(Bytes::from_static(b"{\"page\": 1}")).map_err(|e| match e {}).boxed();
        let body =
            Kept::new(inner, pages.clone(), k.clone(), &answer, Duration::from_secs(60)).collect().await.unwrap();
        assert_eq!(body.to_bytes(), &b"{\"page\": 1}"[..]);
        let now = Instant::now();
        let page = pages.get(&k, now).unwrap();
        let whole = page.answer(&HeaderMap::new(), now);
        assert_eq!(whole.status(), StatusCode::OK);
        assert_eq!(whole.headers()[header::ETAG], "\"v1\"");
        assert_eq!(whole.headers()[header::CONTENT_LENGTH], "11");
        assert!(!whole.headers().contains_key(header::SET_COOKIE));
        assert_eq!(whole.into_body().collect().await.unwrap().to_bytes(), &b"{\"page\": 1}"[..]);
        for tag in ["\"v1\"", "W/\"v1\"", "\"v0\", \"v1\"", "*"] {
            let r = page.answer(&headers(&[("if-none-match", tag)]), now);
            assert_eq!(r.status(), StatusCode::NOT_MODIFIED, "{tag}");
        }
        assert_eq!(page.answer(&headers(&[("if-none-match", "\"v2\"")]), now).status(), StatusCode::OK);
        assert!(pages.get(&k, now + Duration::from_secs(61)).is_none());
        assert!(pages.get(&k, now).is_none(), "a stale page goes");
    }

    #[tokio::test]
    async fn a_page_that_breaks_off_or_is_too_large_is_not_kept() {
        let pages = Arc::new(Pages::default());
        let k = key(&Method::GET, true, "pypi.org", "/simple/big/", &HeaderMap::new()).unwrap();
        let big: Body = Full::new(Bytes::from(vec![b'x'; PAGE_MAX + 1])).map_err(|e| match e {}).boxed();
        let _ = Kept::new(big, pages.clone(), k.clone(), &HeaderMap::new(), Duration::from_secs(60)).collect().await;
        assert!(pages.get(&k, Instant::now()).is_none());
        let broken: Body = http_body_util::StreamBody::new(futures_util::stream::iter(vec![
            Ok(Frame::data(Bytes::from_static(b"half"))),
            Err(BoxError::from("reset")),
        ]))
        .boxed();
        let _ = Kept::new(broken, pages.clone(), k.clone(), &HeaderMap::new(), Duration::from_secs(60)).collect().await;
        assert!(pages.get(&k, Instant::now()).is_none());
    }

    #[test]
    fn all_pages_together_stay_within_their_bound() {
        let pages = Pages::default();
        let now = Instant::now();
        for i in 0..(HELD_MAX / (4 << 20) + 3) {
            let k = key(&Method::GET, true, "pypi.org", &format!("/simple/p{i}/"), &HeaderMap::new()).unwrap();
            let page = Page { body: Bytes::from(vec![0u8; 4 << 20]), headers: vec![], until: now + MAX_FRESH };
            pages.insert(k, page, now + Duration::from_millis(i as u64));
        }
        let held = pages.inner.lock().unwrap();
        assert!(held.bytes <= HELD_MAX && held.bytes == held.pages.values().map(|(p, _)| p.len()).sum::<usize>());
        let first = key(&Method::GET, true, "pypi.org", "/simple/p0/", &HeaderMap::new()).unwrap();
        assert!(!held.pages.contains_key(&first), "the oldest went first");
    }
}
