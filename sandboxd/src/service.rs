//! The daemon's operations, typed: what the HTTP handlers ([`crate::api`]) and the
//! MCP tools ([`crate::api::mcp`]) call in-process, and what [`crate::client`]
//! calls over the API, with the same request and answer structs.
//!
//! Each operation takes a [`Caller`] (whose token, if any) and typed input, and
//! returns a typed answer or an [`Error`]. Nothing here knows HTTP: the API edge
//! maps an [`Error`] to its status and error code in one place
//! (`impl From<service::Error> for ApiError`, in `api/error.rs`).

use crate::artifacts;
use crate::isolate::output::Chunk;
use crate::listing;
pub use crate::listing::{FileEntry, Listing};
use crate::names;
use crate::policy::Policy;
use crate::records::{self, RunPage, RunRecord};
use crate::run::{self, Context, RunRequest, RunResult};
use crate::session::{self, Lease, Manager, Mode, SessionInfo};
use crate::workspace::{self, Workspace};
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
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
    #[error("session {session:?} has no run {run_id:?}: list its runs with GET /v1/sessions/{session}/runs (a session keeps its newest {} runs)", records::MAX_RECORDS)]
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

/// The body of `POST /v1/sessions`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// Caller-chosen id (`^[A-Za-z0-9_-]{1,64}$`); made up when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = r"^[A-Za-z0-9_-]{1,64}$")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Idle time before the session is closed, seconds (1 to 30 days; default:
    /// the daemon's `session_ttl_s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 2592000)]
    pub ttl_s: Option<u64>,
}

/// The answer of an operation that only reports what it did:
/// `{"status":"closed"}`, `{"status":"cancelled"|"idle"}`,
/// `{"status":"deleted","path":...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Done {
    #[schema(example = "closed")]
    pub status: String,
    /// The file deleted (`DELETE .../files/{path}` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub path: Option<String>,
}

impl Done {
    fn status(status: &str) -> Done {
        Done { status: status.to_string(), path: None }
    }
}

/// The limits of a policy a client states to its user (e.g. in MCP tool
/// descriptions): a subset of `GET /v1/policies`' entries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyLimits {
    pub name: String,
    pub timeout_s: u64,
    pub memory_mb: u64,
    pub cpus: f64,
    pub output_kb: u64,
    /// Most code a run may send (KiB): MCP checks a run against it before it makes
    /// a session for the run.
    pub code_kb: u64,
    pub upload_mb: u64,
    pub mcp_inline_mb: u64,
}

impl From<&Policy> for PolicyLimits {
    fn from(p: &Policy) -> Self {
        PolicyLimits {
            name: p.name.clone(),
            timeout_s: p.timeout_s,
            memory_mb: p.memory_mb,
            cpus: p.cpus,
            output_kb: p.output_kb,
            code_kb: p.code_kb,
            upload_mb: p.upload_mb,
            mcp_inline_mb: p.mcp_inline_mb,
        }
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
    pub problems: Vec<crate::health::Problem>,
    /// The cgroup setup, described.
    pub cgroup: String,
    pub sessions: usize,
    pub busy_sessions: usize,
    pub pool: crate::pool::Stats,
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
    fn policies(&self) -> Vec<Policy>;
    /// The largest code any policy allows, in bytes.
    fn max_code_bytes(&self) -> Option<usize>;
    fn create_session<'a>(
        &'a self,
        caller: &'a Caller,
        req: CreateSession,
    ) -> BoxFuture<'a, Result<SessionInfo, Error>>;
    fn get_session(&self, caller: &Caller, id: &str) -> Result<SessionInfo, Error>;
    fn list_sessions(&self, caller: &Caller) -> Vec<SessionInfo>;
    /// Close a session: kill its run, if any, and remove its files.
    fn close_session<'a>(&'a self, caller: &'a Caller, id: &'a str) -> BoxFuture<'a, Result<Done, Error>>;
    /// Stop the run in flight in a session (it ends with status `killed`).
    fn cancel_run(&self, caller: &Caller, id: &str) -> Result<Done, Error>;
    /// Start `req` in its session or a new one; output goes to `chunks` as it
    /// comes, the result to the returned receiver (see [`Service::start_run`]).
    fn start_run<'a>(
        &'a self,
        caller: &'a Caller,
        req: RunRequest,
        chunks: Option<mpsc::Sender<Chunk>>,
    ) -> BoxFuture<'a, Result<RunDone, Error>>;
    /// The workspace's files, sorted by path, and whether that is their first part only.
    /// A path (here and below) is in its text form ([`crate::names`]).
    fn listing<'a>(&'a self, caller: &'a Caller, id: &'a str) -> BoxFuture<'a, Result<Listing, Error>>;
    /// Open a workspace file to stream it.
    fn open_file(&self, caller: &Caller, id: &str, path: &str) -> Result<OpenFile, Error>;
    /// Start writing a workspace file, within the policy's upload limit.
    fn create_file(&self, caller: &Caller, id: &str, path: &str, overwrite: bool)
        -> Result<Box<dyn FileUpload>, Error>;
    fn delete_file(&self, caller: &Caller, id: &str, path: &str) -> Result<Done, Error>;
    /// What is degraded now, and the counters `GET /v1/health` shows.
    fn condition(&self) -> BoxFuture<'_, Condition>;
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
            let opened = self.open_file(caller, id, path)?;
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
}

