//! The API's error envelope: an HTTP status and
//! `{"error":{"code":"...","message":"..."}}`, the message saying what to do.

use crate::model::error::Code;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// The HTTP status each error code is answered with.
pub fn http_status(code: Code) -> StatusCode {
    use Code::*;
    match code {
        InvalidRequest | InvalidSessionId | InvalidPath | PolicyNotFound => StatusCode::BAD_REQUEST,
        Unauthorized => StatusCode::UNAUTHORIZED,
        Forbidden => StatusCode::FORBIDDEN,
        UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        RequestTimeout => StatusCode::REQUEST_TIMEOUT,
        SessionNotFound | RunNotFound | NotFound => StatusCode::NOT_FOUND,
        MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        FileExists | FileBusy | SessionExists | SessionBusy => StatusCode::CONFLICT,
        CodeTooLarge | UploadTooLarge | ArtifactTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        MaxSessions | MaxRuns | MaxListings | MaxConnections => StatusCode::TOO_MANY_REQUESTS,
        InsufficientStorage => StatusCode::INSUFFICIENT_STORAGE,
        PackageInstallFailed => StatusCode::UNPROCESSABLE_ENTITY,
        Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Internal => StatusCode::INTERNAL_SERVER_ERROR,
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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // Every error answer passes here: counted by code for `GET /metrics`.
        crate::metrics::global().api_error(self.code.as_str());
        (http_status(self.code), axum::Json(self.body())).into_response()
    }
}

/// `axum::extract::Path`, refused in the error envelope (axum's own refusal is
/// plain text): a segment that is not UTF-8 once percent-decoded.
pub struct Path<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for Path<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(e) => Err(ApiError::new(
                Code::InvalidRequest,
                format!("{}: percent-encode the URL's path from UTF-8", e.body_text()),
            )),
        }
    }
}

/// `axum::extract::Query`, refused in the error envelope.
pub struct Query<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for Query<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Query(v)),
            Err(e) => Err(ApiError::new(
                Code::InvalidRequest,
                format!("{}: see GET /v1/openapi.json for the route's query parameters", e.body_text()),
            )),
        }
    }
}

/// The one mapping from the service's errors to HTTP answers (status and code).
/// Internal failures are logged in full here and answered without host details.
impl From<crate::service::Error> for ApiError {
    fn from(e: crate::service::Error) -> Self {
        use crate::service::Error as S;
        match e {
            S::Session(e) => session_error(e),
            S::Run(e) => run_error(e),
            S::Workspace(e) => workspace_error(e),
            S::Packages(crate::packages::Error::Invalid(m)) => ApiError::new(Code::InvalidRequest, m),
            S::Packages(crate::packages::Error::Failed(m)) => ApiError::new(Code::PackageInstallFailed, m),
            S::Packages(crate::packages::Error::NoRoom(e)) => session_error(e),
            S::Packages(crate::packages::Error::Internal { context, error }) => ApiError::internal(&context, error),
            S::InvalidRequest(m) => ApiError::new(Code::InvalidRequest, m),
            e @ S::UploadTooLarge { .. } => ApiError::new(Code::UploadTooLarge, e.to_string()),
            e @ S::FileTooLarge { .. } => ApiError::new(Code::ArtifactTooLarge, e.to_string()),
            e @ S::ShuttingDown => ApiError::new(Code::Unavailable, e.to_string()),
            S::ListingsBusy(e @ crate::listing::Busy::Token(_)) => ApiError::new(Code::MaxListings, e.to_string()),
            S::ListingsBusy(e @ crate::listing::Busy::Daemon(_)) => ApiError::new(Code::Unavailable, e.to_string()),
            e @ S::RunNotFound { .. } => ApiError::new(Code::RunNotFound, e.to_string()),
            e @ S::ChatNotFound { .. } => ApiError::new(Code::NotFound, e.to_string()),
            S::Internal { context, error } => ApiError::internal(&context, error),
        }
    }
}

