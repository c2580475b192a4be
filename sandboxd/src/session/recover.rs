//! Start and stop: taking back the sessions an earlier daemon left (re-keying
//! those of tokens whose owner ids it made the older way), and unmounting every
//! workspace at shutdown.

use super::{key_of, validate_id, Live, Manager, Phase, KERNEL_STARTED};
use crate::model::session::{Mode, SessionInfo};
use crate::records::Records;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

impl Manager {
    /// Take back the sessions an earlier instance left (their workspaces are
    /// mounted at their next use), and remove expired ones and any mount that
    /// belongs to no session.
    ///
    /// `rekey` holds (old owner id, new owner id) pairs: a session whose owner is
    /// an old id is moved to the new one first (its directory renamed to its new
    /// key, its description rewritten), so that its token finds it again.
    pub async fn recover(&self, rekey: &[(String, String)]) -> usize {
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
            let (path, info) = match info {
                Some(i) => {
                    let (path, i) = self.rekeyed(path, i, rekey).await;
                    (path, Some(i))
                }
                None => (path, None),
            };
            let keep = info.filter(|i| {
                let last_used = humantime::parse_rfc3339(&i.last_used_at).unwrap_or(UNIX_EPOCH);
                now.duration_since(last_used).unwrap_or_default() <= Duration::from_secs(i.ttl_s)
                    && self.policies.contains_key(&i.policy)
            });
            let mounted = match &keep {
                // An earlier version left wider modes: fixed before serving.
                Some(i) => self.storage.reopen(&path, i.uid).await,
                None => Err(std::io::Error::other("expired or invalid")),
            };
            match (keep, mounted) {
                (Some(info), Ok(mounted)) => {
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
                    let mut live = Live::new(info, last_used, Phase::Ready, self.next_epoch());
                    // Mounted at its next use, unless the earlier daemon's end left it so.
                    live.mount = std::sync::Arc::new(tokio::sync::Mutex::new(mounted));
                    // Its images' room, or before they are made its policy's sizes
                    // (the policy may have changed since images were made: theirs count).
                    let policy = self.policies.get(&live.info.policy);
                    let nominal = policy.map_or(0, |p| p.workspace_bytes().saturating_add(p.layer_bytes()));
                    live.room = self.storage.room(&path).unwrap_or(nominal);
                    live.taken = self.storage.taken(&path).unwrap_or(0);
                    // A kernel session whose kernel ever started had variables: gone.
                    live.kernel_lost = live.info.mode == Mode::Kernel && path.join(KERNEL_STARTED).exists();
                    self.lock().insert(key_of(&live.info), live);
                    taken += 1;
                }
                (_, result) => {
                    if let Err(e) = result {
                        tracing::info!(path = %path.display(), reason = %e, "removing a session left by an earlier run");
                    }
                    let _ = self.storage.unmount(&path).await;
                    let _ = std::fs::remove_dir_all(&path);
                }
            }
        }
        for stray in self.storage.mounted_below(&self.dir) {
            if let Some(session) = stray.parent() {
                let known = session.file_name().and_then(|n| n.to_str()).is_some_and(|id| self.lock().contains_key(id));
                if !known {
                    let _ = self.storage.unmount(session).await;
                }
            }
        }
        taken
    }

    /// The session in `path` under its token's new owner id, if `rekey` maps its
    /// owner to one: its directory renamed to the new key, its description
    /// rewritten. Anything that fails leaves it as it was (and says so).
    async fn rekeyed(&self, path: PathBuf, info: SessionInfo, rekey: &[(String, String)]) -> (PathBuf, SessionInfo) {
        let Some((_, new)) = rekey.iter().find(|(old, _)| info.owner.as_deref() == Some(old.as_str())) else {
            return (path, info);
        };
        let moved = SessionInfo { owner: Some(new.clone()), ..info.clone() };
        let target = self.session_dir(&key_of(&moved));
        let old_key = key_of(&info);
        let result = async {
            if target.exists() {
                return Err(std::io::Error::other(format!("{} exists", target.display())));
            }
            // A workspace an earlier daemon left mounted moves with its directory
            // only once unmounted; it is mounted again below, at its new place.
            self.storage.unmount(&path).await?;
            std::fs::rename(&path, &target)
        }
        .await;
        match result {
            Ok(()) => {
                self.persist(&moved);
                tracing::info!(session_id = %key_of(&moved), "moved a token's session to its keyed owner id");
                (target, moved)
            }
            Err(e) => {
                tracing::warn!(session_id = %old_key, error = %e, "could not move a token's session to its keyed owner id: its token will not find it");
                (path, info)
            }
        }
    }

    /// Unmount every workspace (daemon shutdown); their files stay in the images.
    /// What still streams from one is cut first.
    pub async fn unmount_all(&self) {
        let ids: Vec<String> = {
            let map = self.lock();
            map.values().for_each(|l| l.cut.cancel());
            map.keys().cloned().collect()
        };
        for id in ids {
            let Some(mount) = self.lock().get(&id).map(|l| l.mount.clone()) else { continue };
            let mut mounted = mount.lock().await;
            if !*mounted {
                continue;
            }
            *mounted = false;
            if let Err(e) = self.storage.unmount(&self.session_dir(&id)).await {
                tracing::warn!(session_id = %id, error = %e, "could not unmount a workspace");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::Path;

    /// A session directory as an earlier daemon left it.
    fn write_session(dir: &Path, info: &SessionInfo) -> PathBuf {
        let path = dir.join(key_of(info));
        std::fs::create_dir_all(path.join("runs")).unwrap();
        std::fs::write(path.join("session.json"), serde_json::to_vec(info).unwrap()).unwrap();
        path
    }

    fn info(id: &str, owner: Option<String>) -> SessionInfo {
        super::super::testing::info(id, owner, 600_001)
    }

    #[tokio::test]
    async fn sessions_of_old_owner_ids_move_to_the_keyed_ones() {
        let state = tempfile::tempdir().unwrap();
        let manager = Manager::new(state.path(), BTreeMap::new(), 4, 60, 600_000).unwrap();
        let key = crate::owner::OwnerKey::from_bytes([5; 32]);
        let rekey = key.rekeying(&["tok".to_string()]);
        let sessions = state.path().join("sessions");
        let old = info("x", Some(crate::owner::legacy_id("tok")));
        let path = write_session(&sessions, &old);
        let (moved_to, moved) = manager.rekeyed(path.clone(), old, &rekey).await;
        assert_eq!(moved.owner.as_deref(), Some(key.id("tok").as_str()));
        assert_eq!(moved_to, sessions.join(format!("{}.x", &key.id("tok")[..16])));
        assert!(!path.exists() && moved_to.join("runs").is_dir());
        let stored: SessionInfo =
            serde_json::from_slice(&std::fs::read(moved_to.join("session.json")).unwrap()).unwrap();
        assert_eq!(stored.owner, moved.owner);
        // Another owner's session, and the operator's, stay as they are.
        for other in [info("y", Some("0123456789abcdef0123456789abcdef".into())), info("z", None)] {
            let path = write_session(&sessions, &other);
            let (still, kept) = manager.rekeyed(path.clone(), other.clone(), &rekey).await;
            assert_eq!((still, kept.owner), (path, other.owner));
        }
        // A session already at the new key is not overwritten: the old one stays put.
        let again = info("x", Some(crate::owner::legacy_id("tok")));
        let path = write_session(&sessions, &again);
        let (still, kept) = manager.rekeyed(path.clone(), again.clone(), &rekey).await;
        assert_eq!((still, kept.owner), (path, again.owner));
    }

    #[tokio::test]
    async fn a_restart_takes_back_live_sessions_and_removes_expired_and_stray_ones() {
        use super::super::testing::{dir, manager, KEY_A, OWNER};
        use crate::storage::fake::Dirs;
        use std::collections::BTreeSet;
        use std::sync::Arc;
        let state = tempfile::tempdir().unwrap();
        let before = Arc::new(manager(state.path(), &Arc::new(Dirs::default()), 4));
        let a = before.create(Some("a".into()), None, Mode::Kernel, None, Some(OWNER)).await.unwrap();
        let b = before.create(Some("b".into()), None, Mode::Script, None, None).await.unwrap();
        let c = before.create(Some("c".into()), None, Mode::Kernel, None, None).await.unwrap();
        before.mark_kernel_started(KEY_A);
        // `b` was last used longer ago than its TTL.
        let expired = SessionInfo { last_used_at: "2026-01-01T00:00:00Z".into(), ..b.clone() };
        before.persist(&expired);
        drop(before);
        let sessions = state.path().join("sessions");
        // A directory that is no session's, and a workspace mount whose session is gone.
        std::fs::create_dir_all(sessions.join("junk").join("data")).unwrap();
        let storage = Arc::new(Dirs::default());
        storage.mount(&sessions.join("junk"));
        storage.mount(&sessions.join("gone"));
        // The earlier daemon's end left `a`'s workspace mounted; `c` was not.
        storage.mount(&dir(state.path(), KEY_A));

        let after = manager(state.path(), &storage, 4);
        assert_eq!(after.recover(&[]).await, 2);
        assert_eq!(storage.mounted(), BTreeSet::from([dir(state.path(), KEY_A).join("data")]));
        assert_eq!(after.mounted_count(), 1);
        assert!(!sessions.join("b").exists() && !sessions.join("junk").exists());
        let back = after.get("a", Some(OWNER)).unwrap();
        assert_eq!((back.mode, back.uid, back.created_at), (Mode::Kernel, a.uid, a.created_at));
        assert_eq!(after.get("c", None).unwrap().uid, c.uid);
        assert!(matches!(after.get("b", None), Err(super::super::Error::NotFound(_))));
        // A kernel session whose kernel had started says so once; one whose never did, not.
        assert!(after.take_kernel_lost(KEY_A));
        assert!(!after.take_kernel_lost(KEY_A));
        assert!(!after.take_kernel_lost("c"));
        assert_eq!(after.uids().into_iter().collect::<BTreeSet<u32>>(), BTreeSet::from([a.uid, c.uid]));
        after.unmount_all().await;
        assert!(storage.mounted().is_empty());
    }
}
