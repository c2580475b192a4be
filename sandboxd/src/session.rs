//! Sessions: a workspace on disk that persists across runs, with its own host uid,
//! a policy, a mode, an idle TTL and an owner.
//!
//! The manager keeps the live state (busy, the running run's cancel switch) in
//! memory and each session's description in `<state>/sessions/<key>/session.json`,
//! so a restarted daemon takes back the sessions still within their TTL.
//!
//! Tenants: each bearer token has an id space of its own, so two tokens can both
//! have a session `x`, and no answer tells a token whether another one uses an id.
//! A session's key (its directory, its kernel, its key in the manager) is its id
//! for callers without a token, and `<tenant>.<id>` for a token's session, where
//! the tenant is the first 16 hex digits of the token's hash. A caller without a
//! token (the operator) sees and addresses sessions by key; a token's caller by id.
//! Each token also has quotas: sessions held, and runs going at once.

use crate::policy::Policy;
use crate::records::Records;
use crate::storage;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

mod create;
mod recover;
mod teardown;

/// What can go wrong with a session; the API edge maps each to its HTTP answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid session id {0:?}: use 1 to 64 letters, digits, `-` or `_`")]
    InvalidId(String),
    #[error("no policy named {name:?}; known policies: {}", known.join(", "))]
    PolicyNotFound { name: String, known: Vec<String> },
    #[error("no session {0:?}: it was closed, expired or never made; create one with POST /v1/sessions")]
    NotFound(String),
    #[error("session {0:?} already exists: use it, close it first, or pick another id")]
    Exists(String),
    #[error("session {0:?} is running code: wait for that run to finish, or use another session")]
    Busy(String),
    #[error("ttl_s must be from 1 to 2592000 seconds")]
    InvalidTtl,
    /// `closing`: how many of them are still being torn down (they count until
    /// their teardown has ended).
    #[error("this token already holds its maximum of {max} sessions (token_max_sessions){}: close one (DELETE /v1/sessions/ID) or wait for idle ones to expire", closing_note(*closing))]
    TokenMaxSessions { max: usize, closing: usize },
    #[error("the daemon already holds its maximum of {max} sessions{}: close one (DELETE /v1/sessions/ID) or wait for idle ones to expire", closing_note(*closing))]
    MaxSessions { max: usize, closing: usize },
    #[error("this token already has its maximum of {0} runs going at once (token_max_runs): wait for one to finish, or cancel one (DELETE /v1/sessions/ID/run), then retry")]
    TokenMaxRuns(usize),
    /// The state directory's filesystem cannot hold every session's workspace
    /// filled up, this new one included.
    #[error("the state directory's filesystem has {free_mb} MiB free, but the sessions held could grow by {held_mb} MiB and this one needs {wanted_mb} MiB (policy {policy:?}): close sessions you no longer need, free disk space, or use a policy with a smaller workspace_mb")]
    InsufficientStorage { free_mb: u64, held_mb: u64, wanted_mb: u64, policy: String },
    /// The session's workspace could not be made (a host failure, not the caller's).
    #[error("creating the session workspace: {0}")]
    Workspace(std::io::Error),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every run is a fresh sandbox over the session's workspace.
    #[default]
    Script,
    /// One interpreter stays alive across runs: variables persist ([`crate::kernel`]).
    Kernel,
}

/// How a quota refusal names the sessions that still count while torn down.
fn closing_note(closing: usize) -> String {
    match closing {
        0 => String::new(),
        n => format!(", {n} of them still being closed (retry in a moment)"),
    }
}

/// What is stored of a session, and what the API shows.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionInfo {
    pub id: String,
    pub mode: Mode,
    pub policy: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub last_used_at: String,
    pub ttl_s: u64,
    /// The token identity that owns the session (a hash, never the token); absent
    /// for sessions made without a token.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub owner: Option<String>,
    /// The host uid the session's code runs as.
    #[serde(default)]
    pub uid: u32,
    /// Always stored as false: only the live state says a session is busy.
    #[serde(default)]
    pub busy: bool,
}

