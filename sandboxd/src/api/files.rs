//! Workspace file routes: list, upload, download, delete. Each reads its input
//! and calls [`crate::service`], whose file access goes through
//! [`crate::workspace`] (never following a link out of the workspace).

use super::error::ApiError;
use super::error::{Path, Query};
use super::{Caller, Shared};
use crate::model::error::Code;
use crate::model::files::{FileBytes, FileEntry};
use crate::model::session::StatusAnswer;
use crate::service;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::StreamExt;
use serde::Deserialize;
use std::os::unix::ffi::OsStrExt;

/// The listing's header that says whether it is the workspace's first part only.
pub const LISTING_PARTIAL: &str = "sandboxd-listing-partial";

#[derive(Deserialize, Default)]
pub struct UploadQuery {
    #[serde(default)]
    pub overwrite: Option<String>,
}

/// A file route's session id and path, read from the URL as it came (axum's own
/// extractors decode to UTF-8 strings, and a name need not be UTF-8): each
/// percent-decoded exactly once, the path to bytes, checked
/// ([`crate::workspace::validate`]: no `..`, `.` or empty parts, not absolute, no
/// NUL), and handed on in its text form ([`crate::names`]). A name that looks
/// percent-encoded (`%2e`) after that one decode is that name, nothing more.
pub struct FileRoute {
    pub id: String,
    pub path: String,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for FileRoute {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, ApiError> {
        // The route matched `/v1/sessions/{id}/files/{*path}` on this very path,
        // where a `/` that is not `%2F` separates parts.
        let raw = parts.uri.path();
        let split = raw.strip_prefix("/v1/sessions/").and_then(|rest| rest.split_once('/'));
        let Some((id, path)) = split.and_then(|(id, rest)| Some((id, rest.strip_prefix("files/")?))) else {
            return Err(ApiError::new(
                Code::InvalidRequest,
                format!("{raw:?} is not a file route's path: use /v1/sessions/ID/files/PATH"),
            ));
        };
        let id = String::from_utf8_lossy(&crate::names::from_url(id)).into_owned();
        Ok(FileRoute { id, path: checked_path(path)? })
    }
}

/// The text form of the path `encoded` (a file route's `{path}`, as the URL has
/// it): decoded once to bytes, and checked.
fn checked_path(encoded: &str) -> Result<String, ApiError> {
    let raw = crate::names::from_url(encoded);
    crate::workspace::validate(&raw).map_err(|e| ApiError::from(service::Error::from(e)))?;
    Ok(crate::names::text(&raw))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files", operation_id = "list_files", tag = "files",
    params(("id" = String, Path, description = "the session's id")),
    responses((status = 200, body = Vec<FileEntry>, description = "every regular file of the workspace, recursively, sorted by path (compared part by part); links, FIFOs, sockets and devices are never listed. A name that is not UTF-8 or holds a backslash is escaped in `path` (see `FileEntry`); `url` always reaches the file. At most 16 MiB of JSON (counted as encoded, so names of control bytes count sixfold), 200,000 entries read, 64 levels, 4 MiB of paths, paths of at most 4096 bytes. At most 8 listings are walked or sent at once in the daemon and 2 per token, each until its answer is read to the end: past that a listing waits up to 5 s, then gets 429 `max_listings` (the token's) or 503 `unavailable` (the daemon's)",
        headers(("sandboxd-listing-partial" = String, description = "`true` when the workspace holds more than one listing reports (see above): what is listed is its first part, by path (a directory with more names than the walk reads is cut where its reading stopped); else `false`. Decided before the first byte, like `Content-Length`")))))]
pub async fn list(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let listing = state.service.listing(&caller, &id).await?;
    let partial = if listing.partial { "true" } else { "false" };
    let length = listing.files.json_len();
    // Encoded a piece at a time as the connection takes it: a slow reader holds
    // the compact listing and one piece, never the whole JSON.
    let chunks = listing.files.into_chunks().map(|c| Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(c)));
    Ok((
        [
            (header::CONTENT_TYPE, "application/json".to_string()),
            (header::CONTENT_LENGTH, length.to_string()),
            (header::HeaderName::from_static(LISTING_PARTIAL), partial.to_string()),
        ],
        Body::from_stream(futures_util::stream::iter(chunks)),
    )
        .into_response())
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files/{path}", operation_id = "download_file", tag = "files",
    params(("id" = String, Path, description = "the session's id"), ("path" = String, Path, description = "a relative path in the workspace, `/` between its parts: the name's raw bytes percent-encoded, decoded exactly once (so `%252e` is a name holding `%2e`, and `%FF` the byte 0xff; a listing's `url` has it); no `.`, `..` or empty parts, no NUL, at most 4096 bytes")),
    description = "A browser's request for the file as a script, worker or style sheet (`Sec-Fetch-Dest`) is refused: 403 `forbidden`.",
    responses((status = 200, description = "the file's bytes, with the `Content-Type` its name implies",
        content((FileBytes = "*/*")),
        headers(("content-disposition" = String, description = "`inline; filename=\"...\"; filename*=UTF-8''...` (RFC 6266: an ASCII fallback, then the name percent-encoded)"),
            ("content-security-policy" = String, description = "`sandbox`: a page the session wrote runs in an origin of its own")))))]
