//! Dropping every privilege: securebits locked, the bounding and ambient sets
//! emptied, uid/gid switched to the sandbox user, every remaining capability set
//! cleared, and no-new-privs set.

use super::spec::{SANDBOX_GID, SANDBOX_UID};
use caps::{CapSet, CapsHashSet};
use nix::unistd::{setresgid, setresuid, Gid, Uid};
use rustix::thread::CapabilitiesSecureBits;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: {1}")]
    Caps(&'static str, caps::errors::CapsError),
    #[error("{0}: {1}")]
    Sys(&'static str, nix::Error),
}

/// The securebits a sandboxed process ends with: root gains nothing from its uid,
/// capabilities are not kept across setuid, ambient capabilities cannot be raised,
/// and none of that can be changed again.
pub const SECUREBITS: CapabilitiesSecureBits = CapabilitiesSecureBits::NO_ROOT
    .union(CapabilitiesSecureBits::NO_ROOT_LOCKED)
    .union(CapabilitiesSecureBits::NO_SETUID_FIXUP_LOCKED)
    .union(CapabilitiesSecureBits::KEEP_CAPS_LOCKED)
    .union(CapabilitiesSecureBits::NO_CAP_AMBIENT_RAISE)
    .union(CapabilitiesSecureBits::NO_CAP_AMBIENT_RAISE_LOCKED);

/// What [`drop_all`] does, as data, in its order.
#[derive(Debug, Clone)]
pub struct Plan {
    pub securebits: CapabilitiesSecureBits,
    /// Dropped from the bounding set (every capability the library knows).
    pub bounding_drop: CapsHashSet,
    /// Cleared before the uid/gid switch.
    pub clear_before: CapSet,
    /// The user and group the process becomes (real, effective and saved).
    pub uid: u32,
    pub gid: u32,
    /// Emptied after the switch: nothing is kept.
    pub clear_after: [CapSet; 3],
    pub no_new_privs: bool,
}

/// Keep nothing: every capability leaves every set, for good.
pub fn plan() -> Plan {
    Plan {
        securebits: SECUREBITS,
        bounding_drop: caps::all(),
        clear_before: CapSet::Ambient,
        uid: SANDBOX_UID,
        gid: SANDBOX_GID,
        clear_after: [CapSet::Inheritable, CapSet::Effective, CapSet::Permitted],
        no_new_privs: true,
    }
}

/// Become the sandbox user with no capabilities at all, for good ([`plan`]).
/// Runs while the process still holds its full capability set in its user namespace.
pub fn drop_all() -> Result<(), Error> {
    let plan = plan();
    rustix::thread::set_capabilities_secure_bits(plan.securebits)
        .map_err(|e| Error::Sys("PR_SET_SECUREBITS", nix::Error::from_raw(e.raw_os_error())))?;
    for cap in plan.bounding_drop {
        caps::drop(None, CapSet::Bounding, cap).map_err(|e| Error::Caps("dropping the bounding set", e))?;
    }
    caps::clear(None, plan.clear_before).map_err(|e| Error::Caps("clearing the ambient set", e))?;
    let (uid, gid) = (Uid::from_raw(plan.uid), Gid::from_raw(plan.gid));
    setresgid(gid, gid, gid).map_err(|e| Error::Sys("setresgid", e))?;
    setresuid(uid, uid, uid).map_err(|e| Error::Sys("setresuid", e))?;
    // The host uid we came from is not mapped in the namespace, so setresuid did not
    // clear the sets by itself: clear them explicitly (lowering needs no capability).
    let empty = CapsHashSet::new();
    for set in plan.clear_after {
        caps::set(None, set, &empty).map_err(|e| Error::Caps("clearing a capability set", e))?;
    }
    if plan.no_new_privs {
        nix::sys::prctl::set_no_new_privs().map_err(|e| Error::Sys("PR_SET_NO_NEW_PRIVS", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use caps::Capability;

    #[test]
    fn nothing_is_kept() {
        let p = plan();
        // The bounding set loses every capability, the dangerous ones among them.
        for cap in [Capability::CAP_SYS_ADMIN, Capability::CAP_SETUID, Capability::CAP_NET_ADMIN, Capability::CAP_BPF] {
            assert!(p.bounding_drop.contains(&cap), "{cap}");
        }
        assert_eq!(p.bounding_drop, caps::all());
        assert!(matches!(p.clear_before, CapSet::Ambient));
        assert!(matches!(p.clear_after, [CapSet::Inheritable, CapSet::Effective, CapSet::Permitted]));
        assert_eq!((p.uid, p.gid), (1000, 1000));
        assert!(p.no_new_privs);
    }

    #[test]
    fn securebits_are_set_and_locked() {
        // The kernel's values (include/uapi/linux/securebits.h): 0b1110_1011.
        assert_eq!(plan().securebits.bits(), 0xeb);
        assert!(!SECUREBITS.contains(CapabilitiesSecureBits::KEEP_CAPS));
        assert!(!SECUREBITS.contains(CapabilitiesSecureBits::NO_SETUID_FIXUP));
    }
}
