//! Landlock: read-only everywhere, read-write only in the workspace, `/tmp` and
//! `/dev/shm`; TCP bind and connect denied; signals and abstract Unix sockets
//! scoped to the sandbox. Applied by the program's process, after `pivot_root`, so
//! the paths are the sandbox's own.

use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetError, RulesetStatus, Scope, ABI,
};

/// The newest ABI whose rights this ruleset was written and tested against.
pub const TARGET_ABI: ABI = ABI::V7;

/// Directories the sandbox may write below. The workspace is `/mnt/data`; the rule
/// is on `/mnt` because a pooled sandbox's workspace is mounted after the ruleset is
/// made, and rules bind to the inodes they were opened on (a rule on the directory
/// the workspace later covers would not apply). `/mnt` itself is on the read-only
/// rootfs, so this grants nothing more.
pub const WRITABLE: [&str; 3] = ["/mnt", "/tmp", "/dev/shm"];
/// Device files the sandbox may write to (writes are discarded or fail as usual).
pub const WRITABLE_DEVICES: [&str; 3] = ["/dev/null", "/dev/zero", "/dev/full"];

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("landlock: {0}")]
    Ruleset(#[from] RulesetError),
}

/// How far the kernel enforced the ruleset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    Full,
    /// Some rights are not known to this kernel (an older ABI): enforced partly.
    Partial,
    /// The kernel has no Landlock at all.
    None,
}

/// Build and apply the ruleset to the calling thread and its future children.
pub fn apply() -> Result<Enforcement, Error> {
    let abi = TARGET_ABI;
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))?
        .handle_access(AccessNet::from_all(abi))?
        .scope(Scope::from_all(abi))?
        .create()?
        .add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi)))?
        .add_rules(path_beneath_rules(WRITABLE, AccessFs::from_all(abi)))?
        .add_rules(path_beneath_rules(WRITABLE_DEVICES, AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate))?
        .restrict_self()?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Enforcement::Full,
        RulesetStatus::PartiallyEnforced => Enforcement::Partial,
        RulesetStatus::NotEnforced => Enforcement::None,
    })
}

/// The Landlock ABI the running kernel offers (0 when it has none).
pub fn kernel_abi() -> i32 {
    // SAFETY: landlock_create_ruleset with a NULL attr, size 0 and the VERSION flag
    // only returns the ABI version; it reads no memory.
    unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        ) as i32
    }
    .max(0)
}
