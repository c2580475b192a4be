//! Inside the namespaces: the sandbox's init (pid 1) and the program it runs.
//!
//! The init waits until its uid/gid maps are written, builds the filesystem
//! ([`super::mounts`]), sets the hostname and brings up `lo`, drops every privilege
//! ([`super::caps`]), installs the seccomp filter, then forks the program, which
//! inherits both. The program's process sets rlimits, applies Landlock and execs.
//! The init reaps, forwards SIGTERM/SIGINT/SIGHUP to every process in the sandbox, and when
//! the program ends reports its status to the helper and exits: the kernel then
//! kills whatever else is left in the pid namespace.
//!
//! Reports travel as JSON lines on a pipe ([`InitLine`]): a warning, a failed
//! set-up step, or how the program ended ([`super::message::Exit`]); each is read
//! bounded and strictly ([`read_report`]), by the helper, a fork's outer process, and
//! the init itself (the program's set-up report).
//!
//! After the init's fork, and in a template's fork, a line is written without
//! allocating: [`InitLine::write`] encodes it into a fixed buffer on the stack, at
//! most `PIPE_BUF` bytes, so it reaches its pipe in one atomic write. (Both
//! processes are single-threaded, so allocating is safe there, and a failure's
//! text is made when it happens; the program's end is reported with no allocation
//! at all.)

use super::channel;
use super::message::{Exit, Failure, InitLine};
use super::mounts::{self, Filesystem};
use super::seccomp::{self, Program};
use super::spec::{Rlimits, SandboxSpec};
use super::{caps, landlock, namespaces, rlimits};
use nix::sys::signal::{kill, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use std::ffi::CString;
use std::fs::File;
use std::io::{BufRead, Read, Write};
use std::os::fd::OwnedFd;

pub(super) use super::message::REPORT_LINE;

/// Read a report up to its first line that says how the program ended (or how
/// setting it up failed), each line at most [`REPORT_LINE`] bytes and parsed
/// strictly; `warning` gets each warning on the way. `None`: the report ended
/// without one (a last line cut short by the writer's end included). A line over
/// the bound or one that is not an [`InitLine`] is an error, and the report is out
/// of step after it.
pub(super) fn read_report<R: BufRead>(
    report: &mut R,
    mut warning: impl FnMut(String),
) -> Result<Option<InitLine>, channel::Error> {
    loop {
        let line = match channel::read_line(report, REPORT_LINE) {
            Ok(Some(line)) => line,
            Ok(None) | Err(channel::Error::Truncated) => return Ok(None),
            Err(e) => return Err(e),
        };
        match channel::parse::<InitLine>(&line)? {
            InitLine::Warning(message) => warning(message),
            end => return Ok(Some(end)),
        }
    }
}

const FORWARDED: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP];

/// The init's whole life. Never returns. `stdin`, when given, becomes the program's
/// fd 0 (a pooled sandbox's socket to the daemon).
pub fn run(spec: &SandboxSpec, go: OwnedFd, report: OwnedFd, stdin: Option<OwnedFd>) -> ! {
    let mut report = File::from(report);
    let _ = match init(spec, go, &mut report, stdin) {
        Ok(line) => line.write(&mut report),
        Err(f) => f.write(&mut report),
    };
    // SAFETY: _exit ends this process without running anything inherited from the
    // helper's Rust runtime state (no destructors, no atexit handlers).
    unsafe { libc::_exit(0) }
}

fn init(spec: &SandboxSpec, go: OwnedFd, report: &mut File, stdin: Option<OwnedFd>) -> Result<InitLine, Failure> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(Failure::at("PR_SET_PDEATHSIG"))?;
    let mut byte = [0u8; 1];
    let mut go = File::from(go);
    match go.read(&mut byte) {
        Ok(1) => {}
        _ => return Err(Failure { step: "wait for id maps", error: "the helper is gone".into() }),
    }
    // The filesystem is built with root's filesystem ids (the helper cloned us so,
    // see namespaces::creator), creating no file: its tmpfs mounts belong to host
    // root, which their mount options do not name. caps::drop_all then makes every
    // id the sandbox user's.
    let plan = mounts::plan(&Filesystem {
        rootfs: &spec.rootfs,
        dev: &spec.dev,
        workspace: spec.workspace.as_deref(),
        packages: spec.packages.as_deref(),
        ca_bundle: spec.egress.as_ref().map(|e| e.ca_bundle.as_path()),
        tmp_size_bytes: spec.tmp_size_bytes,
        shm_size_bytes: spec.shm_size_bytes,
        // A template's forks each mount (and mask) a fresh /proc of their own.
        mask_proc: !spec.template,
    });
    mounts::apply(&plan).map_err(Failure::at("mounts"))?;
    namespaces::set_hostname(&spec.hostname).map_err(Failure::at("hostname"))?;
    namespaces::loopback_up().map_err(Failure::at("loopback"))?;
    let confine = (!spec.template).then_some(&spec.seccomp);
    let egress_port = spec.egress.as_ref().map(|e| e.port);
    match lock_down_and_fork(&spec.rlimits, confine, egress_port, None, report, &go)? {
        Role::Init(line) => Ok(line),
        Role::Program(mut err_w) => {
            if let Err(f) = exec_program(spec, stdin) {
                let _ = f.write(&mut err_w);
            }
            // SAFETY: leave the failed child at once, without destructors.
            unsafe { libc::_exit(127) }
        }
    }
}

