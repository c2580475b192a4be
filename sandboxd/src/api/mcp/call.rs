//! One tool call's way to the daemon, through either backend, and how its
//! failures read to a model.

use super::Backend;
use crate::api::error::ApiError;
use crate::client::ClientError;
use crate::model::files::FileEntry;
use crate::model::policy::Policy;
use crate::model::run::{RunRequest, RunResult};
use crate::model::session::{CreateSessionRequest, SessionInfo, StatusAnswer as Done};
use crate::service::{self, Caller};
use crate::session;
use rmcp::model::{CallToolResult, ContentBlock};

/// Why a tool's operation failed, from either backend.
#[derive(Debug)]
pub(super) enum Failure {
    /// The API's error: its code and message.
    Api { code: String, message: String },
    /// A file larger than the caller reads (bytes).
    TooLarge(u64),
    /// The daemon could not be reached or answered nonsense (stdio only).
    Unavailable(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Api { code, message } => write!(f, "{message} ({code})"),
            Failure::TooLarge(limit) => write!(f, "the answer is larger than {limit} bytes"),
            Failure::Unavailable(m) => f.write_str(m),
        }
    }
}

impl From<service::Error> for Failure {
    fn from(e: service::Error) -> Self {
        match e {
            service::Error::FileTooLarge { limit, .. } => Failure::TooLarge(limit),
            e => {
                let e = ApiError::from(e);
                Failure::Api { code: e.code.as_str().to_string(), message: e.message }
            }
        }
    }
}

impl From<session::Error> for Failure {
    fn from(e: session::Error) -> Self {
        service::Error::from(e).into()
    }
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Api { code, message, .. } => Failure::Api { code, message },
            ClientError::TooLarge(limit) => Failure::TooLarge(limit as u64),
            other => Failure::Unavailable(other.to_string()),
        }
    }
}

pub(super) fn failure(e: Failure) -> CallToolResult {
    let text = match e {
        Failure::Api { code, message } => {
            let hint = match code.as_str() {
                "session_not_found" => " Next: call create_session, or omit session_id to start a new session.",
                "session_busy" => " Next: wait for that run to finish, or use another session.",
                "file_exists" => " Next: pass overwrite=true to replace it.",
                "invalid_path" => " Next: use a relative path such as data/input.csv.",
                "invalid_session_id" => " Next: pass a session_id exactly as create_session or a run returned it.",
                _ => "",
            };
            // One period after the message, which is quoted as is (an id like
            // `../x` stays what the caller sent).
            format!("error {code}: {}.{hint}", message.trim_end_matches('.'))
        }
        Failure::TooLarge(limit) => format!("error artifact_too_large: the file is larger than {limit} bytes"),
        Failure::Unavailable(m) => format!("error unavailable: {m}"),
    };
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// A `session_id` argument, checked before it is used anywhere: an id, or (for a
/// caller without a token) a session key; never a path or anything else.
pub(super) fn session_arg(id: &str) -> Result<&str, Failure> {
    session::key(id, None)?;
    Ok(id)
}

/// One tool call's way to the daemon: the backend, as the calling client.
pub(super) struct Call<'a> {
    pub(super) backend: &'a Backend,
    pub(super) caller: Caller,
}

