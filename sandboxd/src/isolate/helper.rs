//! The sandbox helper: one single-threaded process per run, forked by the run's
//! slot process ([`super::slot`]), so no fork ever happens in the async runtime and
//! the helper is born in the slot's cgroup.
//!
//! On the host, as root, it: reads the [`SandboxSpec`] from its control socket,
//! clones the sandbox init into new namespaces (see [`super::init`]), writes the
//! init's uid/gid maps, releases it, and reports [`Event`]s back until the init
//! exits.

use super::init;
use super::namespaces::{self, Forked};
use super::spec::{Event, SandboxSpec};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
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

/// Serve one run on `socket`: the body of a process the slot just forked, whose
/// stdout/stderr are the run's output pipes. Never returns.
pub fn serve(socket: UnixStream) -> ! {
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

fn run(socket: UnixStream, control: &mut Control) -> Result<(), Failure> {
    // The slot dies with the daemon; the helper dies with the slot.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(Failure::at("PR_SET_PDEATHSIG"))?;
    let mut line = String::new();
    BufReader::new(socket).read_line(&mut line).map_err(Failure::at("read spec"))?;
    if line.is_empty() {
        return Err(Failure { step: "read spec", error: "the daemon closed the control socket".into() });
    }
    let spec: SandboxSpec = serde_json::from_str(&line).map_err(Failure::at("parse spec"))?;
    control.send(&Event::HelperStarted { pid: nix::unistd::getpid().as_raw() });

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