/// Which side of [`lock_down_and_fork`] returned.
pub(super) enum Role {
    /// The init, once the program ended: the report line for the helper.
    Init(InitLine),
    /// The program's process, locked down; a failure from here on is written to
    /// the pipe, whose other end the init reads until it closes (at exec, or when
    /// the process closes it).
    Program(File),
}

/// In the init, with its filesystem built: drop every privilege, install the
/// seccomp filter, fork the program's process, which inherits both and sets its own
/// session, rlimits and Landlock, then supervise it. `confine` is the daemon's
/// compiled filter; without it (a template's interpreter, whose forks must still
/// make namespaces and mounts, and each confine themselves) there is neither
/// seccomp filter nor Landlock. `egress_port` is the one TCP port Landlock lets the
/// program connect to (the egress proxy's). `furnish`, when given, runs in the program's process
/// just before Landlock (a template's fork: its own `/tmp` and `/dev/shm` must be
/// mounted before the ruleset names them). `parent` reads end-of-file when whoever
/// started the init is gone.
pub(super) fn lock_down_and_fork(
    rlimits: &Rlimits,
    confine: Option<&Program>,
    egress_port: Option<u16>,
    furnish: Option<&dyn Fn() -> Result<(), Failure>>,
    report: &mut File,
    parent: &File,
) -> Result<Role, Failure> {
    let mut blocked = SigSet::empty();
    blocked.add(Signal::SIGCHLD);
    for s in FORWARDED {
        blocked.add(s);
    }
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&blocked), None).map_err(Failure::at("sigprocmask"))?;

    let (err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(Failure::at("pipe"))?;
    // Every privilege goes, and the seccomp filter is installed, once, here: the
    // program inherits both (loading the filter costs the kernel most of a
    // millisecond, so it is not loaded twice).
    caps::drop_all().map_err(Failure::at("drop privileges"))?;
    // No host uid shows inside: the sandbox user maps to itself in a user namespace
    // nested in the sandbox's. Entering it grants every capability of that
    // namespace and resets the securebits and the bounding set, so all of it is
    // dropped again (no-new-privs, a flag of the process, stays set).
    namespaces::nest_user_namespace().map_err(Failure::at("nested user namespace"))?;
    caps::drop_all().map_err(Failure::at("drop privileges"))?;
    // Changing credentials cleared the parent-death signal: set it again. The pipe
    // from the parent covers the moments in between: it reads end-of-file as soon
    // as the parent is gone, whenever that happened.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(Failure::at("PR_SET_PDEATHSIG"))?;
    if let Some(filter) = confine {
        seccomp::apply(filter).map_err(Failure::at("seccomp"))?;
    }
    // SAFETY: the init is single-threaded (it was cloned or forked from a
    // single-threaded process and started no thread), so the child may run
    // arbitrary code.
    let child = match unsafe { fork() }.map_err(Failure::at("fork"))? {
        ForkResult::Child => {
            drop(err_r);
            let mut err_w = File::from(err_w);
            let landlock = confine.is_some().then_some(egress_port);
            if let Err(f) = program_setup(rlimits, landlock, furnish, &mut err_w) {
                let _ = f.write(&mut err_w);
                // SAFETY: leave the failed child at once, without destructors.
                unsafe { libc::_exit(127) }
            }
            return Ok(Role::Program(err_w));
        }
        ForkResult::Parent { child } => child,
    };
    drop(err_w);
    // The program's set-up report ends at its exec (the pipe is close-on-exec) or
    // with its failure; its warnings go on to the init's own report.
    let mut setup = std::io::BufReader::new(File::from(err_r));
    loop {
        let forward = |message| {
            let _ = InitLine::Warning(message).write(report);
        };
        let failed = match read_report(&mut setup, forward) {
            Ok(None) => break,
            Ok(Some(failed @ InitLine::Failed { .. })) => failed,
            Ok(Some(_)) => continue,
            Err(e) => Failure::at("read the program's set-up report")(e).line(),
        };
        let _ = kill(child, Signal::SIGKILL);
        let _ = waitpid(child, None);
        return Ok(Role::Init(failed));
    }

    // The init keeps no output pipe open while it waits.
    devnull_stdio();
    let signals = nix::sys::signalfd::SignalFd::with_flags(&blocked, nix::sys::signalfd::SfdFlags::SFD_CLOEXEC)
        .map_err(Failure::at("signalfd"))?;
    Ok(Role::Init(reap_until_exit(child, &signals, parent)))
}

