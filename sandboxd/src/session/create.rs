//! Making a session: its id reserved under the quotas (and the state
//! directory's room), then its directory and description made, and only then
//! ready. Its workspace is made at its first use (`mounts.rs`): a session held
//! but not used costs a directory and its description.

use super::{key, new_id, rfc3339, shown, validate_id, Error, Live, Manager, Phase, TEARDOWN_WAIT};
use crate::model::policy::Policy;
use crate::model::session::{Mode, SessionInfo};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

impl Manager {
    /// Make a new session. `owner` is the caller's token identity, if any.
    ///
    /// A key whose earlier session is still being torn down stays taken until
    /// that ends: the create waits for it (at most [`TEARDOWN_WAIT`], then
    /// `session_exists`). The session is reachable only once its directory and
    /// description are made; the work runs in a task of its own, so a caller that
    /// goes away midway cannot leave the key reserved.
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
        let made = tokio::spawn(async move { this.make_session(&key, &info).await.map(|()| info) }).await;
        let info = made.map_err(|e| Error::Workspace(std::io::Error::other(e)))??;
        Ok(shown(&info, false, 0, owner))
    }

    /// Make the directory of the reserved `key` and its description, then make it
    /// ready; on failure, remove what was made and free the key.
    async fn make_session(&self, key: &str, info: &SessionInfo) -> Result<(), Error> {
        let dir = self.session_dir(key);
        if dir.exists() {
            // What a failed teardown left of an earlier session of this key: the
            // key is ours now, so nothing else uses it.
            tracing::warn!(session_id = %key, "removing what an earlier session of this id left");
            let _ = self.storage.unmount(&dir).await;
            let _ = std::fs::remove_dir_all(&dir);
        }
        let made = std::fs::create_dir(&dir).and_then(|()| self.storage.prepare(&dir, info.uid));
        if let Err(e) = made {
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
        // The quotas, which count sessions still being torn down (`quota.rs`).
        self.check_sessions(&map, owner)?;
        self.check_storage(&map, policy)?;
        // A uid of the sessions' range that no session holds (a closing one's
        // processes may still run as its own): never one of the pool's.
        let range = self.uid_range();
        let mut used = vec![false; range.len()];
        for l in map.values() {
            if let Some(taken) = l.info.uid.checked_sub(range.start).and_then(|i| used.get_mut(i as usize)) {
                *taken = true;
            }
        }
        let uid = crate::uids::free(range.clone(), |u| used[(u - range.start) as usize]).ok_or_else(|| {
            let closing = map.values().filter(|l| l.phase == Phase::Closing).count();
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
            disk_bytes: 0,
        };
        // Reserved, unreachable by any route until its directory is made.
        let mut live = Live::new(info.clone(), now, Phase::Creating, self.next_epoch());
        live.room = policy.workspace_bytes().saturating_add(policy.layer_bytes());
        map.insert(key.to_string(), live);
        Ok(Some(info))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{dir, manager, KEY_A, OTHER, OWNER};
    use super::*;
    use crate::storage::fake::Dirs;

    #[tokio::test]
    async fn a_session_is_made_and_recorded_then_found_by_its_owner_only() {
        let state = tempfile::tempdir().unwrap();
        let storage = Arc::new(Dirs::default());
        let m = Arc::new(manager(state.path(), &storage, 4));
        let info = m.create(Some("a".into()), None, Mode::Kernel, Some(120), Some(OWNER)).await.unwrap();
        assert_eq!(
            (info.id.as_str(), info.mode, info.policy.as_str(), info.ttl_s, info.owner.as_deref(), info.busy),
            ("a", Mode::Kernel, "default", 120, Some(OWNER), false)
        );
        assert!(m.uid_range().contains(&info.uid), "{}", info.uid);
        let dir = dir(state.path(), KEY_A);
        // Nothing is mounted or made before its first use (`mounts.rs`).
        assert!(storage.mounted().is_empty() && !dir.join("workspace.img").exists());
        let stored: SessionInfo = serde_json::from_slice(&std::fs::read(dir.join("session.json")).unwrap()).unwrap();
        assert_eq!((stored.id.as_str(), stored.uid, stored.owner.as_deref()), ("a", info.uid, Some(OWNER)));
        // Its token finds it by id, the operator by key, another token not at all.
        assert_eq!(m.get("a", Some(OWNER)).unwrap().id, "a");
        assert_eq!(m.get(KEY_A, None).unwrap().id, KEY_A);
        assert!(matches!(m.get("a", Some(OTHER)), Err(Error::NotFound(id)) if id == "a"));
        assert_eq!(m.workspace(&key("a", Some(OWNER)).unwrap()), dir.join("data"));
        // The same id again is refused; another token's `a` is its own.
        let again = m.create(Some("a".into()), None, Mode::Script, None, Some(OWNER)).await;
        assert!(matches!(again, Err(Error::Exists(id)) if id == "a"));
        let theirs = m.create(Some("a".into()), None, Mode::Script, None, Some(OTHER)).await.unwrap();
        assert_ne!(theirs.uid, info.uid, "each session its own uid");
        assert_eq!(m.count(), 2);
    }

    #[tokio::test]
    async fn bad_arguments_are_refused_and_make_nothing() {
        let state = tempfile::tempdir().unwrap();
        let storage = Arc::new(Dirs::default());
        let m = Arc::new(manager(state.path(), &storage, 4));
        let bad_id = m.create(Some("a b".into()), None, Mode::Script, None, Some(OWNER)).await;
        assert!(matches!(bad_id, Err(Error::InvalidId(id)) if id == "a b"));
        for ttl in [0, 30 * 86400 + 1] {
            let bad_ttl = m.create(Some("a".into()), None, Mode::Script, Some(ttl), Some(OWNER)).await;
            assert!(matches!(bad_ttl, Err(Error::InvalidTtl)), "{ttl}");
        }
        let no_policy = m.create(Some("a".into()), Some("nope"), Mode::Script, None, Some(OWNER)).await;
        assert!(
            matches!(no_policy, Err(Error::PolicyNotFound { name, known }) if name == "nope" && known == ["default"])
        );
        assert_eq!(m.count(), 0);
        assert!(storage.mounted().is_empty());
        assert_eq!(std::fs::read_dir(state.path().join("sessions")).unwrap().count(), 0);
        // Without an id, it gets a fresh one.
        let made = m.create(None, None, Mode::Script, None, None).await.unwrap();
        assert_eq!(made.id.len(), 32);
        assert!(made.id.bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[tokio::test]
    async fn a_session_whose_directory_cannot_be_made_is_refused_and_frees_the_id() {
        let state = tempfile::tempdir().unwrap();
        let storage = Arc::new(Dirs::default());
        let m = Arc::new(manager(state.path(), &storage, 4));
        let sessions = state.path().join("sessions");
        std::fs::remove_dir(&sessions).unwrap();
        std::fs::write(&sessions, "not a directory").unwrap();
        let failed = m.create(Some("a".into()), None, Mode::Script, None, Some(OWNER)).await;
        assert!(matches!(&failed, Err(Error::Workspace(e)) if e.raw_os_error() == Some(libc::ENOTDIR)), "{failed:?}");
        assert_eq!(m.count(), 0);
        std::fs::remove_file(&sessions).unwrap();
        std::fs::create_dir(&sessions).unwrap();
        m.create(Some("a".into()), None, Mode::Script, None, Some(OWNER)).await.unwrap();
        assert_eq!(m.count(), 1);
    }
}