fn session_error(e: crate::session::Error) -> ApiError {
    use crate::session::Error as E;
    let code = match &e {
        E::InvalidId(_) => Code::InvalidSessionId,
        E::PolicyNotFound { .. } => Code::PolicyNotFound,
        E::NotFound(_) => Code::SessionNotFound,
        E::Exists(_) => Code::SessionExists,
        E::Busy(_) => Code::SessionBusy,
        E::InvalidTtl => Code::InvalidRequest,
        E::TokenMaxSessions { .. } | E::MaxSessions { .. } => Code::MaxSessions,
        E::TokenMaxRuns(_) => Code::MaxRuns,
        E::InsufficientStorage { .. } | E::LayerNoRoom { .. } => Code::InsufficientStorage,
        E::Workspace(io) if io.kind() == std::io::ErrorKind::StorageFull => {
            return ApiError::new(
                Code::InsufficientStorage,
                format!("the state directory's filesystem has no room to make this session's workspace ({io}): free disk space or close sessions you no longer need, then retry"),
            )
        }
        E::Workspace(io) => return ApiError::internal("making or mounting the session's workspace", io),
        E::InvalidSecret(_) => Code::InvalidRequest,
        E::SecretNotFound { .. } => Code::NotFound,
        E::Layer(io) if io.kind() == std::io::ErrorKind::StorageFull => {
            return ApiError::new(
                Code::InsufficientStorage,
                format!("the state directory's filesystem has no room to make this session's package layer ({io}): free disk space or close sessions you no longer need, then retry"),
            )
        }
        E::Layer(io) => return ApiError::internal("making the session's package layer", io),
    };
    ApiError::new(code, e.to_string())
}

fn run_error(e: crate::run::Error) -> ApiError {
    use crate::run::Error as E;
    match e {
        e @ E::CodeTooLarge { .. } => ApiError::new(Code::CodeTooLarge, e.to_string()),
        e @ (E::NulByte | E::Timeout { .. }) => ApiError::new(Code::InvalidRequest, e.to_string()),
        e @ E::Closed(_) => ApiError::new(Code::SessionNotFound, e.to_string()),
        E::Internal { context, error } => ApiError::internal(&context, error),
    }
}

