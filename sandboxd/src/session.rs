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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{watch, Notify};

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
    #[error("this token already holds its maximum of {0} sessions (token_max_sessions): close one (DELETE /v1/sessions/ID) or wait for idle ones to expire")]
    TokenMaxSessions(usize),
    #[error("the daemon already holds its maximum of {0} sessions: close one (DELETE /v1/sessions/ID) or wait for idle ones to expire")]
    MaxSessions(usize),
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
    /// File operations going on in the workspace ([`Use`]); a teardown waits for them.
    users: usize,
    /// Set when the teardown begins: an upload in progress stops at its next write.
    closing: Arc<AtomicBool>,
    /// A kernel session taken back after a restart, whose kernel (and variables)
    /// went with the earlier daemon: its next cell says `kernel_restarted`.
    kernel_lost: bool,
}

impl Live {
    fn new(info: SessionInfo, last_used: SystemTime, phase: Phase) -> Live {
        Live {
            info,
            last_used,
            busy: false,
            cancel: None,
            phase,
            users: 0,
            closing: Arc::default(),
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
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Save the session's new last use while it still counts as busy, so a
        // teardown (which waits for that) never races this write.
        let saved = {
            let mut map = self.manager.lock();
            map.get_mut(&self.id).filter(|l| l.phase == Phase::Ready).map(|live| {
                live.last_used = SystemTime::now();
                live.info.last_used_at = rfc3339(live.last_used);
                live.info.clone()
            })
        };
        if let Some(info) = saved {
            self.manager.persist(&info);
        }
        if let Some(live) = self.manager.lock().get_mut(&self.id) {
            live.busy = false;
            live.cancel = None;
        }
        self.manager.idle.notify_waiters();
    }
}

/// One file operation's hold on a ready session's workspace (see
/// [`Manager::open`]): the session's teardown waits until every hold is dropped,
/// so nothing is written into a workspace being unmounted.
pub struct Use {
    manager: Arc<Manager>,
    key: String,
    public_id: String,
    closing: Arc<AtomicBool>,
}

impl Use {
    /// `Err(session_not_found)` once the session's teardown began: stop writing,
    /// the workspace is going away.
    pub fn check(&self) -> Result<(), Error> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(Manager::not_found(&self.public_id));
        }
        Ok(())
    }
}

impl Drop for Use {
    fn drop(&mut self) {
        if let Some(live) = self.manager.lock().get_mut(&self.key) {
            live.users = live.users.saturating_sub(1);
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
        })
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
        let hold =
            Use { manager: self.clone(), key: key.clone(), public_id: id.to_string(), closing: live.closing.clone() };
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

