//! What the session files' unit tests share: a manager whose workspaces are
//! plain directories ([`Dirs`]: no root, no mounts) in a temporary state directory.

use super::Manager;
use crate::model::policy::Policy;
use crate::model::session::{Mode, SessionInfo};
use crate::storage::fake::Dirs;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Two token identities (hashes), and their tenants' keys for session `a`.
pub const OWNER: &str = "0123456789abcdef0123456789abcdef";
pub const OTHER: &str = "fedcba9876543210fedcba9876543210";
pub const KEY_A: &str = "0123456789abcdef.a";

/// A manager over `storage` in `state` for `max_sessions` sessions, with one
/// policy (`default`, a 1 MiB workspace) and a 60 s default TTL.
pub fn manager(state: &Path, storage: &Arc<Dirs>, max_sessions: usize) -> Manager {
    let policy = Policy { name: "default".into(), workspace_mb: 1, packages_mb: 1, ..Policy::default() };
    let policies = BTreeMap::from([("default".to_string(), policy)]);
    Manager::new(state, policies, max_sessions, 60, 600_000).unwrap().with_storage(storage.clone())
}

/// A script session's description, as an earlier daemon (or a create) wrote it:
/// policy `default`, made and last used on 2026-01-01, a 60 s TTL, not busy.
pub fn info(id: &str, owner: Option<String>, uid: u32) -> SessionInfo {
    SessionInfo {
        id: id.into(),
        mode: Mode::Script,
        policy: "default".into(),
        created_at: "2026-01-01T00:00:00Z".into(),
        last_used_at: "2026-01-01T00:00:00Z".into(),
        ttl_s: 60,
        owner,
        uid,
        busy: false,
        disk_bytes: 0,
    }
}

/// The directory of the session with this key.
pub fn dir(state: &Path, key: &str) -> PathBuf {
    state.join("sessions").join(key)
}
