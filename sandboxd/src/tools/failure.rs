//! Why a tool's operation failed, and how that reads to a model: the API's error
//! code and message (the one mapping of `api/error.rs`), then what to do next.

use crate::api::error::ApiError;
use crate::model::error::Code;
use crate::service;
use crate::session;

/// Why a tool's operation failed.
#[derive(Debug)]
pub(super) enum ToolError {
    /// The API's error: its code and message.
    Api(ApiError),
    /// A file larger than the tool reads (bytes).
    TooLarge(u64),
}

impl ToolError {
    pub(super) fn new(code: Code, message: impl Into<String>) -> ToolError {
        ToolError::Api(ApiError::new(code, message))
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToolError::Api(e) => write!(f, "{} ({})", e.message, e.code.as_str()),
            ToolError::TooLarge(limit) => write!(f, "the answer is larger than {limit} bytes"),
        }
    }
}

impl From<service::Error> for ToolError {
    fn from(e: service::Error) -> Self {
        match e {
            service::Error::FileTooLarge { limit, .. } => ToolError::TooLarge(limit),
            e => ToolError::Api(ApiError::from(e)),
        }
    }
}

impl From<session::Error> for ToolError {
    fn from(e: session::Error) -> Self {
        service::Error::from(e).into()
    }
}

/// What a model does next after an error with `code`, or "" when the message
/// says it all. Every code is named: a code added or renamed fails to compile
/// here until its hint is decided.
pub fn next_step(code: Code) -> &'static str {
    use Code::*;
    match code {
        SessionNotFound => " Next: call create_session, or omit session_id to start a new session.",
        SessionBusy => " Next: wait for that run to finish, or use another session.",
        FileExists => " Next: pass overwrite=true to replace it.",
        InvalidPath => " Next: use a relative path such as data/input.csv.",
        InvalidSessionId => " Next: pass a session_id exactly as create_session or a run returned it.",
        PackageInstallFailed => {
            " Next: read the installer's message above, fix the package names or version pins, and install again (a wheel must exist for the package)."
        }
        InvalidRequest | PolicyNotFound | Unauthorized | Forbidden | RunNotFound | NotFound | MethodNotAllowed
        | FileBusy | SessionExists | CodeTooLarge | UploadTooLarge | ArtifactTooLarge | UnsupportedMediaType
        | RequestTimeout | MaxSessions | MaxRuns | MaxListings | MaxConnections | InsufficientStorage | Unavailable
        | Internal => "",
    }
}

/// The text of a failed call: `error <code>: <message>. <next step>`.
pub(super) fn error_text(e: &ToolError) -> String {
    match e {
        // One period after the message, which is quoted as is (an id like `../x`
        // stays what the caller sent).
        ToolError::Api(e) => {
            format!("error {}: {}.{}", e.code.as_str(), e.message.trim_end_matches('.'), next_step(e.code))
        }
        ToolError::TooLarge(limit) => format!("error artifact_too_large: the file is larger than {limit} bytes"),
    }
}

/// A `session_id` argument, checked before it is used anywhere: an id, or (for a
/// caller without a token) a session key; never a path or anything else.
pub(super) fn session_arg(id: &str) -> Result<&str, ToolError> {
    session::key(id, None)?;
    Ok(id)
}
