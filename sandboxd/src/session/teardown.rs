//! Closing a session (DELETE, TTL expiry): it becomes unreachable at once, what
//! holds it is told to let go (its run is killed, uploads stop, response bodies
//! are cut and their connections closed), and once they have, or at the
//! deadline, its kernel, workspace and files go. It counts toward the quotas
//! until then.

use super::{Manager, Phase};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// What still held a session when its teardown's deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    run: bool,
    file_operations: usize,
    bodies: usize,
}

impl Manager {
    /// Close a session: kill its run, if any, and remove its files.
    ///
    /// From the moment it begins, the session is unreachable (`session_not_found`)
    /// while its key stays taken, and counted, until the teardown ends (see
    /// [`Manager::create`]). The teardown runs in a task of its own: a caller that
    /// goes away midway cannot leave it half done.
    pub async fn close(self: &Arc<Self>, id: &str, owner: Option<&str>) -> Result<(), super::Error> {
        let key = super::key(id, owner)?;
        {
            let mut map = self.lock();
            let Some(live) = Self::ready_mut(&mut map, &key, owner) else { return Err(Self::not_found(id)) };
            live.phase = Phase::Closing;
            // Uploads stop, bodies streaming from the workspace are cut.
            live.cut.cancel();
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

    /// Tear down the session `key` (already `Closing`, its holds told to let go):
    /// wait for its run, its file operations and its bodies to end, at most the
    /// teardown deadline, then stop its kernel, unmount (lazily) and remove its
    /// workspace, and free the key. Past the deadline it goes on regardless and
    /// logs what it forced; a run still going then keeps the key (and its uid)
    /// until it ends ([`super::Lease`]).
    async fn teardown(&self, key: &str) {
        let deadline = tokio::time::Instant::now() + self.teardown_deadline;
        let forced = loop {
            let notified = self.idle.notified();
            {
                let map = self.lock();
                let Some(live) = map.get(key) else { return };
                if !live.busy && live.users == 0 && live.bodies == 0 {
                    break None;
                }
                if let Some(cancel) = &live.cancel {
                    let _ = cancel.send(true);
                }
                if tokio::time::Instant::now() >= deadline {
                    break Some(Held { run: live.busy, file_operations: live.users, bodies: live.bodies });
                }
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let _ = tokio::time::timeout(left.min(Duration::from_secs(1)), notified).await;
        };
        if let Some(held) = forced {
            tracing::warn!(
                session_id = %key,
                deadline_s = self.teardown_deadline.as_secs_f64(),
                run_going = held.run,
                file_operations = held.file_operations,
                bodies = held.bodies,
                "the session's teardown passed its deadline with these still holding it: forcing it (its kernel killed, its workspace unmounted lazily and removed)"
            );
        }
        self.kernels.stop(key).await;
        let dir = self.session_dir(key);
        // Not while a use is still mounting it.
        let mount = self.lock().get(key).map(|l| l.mount.clone());
        let _mounting = match &mount {
            Some(m) => Some(m.lock().await),
            None => None,
        };
        if let Err(e) = self.storage.unmount(&dir).await {
            tracing::warn!(session_id = %key, error = %e, "could not unmount the session's workspace");
        }
        let removed = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&dir)).await;
        if let Ok(Err(e)) = removed {
            tracing::warn!(session_id = %key, error = %e, "could not remove the session's files");
        }
        {
            let mut map = self.lock();
            match map.get_mut(key) {
                Some(live) if live.busy => {
                    live.torn_down = true;
                    tracing::warn!(session_id = %key, "the session's run is still going: its id and uid stay taken until it ends");
                }
                _ => {
                    map.remove(key);
                    tracing::info!(session_id = %key, "session closed");
                }
            }
        }
        self.idle.notify_waiters();
    }

    /// Close idle sessions past their TTL; never a busy one, nor one with a file
    /// operation going on. A download in progress does not keep a session: its
    /// body is cut.
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
            .map(|l| super::key_of(&l.info))
            .collect();
        for id in expired {
            tracing::info!(session_id = %id, "session expired");
            let _ = self.close(&id, None).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{dir, KEY_A, OWNER};
    use super::super::Live;
    use super::*;
    use crate::model::session::Mode;
    use crate::storage::fake::Dirs;

    fn manager(dir: &std::path::Path, max: usize, deadline: Duration) -> Arc<Manager> {
        let storage = Arc::new(Dirs::default());
        Arc::new(super::super::testing::manager(dir, &storage, max).with_teardown_deadline(deadline))
    }

    /// A ready session, as if made (its workspace is not mounted: the teardown's
    /// unmount has nothing to do, its removal removes the directory).
    fn ready(m: &Manager, id: &str) {
        let info = super::super::testing::info(id, Some(OWNER.into()), 600_000);
        std::fs::create_dir_all(m.session_dir(&super::super::key_of(&info))).unwrap();
        let live = Live::new(info.clone(), SystemTime::now(), Phase::Ready, m.next_epoch());
        m.lock().insert(super::super::key_of(&info), live);
    }

    fn reserve(m: &Manager, id: &str) -> Result<Option<super::super::SessionInfo>, super::super::Error> {
        let policy = m.policy(None).unwrap();
        m.reserve(&super::super::key(id, Some(OWNER)).unwrap(), id, &policy, Mode::Script, None, Some(OWNER))
    }

    #[tokio::test]
    async fn a_session_being_closed_counts_until_its_teardown_has_ended() {
        let dir = tempfile::tempdir().unwrap();
        let m = manager(dir.path(), 2, Duration::from_secs(30));
        ready(&m, "a");
        ready(&m, "b");
        // A file operation holds "a": its teardown waits for it.
        let hold = m.open("a", Some(OWNER)).unwrap().hold;
        let closing = tokio::spawn({
            let m = m.clone();
            async move { m.close("a", Some(OWNER)).await }
        });
        while m.lock().get(&super::super::key("a", Some(OWNER)).unwrap()).is_some_and(|l| l.phase != Phase::Closing) {
            tokio::task::yield_now().await;
        }
        assert!(hold.cut().is_cancelled(), "the teardown told its holds to let go");
        let refused = reserve(&m, "c").unwrap_err();
        assert!(matches!(refused, super::super::Error::TokenMaxSessions { max: 2, closing: 1 }), "{refused:?}");
        assert!(refused.to_string().contains("1 of them still being closed"), "{refused}");
        drop(hold);
        closing.await.unwrap().unwrap();
        assert!(reserve(&m, "c").unwrap().is_some());
    }

    #[tokio::test]
    async fn a_teardown_past_its_deadline_is_forced_and_late_holds_touch_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let m = manager(dir.path(), 4, Duration::from_millis(200));
        ready(&m, "a");
        let key = super::super::key("a", Some(OWNER)).unwrap();
        let stuck = m.open("a", Some(OWNER)).unwrap().hold;
        let started = tokio::time::Instant::now();
        m.close("a", Some(OWNER)).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(200) && started.elapsed() < Duration::from_secs(5));
        assert!(m.lock().get(&key).is_none(), "forced: the key is free");
        assert!(!m.session_dir(&key).exists(), "its files are gone");
        // A new session of the key; the stuck hold of the old one lets go late.
        ready(&m, "a");
        let fresh = m.open("a", Some(OWNER)).unwrap().hold;
        drop(stuck);
        assert_eq!(m.lock().get(&key).map(|l| l.users), Some(1), "the new session's count is its own");
        drop(fresh);

        // A run that outlives the deadline: its key (and uid) stay taken, and
        // counted, until its lease drops.
        let lease = m.lease("a", Some(OWNER)).unwrap().mount().await.unwrap();
        m.close("a", Some(OWNER)).await.unwrap();
        assert!(m.lock().get(&key).is_some_and(|l| l.torn_down && l.phase == Phase::Closing));
        assert!(!m.session_dir(&key).exists());
        drop(lease);
        assert!(m.lock().get(&key).is_none());
    }