/// Point our own stdin, stdout and stderr at /dev/null, so that we hold no copy of
/// the run's output pipes.
pub(super) fn devnull_stdio() {
    if let Ok(devnull) = File::options().read(true).write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdin(&devnull);
        let _ = nix::unistd::dup2_stdout(&devnull);
        let _ = nix::unistd::dup2_stderr(&devnull);
    }
}

/// In the program's process, which has no privilege left and the init's seccomp
/// filter: its own session, limits and Landlock (`landlock`: with the egress port it
/// allows, if any; `None` for a template's interpreter: each of its forks applies
/// its own), after `furnish` when given.
fn program_setup(
    rlimits: &Rlimits,
    landlock: Option<Option<u16>>,
    furnish: Option<&dyn Fn() -> Result<(), Failure>>,
    err_w: &mut File,
) -> Result<(), Failure> {
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
        .map_err(Failure::at("sigprocmask"))?;
    nix::unistd::setsid().map_err(Failure::at("setsid"))?;
    rlimits::apply(rlimits).map_err(Failure::at("rlimits"))?;
    if let Some(furnish) = furnish {
        furnish()?;
    }
    let Some(egress_port) = landlock else {
        return Ok(());
    };
    match landlock::apply(egress_port).map_err(Failure::at("landlock"))? {
        landlock::Enforcement::Full => {}
        other => {
            let warning = InitLine::Warning(format!(
                "landlock is {} on this kernel (ABI {}); the sandbox relies on the mount namespace and seccomp alone for what it lacks",
                if other == landlock::Enforcement::None { "unavailable" } else { "only partly enforced" },
                landlock::kernel_abi()
            ));
            let _ = warning.write(err_w);
        }
    }
    Ok(())
}

/// Wait for the program to end, reaping orphans and forwarding signals meanwhile.
/// If the helper dies first, end at once: the kernel then kills the whole sandbox.
pub(super) fn reap_until_exit(child: Pid, signals: &nix::sys::signalfd::SignalFd, helper: &File) -> InitLine {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    loop {
        let mut fds = [PollFd::new(signals.as_fd(), PollFlags::POLLIN), PollFd::new(helper.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, PollTimeout::NONE).is_err() {
            continue;
        }
        if fds[1].any().unwrap_or(false) {
            return InitLine::Ended(Exit::KILLED);
        }
        let Ok(Some(info)) = signals.read_signal() else { continue };
        match Signal::try_from(info.ssi_signo as i32) {
            Ok(Signal::SIGCHLD) => loop {
                match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(status) if status.pid() == Some(child) => match Exit::of(status) {
                        Some(exit) => return InitLine::Ended(exit),
                        None => continue,
                    },
                    Ok(_) => continue,
                }
            },
            Ok(sig) if FORWARDED.contains(&sig) => {
                // Every process in the pid namespace but the init itself.
                let _ = kill(Pid::from_raw(-1), sig);
            }
            _ => {}
        }
    }
}

/// The cold program's stdin and working directory, then exec.
fn exec_program(spec: &SandboxSpec, stdin: Option<OwnedFd>) -> Result<(), Failure> {
    match stdin {
        Some(fd) => dup_stdin(&fd)?,
        None => setup_stdin(spec.stdin.as_deref())?,
    }
    nix::unistd::chdir("/mnt/data").map_err(Failure::at("chdir /mnt/data"))?;
    // Every fd but 0-2 closes at exec.
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags on our own fds.
    if unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) } != 0 {
        return Err(Failure::at("close_range")(nix::Error::last()));
    }
    let argv = cstrings(spec.argv.iter().map(String::as_str))?;
    let env =
        cstrings(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().iter().map(String::as_str))?;
    let program = argv.first().cloned().ok_or(Failure { step: "exec", error: "empty argv".into() })?;
    let err = nix::unistd::execve(&program, &argv, &env).err();
    Err(Failure {
        step: "exec",
        error: format!("{}: {}", spec.argv[0], err.map(|e| e.to_string()).unwrap_or_default()),
    })
}

