//! A session's workspace mounted while it is used, not while it is held: made
//! and mounted by its first run or file operation ([`Manager::mount_workspace`],
//! called by [`Manager::lease`] and [`Manager::open_mounted`] once their hold is
//! counted), and unmounted once the session has been idle for
//! `workspace_idle_unmount_s` ([`Manager::unmount_idle`]), to be mounted again at
//! its next use. So ten thousand sessions held cost ten thousand directories; the
//! mounts (a loop device, a kernel thread and kernel memory each, and every new
//! sandbox's mount namespace starts from the daemon's) follow the sessions in use.
//!
//! Each session's `mount` lock is held while its workspace is mounted or
//! unmounted. A hold (a run's lease, a file operation, a body) is counted under
//! the manager's lock before its workspace is mounted; an idle unmount takes the
//! session's mount lock, then checks under the manager's lock that nothing holds
//! it: a hold counted after that check waits for the mount lock and mounts the
//! workspace again. A session whose kernel lives keeps its workspace mounted (the
//! kernel's sandbox has it), as does one being torn down until its teardown.

use super::{Error, Live, Manager, Phase};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The id part of a session key, as a caller names the session.
pub(super) fn shown_id(key: &str) -> &str {
    key.rsplit_once('.').map_or(key, |(_, id)| id)
}

impl Manager {
    /// Mount session `key`'s workspace (and its package layer, if it has one),
    /// making it first at the session's first use; nothing if it is mounted. Call
    /// it with a hold on the session counted.
    ///
    /// The work runs in a task of its own that holds the session's mount lock from
    /// before it looks until its flag says what it did: a caller that goes away
    /// midway (a client that hung up) leaves it to finish, so no second use can
    /// start a second mount of the same image meanwhile.
    pub(super) async fn mount_workspace(self: &Arc<Self>, key: &str) -> Result<(), Error> {
        let (mount, uid, policy, epoch) = {
            let map = self.lock();
            let Some(live) = map.get(key) else { return Err(Self::not_found(shown_id(key))) };
            (live.mount.clone(), live.info.uid, live.info.policy.clone(), live.epoch)
        };
        let size = self.policy(Some(&policy))?.workspace_bytes();
        let (this, key_owned) = (self.clone(), key.to_string());
        let task = tokio::spawn(async move {
            let key = key_owned.as_str();
            let mut mounted = mount.lock_owned().await;
            // Its teardown may have begun (and removed it) while this waited.
            let live = this.lock().get(key).is_some_and(|l| l.epoch == epoch && l.phase == Phase::Ready);
            if !live {
                return Err(Self::not_found(shown_id(key)));
            }
            let dir = this.session_dir(key);
            // What the flag says, checked: a workspace not mounted is never handed
            // out (its files would land on the host's disk, unbounded), nor one
            // whose package layer was left unmounted (a daemon stopped between the
            // two mounts, an unmount that failed halfway): both are mounted again.
            if !*mounted || !this.storage.is_open(&dir) {
                this.storage.open(&dir, size, uid).await.map_err(Error::Workspace)?;
                *mounted = true;
                // Counted in the host disk's sharing, and held to its share,
                // before anything writes into it (this task holds its mount lock:
                // it counts as mounted). One mounted already was counted then.
                this.share_disk().await;
            }
            if !this.storage.is_open(&dir) {
                *mounted = false;
                let e = std::io::Error::other(format!("{} is not mounted", dir.join(crate::storage::DATA).display()));
                return Err(Error::Workspace(e));
            }
            Ok(())
        });
        task.await.map_err(|e| Error::Workspace(std::io::Error::other(e)))??;
        self.note_use(key);
        self.refresh_room(key);
        Ok(())
    }

    /// Note that session `key` was used just now (its workspace's idle time
    /// starts again; a run's end also moves its TTL: [`super::Lease`]).
    pub(super) fn note_use(&self, key: &str) {
        if let Some(live) = self.lock().get_mut(key) {
            live.used_at = SystemTime::now();
        }
    }

