//! The router's own unit tests: the real axum router (surface guard, auth,
//! handlers, error envelope), driven request by request, over a small in-memory
//! [`Operations`] in place of the sandboxes. No root, no kernel: what is tested is
//! what the router adds on top of the service (routing, status codes, bodies,
//! headers, the envelope). The black-box suite (`tests/`) tests the real daemon.

use super::surface::Surface;
use super::{router, AppState, Tokens};
use crate::model::health::Problem;
use crate::model::policy::Policy;
use crate::run;
use crate::service;
pub(super) use crate::service::fake::Memory;
use crate::session;
use crate::workspace;
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::response::Response;
use axum::Router;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

pub(super) const TOKEN: &str = "secret-token";

/// The owner key of the router's tests.
pub(super) fn owner_key() -> crate::owner::OwnerKey {
    crate::owner::OwnerKey::from_bytes([9; 32])
}

/// A token's owner id, as the router's tests' daemon keys it.
pub(super) fn owner_id(token: &str) -> String {
    owner_key().id(token)
}

pub(super) fn state_with(memory: Arc<Memory>, tokens: &[&str], operators: &[&str]) -> Arc<AppState> {
    let list = |ts: &[&str]| ts.iter().map(|t| t.to_string()).collect::<Vec<_>>();
    Arc::new(AppState {
        service: memory,
        tokens: Tokens::new(owner_key(), &list(tokens), &list(operators)),
        version: "test",
        rootfs_sha256: "abc".into(),
        landlock_abi: 6,
        shutdown: tokio_util::sync::CancellationToken::new(),
        mcp_sessions: super::mcp::SessionLimits { max: 4, per_token: 2, idle: Duration::from_secs(300) },
        mcp: Default::default(),
        chat: Arc::new(crate::chat::Engine::new(crate::chat::Settings {
            endpoint: None,
            model: None,
            max_turns: 3,
            images: false,
        })),
    })
}

fn state(memory: Arc<Memory>, tokens: &[&str]) -> Arc<AppState> {
    state_with(memory, tokens, &[])
}

pub(super) fn unix(memory: &Arc<Memory>) -> Router {
    router(state(memory.clone(), &[]), Surface::unix(Duration::from_secs(5)))
}

pub(super) fn http(memory: &Arc<Memory>, tokens: &[&str]) -> Router {
    let surface = Surface::http("127.0.0.1:8181".parse().unwrap(), "", Duration::from_secs(5));
    router(state(memory.clone(), tokens), surface)
}

/// One request through the router, as hyper would pass it.
pub(super) async fn send(app: &Router, req: Request<Body>) -> Response {
    use hyper::service::Service as _;
    hyper_util::service::TowerToHyperService::new(app.clone()).call(req).await.unwrap()
}

pub(super) fn request(method: Method, uri: &str) -> axum::http::request::Builder {
    Request::builder().method(method).uri(uri).header(header::HOST, "localhost:8181")
}

pub(super) fn json_request(method: Method, uri: &str, body: Value) -> Request<Body> {
    request(method, uri).header(header::CONTENT_TYPE, "application/json").body(Body::from(body.to_string())).unwrap()
}

pub(super) fn empty(method: Method, uri: &str) -> Request<Body> {
    request(method, uri).body(Body::empty()).unwrap()
}

pub(super) async fn body_of(resp: Response) -> Vec<u8> {
    axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap().to_vec()
}

pub(super) async fn json_of(resp: Response) -> Value {
    let bytes = body_of(resp).await;
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
}

/// The status, and the error envelope's code and message (asserting its exact shape).
pub(super) async fn error_of(resp: Response) -> (u16, String, String) {
    let status = resp.status().as_u16();
    let ctype = resp.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_string());
    assert_eq!(ctype.as_deref(), Some("application/json"), "status {status}");
    let body = json_of(resp).await;
    let obj = body.as_object().unwrap();
    assert_eq!(obj.keys().collect::<Vec<_>>(), ["error"], "{body}");
    let err = body["error"].as_object().unwrap();
    let mut keys: Vec<_> = err.keys().collect();
    keys.sort();
    assert_eq!(keys, ["code", "message"], "{body}");
    let message = err["message"].as_str().unwrap().to_string();
    assert!(!message.is_empty(), "{body}");
    (status, err["code"].as_str().unwrap().to_string(), message)
}

