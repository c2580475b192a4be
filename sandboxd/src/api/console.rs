//! The web console: `GET /` on the HTTP listener, and its assets under
//! `/console/`. Three files written for it (`sandboxd/console/`: the page, its
//! script and its style sheet; no framework, nothing fetched from elsewhere),
//! embedded in the binary at build time. The page calls the v1 API itself, with the
//! token the person gives it, so it sees what that token sees and nothing more.
//!
//! Nothing a run made is trusted by the page: its output and file names go in as
//! text, figures as images (an SVG in an `<img>` runs no script), a kernel's HTML
//! in a frame sandboxed without scripts, and every answer here carries a
//! Content-Security-Policy that allows only this console.js (by its hash) and these
//! files' own style.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::sync::OnceLock;

const INDEX: &str = include_str!("../../console/index.html");
const SCRIPT: &str = include_str!("../../console/console.js");
const STYLE: &str = include_str!("../../console/console.css");

/// Where the page's own script is named in it: replaced by the script's hash.
const INTEGRITY_MARK: &str = "sha256-CONSOLE-JS";

/// The page's policy: it may run one script, this console.js (pinned by its hash,
/// so no other file of this origin runs as its script, a session's file
/// included), style itself from this origin only, reach nothing but the API on it,
/// show images from it and the blobs and `data:` URLs it made of figures, and be
/// framed by no one. `frame-src 'self'` is for the kernel's HTML results, shown in
/// `srcdoc` frames sandboxed without scripts.
fn policy() -> &'static str {
    static POLICY: OnceLock<String> = OnceLock::new();
    POLICY.get_or_init(|| {
        format!(
            "default-src 'none'; script-src '{}'; style-src 'self'; img-src 'self' blob: data:; connect-src 'self'; \
             frame-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            script_hash()
        )
    })
}

/// [`policy`] as a header value, made once. It is ASCII by construction; were it
/// ever not a valid value, the page would get `default-src 'none'` (nothing runs),
/// never no policy at all.
fn policy_header() -> HeaderValue {
    static VALUE: OnceLock<HeaderValue> = OnceLock::new();
    VALUE
        .get_or_init(|| HeaderValue::from_str(policy()).unwrap_or(HeaderValue::from_static("default-src 'none'")))
        .clone()
}

/// `sha256-<base64>` of console.js, as CSP and Subresource Integrity write it.
fn script_hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| {
        use base64::Engine;
        use sha2::Digest;
        format!("sha256-{}", base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(SCRIPT.as_bytes())))
    })
}

/// The page, its script tag carrying the script's hash (`integrity`).
fn index() -> &'static str {
    static PAGE: OnceLock<String> = OnceLock::new();
    PAGE.get_or_init(|| INDEX.replace(INTEGRITY_MARK, script_hash()))
}

/// The console's routes, for the HTTP listener's router.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { asset(index(), "text/html; charset=utf-8") }))
        .route("/console/console.js", get(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }))
        .route("/console/console.css", get(|| async { asset(STYLE, "text/css; charset=utf-8") }))
        // The chat is a view of the page.
        .route("/chat", get(|| async { axum::response::Redirect::to("/#/chat") }))
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut answer = body.into_response();
    let h = answer.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_SECURITY_POLICY, policy_header());
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
        assert!(INDEX
            .contains(&format!(r#"<script src="/console/console.js" integrity="{INTEGRITY_MARK}" defer></script>"#)));
        assert!(index().contains(&format!(r#"integrity="{}""#, script_hash())) && !index().contains(INTEGRITY_MARK));
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
        assert!(policy().contains(&format!("script-src '{}';", script_hash())));
        assert!(script_hash().starts_with("sha256-") && script_hash().len() == 7 + 44);
        assert!(!policy().contains("unsafe"));
        assert!(policy().contains("frame-ancestors 'none'"));
        assert!(policy().contains("connect-src 'self';"));
        assert_eq!(policy_header().to_str().ok(), Some(policy()));
    }
}