impl Service {
    pub fn new(sessions: Arc<Manager>, ctx: Context) -> Service {
        let listings = listing::Slots::new(listing::IN_FLIGHT, listing::TOKEN_IN_FLIGHT, listing::WAIT);
        Service { sessions, ctx, draining: Arc::new(AtomicBool::new(false)), listings: Arc::new(listings) }
    }

    /// Refuse new runs from now on (daemon shutdown).
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn policy(&self, name: Option<&str>) -> Result<Arc<Policy>, Error> {
        Ok(self.sessions.policy(name)?)
    }

    pub fn policies(&self) -> Vec<Policy> {
        self.sessions.policies().map(|p| (**p).clone()).collect()
    }

    /// The largest code any policy allows, in bytes.
    pub fn max_code_bytes(&self) -> Option<usize> {
        self.sessions.policies().map(|p| p.code_bytes()).max()
    }

    pub async fn create_session(&self, caller: &Caller, req: CreateSession) -> Result<SessionInfo, Error> {
        Ok(self
            .sessions
            .create(req.id, req.policy.as_deref(), req.mode.unwrap_or_default(), req.ttl_s, caller.owner())
            .await?)
    }

    pub fn get_session(&self, caller: &Caller, id: &str) -> Result<SessionInfo, Error> {
        Ok(self.sessions.get(id, caller.owner())?)
    }

    pub fn list_sessions(&self, caller: &Caller) -> Vec<SessionInfo> {
        self.sessions.list(caller.owner())
    }

    /// Close a session: kill its run, if any, and remove its files.
    pub async fn close_session(&self, caller: &Caller, id: &str) -> Result<Done, Error> {
        self.sessions.close(id, caller.owner()).await?;
        Ok(Done::status("closed"))
    }

    /// Stop the run in flight in a session (it ends with status `killed`).
    pub fn cancel_run(&self, caller: &Caller, id: &str) -> Result<Done, Error> {
        let cancelled = self.sessions.cancel_run(id, caller.owner())?;
        Ok(Done::status(if cancelled { "cancelled" } else { "idle" }))
    }

    /// Start `req` in its session (`req.session_id`), or in a new one made for it.
    /// The run goes on in a task of its own, so a caller that goes away cannot
    /// abort it halfway; its output goes to `chunks` as it comes, and the result
    /// to the returned receiver.
    pub async fn start_run(
        &self,
        caller: &Caller,
        req: RunRequest,
        chunks: Option<mpsc::Sender<Chunk>>,
    ) -> Result<RunDone, Error> {
        let owner = caller.owner();
        let lease = match &req.session_id {
            Some(id) => {
                let lease = self.sessions.lease(id, owner)?;
                check_policy(&req, &lease)?;
                lease
            }
            None => {
                run::validate(&req, &*self.sessions.policy(req.policy.as_deref())?)?;
                // Refuse before a session is made for a run the token may not start.
                self.sessions.check_run_quota(owner)?;
                let info = self.sessions.create(None, req.policy.as_deref(), Mode::Script, None, owner).await?;
                match self.sessions.lease(&info.id, owner) {
                    Ok(lease) => lease,
                    Err(e) => {
                        // Another run of the token's took the last place meanwhile.
                        let _ = self.sessions.close(&info.id, owner).await;
                        return Err(e.into());
                    }
                }
            }
        };
        if self.draining.load(Ordering::SeqCst) {
            return Err(Error::ShuttingDown);
        }
        // The run is accepted: from here on it has a record, written beside the
        // sandbox's start rather than before it.
        let run_id = run::new_run_id();
        let records = self.sessions.records(&lease.id);
        let record = RunRecord::accepted(&run_id, req.language, lease.mode, &req.code);
        let begun = blocking(records.clone(), move |r| r.begin(record));
        let (done_tx, done_rx) = oneshot::channel();
        let ctx = self.ctx.clone();
        tokio::spawn(async move {
            let (result, begun) = tokio::join!(run::execute(&ctx, &lease, &req, &run_id, chunks), begun);
            let result = result.map_err(Error::from);
            match begun {
                Ok(mut pending) => {
                    pending.record.ended(result.as_ref().map_err(record_error));
                    // Written while the lease still holds the session (its teardown
                    // waits), and before the caller hears of the result.
                    if let Err(e) = blocking(records, move |r| r.finish(&pending)).await {
                        tracing::warn!(session_id = %lease.id, run_id = %run_id, error = %e, "could not keep the run's record");
                    }
                }
                // The run went on without one: the host's disk is the operator's to fix.
                Err(e) => {
                    tracing::warn!(session_id = %lease.id, run_id = %run_id, error = %e, "could not keep the run's record")
                }
            }
            drop(lease);
            let _ = done_tx.send(result);
        });
        Ok(done_rx)
    }