    /// Make a new session. `owner` is the caller's token identity, if any.
    ///
    /// A key whose earlier session is still being torn down stays taken until
    /// that ends: the create waits for it (at most [`TEARDOWN_WAIT`], then
    /// `session_exists`). The session is reachable only once its workspace is
    /// mounted; the work runs in a task of its own, so a caller that goes away
    /// midway cannot leave the key reserved.
    pub async fn create(
        self: &Arc<Self>,
        id: Option<String>,
        policy: Option<&str>,
        mode: Mode,
        ttl_s: Option<u64>,
        owner: Option<&str>,
    ) -> Result<SessionInfo, Error> {
        let policy = self.policy(policy)?;
        // Caller-chosen ids are plain ids in every space: none names another tenant's.
        let id = match id {
            Some(id) => {
                validate_id(&id)?;
                id
            }
            None => new_id(),
        };
        let key = key(&id, owner)?;
        if let Some(ttl) = ttl_s {
            if ttl == 0 || ttl > 30 * 86400 {
                return Err(Error::InvalidTtl);
            }
        }
        let deadline = tokio::time::Instant::now() + TEARDOWN_WAIT;
        let info = loop {
            let torn_down = self.idle.notified();
            if let Some(info) = self.reserve(&key, &id, &policy, mode, ttl_s, owner)? {
                break info;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Exists(id));
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), torn_down).await;
        };
        let this = self.clone();
        let made = tokio::spawn(async move { this.make_workspace(&key, &info, &policy).await.map(|()| info) }).await;
        let info = made.map_err(|e| Error::Workspace(std::io::Error::other(e)))??;
        Ok(shown(&info, false, owner))
    }

    /// Make and mount the workspace of the reserved `key`, then make it ready;
    /// on failure, remove what was made and free the key.
    async fn make_workspace(&self, key: &str, info: &SessionInfo, policy: &Policy) -> Result<(), Error> {
        let dir = self.session_dir(key);
        if dir.exists() {
            // What a failed teardown left of an earlier session of this key: the
            // key is ours now, so nothing else uses it.
            tracing::warn!(session_id = %key, "removing what an earlier session of this id left");
            let _ = storage::unmount(&dir).await;
            let _ = std::fs::remove_dir_all(&dir);
        }
        let made = async {
            std::fs::create_dir_all(&dir)?;
            storage::restrict_dir(&dir, info.uid)?;
            storage::create(&dir, policy.workspace_bytes(), info.uid).await
        }
        .await;
        if let Err(e) = made {
            let _ = storage::unmount(&dir).await;
            let _ = std::fs::remove_dir_all(&dir);
            self.lock().remove(key);
            self.idle.notify_waiters();
            return Err(Error::Workspace(e));
        }
        self.persist(info);
        if let Some(live) = self.lock().get_mut(key) {
            live.phase = Phase::Ready;
        }
        tracing::info!(session_id = %key, policy = %info.policy, "session created");
        Ok(())
    }

    /// Check the limits and reserve `key` with its host uid, under the lock.
    /// `None`: the key's earlier session is still being torn down.
    fn reserve(
        &self,
        key: &str,
        id: &str,
        policy: &Policy,
        mode: Mode,
        ttl_s: Option<u64>,
        owner: Option<&str>,
    ) -> Result<Option<SessionInfo>, Error> {
        let mut map = self.lock();
        match map.get(key).map(|l| l.phase) {
            Some(Phase::Closing) => return Ok(None),
            Some(_) => return Err(Error::Exists(id.to_string())),
            None => {}
        }
        // Sessions being torn down are going: they count for no limit, but their
        // uids stay taken until their processes are gone.
        let counted = || map.values().filter(|l| l.phase != Phase::Closing);
        if let Some(o) = owner {
            let held = counted().filter(|l| l.info.owner.as_deref() == Some(o)).count();
            if held >= self.token_max_sessions {
                return Err(Error::TokenMaxSessions(self.token_max_sessions));
            }
        }
        if counted().count() >= self.max_sessions {
            return Err(Error::MaxSessions(self.max_sessions));
        }
        self.check_storage(&map, policy)?;
        // A uid of the sessions' range no session holds, a closing one included
        // (its processes may still run as it): never one of the pool's.
        let used: Vec<u32> = map.values().map(|l| l.info.uid).collect();
        let uid =
            crate::uids::free(self.uid_range(), |u| used.contains(&u)).ok_or(Error::MaxSessions(self.max_sessions))?;
        let now = SystemTime::now();
        let info = SessionInfo {
            id: id.to_string(),
            mode,
            policy: policy.name.clone(),
            created_at: rfc3339(now),
            last_used_at: rfc3339(now),
            ttl_s: ttl_s.unwrap_or(self.default_ttl_s),
            owner: owner.map(str::to_string),
            uid,
            busy: false,
        };
        // Reserved, unreachable by any route until its workspace is mounted.
        map.insert(key.to_string(), Live::new(info.clone(), now, Phase::Creating));
        Ok(Some(info))
    }

    /// Refuse a new session of `policy` when the state directory's filesystem could
    /// not hold every session's workspace filled up (images are sparse: each can
    /// still grow by its size less what it already takes), this one included, with
    /// each session's run records ([`crate::records::RESERVE`]).
    fn check_storage(&self, map: &HashMap<String, Live>, policy: &Policy) -> Result<(), Error> {
        // A filesystem that cannot say (or a failure to ask) refuses nothing.
        let Ok(fs) = nix::sys::statvfs::statvfs(&self.dir) else { return Ok(()) };
        let free = fs.blocks_available().saturating_mul(fs.fragment_size());
        let per_session = crate::records::RESERVE;
        let held: u64 = map
            .iter()
            .filter(|(_, l)| l.phase != Phase::Closing)
            .map(|(key, l)| {
                // The image's own size (its policy may have changed since it was
                // made), less what it already takes; one not made yet, its policy's.
                let room = match std::fs::metadata(self.session_dir(key).join(storage::IMAGE)) {
                    Ok(m) => m.len().saturating_sub(std::os::unix::fs::MetadataExt::blocks(&m).saturating_mul(512)),
                    Err(_) => self.policies.get(&l.info.policy).map(|p| p.workspace_bytes()).unwrap_or(0),
                };
                room.saturating_add(per_session)
            })
            .sum();
        let wanted = policy.workspace_bytes().saturating_add(per_session);
        if held.saturating_add(wanted) > free {
            const MIB: u64 = 1024 * 1024;
            return Err(Error::InsufficientStorage {
                free_mb: free / MIB,
                held_mb: held.div_ceil(MIB),
                wanted_mb: wanted.div_ceil(MIB),
                policy: policy.name.clone(),
            });
        }
        Ok(())
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
        Ok(Lease {
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

    /// Close a session: kill its run, if any, and remove its files.
    ///
    /// From the moment it begins, the session is unreachable (`session_not_found`)
    /// while its key stays taken until the teardown ends (see [`Manager::create`]).
    /// The teardown runs in a task of its own: a caller that goes away midway
    /// cannot leave it half done.
    pub async fn close(self: &Arc<Self>, id: &str, owner: Option<&str>) -> Result<(), Error> {
        let key = key(id, owner)?;
        {
            let mut map = self.lock();
            let Some(live) = Self::ready_mut(&mut map, &key, owner) else { return Err(Self::not_found(id)) };
            live.phase = Phase::Closing;
            live.closing.store(true, Ordering::SeqCst);
            if let Some(cancel) = &live.cancel {
                let _ = cancel.send(true);
            }
        }
        let this = self.clone();
        if let Err(e) = tokio::spawn(async move { this.teardown(&key).await }).await {
            tracing::error!(session_id = %id, error = %e, "the session's teardown failed");
        }
        Ok(())
    }

    /// Tear down the session `key` (already `Closing`): wait for its run (told to
    /// die) and its file operations to end, stop its kernel, unmount and remove
    /// its workspace, then free the key.
    async fn teardown(&self, key: &str) {
        loop {
            let notified = self.idle.notified();
            {
                let map = self.lock();
                let Some(live) = map.get(key) else { return };
                if !live.busy && live.users == 0 {
                    break;
                }
                if let Some(cancel) = &live.cancel {
                    let _ = cancel.send(true);
                }
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
        }
        self.kernels.stop(key).await;
        let dir = self.session_dir(key);
        if let Err(e) = storage::unmount(&dir).await {
            tracing::warn!(session_id = %key, error = %e, "could not unmount the session's workspace");
        }
        let removed = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&dir)).await;
        if let Ok(Err(e)) = removed {
            tracing::warn!(session_id = %key, error = %e, "could not remove the session's files");
        }
        self.lock().remove(key);
        self.idle.notify_waiters();
        tracing::info!(session_id = %key, "session closed");
    }

    /// Close idle sessions past their TTL; never a busy one.
    pub async fn reap_expired(self: &Arc<Self>) {
        let now = SystemTime::now();
        let expired: Vec<String> = self
            .lock()
            .values()
            .filter(|l| {
                l.phase == Phase::Ready
                    && !l.busy
                    && l.users == 0
                    && now.duration_since(l.last_used).unwrap_or_default() > Duration::from_secs(l.info.ttl_s)
            })
            .map(|l| key_of(&l.info))
            .collect();
        for id in expired {
            tracing::info!(session_id = %id, "session expired");
            let _ = self.close(&id, None).await;
        }
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

    /// Take back the sessions an earlier instance left (mounting their workspaces),
    /// and remove expired ones and any mount that belongs to no session.
    pub async fn recover(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return 0 };
        let now = SystemTime::now();
        let mut taken = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            let info: Option<SessionInfo> =
                std::fs::read(path.join("session.json")).ok().and_then(|b| serde_json::from_slice(&b).ok());
            // A session is kept only in the directory named by its key.
            let info = info.filter(|i| {
                validate_id(&i.id).is_ok()
                    && i.owner.as_deref().is_none_or(|o| o.len() == 32 && o.bytes().all(|b| b.is_ascii_hexdigit()))
                    && path.file_name() == Some(std::ffi::OsStr::new(&key_of(i)))
            });
            let keep = info.filter(|i| {
                let last_used = humantime::parse_rfc3339(&i.last_used_at).unwrap_or(UNIX_EPOCH);
                now.duration_since(last_used).unwrap_or_default() <= Duration::from_secs(i.ttl_s)
                    && self.policies.contains_key(&i.policy)
            });
            let mounted = match &keep {
                Some(i) => match storage::mount(&path).await {
                    // An earlier version left wider modes: fix them before serving.
                    Ok(()) => storage::restrict(&path, i.uid),
                    Err(e) => Err(e),
                },
                None => Err(std::io::Error::other("expired or invalid")),
            };
            match (keep, mounted) {
                (Some(info), Ok(())) => {
                    let last_used = humantime::parse_rfc3339(&info.last_used_at).unwrap_or(UNIX_EPOCH);
                    // Runs the earlier daemon had going ended with it.
                    let records = Records::of(&path);
                    match records.interrupt_running() {
                        Ok(0) => {}
                        Ok(n) => {
                            tracing::info!(session_id = %key_of(&info), runs = n, "runs cut off by the earlier daemon's end are marked interrupted")
                        }
                        Err(e) => {
                            tracing::warn!(session_id = %key_of(&info), error = %e, "could not mark the session's interrupted runs")
                        }
                    }
                    let mut live = Live::new(info, last_used, Phase::Ready);
                    // A kernel session whose kernel ever started had variables: gone.
                    live.kernel_lost = live.info.mode == Mode::Kernel && path.join(KERNEL_STARTED).exists();
                    self.lock().insert(key_of(&live.info), live);
                    taken += 1;
                }
                (_, result) => {
                    if let Err(e) = result {
                        tracing::info!(path = %path.display(), reason = %e, "removing a session left by an earlier run");
                    }
                    let _ = storage::unmount(&path).await;
                    let _ = std::fs::remove_dir_all(&path);
                }
            }
        }
        for stray in storage::mounted_below(&self.dir) {
            if let Some(session) = stray.parent() {
                let known = session.file_name().and_then(|n| n.to_str()).is_some_and(|id| self.lock().contains_key(id));
                if !known {
                    let _ = storage::unmount(session).await;
                }
            }
        }
        taken
    }

    /// End every kernel (daemon shutdown).
    pub async fn stop_kernels(&self) {
        self.kernels.stop_all().await;
    }

    /// Unmount every workspace (daemon shutdown); their files stay in the images.
    pub async fn unmount_all(&self) {
        let ids: Vec<String> = self.lock().keys().cloned().collect();
        for id in ids {
            if let Err(e) = storage::unmount(&self.session_dir(&id)).await {
                tracing::warn!(session_id = %id, error = %e, "could not unmount a workspace");
            }
        }
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
