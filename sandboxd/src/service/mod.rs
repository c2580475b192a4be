//! The daemon's operations, typed: what the HTTP handlers ([`crate::api`]) and the
//! MCP tools ([`crate::api::mcp`]) call in-process, and what [`crate::client`]
//! calls over the API, with the same request and answer structs ([`crate::model`]).
//!
//! Each operation takes a [`Caller`] (whose token, if any) and typed input, and
//! returns a typed answer or an [`Error`]. Nothing here knows HTTP: the API edge
//! maps an [`Error`] to its status and error code in one place
//! (`impl From<service::Error> for ApiError`, in `api/error.rs`).
//!
//! Here: the seam ([`Operations`], [`FileUpload`]), its types and [`Service`];
//! `ops.rs` implements every operation on [`Service`], once; `files.rs` and
//! `records.rs` hold what the file and the run-record operations share.

#[cfg(test)]
pub(crate) mod fake;
mod files;
mod ops;
mod records;

pub use files::Upload;

use crate::isolate::output::Chunk;
use crate::listing::{self, Listing};
use crate::model::chat::{Chat, ChatList};
use crate::model::check::Report;
use crate::model::files::FileEntry;
use crate::model::health::{PoolStats, Problem};
use crate::model::packages::{InstallRequest, InstallResult};
use crate::model::policy::Policy;
use crate::model::records::{RunPage, RunRecord};
use crate::model::run::{RunRequest, RunResult};
use crate::model::secrets::{SecretInfo, SecretRequest};
use crate::model::session::{CreateSessionRequest, SessionInfo, StatusAnswer};
use crate::run::{self, Context};
use crate::session::{self, Manager};
use crate::workspace;
use futures_util::future::BoxFuture;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Who is calling: `owner` is the caller's token identity; None sees everything
/// (no tokens configured, or a Unix-socket caller without a token).
#[derive(Debug, Clone)]
pub struct Caller {
    pub owner: Option<String>,
}

impl Caller {
    fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }
}