    /// Up to `limit` of session `id`'s run records, newest first.
    pub async fn list_runs(
        &self,
        caller: &Caller,
        id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<RunPage, Error> {
        let opened = self.sessions.open(id, caller.owner())?;
        let records = opened.records.clone();
        let wanted = before.map(str::to_string);
        let page = blocking(records, move |r| {
            let page = r.page(wanted.as_deref(), limit);
            drop(opened);
            page
        })
        .await
        .map_err(|e| Error::internal("reading the session's run records", e))?;
        page.ok_or_else(|| Error::RunNotFound { session: id.to_string(), run_id: before.unwrap_or_default().into() })
    }

    /// Run `run_id`'s record in session `id`.
    pub async fn get_run(&self, caller: &Caller, id: &str, run_id: &str) -> Result<RunRecord, Error> {
        let opened = self.sessions.open(id, caller.owner())?;
        let records = opened.records.clone();
        let wanted = run_id.to_string();
        let record = blocking(records, move |r| {
            let record = r.get(&wanted);
            drop(opened);
            record
        })
        .await
        .map_err(|e| Error::internal("reading a run record", e))?;
        record.ok_or_else(|| Error::RunNotFound { session: id.to_string(), run_id: run_id.to_string() })
    }

    /// The session's workspace, opened for one file operation while the session
    /// is ready; the [`session::Use`] holds its teardown off until dropped.
    fn open_workspace(&self, caller: &Caller, id: &str) -> Result<(Workspace, SessionInfo, session::Use), Error> {
        let opened = self.sessions.open(id, caller.owner())?;
        let ws = Workspace::open(&opened.workspace, opened.info.uid)?;
        Ok((ws, opened.info, opened.hold))
    }

    fn file_url(&self, id: &str, rel: &Path) -> String {
        format!("{}/v1/sessions/{id}/files/{}", self.ctx.public_url, names::url(rel.as_os_str().as_bytes()))
    }

    /// The workspace's files in path order, and whether that is only their first
    /// part ([`crate::listing`]: at most [`listing::MAX_JSON`] of JSON, and the
    /// walk's bounds), once a place among the listings in flight is free.
    pub async fn listing(&self, caller: &Caller, id: &str) -> Result<Listing, Error> {
        // An unknown session is told so at once, not after a wait for a place.
        self.sessions.get(id, caller.owner())?;
        let slot = self.listings.take(caller.owner()).await?;
        let (ws, _, hold) = self.open_workspace(caller, id)?;
        let prefix = format!("{}/v1/sessions/{id}/files/", self.ctx.public_url);
        let (mut files, walked, slot) = tokio::task::spawn_blocking(move || {
            // The place goes with the walk: a client that leaves meanwhile does
            // not free it while the walk still holds its memory.
            let listed = listing::walk(&ws, prefix);
            drop(hold);
            listed.map(|(files, walked)| (files, walked, slot))
        })
        .await
        .map_err(|e| Error::internal("listing files", e))??;
        files.hold(slot);
        Ok(Listing { files, partial: walked.partial })
    }

    /// Open a workspace file to stream it.
    pub fn open_file(&self, caller: &Caller, id: &str, path: &str) -> Result<OpenFile, Error> {
        let rel = names::path_of(path)?;
        let (ws, _, hold) = self.open_workspace(caller, id)?;
        let (file, meta) = ws.open_read(&rel)?;
        let name = rel.file_name().map(|n| n.to_os_string()).unwrap_or_default();
        Ok(OpenFile { file, size: meta.size, mime_type: artifacts::mime_type(&rel), name, hold: Some(hold) })
    }

    /// Start writing a workspace file; feed it with [`Upload::write`].
    pub fn create_file(&self, caller: &Caller, id: &str, path: &str, overwrite: bool) -> Result<Upload, Error> {
        let rel = names::path_of(path)?;
        let (ws, info, hold) = self.open_workspace(caller, id)?;
        let limit = self.sessions.policy(Some(&info.policy))?.upload_bytes();
        let file = ws.create(&rel, overwrite)?;
        let url = self.file_url(id, &rel);
        let writer = std::io::BufWriter::with_capacity(256 * 1024, file);
        Ok(Upload { ws, rel, writer, written: 0, limit, url, hold })
    }

    pub fn delete_file(&self, caller: &Caller, id: &str, path: &str) -> Result<Done, Error> {
        let rel = names::path_of(path)?;
        let (ws, _, _hold) = self.open_workspace(caller, id)?;
        ws.remove(&rel)?;
        Ok(Done { status: "deleted".into(), path: Some(names::text(rel.as_os_str().as_bytes())) })
    }
}

impl Service {
    /// What `GET /v1/health` reports: the problems [`crate::health`] finds now, and counters.
    pub async fn condition(&self) -> Condition {
        let ctx = &self.ctx;
        let facts = crate::health::Facts::gather(
            &ctx.rootfs,
            &ctx.sandboxes.cgroups,
            ctx.pool.start_errors(),
            crate::check::now().await,
        );
        Condition {
            problems: facts.problems(),
            cgroup: ctx.sandboxes.cgroups.describe(),
            sessions: self.sessions.count(),
            busy_sessions: self.sessions.busy_count(),
            pool: ctx.pool.stats(),
        }
    }
}

/// The real operations: each is the [`Service`] method of the same name.
impl Operations for Service {
    fn policy(&self, name: Option<&str>) -> Result<Arc<Policy>, Error> {
        Service::policy(self, name)
    }