    /// Note how much more of the host disk session `key`'s images may take now
    /// (after a use: what its runs and uploads wrote is no longer room). A package
    /// layer its policy allows but its first run has not made yet counts full.
    pub(super) fn refresh_room(&self, key: &str) {
        let dir = self.session_dir(key);
        let Some(room) = self.storage.room(&dir) else { return };
        let taken = self.storage.taken(&dir).unwrap_or(0);
        let layer_to_come = match dir.join(crate::storage::LAYER_IMAGE).exists() {
            true => 0,
            false => {
                self.lock().get(key).and_then(|l| self.policies.get(&l.info.policy)).map_or(0, |p| p.layer_bytes())
            }
        };
        if let Some(live) = self.lock().get_mut(key) {
            live.room = room.saturating_add(layer_to_come);
            live.taken = taken;
        }
    }

    /// Unmount the workspaces of ready sessions nothing has used for `after` and
    /// nothing holds (see the module's notes); returns how many.
    pub async fn unmount_idle(&self, after: Duration) -> usize {
        let now = SystemTime::now();
        let unheld = |l: &Live| l.phase == Phase::Ready && !l.busy && l.users == 0 && l.bodies == 0;
        let idle: Vec<_> = self
            .lock()
            .iter()
            .filter(|(_, l)| unheld(l) && now.duration_since(l.used_at).unwrap_or_default() >= after)
            .map(|(key, l)| (key.clone(), l.mount.clone()))
            .collect();
        let mut unmounted = 0;
        for (key, mount) in idle {
            // One being mounted now is in use.
            let Ok(mut mounted) = mount.try_lock() else { continue };
            if !*mounted || self.kernels.has(&key).await {
                continue;
            }
            if !self.lock().get(&key).is_some_and(unheld) {
                continue;
            }
            match self.storage.unmount(&self.session_dir(&key)).await {
                Ok(()) => {
                    *mounted = false;
                    unmounted += 1;
                    tracing::debug!(session_id = %key, "idle session's workspace unmounted");
                }
                Err(e) => {
                    tracing::warn!(session_id = %key, error = %e, "could not unmount an idle session's workspace")
                }
            }
        }
        unmounted
    }

    /// Share what the host disk has free among the images of the sessions
    /// mounted now, each held to its share (`storage/share.rs`): a disk that
    /// fills is `ENOSPC` to the session writing, never an I/O error under its
    /// filesystem. The daemon calls it every second, and each mount before its
    /// images are handed out (one holding its session's mount lock counts as
    /// mounted); one sharing at a time.
    pub async fn share_disk(self: &Arc<Self>) {
        let _one = self.sharing.lock().await;
        let (dirs, room) = {
            let map = self.lock();
            let mounted: Vec<_> = map.iter().filter(|(_, l)| l.mount.try_lock().map_or(true, |m| *m)).collect();
            let room = mounted.iter().map(|(_, l)| l.room).fold(0u64, u64::saturating_add);
            (mounted.into_iter().map(|(key, _)| self.session_dir(key)).collect::<Vec<_>>(), room)
        };
        let Some(free) = self.storage.free(&self.dir) else { return };
        // Room for every mounted image filled up (what each was last seen able
        // to take, at most what it can): nothing to hold back, nothing held.
        let last = self.disk_level.load(Ordering::Relaxed);
        if last == u64::MAX && free.saturating_sub(crate::storage::share::MARGIN) >= room {
            return;
        }
        let this = self.clone();
        match tokio::task::spawn_blocking(move || this.storage.share(&dirs, free)).await {
            Ok(level) => self.disk_level.store(level, Ordering::Relaxed),
            Err(e) => tracing::warn!(error = %e, "sharing the host disk among the workspaces failed"),
        }
    }

