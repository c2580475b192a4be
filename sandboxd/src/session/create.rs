//! Making a session: its id reserved under the quotas (and the state
//! directory's room), then its workspace made and mounted, and only then ready.

use super::{
    key, new_id, rfc3339, shown, storage, validate_id, Error, Live, Manager, Mode, Phase, SessionInfo, TEARDOWN_WAIT,
};
use crate::policy::Policy;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

impl Manager {
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
    pub(super) fn reserve(
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
        // Sessions being torn down still hold their workspace, loop device and
        // uid: they count until their teardown has ended, so churning creates and
        // closes never holds more than the quotas.
        let closing = |l: &Live| l.phase == Phase::Closing;
        if let Some(o) = owner {
            let mine: Vec<&Live> = map.values().filter(|l| l.info.owner.as_deref() == Some(o)).collect();
            if mine.len() >= self.token_max_sessions {
                let closing = mine.iter().filter(|l| closing(l)).count();
                return Err(Error::TokenMaxSessions { max: self.token_max_sessions, closing });
            }
        }
        if map.len() >= self.max_sessions {
            let closing = map.values().filter(|l| closing(l)).count();
            return Err(Error::MaxSessions { max: self.max_sessions, closing });
        }
        self.check_storage(&map, policy)?;
        // A uid of the sessions' range that no session holds (a closing one's
        // processes may still run as its own): never one of the pool's.
        let used: Vec<u32> = map.values().map(|l| l.info.uid).collect();
        let uid = crate::uids::free(self.uid_range(), |u| used.contains(&u)).ok_or_else(|| {
            let closing = map.values().filter(|l| closing(l)).count();
            Error::MaxSessions { max: self.max_sessions, closing }
        })?;
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
        map.insert(key.to_string(), Live::new(info.clone(), now, Phase::Creating, self.next_epoch()));
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
}
