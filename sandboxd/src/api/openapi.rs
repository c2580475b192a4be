//! `GET /v1/openapi.json`: generated from the handlers' annotations and the
//! request/response types, never written by hand.

use axum::Json;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sandboxd",
        description = "Run untrusted Python in native Linux sandboxes. Every POST takes a JSON body sent with `Content-Type: application/json` (else 415 `unsupported_media_type`). Over HTTP, a `Host` the daemon does not serve or a foreign `Origin` is refused with 403 `forbidden`. A body that stalls, or a JSON body slower than `body_timeout_s`, gets 408 `request_timeout`. With tokens, each token has its own session id space and quotas (429 `max_sessions`, `max_runs`)."
    ),
    paths(
        super::health,
        super::runs::create_run,
        super::runs::session_run,
        super::sessions::create,
        super::sessions::list,
        super::sessions::show,
        super::sessions::close,
        super::sessions::cancel_run,
        super::sessions::policies,
        super::files::list,
        super::files::download,
        super::files::upload,
        super::files::remove,
        crate::check::route,
    ),
    components(schemas(crate::health::Problem, super::error::Code, crate::run::Language, crate::session::Mode))
)]
pub struct ApiDoc;

pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