fn setup_stdin(data: Option<&str>) -> Result<(), Failure> {
    let fd: OwnedFd = match data {
        Some(text) => {
            let memfd = nix::sys::memfd::memfd_create(c"stdin", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
                .map_err(Failure::at("memfd_create"))?;
            let mut file = File::from(memfd);
            file.write_all(text.as_bytes()).map_err(Failure::at("write stdin"))?;
            use std::io::Seek;
            file.rewind().map_err(Failure::at("rewind stdin"))?;
            file.into()
        }
        None => File::open("/dev/null").map_err(Failure::at("open /dev/null"))?.into(),
    };
    dup_stdin(&fd)
}

fn dup_stdin(fd: &OwnedFd) -> Result<(), Failure> {
    // The new fd 0 has no close-on-exec flag.
    nix::unistd::dup2_stdin(fd).map_err(Failure::at("dup2 stdin"))
}

fn cstrings<'a>(items: impl Iterator<Item = &'a str>) -> Result<Vec<CString>, Failure> {
    items.map(|s| CString::new(s).map_err(Failure::at("argument with a NUL byte"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report as the init writes it.
    fn report(lines: &[InitLine]) -> Vec<u8> {
        lines.iter().flat_map(InitLine::encode).collect()
    }

    #[test]
    fn a_report_is_read_up_to_how_the_program_ended_with_its_warnings() {
        let text = report(&[
            InitLine::Warning("careful".into()),
            InitLine::Ended(Exit::Exited(3)),
            InitLine::Warning("after".into()),
        ]);
        let mut r = &text[..];
        let mut warnings = vec![];
        assert_eq!(read_report(&mut r, |w| warnings.push(w)).unwrap(), Some(InitLine::Ended(Exit::Exited(3))));
        assert_eq!(warnings, ["careful"]);
        // What follows is left in the stream.
        assert_eq!(r, b"{\"warning\":\"after\"}\n");
        let mut r = &b"{\"failed\":{\"step\":\"mounts\",\"error\":\"bind /x: EPERM\"}}\n"[..];
        assert_eq!(
            read_report(&mut r, |_| {}).unwrap(),
            Some(InitLine::Failed { step: "mounts".into(), error: "bind /x: EPERM".into() })
        );
        // A report that ends without a complete end line has none.
        let cut = report(&[InitLine::Warning("a".into()), InitLine::Ended(Exit::Exited(3))]);
        assert_eq!(read_report(&mut &cut[..cut.len() - 1], |_| {}).unwrap(), None);
        assert_eq!(read_report(&mut &b""[..], |_| {}).unwrap(), None);
    }

    #[test]
    fn a_line_that_is_not_an_init_line_is_refused() {
        for bad in [&b"X 3\n"[..], b"not a report line\n", b"\xff\n", b"{\"ended\":{\"exited\":3},\"x\":1}\n", b"\n"] {
            let mut warnings = vec![];
            let e = read_report(&mut &bad[..], |w| warnings.push(w)).unwrap_err();
            assert!(e.is_violation() && warnings.is_empty(), "{}: {e}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn an_over_long_report_line_is_refused_and_not_held() {
        // A line exactly at the bound is read; one byte more, or a stream that never
        // ends a line, is refused after taking the bound off the stream.
        let frame = br#"{"warning":""}"#.len();
        let at_bound =
            format!("{{\"warning\":\"{}\"}}\n{{\"ended\":{{\"signaled\":9}}}}\n", "x".repeat(REPORT_LINE - frame));
        let mut warnings = vec![];
        assert_eq!(
            read_report(&mut at_bound.as_bytes(), |w| warnings.push(w)).unwrap(),
            Some(InitLine::Ended(Exit::Signaled(9)))
        );
        assert_eq!(warnings[0].len(), REPORT_LINE - frame);
        let over =
            format!("{{\"warning\":\"{}\"}}\n{{\"ended\":{{\"signaled\":9}}}}\n", "x".repeat(REPORT_LINE - frame + 1));
        let e = read_report(&mut over.as_bytes(), |_| panic!("no warning")).unwrap_err();
        assert!(matches!(e, channel::Error::TooLong(REPORT_LINE)), "{e}");
        let mut endless = std::io::BufReader::new(std::io::repeat(b'W'));
        let e = read_report(&mut endless, |_| panic!("no warning")).unwrap_err();
        assert!(matches!(e, channel::Error::TooLong(REPORT_LINE)), "{e}");
    }

    /// What the init writes on a pipe reads back as it was, each line in one write.
    #[test]
    fn lines_written_on_a_pipe_read_back() {
        let (r, w) = super::super::process::pipe().unwrap();
        let mut w = File::from(w);
        InitLine::Warning("landlock\npartly".into()).write(&mut w).unwrap();
        Failure { step: "exec", error: "x".repeat(REPORT_LINE) }.write(&mut w).unwrap();
        drop(w);
        let mut r = std::io::BufReader::new(File::from(r));
        let mut warnings = vec![];
        let Some(InitLine::Failed { step, error }) = read_report(&mut r, |w| warnings.push(w)).unwrap() else {
            panic!("no failure")
        };
        assert_eq!(warnings, ["landlock\npartly"]);
        assert_eq!(step, "exec");
        assert!(error.len() > 3000 && error.bytes().all(|b| b == b'x'), "{}", error.len());
    }
}