fn workspace_error(e: crate::workspace::Error) -> ApiError {
    use crate::workspace::Error as E;
    match e {
        E::InvalidPath(m) => ApiError::new(Code::InvalidPath, m),
        E::NotFound(p) => ApiError::new(
            Code::NotFound,
            format!("no file {p:?} in this session: list them with GET /v1/sessions/ID/files"),
        ),
        e @ E::Exists(_) => ApiError::new(Code::FileExists, e.to_string()),
        e @ (E::NotRegular(_) | E::Link(_) | E::NotDir(_) | E::Denied(_)) => {
            ApiError::new(Code::InvalidPath, e.to_string())
        }
        E::Io(p, e) if e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT) => {
            ApiError::new(
                Code::UploadTooLarge,
                format!("{p}: the session's workspace quota is full: delete files first"),
            )
        }
        // A lease or lock the sandbox's code holds on the file (F_SETLEASE makes the
        // daemon's non-blocking open fail): the file is busy, not broken.
        E::Io(p, e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => ApiError::new(
            Code::FileBusy,
            format!("{p:?} is held by a lease or lock from the session's code: retry once the code lets go of it"),
        ),
        E::Io(p, e) => ApiError::internal(&format!("file operation on {p:?}"), e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::Error as S;
    use crate::{run, session, workspace};

    fn answer(e: S) -> (u16, &'static str) {
        let e = ApiError::from(e);
        (http_status(e.code).as_u16(), e.code.as_str())
    }

    /// serde reads every code by the name `as_str` gives it (a client parses the
    /// envelope with it); a name it does not know is no code.
    #[test]
    fn codes_read_back_by_their_names() {
        use Code::*;
        let all = [
            InvalidRequest,
            InvalidSessionId,
            InvalidPath,
            PolicyNotFound,
            Unauthorized,
            Forbidden,
            SessionNotFound,
            RunNotFound,
            NotFound,
            MethodNotAllowed,
            FileExists,
            FileBusy,
            SessionExists,
            SessionBusy,
            CodeTooLarge,
            UploadTooLarge,
            ArtifactTooLarge,
            UnsupportedMediaType,
            RequestTimeout,
            MaxSessions,
            MaxRuns,
            MaxListings,
            MaxConnections,
            InsufficientStorage,
            PackageInstallFailed,
            Unavailable,
            Internal,
        ];
        for code in all {
            assert_eq!(Code::parse(code.as_str()), Some(code));
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
        }
        assert_eq!(Code::parse("language_unavailable"), None);
    }

    /// The one mapping: each module's error becomes the HTTP answer the API has always given.
    #[test]
    fn service_errors_map_to_their_http_answers() {
        let cases: Vec<(S, (u16, &str))> = vec![
            (session::Error::InvalidId("a b".into()).into(), (400, "invalid_session_id")),
            (session::Error::PolicyNotFound { name: "x".into(), known: vec![] }.into(), (400, "policy_not_found")),
            (session::Error::NotFound("s".into()).into(), (404, "session_not_found")),
            (session::Error::Exists("s".into()).into(), (409, "session_exists")),
            (session::Error::Busy("s".into()).into(), (409, "session_busy")),
            (session::Error::InvalidTtl.into(), (400, "invalid_request")),
            (session::Error::TokenMaxSessions { max: 1, closing: 0 }.into(), (429, "max_sessions")),
            (session::Error::MaxSessions { max: 1, closing: 1 }.into(), (429, "max_sessions")),
            (session::Error::TokenMaxRuns(1).into(), (429, "max_runs")),
            (session::Error::Workspace(std::io::Error::other("x")).into(), (500, "internal")),
            (run::Error::CodeTooLarge { len: 2, policy: "p".into(), max: 1 }.into(), (413, "code_too_large")),
            (run::Error::NulByte.into(), (400, "invalid_request")),
            (run::Error::Timeout { given: 0.0, policy: "p".into(), max: 1 }.into(), (400, "invalid_request")),
            (run::Error::Internal { context: "c".into(), error: "e".into() }.into(), (500, "internal")),
            (run::Error::Closed("s".into()).into(), (404, "session_not_found")),
            (workspace::Error::InvalidPath("p".into()).into(), (400, "invalid_path")),
            (workspace::Error::NotFound("p".into()).into(), (404, "not_found")),
            (workspace::Error::Exists("p".into()).into(), (409, "file_exists")),
            (
                workspace::Error::Io("p".into(), std::io::Error::from_raw_os_error(libc::ENOSPC)).into(),
                (413, "upload_too_large"),
            ),
            (S::InvalidRequest("x".into()), (400, "invalid_request")),
            (S::UploadTooLarge { limit: 1 << 20 }, (413, "upload_too_large")),
            (S::FileTooLarge { path: "p".into(), limit: 1 }, (413, "artifact_too_large")),
            (S::ShuttingDown, (503, "unavailable")),
            (crate::listing::Busy::Token(2).into(), (429, "max_listings")),
            (crate::listing::Busy::Daemon(8).into(), (503, "unavailable")),
        ];
        for (e, want) in cases {
            let shown = e.to_string();
            assert_eq!(answer(e), want, "{shown}");
        }
        let internal = ApiError::from(S::Internal { context: "reading x".into(), error: "/secret/path".into() });
        assert!(!internal.message.contains("/secret/path"), "{}", internal.message);
        let id = ApiError::from(S::from(session::Error::InvalidId("S/files/x".into())));
        assert_eq!(id.message, "invalid session id \"S/files/x\": use 1 to 64 letters, digits, `-` or `_`");
    }
}
