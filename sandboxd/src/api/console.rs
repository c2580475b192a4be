//! The web console: `GET /` on the HTTP listener, and its assets under
//! `/console/`. Three files written for it (`sandboxd/console/`: the page, its
//! script and its style sheet; no framework, nothing fetched from elsewhere),
//! embedded in the binary at build time. The page calls the v1 API itself, with the
//! token the person gives it, so it sees what that token sees and nothing more.
//!
//! Nothing a run made is trusted by the page: its output and file names go in as
//! text, figures as images (an SVG in an `<img>` runs no script), a kernel's HTML
//! in a frame sandboxed without scripts, and every answer here carries a
//! Content-Security-Policy that allows only these files' own script and style.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("../../console/index.html");
const SCRIPT: &str = include_str!("../../console/console.js");
const STYLE: &str = include_str!("../../console/console.css");

/// The page may run and style itself from this origin only, reach nothing but the
/// API on it, show images from it and from the blobs it made of figures, and be
/// framed by no one. `frame-src 'self'` is for the kernel's HTML results, shown in
/// `srcdoc` frames sandboxed without scripts.
pub const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; \
connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The console's routes, for the HTTP listener's router.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { asset(INDEX, "text/html; charset=utf-8") }))
        .route("/console/console.js", get(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }))
        .route("/console/console.css", get(|| async { asset(STYLE, "text/css; charset=utf-8") }))
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut answer = body.into_response();
    let h = answer.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::HeaderName::from_static("cross-origin-opener-policy"), HeaderValue::from_static("same-origin"));
    // The daemon's own files: a new binary's are fetched again, never a stale mix.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_script_and_style() {
        assert!(INDEX.contains(r#"<script src="/console/console.js" defer></script>"#));
        assert!(INDEX.contains(r#"<link rel="stylesheet" href="/console/console.css">"#));
        // No inline script or style, no handler attributes, nothing from elsewhere:
        // the policy would block them, so none may be relied on.
        for banned in ["<script>", "<style", " style=", " onclick=", " onload=", "http://", "https://"] {
            assert!(!INDEX.contains(banned), "{banned}");
        }
        assert!(!SCRIPT.contains("innerHTML"), "output goes in as text, never as markup");
        assert!(!SCRIPT.contains("eval("));
    }

    #[test]
    fn the_policy_allows_no_inline_script_and_no_other_origin() {
        assert!(POLICY.contains("script-src 'self';"));
        assert!(!POLICY.contains("unsafe"));
        assert!(POLICY.contains("frame-ancestors 'none'"));
        assert!(POLICY.contains("connect-src 'self';"));
    }
}
