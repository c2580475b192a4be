//! The API's error envelope: an HTTP status and
//! `{"error":{"code":"...","message":"..."}}`, the message saying what to do.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    InvalidRequest,
    InvalidSessionId,
    InvalidPath,
    PolicyNotFound,
    Unauthorized,
    /// A `Host` the daemon does not serve, or a foreign `Origin` (a browser page).
    Forbidden,
    SessionNotFound,
    NotFound,
    FileExists,
    /// A file the session's code holds a lease or lock on.
    FileBusy,
    SessionExists,
    SessionBusy,
    CodeTooLarge,
    UploadTooLarge,
    ArtifactTooLarge,
    /// A JSON route's body without `Content-Type: application/json`.
    UnsupportedMediaType,
    /// A request body that did not arrive in time.
    RequestTimeout,
    MaxSessions,
    /// The caller's token already has its most runs going at once.
    MaxRuns,
    Unavailable,
    Internal,
}

impl Code {
    pub fn status(self) -> StatusCode {
        use Code::*;
        match self {
            InvalidRequest | InvalidSessionId | InvalidPath | PolicyNotFound => StatusCode::BAD_REQUEST,
            Unauthorized => StatusCode::UNAUTHORIZED,
            Forbidden => StatusCode::FORBIDDEN,
            UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            SessionNotFound | NotFound => StatusCode::NOT_FOUND,
            FileExists | FileBusy | SessionExists | SessionBusy => StatusCode::CONFLICT,
            CodeTooLarge | UploadTooLarge | ArtifactTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            MaxSessions | MaxRuns => StatusCode::TOO_MANY_REQUESTS,
            Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn as_str(self) -> &'static str {
        use Code::*;
        match self {
            InvalidRequest => "invalid_request",
            InvalidSessionId => "invalid_session_id",
            InvalidPath => "invalid_path",
            PolicyNotFound => "policy_not_found",
            Unauthorized => "unauthorized",
            Forbidden => "forbidden",
            UnsupportedMediaType => "unsupported_media_type",
            RequestTimeout => "request_timeout",
            SessionNotFound => "session_not_found",
            NotFound => "not_found",
            FileExists => "file_exists",
            FileBusy => "file_busy",
            SessionExists => "session_exists",
            SessionBusy => "session_busy",
            CodeTooLarge => "code_too_large",
            UploadTooLarge => "upload_too_large",
            ArtifactTooLarge => "artifact_too_large",
            MaxSessions => "max_sessions",
            MaxRuns => "max_runs",
            Unavailable => "unavailable",
            Internal => "internal",
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct ApiError {
    pub code: Code,
    pub message: String,
}

impl ApiError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ApiError { code, message: message.into() }
    }

    /// An internal failure: logged in full, reported without host details.
    pub fn internal(context: &str, err: impl std::fmt::Display) -> Self {
        // The context may hold names sandboxed code chose: escaped, one line.
        tracing::error!(error = %err.to_string().escape_debug(), "{}", context.escape_debug());
        ApiError::new(
            Code::Internal,
            format!(
                "{context} failed on the server; the daemon log has the cause. Retry, and report it if it persists"
            ),
        )
    }

    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {"code": self.code.as_str(), "message": self.message}})
    }
}

/// The envelope as documented in the OpenAPI document.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    pub code: Code,
    pub message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.code.status(), axum::Json(self.body())).into_response()
    }
}
