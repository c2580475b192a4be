//! Slots: a cgroup plus a small resident process in it (`sandboxd __sandbox`), made
//! once and reused run after run.
//!
//! Moving a process into a v1 cgroup waits for an RCU grace period (~10 ms) while
//! holding a lock that stalls every fork on the machine. A slot pays that once:
//! for each run the daemon hands the slot a control socket and the two output
//! pipes (SCM_RIGHTS over a SOCK_SEQPACKET socket), and the slot forks the run's
//! helper ([`super::helper`]), which is born in the slot's cgroup without any
//! migration and without an exec.

use super::cgroup::RunCgroup;
use super::channel;
use super::helper;
use super::message::{Failure, HelperFds, Prepare, SlotReply, RUN_BYTE};
use nix::sys::signal::{signal, SigHandler, Signal};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// The hidden first argument that turns the `sandboxd` binary into a slot.
pub const HELPER_ARG: &str = "__sandbox";
/// Longest datagram a slot or the daemon reads from the other.
const DATAGRAM: usize = 64 * 1024;

fn send_reply(sock: &OwnedFd, msg: &SlotReply) -> Result<(), Failure> {
    channel::send_datagram(sock.as_fd(), msg).map_err(Failure::at("send"))
}

/// Entry point of `sandboxd __sandbox`: the slot process. Never returns.
pub fn main() -> ! {
    let code = match slot_main() {
        Ok(()) => 0,
        Err(_) => 1,
    };
    std::process::exit(code)
}

fn slot_main() -> Result<(), Failure> {
    // SAFETY: the daemon starts the slot with its SOCK_SEQPACKET socket as fd 0 and
    // nothing else owns fd 0 in this fresh process.
    let stdin = unsafe { OwnedFd::from_raw_fd(0) };
    let sock = rustix::io::fcntl_dupfd_cloexec(&stdin, 3).map_err(Failure::at("dup"))?;
    let devnull = std::fs::File::open("/dev/null").map_err(Failure::at("open /dev/null"))?;
    // Replaces fd 0 (owned by `stdin`, forgotten below) with /dev/null.
    let _ = nix::unistd::dup2_stdin(&devnull);
    std::mem::forget(stdin);

    let prepare: Prepare = channel::recv_datagram(sock.as_fd(), DATAGRAM).map_err(Failure::at("read prepare"))?;
    let ready = join(&prepare);
    match ready {
        Ok(()) => send_reply(&sock, &SlotReply::Ready)?,
        Err(f) => {
            let _ = send_reply(&sock, &SlotReply::SetupFailed { step: f.step.into(), error: f.error.clone() });
            return Err(f);
        }
    }
    // Anything a helper leaves (a killed helper's init) comes back to the slot, not
    // to the host's pid 1.
    nix::sys::prctl::set_child_subreaper(true).map_err(Failure::at("PR_SET_CHILD_SUBREAPER"))?;
    // Helpers are reaped by the kernel: the slot never waits for them.
    // SAFETY: setting SIG_IGN installs no handler code.
    unsafe { signal(Signal::SIGCHLD, SigHandler::SigIgn) }.map_err(Failure::at("SIGCHLD"))?;

    loop {
        // [control, stdout, stderr] and, for a pooled sandbox, the program's stdin
        // socket ([`HelperFds`]).
        let fds = match channel::recv_fds::<4>(sock.as_fd(), &[3, 4]) {
            Ok(Some(fds)) => fds,
            Ok(None) => return Ok(()), // the daemon closed the socket
            Err(_) => continue,
        };
        // SAFETY: the slot is single-threaded (it never starts a thread), so the
        // child may run arbitrary code.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => {
                drop(sock);
                become_helper(fds)
            }
            Ok(nix::unistd::ForkResult::Parent { .. }) => drop(fds),
            Err(_) => drop(fds), // the daemon sees the control socket close
        }
    }
}

/// Tie the slot to the daemon and join the cgroup, once.
fn join(prepare: &Prepare) -> Result<(), Failure> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(Failure::at("PR_SET_PDEATHSIG"))?;
    if nix::unistd::getppid().as_raw() as u32 != prepare.daemon_pid {
        return Err(Failure { step: "check parent", error: "the daemon is gone".into() });
    }
    nix::unistd::setgroups(&[]).map_err(Failure::at("drop supplementary groups"))?;
    let me = nix::unistd::getpid().to_string();
    for procs in &prepare.cgroup_procs {
        std::fs::write(procs, &me)
            .map_err(|e| Failure { step: "join cgroup", error: format!("{}: {e}", procs.display()) })?;
    }
    Ok(())
}

