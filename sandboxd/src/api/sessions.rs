//! Session routes: create, list, show, close.

use super::error::{ApiError, Code};
use super::{read_json, Caller, Shared};
use crate::session::{Mode, SessionInfo};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// Caller-chosen id (`^[A-Za-z0-9_-]{1,64}$`); made up when absent.
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub policy: Option<String>,
    #[serde(default)]
    pub mode: Option<Mode>,
    /// Idle time before the session is closed, seconds.
    #[serde(default)]
    pub ttl_s: Option<u64>,
}

#[utoipa::path(post, path = "/v1/sessions", request_body = CreateSession,
    responses((status = 201, body = SessionInfo), (status = "4XX", body = super::error::ErrorBody)))]
pub async fn create(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Body,
) -> Result<(StatusCode, Json<SessionInfo>), ApiError> {
    let bytes = axum::body::to_bytes(body, 64 * 1024).await.map_err(|e| {
        super::body_read_error(e, || ApiError::new(Code::InvalidRequest, "request body is larger than 64 KiB"))
    })?;
    // An empty body is fine here: every field is optional.
    let req: CreateSession = if bytes.iter().all(u8::is_ascii_whitespace) {
        CreateSession::default()
    } else {
        read_json(axum::body::Body::from(bytes), 64 * 1024, Code::InvalidRequest).await?
    };
    let info = state
        .sessions
        .create(req.id, req.policy.as_deref(), req.mode.unwrap_or_default(), req.ttl_s, caller.owner.as_deref())
        .await?;
    Ok((StatusCode::CREATED, Json(info)))
}

#[utoipa::path(get, path = "/v1/sessions", responses((status = 200, body = Vec<SessionInfo>)))]
pub async fn list(State(state): State<Shared>, Extension(caller): Extension<Caller>) -> Json<Vec<SessionInfo>> {
    Json(state.sessions.list(caller.owner.as_deref()))
}

#[utoipa::path(get, path = "/v1/sessions/{id}", params(("id" = String, Path)),
    responses((status = 200, body = SessionInfo), (status = "4XX", body = super::error::ErrorBody)))]
pub async fn show(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, ApiError> {
    Ok(Json(state.sessions.get(&id, caller.owner.as_deref())?))
}

#[utoipa::path(delete, path = "/v1/sessions/{id}", params(("id" = String, Path)),
    responses((status = 200, description = "{\"status\":\"closed\"}"), (status = "4XX", body = super::error::ErrorBody)))]
pub async fn close(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    state.sessions.close(&id, caller.owner.as_deref()).await?;
    Ok(Json(serde_json::json!({"status": "closed"})))
}

#[utoipa::path(delete, path = "/v1/sessions/{id}/run", params(("id" = String, Path)),
    responses((status = 200, description = "{\"status\":\"cancelled\"} or {\"status\":\"idle\"}"), (status = "4XX", body = super::error::ErrorBody)))]
/// Stop the run in flight in a session (it ends with status `killed`); the session stays.
pub async fn cancel_run(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let cancelled = state.sessions.cancel_run(&id, caller.owner.as_deref())?;
    Ok(Json(serde_json::json!({"status": if cancelled { "cancelled" } else { "idle" }})))
}

#[utoipa::path(get, path = "/v1/policies", responses((status = 200, body = Vec<crate::policy::Policy>)))]
/// The policies sessions can use, with their limits.
pub async fn policies(State(state): State<Shared>) -> Json<Vec<crate::policy::Policy>> {
    Json(state.sessions.policies().map(|p| (**p).clone()).collect())
}
