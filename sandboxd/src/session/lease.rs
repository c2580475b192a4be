//! Holds on a ready session: a [`Lease`] takes it for one run (one at a time, and
//! its kernel with it), a [`Use`] for one file operation or one response body.
//! A session's teardown waits for both (or, past its deadline, cuts what is left).

use super::{key, rfc3339, shown, Error, Manager, Phase};
use crate::kernel::Kernel;
use crate::model::policy::Policy;
use crate::model::session::{Mode, SessionInfo};
use crate::records::Records;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Marks a session busy for one run; dropping it frees the session.
pub struct Lease {
    manager: Arc<Manager>,
    /// The session's key: its directory, its kernel (see the `session` module doc).
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

impl Lease {
    /// The session's live kernel, taken out for the cell this lease runs (`None`:
    /// it has none, or its last one died). Give it back with [`Lease::put_kernel`].
    pub async fn take_kernel(&self) -> Option<Kernel> {
        self.manager.kernels.take(&self.id).await
    }

    /// Keep `kernel` as the session's live kernel for its next cell; the
    /// session's teardown (or the daemon's shutdown) stops it.
    pub async fn put_kernel(&self, kernel: Kernel) {
        self.manager.kernels.put(&self.id, kernel).await;
    }

    /// Note that the session has had a kernel: its variables would be lost with
    /// the daemon (see [`Lease::take_kernel_lost`]).
    pub fn mark_kernel_started(&self) {
        self.manager.mark_kernel_started(&self.id);
    }

    /// Whether the session's kernel went with an earlier daemon and no cell has
    /// said so yet; the answer is given once.
    pub fn take_kernel_lost(&self) -> bool {
        self.manager.take_kernel_lost(&self.id)
    }

    /// The session's package layer (made now if its policy allows packages and it
    /// has none yet); `None` when the policy allows none.
    pub async fn package_layer(&self) -> Result<Option<PathBuf>, super::Error> {
        self.manager.package_layer(&self.id, self.epoch, self.uid, &self.policy).await
    }

    /// The session's secrets as the egress proxy serves them, kept up to date.
    pub fn secrets(&self) -> std::sync::Arc<crate::egress::secrets::Live> {
        self.manager.secrets_for(&self.id)
    }
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
            // What the run wrote is no longer room.
            self.manager.refresh_room(&self.id);
            self.manager.note_use(&self.id);
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

/// A session taken for one run whose workspace is not mounted yet: the run
/// holds the session (it is busy), and [`Taken::mount`] gives its [`Lease`].
pub struct Taken(Lease);

impl Taken {
    /// The session's policy.
    pub fn policy(&self) -> &Arc<Policy> {
        &self.0.policy
    }

    /// The session's key.
    pub fn key(&self) -> &str {
        &self.0.id
    }

    /// Mount the session's workspace (made at its first use: `mounts.rs`); the
    /// session is freed should that fail.
    pub async fn mount(self) -> Result<Lease, Error> {
        self.0.manager.mount_workspace(&self.0.id).await?;
        Ok(self.0)
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
    /// Holds the workspace mounted ([`Manager::open_mounted`]): its end counts as
    /// a use (the idle unmount's clock starts again). A read of the run records
    /// alone does not: a client polling them keeps nothing mounted.
    mounted: bool,
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
        let ours = {
            let mut map = self.manager.lock();
            let live = map.get_mut(&self.key).filter(|l| l.epoch == self.epoch);
            live.map(|live| {
                if self.body {
                    live.bodies = live.bodies.saturating_sub(1);
                } else {
                    live.users = live.users.saturating_sub(1);
                }
                live.mount.try_lock().is_ok_and(|m| *m)
            })
        };
        // What an upload wrote is no longer room (read only while its workspace is
        // mounted: one not made yet has its policy's sizes).
        if ours == Some(true) && !self.body {
            self.manager.refresh_room(&self.key);
        }
        if ours.is_some() && self.mounted {
            self.manager.note_use(&self.key);
        }
        self.manager.idle.notify_waiters();
    }
}

/// A ready session's workspace, opened for one file operation.
pub struct Opened {
    pub info: SessionInfo,
    /// The workspace's root directory (mounted if opened by [`Manager::open_mounted`]).
    pub workspace: PathBuf,
    /// The session's run records.
    pub records: Records,
    /// The session's conversations.
    pub chats: crate::conversations::Chats,
    /// Holds the session up: drop it when the operation is done.
    pub hold: Use,
}

impl Manager {
    /// Session `id` for one file operation, held until the returned [`Use`] is
    /// dropped (its teardown waits for that); its workspace is not mounted here
    /// (what needs it: [`Manager::open_mounted`]), its run records are there.
    pub fn open(self: &Arc<Self>, id: &str, owner: Option<&str>) -> Result<Opened, Error> {
        let key = key(id, owner)?;
        let mut map = self.lock();
        let Some(live) = Self::ready_mut(&mut map, &key, owner) else { return Err(Self::not_found(id)) };
        live.users += 1;
        let info = shown(&live.info, live.busy, live.taken, owner);
        let hold = Use {
            manager: self.clone(),
            key: key.clone(),
            public_id: id.to_string(),
            epoch: live.epoch,
            cut: live.cut.clone(),
            body: false,
            mounted: false,
        };
        Ok(Opened { info, workspace: self.workspace(&key), records: self.records(&key), chats: self.chats(&key), hold })
    }

