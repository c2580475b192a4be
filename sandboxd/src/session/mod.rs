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
//!
//! This file holds the manager, its live state and the one lookup every route
//! goes through (`Manager::ready`); beside it, one file per role: `key.rs` (ids,
//! tenant keys), `lease.rs` (a run's [`Lease`], a file operation's [`Use`]),
//! `mounts.rs` (a workspace mounted at its session's use, unmounted when idle),
//! `quota.rs` (sessions and runs held, the state directory's room), `create.rs`,
//! `teardown.rs` (close, expiry) and `recover.rs` (restart, shutdown).

use crate::model::policy::Policy;
use crate::model::session::SessionInfo;
use crate::records::Records;
use crate::storage::{self, Storage};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

mod create;
mod key;
mod lease;
mod mounts;
mod quota;
mod recover;
pub mod secrets;
mod teardown;
#[cfg(test)]
mod testing;

pub use key::{key, new_id, rfc3339, validate_id};
use key::{key_of, shown};
pub use lease::{Lease, Opened, Taken, Use};
use quota::closing_note;

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
    /// `room_mb`: what the images may add up to (`free_mb` times `workspace_overcommit`).
    #[error("the state directory's filesystem has {free_mb} MiB free{}, but the sessions held could grow by {held_mb} MiB and this one needs {wanted_mb} MiB (its workspace, package layer, run records and conversations; policy {policy:?}): close sessions you no longer need, free disk space, use a policy with a smaller workspace_mb or packages_mb, or raise workspace_overcommit", overcommitted(*free_mb, *room_mb))]
    InsufficientStorage { free_mb: u64, room_mb: u64, held_mb: u64, wanted_mb: u64, policy: String },
    /// The session's workspace could not be made or mounted (a host failure, or
    /// the host disk full: `StorageFull`).
    #[error("making or mounting the session's workspace: {0}")]
    Workspace(std::io::Error),
    /// A secret the session cannot take; the text says why.
    #[error("{0}")]
    InvalidSecret(String),
    #[error(
        "session {session:?} has no secret {name:?} of its own: list them with GET /v1/sessions/{session}/secrets"
    )]
    SecretNotFound { session: String, name: String },
    /// The state directory's filesystem could not hold a new package layer full,
    /// with every session's images full too.
    #[error("the state directory's filesystem has {free_mb} MiB free{}, the sessions' workspaces and package layers may take {held_mb} MiB of it, and this session's package layer may hold {wanted_mb} MiB (policy {policy:?}'s packages_mb): free disk space, close sessions, use a policy with a smaller packages_mb, or raise workspace_overcommit", overcommitted(*free_mb, *room_mb))]
    LayerNoRoom { free_mb: u64, room_mb: u64, held_mb: u64, wanted_mb: u64, policy: String },
    /// The session's package layer could not be made (a host failure).
    #[error("making the session's package layer: {0}")]
    Layer(std::io::Error),
}

/// How a storage refusal names the room `workspace_overcommit` gives beyond
/// what is free.
fn overcommitted(free_mb: u64, room_mb: u64) -> String {
    match room_mb > free_mb {
        true => format!(" (sessions' images may add up to {room_mb} MiB: workspace_overcommit)"),
        false => String::new(),
    }
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
    /// Its secrets' placeholders, and its own secrets (memory only).
    secrets: secrets::Held,
    /// Whether its workspace is mounted now; held while it is being mounted or
    /// unmounted (`mounts.rs`).
    mount: Arc<tokio::sync::Mutex<bool>>,
    /// When a run or file operation last used it: its workspace is unmounted
    /// once this is `workspace_idle_unmount_s` ago.
    used_at: SystemTime,
    /// How much more of the host disk its images may take, as last seen
    /// ([`Storage::room`]); before they are made, its policy's sizes.
    room: u64,
    /// How much of the host disk its images take, as last seen ([`Storage::taken`]).
    taken: u64,
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
            secrets: secrets::Held::default(),
            mount: Arc::new(tokio::sync::Mutex::new(false)),
            used_at: last_used,
            room: 0,
            taken: 0,
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
    /// Live kernels of kernel-mode sessions, by key: a cell takes its session's
    /// out through its [`Lease`] and puts it back; the teardown stops it.
    kernels: crate::kernel::Kernels,
    /// Most sessions one token holds, and runs it has going, at once.
    token_max_sessions: usize,
    token_max_runs: usize,
    /// The next [`Live::epoch`].
    epochs: AtomicU64,
    /// Longest a teardown waits for what holds the session before it forces it.
    teardown_deadline: Duration,
    /// Where workspaces are made and mounted ([`storage::LoopImages`] but in tests).
    storage: Arc<dyn Storage>,
    /// Every policy's secrets, their values read at start ([`secrets::resolve`]).
    policy_secrets: secrets::PolicySecrets,
    /// Held while a package layer is made ([`Manager::package_layer`]).
    making_layer: tokio::sync::Mutex<()>,
    /// The level of the host disk's last sharing among the mounted images
    /// ([`Manager::share_disk`]): what an image mounted since may have free.
    disk_level: AtomicU64,
    /// One sharing of the host disk at a time ([`Manager::share_disk`]).
    sharing: tokio::sync::Mutex<()>,
    /// How many times the room the state directory's filesystem has free the
    /// sessions' images may add up to (`workspace_overcommit`: images are sparse).
    overcommit: f64,
}