    fn policies(&self) -> Vec<Policy> {
        Service::policies(self)
    }

    fn max_code_bytes(&self) -> Option<usize> {
        Service::max_code_bytes(self)
    }

    fn create_session<'a>(
        &'a self,
        caller: &'a Caller,
        req: CreateSession,
    ) -> BoxFuture<'a, Result<SessionInfo, Error>> {
        Box::pin(Service::create_session(self, caller, req))
    }

    fn get_session(&self, caller: &Caller, id: &str) -> Result<SessionInfo, Error> {
        Service::get_session(self, caller, id)
    }

    fn list_sessions(&self, caller: &Caller) -> Vec<SessionInfo> {
        Service::list_sessions(self, caller)
    }

    fn close_session<'a>(&'a self, caller: &'a Caller, id: &'a str) -> BoxFuture<'a, Result<Done, Error>> {
        Box::pin(Service::close_session(self, caller, id))
    }

    fn cancel_run(&self, caller: &Caller, id: &str) -> Result<Done, Error> {
        Service::cancel_run(self, caller, id)
    }

    fn start_run<'a>(
        &'a self,
        caller: &'a Caller,
        req: RunRequest,
        chunks: Option<mpsc::Sender<Chunk>>,
    ) -> BoxFuture<'a, Result<RunDone, Error>> {
        Box::pin(Service::start_run(self, caller, req, chunks))
    }

    fn listing<'a>(&'a self, caller: &'a Caller, id: &'a str) -> BoxFuture<'a, Result<Listing, Error>> {
        Box::pin(Service::listing(self, caller, id))
    }

    fn open_file(&self, caller: &Caller, id: &str, path: &str) -> Result<OpenFile, Error> {
        Service::open_file(self, caller, id, path)
    }

    fn create_file(
        &self,
        caller: &Caller,
        id: &str,
        path: &str,
        overwrite: bool,
    ) -> Result<Box<dyn FileUpload>, Error> {
        Ok(Box::new(Service::create_file(self, caller, id, path, overwrite)?))
    }

    fn delete_file(&self, caller: &Caller, id: &str, path: &str) -> Result<Done, Error> {
        Service::delete_file(self, caller, id, path)
    }

    fn condition(&self) -> BoxFuture<'_, Condition> {
        Box::pin(Service::condition(self))
    }

    fn metrics_live(&self) -> crate::metrics::Live {
        let pool = self.ctx.pool.stats();
        let mode = |m| serde_json::to_value(m).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
        crate::metrics::Live {
            pool_idle: pool.ready_by_policy.into_iter().collect(),
            pool_hits: pool.hits,
            pool_misses: pool.misses,
            sessions: self.sessions.count_by_mode().into_iter().map(|(m, n)| (mode(m), n)).collect(),
        }
    }

    fn list_runs<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        before: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<RunPage, Error>> {
        Box::pin(Service::list_runs(self, caller, id, before, limit))
    }

    fn get_run<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<RunRecord, Error>> {
        Box::pin(Service::get_run(self, caller, id, run_id))
    }
}

