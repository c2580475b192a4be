//! Resource limits that cgroups do not cover: file size, open files, core dumps.

use super::spec::Rlimits;
use nix::sys::resource::{setrlimit, Resource};

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
        (Resource::RLIMIT_MEMLOCK, 64 * 1024),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_sets_the_policy_and_forbids_cores_and_locked_memory() {
        let t = plan(&Rlimits { file_size_bytes: 5 << 20, open_files: 64 });
        assert_eq!(
            t,
            vec![
                (Resource::RLIMIT_FSIZE, 5 << 20),
                (Resource::RLIMIT_NOFILE, 64),
                (Resource::RLIMIT_CORE, 0),
                (Resource::RLIMIT_MEMLOCK, 64 * 1024),
            ]
        );
    }
}
