//! A session's own secrets: `PUT`, `GET` and `DELETE /v1/sessions/{id}/secrets...`.
//! Write-only: a value goes in and no route answers it (see
//! [`crate::session::secrets`]); each handler reads its input and calls
//! [`crate::service`].

use super::error::{ApiError, Path};
use super::{read_json, Caller, Shared};
use crate::model::error::Code;
use crate::model::secrets::{SecretInfo, SecretRequest};
use crate::model::session::StatusAnswer;
use axum::extract::State;
use axum::{Extension, Json};

#[utoipa::path(put, path = "/v1/sessions/{id}/secrets/{name}", operation_id = "set_secret", tag = "sessions",
    request_body = SecretRequest,
    params(("id" = String, Path, description = "the session's id"), ("name" = String, Path, description = "the environment variable that holds the secret's placeholder in the session's sandboxes")),
    description = "Set (or replace) a secret of the session's own. Its sandboxes see a placeholder in the variable `name` (from their next run or cell on); the egress proxy puts the value in its place only in requests to `hosts` (which the policy must allow), and refuses a request carrying the placeholder anywhere else. The value is kept in the daemon's memory only: it is never answered by any route, written to disk or logged, and a restart forgets it.",
    responses((status = 200, body = SecretInfo, description = "the secret's name and hosts")))]
pub async fn set(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, name)): Path<(String, String)>,
    body: axum::body::Body,
) -> Result<Json<SecretInfo>, ApiError> {
    let req: SecretRequest = read_json(body, 64 * 1024, Code::InvalidRequest).await?;
    Ok(Json(state.service.set_secret(&caller, &id, &name, req)?))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/secrets", operation_id = "list_secrets", tag = "sessions",
    params(("id" = String, Path, description = "the session's id")),
    responses((status = 200, body = Vec<SecretInfo>, description = "the session's secrets, its policy's and its own: names and hosts, never a value")))]
pub async fn list(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Vec<SecretInfo>>, ApiError> {
    Ok(Json(state.service.list_secrets(&caller, &id)?))
}

#[utoipa::path(delete, path = "/v1/sessions/{id}/secrets/{name}", operation_id = "delete_secret", tag = "sessions",
    params(("id" = String, Path, description = "the session's id"), ("name" = String, Path, description = "the secret's name")),
    responses((status = 200, body = StatusAnswer, description = "`{\"status\":\"deleted\"}`; its policy's secrets stay")))]
pub async fn remove(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, name)): Path<(String, String)>,
) -> Result<Json<StatusAnswer>, ApiError> {
    Ok(Json(state.service.delete_secret(&caller, &id, &name)?))
}