/// Why an operation was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Session(#[from] session::Error),
    #[error(transparent)]
    Run(#[from] run::Error),
    #[error(transparent)]
    Workspace(#[from] workspace::Error),
    #[error(transparent)]
    Packages(#[from] crate::packages::Error),
    /// A request that contradicts itself or its session; the text says how.
    #[error("{0}")]
    InvalidRequest(String),
    #[error("upload is larger than the policy's {} MiB limit: split it, or compress it", limit / (1024 * 1024))]
    UploadTooLarge { limit: u64 },
    /// A file read whole (MCP's `read_file`) that is larger than the caller takes.
    #[error("{path} is more than the {limit} bytes that can be read at once")]
    FileTooLarge { path: String, limit: u64 },
    #[error("the daemon is shutting down: retry in a moment")]
    ShuttingDown,
    /// Too many listings walked or sent at once ([`crate::listing::Slots`]).
    #[error(transparent)]
    ListingsBusy(#[from] listing::Busy),
    /// A run record the session does not have (never made, or pruned: a session
    /// keeps its newest runs only).
    /// A conversation the session does not have (never made, or no longer kept).
    #[error("session {session:?} has no conversation {chat_id:?}: list its conversations with GET /v1/sessions/{session}/chats (a session keeps its newest {})", crate::conversations::MAX_CHATS)]
    ChatNotFound { session: String, chat_id: String },
    #[error("session {session:?} has no run {run_id:?}: list its runs with GET /v1/sessions/{session}/runs (a session keeps its newest {} runs)", crate::records::MAX_RECORDS)]
    RunNotFound { session: String, run_id: String },
    /// A host failure; `context` names the step (the cause is logged, not shown).
    #[error("{context}: {error}")]
    Internal { context: String, error: String },
}

impl Error {
    fn internal(context: &str, error: impl std::fmt::Display) -> Error {
        Error::Internal { context: context.to_string(), error: error.to_string() }
    }
}

/// A workspace file opened for reading.
pub struct OpenFile {
    pub file: std::fs::File,
    pub size: u64,
    pub mime_type: String,
    /// The file's name (its last component), as the workspace holds it.
    pub name: std::ffi::OsString,
    /// Holds the session up while the file is read: the open file pins its
    /// workspace's mount. A streamed answer keeps it as long as it is sent
    /// ([`session::Use::for_body`]).
    pub hold: Option<session::Use>,
}

/// Where a started run's result arrives.
pub type RunDone = oneshot::Receiver<Result<RunResult, Error>>;

/// What `GET /v1/health` reports from below the API.
#[derive(Debug, Clone, Default)]
pub struct Condition {
    /// What is degraded now (empty: nothing), see [`crate::health`].
    pub problems: Vec<Problem>,
    /// The cgroup setup, described.
    pub cgroup: String,
    pub sessions: usize,
    pub busy_sessions: usize,
    pub pool: PoolStats,
    pub storage: crate::model::health::StorageStats,
}

/// What the API (its handlers, and the MCP tools in the daemon) needs from below:
/// the daemon's operations, as one object-safe trait, held as `Arc<dyn Operations>`
/// in [`crate::api::AppState`]. [`Service`] is the real one (sessions, sandboxes,
/// the pool); the router's unit tests put a small in-memory one in its place, so
/// the router is tested without root or a kernel. Async operations return a boxed
/// future (a trait object cannot have `async fn`s); handlers just `.await` them.
pub trait Operations: Send + Sync + 'static {
    /// A policy by name (`None`: the default one).
    fn policy(&self, name: Option<&str>) -> Result<Arc<Policy>, Error>;
    /// Every policy loaded.
    fn policies(&self) -> Vec<Policy>;
    /// The largest code any policy allows, in bytes.
    fn max_code_bytes(&self) -> Option<usize>;
    fn create_session<'a>(
        &'a self,
        caller: &'a Caller,
        req: CreateSessionRequest,
    ) -> BoxFuture<'a, Result<SessionInfo, Error>>;
    fn get_session(&self, caller: &Caller, id: &str) -> Result<SessionInfo, Error>;
    fn list_sessions(&self, caller: &Caller) -> Vec<SessionInfo>;
    /// Close a session: kill its run, if any, and remove its files.
    fn close_session<'a>(&'a self, caller: &'a Caller, id: &'a str) -> BoxFuture<'a, Result<StatusAnswer, Error>>;
    /// Stop the run in flight in a session (it ends with status `killed`).
    fn cancel_run(&self, caller: &Caller, id: &str) -> Result<StatusAnswer, Error>;
    /// Start `req` in its session (`req.session_id`), or in a new one made for it.
    /// The run goes on in a task of its own, so a caller that goes away cannot
    /// abort it halfway; its output goes to `chunks` as it comes, and the result
    /// to the returned receiver.
    fn start_run<'a>(
        &'a self,
        caller: &'a Caller,
        req: RunRequest,
        chunks: Option<mpsc::Sender<Chunk>>,
    ) -> BoxFuture<'a, Result<RunDone, Error>>;
    /// The workspace's files in path order, and whether that is only their first
    /// part ([`crate::listing`]: at most [`listing::MAX_JSON`] of JSON, and the
    /// walk's bounds), once a place among the listings in flight is free.
    /// A path (here and below) is in its text form ([`crate::names`]).
    fn listing<'a>(&'a self, caller: &'a Caller, id: &'a str) -> BoxFuture<'a, Result<Listing, Error>>;
    /// Open a workspace file to stream it.
    fn open_file<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<OpenFile, Error>>;
    /// Start writing a workspace file, within the policy's upload limit; feed it
    /// with [`FileUpload::write`].
    fn create_file<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        path: &'a str,
        overwrite: bool,
    ) -> BoxFuture<'a, Result<Box<dyn FileUpload>, Error>>;
    fn delete_file<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<StatusAnswer, Error>>;
    /// What is degraded now (the problems [`crate::health`] finds), and the
    /// counters `GET /v1/health` shows.
    fn condition(&self) -> BoxFuture<'_, Condition>;
    /// The host check, as the daemon finds the host now (`GET /v1/check`).
    fn check_host(&self) -> BoxFuture<'_, Report>;
    /// Up to `limit` of the session's run records, newest first, older than run
    /// `before` when given ([`crate::records`]).
    fn list_runs<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        before: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<RunPage, Error>>;
    /// One run record of the session.
    fn get_run<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<RunRecord, Error>>;
    /// The session's conversations, used most recently first ([`crate::conversations`]).
    fn list_chats<'a>(&'a self, caller: &'a Caller, id: &'a str) -> BoxFuture<'a, Result<ChatList, Error>>;
    /// One conversation of the session.
    fn get_chat<'a>(&'a self, caller: &'a Caller, id: &'a str, chat_id: &'a str) -> BoxFuture<'a, Result<Chat, Error>>;
    /// Keep `chat` as it is now, in session `id` (its `session_id` is set to the
    /// session's own id): a conversation too full for it is
    /// [`Error::InvalidRequest`], saying so.
    fn save_chat<'a>(&'a self, caller: &'a Caller, id: &'a str, chat: &'a Chat) -> BoxFuture<'a, Result<(), Error>>;

    /// Install `req.packages` into the session's package layer (as the session's
    /// run: one at a time, `session_busy` while it runs).
    fn install_packages<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        req: InstallRequest,
    ) -> BoxFuture<'a, Result<InstallResult, Error>>;
    /// Set the session's own secret `name` (write-only: no route answers its value).
    fn set_secret(&self, caller: &Caller, id: &str, name: &str, req: SecretRequest) -> Result<SecretInfo, Error>;
    /// The session's secrets (its policy's and its own): names and hosts.
    fn list_secrets(&self, caller: &Caller, id: &str) -> Result<Vec<SecretInfo>, Error>;
    /// Forget the session's own secret `name`.
    fn delete_secret(&self, caller: &Caller, id: &str, name: &str) -> Result<StatusAnswer, Error>;

    /// What `GET /metrics` reads at a scrape (the pool, the sessions).
    fn metrics_live(&self) -> crate::metrics::Live {
        crate::metrics::Live::default()
    }

    /// [`Operations::start_run`], waiting for the result.
    fn run<'a>(&'a self, caller: &'a Caller, req: RunRequest) -> BoxFuture<'a, Result<RunResult, Error>> {
        Box::pin(async move {
            let done = self.start_run(caller, req, None).await?;
            done.await.map_err(|e| Error::internal("waiting for the run", e))?
        })
    }

    /// Every file in the session's workspace, recursively.
    fn list_files<'a>(&'a self, caller: &'a Caller, id: &'a str) -> BoxFuture<'a, Result<Vec<FileEntry>, Error>> {
        Box::pin(async move { Ok(self.listing(caller, id).await?.files.iter().collect()) })
    }

    /// A workspace file's bytes, at most `limit` of them: a larger file is
    /// [`Error::FileTooLarge`], found without reading more than `limit + 1` bytes.
    fn read_file<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        path: &'a str,
        limit: u64,
    ) -> BoxFuture<'a, Result<Vec<u8>, Error>> {
        Box::pin(async move {
            let opened = self.open_file(caller, id, path).await?;
            let too_large = || Error::FileTooLarge { path: path.to_string(), limit };
            if opened.size > limit {
                return Err(too_large());
            }
            let bytes = tokio::task::spawn_blocking(move || {
                let mut bytes = vec![];
                opened.file.take(limit.saturating_add(1)).read_to_end(&mut bytes).map(|_| bytes)
            })
            .await
            .map_err(|e| Error::internal("reading a file", e))?
            .map_err(|e| Error::from(workspace::Error::Io(path.to_string(), e)))?;
            if bytes.len() as u64 > limit {
                return Err(too_large());
            }
            Ok(bytes)
        })
    }
}

