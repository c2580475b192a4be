//! Inside a pooled sandbox: what each fork of its template interpreter runs to
//! become a sandbox of its own. (The daemon's handle on the template is
//! [`super::pooled::PooledTemplate`].)
//!
//! A pooled sandbox's Python (`runner.py --template`) imports the policy's preload
//! modules once and then serves runs one after another: for each it forks, and the
//! fork calls [`sandboxd_enter`] (this crate is also built as `libsandboxd.so`,
//! which the template loads from an fd the daemon hands it). The fork then:
//!
//! 1. leaves the template's namespaces for new user, mount, pid, net, ipc, uts and
//!    cgroup namespaces (nested in the template's), mapping only the sandbox user;
//! 2. forks the run's init (pid 1 of the new pid namespace), which mounts a fresh
//!    `/proc` (its files masked), brings up `lo`, and then goes through exactly the
//!    lockdown of a cold sandbox ([`super::init::lock_down_and_fork`]): no
//!    privileges, the seccomp filter, a new session, rlimits, Landlock;
//! 3. returns 0 to Python in the locked-down process, which says it entered and
//!    waits for its code.
//!
//! In step 2, just before Landlock (whose rules name `/tmp` and `/dev/shm`), the
//! run's process asks the daemon on the run's socket ([`ask_to_be_furnished`]) and
//! the template's helper (host root) mounts the fork's own `/tmp` and `/dev/shm`
//! and masks `/proc`'s directories from outside ([`super::attach::furnish`]): a
//! tmpfs the fork made itself would name the template's host uid in its mount
//! options.
//!
//! The first fork stays outside, in the template's pid namespace: it waits for the
//! run's init and writes how the run ended ([`Report`]) on the run's report channel,
//! a pipe only it holds: the init closes its copy before anything else, so no
//! process of the run, and no user code, ever has it. The run's own socket, which
//! the user's code shares with the runner, carries only what the runner says (see
//! [`crate::pool`] for what the daemon accepts from it, and when). Killing the
//! run's init ends everything in the run; the template, which never runs user
//! code, serves the next one. The workspace is mounted into the run's mount
//! namespace by the sandbox's helper, from outside ([`super::helper`]).
//!
//! Nothing here allocates after the first fork beyond what the cold init does
//! (its report lines go through a fixed buffer, [`InitLine::write`]); the
//! template's Python is single-threaded in the fork (threads do not survive it).

use super::channel;
use super::init::{self, Role};
use super::message::{Exit, Failure, ForkMessage, ForkReply, InitLine, Report};
use super::mounts::{self, MountOp};
use super::namespaces;
use super::spec::{ChildSpec, SANDBOX_GID, SANDBOX_UID};
use nix::sys::signal::Signal;
use nix::unistd::{fork, ForkResult};
use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// The namespaces a fork leaves the template's for.
const UNSHARE_FLAGS: libc::c_int = namespaces::CLONE_FLAGS;

/// C entry point, called by the template's fork with the [`ChildSpec`] as JSON, the
/// run's socket and the run's report channel. Returns 0 in the run's process,
/// locked down, without the report channel; writes [`Report::Failed`] on the report
/// channel and returns -1 when the sandbox could not be made. The other processes
/// it makes never return.
///
/// # Safety
/// `spec` must point to `len` readable bytes; the caller must be single-threaded
/// (a fresh fork) and `socket` and `report` open fds it owns.
#[no_mangle]
pub unsafe extern "C" fn sandboxd_enter(spec: *const u8, len: usize, socket: RawFd, report: RawFd) -> libc::c_int {
    if spec.is_null() || socket < 0 || report < 0 || socket == report {
        return -1;
    }
    // SAFETY: the caller passes `len` readable bytes at `spec`.
    let bytes = unsafe { std::slice::from_raw_parts(spec, len) };
    // SAFETY: the caller owns `report`; the outer process writes on it and ends
    // (through _exit, so nothing closes it twice).
    let mut out = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(report) });
    let result = channel::parse::<ChildSpec>(bytes)
        .map_err(Failure::at("parse the run's spec"))
        .and_then(|spec| enter(&spec, socket, report));
    match result {
        Ok(()) => 0,
        Err(f) => {
            send(&mut out, &Report::Failed { step: f.step.into(), error: f.error });
            -1
        }
    }
}

fn send(out: &mut File, msg: &Report) {
    let _ = channel::write_line(out, msg);
}