/// Each kind of service error, and the status and code the API answers it with.
fn error_cases() -> Vec<(service::Error, u16, &'static str)> {
    vec![
        (session::Error::InvalidId("a b".into()).into(), 400, "invalid_session_id"),
        (session::Error::PolicyNotFound { name: "x".into(), known: vec![] }.into(), 400, "policy_not_found"),
        (session::Error::NotFound("s".into()).into(), 404, "session_not_found"),
        (session::Error::Exists("s".into()).into(), 409, "session_exists"),
        (session::Error::Busy("s".into()).into(), 409, "session_busy"),
        (session::Error::InvalidTtl.into(), 400, "invalid_request"),
        (session::Error::TokenMaxSessions { max: 1, closing: 0 }.into(), 429, "max_sessions"),
        (session::Error::MaxSessions { max: 1, closing: 2 }.into(), 429, "max_sessions"),
        (session::Error::TokenMaxRuns(1).into(), 429, "max_runs"),
        (
            session::Error::InsufficientStorage {
                free_mb: 1,
                room_mb: 1,
                held_mb: 2,
                wanted_mb: 3,
                policy: "p".into(),
            }
            .into(),
            507,
            "insufficient_storage",
        ),
        (session::Error::Workspace(std::io::Error::other("/srv/x")).into(), 500, "internal"),
        (run::Error::CodeTooLarge { len: 2, policy: "p".into(), max: 1 }.into(), 413, "code_too_large"),
        (run::Error::NulByte.into(), 400, "invalid_request"),
        (run::Error::Timeout { given: 0.0, policy: "p".into(), max: 1 }.into(), 400, "invalid_request"),
        (run::Error::Internal { context: "c".into(), error: "/srv/x".into() }.into(), 500, "internal"),
        (workspace::Error::InvalidPath("p".into()).into(), 400, "invalid_path"),
        (workspace::Error::NotFound("p".into()).into(), 404, "not_found"),
        (workspace::Error::Exists("p".into()).into(), 409, "file_exists"),
        (workspace::Error::NotDir("p".into()).into(), 400, "invalid_path"),
        (
            workspace::Error::Io("p".into(), std::io::Error::from_raw_os_error(libc::ENOSPC)).into(),
            413,
            "upload_too_large",
        ),
        (
            workspace::Error::Io("p".into(), std::io::Error::from_raw_os_error(libc::EWOULDBLOCK)).into(),
            409,
            "file_busy",
        ),
        (workspace::Error::Io("p".into(), std::io::Error::other("/srv/x")).into(), 500, "internal"),
        (service::Error::InvalidRequest("x".into()), 400, "invalid_request"),
        (service::Error::UploadTooLarge { limit: 1 << 20 }, 413, "upload_too_large"),
        (service::Error::FileTooLarge { path: "p".into(), limit: 1 }, 413, "artifact_too_large"),
        (service::Error::ShuttingDown, 503, "unavailable"),
        (service::Error::RunNotFound { session: "s".into(), run_id: "r".into() }, 404, "run_not_found"),
        (service::Error::Internal { context: "c".into(), error: "/srv/x".into() }, 500, "internal"),
    ]
}

/// Every kind of service error reaches the client as its status and code, in the
/// envelope, through each kind of route (async, sync, streamed download).
#[tokio::test]
async fn every_service_error_is_its_status_and_code_in_the_envelope() {
    let memory = Arc::new(Memory::default());
    let app = unix(&memory);
    let routes = [
        (Method::GET, "/v1/sessions/s1"),
        (Method::DELETE, "/v1/sessions/s1"),
        (Method::GET, "/v1/sessions/s1/files"),
        (Method::GET, "/v1/sessions/s1/files/a.txt"),
        (Method::DELETE, "/v1/sessions/s1/run"),
        (Method::GET, "/v1/sessions/s1/runs"),
        (Method::GET, "/v1/sessions/s1/runs/0123456789abcdef0123456789abcdef"),
    ];
    for (method, uri) in &routes {
        for (error, status, code) in error_cases() {
            *memory.fail.lock().unwrap() = Some(error);
            let (got_status, got_code, message) = error_of(send(&app, empty(method.clone(), uri)).await).await;
            assert_eq!((got_status, got_code.as_str()), (status, code), "{method} {uri}: {message}");
            // A host failure never shows the host's details.
            assert!(!message.contains("/srv/x"), "{message}");
        }
    }
    assert_eq!(memory.calls(), error_cases().len() * routes.len());
}