/// A workspace file being written ([`Operations::create_file`]). Call
/// [`FileUpload::finish`] when all is written, or [`FileUpload::abort`] to leave nothing.
pub trait FileUpload: Send {
    fn write(&mut self, chunk: &[u8]) -> Result<(), Error>;
    /// Flush the file and describe it; on failure nothing half-written is kept.
    fn finish(self: Box<Self>) -> Result<FileEntry, Error>;
    /// Remove what was written.
    fn abort(self: Box<Self>);
    /// Cancelled when the session's teardown begins: stop waiting for the body.
    fn closed(&self) -> Option<tokio_util::sync::CancellationToken> {
        None
    }
}

/// The daemon's operations over its sessions, runs and files. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    sessions: Arc<Manager>,
    ctx: Context,
    draining: Arc<AtomicBool>,
    listings: Arc<listing::Slots>,
    /// What the host check looks at: the daemon's configuration, and every uid
    /// its sandboxes run as (recovered sessions' included).
    check: Arc<crate::check::Inputs>,
}

impl Service {
    pub fn new(sessions: Arc<Manager>, ctx: Context, check: crate::check::Inputs) -> Service {
        let listings = listing::Slots::new(listing::IN_FLIGHT, listing::TOKEN_IN_FLIGHT, listing::WAIT);
        Service {
            sessions,
            ctx,
            draining: Arc::new(AtomicBool::new(false)),
            listings: Arc::new(listings),
            check: Arc::new(check),
        }
    }

