//! A run that leaves its workspace out of room says so: `usage.disk_full` names
//! which room (its own size, or its share of the host disk: `storage/share.rs`)
//! and its stderr says what to do, since the code's own error (`OSError: [Errno
//! 28] No space left on device`) cannot tell the two apart.

use crate::model::policy::Policy;
use crate::model::run::{DiskFull, RunUsage};
use crate::storage::share::Room;
use std::path::Path;

/// Which room a workspace is out of, if it is: one with less free than a
/// write of note (2 MiB, or 0.5 % of its size) counts as full, and `held_back`
/// says whether its share of the host disk, not its own size, is what limits it.
pub fn full(room: Room) -> Option<DiskFull> {
    const AT_LEAST: u64 = 2 * 1024 * 1024;
    if room.free >= AT_LEAST.max(room.size / 200) {
        return None;
    }
    Some(if room.held_back { DiskFull::Host } else { DiskFull::Workspace })
}

/// The line on a run's stderr that says why its writes failed.
pub fn note(full: DiskFull, policy: &Policy) -> String {
    match full {
        DiskFull::Workspace => format!(
            "sandboxd: the session's workspace is full (its {} MiB, the policy's workspace_mb, are used up): delete files you no longer need, or use a policy with a larger workspace_mb\n",
            policy.workspace_mb
        ),
        DiskFull::Host => "sandboxd: the host's disk is nearly full: this session's share of what it has free is used up (its workspace has room of its own left): delete files you no longer need, close sessions, or ask the operator to free disk space, then retry\n".to_string(),
    }
}

/// Note in `usage` and on `stderr` that the workspace at `workspace` is full,
/// if it is; nothing if its room cannot be read.
pub fn note_full(workspace: &Path, policy: &Policy, usage: &mut RunUsage, stderr: &mut String) {
    // Most runs leave room: one statvfs says so, and nothing more is read.
    if let Ok(fs) = nix::sys::statvfs::statvfs(workspace) {
        let (free, size) = (fs.blocks_available(), fs.blocks());
        let rough = Room {
            free: free.saturating_mul(fs.fragment_size()),
            size: size.saturating_mul(fs.fragment_size()),
            held_back: false,
        };
        if full(rough).is_none() {
            return;
        }
    }
    let Some(image) = workspace.parent().map(|dir| dir.join(crate::storage::IMAGE)) else { return };
    let room = match crate::storage::share::room_at(workspace, &image) {
        Ok(room) => room,
        Err(e) => {
            tracing::warn!(workspace = %workspace.display(), error = %e, "could not read the workspace's room");
            return;
        }
    };
    let Some(which) = full(room) else { return };
    if !stderr.is_empty() && !stderr.ends_with('\n') {
        stderr.push('\n');
    }
    stderr.push_str(&note(which, policy));
    usage.disk_full = Some(which);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_is_full_below_a_write_of_note_and_the_share_says_which_room() {
        const MIB: u64 = 1024 * 1024;
        let room = |free, held_back| Room { free, size: 200 * MIB, held_back };
        assert_eq!(full(room(10 * MIB, false)), None);
        assert_eq!(full(room(10 * MIB, true)), None);
        assert_eq!(full(room(0, false)), Some(DiskFull::Workspace));
        assert_eq!(full(room(MIB, true)), Some(DiskFull::Host));
        // A large one: under 0.5 % of its size.
        assert_eq!(full(Room { free: 4 * MIB, size: 1024 * MIB, held_back: false }), Some(DiskFull::Workspace));
        assert_eq!(full(Room { free: 6 * MIB, size: 1024 * MIB, held_back: false }), None);
        let policy = Policy { workspace_mb: 200, ..Policy::default() };
        assert!(note(DiskFull::Workspace, &policy).contains("its 200 MiB"));
        assert!(note(DiskFull::Host, &policy).contains("ask the operator to free disk space"));
    }
}
