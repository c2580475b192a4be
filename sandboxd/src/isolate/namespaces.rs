//! The namespaces: one `clone` makes the sandbox's init in new user, mount, pid,
//! net, ipc, uts and cgroup namespaces; its parent (still host root) then writes the
//! uid/gid maps. Inside, the loopback interface is brought up and the hostname set.
//!
//! The user namespace is made by the sandbox's own host uid, not by root
//! ([`Owner`], [`creator`]): the kernel charges its per-user counters (inotify
//! instances and watches, queued signals, message queue bytes, locked shared
//! memory, processes, namespaces) to the namespace's user and then to the owner of
//! each namespace above it, so a namespace that root made would spend host root's.

use super::spec::{SANDBOX_GID, SANDBOX_UID};
use nix::unistd::Pid;
use std::fs;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("clone: {0}")]
    Clone(nix::Error),
    #[error("writing {0}: {1}")]
    IdMap(String, std::io::Error),
    #[error("bringing up lo: {0}")]
    Loopback(nix::Error),
    #[error("sethostname: {0}")]
    Hostname(nix::Error),
    #[error("unshare a nested user namespace: {0}")]
    Nest(nix::Error),
    #[error("taking the sandbox owner's ids around the clone: {0}")]
    Owner(nix::Error),
}

/// Every namespace a sandbox gets.
pub const CLONE_FLAGS: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP;

/// Which side of [`clone_into_namespaces`] returned. (A template's fork waiting
/// for its code is another thing: [`super::pooled::Forked`].)
pub enum Cloned {
    /// The sandbox's init, pid 1 of its namespaces.
    Child,
    /// The helper, with the init's host pid.
    Parent(Pid),
}

/// Whose the sandbox's user namespace is: the host uid and gid the sandbox user
/// maps to (its session's, or a pooled template's). What the sandbox holds of the
/// kernel's per-user counters is charged to this uid, never to host root's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// The ids a process holds, as (real, effective, saved, filesystem).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    pub real: u32,
    pub effective: u32,
    pub saved: u32,
    pub fs: u32,
}

/// The uids and gids the helper (host root) takes for the one `clone` that makes
/// a sandbox's namespaces, and gives back at once after it:
///
/// - effective: the owner's, since the kernel makes the effective uid the new user
///   namespace's owner (and the owner is who its counters are charged to);
/// - real and saved: root's, so the helper may take root's effective ids back, and
///   the sandbox's init keeps them (unmapped, shown as nobody inside) until it
///   drops every privilege;
/// - filesystem: root's, so the init builds the sandbox's filesystem with the same
///   file access as before, and the tmpfs mounts it makes belong to no host uid (the
///   kernel shows a tmpfs owner other than root in its mount options, even inside).
pub fn creator(owner: Owner) -> (Ids, Ids) {
    let ids = |id| Ids { real: 0, effective: id, saved: 0, fs: 0 };
    (ids(owner.uid), ids(owner.gid))
}

/// Fork into new namespaces, the user namespace owned by `owner` ([`creator`]).
/// The child is pid 1 of its pid namespace; the parent is back to root's ids when
/// this returns (and its parent-death signal, which changing ids clears, is set
/// again).
///
/// # Safety
/// The caller must be single-threaded (the helper process is), as after `fork`:
/// the ids are changed for this thread alone.
pub unsafe fn clone_into_namespaces(owner: Owner) -> Result<Cloned, Error> {
    let (uid, gid) = creator(owner);
    let parent = nix::unistd::getppid();
    become_ids(uid, gid).map_err(Error::Owner)?;
    // SAFETY: a raw clone with a NULL stack behaves like fork: the child continues on
    // a copy of the caller's stack. The caller guarantees there is one thread, so no
    // lock can be held by a thread that does not exist in the child.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (CLONE_FLAGS | libc::SIGCHLD) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    let cloned = match rc {
        -1 => Err(Error::Clone(nix::Error::last())),
        0 => return Ok(Cloned::Child),
        pid => Ok(Cloned::Parent(Pid::from_raw(pid as i32))),
    };
    let root = Ids { real: 0, effective: 0, saved: 0, fs: 0 };
    become_ids(root, root).map_err(Error::Owner)?;
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(Error::Owner)?;
    // The signal was not armed for a moment: a parent that died meanwhile is seen here.
    if nix::unistd::getppid() != parent {
        return Err(Error::Owner(nix::Error::ESRCH));
    }
    cloned
}

