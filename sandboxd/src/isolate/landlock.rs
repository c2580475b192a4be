//! Landlock: read-only everywhere, read-write only in the workspace, `/tmp`,
//! `/dev/shm` and the package layer; TCP bind denied, and TCP connect too but to
//! the egress proxy's port (a policy with network); signals and abstract Unix
//! sockets scoped to the sandbox. Applied by the program's process, after
//! `pivot_root`, so the paths are the sandbox's own.

use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetError, RulesetStatus, Scope, ABI,
};

/// The newest ABI whose rights this ruleset was written and tested against.
pub const TARGET_ABI: ABI = ABI::V7;

/// Directories the sandbox may write below. The workspace is `/mnt/data`; the rule
/// is on `/mnt` because a pooled sandbox's workspace is mounted after the ruleset is
/// made, and rules bind to the inodes they were opened on (a rule on the directory
/// the workspace later covers would not apply). `/mnt` itself is on the read-only
/// rootfs, so this grants nothing more.
/// `/opt/packages` is the session's package layer: an empty directory of the
/// read-only rootfs when the session has none, and the rule's inode is the
/// directory the layer is later mounted on in a pooled sandbox, which the rule
/// then does not cover; so the rule is on `/opt` (read-only but for that mount).
pub const WRITABLE: [&str; 4] = ["/mnt", "/tmp", "/dev/shm", "/opt"];
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

/// The ruleset, as data: what it handles (everything `abi` knows, so all of it is
/// denied unless a rule grants it) and the rules that grant something back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub handled_fs: BitFlags<AccessFs>,
    pub handled_net: BitFlags<AccessNet>,
    pub scopes: BitFlags<Scope>,
    /// `(path, rights below it)`, applied in order.
    pub rules: Vec<(&'static str, BitFlags<AccessFs>)>,
    /// The one TCP port the sandbox may connect to (the egress proxy's, on its own
    /// loopback); bind is never granted.
    pub connect_port: Option<u16>,
}

/// The ruleset for `abi`: read (and execute) everywhere, everything below
/// [`WRITABLE`], read/write/truncate on [`WRITABLE_DEVICES`], and TCP connect to
/// `egress_port` when given.
pub fn plan(abi: ABI, egress_port: Option<u16>) -> Plan {
    let mut rules = vec![("/", AccessFs::from_read(abi))];
    rules.extend(WRITABLE.iter().map(|p| (*p, AccessFs::from_all(abi))));
    rules.extend(WRITABLE_DEVICES.iter().map(|p| (*p, AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate)));
    Plan {
        handled_fs: AccessFs::from_all(abi),
        handled_net: AccessNet::from_all(abi),
        scopes: Scope::from_all(abi),
        rules,
        connect_port: egress_port,
    }
}

/// Build [`plan`]`(`[`TARGET_ABI`]`, egress_port)` and apply it to the calling
/// thread and its future children (best effort: rights an older kernel lacks are
/// left out).
pub fn apply(egress_port: Option<u16>) -> Result<Enforcement, Error> {
    let plan = plan(TARGET_ABI, egress_port);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(plan.handled_fs)?
        .handle_access(plan.handled_net)?
        .scope(plan.scopes)?
        .create()?;
    for (path, access) in plan.rules {
        ruleset = ruleset.add_rules(path_beneath_rules([path], access))?;
    }
    if let Some(port) = plan.connect_port {
        ruleset = ruleset.add_rule(NetPort::new(port, AccessNet::ConnectTcp))?;
    }
    let status = ruleset.restrict_self()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_denies_what_it_does_not_grant() {
        let p = plan(TARGET_ABI, None);
        assert_eq!(p.handled_fs, AccessFs::from_all(TARGET_ABI));
        // Network: both TCP rights handled, no rule grants either.
        assert_eq!(p.handled_net, AccessNet::BindTcp | AccessNet::ConnectTcp);
        assert_eq!(p.connect_port, None);
        assert_eq!(p.scopes, Scope::AbstractUnixSocket | Scope::Signal);
        let paths: Vec<&str> = p.rules.iter().map(|(path, _)| *path).collect();
        assert_eq!(paths, ["/", "/mnt", "/tmp", "/dev/shm", "/opt", "/dev/null", "/dev/zero", "/dev/full"]);
        // With network, connecting to the proxy's port only; binding stays denied.
        let p = plan(TARGET_ABI, Some(3128));
        assert_eq!((p.connect_port, p.handled_net), (Some(3128), AccessNet::BindTcp | AccessNet::ConnectTcp));
    }

    #[test]
    fn the_root_is_read_only_and_only_the_writable_places_get_more() {
        let p = plan(TARGET_ABI, None);
        let root = p.rules[0].1;
        assert_eq!(root, AccessFs::Execute | AccessFs::ReadFile | AccessFs::ReadDir);
        let write = AccessFs::WriteFile
            | AccessFs::RemoveDir
            | AccessFs::RemoveFile
            | AccessFs::MakeReg
            | AccessFs::MakeSym
            | AccessFs::MakeDir
            | AccessFs::MakeChar
            | AccessFs::MakeBlock
            | AccessFs::MakeSock
            | AccessFs::MakeFifo
            | AccessFs::Refer
            | AccessFs::Truncate
            | AccessFs::IoctlDev;
        assert!(!root.intersects(write));
        for (path, access) in &p.rules[1..5] {
            assert_eq!(*access, AccessFs::from_all(TARGET_ABI), "{path}");
        }
        for (path, access) in &p.rules[5..] {
            assert_eq!(*access, AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate, "{path}");
            // Devices: no making, removing, renaming or ioctl.
            assert!(!access.intersects(AccessFs::IoctlDev | AccessFs::Refer | AccessFs::RemoveFile), "{path}");
        }
    }

    #[test]
    fn an_older_abi_handles_fewer_rights() {
        let v1 = plan(ABI::V1, Some(3128));
        assert!(v1.handled_net.is_empty() && v1.scopes.is_empty());
        assert!(!v1.handled_fs.contains(AccessFs::Truncate) && !v1.handled_fs.contains(AccessFs::Refer));
        assert_eq!(v1.rules.len(), plan(TARGET_ABI, None).rules.len());
    }
}
