//! The sandbox helper: one single-threaded process per run, forked by the run's
//! slot process ([`super::slot`]), so no fork ever happens in the async runtime and
//! the helper is born in the slot's cgroup.
//!
//! On the host, as root, it: reads the [`SandboxSpec`] from its control socket,
//! clones the sandbox init into new namespaces (see [`super::init`]), writes the
//! init's uid/gid maps, releases it, and reports [`Event`]s back until the init
//! exits, translating the init's [`InitLine`]s. The messages are in
//! [`super::message`].

use super::attach;
use super::channel;
use super::init;
use super::message::{Attach, Event, Exit, Failure, HelperRequest, InitLine};
use super::namespaces::{self, Cloned};
use super::netns;
use super::spec::{SandboxSpec, MAX_SPEC_LINE};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;
use std::fs::File;
use std::io::{BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

struct Control(UnixStream);

impl Control {
    fn send(&mut self, event: &Event) {
        // If the daemon is gone there is no one to tell; PDEATHSIG ends us anyway.
        let _ = channel::write_line(&mut self.0, event);
    }

    /// Send `event` with `fd` attached to its bytes (the daemon's reader takes
    /// the fds that come with a line: `isolate::fdstream`).
    fn send_with_fd(&mut self, event: &Event, fd: &OwnedFd) -> Result<(), Failure> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        use std::os::fd::AsRawFd;
        let line = channel::encode(event).map_err(Failure::at("encode an event"))?;
        let raw = [fd.as_raw_fd()];
        let iov = [std::io::IoSlice::new(&line)];
        let sent = sendmsg::<()>(self.0.as_raw_fd(), &iov, &[ControlMessage::ScmRights(&raw)], MsgFlags::empty(), None)
            .map_err(Failure::at("send the egress listener"))?;
        if sent != line.len() {
            return Err(Failure { step: "send the egress listener", error: "a short write".into() });
        }
        Ok(())
    }
}

/// Serve one run on `socket`: the body of a process the slot just forked, whose
/// stdout/stderr are the run's output pipes, and `stdin`, when given, the program's
/// socket to the daemon (a pooled sandbox). Never returns.
pub fn serve(socket: UnixStream, stdin: Option<OwnedFd>) -> ! {
    let mut control = match socket.try_clone() {
        Ok(s) => Control(s),
        Err(_) => std::process::exit(2),
    };
    let code = match run(socket, stdin, &mut control) {
        Ok(()) => 0,
        Err(f) => {
            control.send(&Event::SetupFailed { step: f.step.into(), error: f.error });
            1
        }
    };
    std::process::exit(code)
}

