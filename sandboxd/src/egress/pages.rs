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

use super::bodies::{Body, Keeper, Watched};
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Response, StatusCode};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The longest a page is answered from memory, whatever the index says.
pub const MAX_FRESH: Duration = Duration::from_secs(600);
/// A request that asks for a fresh page (`no-cache`, `max-age=0`: pip's) is
/// still answered from memory with a page fetched this recently.
pub const REVALIDATED_WITHIN: Duration = Duration::from_secs(10);
/// The most pages kept at once.
pub const PAGES_MAX: usize = 4096;
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

/// The headers a request may carry and still be answered from memory (or kept):
/// what an installer sends. Anything else (credentials of any name, forwarding
/// headers a mirror builds its links from, a body) could make the index answer one
/// session differently from another: such a request goes to the index as it is.
const PLAIN_REQUEST: [&str; 11] = [
    "accept",
    "accept-encoding",
    "user-agent",
    "if-none-match",
    "if-modified-since",
    "cache-control",
    "pragma",
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
];
/// The longest path, and `Accept`, a kept page's key holds.
const KEY_PART_MAX: usize = 1024;

/// The key of a request that may be answered from memory, and its answer kept: a
/// `GET` over TLS below the index's path (`prefix`), with no body and only
/// [`PLAIN_REQUEST`] headers, its path and `Accept` short and plain. The index is
/// asked with [`Key::upstream_headers`] only, so the key is all it is asked.
pub fn key(method: &Method, tls: bool, host: &str, path: &str, prefix: &str, headers: &HeaderMap) -> Option<Key> {
    if method != Method::GET || !tls || !path.starts_with(prefix) || path.len() > KEY_PART_MAX {
        return None;
    }
    if headers.keys().any(|name| !PLAIN_REQUEST.contains(&name.as_str())) {
        return None;
    }
    let hop = |v: &HeaderValue| {
        v.to_str().map(|v| {
            v.split(',').all(|t| matches!(t.trim().to_ascii_lowercase().as_str(), "" | "keep-alive" | "close"))
        })
    };
    if !headers.get_all(header::CONNECTION).iter().all(|v| hop(v).unwrap_or(false)) {
        return None;
    }
    let mut accept = vec![];
    for value in headers.get_all(header::ACCEPT) {
        let text = value.to_str().ok()?;
        if !text.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
            return None;
        }
        accept.push(text.trim());
    }
    let accept = accept.join(", ");
    (accept.len() <= KEY_PART_MAX).then(|| Key { host: host.to_ascii_lowercase(), path: path.into(), accept })
}

impl Key {
    /// All the index is asked with for this key (besides `Host`): its `Accept`,
    /// and the answer as written.
    pub fn upstream_headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(&self.accept) {
            if !self.accept.is_empty() {
                headers.insert(header::ACCEPT, v);
            }
        }
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        headers.insert(header::USER_AGENT, HeaderValue::from_static("sandboxd-egress"));
        headers
    }

    /// What the key takes of memory.
    fn len(&self) -> usize {
        self.host.len() + self.path.len() + self.accept.len()
    }
}