    /// Refuse new runs from now on (daemon shutdown).
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::policy::PolicyLimits;
    use crate::model::session::Mode;

    /// What the API serves is what the typed client reads back.
    #[test]
    fn answers_read_back_as_the_typed_structs() {
        let policy = Policy { name: "default".into(), timeout_s: 17, ..Policy::default() };
        let limits: PolicyLimits = serde_json::from_value(serde_json::to_value(&policy).unwrap()).unwrap();
        assert_eq!(limits, PolicyLimits::from(&policy));
        assert_eq!(limits.timeout_s, 17);

        let info = SessionInfo {
            id: "s".into(),
            mode: Mode::Kernel,
            policy: "default".into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            last_used_at: "2026-01-01T00:00:00Z".into(),
            ttl_s: 5,
            owner: None,
            uid: 7,
            busy: true,
            disk_bytes: 0,
        };
        let back: SessionInfo = serde_json::from_value(serde_json::to_value(&info).unwrap()).unwrap();
        assert!(back.busy && back.mode == Mode::Kernel && back.uid == 7);
        // A mode's name (the metrics' `mode` label) is the API's.
        for mode in [Mode::Script, Mode::Kernel] {
            assert_eq!(serde_json::to_value(mode).unwrap(), mode.name());
        }

        // A client's request passes the daemon's `deny_unknown_fields`, absent fields left out.
        let req = RunRequest { code: "1".into(), timeout_s: Some(2.5), ..RunRequest::default() };
        let sent = serde_json::to_value(&req).unwrap();
        assert_eq!(sent, serde_json::json!({"code": "1", "language": "python", "timeout_s": 2.5}));
        let got: RunRequest = serde_json::from_value(sent).unwrap();
        assert_eq!(got.timeout_s, Some(2.5));
        let sent =
            serde_json::to_value(CreateSessionRequest { mode: Some(Mode::Script), ..Default::default() }).unwrap();
        assert_eq!(sent, serde_json::json!({"mode": "script"}));

        assert_eq!(
            serde_json::to_value(StatusAnswer::status("closed")).unwrap(),
            serde_json::json!({"status": "closed"})
        );
    }
}