/// Where a session is in its life. Only a `Ready` session is reachable by any
/// route (files, runs, kernel cells, cancel, close): one being created has no
/// mounted workspace yet, and one being torn down is going away. Both answer
/// `session_not_found`, as a session that does not exist; their key stays taken
/// (a create of it waits for a teardown to end, see [`Manager::create`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reserved; its workspace is being made and mounted.
    Creating,
    Ready,
    /// Its teardown began: runs are told to stop, then kernel, workspace and files go.
    Closing,
}

struct Live {
    info: SessionInfo,
    last_used: SystemTime,
    busy: bool,
    cancel: Option<watch::Sender<bool>>,
    phase: Phase,
    /// Which life of its key this is: a hold ([`Lease`], [`Use`]) that outlives a
    /// forced teardown never touches a later session of the same key.
    epoch: u64,
    /// File operations going on in the workspace ([`Use`]); a teardown waits for them.
    users: usize,
    /// Response bodies streaming from the workspace ([`Use::for_body`]): a teardown
    /// cuts them, then waits for them to be dropped.
    bodies: usize,
    /// Cancelled when the teardown begins: an upload in progress stops, a body
    /// being sent is cut (its connection closed).
    cut: CancellationToken,
    /// The teardown was forced while a run still held the session: the run's
    /// lease removes the entry (freeing the key and its uid) when it drops.
    torn_down: bool,
    /// A kernel session taken back after a restart, whose kernel (and variables)
    /// went with the earlier daemon: its next cell says `kernel_restarted`.
    kernel_lost: bool,
}

impl Live {
    fn new(info: SessionInfo, last_used: SystemTime, phase: Phase, epoch: u64) -> Live {
        Live {
            info,
            last_used,
            busy: false,
            cancel: None,
            phase,
            epoch,
            users: 0,
            bodies: 0,
            cut: CancellationToken::new(),
            torn_down: false,
            kernel_lost: false,
        }
    }
}

pub struct Manager {
    dir: PathBuf,
    policies: BTreeMap<String, Arc<Policy>>,
    max_sessions: usize,
    default_ttl_s: u64,
    uid_base: u32,
    sessions: Mutex<HashMap<String, Live>>,
    idle: Notify,
    /// Live kernels of kernel-mode sessions, taken out while a cell runs.
    pub kernels: crate::kernel::Kernels,
    /// Most sessions one token holds, and runs it has going, at once.
    token_max_sessions: usize,
    token_max_runs: usize,
    /// The next [`Live::epoch`].
    epochs: AtomicU64,
    /// Longest a teardown waits for what holds the session before it forces it.
    teardown_deadline: Duration,
}

/// Marks a session busy for one run; dropping it frees the session.
pub struct Lease {
    manager: Arc<Manager>,
    /// The session's key: its directory, its kernel (see the module doc).
    pub id: String,
    /// The id as the caller addresses it: for results and artifact URLs.
    pub public_id: String,
    pub uid: u32,
    pub policy: Arc<Policy>,
    pub workspace: PathBuf,
    pub mode: Mode,
    pub cancel: watch::Receiver<bool>,
    epoch: u64,
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Save the session's new last use while it still counts as busy, so a
        // teardown (which waits for that) never races this write.
        let saved = {
            let mut map = self.manager.lock();
            map.get_mut(&self.id).filter(|l| l.phase == Phase::Ready && l.epoch == self.epoch).map(|live| {
                live.last_used = SystemTime::now();
                live.info.last_used_at = rfc3339(live.last_used);
                live.info.clone()
            })
        };
        if let Some(info) = saved {
            self.manager.persist(&info);
        }
        {
            let mut map = self.manager.lock();
            if let Some(live) = map.get_mut(&self.id).filter(|l| l.epoch == self.epoch) {
                live.busy = false;
                live.cancel = None;
                if live.torn_down {
                    // Its teardown was forced while this run held it: the key and
                    // the uid are free only now that the run is over.
                    map.remove(&self.id);
                    tracing::info!(session_id = %self.id, "the run that outlived its session's teardown ended: session closed");
                }
            }
        }
        self.manager.idle.notify_waiters();
    }
}

