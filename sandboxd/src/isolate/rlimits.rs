//! Resource limits that cgroups do not cover: file size, open files, core dumps,
//! and the per-user counters the kernel keeps a limit for: queued signals, POSIX
//! message queue bytes, locked memory.
//!
//! Those counters are shared by every process of one user in one user namespace
//! (and charged up the chain to the namespace's owner, the sandbox's own host uid:
//! [`super::namespaces::Owner`]), so their limits hold for the sandbox as a whole:
//! a run can queue [`SIGPENDING`] signals, not the host's default (about 96,000,
//! what host root's processes may queue).

use super::spec::Rlimits;
use nix::sys::resource::{setrlimit, Resource};

/// Signals a sandbox may have queued at once (`RLIMIT_SIGPENDING`).
pub const SIGPENDING: u64 = 1024;
/// Bytes of POSIX message queues a sandbox may hold (`RLIMIT_MSGQUEUE`; `mq_open`
/// is not in the seccomp allow-list either).
pub const MSGQUEUE: u64 = 0;
/// Memory a sandbox may lock (`RLIMIT_MEMLOCK`), `mlock` and `SHM_LOCK` alike.
pub const MEMLOCK: u64 = 64 * 1024;

/// Apply the limits to the calling process (inherited by its children).
pub fn apply(limits: &Rlimits) -> Result<(), nix::Error> {
    for (resource, value) in plan(limits) {
        setrlimit(resource, value, value)?;
    }
    Ok(())
}

/// The (resource, soft = hard value) pairs to set.
pub fn plan(limits: &Rlimits) -> Vec<(Resource, u64)> {
    vec![
        (Resource::RLIMIT_FSIZE, limits.file_size_bytes),
        (Resource::RLIMIT_NOFILE, limits.open_files),
        (Resource::RLIMIT_CORE, 0),
        (Resource::RLIMIT_MEMLOCK, MEMLOCK),
        (Resource::RLIMIT_SIGPENDING, SIGPENDING),
        (Resource::RLIMIT_MSGQUEUE, MSGQUEUE),
        // No raising the run's scheduling priority, real-time or not.
        (Resource::RLIMIT_RTPRIO, 0),
        (Resource::RLIMIT_NICE, 0),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_sets_the_policy_and_bounds_every_per_user_counter() {
        let t = plan(&Rlimits { file_size_bytes: 5 << 20, open_files: 64 });
        assert_eq!(
            t,
            vec![
                (Resource::RLIMIT_FSIZE, 5 << 20),
                (Resource::RLIMIT_NOFILE, 64),
                (Resource::RLIMIT_CORE, 0),
                (Resource::RLIMIT_MEMLOCK, 64 * 1024),
                (Resource::RLIMIT_SIGPENDING, 1024),
                (Resource::RLIMIT_MSGQUEUE, 0),
                (Resource::RLIMIT_RTPRIO, 0),
                (Resource::RLIMIT_NICE, 0),
            ]
        );
    }
}