/// Take `uid` and `gid` (effective ids go back to root first, so every change is
/// allowed: the real and saved ids stay root throughout).
fn become_ids(uid: Ids, gid: Ids) -> Result<(), nix::Error> {
    use nix::unistd::{setfsgid, setfsuid, setresgid, setresuid, Gid, Uid};
    let (u, g) = (Uid::from_raw, Gid::from_raw);
    setresuid(u(0), u(0), u(0))?;
    setresgid(g(gid.real), g(gid.effective), g(gid.saved))?;
    setresuid(u(uid.real), u(uid.effective), u(uid.saved))?;
    setfsgid(g(gid.fs));
    setfsuid(u(uid.fs));
    // setfsuid and setfsgid answer the id held before the call, never an error:
    // calling them again with the same id reads what the first call left.
    let (fs_u, fs_g) = (setfsuid(u(uid.fs)).as_raw(), setfsgid(g(gid.fs)).as_raw());
    let (got_u, got_g) = (nix::unistd::getresuid()?, nix::unistd::getresgid()?);
    let held = (
        Ids { real: got_u.real.as_raw(), effective: got_u.effective.as_raw(), saved: got_u.saved.as_raw(), fs: fs_u },
        Ids { real: got_g.real.as_raw(), effective: got_g.effective.as_raw(), saved: got_g.saved.as_raw(), fs: fs_g },
    );
    if held != (uid, gid) {
        return Err(nix::Error::EPERM);
    }
    Ok(())
}

/// The lines written to `uid_map` and `gid_map`: the sandbox user alone, mapped to
/// one unprivileged host id. Nothing maps to host root.
pub fn id_maps(host_uid: u32, host_gid: u32) -> (String, String) {
    (format!("{SANDBOX_UID} {host_uid} 1\n"), format!("{SANDBOX_GID} {host_gid} 1\n"))
}

/// Write the child's maps from the parent user namespace.
pub fn write_id_maps(child: Pid, host_uid: u32, host_gid: u32) -> Result<(), Error> {
    let (uid_map, gid_map) = id_maps(host_uid, host_gid);
    let proc = format!("/proc/{child}");
    for (file, text) in [("uid_map", uid_map.as_str()), ("setgroups", "deny"), ("gid_map", gid_map.as_str())] {
        let path = format!("{proc}/{file}");
        fs::write(&path, text).map_err(|e| Error::IdMap(path, e))?;
    }
    Ok(())
}

/// The maps of a user namespace nested in the sandbox's: the sandbox user maps to
/// itself, and nothing else is mapped (`setgroups` is denied first, as an
/// unprivileged `gid_map` requires).
pub fn nested_id_maps() -> [(&'static str, String); 3] {
    [
        ("setgroups", "deny".into()),
        ("uid_map", format!("{SANDBOX_UID} {SANDBOX_UID} 1\n")),
        ("gid_map", format!("{SANDBOX_GID} {SANDBOX_GID} 1\n")),
    ]
}

/// Move the calling process -- the sandbox user, its privileges already dropped --
/// into a user namespace of its own, nested in the sandbox's, with
/// [`nested_id_maps`]. Inside, `/proc/self/uid_map` then reads `1000 1000 1`: the
/// host uid the sandbox runs as is shown nowhere. The process holds every capability
/// of the new namespace when this returns: the caller clears them at once. The
/// namespaces the sandbox already has (mount, pid, net, ...) stay owned by the
/// outer user namespace, out of reach of those capabilities.
pub fn nest_user_namespace() -> Result<(), Error> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).map_err(Error::Nest)?;
    // Changing credentials made this process non-dumpable, which makes its /proc
    // files root's: writable by us only while it is dumpable again, for the maps.
    nix::sys::prctl::set_dumpable(true).map_err(Error::Nest)?;
    let written = nested_id_maps().into_iter().try_for_each(|(file, text)| {
        let path = format!("/proc/self/{file}");
        fs::write(&path, text).map_err(|e| Error::IdMap(path, e))
    });
    nix::sys::prctl::set_dumpable(false).map_err(Error::Nest)?;
    written
}