/// One file operation's hold on a ready session's workspace (see
/// [`Manager::open`]): the session's teardown waits until every hold is dropped,
/// so nothing is written into a workspace being unmounted. A response body that
/// streams from the workspace holds it as long as it is sent ([`Use::for_body`]).
pub struct Use {
    manager: Arc<Manager>,
    key: String,
    public_id: String,
    epoch: u64,
    cut: CancellationToken,
    /// Counted as a body (cut by the teardown) rather than a file operation.
    body: bool,
}

impl Use {
    /// `Err(session_not_found)` once the session's teardown began: stop writing,
    /// the workspace is going away.
    pub fn check(&self) -> Result<(), Error> {
        if self.cut.is_cancelled() {
            return Err(Manager::not_found(&self.public_id));
        }
        Ok(())
    }

    /// Cancelled when the session's teardown begins: what holds the session
    /// stops (an upload) or is cut (a body, its connection closed).
    pub fn cut(&self) -> CancellationToken {
        self.cut.clone()
    }

    /// This hold, for a response body that streams from the workspace: the
    /// teardown cuts it at once instead of waiting, and an expiry does not wait.
    pub fn for_body(mut self) -> Use {
        if !self.body {
            if let Some(live) = self.manager.lock().get_mut(&self.key).filter(|l| l.epoch == self.epoch) {
                live.users = live.users.saturating_sub(1);
                live.bodies += 1;
            }
            self.body = true;
        }
        self
    }
}

impl Drop for Use {
    fn drop(&mut self) {
        if let Some(live) = self.manager.lock().get_mut(&self.key).filter(|l| l.epoch == self.epoch) {
            if self.body {
                live.bodies = live.bodies.saturating_sub(1);
            } else {
                live.users = live.users.saturating_sub(1);
            }
        }
        self.manager.idle.notify_waiters();
    }
}

/// A ready session's workspace, opened for one file operation.
pub struct Opened {
    pub info: SessionInfo,
    /// The mounted workspace's root directory.
    pub workspace: PathBuf,
    /// The session's run records.
    pub records: Records,
    /// Holds the session up: drop it when the operation is done.
    pub hold: Use,
}

/// In a session's directory: the session has had a kernel (so a restart lost one).
const KERNEL_STARTED: &str = "kernel-started";

/// Longest a create of a key waits for that key's teardown to end.
const TEARDOWN_WAIT: Duration = Duration::from_secs(60);

/// Longest a teardown waits for the session's run, file operations and bodies to
/// let go before it forces its way ([`Manager::with_teardown_deadline`]).
pub const TEARDOWN_DEADLINE: Duration = Duration::from_secs(15);

pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Session ids: `^[A-Za-z0-9_-]{1,64}$`.
pub fn validate_id(id: &str) -> Result<(), Error> {
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err(Error::InvalidId(id.to_string()));
    }
    Ok(())
}

pub fn new_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The tenant label of a token identity (its hash): 16 hex digits.
fn tenant(owner: &str) -> &str {
    owner.get(..16).unwrap_or(owner)
}

/// The key of session `id` as addressed by `owner`: a token's caller addresses its
/// own id space; a caller without a token addresses keys (`id`, or `tenant.id`).
pub fn key(id: &str, owner: Option<&str>) -> Result<String, Error> {
    match owner {
        Some(o) => {
            validate_id(id)?;
            Ok(format!("{}.{id}", tenant(o)))
        }
        None => {
            let is_key = id.split_once('.').is_some_and(|(t, rest)| {
                t.len() == 16
                    && t.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                    && validate_id(rest).is_ok()
            });
            if !is_key {
                validate_id(id)?;
            }
            Ok(id.to_string())
        }
    }
}

/// The key of a stored session.
fn key_of(info: &SessionInfo) -> String {
    match &info.owner {
        Some(o) => format!("{}.{}", tenant(o), info.id),
        None => info.id.clone(),
    }
}