    #[tokio::test]
    async fn a_close_unmounts_and_removes_the_workspace_and_frees_the_id() {
        let state = tempfile::tempdir().unwrap();
        let storage = Arc::new(Dirs::default());
        let m = Arc::new(super::super::testing::manager(state.path(), &storage, 4));
        m.create(Some("a".into()), None, Mode::Script, None, Some(OWNER)).await.unwrap();
        drop(m.lease("a", Some(OWNER)).unwrap().mount().await.unwrap());
        assert!(!storage.mounted().is_empty());
        let theirs = m.close("a", Some("fedcba9876543210fedcba9876543210")).await;
        assert!(matches!(theirs, Err(super::super::Error::NotFound(_))), "another token cannot close it");
        m.close("a", Some(OWNER)).await.unwrap();
        assert!(matches!(m.get("a", Some(OWNER)), Err(super::super::Error::NotFound(_))));
        assert!(storage.mounted().is_empty());
        assert!(!dir(state.path(), KEY_A).exists());
        assert_eq!(m.count(), 0);
        assert!(matches!(m.close("a", Some(OWNER)).await, Err(super::super::Error::NotFound(_))));
        m.create(Some("a".into()), None, Mode::Script, None, Some(OWNER)).await.unwrap();
    }

    #[tokio::test]
    async fn only_idle_sessions_past_their_ttl_are_reaped() {
        let state = tempfile::tempdir().unwrap();
        let storage = Arc::new(Dirs::default());
        let m = Arc::new(super::super::testing::manager(state.path(), &storage, 8));
        for id in ["idle", "running", "reading", "downloading", "fresh"] {
            m.create(Some(id.into()), None, Mode::Script, Some(5), Some(OWNER)).await.unwrap();
        }
        let key = |id: &str| super::super::key(id, Some(OWNER)).unwrap();
        let long_ago = SystemTime::now() - Duration::from_secs(60);
        for id in ["idle", "running", "reading", "downloading"] {
            m.lock().get_mut(&key(id)).unwrap().last_used = long_ago;
        }
        let lease = m.lease("running", Some(OWNER)).unwrap().mount().await.unwrap();
        let reading = m.open("reading", Some(OWNER)).unwrap().hold;
        let body = m.open("downloading", Some(OWNER)).unwrap().hold.for_body();
        let reaping = tokio::spawn({
            let m = m.clone();
            async move { m.reap_expired().await }
        });
        // A download does not keep its session: its body is cut, then dropped.
        body.cut().cancelled().await;
        drop(body);
        reaping.await.unwrap();
        let mut left: Vec<String> = m.list(Some(OWNER)).into_iter().map(|i| i.id).collect();
        left.sort();
        assert_eq!(left, ["fresh", "reading", "running"]);
        assert!(!dir(state.path(), &key("idle")).exists() && !dir(state.path(), &key("downloading")).exists());
        drop((lease, reading));
    }
}