/// The run's own `/proc`, its files masked as a cold sandbox's (the template's
/// stays fully visible, which the kernel requires for this mount; the directories'
/// masks come from the helper with the fork's `/tmp`).
pub fn fresh_proc() -> Vec<MountOp> {
    let proc = PathBuf::from("/proc");
    let mut ops = vec![MountOp::Proc { dst: proc.clone() }];
    ops.extend(mounts::proc_file_masks(&proc, std::path::Path::new("/dev/null")));
    ops
}

/// The id maps of the run's user namespace: the sandbox user maps to itself in the
/// template's namespace (the only id a process may map without privileges there).
pub fn id_maps() -> [(&'static str, String); 3] {
    [
        ("setgroups", "deny".into()),
        ("uid_map", format!("{SANDBOX_UID} {SANDBOX_UID} 1\n")),
        ("gid_map", format!("{SANDBOX_GID} {SANDBOX_GID} 1\n")),
    ]
}

fn enter(spec: &ChildSpec, socket: RawFd, report: RawFd) -> Result<(), Failure> {
    // The template's descriptors (its socket to the daemon, the library) stay behind.
    close_fds_except(&[socket, report])?;
    // SAFETY: unshare takes flags only; the caller is single-threaded, as
    // CLONE_NEWUSER requires.
    if unsafe { libc::unshare(UNSHARE_FLAGS) } != 0 {
        return Err(Failure::at("unshare")(nix::Error::last()));
    }
    for (file, text) in id_maps() {
        std::fs::write(format!("/proc/self/{file}"), text).map_err(Failure::at("write id maps"))?;
    }

    let (report_r, report_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(Failure::at("pipe"))?;
    let (alive_r, alive_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(Failure::at("pipe"))?;
    // SAFETY: single-threaded (see above).
    match unsafe { fork() }.map_err(Failure::at("fork"))? {
        ForkResult::Child => {
            // The report channel is the outer process's alone: the run's init and
            // program never hold it.
            // SAFETY: `report` is ours (see sandboxd_enter); nothing else in this
            // process uses it.
            unsafe { libc::close(report) };
            drop((report_r, alive_w));
            run_init(spec, socket, report_w, alive_r)
        }
        ForkResult::Parent { child } => {
            drop((report_w, alive_r));
            // Output is the run's alone: this process keeps no copy of it, nor of
            // the run's socket.
            init::devnull_stdio();
            // SAFETY: `socket` is ours (see sandboxd_enter); only the run's process
            // uses it from here on.
            unsafe { libc::close(socket) };
            // SAFETY: `report` is ours (see sandboxd_enter); this process ends below.
            let mut out = unsafe { File::from_raw_fd(report) };
            // The init's final line comes once the program is gone: report it then,
            // not after the init's own exit (the rest of the run's teardown). A fork's
            // warnings have nowhere to go: a [`Report`] carries none.
            let mut lines = std::io::BufReader::new(File::from(report_r));
            let reported = match init::read_report(&mut lines, |_| {}) {
                Ok(line) => line.map(final_report),
                // An init whose report breaks its bound or its form is out of step:
                // the run ends.
                Err(e) => {
                    let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                    Some(Report::Failed { step: "read the init's report".into(), error: e.to_string() })
                }
            };
            if let Some(r) = &reported {
                send(&mut out, r);
            }
            // Reaped only once the run is gone: the template's "reaped" means that.
            let status = nix::sys::wait::waitpid(child, None);
            if reported.is_none() {
                send(&mut out, &final_message(status));
            }
            drop(alive_w);
            // SAFETY: leave without running the template's atexit handlers or
            // destructors: this process is a copy of the template's Python.
            unsafe { libc::_exit(0) }
        }
    }
}

/// How the run ended when the init did not say: killed, by the signal that killed
/// the init (SIGKILL when it exited, or cannot be waited for).
fn final_message(status: nix::Result<nix::sys::wait::WaitStatus>) -> Report {
    match status.ok().and_then(Exit::of) {
        Some(killed @ Exit::Signaled(_)) => Report::Ended(killed),
        _ => Report::Ended(Exit::KILLED),
    }
}

/// How the run ended, as the init's final line says ([`init::read_report`], which
/// hands warnings to its callback, never as its answer).
fn final_report(line: InitLine) -> Report {
    match line {
        InitLine::Ended(exit) => Report::Ended(exit),
        InitLine::Failed { step, error } => Report::Failed { step, error },
        InitLine::Warning(message) => Report::Failed { step: "read the init's report".into(), error: message },
    }
}

/// Pid 1 of the run: a fresh `/proc` and `lo`, then the cold sandbox's lockdown,
/// in which the run's process has its own filesystems mounted before Landlock
/// ([`ask_to_be_furnished`] on `socket`). Returns (as the run's process) only
/// through [`Role::Program`].
fn run_init(spec: &ChildSpec, socket: RawFd, report: OwnedFd, alive: OwnedFd) -> Result<(), Failure> {
    let mut report = File::from(report);
    let alive = File::from(alive);
    let furnish = move || ask_to_be_furnished(socket);
    let prepared = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(Failure::at("PR_SET_PDEATHSIG"))
        .and_then(|()| mounts::apply(&fresh_proc()).map_err(Failure::at("mounts")))
        .and_then(|()| namespaces::loopback_up().map_err(Failure::at("loopback")))
        .and_then(|()| {
            init::lock_down_and_fork(
                &spec.rlimits,
                Some(&spec.seccomp),
                spec.egress_port,
                Some(&furnish),
                &mut report,
                &alive,
            )
        });
    match prepared {
        Ok(Role::Program(mut err_w)) => {
            drop((report, alive));
            // A cold program becomes dumpable again at its exec (its ids do not change
            // there); a fork runs on without one, non-dumpable since its ids changed,
            // which leaves its /proc/self files to root: it could not read its own
            // `environ` nor list its own `fd`. Do what exec does.
            if let Err(e) = nix::sys::prctl::set_dumpable(true) {
                let _ = Failure::at("PR_SET_DUMPABLE")(e).write(&mut err_w);
                // SAFETY: the failed program leaves at once, without destructors.
                unsafe { libc::_exit(127) }
            }
            // Setup went well: closing the pipe tells the init so.
            drop(err_w);
            Ok(())
        }
        Ok(Role::Init(line)) => {
            let _ = line.write(&mut report);
            // SAFETY: the init leaves without destructors (a copy of Python's state).
            unsafe { libc::_exit(0) }
        }
        Err(f) => {
            let _ = f.write(&mut report);
            // SAFETY: as above.
            unsafe { libc::_exit(0) }
        }
    }
}

/// Longest answer read from the daemon before Landlock.
const FURNISHED_LINE: usize = 256;

/// In the run's process, before Landlock (whose rules name `/tmp` and `/dev/shm`,
/// so they must be the run's own by then): ask the daemon on the run's socket for
/// the fork's own `/tmp`, `/dev/shm` and `/proc` masks, which the template's helper
/// mounts from outside ([`super::attach::furnish`]), and wait until they are there.
/// No user code has run: the socket is the runner's and the daemon's alone.
fn ask_to_be_furnished(socket: RawFd) -> Result<(), Failure> {
    use std::io::Read;
    // SAFETY: `socket` is the run's socket, open for as long as this process lives;
    // ManuallyDrop leaves it open for the runner, which reads on from it.
    let mut sock = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(socket) });
    channel::write_line(&mut *sock, &ForkMessage::Furnish(true)).map_err(Failure::at("ask for /tmp"))?;
    // One line, a byte at a time: nothing after it may be taken from the runner.
    let mut line = Vec::with_capacity(32);
    let mut byte = [0u8; 1];
    loop {
        match sock.read(&mut byte) {
            Ok(0) => return Err(Failure { step: "furnish", error: "the daemon closed the run's socket".into() }),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) if line.len() < FURNISHED_LINE => line.push(byte[0]),
            Ok(_) => return Err(Failure { step: "furnish", error: "the daemon's answer is too long".into() }),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Failure::at("read the daemon's answer")(e)),
        }
    }
    match channel::parse::<ForkReply>(&line) {
        Ok(ForkReply::Furnished(true)) => Ok(()),
        _ => Err(Failure { step: "furnish", error: "the daemon did not furnish the fork".into() }),
    }
}