fn run(socket: UnixStream, stdin: Option<OwnedFd>, control: &mut Control) -> Result<(), Failure> {
    // The slot dies with the daemon; the helper dies with the slot.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(Failure::at("PR_SET_PDEATHSIG"))?;
    let mut requests = BufReader::new(socket);
    let Some(line) = channel::read_line(&mut requests, MAX_SPEC_LINE).map_err(Failure::at("read spec"))? else {
        return Err(Failure { step: "read spec", error: "the daemon closed the control socket".into() });
    };
    let spec: SandboxSpec = channel::parse(&line).map_err(Failure::at("parse spec"))?;
    control.send(&Event::HelperStarted { pid: nix::unistd::getpid().as_raw() });

    let (go_r, go_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(Failure::at("pipe"))?;
    let (report_r, report_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(Failure::at("pipe"))?;

    // The sandbox's user namespace is its host uid's: what it holds of the kernel's
    // per-user counters is charged there, not to host root.
    let owner = namespaces::Owner { uid: spec.host_uid, gid: spec.host_gid };
    // SAFETY: the helper is single-threaded: it never starts a thread.
    match unsafe { namespaces::clone_into_namespaces(owner) }.map_err(Failure::at("clone namespaces"))? {
        Cloned::Child => {
            drop(go_w);
            drop(report_r);
            init::run(&spec, go_r, report_w, stdin)
        }
        Cloned::Parent(child) => {
            drop(stdin);
            drop(go_r);
            drop(report_w);
            supervise(&spec, child, go_w, report_r, requests, control)
        }
    }
}

fn supervise(
    spec: &SandboxSpec,
    child: Pid,
    go: OwnedFd,
    report: OwnedFd,
    requests: BufReader<UnixStream>,
    control: &mut Control,
) -> Result<(), Failure> {
    let ends = |f: Failure| {
        let _ = kill(child, Signal::SIGKILL);
        let _ = waitpid(child, None);
        f
    };
    namespaces::write_id_maps(child, spec.host_uid, spec.host_gid)
        .map_err(Failure::at("write id maps"))
        .map_err(ends)?;
    // A pooled sandbox's mount namespace, for workspaces attached later.
    let sandbox_ns = match spec.workspace {
        Some(_) => None,
        None => Some(
            File::open(format!("/proc/{child}/ns/mnt"))
                .map_err(Failure::at("open the sandbox's mount namespace"))
                .map_err(ends)?,
        ),
    };
    // The egress proxy's end in the sandbox, made before anything runs there (not in
    // a template's: it runs no user code, and each fork gets its own at Furnish).
    let listener = match &spec.egress {
        Some(egress) if !spec.template => {
            // The child is ours (no other can reap it): its pid is its own.
            let net = File::open(format!("/proc/{child}/ns/net"))
                .map_err(Failure::at("open the sandbox's network namespace"))
                .map_err(ends)?;
            Some(netns::listen_in(&net, egress.port).map_err(Failure::at("egress")).map_err(ends)?)
        }
        _ => None,
    };
    // The write end stays open for as long as the helper lives: the init watches
    // it, and ends the sandbox when it sees end-of-file.
    let mut go = File::from(go);
    go.write_all(b"g").map_err(Failure::at("release init")).map_err(ends)?;
    match listener {
        Some(fd) => {
            control.send_with_fd(&Event::Started { init_pid: child.as_raw(), listener: true }, &fd).map_err(ends)?
        }
        None => control.send(&Event::Started { init_pid: child.as_raw(), listener: false }),
    }

    // Our copies of the output pipes must not keep them open: only the sandbox's.
    let devnull = File::options().write(true).open("/dev/null").map_err(Failure::at("open /dev/null"))?;
    let _ = nix::unistd::dup2_stdout(&devnull);
    let _ = nix::unistd::dup2_stderr(&devnull);
    if let Some(ns) = sandbox_ns {
        serve_attaches(spec, &ns, requests, &report, control).map_err(ends)?;
    }

    // The init's warnings go to the daemon as they come.
    let mut report = BufReader::new(File::from(report));
    let last = init::read_report(&mut report, |message| control.send(&Event::Warning { message }))
        .map_err(Failure::at("read the init's report"))
        .map_err(ends)?
        .map(InitLine::into_event);
    // The program's status is known once the init has reported it: send it now. The
    // init's exit (the sandbox's namespaces being torn down) is not waited for.
    if let Some(e) = last {
        control.send(&e);
        let _ = waitpid(child, None);
        drop(go);
        return Ok(());
    }
    let status = waitpid(child, None).map_err(Failure::at("wait for init"))?;
    control.send(&init_ended(status));
    drop(go);
    Ok(())
}

/// What the helper says when the init ended without reporting how the program
/// ended: the signal that killed the init, or that it ended without a status.
fn init_ended(status: WaitStatus) -> Event {
    match Exit::of(status) {
        Some(Exit::Signaled(signal)) => Event::InitKilled { signal },
        _ => Event::SetupFailed { step: "init".into(), error: format!("init ended without a status: {status:?}") },
    }
}

/// Serve the daemon's [`HelperRequest`]s, one at a time, until the init ends (its
/// report pipe turns readable) or the daemon hangs up: a template fork's own
/// filesystems ([`HelperRequest::Furnish`], answered by [`Event::Furnished`]) and
/// workspaces ([`HelperRequest::Attach`], answered by [`Event::Attached`]). The
/// daemon asks only once the fork's process said it is ready, so its own
/// namespaces and `/proc` are built by then.
fn serve_attaches(
    spec: &SandboxSpec,
    sandbox_ns: &File,
    mut requests: BufReader<UnixStream>,
    report: &OwnedFd,
    control: &mut Control,
) -> Result<(), Failure> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    // Idmap namespaces by owner: making one costs a process; a session's runs reuse it.
    let mut idmaps: std::collections::HashMap<(u32, u32), OwnedFd> = Default::default();
    let furnishings = attach::furnishings(spec.tmp_size_bytes, spec.shm_size_bytes);
    loop {
        if !requests.buffer().contains(&b'\n') {
            let mut fds = [
                PollFd::new(requests.get_ref().as_fd(), PollFlags::POLLIN),
                PollFd::new(report.as_fd(), PollFlags::POLLIN),
            ];
            if poll(&mut fds, PollTimeout::NONE).is_err() {
                continue;
            }
            if fds[1].any().unwrap_or(true) {
                return Ok(());
            }
        }
        let Some(line) = channel::read_line(&mut requests, REQUEST_LINE).map_err(Failure::at("read a request"))? else {
            return Ok(());
        };
        let req: HelperRequest = channel::parse(&line).map_err(Failure::at("parse a request"))?;
        match req {
            HelperRequest::Furnish { pid } => {
                let run_ns = run_namespaces(pid)?;
                let host_ns =
                    File::open("/proc/self/ns/mnt").map_err(Failure::at("open the host's mount namespace"))?;
                attach::furnish(&furnishings, run_ns.mnt.as_fd(), host_ns.as_fd()).map_err(Failure::at("furnish"))?;
                // The fork's own network namespace gets its egress listener.
                match &spec.egress {
                    Some(egress) => {
                        let fd = netns::listen_in(&run_ns.net, egress.port).map_err(Failure::at("egress"))?;
                        control.send_with_fd(&Event::Furnished { listener: true }, &fd)?;
                    }
                    None => control.send(&Event::Furnished { listener: false }),
                }
            }
            HelperRequest::Attach(req) => {
                if idmaps.len() >= 64 {
                    idmaps.clear();
                }
                let owner = (req.owner_uid, req.owner_gid);
                let userns = match idmaps.remove(&owner) {
                    Some(fd) => fd,
                    // SAFETY: the helper is single-threaded.
                    None => unsafe { namespaces::idmap_userns((owner.0, spec.host_uid), (owner.1, spec.host_gid)) }
                        .map_err(Failure::at("idmap user namespace"))?,
                };
                attach(sandbox_ns, &req, &userns)?;
                idmaps.insert(owner, userns);
                control.send(&Event::Attached);
            }
        }
    }
}

/// Longest request line read from the daemon.
const REQUEST_LINE: usize = 64 * 1024;

/// A process of this sandbox's namespaces (see [`run_namespaces`]).
struct RunNamespaces {
    mnt: File,
    net: File,
}

/// The mount and network namespaces of `pid`, which must be one of this
/// sandbox's processes. The pid is held by a pidfd from before it is checked
/// until after its namespaces are opened, and found alive then: had it ended
/// and its number gone to another process meanwhile, these would be that one's
/// (a host process's, say), and the workspace or the egress listener would land
/// there.
fn run_namespaces(pid: i32) -> Result<RunNamespaces, Failure> {
    let not_ours = || Failure { step: "attach workspace", error: format!("pid {pid} is not in this sandbox") };
    let held = rustix::process::Pid::from_raw(pid).ok_or_else(not_ours)?;
    let pidfd = rustix::process::pidfd_open(held, rustix::process::PidfdFlags::empty())
        .map_err(|e| Failure { step: "find the run", error: format!("pidfd_open {pid}: {e}") })?;
    let ours = std::fs::read_to_string("/proc/self/cgroup").map_err(Failure::at("read our cgroup"))?;
    let theirs = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(Failure::at("find the run"))?;
    if ours != theirs {
        return Err(not_ours());
    }
    let mnt = File::open(format!("/proc/{pid}/ns/mnt")).map_err(Failure::at("open the run's mount namespace"))?;
    let net = File::open(format!("/proc/{pid}/ns/net")).map_err(Failure::at("open the run's network namespace"))?;
    // A pidfd is readable once its process has ended (even one not yet reaped,
    // whose number cannot have gone to another: refused too).
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
    let ended = poll(&mut fds, PollTimeout::ZERO).map_err(Failure::at("find the run"))? != 0;
    if ended {
        return Err(Failure { step: "find the run", error: format!("pid {pid} ended while it was being attached") });
    }
    Ok(RunNamespaces { mnt, net })
}

/// Mount `req`'s workspace at `/mnt/data` in the sandbox, or in the mount
/// namespace of `req.pid`, which must be one of this sandbox's processes, with the
/// idmap of `userns`.
fn attach(sandbox_ns: &File, req: &Attach, userns: &OwnedFd) -> Result<(), Failure> {
    use std::os::fd::AsFd;
    let run_ns = req.pid.map(run_namespaces).transpose()?;
    let host_ns = File::open("/proc/self/ns/mnt").map_err(Failure::at("open the host's mount namespace"))?;
    let target = run_ns.as_ref().map_or(sandbox_ns, |ns| &ns.mnt);
    attach::workspace(&req.workspace, userns.as_fd(), target.as_fd(), host_ns.as_fd())
        .map_err(Failure::at("attach workspace"))?;
    if let Some(layer) = &req.packages {
        attach::packages(layer, userns.as_fd(), target.as_fd(), host_ns.as_fd())
            .map_err(Failure::at("attach the package layer"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_init_that_ended_without_a_report_is_said_to_be_killed_or_to_have_failed() {
        let pid = Pid::from_raw(2);
        assert_eq!(init_ended(WaitStatus::Signaled(pid, Signal::SIGKILL, false)), Event::InitKilled { signal: 9 });
        assert_eq!(init_ended(WaitStatus::Signaled(pid, Signal::SIGSEGV, true)), Event::InitKilled { signal: 11 });
        let Event::SetupFailed { step, error } = init_ended(WaitStatus::Exited(pid, 0)) else { panic!() };
        assert_eq!((step.as_str(), error.as_str()), ("init", "init ended without a status: Exited(Pid(2), 0)"));
    }
}