/// Room on disk a session's own state may take beside its images: its run
/// records and its conversations. Every session's storage reservation counts it.
pub const STATE_RESERVE: u64 = crate::records::RESERVE + crate::conversations::RESERVE;

/// In a session's directory: the session has had a kernel (so a restart lost one).
const KERNEL_STARTED: &str = "kernel-started";

/// Longest a create of a key waits for that key's teardown to end.
const TEARDOWN_WAIT: Duration = Duration::from_secs(60);

/// Longest a teardown waits for the session's run, file operations and bodies to
/// let go before it forces its way ([`Manager::with_teardown_deadline`]).
pub const TEARDOWN_DEADLINE: Duration = Duration::from_secs(15);

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
            storage: Arc::new(storage::LoopImages::new(state_dir.join("blank-images"))),
            policy_secrets: secrets::PolicySecrets::new(),
            making_layer: tokio::sync::Mutex::new(()),
            disk_level: AtomicU64::new(u64::MAX),
            sharing: tokio::sync::Mutex::new(()),
            overcommit: 1.0,
        })
    }

    /// Give sessions their policies' secrets (read at start: [`secrets::resolve`]).
    pub fn with_secrets(mut self, secrets: secrets::PolicySecrets) -> Manager {
        self.policy_secrets = secrets;
        self
    }

    /// Keep workspaces in `storage` instead of loop-mounted images (unit tests:
    /// `storage::fake::Dirs`).
    pub fn with_storage(mut self, storage: Arc<dyn Storage>) -> Manager {
        self.storage = storage;
        self
    }

    /// Let the sessions' images add up to `overcommit` times the room the state
    /// directory's filesystem has free (at least 1).
    pub fn with_overcommit(mut self, overcommit: f64) -> Manager {
        self.overcommit = overcommit.max(1.0);
        self
    }

    /// Set how long a teardown waits before it forces its way.
    pub fn with_teardown_deadline(mut self, deadline: Duration) -> Manager {
        self.teardown_deadline = deadline;
        self
    }

    fn next_epoch(&self) -> u64 {
        self.epochs.fetch_add(1, Ordering::Relaxed)
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

    /// The package layer of the session with this key, made now if its policy
    /// allows packages and it has none yet (mounted again if an earlier use made
    /// it and it is not mounted now); `None` when the policy allows none.
    /// Called under the session's [`Lease`] (`epoch` its session's): one run or
    /// install at a time makes it. Made at the session's first run (any run may
    /// write into it: `pip install` in its code), and from then on counted as the
    /// workspace is, full: one is made only while the state directory's filesystem
    /// could hold it full with every session's images full too
    /// ([`Manager::held_storage`]), else [`Error::LayerNoRoom`] (a run goes on
    /// without one; an install is refused).
    ///
    /// As a workspace's mount (`mounts.rs`), it is made under the session's mount
    /// lock, in a task of its own, and only while the session is still the one
    /// leased and ready: a teardown that unmounts it waits for it, and one that
    /// began first is never followed by a layer mounted for nobody.
    pub async fn package_layer(
        self: &Arc<Self>,
        key: &str,
        epoch: u64,
        uid: u32,
        policy: &Policy,
    ) -> Result<Option<PathBuf>, Error> {
        if !policy.packages_enabled() {
            return Ok(None);
        }
        let dir = self.session_dir(key);
        if self.storage.has_layer(&dir) {
            return Ok(Some(dir.join(storage::LAYER)));
        }
        let Some(mount) = self.lock().get(key).filter(|l| l.epoch == epoch).map(|l| l.mount.clone()) else {
            return Err(Self::not_found(mounts::shown_id(key)));
        };
        let (this, key, size, name) =
            (self.clone(), key.to_string(), policy.packages_mb * 1024 * 1024, policy.name.clone());
        let task = tokio::spawn(async move {
            let _mounted = mount.lock_owned().await;
            let live = this.lock().get(&key).is_some_and(|l| l.epoch == epoch && l.phase == Phase::Ready);
            if !live {
                return Err(Self::not_found(mounts::shown_id(&key)));
            }
            let dir = this.session_dir(&key);
            if this.storage.has_layer(&dir) {
                return Ok(());
            }
            if this.storage.has_layer_image(&dir) {
                // Made by an earlier use: mounted again, counted already.
                this.storage.open_layer(&dir, size, uid).await.map_err(Error::Layer)?;
                this.share_disk().await;
                return Ok(());
            }
            // One at a time: each counts the ones made before it.
            let _one = this.making_layer.lock().await;
            if let Some(free) = this.storage.free(&this.dir) {
                let held = this.held_storage(&this.lock());
                let room = this.capacity(free);
                if held.saturating_add(size) > room {
                    const MIB: u64 = 1024 * 1024;
                    return Err(Error::LayerNoRoom {
                        free_mb: free / MIB,
                        room_mb: room / MIB,
                        held_mb: held.div_ceil(MIB),
                        wanted_mb: size / MIB,
                        policy: name,
                    });
                }
            }
            this.storage.open_layer(&dir, size, uid).await.map_err(Error::Layer)?;
            // Shared with the others before anything writes into it.
            this.share_disk().await;
            tracing::info!(session_id = %key, size_mb = size / (1024 * 1024), "the session's package layer was made");
            Ok(())
        });
        task.await.map_err(|e| Error::Layer(std::io::Error::other(e)))??;
        Ok(Some(dir.join(storage::LAYER)))
    }

    /// The run records of the session with this key (they go with its directory).
    pub fn records(&self, key: &str) -> Records {
        Records::of(&self.session_dir(key))
    }

    /// The conversations of the session with this key (they go with its directory).
    pub fn chats(&self, key: &str) -> crate::conversations::Chats {
        crate::conversations::Chats::of(&self.session_dir(key))
    }

    /// Note on disk that session `key` has had a kernel (its variables would be lost
    /// with the daemon: see [`Manager::take_kernel_lost`]); a cell's [`Lease`] does.
    fn mark_kernel_started(&self, key: &str) {
        let mark = self.session_dir(key).join(KERNEL_STARTED);
        let made = std::fs::OpenOptions::new().write(true).create(true).truncate(false).mode(0o600).open(&mark);
        if let Err(e) = made {
            tracing::warn!(session_id = %key, error = %e, "could not note that the session's kernel started");
        }
    }

    /// Whether session `key`'s kernel went with an earlier daemon and no cell has
    /// said so yet; the answer is given once (to a cell's [`Lease`]).
    fn take_kernel_lost(&self, key: &str) -> bool {
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
            Some(live) => Ok(shown(&live.info, live.busy, live.taken, owner)),
            None => Err(Self::not_found(id)),
        }
    }

    pub fn list(&self, owner: Option<&str>) -> Vec<SessionInfo> {
        let map = self.lock();
        let mut v: Vec<SessionInfo> = map
            .values()
            .filter(|l| l.phase == Phase::Ready && Self::visible(l, owner))
            .map(|l| shown(&l.info, l.busy, l.taken, owner))
            .collect();
        v.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        v
    }

    /// The host uids sessions take, one each ([`crate::uids`]).
    pub fn uid_range(&self) -> std::ops::Range<u32> {
        crate::uids::Ranges::new(self.uid_base, self.max_sessions, None).sessions
    }

    /// The host uids sessions hold (after [`Manager::recover`], a restart with
    /// another `uid_base` or a lower `max_sessions` may have brought back some
    /// outside the range).
    pub fn uids(&self) -> Vec<u32> {
        self.lock().values().map(|l| l.info.uid).collect()
    }

    /// End every kernel (daemon shutdown).
    pub async fn stop_kernels(&self) {
        self.kernels.stop_all().await;
    }
}