pub async fn download(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    conn: Option<Extension<crate::serve::Connection>>,
    FileRoute { id, path }: FileRoute,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    if let Some(dest) = headers.get("sec-fetch-dest").and_then(|v| v.to_str().ok()).filter(|d| runs_as_code(d)) {
        // A page of the daemon's origin (the console) must not run or style itself
        // with a file a sandbox wrote: `CSP: sandbox` below does not apply to a
        // script or style sheet, only to a document.
        return Err(ApiError::new(
            Code::Forbidden,
            format!("a session's file is not served as a {dest} (Sec-Fetch-Dest): download it, or open it as a page"),
        ));
    }
    let opened = state.service.open_file(&caller, &id, &path).await?;
    let body = Body::from_stream(tokio_util::io::ReaderStream::with_capacity(
        tokio::fs::File::from_std(opened.file),
        256 * 1024,
    ));
    // The open file pins the workspace: the body holds its session until it is
    // sent or dropped, and the session's teardown cuts it (and its connection).
    let body = match opened.hold {
        Some(hold) => super::hold::held(body, hold.for_body(), conn.map(|Extension(c)| c)),
        None => body,
    };
    Ok((
        [
            (header::CONTENT_TYPE, opened.mime_type),
            (header::CONTENT_LENGTH, opened.size.to_string()),
            (header::CONTENT_DISPOSITION, content_disposition(opened.name.as_bytes())),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
            // A page the sandbox wrote, shown by a browser, runs in an origin of its
            // own: it cannot call the API as the daemon's origin.
            (header::CONTENT_SECURITY_POLICY, "sandbox".to_string()),
        ],
        body,
    )
        .into_response())
}

/// Whether a browser would run or apply what it fetches for this destination
/// (`Sec-Fetch-Dest`) as code of the page that asked: a script, a worker or a style
/// sheet.
fn runs_as_code(dest: &str) -> bool {
    matches!(
        dest,
        "script"
            | "worker"
            | "sharedworker"
            | "serviceworker"
            | "style"
            | "audioworklet"
            | "paintworklet"
            | "xslt"
            | "json"
    )
}

/// `Content-Disposition` for a file named `name` (bytes the sandbox chose: any
/// but `/` and NUL), per RFC 6266: `inline` (DESIGN §4), an ASCII `filename`
/// for old clients (each character that is not printable ASCII, and `"` and
/// `\\`, as `_`), and `filename*` with the name's UTF-8 percent-encoded (RFC 8187;
/// a name that is not UTF-8 is read lossily). Always a valid header value.
pub fn content_disposition(name: &[u8]) -> String {
    let text = String::from_utf8_lossy(name);
    let fallback: String =
        text.chars().map(|c| if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' { c } else { '_' }).collect();
    let mut encoded = String::new();
    for b in text.bytes() {
        // RFC 8187 attr-char: ALPHA / DIGIT / "!#$&+-.^_`|~"; everything else as %XX.
        if b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b) {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    format!("inline; filename=\"{fallback}\"; filename*=UTF-8''{encoded}")
}

#[utoipa::path(put, path = "/v1/sessions/{id}/files/{path}", operation_id = "upload_file", tag = "files",
    params(("id" = String, Path, description = "the session's id"), ("path" = String, Path, description = "a relative path in the workspace, `/` between its parts: the name's raw bytes percent-encoded, decoded exactly once (so `%252e` is a name holding `%2e`, and `%FF` the byte 0xff; a listing's `url` has it); no `.`, `..` or empty parts, no NUL, at most 4096 bytes; missing directories are made"),
        ("overwrite" = Option<String>, Query, description = "`true` (or `1`) replaces an existing file; default `false` (or `0`)")),
    request_body(content = FileBytes, content_type = "application/octet-stream", description = "the file's bytes, at most the policy's `upload_mb`"),
    responses((status = 201, body = FileEntry, description = "the file written")))]
