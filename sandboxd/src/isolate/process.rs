//! Process plumbing the daemon uses on its sandboxes: pidfds, signals, the
//! children of a process, pipes. Nothing here knows what a sandbox is.

use std::os::fd::OwnedFd;

/// A pidfd for `pid`.
pub fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid).ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    Ok(rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?)
}

/// SIGKILL the process behind `pidfd` (nothing happens if it has already ended).
pub fn pidfd_kill(pidfd: &OwnedFd) {
    let _ = rustix::process::pidfd_send_signal(pidfd, rustix::process::Signal::KILL);
}

/// Send `sig` to the process behind `pidfd`: never to another process that got its
/// pid since (nothing happens if it has already ended).
pub fn pidfd_signal(pidfd: &OwnedFd, sig: nix::sys::signal::Signal) {
    if let Some(sig) = rustix::process::Signal::from_named_raw(sig as i32) {
        let _ = rustix::process::pidfd_send_signal(pidfd, sig);
    }
}

pub fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

/// SIGKILL the sandbox's init: the kernel then kills its whole pid namespace, and the
/// helper reaps the init, reports and exits. Only when the init is not known yet is
/// the helper killed instead (the init, if any, dies with it).
pub fn kill_all(init_pid: Option<i32>, helper_pid: Option<i32>) {
    if let Some(pid) = init_pid.or(helper_pid) {
        signal(pid, nix::sys::signal::Signal::SIGKILL);
    }
}

/// The host pids of `pid`'s children (its main thread's).
pub fn children(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// A close-on-exec pipe: (read end, write end).
pub fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(Into::into)
}

/// A pipe for a sandbox's output, owned by the host ids the sandbox user maps to.
/// A pipe's inode is its maker's (host root, mode 0600): inside, opening it again
/// by name (`/dev/stdout`, `/proc/self/fd/1`, which a shell's `echo x > /dev/stderr`
/// does) found it owned by an unmapped user, and failed with EACCES. Owned by the
/// sandbox's own ids it opens as it would in a plain process; nothing else of the
/// host can reach it (it has no name, only fds).
pub fn output_pipe(uid: u32, gid: u32) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = pipe()?;
    nix::unistd::fchown(&w, Some(nix::unistd::Uid::from_raw(uid)), Some(nix::unistd::Gid::from_raw(gid)))?;
    Ok((r, w))
}

/// A connected pair of stream sockets: the daemon's end (non-blocking, for tokio)
/// and the other.
pub fn socket_pair() -> std::io::Result<(tokio::net::UnixStream, std::os::unix::net::UnixStream)> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    Ok((tokio::net::UnixStream::from_std(ours)?, theirs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn a_pidfd_signal_reaches_its_process_and_nothing_once_it_is_gone() {
        let Ok(mut child) = std::process::Command::new("sleep").arg("30").spawn() else {
            panic!("sleep could not be started")
        };
        let pid = i32::try_from(child.id()).unwrap_or_default();
        let pidfd = pidfd_open(pid).unwrap();
        pidfd_signal(&pidfd, nix::sys::signal::Signal::SIGTERM);
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        // Reaped: the pidfd still names that process, and a signal through it goes
        // nowhere (by pid it would reach whatever has the pid now).
        pidfd_signal(&pidfd, nix::sys::signal::Signal::SIGKILL);
        pidfd_kill(&pidfd);
    }
}