/// In the freshly forked child: the output pipes become stdout/stderr, and the
/// helper serves the run on the control socket.
fn become_helper(fds: Vec<OwnedFd>) -> ! {
    let mut fds = fds.into_iter();
    let (Some(control), Some(stdout), Some(stderr)) = (fds.next(), fds.next(), fds.next()) else {
        std::process::exit(3)
    };
    let stdin = fds.next();
    // SAFETY: restoring the default SIGCHLD disposition installs no handler; the
    // helper must be able to wait for its own child.
    let _ = unsafe { signal(Signal::SIGCHLD, SigHandler::SigDfl) };
    // dup2 onto our own stdout/stderr (nix's wrappers only call dup2: nothing is
    // allocated in this child of a fork).
    if nix::unistd::dup2_stdout(&stdout).is_err() || nix::unistd::dup2_stderr(&stderr).is_err() {
        std::process::exit(3);
    }
    drop(stdout);
    drop(stderr);
    helper::serve(UnixStream::from(control), stdin)
}

/// Wait (blocking) for the slot's answer to [`Prepare`].
fn wait_ready(sock: &OwnedFd) -> Result<(), Failure> {
    // The attach takes ~10 ms; a slot that does not answer in 30 s is broken.
    let tv = nix::sys::time::TimeVal::new(30, 0);
    nix::sys::socket::setsockopt(sock, nix::sys::socket::sockopt::ReceiveTimeout, &tv)
        .map_err(Failure::at("setsockopt"))?;
    match channel::recv_datagram::<SlotReply>(sock.as_fd(), DATAGRAM) {
        Ok(SlotReply::Ready) => Ok(()),
        Ok(SlotReply::SetupFailed { step, error }) => Err(Failure { step: "slot", error: format!("{step}: {error}") }),
        Err(_) => Err(Failure { step: "slot", error: "the slot process ended before it was ready".into() }),
    }
}

/// The daemon's side of a slot.
pub struct Slot {
    pub id: String,
    pub process: tokio::process::Child,
    sock: OwnedFd,
    pub cg: RunCgroup,
}

impl Slot {
    /// Start a slot process in `cg` and wait until it has joined the cgroup.
    ///
    /// The process is spawned on the calling (async worker) thread: its parent-death
    /// signal fires when the thread that forked it ends, and worker threads live as
    /// long as the daemon, unlike the blocking pool's. Only the wait is blocking.
    pub async fn start(id: String, cg: RunCgroup, exe: &std::path::Path, arg: &str) -> Result<Slot, Failure> {
        let spawned = Self::spawn(&cg, exe, arg);
        let (process, cg, result) = match spawned {
            Ok((process, sock)) => {
                let waited = tokio::task::spawn_blocking(move || (wait_ready(&sock).map(|_| sock), cg)).await;
                match waited {
                    Ok((result, cg)) => (Some(process), cg, result),
                    Err(e) => return Err(Failure { step: "slot", error: e.to_string() }),
                }
            }
            Err(f) => (None, cg, Err(f)),
        };
        match (process, result) {
            (Some(process), Ok(sock)) => Ok(Slot { id, process, sock, cg }),
            (process, Err(f)) => {
                // Nothing may stay in the cgroup: kill the process, then remove it.
                if let Some(mut p) = process {
                    let _ = p.start_kill();
                    let _ = p.wait().await;
                }
                let _ = tokio::task::spawn_blocking(move || {
                    cg.kill();
                    cg.remove()
                })
                .await;
                Err(f)
            }
            (None, Ok(_)) => Err(Failure { step: "slot", error: "no slot process".into() }),
        }
    }

    fn spawn(cg: &RunCgroup, exe: &std::path::Path, arg: &str) -> Result<(tokio::process::Child, OwnedFd), Failure> {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
            .map_err(Failure::at("socketpair"))?;
        let process = tokio::process::Command::new(exe)
            .arg0("sandboxd")
            .arg(arg)
            .env_clear()
            .stdin(std::process::Stdio::from(theirs))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(Failure::at("start the slot process"))?;
        let prepare = Prepare { cgroup_procs: cg.procs_files(), daemon_pid: std::process::id() };
        channel::send_datagram(ours.as_fd(), &prepare).map_err(Failure::at("send"))?;
        Ok((process, ours))
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.id()
    }

    /// Is the slot process still there to fork helpers?
    pub fn alive(&mut self) -> bool {
        matches!(self.process.try_wait(), Ok(None))
    }

    /// Ask the slot to fork a helper for one run, handing it `fds`.
    pub fn fork_helper(&self, fds: &HelperFds<'_>) -> Result<(), Failure> {
        channel::send_fds(self.sock.as_fd(), RUN_BYTE, &fds.to_vec()).map_err(Failure::at("hand the run to the slot"))
    }
}