/// Close every fd from 3 up but those in `keep`.
fn close_fds_except(keep: &[RawFd]) -> Result<(), Failure> {
    for (first, last) in ranges_to_close(keep) {
        // SAFETY: close_range only closes our own descriptors.
        if unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) } != 0 {
            return Err(Failure::at("close_range")(nix::Error::last()));
        }
    }
    Ok(())
}

/// The ranges of fds from 3 up that are not in `keep`.
fn ranges_to_close(keep: &[RawFd]) -> Vec<(u32, u32)> {
    let mut keep: Vec<u32> = keep.iter().filter_map(|k| u32::try_from(*k).ok()).filter(|k| *k >= 3).collect();
    keep.sort_unstable();
    keep.dedup();
    let mut ranges = vec![];
    let mut first = 3u32;
    for k in keep {
        if k > first {
            ranges.push((first, k - 1));
        }
        first = k + 1;
    }
    // fds are below 2^31: `first` did not wrap.
    ranges.push((first, u32::MAX));
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_maps_only_the_sandbox_user_and_leaves_every_namespace() {
        let maps = id_maps();
        assert_eq!(maps[0], ("setgroups", "deny".to_string()), "setgroups first, as gid_map requires");
        assert_eq!(maps[1].1, "1000 1000 1\n");
        assert_eq!(maps[2].1, "1000 1000 1\n");
    }

    #[test]
    fn a_fork_mounts_a_fresh_proc_then_masks_its_files() {
        let ops = fresh_proc();
        let null = std::path::Path::new("/dev/null");
        assert_eq!(ops[0], MountOp::Proc { dst: "/proc".into() });
        assert_eq!(ops[1..], mounts::proc_file_masks(std::path::Path::new("/proc"), null)[..]);
        assert!(ops.contains(&MountOp::MaskFile { path: "/proc/cmdline".into(), null: null.into() }));
        assert!(ops.contains(&MountOp::ReadOnly { path: "/proc/sysrq-trigger".into() }));
        // The directories' masks are the helper's (attach::furnishings).
        assert!(!ops.iter().any(|o| matches!(o, MountOp::MaskDir { .. } | MountOp::Tmpfs { .. })));
    }

    #[test]
    fn the_final_message_says_how_the_run_ended() {
        use nix::sys::wait::WaitStatus;
        let pid = nix::unistd::Pid::from_raw(2);
        fn report(lines: &[InitLine], cut: usize) -> Option<Report> {
            let text: Vec<u8> = lines.iter().flat_map(InitLine::encode).collect();
            init::read_report(&mut &text[..text.len() - cut], |_| {}).unwrap().map(final_report)
        }
        let careful = || InitLine::Warning("careful".into());
        let ended = |exit| InitLine::Ended(exit);
        assert_eq!(report(&[careful(), ended(Exit::Exited(3))], 0), Some(Report::Ended(Exit::Exited(3))));
        assert_eq!(report(&[ended(Exit::Signaled(9))], 0), Some(Report::Ended(Exit::Signaled(9))));
        assert_eq!(
            report(&[InitLine::Failed { step: "landlock".into(), error: "nope".into() }], 0),
            Some(Report::Failed { step: "landlock".into(), error: "nope".into() })
        );
        // Reported as soon as a final line is complete; a warning is not one.
        assert_eq!(report(&[careful()], 0), None);
        assert_eq!(report(&[careful(), ended(Exit::Exited(0))], 1), None);
        assert_eq!(report(&[careful(), ended(Exit::Exited(0))], 0), Some(Report::Ended(Exit::Exited(0))));
        // Without one, the init's own status says.
        let killed = |s| final_message(Ok(WaitStatus::Signaled(pid, s, false)));
        assert_eq!(killed(Signal::SIGKILL), Report::Ended(Exit::Signaled(9)));
        assert_eq!(killed(Signal::SIGSEGV), Report::Ended(Exit::Signaled(11)));
        assert_eq!(final_message(Ok(WaitStatus::Exited(pid, 0))), Report::Ended(Exit::KILLED));
        assert_eq!(final_message(Err(nix::Error::ECHILD)), Report::Ended(Exit::KILLED));
    }

    #[test]
    fn a_fork_keeps_only_its_socket_and_report_channel() {
        assert_eq!(ranges_to_close(&[5, 7]), vec![(3, 4), (6, 6), (8, u32::MAX)]);
        assert_eq!(ranges_to_close(&[7, 3]), vec![(4, 6), (8, u32::MAX)]);
        assert_eq!(ranges_to_close(&[4, 5]), vec![(3, 3), (6, u32::MAX)]);
        assert_eq!(ranges_to_close(&[]), vec![(3, u32::MAX)]);
    }
}
