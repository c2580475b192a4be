//! What a session or a run may take: sessions held (daemon-wide and per token),
//! a token's runs going at once, and the state directory's room for every
//! session's workspace filled up. Sessions being torn down still hold their
//! workspace, loop device and uid: they count until their teardown has ended, so
//! churning creates and closes never holds more than the quotas.

use super::{Error, Live, Manager, Phase};
use crate::model::policy::Policy;
use crate::model::session::Mode;
use std::collections::HashMap;

/// How a quota refusal names the sessions that still count while torn down.
pub(super) fn closing_note(closing: usize) -> String {
    match closing {
        0 => String::new(),
        n => format!(", {n} of them still being closed (retry in a moment)"),
    }
}

impl Manager {
    /// Set the per-token quotas (each at most `max_sessions`).
    pub fn with_token_quotas(mut self, sessions: usize, runs: usize) -> Manager {
        self.token_max_sessions = sessions.clamp(1, self.max_sessions);
        self.token_max_runs = runs.clamp(1, self.max_sessions);
        self
    }

    /// A new session for `owner` must stay within its token's quota and the
    /// daemon's; sessions being closed count.
    pub(super) fn check_sessions(&self, map: &HashMap<String, Live>, owner: Option<&str>) -> Result<(), Error> {
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
        Ok(())
    }

    /// Refuse a new session of `policy` when the state directory's filesystem could
    /// not hold every session's workspace filled up (images are sparse: each can
    /// still grow by its size less what it already takes), this one included, with
    /// each session's run records and conversations ([`crate::session::STATE_RESERVE`]).
    pub(super) fn check_storage(&self, map: &HashMap<String, Live>, policy: &Policy) -> Result<(), Error> {
        // A filesystem that cannot say (or a failure to ask) refuses nothing.
        let Some(free) = self.storage.free(&self.dir) else { return Ok(()) };
        let held = self.held_storage(map);
        let wanted =
            policy.workspace_bytes().saturating_add(policy.layer_bytes()).saturating_add(crate::session::STATE_RESERVE);
        let room = self.capacity(free);
        if held.saturating_add(wanted) > room {
            const MIB: u64 = 1024 * 1024;
            return Err(Error::InsufficientStorage {
                free_mb: free / MIB,
                room_mb: room / MIB,
                held_mb: held.div_ceil(MIB),
                wanted_mb: wanted.div_ceil(MIB),
                policy: policy.name.clone(),
            });
        }
        Ok(())
    }

    /// Bytes of the state directory's filesystem the sessions may still take:
    /// each session's images (workspace, package layer) up to their sizes, and
    /// its run records' room. What the images take is as last seen
    /// ([`Live::room`]): no disk is read here, so a create costs the same with
    /// ten thousand sessions held as with one.
    pub(super) fn held_storage(&self, map: &HashMap<String, Live>) -> u64 {
        map.values()
            .filter(|l| l.phase != Phase::Closing)
            .fold(0u64, |held, l| held.saturating_add(l.room.saturating_add(crate::session::STATE_RESERVE)))
    }

    /// What the sessions' images may add up to when the state directory's
    /// filesystem has `free` bytes free: `workspace_overcommit` times that.
    pub(super) fn capacity(&self, free: u64) -> u64 {
        // f64 holds any byte count of a real disk to well within a block.
        (free as f64 * self.overcommit).min(u64::MAX as f64) as u64
    }

    /// The sessions' workspaces and the state directory's disk, as health shows them.
    pub fn storage_stats(&self) -> crate::model::health::StorageStats {
        crate::model::health::StorageStats {
            workspaces_mounted: self.mounted_count(),
            workspace_overcommit: self.overcommit,
            free_bytes: self.storage.free(&self.dir),
            held_bytes: self.held_storage(&self.lock()),
            disk_share_bytes: Some(self.disk_level.load(std::sync::atomic::Ordering::Relaxed))
                .filter(|&level| level != u64::MAX),
        }
    }