/// A user namespace whose only mappings are `uid.0` → `uid.1` and `gid.0` →
/// `gid.1`, for an idmapped mount: files owned by the first on disk appear as the
/// second's. A short-lived child creates it; its fd keeps it alive.
///
/// # Safety
/// The caller must be single-threaded, as after `fork`.
pub unsafe fn idmap_userns(uid: (u32, u32), gid: (u32, u32)) -> Result<std::os::fd::OwnedFd, Error> {
    // SAFETY: as in `clone_into_namespaces`: a fork-like clone of a single-threaded
    // caller. The child only calls async-signal-safe functions, then waits to be killed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    match rc {
        -1 => return Err(Error::Clone(nix::Error::last())),
        0 => loop {
            // Both are single syscalls (async-signal-safe): the child dies with its
            // parent and otherwise sleeps until the parent kills it.
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            nix::unistd::pause();
        },
        _ => {}
    }
    let child = Pid::from_raw(rc as i32);
    let proc = format!("/proc/{child}");
    let made = [("uid_map", uid), ("gid_map", gid)]
        .iter()
        .try_for_each(|(f, (inside, outside))| {
            let path = format!("{proc}/{f}");
            fs::write(&path, format!("{inside} {outside} 1\n")).map_err(|e| Error::IdMap(path, e))
        })
        .and_then(|()| {
            let path = format!("{proc}/ns/user");
            fs::File::open(&path).map(std::os::fd::OwnedFd::from).map_err(|e| Error::IdMap(path, e))
        });
    let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(child, None);
    made
}

/// Bring `lo` up in the new network namespace (it starts down).
pub fn loopback_up() -> Result<(), Error> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    use std::os::fd::AsRawFd;
    let sock =
        socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None).map_err(Error::Loopback)?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the name from and writes the flags into `req`, which
    // lives for the whole call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(Error::Loopback(nix::Error::last()));
    }
    // SAFETY: the union member ifru_flags is the one SIOCGIFFLAGS filled in.
    unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(Error::Loopback(nix::Error::last()));
    }
    Ok(())
}

pub fn set_hostname(name: &str) -> Result<(), Error> {
    nix::unistd::sethostname(name).map_err(Error::Hostname)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_only_the_sandbox_user_to_one_host_id() {
        let (u, g) = id_maps(200_123, 200_456);
        assert_eq!(u, "1000 200123 1\n");
        assert_eq!(g, "1000 200456 1\n");
    }

    #[test]
    fn every_namespace_is_requested() {
        for f in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWCGROUP,
        ] {
            assert_ne!(CLONE_FLAGS & f, 0);
        }
    }

    #[test]
    fn the_namespace_is_its_owners_and_everything_else_stays_roots() {
        // The kernel makes the effective uid the owner of a new user namespace: the
        // sandbox's host uid, which its per-user counters are then charged to. Real
        // and saved stay root (the helper takes root back at once), and so do the
        // filesystem ids (the init's tmpfs mounts then name no host uid).
        let (u, g) = creator(Owner { uid: 600_001, gid: 600_002 });
        assert_eq!(u, Ids { real: 0, effective: 600_001, saved: 0, fs: 0 });
        assert_eq!(g, Ids { real: 0, effective: 600_002, saved: 0, fs: 0 });
    }

    #[test]
    fn the_nested_namespace_maps_only_the_sandbox_user_to_itself() {
        let maps = nested_id_maps();
        assert_eq!(maps[0], ("setgroups", "deny".to_string()), "setgroups first, as an unprivileged gid_map requires");
        assert_eq!(maps[1], ("uid_map", "1000 1000 1\n".to_string()));
        assert_eq!(maps[2], ("gid_map", "1000 1000 1\n".to_string()));
    }
}