/// A run that fails once started: JSON gets the envelope, an event stream an
/// `error` event carrying it.
#[tokio::test]
async fn a_run_that_fails_after_it_started_answers_the_envelope() {
    let memory = Arc::new(Memory { run_fails: true, ..Memory::default() });
    let app = unix(&memory);
    let (status, code, message) =
        error_of(send(&app, json_request(Method::POST, "/v1/runs", json!({"code": "1"}))).await).await;
    assert_eq!((status, code.as_str()), (500, "internal"));
    assert!(
        message.starts_with("starting the sandbox failed on the server") && !message.contains("/host/path"),
        "{message}"
    );

    let mut req = json_request(Method::POST, "/v1/runs", json!({"code": "1"}));
    req.headers_mut().insert(header::ACCEPT, "text/event-stream".parse().unwrap());
    let resp = send(&app, req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let text = String::from_utf8(body_of(resp).await).unwrap();
    let error =
        text.split("event: error\ndata: ").nth(1).and_then(|r| r.lines().next()).unwrap_or_else(|| panic!("{text}"));
    let error: Value = serde_json::from_str(error).unwrap();
    assert_eq!(error["error"]["code"], "internal", "{text}");
    assert!(!text.contains("event: result"), "{text}");
}

#[tokio::test]
async fn unknown_routes_are_404_and_other_methods_405_with_allow() {
    let memory = Arc::new(Memory::default());
    let app = unix(&memory);
    let (status, code, message) = error_of(send(&app, empty(Method::GET, "/v2/sessions")).await).await;
    assert_eq!((status, code.as_str()), (404, "not_found"));
    assert!(message.contains("GET /v2/sessions") && message.contains("/v1/openapi.json"), "{message}");

    let resp = send(&app, empty(Method::PATCH, "/v1/sessions")).await;
    let allow = resp.headers().get(header::ALLOW).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    let (status, code, message) = error_of(resp).await;
    assert_eq!((status, code.as_str()), (405, "method_not_allowed"));
    assert!(message.starts_with("PATCH is not a method of /v1/sessions"), "{message}");
    let mut allowed: Vec<&str> = allow.split(',').map(str::trim).collect();
    allowed.sort();
    assert_eq!(allowed, ["GET", "HEAD", "POST"], "{allow}");
    // A PUT on a session's file is an upload, on the session itself a wrong method.
    let (status, code, _) = error_of(send(&app, empty(Method::PUT, "/v1/sessions/s1")).await).await;
    assert_eq!((status, code.as_str()), (405, "method_not_allowed"));
    assert_eq!(memory.calls(), 0, "refused before the service");
}

/// A JSON route's body must say it is JSON; nothing reaches the service otherwise.
#[tokio::test]
async fn json_routes_without_the_json_type_are_415() {
    let memory = Arc::new(Memory::default());
    for app in [unix(&memory), http(&memory, &[])] {
        for (uri, ctype) in
            [("/v1/runs", Some("text/plain")), ("/v1/runs", None), ("/v1/sessions/s1/runs", Some("application/jsonp"))]
        {
            let mut req = request(Method::POST, uri);
            if let Some(t) = ctype {
                req = req.header(header::CONTENT_TYPE, t);
            }
            let resp = send(&app, req.body(Body::from(r#"{"code":"1"}"#)).unwrap()).await;
            let (status, code, message) = error_of(resp).await;
            assert_eq!((status, code.as_str()), (415, "unsupported_media_type"), "{uri} {ctype:?}");
            assert!(message.contains("Content-Type: application/json"), "{message}");
        }
        // The one JSON route whose fields are all optional takes no body and no type.
        let resp = send(&app, empty(Method::POST, "/v1/sessions")).await;
        assert_eq!(resp.status(), StatusCode::CREATED);
    }
    assert_eq!(memory.calls(), 2, "only the two session creations got through");
}

/// On HTTP, a Host the daemon does not serve or a foreign Origin is 403 before anything else.
#[tokio::test]
async fn http_refuses_foreign_hosts_and_origins_with_403() {
    let memory = Arc::new(Memory::default());
    let app = http(&memory, &[]);
    let with = |host: &str, origin: Option<&str>| {
        let mut req = Request::builder().method(Method::GET).uri("/v1/sessions").header(header::HOST, host);
        if let Some(o) = origin {
            req = req.header(header::ORIGIN, o);
        }
        req.body(Body::empty()).unwrap()
    };
    for (host, origin) in [
        ("evil.example", None),
        ("localhost:8182", None),
        ("localhost:8181", Some("http://evil.example")),
        ("localhost:8181", Some("null")),
    ] {
        let (status, code, message) = error_of(send(&app, with(host, origin)).await).await;
        assert_eq!((status, code.as_str()), (403, "forbidden"), "{host} {origin:?}");
        assert!(message.contains("localhost:8181"), "says what is served: {message}");
    }
    // Even the routes without auth, and routes that do not exist.
    for uri in ["/v1/health", "/nowhere"] {
        let req = Request::builder().uri(uri).header(header::HOST, "evil.example").body(Body::empty()).unwrap();
        assert_eq!(error_of(send(&app, req).await).await.1, "forbidden", "{uri}");
    }
    assert_eq!(memory.calls(), 0);
    let resp = send(&app, with("localhost:8181", Some("http://localhost:8181"))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    // The Unix socket has no browser rules: no Host needed.
    let req = Request::builder().uri("/v1/sessions").body(Body::empty()).unwrap();
    assert_eq!(send(&unix(&memory), req).await.status(), StatusCode::OK);
}

/// With tokens: HTTP needs one, the socket may go without; the service sees
/// each caller's identity (the token's hash, never the token).
#[tokio::test]
async fn tokens_decide_the_caller_the_service_sees() {
    let memory = Arc::new(Memory::default());
    let web = http(&memory, &[TOKEN]);
    let sock = router(state(memory.clone(), &[TOKEN]), Surface::unix(Duration::from_secs(5)));
    let bearer = |token: &str| {
        request(Method::GET, "/v1/sessions")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap()
    };
    for (app, req) in [
        (&web, empty(Method::GET, "/v1/sessions")),
        (&web, bearer("wrong")),
        (&sock, bearer("wrong")),
        (&web, request(Method::GET, "/v1/sessions").header(header::AUTHORIZATION, TOKEN).body(Body::empty()).unwrap()),
    ] {
        let (status, code, message) = error_of(send(app, req).await).await;
        assert_eq!((status, code.as_str()), (401, "unauthorized"));
        assert!(message.contains("Authorization: Bearer"), "{message}");
    }
    assert_eq!(memory.calls(), 0);
    // Health needs no token.
    assert_eq!(send(&web, empty(Method::GET, "/v1/health")).await.status(), StatusCode::OK);

    assert_eq!(send(&web, bearer(TOKEN)).await.status(), StatusCode::OK);
    assert_eq!(send(&sock, bearer(&format!(" {TOKEN} "))).await.status(), StatusCode::OK);
    assert_eq!(send(&sock, empty(Method::GET, "/v1/sessions")).await.status(), StatusCode::OK);
    let owners = memory.owners.lock().unwrap().clone();
    assert_eq!(owners, [Some(owner_id(TOKEN)), Some(owner_id(TOKEN)), None]);
    assert_ne!(owners[0].as_deref(), Some(crate::owner::legacy_id(TOKEN).as_str()));
    assert!(!owners[0].as_deref().unwrap().contains(TOKEN));

    // Without tokens configured, a bearer token is ignored: everyone is the one owner.
    let open = Arc::new(Memory::default());
    let app = http(&open, &[]);
    let req =
        request(Method::GET, "/v1/sessions").header(header::AUTHORIZATION, "Bearer x").body(Body::empty()).unwrap();
    assert_eq!(send(&app, req).await.status(), StatusCode::OK);
    assert_eq!(open.owners.lock().unwrap().clone(), [None]);
}

/// A session id is one path segment, percent-decoded once, and checked by the
/// session id rules; what is not an id is 400 `invalid_session_id`, quoted.
#[tokio::test]
async fn session_ids_are_one_decoded_segment_checked_by_the_id_rules() {
    let memory = Arc::new(Memory::default());
    let app = unix(&memory);
    let long = "a".repeat(65);
    for (uri, shown) in [
        ("/v1/sessions/a%20b".to_string(), "\"a b\""),
        ("/v1/sessions/a%2Fb".to_string(), "\"a/b\""),
        ("/v1/sessions/..".to_string(), "\"..\""),
        (format!("/v1/sessions/{long}"), long.as_str()),
        ("/v1/sessions/%C3%A9t%C3%A9".to_string(), "\"été\""),
    ] {
        let (status, code, message) = error_of(send(&app, empty(Method::GET, &uri)).await).await;
        assert_eq!((status, code.as_str()), (400, "invalid_session_id"), "{uri}");
        assert!(message.contains(shown) && message.contains("letters, digits"), "{uri}: {message}");
    }
    let body = json!({"id": "x y"});
    let (status, code, _) = error_of(send(&app, json_request(Method::POST, "/v1/sessions", body)).await).await;
    assert_eq!((status, code.as_str()), (400, "invalid_session_id"));
    assert!(memory.sessions.lock().unwrap().is_empty());
    let body = json!({"code": "1", "session_id": "a/b"});
    let (status, code, _) = error_of(send(&app, json_request(Method::POST, "/v1/runs", body)).await).await;
    assert_eq!((status, code.as_str()), (400, "invalid_session_id"));

    // A valid id that names no session.
    let (status, code, message) = error_of(send(&app, empty(Method::GET, "/v1/sessions/Ab_9-z")).await).await;
    assert_eq!((status, code.as_str()), (404, "session_not_found"));
    assert!(message.contains("\"Ab_9-z\""), "{message}");
}

/// Bodies are read and checked before the service is asked: empty, not JSON,
/// unknown fields, too large, contradicting the path.
#[tokio::test]
async fn bodies_are_checked_before_the_service_is_asked() {
    let memory = Arc::new(Memory::default());
    let app = unix(&memory);
    let raw = |uri: &str, body: Vec<u8>| {
        request(Method::POST, uri).header(header::CONTENT_TYPE, "application/json").body(Body::from(body)).unwrap()
    };
    let limit = Policy::default().code_bytes() * 6 + 64 * 1024;
    let too_large = format!("larger than {limit} bytes");
    let cases: Vec<(&str, Vec<u8>, u16, &str, &str)> = vec![
        ("/v1/runs", vec![], 400, "invalid_request", "request body is empty"),
        ("/v1/runs", b"{\"code\":".to_vec(), 400, "invalid_request", "invalid JSON body"),
        ("/v1/runs", b"[1]".to_vec(), 400, "invalid_request", "not a JSON object"),
        (
            "/v1/runs",
            br#"{"code":"1","langauge":"python"}"#.to_vec(),
            400,
            "invalid_request",
            "unknown field `langauge`",
        ),
        ("/v1/runs", br#"{"code":"1","language":"ruby"}"#.to_vec(), 400, "invalid_request", "unknown variant `ruby`"),
        ("/v1/runs", br#"{"timeout_s":1}"#.to_vec(), 400, "invalid_request", "missing field `code`"),
        ("/v1/runs", vec![b' '; limit + 1], 413, "code_too_large", &too_large),
        (
            "/v1/sessions/s1/runs",
            br#"{"code":"1","session_id":"s2"}"#.to_vec(),
            400,
            "invalid_request",
            "differs from the one in the path",
        ),
        ("/v1/sessions", b"{".to_vec(), 400, "invalid_request", "invalid JSON body"),
        ("/v1/sessions", br#"{"ttl":5}"#.to_vec(), 400, "invalid_request", "unknown field `ttl`"),
        ("/v1/sessions", br#"{"mode":"repl"}"#.to_vec(), 400, "invalid_request", "unknown variant `repl`"),
        ("/v1/sessions", vec![b' '; 64 * 1024 + 1], 400, "invalid_request", "larger than 64 KiB"),
    ];
    for (uri, body, status, code, says) in cases {
        let (got_status, got_code, message) = error_of(send(&app, raw(uri, body)).await).await;
        assert_eq!((got_status, got_code.as_str()), (status, code), "{uri}: {message}");
        assert!(message.contains(says), "{uri}: {message:?} should say {says:?}");
    }
    assert_eq!(memory.calls(), 0, "no refused body reached the service");
    // Whitespace is an empty session request: all defaults.
    let resp = send(&app, raw("/v1/sessions", b" \n ".to_vec())).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
}

/// A body that stalls is 408 `request_timeout`: a JSON body past its deadline, an
/// upload after its idle time (and nothing of it is kept).
#[tokio::test]
async fn a_stalled_body_is_408() {
    let memory = Arc::new(Memory::default());
    let app = router(state(memory.clone(), &[]), Surface::unix(Duration::from_millis(200)));
    let stalled = || {
        let first = futures_util::stream::once(async { Ok::<_, std::io::Error>(axum::body::Bytes::from_static(b"{")) });
        Body::from_stream(first.chain(futures_util::stream::pending()))
    };
    let req = request(Method::POST, "/v1/runs").header(header::CONTENT_TYPE, "application/json").body(stalled());
    let (status, code, message) = error_of(send(&app, req.unwrap()).await).await;
    assert_eq!((status, code.as_str()), (408, "request_timeout"));
    assert!(message.starts_with("the request body did not arrive whole within"), "{message}");
    assert_eq!(memory.calls(), 0);

    send(&app, empty(Method::POST, "/v1/sessions")).await;
    let req = request(Method::PUT, "/v1/sessions/s1/files/big.bin").body(stalled());
    let (status, code, message) = error_of(send(&app, req.unwrap()).await).await;
    assert_eq!((status, code.as_str()), (408, "request_timeout"));
    assert!(message.starts_with("the request body stalled"), "{message}");
    assert!(memory.files.lock().unwrap().is_empty());
}

/// Paths in file routes are checked at the edge, once decoded: leaving the
/// workspace is refused; a name that still looks encoded is that name.
#[tokio::test]
async fn file_paths_and_upload_options_are_checked() {
    let memory = Arc::new(Memory::default());
    let app = unix(&memory);
    for uri in [
        "/v1/sessions/s1/files/..%2Fetc%2Fpasswd",
        "/v1/sessions/s1/files/%2e%2e/x",
        "/v1/sessions/s1/files/a%00b",
        "/v1/sessions/s1/files/%2Fetc%2Fpasswd",
        "/v1/sessions/s1/files//etc/passwd",
        "/v1/sessions/s1/files/a/../../b",
    ] {
        for method in [Method::GET, Method::PUT, Method::DELETE] {
            let (status, code, message) = error_of(send(&app, empty(method.clone(), uri)).await).await;
            assert_eq!((status, code.as_str()), (400, "invalid_path"), "{method} {uri}: {message}");
        }
    }
    assert_eq!(memory.calls(), 0, "refused paths never reach the service");
    send(&app, empty(Method::POST, "/v1/sessions")).await;
    // Decoded exactly once, to bytes, and handed on as text (`names`).
    for (uri, path) in [("a%252e%252e/x", "a%2e%2e/x"), ("a%252Fb", "a%2Fb"), ("a%FFb%5C", "a\\xffb\\\\")] {
        let req = request(Method::PUT, &format!("/v1/sessions/s1/files/{uri}")).body(Body::from("x")).unwrap();
        let entry = json_of(send(&app, req).await).await;
        assert_eq!(entry["path"], path, "{uri}");
        let got = send(&app, empty(Method::GET, &format!("/v1/sessions/s1/files/{uri}"))).await;
        assert_eq!((got.status(), body_of(got).await), (StatusCode::OK, b"x".to_vec()), "{uri}");
    }
    memory.files.lock().unwrap().clear();
    let req = request(Method::PUT, "/v1/sessions/s1/files/a.txt?overwrite=yes").body(Body::from("x")).unwrap();
    let (status, code, message) = error_of(send(&app, req).await).await;
    assert_eq!((status, code.as_str()), (400, "invalid_request"));
    assert!(message.contains("overwrite=true or overwrite=false"), "{message}");
    assert!(memory.files.lock().unwrap().is_empty());
}

/// What each route answers, in shape: the API's documented JSON and headers.
#[tokio::test]
async fn answers_have_their_documented_shapes() {
    let memory = Arc::new(Memory::default());
    let app = unix(&memory);
    let resp = send(&app, json_request(Method::POST, "/v1/sessions", json!({"id": "work", "ttl_s": 60}))).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let info = json_of(resp).await;
    let mut keys: Vec<_> = info.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    assert_eq!(
        keys,
        ["busy", "created_at", "disk_bytes", "id", "last_used_at", "mode", "policy", "ttl_s", "uid"],
        "{info}"
    );
    assert_eq!(
        (info["id"].as_str(), info["mode"].as_str(), info["policy"].as_str()),
        (Some("work"), Some("script"), Some("default"))
    );
    let again = send(&app, json_request(Method::POST, "/v1/sessions", json!({"id": "work"}))).await;
    assert_eq!(error_of(again).await.1, "session_exists");

    let list = json_of(send(&app, empty(Method::GET, "/v1/sessions")).await).await;
    assert_eq!(list.as_array().map(|a| a.len()), Some(1), "{list}");
    assert_eq!(json_of(send(&app, empty(Method::GET, "/v1/sessions/work")).await).await["id"], "work");
    let policies = json_of(send(&app, empty(Method::GET, "/v1/policies")).await).await;
    assert_eq!(policies[0]["name"], "default", "{policies}");
    assert_eq!(policies[0]["code_kb"], 100, "{policies}");

    // Files: upload (201, an entry), list (with the partial header), download, delete.
    let req = request(Method::PUT, "/v1/sessions/work/files/data/x.csv").body(Body::from("a,b\n1,2\n")).unwrap();
    let resp = send(&app, req).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let entry = json_of(resp).await;
    assert_eq!(
        (entry["path"].as_str(), entry["size_bytes"].as_u64(), entry["mime_type"].as_str()),
        (Some("data/x.csv"), Some(8), Some("text/csv")),
        "{entry}"
    );
    assert!(entry["url"].as_str().unwrap().ends_with("/v1/sessions/work/files/data/x.csv"), "{entry}");
    let req = request(Method::PUT, "/v1/sessions/work/files/data/x.csv").body(Body::from("z")).unwrap();
    assert_eq!(error_of(send(&app, req).await).await.1, "file_exists");
    let req = request(Method::PUT, "/v1/sessions/work/files/data/x.csv?overwrite=1").body(Body::from("a,b\n")).unwrap();
    assert_eq!(send(&app, req).await.status(), StatusCode::CREATED);

    let resp = send(&app, empty(Method::GET, "/v1/sessions/work/files")).await;
    assert_eq!(resp.headers().get("sandboxd-listing-partial").unwrap(), "false");
    let files = json_of(resp).await;
    assert_eq!(files.as_array().map(|a| a.len()), Some(1), "{files}");
    assert_eq!(files[0]["size_bytes"], 4);

    let resp = send(&app, empty(Method::GET, "/v1/sessions/work/files/data/x.csv")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let h = resp.headers().clone();
    assert_eq!(h.get(header::CONTENT_TYPE).unwrap(), "text/csv");
    assert_eq!(h.get(header::CONTENT_LENGTH).unwrap(), "4");
    assert_eq!(h.get(header::CONTENT_DISPOSITION).unwrap(), "inline; filename=\"x.csv\"; filename*=UTF-8''x.csv");
    assert_eq!(h.get(header::X_CONTENT_TYPE_OPTIONS).unwrap(), "nosniff");
    assert_eq!(body_of(resp).await, b"a,b\n");

    let done = json_of(send(&app, empty(Method::DELETE, "/v1/sessions/work/files/data/x.csv")).await).await;
    assert_eq!(done, json!({"status": "deleted", "path": "data/x.csv"}));
    let (status, code, _) = error_of(send(&app, empty(Method::GET, "/v1/sessions/work/files/data/x.csv")).await).await;
    assert_eq!((status, code.as_str()), (404, "not_found"));

    assert_eq!(
        json_of(send(&app, empty(Method::DELETE, "/v1/sessions/work/run")).await).await,
        json!({"status": "idle"})
    );
    assert_eq!(
        json_of(send(&app, empty(Method::DELETE, "/v1/sessions/work")).await).await,
        json!({"status": "closed"})
    );
    assert_eq!(error_of(send(&app, empty(Method::GET, "/v1/sessions/work")).await).await.1, "session_not_found");
}

/// A run answers its result as JSON, or as `stdout`/`stderr` events then a `result` event.
#[tokio::test]
async fn runs_answer_json_or_an_event_stream() {
    let memory = Arc::new(Memory::default());
    let app = unix(&memory);
    let resp = send(&app, json_request(Method::POST, "/v1/runs", json!({"code": "print(1)"}))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let result = json_of(resp).await;
    for key in [
        "run_id",
        "session_id",
        "status",
        "exit_code",
        "signal",
        "stdout",
        "stderr",
        "stdout_truncated",
        "stderr_truncated",
        "duration_ms",
        "artifacts",
        "artifacts_truncated",
    ] {
        assert!(result.get(key).is_some(), "{key} missing: {result}");
    }
    assert!(result.get("result").is_none(), "script runs have no kernel fields: {result}");
    assert_eq!((result["status"].as_str(), result["stdout"].as_str()), (Some("ok"), Some("ran print(1)")));
    let session = result["session_id"].as_str().unwrap().to_string();

    // In that session, as events; `session_id` in the body may repeat the path's.
    let body = json!({"code": "2", "session_id": session});
    let mut req = json_request(Method::POST, &format!("/v1/sessions/{session}/runs"), body);
    req.headers_mut().insert(header::ACCEPT, "text/event-stream".parse().unwrap());
    let resp = send(&app, req).await;
    assert_eq!(resp.headers().get(header::CONTENT_TYPE).unwrap(), "text/event-stream");
    let text = String::from_utf8(body_of(resp).await).unwrap();
    let events: Vec<(&str, Value)> = text
        .split("\n\n")
        .filter_map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = e.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((name, serde_json::from_str(data).unwrap()))
        })
        .collect();
    let names: Vec<&str> = events.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["stdout", "stderr", "result"], "{text}");
    assert_eq!(events[0].1, json!({"text": "out\n"}));
    assert_eq!(events[2].1["session_id"], session.as_str());
    assert_eq!(events[2].1["stdout"], "ran 2");

    // Refused by the run's own checks (below the router): the policy's limits.
    let body = json!({"code": "x", "timeout_s": 0});
    assert_eq!(error_of(send(&app, json_request(Method::POST, "/v1/runs", body)).await).await.1, "invalid_request");
    let body = json!({"code": "1", "policy": "nope"});
    assert_eq!(error_of(send(&app, json_request(Method::POST, "/v1/runs", body)).await).await.1, "policy_not_found");
}

/// `GET /v1/check` answers the service's host check, behind the token check like
/// every `/v1` route but health.
#[tokio::test]
async fn check_answers_the_services_host_check() {
    let memory = Arc::new(Memory::default());
    let resp = send(&unix(&memory), empty(Method::GET, "/v1/check")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let failing = json!({"ok": false, "items": [
        {"name": "kernel", "status": "ok", "found": "6.12.0"},
        {"name": "loop devices", "status": "fail", "found": "no /dev/loop-control", "fix": "modprobe loop"},
    ]});
    assert_eq!(json_of(resp).await, failing);
    let web = http(&memory, &[TOKEN]);
    let (status, code, _) = error_of(send(&web, empty(Method::GET, "/v1/check")).await).await;
    assert_eq!((status, code.as_str()), (401, "unauthorized"));
    let bearer = format!("Bearer {TOKEN}");
    let req = request(Method::GET, "/v1/check").header(header::AUTHORIZATION, bearer).body(Body::empty()).unwrap();
    assert_eq!(json_of(send(&web, req).await).await, failing);
}

/// Health states what the service finds: `ok`, or `degraded` with the problems.
#[tokio::test]
async fn health_says_what_is_degraded() {
    let memory = Arc::new(Memory::default());
    let ok = json_of(send(&unix(&memory), empty(Method::GET, "/v1/health")).await).await;
    assert_eq!((ok["status"].as_str(), ok["problems"].as_array().map(Vec::len)), (Some("ok"), Some(0)), "{ok}");
    assert_eq!(
        (ok["version"].as_str(), ok["cgroup"].as_str(), ok["landlock_abi"].as_i64()),
        (Some("test"), Some("v2 (test)"), Some(6))
    );
    for key in ["rootfs_sha256", "sessions", "busy_sessions", "pool"] {
        assert!(ok.get(key).is_some(), "{key} missing: {ok}");
    }
    let problem = Problem { name: "rootfs".into(), found: "not mounted".into(), fix: "restart".into() };
    let sick = Arc::new(Memory { problems: vec![problem], ..Memory::default() });
    let resp = send(&unix(&sick), empty(Method::GET, "/v1/health")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let degraded = json_of(resp).await;
    assert_eq!(degraded["status"], "degraded");
    assert_eq!(degraded["problems"], json!([{"name": "rootfs", "found": "not mounted", "fix": "restart"}]));
}

/// `/mcp` is served on the Unix socket as on HTTP (`sandboxctl mcp` bridges to it).
#[tokio::test]
async fn mcp_answers_on_the_unix_socket() {
    let memory = Arc::new(Memory::default());
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
        "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    let req = request(Method::POST, "/mcp")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .body(Body::from(init.to_string()))
        .unwrap();
    let resp = send(&unix(&memory), req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers().contains_key("mcp-session-id"));
}
