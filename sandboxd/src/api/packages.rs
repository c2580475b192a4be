//! `POST /v1/sessions/{id}/packages`: install packages into the session's package
//! layer ([`crate::packages`]); it reads its input and calls [`crate::service`].

use super::error::{ApiError, Path};
use super::{read_json, Caller, Shared};
use crate::model::error::Code;
use crate::model::packages::{InstallRequest, InstallResult};
use axum::extract::State;
use axum::{Extension, Json};

#[utoipa::path(post, path = "/v1/sessions/{id}/packages", operation_id = "install_packages", tag = "sessions",
    request_body = InstallRequest,
    params(("id" = String, Path, description = "the session's id")),
    description = "Install packages (wheels from the policy's index, through the egress proxy) into the session's package layer, where every later run of the session imports them: script runs, pooled runs and kernel cells (a running kernel sees them at its next cell). No other session sees them. The session is busy while it runs (409 `session_busy`); an install that fails, times out (the policy's `install_timeout_s`) or does not fit the layer (`packages_mb`) changes nothing and is 422 `package_install_failed`, its message the installer's own words.",
    responses((status = 200, body = InstallResult, description = "what was installed, and what was already there")))]
pub async fn install(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: axum::body::Body,
) -> Result<Json<InstallResult>, ApiError> {
    let req: InstallRequest = read_json(body, 64 * 1024, Code::InvalidRequest).await?;
    Ok(Json(state.service.install_packages(&caller, &id, req).await?))
}
