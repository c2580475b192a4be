//! One connection of a sandbox's to the proxy ([`Conn`]: what it knows, how it
//! logs and counts what it reached and what was refused) and the answer a
//! refused request gets ([`refusal`]). Both sides of a connection use it: the
//! listener that accepts it (`serve.rs`) and what forwards its requests
//! (`forward.rs`).

use super::bodies::Body;
use super::rules::{code, Refusal};
use super::usage::Usage;
use super::{Egress, Tenant};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body_util::{BodyExt, Full};
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Response, StatusCode};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// What one of the sandbox's connections knows.
pub(super) struct Conn {
    pub egress: Arc<Egress>,
    pub tenant: Arc<Tenant>,
    pub run_id: String,
    pub usage: Arc<Usage>,
    /// What a CONNECT leaves to do once the connection is handed over (the tunnel).
    pub after: Mutex<Option<oneshot::Sender<BoxFuture<'static, ()>>>>,
}

impl Conn {
    /// Log and count a refusal, and answer it.
    pub fn refuse(&self, host: &str, why: Refusal) -> Response<Body> {
        tracing::info!(
            session_id = %self.tenant.session,
            run_id = %self.run_id,
            host,
            code = why.code,
            reason = %why.message,
            "egress refused"
        );
        self.usage.refused(host, &why);
        crate::metrics::global().egress_refused(why.code);
        refusal(&why)
    }

    /// The run reached `host:port` (opened, or looked into).
    pub fn reached(&self, shown: &str, looked_into: bool) {
        tracing::info!(
            session_id = %self.tenant.session,
            run_id = %self.run_id,
            host = shown,
            intercepted = looked_into,
            "egress connection"
        );
        self.usage.reached(shown);
        crate::metrics::global().egress_connection();
    }
}

/// `line` as an HTTP reason phrase: visible ASCII only, at most 1024 bytes.
pub fn reason_text(line: &str) -> String {
    let mut text: String =
        line.chars().map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' }).take(1024).collect();
    if text.is_empty() {
        text.push_str("refused");
    }
    text
}

/// The answer to a refused request: its status, `code: message` as the status
/// line's reason (what a client shows of a failed CONNECT) and as the body.
pub fn refusal(why: &Refusal) -> Response<Body> {
    let status = match why.code {
        code::NAME_NOT_RESOLVED | code::CONNECT_FAILED | code::ANSWER_REFUSED => StatusCode::BAD_GATEWAY,
        code::TOO_MANY_CONNECTIONS => StatusCode::SERVICE_UNAVAILABLE,
        code::BAD_REQUEST => StatusCode::BAD_REQUEST,
        _ => StatusCode::FORBIDDEN,
    };
    let line = why.line();
    let body: Body = Full::new(Bytes::from(format!("{line}\n"))).map_err(|e| match e {}).boxed();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    if let Ok(v) = HeaderValue::from_str(why.code) {
        headers.insert(HeaderName::from_static("sandboxd-refused"), v);
    }
    if let Ok(reason) = hyper::ext::ReasonPhrase::try_from(reason_text(&line)) {
        response.extensions_mut().insert(reason);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_says_its_code_and_reason_in_its_status_line_and_body() {
        let why = Refusal::new(code::HOST_NOT_ALLOWED, "evil.example is not in allow_hosts of policy \"default\"");
        let r = refusal(&why);
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        let reason = r.extensions().get::<hyper::ext::ReasonPhrase>().unwrap();
        assert_eq!(reason.as_bytes(), b"host_not_allowed: evil.example is not in allow_hosts of policy \"default\"");
        assert_eq!(r.headers()["sandboxd-refused"], "host_not_allowed");
        let r = refusal(&Refusal::new(code::CONNECT_FAILED, "x"));
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(reason_text("a\u{1}b\u{e9}c\r\n"), "a?b?c??");
    }
}