/// `info` as `owner` sees it: its id in the caller's space.
fn shown(info: &SessionInfo, busy: bool, owner: Option<&str>) -> SessionInfo {
    let id = if owner.is_some() { info.id.clone() } else { key_of(info) };
    SessionInfo { id, busy, ..info.clone() }
}

impl Manager {
    pub fn new(
        state_dir: &Path,
        policies: BTreeMap<String, Policy>,
        max_sessions: usize,
        default_ttl_s: u64,
        uid_base: u32,
    ) -> std::io::Result<Manager> {
        let dir = state_dir.join("sessions");
        std::fs::create_dir_all(&dir)?;
        // Kernels' control sockets of older versions lived here (kernels now get
        // theirs as an inherited fd).
        let _ = std::fs::remove_dir_all(state_dir.join("kernels"));
        // Sandboxes (unprivileged host uids) pass through to the rootfs and their
        // workspace; nobody but root lists either directory.
        std::fs::set_permissions(state_dir, std::fs::Permissions::from_mode(0o711))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))?;
        Ok(Manager {
            dir,
            policies: policies.into_iter().map(|(k, v)| (k, Arc::new(v))).collect(),
            max_sessions,
            default_ttl_s,
            uid_base,
            sessions: Mutex::new(HashMap::new()),
            idle: Notify::new(),
            kernels: crate::kernel::Kernels::default(),
            token_max_sessions: max_sessions,
            token_max_runs: max_sessions,
            epochs: AtomicU64::new(1),
            teardown_deadline: TEARDOWN_DEADLINE,
        })
    }

    /// Set how long a teardown waits before it forces its way.
    pub fn with_teardown_deadline(mut self, deadline: Duration) -> Manager {
        self.teardown_deadline = deadline;
        self
    }

    fn next_epoch(&self) -> u64 {
        self.epochs.fetch_add(1, Ordering::Relaxed)
    }

    /// Set the per-token quotas (each at most `max_sessions`).
    pub fn with_token_quotas(mut self, sessions: usize, runs: usize) -> Manager {
        self.token_max_sessions = sessions.clamp(1, self.max_sessions);
        self.token_max_runs = runs.clamp(1, self.max_sessions);
        self
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Live>> {
        // A panic while holding the lock leaves plain data behind: keep serving.
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn policy(&self, name: Option<&str>) -> Result<Arc<Policy>, Error> {
        let name = name.unwrap_or("default");
        self.policies.get(name).cloned().ok_or_else(|| Error::PolicyNotFound {
            name: name.to_string(),
            known: self.policies.keys().cloned().collect(),
        })
    }

    pub fn policies(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.policies.values()
    }

    fn session_dir(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    /// The workspace of the session with this key.
    pub fn workspace(&self, key: &str) -> PathBuf {
        self.session_dir(key).join("data")
    }

    /// The run records of the session with this key (they go with its directory).
    pub fn records(&self, key: &str) -> Records {
        Records::of(&self.session_dir(key))
    }

    /// Note on disk that session `key` has had a kernel (its variables would be lost
    /// with the daemon: see [`Manager::take_kernel_lost`]).
    pub fn mark_kernel_started(&self, key: &str) {
        let mark = self.session_dir(key).join(KERNEL_STARTED);
        let made = std::fs::OpenOptions::new().write(true).create(true).truncate(false).mode(0o600).open(&mark);
        if let Err(e) = made {
            tracing::warn!(session_id = %key, error = %e, "could not note that the session's kernel started");
        }
    }

    /// Whether session `key`'s kernel went with an earlier daemon and no cell has
    /// said so yet; the answer is given once.
    pub fn take_kernel_lost(&self, key: &str) -> bool {
        self.lock().get_mut(key).is_some_and(|l| std::mem::take(&mut l.kernel_lost))
    }

    /// The ready session `key` if `owner` sees it: the one lookup every route
    /// (files, runs, kernel cells, cancel, close) goes through. A session still
    /// being created, or whose teardown began, is not found.
    fn ready<'a>(map: &'a HashMap<String, Live>, key: &str, owner: Option<&str>) -> Option<&'a Live> {
        map.get(key).filter(|l| l.phase == Phase::Ready && Self::visible(l, owner))
    }

    fn ready_mut<'a>(map: &'a mut HashMap<String, Live>, key: &str, owner: Option<&str>) -> Option<&'a mut Live> {
        map.get_mut(key).filter(|l| l.phase == Phase::Ready && Self::visible(l, owner))
    }

    /// The workspace of session `id` as `owner` addresses it, if `owner` sees it.
    pub fn workspace_of(&self, id: &str, owner: Option<&str>) -> Result<PathBuf, Error> {
        let key = key(id, owner)?;
        match Self::ready(&self.lock(), &key, owner) {
            Some(_) => Ok(self.workspace(&key)),
            None => Err(Self::not_found(id)),
        }
    }

    /// Session `id`'s mounted workspace for one file operation, held until the
    /// returned [`Use`] is dropped (its teardown waits for that).
    pub fn open(self: &Arc<Self>, id: &str, owner: Option<&str>) -> Result<Opened, Error> {
        let key = key(id, owner)?;
        let mut map = self.lock();
        let Some(live) = Self::ready_mut(&mut map, &key, owner) else { return Err(Self::not_found(id)) };
        live.users += 1;
        let info = shown(&live.info, live.busy, owner);
        let hold = Use {
            manager: self.clone(),
            key: key.clone(),
            public_id: id.to_string(),
            epoch: live.epoch,
            cut: live.cut.clone(),
            body: false,
        };
        Ok(Opened { info, workspace: self.workspace(&key), records: self.records(&key), hold })
    }

    fn persist(&self, info: &SessionInfo) {
        let path = self.session_dir(&key_of(info)).join("session.json");
        let tmp = path.with_extension("json.tmp");
        let write = serde_json::to_vec_pretty(info)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                // Root's alone (0600), whatever an earlier write left behind.
                let _ = std::fs::remove_file(&tmp);
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?.write_all(&bytes)
            })
            .and_then(|_| std::fs::rename(&tmp, &path));
        if let Err(e) = write {
            tracing::warn!(session_id = %info.id, error = %e, "could not save the session description");
        }
    }

    fn visible(live: &Live, owner: Option<&str>) -> bool {
        match owner {
            None => true,
            Some(o) => live.info.owner.as_deref() == Some(o),
        }
    }

    fn not_found(id: &str) -> Error {
        Error::NotFound(id.to_string())
    }

    pub fn get(&self, id: &str, owner: Option<&str>) -> Result<SessionInfo, Error> {
        let key = key(id, owner)?;
        match Self::ready(&self.lock(), &key, owner) {
            Some(live) => Ok(shown(&live.info, live.busy, owner)),
            None => Err(Self::not_found(id)),
        }
    }

    pub fn list(&self, owner: Option<&str>) -> Vec<SessionInfo> {
        let map = self.lock();
        let mut v: Vec<SessionInfo> = map
            .values()
            .filter(|l| l.phase == Phase::Ready && Self::visible(l, owner))
            .map(|l| shown(&l.info, l.busy, owner))
            .collect();
        v.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        v
    }

    /// Sessions held: ready ones and those being created.
    /// The host uids sessions take, one each ([`crate::uids`]).
    pub fn uid_range(&self) -> std::ops::Range<u32> {
        crate::uids::Ranges::new(self.uid_base, self.max_sessions, None).sessions
    }

    /// The highest host uid a session holds (after [`Manager::recover`], a restart
    /// with a lower `max_sessions` may have brought back one above the range).
    pub fn highest_uid(&self) -> Option<u32> {
        self.lock().values().map(|l| l.info.uid).max()
    }

    pub fn count(&self) -> usize {
        self.lock().values().filter(|l| l.phase != Phase::Closing).count()
    }

    /// [`Manager::count`] by mode (for `GET /metrics`).
    pub fn count_by_mode(&self) -> [(Mode, usize); 2] {
        let map = self.lock();
        let held = |mode| map.values().filter(|l| l.phase != Phase::Closing && l.info.mode == mode).count();
        [(Mode::Script, held(Mode::Script)), (Mode::Kernel, held(Mode::Kernel))]
    }

    /// Take the session for one run; `session_busy` at once if a run holds it.
    pub fn lease(self: &Arc<Self>, id: &str, owner: Option<&str>) -> Result<Lease, Error> {
        let key = key(id, owner)?;
        let mut map = self.lock();
        match Self::ready(&map, &key, owner) {
            None => return Err(Self::not_found(id)),
            Some(l) if l.busy => return Err(Error::Busy(id.to_string())),
            Some(_) => {}
        }
        self.check_runs(&map, owner)?;
        let Some(live) = Self::ready_mut(&mut map, &key, owner) else { return Err(Self::not_found(id)) };
        let policy = self.policy(Some(&live.info.policy))?;
        let (tx, rx) = watch::channel(false);
        live.busy = true;
        live.cancel = Some(tx);
        let epoch = live.epoch;
        Ok(Lease {
            epoch,
            manager: self.clone(),
            id: key.clone(),
            public_id: id.to_string(),
            uid: live.info.uid,
            policy,
            workspace: self.workspace(&key),
            mode: live.info.mode,
            cancel: rx,
        })
    }

    /// A token's runs going at once must stay below its quota.
    fn check_runs(&self, map: &HashMap<String, Live>, owner: Option<&str>) -> Result<(), Error> {
        let Some(o) = owner else { return Ok(()) };
        let running = map.values().filter(|l| l.cancel.is_some() && l.info.owner.as_deref() == Some(o)).count();
        if running >= self.token_max_runs {
            return Err(Error::TokenMaxRuns(self.token_max_runs));
        }
        Ok(())
    }

    /// `max_runs` if `owner` could not start another run now.
    pub fn check_run_quota(&self, owner: Option<&str>) -> Result<(), Error> {
        self.check_runs(&self.lock(), owner)
    }

    /// Kill the run in flight in session `id`, if any. Returns whether one was.
    pub fn cancel_run(&self, id: &str, owner: Option<&str>) -> Result<bool, Error> {
        let key = key(id, owner)?;
        match Self::ready(&self.lock(), &key, owner) {
            Some(l) => Ok(l.cancel.as_ref().map(|c| c.send(true).is_ok()).unwrap_or(false)),
            None => Err(Self::not_found(id)),
        }
    }

    /// Kill every running run (daemon shutdown).
    pub fn cancel_all(&self) {
        for live in self.lock().values() {
            if let Some(c) = &live.cancel {
                let _ = c.send(true);
            }
        }
    }

    pub fn busy_count(&self) -> usize {
        self.lock().values().filter(|l| l.busy).count()
    }

    /// End every kernel (daemon shutdown).
    pub async fn stop_kernels(&self) {
        self.kernels.stop_all().await;
    }
}

#[cfg(test)]
mod key_tests {
    use super::*;

    #[test]
    fn each_token_has_its_own_id_space_and_the_operator_addresses_keys() {
        let a = "0123456789abcdef0123456789abcdef";
        let b = "fedcba9876543210fedcba9876543210";
        assert_eq!(key("x", Some(a)).unwrap(), "0123456789abcdef.x");
        assert_ne!(key("x", Some(a)).unwrap(), key("x", Some(b)).unwrap());
        assert_eq!(key("x", None).unwrap(), "x");
        assert_eq!(key("0123456789abcdef.x", None).unwrap(), "0123456789abcdef.x");
        // A token cannot name a key, and nobody names a malformed one.
        assert!(matches!(key("0123456789abcdef.x", Some(b)), Err(Error::InvalidId(_))));
        for bad in [
            "0123456789ABCDEF.x",
            "0123.x",
            "0123456789abcdef.",
            "0123456789abcdef.x.y",
            "../x",
            "",
            "S/files/x",
            "a b",
        ] {
            assert!(matches!(key(bad, None), Err(Error::InvalidId(_))), "{bad}");
        }
    }
}
