//! The error envelope as callers get it: `{"error":{"code":"...","message":"..."}}`
//! (the HTTP status each code is answered with is the API's: `api/error.rs`).

use serde::{Deserialize, Serialize};

/// An error's code, as the envelope names it (`as_str`; serde reads and writes the
/// same names). A client that reads a code this build does not know keeps its
/// text (`crate::client::ErrorCode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
    /// A run record the session does not have (never made, or no longer kept).
    RunNotFound,
    NotFound,
    /// A route that exists, asked with a method it does not take.
    MethodNotAllowed,
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
    /// The caller's token already has its most listings walked or sent at once.
    MaxListings,
    /// The caller's token already holds its most connections.
    MaxConnections,
    /// The state directory's filesystem cannot hold another session.
    InsufficientStorage,
    /// Installing packages failed; the message has the installer's own words.
    PackageInstallFailed,
    Unavailable,
    Internal,
}

impl Code {
    /// The code named `name`, if this build knows it.
    pub fn parse(name: &str) -> Option<Code> {
        serde_json::from_value(serde_json::Value::String(name.to_string())).ok()
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
            RunNotFound => "run_not_found",
            NotFound => "not_found",
            MethodNotAllowed => "method_not_allowed",
            FileExists => "file_exists",
            FileBusy => "file_busy",
            SessionExists => "session_exists",
            SessionBusy => "session_busy",
            CodeTooLarge => "code_too_large",
            UploadTooLarge => "upload_too_large",
            ArtifactTooLarge => "artifact_too_large",
            MaxSessions => "max_sessions",
            MaxRuns => "max_runs",
            MaxListings => "max_listings",
            MaxConnections => "max_connections",
            InsufficientStorage => "insufficient_storage",
            PackageInstallFailed => "package_install_failed",
            Unavailable => "unavailable",
            Internal => "internal",
        }
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