    /// How many sessions have their workspace mounted now (for health and
    /// `/metrics`); one being mounted or unmounted counts as mounted.
    pub fn mounted_count(&self) -> usize {
        let mounts: Vec<_> = self.lock().values().map(|l| l.mount.clone()).collect();
        mounts.iter().filter(|m| m.try_lock().map_or(true, |m| *m)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{dir, manager, KEY_A, OWNER};
    use super::*;
    use crate::model::session::Mode;
    use crate::storage::fake::Dirs;
    use crate::storage::Storage;
    use std::collections::BTreeSet;

    #[tokio::test]
    async fn a_workspace_is_made_at_first_use_and_unmounted_when_idle_with_its_files() {
        let state = tempfile::tempdir().unwrap();
        let storage = Arc::new(Dirs::default());
        let m = Arc::new(manager(state.path(), &storage, 4));
        m.create(Some("a".into()), None, Mode::Script, None, Some(OWNER)).await.unwrap();
        let session = dir(state.path(), KEY_A);
        // Held, not used: a directory and its description, no image, nothing mounted.
        assert!(session.join("session.json").is_file());
        assert!(!session.join("workspace.img").exists());
        assert!(storage.mounted().is_empty());
        assert_eq!(m.mounted_count(), 0);
        // Its first file operation makes and mounts it.
        let opened = m.open_mounted("a", Some(OWNER)).await.unwrap();
        std::fs::write(opened.workspace.join("kept.txt"), "x").unwrap();
        assert_eq!(storage.mounted(), BTreeSet::from([session.join("data")]));
        assert_eq!(m.mounted_count(), 1);
        // Held: not unmounted, however idle.
        assert_eq!(m.unmount_idle(Duration::ZERO).await, 0);
        drop(opened);
        // Used more recently than asked: kept.
        assert_eq!(m.unmount_idle(Duration::from_secs(3600)).await, 0);
        assert_eq!(m.unmount_idle(Duration::ZERO).await, 1);
        assert!(storage.mounted().is_empty());
        assert_eq!(m.mounted_count(), 0);
        // A run mounts it again, the same image with its files.
        let lease = m.lease("a", Some(OWNER)).unwrap().mount().await.unwrap();
        assert_eq!(storage.mounted(), BTreeSet::from([session.join("data")]));
        assert_eq!(std::fs::read_to_string(lease.workspace.join("kept.txt")).unwrap(), "x");
        assert_eq!(m.unmount_idle(Duration::ZERO).await, 0, "a run holds it");
        drop(lease);
        // Closing one unmounted needs nothing mounted.
        assert_eq!(m.unmount_idle(Duration::ZERO).await, 1);
        m.close("a", Some(OWNER)).await.unwrap();
        assert!(!session.exists() && storage.mounted().is_empty());
    }

    #[tokio::test]
    async fn a_workspace_that_cannot_be_made_fails_the_use_and_leaves_the_session_as_it_was() {
        let state = tempfile::tempdir().unwrap();
        let storage = Arc::new(Dirs::default());
        let m = Arc::new(manager(state.path(), &storage, 4));
        m.create(Some("a".into()), None, Mode::Script, None, Some(OWNER)).await.unwrap();
        storage.fail_create.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(matches!(m.lease("a", Some(OWNER)).unwrap().mount().await, Err(Error::Workspace(_))));
        // Not left busy, nothing left made: the next use makes it.
        assert!(!m.get("a", Some(OWNER)).unwrap().busy);
        assert!(!dir(state.path(), KEY_A).join("workspace.img").exists());
        let lease = m.lease("a", Some(OWNER)).unwrap().mount().await.unwrap();
        assert!(lease.workspace.is_dir());
    }

    #[tokio::test]
    async fn held_storage_counts_what_was_last_seen_without_reading_the_disk() {
        let state = tempfile::tempdir().unwrap();
        let storage = Arc::new(Dirs::default());
        let m = Arc::new(manager(state.path(), &storage, 4));
        m.create(Some("a".into()), None, Mode::Script, None, Some(OWNER)).await.unwrap();
        let policy = m.policy(None).unwrap();
        let nominal = policy.workspace_bytes() + policy.layer_bytes() + crate::session::STATE_RESERVE;
        assert_eq!(m.held_storage(&m.lock()), nominal);
        // Once made, its image's room (the fake's images take nothing: their
        // size), and its package layer's to come.
        drop(m.lease("a", Some(OWNER)).unwrap().mount().await.unwrap());
        assert_eq!(m.held_storage(&m.lock()), nominal);
        // An image that took some of it: that much less.
        let image = dir(state.path(), KEY_A).join("workspace.img");
        std::fs::write(&image, vec![1u8; 64 * 1024]).unwrap();
        std::fs::File::options().write(true).open(&image).unwrap().set_len(policy.workspace_bytes()).unwrap();
        drop(m.lease("a", Some(OWNER)).unwrap().mount().await.unwrap());
        assert_eq!(m.held_storage(&m.lock()), nominal - 64 * 1024);
    }

    /// A manager whose one policy allows packages (its sessions get a layer).
    fn with_packages(state: &std::path::Path, storage: &Arc<Dirs>) -> Manager {
        use crate::model::policy::{Network, Policy};
        let policy = Policy {
            name: "default".into(),
            workspace_mb: 1,
            packages_mb: 1,
            network: Network::Allowlist,
            allow_hosts: vec!["pypi.org".into()],
            ..Policy::default()
        };
        let policies = std::collections::BTreeMap::from([("default".to_string(), policy)]);
        Manager::new(state, policies, 4, 60, 600_000).unwrap().with_storage(storage.clone())
    }

    #[tokio::test]
    async fn a_package_layer_made_but_left_unmounted_is_mounted_again_not_made_twice() {
        let state = tempfile::tempdir().unwrap();
        let storage = Arc::new(Dirs::default());
        let m = Arc::new(with_packages(state.path(), &storage));
        m.create(Some("a".into()), None, Mode::Script, None, Some(OWNER)).await.unwrap();
        let session = dir(state.path(), KEY_A);
        let lease = m.lease("a", Some(OWNER)).unwrap().mount().await.unwrap();
        let layer = lease.package_layer().await.unwrap().unwrap();
        std::fs::write(session.join("packages.img"), "installed").unwrap();
        drop(lease);
        // The daemon stopped between the workspace's mount and the layer's (or
        // an unmount failed halfway): the workspace mounted, the layer not.
        storage.unmount(&session).await.unwrap();
        storage.mount(&session);
        assert!(!storage.is_open(&session));
        // The next use mounts the layer again, the same image.
        let lease = m.lease("a", Some(OWNER)).unwrap().mount().await.unwrap();
        assert_eq!(storage.mounted(), BTreeSet::from([session.join("data"), layer.clone()]));
        drop(lease);
        // And a run that finds only the layer unmounted mounts it, not a new one.
        storage.unmount(&session).await.unwrap();
        storage.mount(&session);
        let lease = m.lease("a", Some(OWNER)).unwrap().mount().await.unwrap();
        assert_eq!(lease.package_layer().await.unwrap(), Some(layer));
        assert_eq!(std::fs::read_to_string(session.join("packages.img")).unwrap(), "installed");
    }

    #[tokio::test]
    async fn a_package_layer_is_not_made_for_a_session_whose_teardown_began() {
        let state = tempfile::tempdir().unwrap();
        let storage = Arc::new(Dirs::default());
        let m = Arc::new(with_packages(state.path(), &storage));
        m.create(Some("a".into()), None, Mode::Script, None, Some(OWNER)).await.unwrap();
        let session = dir(state.path(), KEY_A);
        let lease = m.lease("a", Some(OWNER)).unwrap().mount().await.unwrap();
        // Its close begins (a forced teardown would unmount under the run).
        m.lock().get_mut(KEY_A).unwrap().phase = Phase::Closing;
        assert!(matches!(lease.package_layer().await, Err(Error::NotFound(_))));
        assert!(!session.join("packages.img").exists());
        assert!(!storage.mounted().contains(&session.join("packages")));
    }

    #[tokio::test]
    async fn reading_run_records_does_not_keep_a_workspace_mounted() {
        let state = tempfile::tempdir().unwrap();
        let storage = Arc::new(Dirs::default());
        let m = Arc::new(manager(state.path(), &storage, 4));
        m.create(Some("a".into()), None, Mode::Script, None, Some(OWNER)).await.unwrap();
        drop(m.open_mounted("a", Some(OWNER)).await.unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
        // A client polling the records (no mount) moves no idle clock ...
        drop(m.open("a", Some(OWNER)).unwrap());
        assert_eq!(m.unmount_idle(Duration::from_millis(40)).await, 1);
        // ... a file operation on the workspace does.
        drop(m.open_mounted("a", Some(OWNER)).await.unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(m.open_mounted("a", Some(OWNER)).await.unwrap());
        assert_eq!(m.unmount_idle(Duration::from_millis(40)).await, 0);
    }
}
