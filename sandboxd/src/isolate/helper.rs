//! The sandbox helper, `sandboxd __sandbox`: a fresh, single-threaded process that
//! the daemon starts for every run, so no fork ever happens in the async runtime.
//!
//! On the host, as root, it: reads the [`SandboxSpec`] from the control socket on
//! its stdin, ties its life to the daemon's, drops supplementary groups, joins the
//! run's cgroups, clones the sandbox init into new namespaces (see [`super::init`]),
//! writes the init's uid/gid maps, releases it, and reports [`Event`]s back until
//! the init exits.

use super::init;
use super::namespaces::{self, Forked};
use super::spec::{Event, SandboxSpec};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{getpid, getppid, Pid};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// A step that failed, with its cause; reported as [`Event::SetupFailed`].
#[derive(Debug)]
pub struct Failure {
    pub step: &'static str,
    pub error: String,
}

impl Failure {
    pub fn at<E: std::fmt::Display>(step: &'static str) -> impl FnOnce(E) -> Failure {
        move |e| Failure { step, error: e.to_string() }
    }
}

struct Control(UnixStream);

impl Control {
    fn send(&mut self, event: &Event) {
        if let Ok(mut line) = serde_json::to_vec(event) {
            line.push(b'\n');
            // If the daemon is gone there is no one to tell; PDEATHSIG ends us anyway.
            let _ = self.0.write_all(&line);
        }
    }
}

/// Entry point of `sandboxd __sandbox`. Never returns.
pub fn main() -> ! {
    // SAFETY: the daemon starts the helper with the control socket as fd 0 and
    // nothing else owns fd 0 in this fresh process; we take ownership of it here.
    let stdin = unsafe { OwnedFd::from_raw_fd(0) };
    let socket = match moved_off_stdio(stdin) {
        Ok(s) => s,
        Err(_) => std::process::exit(2),
    };
    let mut control = match socket.try_clone() {
        Ok(s) => Control(s),
        Err(_) => std::process::exit(2),
    };
    let code = match run(socket, &mut control) {
        Ok(()) => 0,
        Err(f) => {
            control.send(&Event::SetupFailed { step: f.step.into(), error: f.error });
            1
        }
    };
    std::process::exit(code)
}

/// Move the control socket to a close-on-exec fd above 2 and put /dev/null on fd 0.
fn moved_off_stdio(fd: OwnedFd) -> Result<UnixStream, Failure> {
    use std::os::fd::AsRawFd;
    let dup = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(3)).map_err(Failure::at("dup control"))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new fd that nothing else owns.
    let socket = unsafe { UnixStream::from_raw_fd(dup) };
    let devnull = File::open("/dev/null").map_err(Failure::at("open /dev/null"))?;
    // SAFETY: dup2 onto fd 0 replaces the stdin we own (`fd`), which we then forget
    // so it is not closed a second time.
    if unsafe { libc::dup2(devnull.as_raw_fd(), 0) } < 0 {
        return Err(Failure::at("dup2 stdin")(nix::Error::last()));
    }
    std::mem::forget(fd);
    Ok(socket)
}

fn run(socket: UnixStream, control: &mut Control) -> Result<(), Failure> {
    let mut line = String::new();
    BufReader::new(socket).read_line(&mut line).map_err(Failure::at("read spec"))?;
    let spec: SandboxSpec = serde_json::from_str(&line).map_err(Failure::at("parse spec"))?;

    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(Failure::at("PR_SET_PDEATHSIG"))?;
    if getppid().as_raw() as u32 != spec.daemon_pid {
        return Err(Failure { step: "check parent", error: "the daemon is gone".into() });
    }
    nix::unistd::setgroups(&[]).map_err(Failure::at("drop supplementary groups"))?;
    let me = getpid().to_string();
    for procs in &spec.cgroup_procs {
        std::fs::write(procs, &me)
            .map_err(|e| Failure { step: "join cgroup", error: format!("{}: {e}", procs.display()) })?;
    }

    let (go_r, go_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(Failure::at("pipe"))?;
    let (report_r, report_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(Failure::at("pipe"))?;

    // SAFETY: the helper is single-threaded: it never starts a thread.
    match unsafe { namespaces::clone_into_namespaces() }.map_err(Failure::at("clone namespaces"))? {
        Forked::Child => {
            drop(go_w);
            drop(report_r);
            init::run(&spec, go_r, report_w)
        }
        Forked::Parent(child) => {
            drop(go_r);
            drop(report_w);
            supervise(&spec, child, go_w, report_r, control)
        }
    }
}

fn supervise(
    spec: &SandboxSpec,
    child: Pid,
    go: OwnedFd,
    report: OwnedFd,
    control: &mut Control,
) -> Result<(), Failure> {
    if let Err(e) = namespaces::write_id_maps(child, spec.host_uid, spec.host_gid) {
        let _ = kill(child, Signal::SIGKILL);
        let _ = waitpid(child, None);
        return Err(Failure::at("write id maps")(e));
    }
    // The write end stays open for as long as the helper lives: the init watches
    // it, and ends the sandbox when it sees end-of-file.
    let mut go = File::from(go);
    go.write_all(b"g").map_err(Failure::at("release init"))?;
    control.send(&Event::Started { init_pid: child.as_raw() });

    // Our copies of the output pipes must not keep them open: only the sandbox's.
    let devnull = File::options().write(true).open("/dev/null").map_err(Failure::at("open /dev/null"))?;
    for fd in [1, 2] {
        use std::os::fd::AsRawFd;
        // SAFETY: replaces our stdout/stderr with /dev/null; both are ours.
        unsafe { libc::dup2(devnull.as_raw_fd(), fd) };
    }

    let mut text = String::new();
    let _ = File::from(report).read_to_string(&mut text);
    let mut last = None;
    for line in text.lines() {
        match init::parse_report(line) {
            Some(Event::Warning { message }) => control.send(&Event::Warning { message }),
            Some(e) => last = Some(e),
            None => {}
        }
    }
    let status = waitpid(child, None).map_err(Failure::at("wait for init"))?;
    let event = match (last, status) {
        (Some(e), _) => e,
        (None, WaitStatus::Signaled(_, sig, _)) => Event::InitKilled { signal: sig as i32 },
        (None, other) => {
            Event::SetupFailed { step: "init".into(), error: format!("init ended without a status: {other:?}") }
        }
    };
    control.send(&event);
    drop(go);
    Ok(())
}