pub async fn upload(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    // A bad path is refused inside, so that the body is read away first.
    route: Result<FileRoute, ApiError>,
    Query(q): Query<UploadQuery>,
    body: Body,
) -> Result<(StatusCode, Json<FileEntry>), ApiError> {
    let opened = async {
        let FileRoute { id, path } = route?;
        let overwrite = match q.overwrite.as_deref() {
            None | Some("false") | Some("0") => false,
            Some("true") | Some("1") => true,
            Some(other) => {
                return Err(ApiError::new(
                    Code::InvalidRequest,
                    format!("overwrite={other:?}: use overwrite=true or overwrite=false"),
                ))
            }
        };
        Ok((state.service.create_file(&caller, &id, &path, overwrite).await?, id))
    }
    .await;
    let (mut upload, id) = match opened {
        Ok(opened) => opened,
        Err(e) => {
            // Refused before its body was read (a bad path, no such session, a file
            // that may not be written): read the body away (bounded) so that the
            // client gets the answer and its keep-alive connection stays usable,
            // instead of a connection closed under its next request.
            drain(body.into_data_stream()).await;
            return Err(e);
        }
    };
    let mut stream = body.into_data_stream();
    // The session's teardown stops an upload at once, even one whose body stalled.
    let closed = upload.closed();
    let result: Result<(), ApiError> = async {
        loop {
            let next = match &closed {
                Some(cut) => tokio::select! {
                    next = stream.next() => next,
                    () = cut.cancelled() => {
                        return Err(ApiError::from(service::Error::from(crate::session::Error::NotFound(id.clone()))));
                    }
                },
                None => stream.next().await,
            };
            let Some(chunk) = next else { break };
            // A stalled upload is a 408 `request_timeout`; nothing of it is kept.
            let chunk = chunk.map_err(|e| {
                super::body_read_error(e, || ApiError::new(Code::UploadTooLarge, "the upload is too large"))
            })?;
            upload.write(&chunk)?;
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        // Leave nothing half-written behind.
        upload.abort();
        drain(stream).await;
        return Err(e);
    }
    Ok((StatusCode::CREATED, Json(upload.finish()?)))
}

/// Read and discard what is left of a refused upload (at most 64 MiB, for at most
/// 10 s), so that a client still sending its body reads the error instead of a
/// connection reset.
async fn drain(mut stream: axum::body::BodyDataStream) {
    const MAX: u64 = 64 << 20;
    let mut read = 0u64;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while let Some(Ok(chunk)) = stream.next().await {
            read += chunk.len() as u64;
            if read > MAX {
                break;
            }
        }
    })
    .await;
}

#[utoipa::path(delete, path = "/v1/sessions/{id}/files/{path}", operation_id = "delete_file", tag = "files",
    params(("id" = String, Path, description = "the session's id"), ("path" = String, Path, description = "a relative path in the workspace, `/` between its parts: the name's raw bytes percent-encoded, decoded exactly once (so `%252e` is a name holding `%2e`, and `%FF` the byte 0xff; a listing's `url` has it); no `.`, `..` or empty parts, no NUL, at most 4096 bytes")),
    responses((status = 200, body = StatusAnswer, description = "`{\"status\":\"deleted\",\"path\":...}`")))]
pub async fn remove(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    FileRoute { id, path }: FileRoute,
) -> Result<Json<StatusAnswer>, ApiError> {
    Ok(Json(state.service.delete_file(&caller, &id, &path).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_disposition_is_a_valid_header_for_any_name() {
        let cases: [(&[u8], &str); 6] = [
            (b"chart.png", "inline; filename=\"chart.png\"; filename*=UTF-8''chart.png"),
            (b"a b\"c\\d;e", "inline; filename=\"a b_c_d;e\"; filename*=UTF-8''a%20b%22c%5Cd%3Be"),
            (b"x\x1b[31m\ny\r", "inline; filename=\"x_[31m_y_\"; filename*=UTF-8''x%1B%5B31m%0Ay%0D"),
            (
                "r\u{e9}sum\u{e9} \u{1f600}.txt".as_bytes(),
                "inline; filename=\"r_sum_ _.txt\"; filename*=UTF-8''r%C3%A9sum%C3%A9%20%F0%9F%98%80.txt",
            ),
            (b"\xff\xfeok", "inline; filename=\"__ok\"; filename*=UTF-8''%EF%BF%BD%EF%BF%BDok"),
            (b"\x7f%", "inline; filename=\"_%\"; filename*=UTF-8''%7F%25"),
        ];
        for (name, want) in cases {
            let got = content_disposition(name);
            assert_eq!(got, want, "{name:?}");
            axum::http::HeaderValue::from_str(&got).unwrap();
        }
    }
}