/// The oldest page a request's own `Cache-Control` (or `Pragma: no-cache`) lets
/// be answered from memory, if it says: never younger than [`REVALIDATED_WITHIN`],
/// so installs at once share one fetch.
pub fn oldest_wanted(request: &HeaderMap) -> Option<Duration> {
    let mut oldest: Option<Duration> = None;
    let mut tighten = |d: Duration| oldest = Some(oldest.map_or(d, |o| o.min(d)));
    for directive in request.get_all(header::CACHE_CONTROL).iter().flat_map(|v| v.to_str().unwrap_or("").split(',')) {
        let directive = directive.trim().to_ascii_lowercase();
        match directive.split_once('=') {
            Some(("max-age", n)) => tighten(Duration::from_secs(n.trim_matches('"').parse().unwrap_or(0))),
            None if directive == "no-cache" => tighten(Duration::ZERO),
            _ => {}
        }
    }
    if request.get_all(header::PRAGMA).iter().any(|v| v.as_bytes().eq_ignore_ascii_case(b"no-cache")) {
        tighten(Duration::ZERO);
    }
    oldest.map(|o| o.max(REVALIDATED_WITHIN))
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
    if headers.get_all(header::PRAGMA).iter().any(|v| v.as_bytes().eq_ignore_ascii_case(b"no-cache")) {
        return None;
    }
    let (mut max_age, mut shared) = (None, None);
    for directive in headers.get_all(header::CACHE_CONTROL).iter().flat_map(|v| v.to_str().unwrap_or("").split(',')) {
        let directive = directive.trim().to_ascii_lowercase();
        match directive.split_once('=') {
            Some(("max-age", n)) => max_age = Some(n.trim_matches('"').parse::<u64>().ok()?),
            // This is a shared cache: its own word comes first.
            Some(("s-maxage", n)) => shared = Some(n.trim_matches('"').parse::<u64>().ok()?),
            Some(("no-cache" | "private", _)) => return None,
            None if matches!(directive.as_str(), "private" | "no-store" | "no-cache" | "must-understand") => {
                return None
            }
            _ => {}
        }
    }
    let max_age = shared.or(max_age);
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
    fetched: Instant,
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

    /// What it takes of memory, with its key.
    fn held(&self, key: &Key) -> usize {
        self.body.len() + key.len() + self.headers.iter().map(|(n, v)| n.as_str().len() + v.len()).sum::<usize>()
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
    /// The page kept for `key`, if it is still fresh and, when the request says
    /// how old a page it takes (`oldest`, [`oldest_wanted`]), no older (a stale
    /// page goes).
    pub fn get(&self, key: &Key, now: Instant, oldest: Option<Duration>) -> Option<Arc<Page>> {
        let mut held = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (page, _) = held.pages.get(key)?;
        if page.until > now {
            let young = oldest.is_none_or(|o| now.saturating_duration_since(page.fetched) <= o);
            return young.then(|| page.clone());
        }
        if let Some((gone, _)) = held.pages.remove(key) {
            held.bytes -= gone.held(key);
        }
        None
    }

    /// Keep `page` under `key` (instead of any earlier one), within [`HELD_MAX`]
    /// bytes and [`PAGES_MAX`] pages, keys and headers counted: stale pages go
    /// first, then those kept longest ago.
    fn insert(&self, key: Key, page: Page, now: Instant) {
        let mut held = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let len = page.held(&key);
        if let Some((old, _)) = held.pages.remove(&key) {
            held.bytes -= old.held(&key);
        }
        if held.bytes + len > HELD_MAX || held.pages.len() >= PAGES_MAX {
            let before = held.pages.len();
            held.pages.retain(|_, (p, _)| p.until > now);
            if held.pages.len() != before {
                held.bytes = held.pages.iter().map(|(k, (p, _))| p.held(k)).sum();
            }
        }
        while held.bytes + len > HELD_MAX || held.pages.len() >= PAGES_MAX {
            let Some(oldest) = held.pages.iter().min_by_key(|(_, (_, at))| *at).map(|(k, _)| k.clone()) else {
                break;
            };
            if let Some((gone, _)) = held.pages.remove(&oldest) {
                held.bytes -= gone.held(&oldest);
            }
        }
        held.bytes += len;
        held.pages.insert(key, (Arc::new(page), now));
    }
}

/// An index page kept as it streams to the sandbox ([`Watched`]), if it comes
/// whole within [`PAGE_MAX`].
pub struct Pending {
    pages: Arc<Pages>,
    key: Key,
    headers: Vec<(header::HeaderName, HeaderValue)>,
    fresh_for: Duration,
    body: BytesMut,
}

/// `inner`, the index's answer to `key` with `headers`, which may be kept for
/// `fresh_for` ([`freshness`]), kept in `pages` as it passes.
pub fn kept(inner: Body, pages: Arc<Pages>, key: Key, headers: &HeaderMap, fresh_for: Duration) -> Watched<Pending> {
    let headers = KEPT_HEADERS
        .iter()
        .flat_map(|name| headers.get_all(name).iter().map(move |v| (name.clone(), v.clone())))
        .collect();
    Watched::new(inner, Pending { pages, key, headers, fresh_for, body: BytesMut::new() })
}

impl Keeper for Pending {
    fn take(&mut self, data: &Bytes) -> bool {
        let fits = self.body.len() + data.len() <= PAGE_MAX;
        if fits {
            self.body.extend_from_slice(data);
        }
        fits
    }

    fn whole(self) {
        let now = Instant::now();
        let page = Page { body: self.body.freeze(), headers: self.headers, fetched: now, until: now + self.fresh_for };
        self.pages.insert(self.key, page, now);
    }
}

#[cfg(test)]
mod tests {
    use super::super::bodies::BoxError;
    use super::*;
    use http_body::Frame;

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
        let k = key(&Method::GET, true, "PyPI.org", "/simple/six/", "/simple", &plain).unwrap();
        assert_eq!(k, key(&Method::GET, true, "pypi.org", "/simple/six/", "/simple", &plain).unwrap());
        assert_ne!(
            k,
            key(&Method::GET, true, "pypi.org", "/simple/six/", "/simple", &headers(&[("accept", "text/html")]))
                .unwrap()
        );
        assert_ne!(k, key(&Method::GET, true, "pypi.org", "/simple/tabulate/", "/simple", &plain).unwrap());
        assert!(key(&Method::HEAD, true, "pypi.org", "/simple/six/", "/simple", &plain).is_none());
        assert!(key(&Method::POST, true, "pypi.org", "/simple/six/", "/simple", &plain).is_none());
        assert!(key(&Method::GET, false, "pypi.org", "/simple/six/", "/simple", &plain).is_none());
        for personal in ["authorization", "cookie", "range", "if-range"] {
            let h = headers(&[("accept", "*/*"), (personal, "x")]);
            assert!(key(&Method::GET, true, "pypi.org", "/simple/six/", "/simple", &h).is_none(), "{personal}");
        }
        // Anything that could make the index answer one session otherwise: a body,
        // forwarding or credential headers of any name, a hop header naming `Accept`.
        for odd in [
            ("x-forwarded-host", "evil.example"),
            ("private-token", "t"),
            ("content-length", "3"),
            ("transfer-encoding", "chunked"),
            ("connection", "accept"),
            ("accept-language", "de"),
        ] {
            let h = headers(&[("accept", "*/*"), odd]);
            assert!(key(&Method::GET, true, "pypi.org", "/simple/six/", "/simple", &h).is_none(), "{odd:?}");
        }
        assert!(key(
            &Method::GET,
            true,
            "pypi.org",
            "/simple/six/",
            "/simple",
            &headers(&[("connection", "keep-alive")])
        )
        .is_some());
        // Below the index's path only, short, with a plain `Accept` (sent as it is keyed).
        assert!(key(&Method::GET, true, "pypi.org", "/pypi/six/json", "/simple", &plain).is_none());
        assert!(
            key(&Method::GET, true, "pypi.org", &format!("/simple/{}", "x".repeat(1100)), "/simple", &plain).is_none()
        );
        let two = headers(&[("accept", "application/vnd.pypi.simple.v1+"), ("accept", "json")]);
        let joined = key(&Method::GET, true, "pypi.org", "/simple/six/", "/simple", &two).unwrap();
        assert_eq!(joined.upstream_headers()[header::ACCEPT], "application/vnd.pypi.simple.v1+, json");
        assert_ne!(joined, k);
        let mut bad = HeaderMap::new();
        bad.insert(header::ACCEPT, HeaderValue::from_bytes(b"text/\xffhtml").unwrap());
        assert!(key(&Method::GET, true, "pypi.org", "/simple/six/", "/simple", &bad).is_none());
        let sent = k.upstream_headers();
        assert_eq!(sent.len(), 3);
        assert_eq!(sent[header::ACCEPT], "application/vnd.pypi.simple.v1+json");
        assert_eq!(sent[header::ACCEPT_ENCODING], "identity");
        // Conditional headers are the sandbox's own business: they do not split pages.
        let conditional = headers(&[("accept", "application/vnd.pypi.simple.v1+json"), ("if-none-match", "\"a\"")]);
        assert_eq!(key(&Method::GET, true, "pypi.org", "/simple/six/", "/simple", &conditional), Some(k));
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
        // A shared cache's own word comes first.
        assert_eq!(freshness(ok, &headers(&[("cache-control", "max-age=600, s-maxage=30")])), secs(30));
        assert_eq!(freshness(ok, &headers(&[("cache-control", "max-age=600, s-maxage=0")])), None);
        for refused in [
            &[("cache-control", "max-age=600, private")][..],
            &[("cache-control", "no-store, max-age=600")],
            &[("cache-control", "no-cache, max-age=600")],
            &[("expires", "Sat, 28 Nov 2026 17:00:00 GMT")],
            &[("cache-control", "max-age=600"), ("pragma", "no-cache")],
            &[("cache-control", "max-age=600, no-cache=\"set-cookie\"")],
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
        let k = key(&Method::GET, true, "pypi.org", "/simple/six/", "/simple", &HeaderMap::new()).unwrap();
        let answer = headers(&[("content-type", "application/json"), ("etag", "\"v1\""), ("set-cookie", "x=y")]);
        let inner: Body = Full::new(Bytes::from_static(b"{\"page\": 1}")).map_err(|e| match e {}).boxed();
        let body = kept(inner, pages.clone(), k.clone(), &answer, Duration::from_secs(60)).collect().await.unwrap();
        assert_eq!(body.to_bytes(), &b"{\"page\": 1}"[..]);
        let now = Instant::now();
        let page = pages.get(&k, now, None).unwrap();
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
        // A request that asks for a fresh page takes one fetched moments ago only.
        let later = now + REVALIDATED_WITHIN + Duration::from_secs(1);
        assert!(pages.get(&k, later, oldest_wanted(&headers(&[("cache-control", "max-age=0")]))).is_none());
        assert!(pages.get(&k, later, oldest_wanted(&headers(&[("pragma", "no-cache")]))).is_none());
        assert!(pages.get(&k, now, oldest_wanted(&headers(&[("cache-control", "no-cache")]))).is_some());
        assert!(pages.get(&k, later, oldest_wanted(&headers(&[("cache-control", "max-age=30")]))).is_some());
        assert!(pages.get(&k, later, None).is_some());
        assert!(pages.get(&k, now + Duration::from_secs(61), None).is_none());
        assert!(pages.get(&k, now, None).is_none(), "a stale page goes");
    }

    #[tokio::test]
    async fn a_page_that_breaks_off_or_is_too_large_is_not_kept() {
        let pages = Arc::new(Pages::default());
        let k = key(&Method::GET, true, "pypi.org", "/simple/big/", "/simple", &HeaderMap::new()).unwrap();
        let big: Body = Full::new(Bytes::from(vec![b'x'; PAGE_MAX + 1])).map_err(|e| match e {}).boxed();
        let _ = kept(big, pages.clone(), k.clone(), &HeaderMap::new(), Duration::from_secs(60)).collect().await;
        assert!(pages.get(&k, Instant::now(), None).is_none());
        let broken: Body = http_body_util::StreamBody::new(futures_util::stream::iter(vec![
            Ok(Frame::data(Bytes::from_static(b"half"))),
            Err(BoxError::from("reset")),
        ]))
        .boxed();
        let _ = kept(broken, pages.clone(), k.clone(), &HeaderMap::new(), Duration::from_secs(60)).collect().await;
        assert!(pages.get(&k, Instant::now(), None).is_none());
    }

    #[test]
    fn all_pages_together_stay_within_their_bound() {
        let pages = Pages::default();
        let now = Instant::now();
        let page =
            |n: usize| Page { body: Bytes::from(vec![0u8; n]), headers: vec![], fetched: now, until: now + MAX_FRESH };
        let k = |i: usize| {
            key(&Method::GET, true, "pypi.org", &format!("/simple/p{i}/"), "/simple", &HeaderMap::new()).unwrap()
        };
        for i in 0..(HELD_MAX / (4 << 20) + 3) {
            pages.insert(k(i), page(4 << 20), now + Duration::from_millis(i as u64));
        }
        {
            let held = pages.inner.lock().unwrap();
            assert!(
                held.bytes <= HELD_MAX && held.bytes == held.pages.iter().map(|(k, (p, _))| p.held(k)).sum::<usize>()
            );
            assert!(!held.pages.contains_key(&k(0)), "the oldest went first");
        }
        // Many small pages: their keys count, and their number is bounded.
        let small = Pages::default();
        for i in 0..PAGES_MAX + 10 {
            small.insert(k(i), page(1), now);
        }
        let held = small.inner.lock().unwrap();
        assert_eq!(held.pages.len(), PAGES_MAX);
        assert_eq!(held.bytes, held.pages.iter().map(|(k, (p, _))| p.held(k)).sum::<usize>());
        assert!(held.bytes > PAGES_MAX * "pypi.org/simple/p0/".len());
    }
}