impl Call<'_> {
    pub(super) async fn create_session(&self, req: CreateSessionRequest) -> Result<SessionInfo, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(s.create_session(&self.caller, req).await?),
            Backend::Remote(c) => Ok(c.create_session(&req).await?),
        }
    }

    pub(super) async fn get_session(&self, id: &str) -> Result<SessionInfo, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(s.get_session(&self.caller, id)?),
            Backend::Remote(c) => Ok(c.get_session(id).await?),
        }
    }

    pub(super) async fn list_sessions(&self) -> Result<Vec<SessionInfo>, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(s.list_sessions(&self.caller)),
            Backend::Remote(c) => Ok(c.list_sessions().await?),
        }
    }

    pub(super) async fn close_session(&self, id: &str) -> Result<Done, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(s.close_session(&self.caller, id).await?),
            Backend::Remote(c) => Ok(c.close_session(id).await?),
        }
    }

    pub(super) async fn cancel_run(&self, id: &str) -> Result<Done, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(s.cancel_run(&self.caller, id)?),
            Backend::Remote(c) => Ok(c.cancel_run(id).await?),
        }
    }

    pub(super) async fn run(&self, req: RunRequest) -> Result<RunResult, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(s.run(&self.caller, req).await?),
            Backend::Remote(c) => Ok(c.run(&req).await?),
        }
    }

    pub(super) async fn list_files(&self, id: &str) -> Result<Vec<FileEntry>, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(s.list_files(&self.caller, id).await?),
            Backend::Remote(c) => Ok(c.list_files(id).await?),
        }
    }

    /// A file's bytes, at most `limit` of them ([`Failure::TooLarge`] past it).
    pub(super) async fn read_file(&self, id: &str, path: &str, limit: u64) -> Result<Vec<u8>, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(s.read_file(&self.caller, id, path, limit).await?),
            Backend::Remote(c) => {
                Ok(c.read_file(id, path, usize::try_from(limit).unwrap_or(usize::MAX)).await?.to_vec())
            }
        }
    }

    pub(super) async fn upload(
        &self,
        id: &str,
        path: &str,
        overwrite: bool,
        data: Vec<u8>,
    ) -> Result<FileEntry, Failure> {
        match self.backend {
            Backend::Local(s) => {
                let (s, caller, id, path) = (s.clone(), self.caller.clone(), id.to_string(), path.to_string());
                let written = tokio::task::spawn_blocking(move || {
                    let mut upload = s.create_file(&caller, &id, &path, overwrite)?;
                    if let Err(e) = upload.write(&data) {
                        upload.abort();
                        return Err(e);
                    }
                    upload.finish()
                })
                .await
                .map_err(|e| Failure::Unavailable(format!("the upload failed: {e}")))?;
                Ok(written?)
            }
            Backend::Remote(c) => Ok(c.upload(id, path, overwrite, data).await?),
        }
    }

    /// The session policy's limit for inlining file content, in bytes.
    pub(super) async fn inline_limit(&self, id: &str) -> Result<u64, Failure> {
        let policy = self.get_session(id).await?.policy;
        let mb = match self.backend {
            Backend::Local(s) => s.policy(Some(&policy))?.mcp_inline_mb,
            Backend::Remote(c) => c
                .policies()
                .await?
                .into_iter()
                .find(|p| p.name == policy)
                .map(|p| p.mcp_inline_mb)
                .unwrap_or(crate::model::policy::Policy::default().mcp_inline_mb),
        };
        Ok(mb * 1024 * 1024)
    }

    /// The policy a session made with the defaults gets (the daemon's `default`),
    /// to check a call against before a session is made for it; None when the
    /// daemon does not say (then the daemon's own check is the only one).
    async fn new_session_policy(&self) -> Result<Option<Policy>, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(Some((*s.policy(None)?).clone())),
            Backend::Remote(c) => Ok(c.policies().await?.into_iter().find(|p| p.name == "default").map(|p| Policy {
                name: p.name,
                timeout_s: p.timeout_s,
                code_kb: p.code_kb,
                upload_mb: p.upload_mb,
                ..Policy::default()
            })),
        }
    }

    /// A session made for this call alone, once `check` has passed the call against
    /// the policy it will have: a call that would be refused makes nothing. The
    /// caller keeps it (and names it in its result) or [`Call::discard`]s it.
    pub(super) async fn new_session(
        &self,
        check: impl FnOnce(&Policy) -> Result<(), service::Error>,
    ) -> Result<SessionInfo, Failure> {
        if let Some(policy) = self.new_session_policy().await? {
            check(&policy)?;
        }
        self.create_session(CreateSessionRequest::default()).await
    }

    /// Close a session this call made, whose call failed: nothing of a refused
    /// call stays behind. (A close that fails leaves it to its TTL; it is logged.)
    pub(super) async fn discard(&self, made: &SessionInfo) {
        if let Err(e) = self.close_session(&made.id).await {
            tracing::warn!(session_id = %made.id, error = %e, "could not close the session made for a failed MCP call");
        }
    }
}