    /// A token's runs going at once must stay below its quota.
    pub(super) fn check_runs(&self, map: &HashMap<String, Live>, owner: Option<&str>) -> Result<(), Error> {
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

    /// Sessions held: ready ones and those being created.
    pub fn count(&self) -> usize {
        self.lock().values().filter(|l| l.phase != Phase::Closing).count()
    }

    /// [`Manager::count`] by mode (for `GET /metrics`).
    pub fn count_by_mode(&self) -> [(Mode, usize); 2] {
        let map = self.lock();
        let held = |mode| map.values().filter(|l| l.phase != Phase::Closing && l.info.mode == mode).count();
        [(Mode::Script, held(Mode::Script)), (Mode::Kernel, held(Mode::Kernel))]
    }

    /// Sessions with a run going.
    pub fn busy_count(&self) -> usize {
        self.lock().values().filter(|l| l.busy).count()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{manager, OTHER, OWNER};
    use super::*;
    use crate::storage::fake::Dirs;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    const MIB: u64 = 1024 * 1024;

    #[tokio::test]
    async fn a_token_holds_at_most_its_sessions_and_the_daemon_its_own() {
        let state = tempfile::tempdir().unwrap();
        let storage = Arc::new(Dirs::default());
        let m = Arc::new(manager(state.path(), &storage, 3).with_token_quotas(2, 1));
        let create = |id: &str, owner: Option<&'static str>| {
            let (m, id) = (m.clone(), id.to_string());
            async move { m.create(Some(id), None, Mode::Script, None, owner).await }
        };
        create("a", Some(OWNER)).await.unwrap();
        create("b", Some(OWNER)).await.unwrap();
        let refused = create("c", Some(OWNER)).await.unwrap_err();
        assert!(matches!(refused, Error::TokenMaxSessions { max: 2, closing: 0 }), "{refused:?}");
        assert!(!refused.to_string().contains("being closed"), "{refused}");
        create("x", Some(OTHER)).await.unwrap();
        for owner in [Some(OTHER), None] {
            let refused = create("y", owner).await.unwrap_err();
            assert!(matches!(refused, Error::MaxSessions { max: 3, closing: 0 }), "{refused:?}");
        }
        assert_eq!((m.count(), m.count_by_mode()), (3, [(Mode::Script, 3), (Mode::Kernel, 0)]));
        m.close("a", Some(OWNER)).await.unwrap();
        create("c", Some(OWNER)).await.unwrap();
        // A token's quota is at most the daemon's, and at least one.
        let clamped = manager(state.path(), &storage, 3).with_token_quotas(10, 0);
        assert_eq!((clamped.token_max_sessions, clamped.token_max_runs), (3, 1));
    }

    #[tokio::test]
    async fn a_token_runs_at_most_its_quota_at_once() {
        let state = tempfile::tempdir().unwrap();
        let storage = Arc::new(Dirs::default());
        let m = Arc::new(manager(state.path(), &storage, 4).with_token_quotas(4, 1));
        for (id, owner) in [("a", Some(OWNER)), ("b", Some(OWNER)), ("x", Some(OTHER)), ("o", None)] {
            m.create(Some(id.into()), None, Mode::Script, None, owner).await.unwrap();
        }
        let first = m.lease("a", Some(OWNER)).unwrap().mount().await.unwrap();
        assert!(matches!(m.check_run_quota(Some(OWNER)), Err(Error::TokenMaxRuns(1))));
        assert!(matches!(m.lease("b", Some(OWNER)), Err(Error::TokenMaxRuns(1))));
        // Another token's runs, and the operator's, are not this token's.
        m.check_run_quota(Some(OTHER)).unwrap();
        let theirs = m.lease("x", Some(OTHER)).unwrap().mount().await.unwrap();
        let operators = m.lease("o", None).unwrap().mount().await.unwrap();
        assert_eq!(m.busy_count(), 3);
        drop(first);
        m.check_run_quota(Some(OWNER)).unwrap();
        let second = m.lease("b", Some(OWNER)).unwrap().mount().await.unwrap();
        drop((second, theirs, operators));
        assert_eq!(m.busy_count(), 0);
    }

    #[tokio::test]
    async fn a_session_is_refused_when_the_disk_could_not_hold_every_workspace_filled() {
        let state = tempfile::tempdir().unwrap();
        let storage = Arc::new(Dirs::default());
        let m = Arc::new(manager(state.path(), &storage, 8));
        // Room for two sessions' workspaces and package layers (1 MiB each) and
        // run records.
        let wanted = 2 * MIB + crate::session::STATE_RESERVE;
        storage.free.store(2 * wanted, Ordering::Relaxed);
        m.create(Some("a".into()), None, Mode::Script, None, Some(OWNER)).await.unwrap();
        m.create(Some("b".into()), None, Mode::Script, None, Some(OWNER)).await.unwrap();
        // Not used yet: each counts its policy's sizes.
        let refused = m.create(Some("c".into()), None, Mode::Script, None, Some(OWNER)).await.unwrap_err();
        let expected = (2 * wanted / MIB, 2 * wanted / MIB, 2 * wanted / MIB, wanted.div_ceil(MIB));
        match &refused {
            Error::InsufficientStorage { free_mb, room_mb, held_mb, wanted_mb, policy } => {
                assert_eq!(
                    (*free_mb, *room_mb, *held_mb, *wanted_mb, policy.as_str()),
                    (expected.0, expected.1, expected.2, expected.3, "default")
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(!refused.to_string().contains("workspace_overcommit)"), "{refused}");
        assert_eq!(m.count(), 2, "the refused one holds nothing");
        // Used, each counts what its images can still take (the fake's take
        // nothing), and the package layer its first run is to make.
        drop(m.lease("a", Some(OWNER)).unwrap().mount().await.unwrap());
        assert_eq!(m.held_storage(&m.lock()), 2 * wanted);
        // With room enough, it is made.
        storage.free.store(u64::MAX, Ordering::Relaxed);
        m.create(Some("c".into()), None, Mode::Script, None, Some(OWNER)).await.unwrap();
    }

    #[tokio::test]
    async fn workspace_overcommit_lets_images_add_up_to_that_many_times_the_free_room() {
        let state = tempfile::tempdir().unwrap();
        let storage = Arc::new(Dirs::default());
        let m = Arc::new(manager(state.path(), &storage, 64).with_overcommit(2.5));
        let wanted = 2 * MIB + crate::session::STATE_RESERVE;
        storage.free.store(2 * wanted, Ordering::Relaxed);
        // Two sessions fit in what is free; two and a half times that holds five.
        for id in ["a", "b", "c", "d", "e"] {
            m.create(Some(id.into()), None, Mode::Script, None, None).await.unwrap();
        }
        let refused = m.create(Some("f".into()), None, Mode::Script, None, None).await.unwrap_err();
        match &refused {
            Error::InsufficientStorage { free_mb, room_mb, held_mb, .. } => {
                assert_eq!((*free_mb, *room_mb, *held_mb), (2 * wanted / MIB, 5 * wanted / MIB, 5 * wanted / MIB))
            }
            other => panic!("{other:?}"),
        }
        assert!(refused.to_string().contains("may add up to"), "{refused}");
        let stats = m.storage_stats();
        assert_eq!(
            (stats.workspace_overcommit, stats.free_bytes, stats.held_bytes),
            (2.5, Some(2 * wanted), 5 * wanted)
        );
        // Less than 1 is taken as 1: never fewer sessions than the disk holds full.
        assert_eq!(manager(state.path(), &storage, 4).with_overcommit(0.5).overcommit, 1.0);
    }
}