/// Call `f` with the session's records on a blocking thread (records are files).
async fn blocking<T: Send + 'static>(
    records: records::Records,
    f: impl FnOnce(&records::Records) -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(move || f(&records)).await.map_err(std::io::Error::other)?
}

/// What a run's record says of the error that stopped it: what its caller was
/// told, without a host failure's details (those are in the daemon's log).
fn record_error(e: &Error) -> String {
    match e {
        Error::Internal { context, .. } | Error::Run(run::Error::Internal { context, .. }) => {
            format!("{context} failed on the server; the daemon log has the cause")
        }
        other => other.to_string(),
    }
}

/// A run in an existing session keeps the session's policy.
fn check_policy(req: &RunRequest, lease: &Lease) -> Result<(), Error> {
    match &req.policy {
        Some(p) if *p != lease.policy.name => Err(Error::InvalidRequest(format!(
            "session {:?} uses policy {:?}; a session's policy is fixed: create a new session for policy {p:?}",
            lease.id, lease.policy.name
        ))),
        _ => run::validate(req, &lease.policy).map(|_| ()).map_err(Error::from),
    }
}

/// A workspace file being written, within the policy's upload limit (the real
/// [`FileUpload`]).
pub struct Upload {
    ws: Workspace,
    rel: PathBuf,
    writer: std::io::BufWriter<std::fs::File>,
    written: u64,
    limit: u64,
    url: String,
    /// The session stays up while the file is written; a teardown stops it.
    hold: session::Use,
}

impl FileUpload for Upload {
    fn write(&mut self, chunk: &[u8]) -> Result<(), Error> {
        self.hold.check()?;
        self.written += chunk.len() as u64;
        if self.written > self.limit {
            return Err(Error::UploadTooLarge { limit: self.limit });
        }
        self.writer.write_all(chunk).map_err(|e| Error::from(workspace::Error::Io(self.rel.display().to_string(), e)))
    }

    fn finish(mut self: Box<Self>) -> Result<FileEntry, Error> {
        let flushed =
            self.writer.flush().map_err(|e| Error::from(workspace::Error::Io(self.rel.display().to_string(), e)));
        if let Err(err) = flushed.and_then(|()| Ok(self.hold.check()?)) {
            self.abort();
            return Err(err);
        }
        Ok(FileEntry {
            path: names::text(self.rel.as_os_str().as_bytes()),
            size_bytes: self.written,
            mime_type: artifacts::mime_type(&self.rel),
            modified_at: session::rfc3339(std::time::SystemTime::now()),
            url: self.url,
        })
    }

    fn abort(self: Box<Self>) {
        let Upload { ws, rel, writer, .. } = *self;
        drop(writer);
        let _ = ws.remove(&rel);
    }

    fn closed(&self) -> Option<tokio_util::sync::CancellationToken> {
        Some(self.hold.cut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        };
        let back: SessionInfo = serde_json::from_value(serde_json::to_value(&info).unwrap()).unwrap();
        assert!(back.busy && back.mode == Mode::Kernel && back.uid == 7);

        // A client's request passes the daemon's `deny_unknown_fields`, absent fields left out.
        let req = RunRequest { code: "1".into(), timeout_s: Some(2.5), ..RunRequest::default() };
        let sent = serde_json::to_value(&req).unwrap();
        assert_eq!(sent, serde_json::json!({"code": "1", "language": "python", "timeout_s": 2.5}));
        let got: RunRequest = serde_json::from_value(sent).unwrap();
        assert_eq!(got.timeout_s, Some(2.5));
        let sent = serde_json::to_value(CreateSession { mode: Some(Mode::Script), ..Default::default() }).unwrap();
        assert_eq!(sent, serde_json::json!({"mode": "script"}));

        assert_eq!(serde_json::to_value(Done::status("closed")).unwrap(), serde_json::json!({"status": "closed"}));
    }
}
