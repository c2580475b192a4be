//! Dropping every privilege: securebits locked, the bounding and ambient sets
//! emptied, uid/gid switched to the sandbox user, every remaining capability set
//! cleared, and no-new-privs set.

use super::spec::{SANDBOX_GID, SANDBOX_UID};
use caps::{CapSet, CapsHashSet};
use nix::unistd::{setresgid, setresuid, Gid, Uid};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: {1}")]
    Caps(&'static str, caps::errors::CapsError),
    #[error("{0}: {1}")]
    Sys(&'static str, nix::Error),
}

const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;

/// The securebits a sandboxed process ends with: root gains nothing from its uid,
/// capabilities are not kept across setuid, ambient capabilities cannot be raised,
/// and none of that can be changed again.
pub const SECUREBITS: libc::c_ulong = SECBIT_NOROOT
    | SECBIT_NOROOT_LOCKED
    | SECBIT_NO_SETUID_FIXUP_LOCKED
    | SECBIT_KEEP_CAPS_LOCKED
    | SECBIT_NO_CAP_AMBIENT_RAISE
    | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;

/// Become the sandbox user with no capabilities at all, for good.
/// Runs while the process still holds its full capability set in its user namespace.
pub fn drop_all() -> Result<(), Error> {
    set_securebits(SECUREBITS)?;
    for cap in caps::all() {
        caps::drop(None, CapSet::Bounding, cap).map_err(|e| Error::Caps("dropping the bounding set", e))?;
    }
    caps::clear(None, CapSet::Ambient).map_err(|e| Error::Caps("clearing the ambient set", e))?;
    setresgid(Gid::from_raw(SANDBOX_GID), Gid::from_raw(SANDBOX_GID), Gid::from_raw(SANDBOX_GID))
        .map_err(|e| Error::Sys("setresgid", e))?;
    setresuid(Uid::from_raw(SANDBOX_UID), Uid::from_raw(SANDBOX_UID), Uid::from_raw(SANDBOX_UID))
        .map_err(|e| Error::Sys("setresuid", e))?;
    // The host uid we came from is not mapped in the namespace, so setresuid did not
    // clear the sets by itself: clear them explicitly (lowering needs no capability).
    clear_sets()?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| Error::Sys("PR_SET_NO_NEW_PRIVS", e))?;
    Ok(())
}

/// Empty the inheritable, effective and permitted sets (lowering needs no
/// capability).
fn clear_sets() -> Result<(), Error> {
    let empty = CapsHashSet::new();
    for set in [CapSet::Inheritable, CapSet::Effective, CapSet::Permitted] {
        caps::set(None, set, &empty).map_err(|e| Error::Caps("clearing a capability set", e))?;
    }
    Ok(())
}

fn set_securebits(bits: libc::c_ulong) -> Result<(), Error> {
    // SAFETY: PR_SET_SECUREBITS takes one integer argument and touches no memory.
    let rc = unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) };
    if rc != 0 {
        return Err(Error::Sys("PR_SET_SECUREBITS", nix::Error::last()));
    }
    Ok(())
}