    /// Session `id`'s workspace for one file operation, mounted (made at its
    /// first use: `mounts.rs`), held until the returned [`Use`] is dropped.
    pub async fn open_mounted(self: &Arc<Self>, id: &str, owner: Option<&str>) -> Result<Opened, Error> {
        let mut opened = self.open(id, owner)?;
        self.mount_workspace(&opened.hold.key).await?;
        opened.hold.mounted = true;
        Ok(opened)
    }

    /// Take the session for one run; `session_busy` at once if a run holds it.
    /// The run holds it from now on (a drain waits for it); its workspace is
    /// mounted (made at its first use) by [`Taken::mount`], which gives the [`Lease`].
    pub fn lease(self: &Arc<Self>, id: &str, owner: Option<&str>) -> Result<Taken, Error> {
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
        Ok(Taken(Lease {
            epoch,
            manager: self.clone(),
            id: key.clone(),
            public_id: id.to_string(),
            uid: live.info.uid,
            policy,
            workspace: self.workspace(&key),
            mode: live.info.mode,
            cancel: rx,
        }))
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
}

#[cfg(test)]
mod tests {
    use super::super::testing::{dir, manager, KEY_A, OTHER, OWNER};
    use super::*;
    use crate::storage::fake::Dirs;

    async fn one_session() -> (tempfile::TempDir, Arc<Manager>) {
        let state = tempfile::tempdir().unwrap();
        let m = Arc::new(manager(state.path(), &Arc::new(Dirs::default()), 4));
        m.create(Some("a".into()), None, Mode::Script, None, Some(OWNER)).await.unwrap();
        (state, m)
    }

    #[tokio::test]
    async fn a_lease_takes_the_session_for_one_run_and_saves_its_last_use() {
        let (state, m) = one_session().await;
        let lease = m.lease("a", Some(OWNER)).unwrap().mount().await.unwrap();
        assert_eq!(
            (lease.id.as_str(), lease.public_id.as_str(), lease.mode, lease.policy.name.as_str()),
            (KEY_A, "a", Mode::Script, "default")
        );
        assert_eq!(lease.workspace, dir(state.path(), KEY_A).join("data"));
        assert!(m.get("a", Some(OWNER)).unwrap().busy);
        assert!(matches!(m.lease("a", Some(OWNER)), Err(Error::Busy(id)) if id == "a"));
        assert!(matches!(m.lease("a", Some(OTHER)), Err(Error::NotFound(id)) if id == "a"));
        // A cancel reaches the run through its lease.
        assert!(!*lease.cancel.borrow());
        assert!(m.cancel_run("a", Some(OWNER)).unwrap());
        assert!(*lease.cancel.borrow());
        // Its end frees the session and saves its last use.
        m.lock().get_mut(KEY_A).unwrap().info.last_used_at = "2026-01-01T00:00:00Z".into();
        drop(lease);
        let now = m.get("a", Some(OWNER)).unwrap();
        assert!(!now.busy);
        assert_ne!(now.last_used_at, "2026-01-01T00:00:00Z");
        let json = std::fs::read(dir(state.path(), KEY_A).join("session.json")).unwrap();
        let stored: SessionInfo = serde_json::from_slice(&json).unwrap();
        assert_eq!((stored.last_used_at, stored.busy), (now.last_used_at, false));
        assert!(!m.cancel_run("a", Some(OWNER)).unwrap(), "no run to cancel");
        m.lease("a", Some(OWNER)).unwrap().mount().await.unwrap();
    }

    #[tokio::test]
    async fn a_use_holds_the_session_and_a_body_counts_apart_from_file_operations() {
        let (state, m) = one_session().await;
        assert!(matches!(m.open("a", Some(OTHER)), Err(Error::NotFound(_))));
        let opened = m.open("a", Some(OWNER)).unwrap();
        assert_eq!((opened.info.id.as_str(), opened.info.busy), ("a", false));
        assert_eq!(opened.workspace, dir(state.path(), KEY_A).join("data"));
        let counts = || m.lock().get(KEY_A).map(|l| (l.users, l.bodies));
        assert_eq!(counts(), Some((1, 0)));
        let body = opened.hold.for_body();
        assert_eq!(counts(), Some((0, 1)));
        body.check().unwrap();
        assert!(!body.cut().is_cancelled());
        drop(body);
        assert_eq!(counts(), Some((0, 0)));
        // Once the teardown begins, a hold says the session is gone.
        let hold = m.open("a", Some(OWNER)).unwrap().hold;
        m.lock().get_mut(KEY_A).unwrap().cut.cancel();
        assert!(matches!(hold.check(), Err(Error::NotFound(id)) if id == "a"));
    }
}
