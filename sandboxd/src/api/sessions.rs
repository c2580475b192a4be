//! Session routes: create, list, show, close; each reads its input and calls
//! [`crate::service`].

use super::error::ApiError;
use super::error::Path;
use super::{read_json, Caller, Shared};
use crate::model::error::Code;
use crate::model::policy::Policy;
use crate::model::session::{CreateSessionRequest, SessionInfo, StatusAnswer};
use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};

#[utoipa::path(post, path = "/v1/sessions", operation_id = "create_session", tag = "sessions",
    request_body(content = CreateSessionRequest, description = "every field is optional; an empty body (no `Content-Type` needed) makes a session with the defaults"),
    responses((status = 201, body = SessionInfo, description = "the new session")))]
pub async fn create(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Body,
) -> Result<(StatusCode, Json<SessionInfo>), ApiError> {
    let bytes = axum::body::to_bytes(body, 64 * 1024).await.map_err(|e| {
        super::body_read_error(e, || ApiError::new(Code::InvalidRequest, "request body is larger than 64 KiB"))
    })?;
    // An empty body is fine here: every field is optional.
    let req: CreateSessionRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        CreateSessionRequest::default()
    } else {
        read_json(axum::body::Body::from(bytes), 64 * 1024, Code::InvalidRequest).await?
    };
    let info = state.service.create_session(&caller, req).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

#[utoipa::path(get, path = "/v1/sessions", operation_id = "list_sessions", tag = "sessions",
    responses((status = 200, body = Vec<SessionInfo>, description = "the caller's sessions")))]
pub async fn list(State(state): State<Shared>, Extension(caller): Extension<Caller>) -> Json<Vec<SessionInfo>> {
    Json(state.service.list_sessions(&caller))
}

#[utoipa::path(get, path = "/v1/sessions/{id}", operation_id = "get_session", tag = "sessions",
    params(("id" = String, Path, description = "the session's id")),
    responses((status = 200, body = SessionInfo, description = "the session")))]
pub async fn show(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, ApiError> {
    Ok(Json(state.service.get_session(&caller, &id)?))
}

#[utoipa::path(delete, path = "/v1/sessions/{id}", operation_id = "close_session", tag = "sessions",
    params(("id" = String, Path, description = "the session's id")),
    responses((status = 200, body = StatusAnswer, description = "`{\"status\":\"closed\"}`: its run (if any) killed, its files removed")))]
pub async fn close(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<StatusAnswer>, ApiError> {
    Ok(Json(state.service.close_session(&caller, &id).await?))
}

#[utoipa::path(delete, path = "/v1/sessions/{id}/run", operation_id = "cancel_run", tag = "sessions",
    params(("id" = String, Path, description = "the session's id")),
    responses((status = 200, body = StatusAnswer, description = "`{\"status\":\"cancelled\"}`, or `{\"status\":\"idle\"}` when nothing was running")))]
/// Stop the run in flight in a session (it ends with status `killed`); the session stays.
pub async fn cancel_run(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<StatusAnswer>, ApiError> {
    Ok(Json(state.service.cancel_run(&caller, &id)?))
}

#[utoipa::path(get, path = "/v1/policies", operation_id = "list_policies", tag = "sessions",
    responses((status = 200, body = Vec<Policy>, description = "every policy, with its limits")))]
/// The policies sessions can use, with their limits.
pub async fn policies(State(state): State<Shared>) -> Json<Vec<Policy>> {
    Json(state.service.policies())
}
