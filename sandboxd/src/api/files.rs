//! Workspace file routes: list, upload, download, delete. Each reads its input
//! and calls [`crate::service`], whose file access goes through
//! [`crate::workspace`] (never following a link out of the workspace).

use super::error::{ApiError, Code};
use super::{Caller, Shared};
pub use crate::service::FileEntry;
use crate::service::{self, Done};
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::StreamExt;
use serde::Deserialize;

/// The listing's header that says whether it is the workspace's first part only.
pub const LISTING_PARTIAL: &str = "sandboxd-listing-partial";

#[derive(Deserialize, Default)]
pub struct UploadQuery {
    #[serde(default)]
    pub overwrite: Option<String>,
}

/// Check a path from the URL (axum has percent-decoded it once). What still
/// looks encoded after that was encoded twice: refused, never decoded again.
fn checked_path(raw: &str) -> Result<&str, ApiError> {
    let lower = raw.to_ascii_lowercase();
    if ["%2e", "%2f", "%5c", "%00"].iter().any(|s| lower.contains(s)) {
        return Err(ApiError::new(
            Code::InvalidPath,
            format!("invalid path {raw:?}: it is percent-encoded twice; encode a path once"),
        ));
    }
    crate::workspace::validate(raw).map_err(|e| ApiError::from(service::Error::from(e)))?;
    Ok(raw)
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files", params(("id" = String, Path)),
    responses((status = 200, body = Vec<FileEntry>,
        headers(("sandboxd-listing-partial" = String, description = "present when the workspace holds more than one listing reports (200,000 entries, 4 MiB of paths, 64 levels): what is listed is the first part, by path"))),
        (status = "4XX", body = super::error::ErrorBody)))]
pub async fn list(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<([(header::HeaderName, &'static str); 1], Json<Vec<FileEntry>>), ApiError> {
    let listing = state.service.listing(&caller, &id).await?;
    let partial = if listing.partial { "true" } else { "false" };
    Ok(([(header::HeaderName::from_static(LISTING_PARTIAL), partial)], Json(listing.files)))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files/{path}", params(("id" = String, Path), ("path" = String, Path)),
    responses((status = 200, description = "the file's bytes"), (status = "4XX", body = super::error::ErrorBody)))]
pub async fn download(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, path)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let opened = state.service.open_file(&caller, &id, checked_path(&path)?)?;
    let body = Body::from_stream(tokio_util::io::ReaderStream::with_capacity(
        tokio::fs::File::from_std(opened.file),
        256 * 1024,
    ));
    Ok((
        [
            (header::CONTENT_TYPE, opened.mime_type),
            (header::CONTENT_LENGTH, opened.size.to_string()),
            (header::CONTENT_DISPOSITION, format!("inline; filename=\"{}\"", opened.name)),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
        ],
        body,
    )
        .into_response())
}

#[utoipa::path(put, path = "/v1/sessions/{id}/files/{path}", params(("id" = String, Path), ("path" = String, Path), ("overwrite" = Option<bool>, Query)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = FileEntry), (status = "4XX", body = super::error::ErrorBody)))]
pub async fn upload(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, path)): Path<(String, String)>,
    Query(q): Query<UploadQuery>,
    body: Body,
) -> Result<(StatusCode, Json<FileEntry>), ApiError> {
    let opened = (|| {
        let path = checked_path(&path)?;
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
        Ok(state.service.create_file(&caller, &id, path, overwrite)?)
    })();
    let mut upload = match opened {
        Ok(upload) => upload,
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
    let result: Result<(), ApiError> = async {
        while let Some(chunk) = stream.next().await {
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

#[utoipa::path(delete, path = "/v1/sessions/{id}/files/{path}", params(("id" = String, Path), ("path" = String, Path)),
    responses((status = 200, description = "{\"status\":\"deleted\"}"), (status = "4XX", body = super::error::ErrorBody)))]
pub async fn remove(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, path)): Path<(String, String)>,
) -> Result<Json<Done>, ApiError> {
    Ok(Json(state.service.delete_file(&caller, &id, checked_path(&path)?)?))
}
