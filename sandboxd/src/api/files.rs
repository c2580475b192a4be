//! Workspace file routes: list, upload, download, delete. All access goes through
//! [`crate::workspace`], which never follows a link out of the workspace.

use super::error::{ApiError, Code};
use super::{Caller, Shared};
use crate::artifacts;
use crate::workspace::{self, Workspace};
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::io::Write;

#[derive(Serialize, utoipa::ToSchema)]
pub struct FileEntry {
    pub path: String,
    pub size_bytes: u64,
    pub mime_type: String,
    pub modified_at: String,
    pub url: String,
}

/// The listing's header that says whether it is the workspace's first part only.
pub const LISTING_PARTIAL: &str = "sandboxd-listing-partial";

#[derive(Deserialize, Default)]
pub struct UploadQuery {
    #[serde(default)]
    pub overwrite: Option<String>,
}

impl From<workspace::Error> for ApiError {
    fn from(e: workspace::Error) -> Self {
        match e {
            workspace::Error::InvalidPath(m) => ApiError::new(Code::InvalidPath, m),
            workspace::Error::NotFound(p) => ApiError::new(
                Code::NotFound,
                format!("no file {p:?} in this session: list them with GET /v1/sessions/ID/files"),
            ),
            e @ workspace::Error::Exists(_) => ApiError::new(Code::FileExists, e.to_string()),
            e @ (workspace::Error::NotRegular(_)
            | workspace::Error::Link(_)
            | workspace::Error::NotDir(_)
            | workspace::Error::Denied(_)) => ApiError::new(Code::InvalidPath, e.to_string()),
            workspace::Error::Io(p, e)
                if e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT) =>
            {
                ApiError::new(
                    Code::UploadTooLarge,
                    format!("{p}: the session's workspace quota is full: delete files first"),
                )
            }
            // A lease or lock the sandbox's code holds on the file (F_SETLEASE makes
            // the daemon's non-blocking open fail): the file is busy, not broken.
            workspace::Error::Io(p, e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => ApiError::new(
                Code::FileBusy,
                format!("{p:?} is held by a lease or lock from the session's code: retry once the code lets go of it"),
            ),
            workspace::Error::Io(p, e) => ApiError::internal(&format!("file operation on {p:?}"), e),
        }
    }
}

/// Validate a path from the URL (axum has percent-decoded it once). What still
/// looks encoded after that was encoded twice: refused, never decoded again.
fn checked_path(raw: &str) -> Result<std::path::PathBuf, ApiError> {
    let lower = raw.to_ascii_lowercase();
    if ["%2e", "%2f", "%5c", "%00"].iter().any(|s| lower.contains(s)) {
        return Err(ApiError::new(
            Code::InvalidPath,
            format!("invalid path {raw:?}: it is percent-encoded twice; encode a path once"),
        ));
    }
    Ok(workspace::validate(raw)?)
}

fn open_workspace(
    state: &Shared,
    caller: &Caller,
    id: &str,
) -> Result<(Workspace, crate::session::SessionInfo), ApiError> {
    let info = state.sessions.get(id, caller.owner.as_deref())?;
    let ws = Workspace::open(&state.sessions.workspace_of(id, caller.owner.as_deref())?, info.uid)?;
    Ok((ws, info))
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
    let info = state.sessions.get(&id, caller.owner.as_deref())?;
    let root = state.sessions.workspace_of(&id, caller.owner.as_deref())?;
    let (files, walked) = tokio::task::spawn_blocking(move || Workspace::open(&root, info.uid)?.files())
        .await
        .map_err(|e| ApiError::internal("listing files", e))??;
    let base = &state.ctx.public_url;
    let partial = [(header::HeaderName::from_static(LISTING_PARTIAL), if walked.partial { "true" } else { "false" })];
    Ok((
        partial,
        Json(
            files
                .into_iter()
                .map(|(path, stat)| FileEntry {
                    url: format!("{base}/v1/sessions/{id}/files/{}", artifacts::url_path(&path)),
                    mime_type: artifacts::mime_type(&path),
                    size_bytes: stat.size,
                    modified_at: crate::session::rfc3339(stat.modified()),
                    path: path.to_string_lossy().into_owned(),
                })
                .collect(),
        ),
    ))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files/{path}", params(("id" = String, Path), ("path" = String, Path)),
    responses((status = 200, description = "the file's bytes"), (status = "4XX", body = super::error::ErrorBody)))]
pub async fn download(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, path)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let rel = checked_path(&path)?;
    let (ws, _) = open_workspace(&state, &caller, &id)?;
    let (file, meta) = ws.open_read(&rel)?;
    let name = rel.file_name().map(|n| n.to_string_lossy().replace(['"', '\\', '\r', '\n'], "_")).unwrap_or_default();
    let body =
        Body::from_stream(tokio_util::io::ReaderStream::with_capacity(tokio::fs::File::from_std(file), 256 * 1024));
    Ok((
        [
            (header::CONTENT_TYPE, artifacts::mime_type(&rel)),
            (header::CONTENT_LENGTH, meta.size.to_string()),
            (header::CONTENT_DISPOSITION, format!("inline; filename=\"{name}\"")),
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
    let rel = checked_path(&path)?;
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
    let (ws, info) = open_workspace(&state, &caller, &id)?;
    let limit = state.sessions.policy(Some(&info.policy))?.upload_bytes();
    let file = match ws.create(&rel, overwrite) {
        Ok(file) => file,
        Err(e) => {
            // Answer the refusal to a client still sending, not a reset connection.
            drain(body.into_data_stream()).await;
            return Err(e.into());
        }
    };
    let mut writer = std::io::BufWriter::with_capacity(256 * 1024, file);
    let mut written: u64 = 0;
    let mut stream = body.into_data_stream();
    let result: Result<(), ApiError> = async {
        while let Some(chunk) = stream.next().await {
            // A stalled upload is a 408 `request_timeout`; nothing of it is kept.
            let chunk = chunk.map_err(|e| {
                super::body_read_error(e, || ApiError::new(Code::UploadTooLarge, "the upload is too large"))
            })?;
            written += chunk.len() as u64;
            if written > limit {
                return Err(ApiError::new(
                    Code::UploadTooLarge,
                    format!(
                        "upload is larger than the policy's {} MiB limit: split it, or compress it",
                        limit / (1024 * 1024)
                    ),
                ));
            }
            writer.write_all(&chunk).map_err(|e| ApiError::from(workspace::Error::Io(rel.display().to_string(), e)))?;
        }
        writer.flush().map_err(|e| ApiError::from(workspace::Error::Io(rel.display().to_string(), e)))?;
        Ok(())
    }
    .await;
    if let Err(e) = result {
        drop(writer);
        // Leave nothing half-written behind.
        let _ = ws.remove(&rel);
        drain(stream).await;
        return Err(e);
    }
    let url = format!("{}/v1/sessions/{id}/files/{}", state.ctx.public_url, artifacts::url_path(&rel));
    Ok((
        StatusCode::CREATED,
        Json(FileEntry {
            path: rel.to_string_lossy().into_owned(),
            size_bytes: written,
            mime_type: artifacts::mime_type(&rel),
            modified_at: crate::session::rfc3339(std::time::SystemTime::now()),
            url,
        }),
    ))
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
) -> Result<Json<serde_json::Value>, ApiError> {
    let rel = checked_path(&path)?;
    let (ws, _) = open_workspace(&state, &caller, &id)?;
    ws.remove(&rel)?;
    Ok(Json(serde_json::json!({"status": "deleted", "path": rel.to_string_lossy()})))
}
