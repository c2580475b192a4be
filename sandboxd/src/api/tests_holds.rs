//! Router unit tests of what a client can hold or see through the surface:
//! refusals before a handler take the body in (so a kept-alive connection
//! serves the next request), one `Host` at most, and who reads the health
//! report and the metrics.

use super::router;
use super::surface::Surface;
use super::tests::{empty, error_of, http, json_of, request, send, state_with, unix, Memory, TOKEN};
use axum::body::{Body, Bytes};
use axum::http::{header, Method, StatusCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const OPERATOR: &str = "operator-token";

/// A body of a few chunks that notes when it was read to its end.
fn watched_body() -> (Body, Arc<AtomicBool>) {
    let read = Arc::new(AtomicBool::new(false));
    let flag = read.clone();
    let chunks = (0..4).map(Ok::<_, std::io::Error>).collect::<Vec<_>>();
    let stream = futures_util::stream::iter(chunks).map(move |c| {
        let n = c?;
        if n == 3 {
            flag.store(true, Ordering::SeqCst);
        }
        Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 1000]))
    });
    (Body::from_stream(stream), read)
}

use futures_util::StreamExt;

/// 401 (auth), 415 (the JSON type), 404 and 405 (no such route or method): each
/// answers only once the request's body is taken in.
#[tokio::test]
async fn refusals_before_a_handler_take_the_body_in() {
    let memory = Arc::new(Memory::default());
    let web = http(&memory, &[TOKEN]);
    // (method, path, content type, token, status, code)
    type Case<'a> = (Method, &'a str, Option<&'a str>, Option<&'a str>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (Method::POST, "/v1/runs", Some("application/json"), None, 401, "unauthorized"),
        (Method::PUT, "/v1/sessions/s1/files/a.txt", None, Some("wrong"), 401, "unauthorized"),
        (Method::POST, "/v1/runs", Some("text/plain"), Some(TOKEN), 415, "unsupported_media_type"),
        (Method::POST, "/v2/nowhere", None, Some(TOKEN), 404, "not_found"),
        (Method::PATCH, "/v1/sessions", None, Some(TOKEN), 405, "method_not_allowed"),
    ];
    for (method, uri, ctype, token, status, code) in cases {
        let (body, read) = watched_body();
        let mut req = request(method.clone(), uri);
        if let Some(t) = ctype {
            req = req.header(header::CONTENT_TYPE, t);
        }
        if let Some(t) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let (got_status, got_code, _) = error_of(send(&web, req.body(body).unwrap()).await).await;
        assert_eq!((got_status, got_code.as_str()), (status, code), "{method} {uri}");
        assert!(read.load(Ordering::SeqCst), "{method} {uri}: answered before its body was taken in");
    }
    assert_eq!(memory.calls(), 0);
}

/// Two `Host` headers could be read two ways (the check reads one, a proxy
/// another): 400, on both listeners, before anything else.
#[tokio::test]
async fn a_request_with_two_hosts_is_refused() {
    let memory = Arc::new(Memory::default());
    for app in [http(&memory, &[]), unix(&memory)] {
        for hosts in [["localhost:8181", "evil.example"], ["localhost:8181", "localhost:8181"]] {
            let req = request(Method::GET, "/v1/sessions").header(header::HOST, hosts[1]).body(Body::empty()).unwrap();
            let (status, code, message) = error_of(send(&app, req).await).await;
            assert_eq!((status, code.as_str()), (400, "invalid_request"), "{hosts:?}");
            assert!(message.contains("2 `Host` headers") && message.contains("exactly one"), "{message}");
        }
    }
    assert_eq!(memory.calls(), 0);
    let one = send(&http(&memory, &[]), empty(Method::GET, "/v1/sessions")).await;
    assert_eq!(one.status(), StatusCode::OK);
}

const FULL: [&str; 8] =
    ["problems", "rootfs_sha256", "cgroup", "landlock_abi", "sessions", "busy_sessions", "pool", "storage"];

fn keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

/// With tokens, health without one is up/down only; any token, or the socket,
/// reads the whole report. Without tokens, everyone does.
#[tokio::test]
async fn health_shows_the_host_only_to_a_known_caller() {
    let memory = Arc::new(Memory::default());
    let state = state_with(memory.clone(), &[TOKEN], &[OPERATOR]);
    let web = router(state.clone(), Surface::http("127.0.0.1:8181".parse().unwrap(), "", Duration::from_secs(5)));
    let sock = router(state, Surface::unix(Duration::from_secs(5)));
    let health = |token: Option<&str>| {
        let mut req = request(Method::GET, "/v1/health");
        if let Some(t) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        req.body(Body::empty()).unwrap()
    };
    for token in [None, Some("wrong")] {
        let short = json_of(send(&web, health(token)).await).await;
        assert_eq!(short, serde_json::json!({"status": "ok", "version": "test"}), "{token:?}");
    }
    let mut all: Vec<String> = FULL.iter().map(|s| s.to_string()).chain(["status".into(), "version".into()]).collect();
    all.sort();
    for (app, token) in [(&web, Some(TOKEN)), (&web, Some(OPERATOR)), (&sock, None)] {
        let full = json_of(send(app, health(token)).await).await;
        assert_eq!(keys(&full), all, "{token:?}");
    }
    let open = json_of(send(&http(&memory, &[]), health(None)).await).await;
    assert_eq!(keys(&open), all);
}

/// The metrics are every tenant's figures: with tokens, an operator token or
/// the socket without one reads them; a tenant's token is 403, none 401.
#[tokio::test]
async fn metrics_need_an_operator() {
    let memory = Arc::new(Memory::default());
    let state = state_with(memory.clone(), &[TOKEN], &[OPERATOR]);
    let web = router(state.clone(), Surface::http("127.0.0.1:8181".parse().unwrap(), "", Duration::from_secs(5)));
    let sock = router(state, Surface::unix(Duration::from_secs(5)));
    let metrics = |token: Option<&str>| {
        let mut req = request(Method::GET, "/metrics");
        if let Some(t) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        req.body(Body::empty()).unwrap()
    };
    let (status, code, message) = error_of(send(&web, metrics(Some(TOKEN))).await).await;
    assert_eq!((status, code.as_str()), (403, "forbidden"));
    assert!(message.contains("operator_tokens") && message.contains("metrics_listen"), "{message}");
    assert_eq!(error_of(send(&sock, metrics(Some(TOKEN))).await).await.1, "forbidden");
    assert_eq!(error_of(send(&web, metrics(None)).await).await.1, "unauthorized");
    for (app, token) in [(&web, Some(OPERATOR)), (&sock, None)] {
        let resp = send(app, metrics(token)).await;
        assert_eq!(resp.status(), StatusCode::OK, "{token:?}");
        assert!(resp.headers()[header::CONTENT_TYPE].to_str().unwrap().starts_with("text/plain"));
    }
    // An operator token is a tenant of its own for everything else.
    let req = request(Method::GET, "/v1/sessions")
        .header(header::AUTHORIZATION, format!("Bearer {OPERATOR}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&web, req).await.status(), StatusCode::OK);
    assert_eq!(memory.owners.lock().unwrap().last().cloned().flatten(), Some(super::tests::owner_id(OPERATOR)));
    // Without tokens, anyone reads them (as before).
    assert_eq!(send(&http(&memory, &[]), metrics(None)).await.status(), StatusCode::OK);
}
