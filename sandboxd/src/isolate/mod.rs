//! Running one program in a fresh sandbox.
//!
//! The daemon side lives here ([`Sandboxes::run`]): it takes a slot (a cgroup with
//! a resident process, [`slot`]), has it fork the run's helper ([`helper`]),
//! reads the program's stdout and stderr (capped while they are read), enforces the
//! wall-clock limit (SIGTERM, a grace period, then SIGKILL to the whole tree), and
//! turns what the helper reports into an [`Outcome`].
//!
//! A pooled run instead takes a [`Template`]: a sandbox whose interpreter forks once
//! per run, each fork entering a sandbox of its own ([`template`]).
//!
//! One file per mechanism: [`namespaces`], [`mounts`], [`cgroup`], [`caps`],
//! [`rlimits`], [`landlock`], [`seccomp`]; [`init`] is pid 1 inside the sandbox.

pub mod caps;
pub mod cgroup;
pub mod channel;
pub mod helper;
pub mod init;
pub mod landlock;
pub mod mounts;
pub mod namespaces;
pub mod output;
pub mod rlimits;
pub mod seccomp;
pub mod slot;
pub mod spec;
pub mod template;

use channel::LineReader;
use output::{Captured, Chunk, StreamKind};
use spec::{Event, SandboxSpec};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use template::{ForkMessage, Report, RunClaim, TemplateMessage};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{mpsc, watch};

/// The hidden first argument that turns the `sandboxd` binary into the helper.
pub const HELPER_ARG: &str = "__sandbox";
/// Longest line read from a template's socket or a run's report channel.
const TEMPLATE_LINE: usize = 64 * 1024;
/// Longest line read from a pooled run's socket (its messages are a few bytes).
const RUN_LINE: usize = 4 * 1024;
/// Whether a pooled run's claim of its exit code ends the run (see [`RunClaim`]
/// and [`crate::pool`]); otherwise the outer process's report alone does.
const ACCEPT_CLAIMS: bool = true;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Cgroup(#[from] cgroup::Error),
    #[error("starting the sandbox helper {0}: {1}")]
    Spawn(PathBuf, std::io::Error),
    #[error("talking to the sandbox helper: {0}")]
    Control(std::io::Error),
    #[error("setting up the sandbox failed at {step}: {error}")]
    Setup { step: String, error: String },
    #[error("the sandbox helper ended without reporting the program's status")]
    NoStatus,
    #[error("the template served its {0} runs and is replaced")]
    Retired(u64),
}

/// One run to perform.
#[derive(Debug, Clone)]
pub struct Run {
    /// For logs.
    pub id: String,
    pub spec: SandboxSpec,
    pub limits: cgroup::Limits,
    pub timeout: Duration,
    /// Between SIGTERM and SIGKILL at the timeout, so the program can save its work.
    pub grace: Duration,
    /// Bytes kept per stream; the rest is read and dropped.
    pub output_limit: usize,
}

/// How a run ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub oom_killed: bool,
    /// Killed on request (the session was closed, the daemon is stopping).
    pub cancelled: bool,
    pub duration: Duration,
    pub stdout: Captured,
    pub stderr: Captured,
    pub warnings: Vec<String>,
    pub memory_peak_bytes: Option<u64>,
}

/// Where the helper binary is: this very executable.
fn helper_exe() -> PathBuf {
    PathBuf::from("/proc/self/exe")
}

/// Makes sandboxes in reusable slots ([`slot`]), keeping some ready.
pub struct Sandboxes {
    pub cgroups: cgroup::Cgroups,
    idle: Mutex<Vec<slot::Slot>>,
    /// Slots made at start-up, before any run needs them.
    prewarm: usize,
    /// Most idle slots kept; more are made under load and removed afterwards.
    max_idle: usize,
}

async fn send_line<T: serde::Serialize>(w: &mut OwnedWriteHalf, msg: &T) -> Result<(), Error> {
    let mut line = serde_json::to_vec(msg).map_err(|e| Error::Control(e.into()))?;
    line.push(b'\n');
    w.write_all(&line).await.map_err(Error::Control)
}

impl Sandboxes {
    pub fn new(cgroups: cgroup::Cgroups, prewarm: usize, max_idle: usize) -> Arc<Sandboxes> {
        Arc::new(Sandboxes { cgroups, idle: Mutex::new(vec![]), prewarm, max_idle: max_idle.max(prewarm) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<slot::Slot>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Make a slot: its cgroup, and its process joined to it (~10 ms on v1).
    async fn new_slot(&self) -> Result<slot::Slot, Error> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let cg = self.cgroups.create(&id)?;
        slot::Slot::start(id, cg, &helper_exe(), HELPER_ARG)
            .await
            .map_err(|f| Error::Setup { step: f.step.into(), error: f.error })
    }

    /// Make the start-up slots (in the background).
    pub fn prewarm(self: &Arc<Self>) {
        let me = self.clone();
        tokio::spawn(async move {
            for _ in 0..me.prewarm {
                match me.new_slot().await {
                    Ok(s) => me.lock().push(s),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not make a sandbox slot ahead of time");
                        break;
                    }
                }
            }
        });
    }

    async fn take(&self) -> Result<slot::Slot, Error> {
        loop {
            let popped = self.lock().pop();
            match popped {
                Some(mut s) => {
                    if s.alive() {
                        return Ok(s);
                    }
                    destroy(s).await;
                }
                None => return self.new_slot().await,
            }
        }
    }

    async fn give_back(&self, mut s: slot::Slot) {
        if s.alive() {
            let mut idle = self.lock();
            if idle.len() < self.max_idle {
                idle.push(s);
                return;
            }
        }
        destroy(s).await;
    }

    /// How many slots wait for runs.
    pub fn idle_slots(&self) -> usize {
        self.lock().len()
    }

    /// Remove every idle slot (daemon shutdown).
    pub async fn shutdown(&self) {
        let slots: Vec<slot::Slot> = self.lock().drain(..).collect();
        for s in slots {
            destroy(s).await;
        }
    }

    /// Run the program in a new sandbox. `chunks`, when given, receives the output
    /// as it is produced (within the caps). Setting `cancel` to true kills the run.
    /// `started`, when given, receives the host pid of the sandbox's init (to signal it).
    pub async fn run(
        self: &Arc<Self>,
        run: Run,
        chunks: Option<mpsc::Sender<Chunk>>,
        cancel: watch::Receiver<bool>,
        started_tx: Option<tokio::sync::oneshot::Sender<i32>>,
    ) -> Result<Outcome, Error> {
        self.run_with_stdin(run, None, chunks, cancel, started_tx).await
    }

    /// [`Sandboxes::run`], the program's stdin being `stdin` when given (a kernel's
    /// channel to the daemon) instead of `run.spec.stdin`.
    pub async fn run_with_stdin(
        self: &Arc<Self>,
        run: Run,
        stdin: Option<OwnedFd>,
        chunks: Option<mpsc::Sender<Chunk>>,
        mut cancel: watch::Receiver<bool>,
        started_tx: Option<tokio::sync::oneshot::Sender<i32>>,
    ) -> Result<Outcome, Error> {
        let started = Instant::now();
        let slot = self.take().await?;
        tracing::debug!(run_id = %run.id, slot = %slot.id, elapsed_us = started.elapsed().as_micros() as u64, "slot taken");
        let oom_before = slot.cg.oom_kills();
        slot.cg.reset_peak();
        let result = match slot.cg.set_limits(&run.limits) {
            Ok(()) => match launch(&slot, &run.spec, stdin.as_ref()).await {
                Ok(mut sandbox) => {
                    // Only the sandbox holds the program's end now.
                    drop(stdin);
                    drive(&mut sandbox, &run.bounds(), chunks, &mut cancel, started, started_tx, None).await
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e.into()),
        };
        tracing::debug!(run_id = %run.id, elapsed_us = started.elapsed().as_micros() as u64, "sandbox ended");
        let (oom_killed, memory_peak_bytes) = self.end(slot, oom_before).await;
        let mut outcome = result?;
        outcome.oom_killed = oom_killed;
        outcome.memory_peak_bytes = memory_peak_bytes;
        Ok(outcome)
    }

    /// After a run: kill whatever is left in the slot, read its OOM count and peak,
    /// and give it back.
    async fn end(&self, slot: slot::Slot, oom_before: u64) -> (bool, Option<u64>) {
        slot.cg.kill_except(slot.pid());
        let usage = usage(&slot, oom_before);
        self.give_back(slot).await;
        usage
    }

    /// Kill whatever is left in the slot and give it back.
    async fn release(&self, slot: slot::Slot) {
        slot.cg.kill_except(slot.pid());
        self.give_back(slot).await;
    }

    /// Start a pooled sandbox: built without a workspace, its program (a template
    /// interpreter, [`template`]) started with a socket as stdin
    /// ([`Template::program`]), at the least CPU weight while it imports.
    /// `spec.workspace` must be `None` and `spec.template` true.
    pub async fn start_template(
        self: &Arc<Self>,
        spec: &SandboxSpec,
        limits: &cgroup::Limits,
    ) -> Result<Template, Error> {
        let slot = self.take().await?;
        let launched = async {
            slot.cg.set_limits(limits)?;
            slot.cg.set_idle(true)?;
            let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(Error::Control)?;
            ours.set_nonblocking(true).map_err(Error::Control)?;
            let mut sandbox = launch(&slot, spec, Some(&OwnedFd::from(theirs))).await?;
            let program = tokio::net::UnixStream::from_std(ours).map_err(Error::Control)?;
            let waited = tokio::time::timeout(Duration::from_secs(60), sandbox.wait_started()).await;
            waited.map_err(|_| Error::Setup { step: "start".into(), error: "no init within 60 s".into() })??;
            // The template's own output goes nowhere: each run has its own pipes.
            sandbox.stdout = None;
            sandbox.stderr = None;
            Ok::<_, Error>((sandbox, program))
        };
        match launched.await {
            Ok((sandbox, program)) => Ok(Template {
                sandboxes: self.clone(),
                slot,
                sandbox,
                program: LineReader::new(program, TEMPLATE_LINE),
                python_pid: None,
                prepared: None,
                served: 0,
            }),
            Err(e) => {
                self.release(slot).await;
                Err(e)
            }
        }
    }
}

/// A pooled sandbox whose interpreter has imported the policy's preload modules and
/// forks once per run; each fork enters a sandbox of its own ([`template`]).
pub struct Template {
    sandboxes: Arc<Sandboxes>,
    slot: slot::Slot,
    sandbox: Launched,
    /// The daemon's end of the template's stdin socket ([`TemplateMessage`]s).
    program: LineReader<tokio::net::UnixStream>,
    /// Host pid of the template's interpreter, once looked up.
    python_pid: Option<i32>,
    /// The fork made ahead of the next run ([`Template::prepare`]).
    prepared: Option<Forked>,
    /// Runs served so far (the pool retires a template after its policy's
    /// `template_runs`).
    served: u64,
}

/// Resolves to how a run ended when its processes report it themselves (None: its
/// report ended without a word).
type Done<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Event>> + Send + 'a>>;

/// A template's fork, in its own namespaces, waiting for its code: its socket has
/// said [`ForkMessage::Entered`] and is quiet. No user code has run.
pub struct Forked {
    /// The daemon's end of the run's socket, shared by the runner and (once it has
    /// its code) the user's code.
    program: LineReader<tokio::net::UnixStream>,
    /// The run's report channel, held by its outer process alone ([`Report`]).
    report: LineReader<tokio::net::unix::pipe::Receiver>,
    stdout: OwnedFd,
    stderr: OwnedFd,
    /// Host pids: the fork that stayed in the template's namespaces, and the
    /// run's init (pid 1 of its namespace).
    outer_pid: i32,
    init_pid: i32,
    /// Host pid of the run's own process.
    program_pid: i32,
    /// The run's init, to kill it once the run is over without ever signalling
    /// another process that got its pid after it died.
    init_pidfd: OwnedFd,
}

/// A pidfd for `pid`.
fn pidfd_open(pid: i32) -> Result<OwnedFd, Error> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(Error::Control(std::io::Error::last_os_error()));
    }
    // SAFETY: the fd was just returned to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as std::os::fd::RawFd) })
}

/// SIGKILL the process behind `pidfd` (nothing happens if it has already ended).
fn pidfd_kill(pidfd: &OwnedFd) {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal reads only its integer arguments (no siginfo).
    unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), libc::SIGKILL, std::ptr::null::<u8>(), 0);
    }
}

/// A fork requested, not yet known to be in its namespaces.
struct PendingFork {
    program: LineReader<tokio::net::UnixStream>,
    report: LineReader<tokio::net::unix::pipe::Receiver>,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

/// A template's fork that was sent its code. From here on its socket is the user's
/// too: it may carry the run's [`RunClaim`] and nothing else, and a failure is
/// never accepted (the run cannot turn into a sandbox that failed to build).
pub struct Running(Forked);

impl Forked {
    /// Send the run its code (`msg`, one JSON line): the fork becomes [`Running`].
    pub async fn send_code<T: serde::Serialize>(mut self, msg: &T) -> Result<Running, Error> {
        let mut line = serde_json::to_vec(msg).map_err(|e| Error::Control(e.into()))?;
        line.push(b'\n');
        self.program.get_mut().write_all(&line).await.map_err(Error::Control)?;
        Ok(Running(self))
    }

    /// Still waiting for its code: nothing said, nothing closed.
    fn quiet(&self) -> bool {
        let mut byte = [0u8; 1];
        let report_quiet =
            matches!(self.report.get_ref().try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        self.program.is_idle() && quiet(self.program.get_ref()) && self.report.is_idle() && report_quiet
    }
}

/// How a run that has its code ended: its outer process's [`Report`], or (with
/// [`ACCEPT_CLAIMS`]) the run's own [`RunClaim`] of an exit code, whichever comes
/// first. A claim can only say what the run could have chosen by exiting with that
/// code; a signal, a failure, a timeout or an OOM kill come only from the report,
/// the daemon's timer and the cgroup. Anything else on the run's socket is ignored
/// and the daemon hangs up on it (the runner waits for either).
async fn run_ended(
    program: &mut LineReader<tokio::net::UnixStream>,
    report: &mut LineReader<tokio::net::unix::pipe::Receiver>,
    run_id: &str,
) -> Event {
    let mut listening = true;
    loop {
        tokio::select! {
            claim = program.next::<RunClaim>(), if listening => {
                match claim {
                    Ok(Some(RunClaim::ExitCode(code))) if ACCEPT_CLAIMS => return Event::Exited { code: i32::from(code) },
                    Ok(Some(_)) | Ok(None) => {}
                    Err(e) if e.is_violation() => {
                        tracing::info!(run_id, error = %e, "a pooled run's socket broke the protocol; how it ended comes from its outer process");
                    }
                    Err(_) => {}
                }
                listening = false;
                let _ = program.get_mut().shutdown().await;
            }
            ended = report.next::<Report>() => return match ended {
                Ok(Some(Report::ExitCode(code))) => Event::Exited { code },
                Ok(Some(Report::Signal(signal))) => Event::Signaled { signal },
                Ok(Some(Report::Failed { step, .. })) => {
                    tracing::warn!(run_id, step = %channel::excerpt(step.as_bytes()), "a pooled run's init failed after the run had its code; taken as killed");
                    Event::InitKilled { signal: libc::SIGKILL }
                }
                // Its outer process is gone (killed with the template).
                Ok(None) | Err(_) => Event::InitKilled { signal: libc::SIGKILL },
            },
        }
    }
}

/// The host pids of `pid`'s children (its main thread's).
fn children(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

impl Template {
    /// Memory the sandbox holds now.
    pub fn memory_bytes(&self) -> Option<u64> {
        self.slot.cg.memory_current()
    }

    /// Host pid of the template's interpreter: the init's only child.
    fn python_pid(&mut self) -> Result<i32, Error> {
        if let Some(pid) = self.python_pid {
            return Ok(pid);
        }
        let init = self.sandbox.init_pid.ok_or(Error::NoStatus)?;
        let pid = children(init).first().copied().ok_or(Error::NoStatus)?;
        self.python_pid = Some(pid);
        Ok(pid)
    }

    /// Fork ahead of the next run: see [`Template::fork`]. Taken by [`Template::take_prepared`].
    pub async fn prepare(&mut self, request: &serde_json::Value, library: &std::fs::File) -> Result<(), Error> {
        let forked = self.fork(request, library).await?;
        self.prepared = Some(forked);
        Ok(())
    }

    /// The fork made ahead of this run, if it is still there.
    pub fn take_prepared(&mut self) -> Option<Forked> {
        let forked = self.prepared.take()?;
        forked.quiet().then_some(forked)
    }

    /// Has the template kept quiet, its socket open? It waits for the daemon:
    /// anything to read, or the end of the stream, means it died or misbehaved.
    pub fn quiet(&self) -> bool {
        self.program.is_idle() && quiet(self.program.get_ref())
    }

    /// The template's next message (`None`: its socket closed).
    pub async fn next_message(&mut self) -> Result<Option<TemplateMessage>, channel::Error> {
        self.program.next::<TemplateMessage>().await
    }

    /// Have the template fork for one run, sending it `request` (JSON) with the
    /// library, the run's output pipes and its socket, and wait until the fork is
    /// in its own namespaces.
    async fn fork(&mut self, request: &serde_json::Value, library: &std::fs::File) -> Result<Forked, Error> {
        let pending = self.request_fork(request, library).await?;
        self.await_fork(pending).await
    }

    /// Send the fork request; the template forks at once.
    async fn request_fork(
        &mut self,
        request: &serde_json::Value,
        library: &std::fs::File,
    ) -> Result<PendingFork, Error> {
        use std::os::fd::AsRawFd;
        // Forking ahead of a run waits behind everything else on the machine (the
        // answer to the run just finished, first of all); the run gets full weight.
        self.slot.cg.set_idle(true)?;
        let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::Control(e.into()));
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let (report_r, report_w) = pipe()?;
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(Error::Control)?;
        ours.set_nonblocking(true).map_err(Error::Control)?;
        let mut line = serde_json::to_vec(request).map_err(|e| Error::Control(e.into()))?;
        line.push(b'\n');
        let fds = [library.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd(), theirs.as_raw_fd(), report_w.as_raw_fd()];
        send_with_fds(self.program.get_ref(), &line, &fds).await?;
        let program = tokio::net::UnixStream::from_std(ours).map_err(Error::Control)?;
        let report = tokio::net::unix::pipe::Receiver::from_owned_fd(report_r).map_err(Error::Control)?;
        Ok(PendingFork {
            program: LineReader::new(program, RUN_LINE),
            report: LineReader::new(report, TEMPLATE_LINE),
            stdout: out_r,
            stderr: err_r,
        })
    }

    /// Wait until the fork says it is in its own namespaces; find its host pids.
    async fn await_fork(&mut self, pending: PendingFork) -> Result<Forked, Error> {
        let PendingFork { mut program, mut report, stdout, stderr } = pending;
        let fork_failed = |error: &str| Error::Setup { step: "fork".into(), error: error.into() };
        // Why a fork ended before it entered: its report (it has written it by the
        // time its socket closes).
        let why = |ended: Result<Option<Report>, channel::Error>| match ended {
            Ok(Some(Report::Failed { step, error })) => Error::Setup { step, error },
            _ => fork_failed("the template's fork ended"),
        };
        let entered = async {
            tokio::select! {
                first = program.next::<ForkMessage>() => match first {
                    Ok(Some(ForkMessage::Entered(true))) => Ok(()),
                    Ok(None) => {
                        let ended = tokio::time::timeout(Duration::from_secs(1), report.next::<Report>()).await;
                        Err(ended.map(why).unwrap_or_else(|_| fork_failed("the template's fork ended")))
                    }
                    Ok(Some(_)) | Err(_) => Err(fork_failed("the template's fork broke the protocol")),
                },
                ended = report.next::<Report>() => Err(why(ended)),
            }
        };
        match tokio::time::timeout(Duration::from_secs(10), entered).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(fork_failed("no fork within 10 s")),
        }
        let python = self.python_pid()?;
        // The template's only fork still running: the others were reaped, or are
        // being torn down (their outer process has no child left).
        let outer_pid = children(python)
            .into_iter()
            .find(|p| !children(*p).is_empty())
            .ok_or(Error::Setup { step: "fork".into(), error: "the fork is not there".into() })?;
        let init_pid = children(outer_pid).first().copied().ok_or(Error::NoStatus)?;
        let init_pidfd = pidfd_open(init_pid)?;
        // The run's process is waiting for its code, so its init (which waits for
        // it) is still the process behind `init_pid`.
        let program_pid = children(init_pid).first().copied().ok_or(Error::NoStatus)?;
        Ok(Forked { program, report, stdout, stderr, outer_pid, init_pid, program_pid, init_pidfd })
    }

    /// Mount the session's workspace (owned by `owner` on the host) at `/mnt/data`
    /// in the fork's mount namespace.
    pub async fn attach(&mut self, forked: &Forked, workspace: &std::path::Path, owner: u32) -> Result<(), Error> {
        let req = spec::Attach {
            pid: Some(forked.outer_pid),
            workspace: workspace.into(),
            owner_uid: owner,
            owner_gid: owner,
        };
        self.slot.cg.set_idle(false)?;
        let control = self.sandbox.control.as_mut().ok_or(Error::NoStatus)?;
        send_line(control, &req).await?;
        loop {
            match self.sandbox.next_event().await? {
                Event::Attached => return Ok(()),
                Event::SetupFailed { step, error } => return Err(Error::Setup { step, error }),
                _ => continue,
            }
        }
    }

    /// Supervise the run that was just sent its code, as [`Sandboxes::run`] does
    /// ([`run_ended`] says how it ended). The run's processes are all killed before
    /// this returns.
    pub async fn finish(
        &mut self,
        running: Running,
        bounds: &Bounds,
        chunks: Option<mpsc::Sender<Chunk>>,
        mut cancel: watch::Receiver<bool>,
    ) -> Result<Outcome, Error> {
        let oom_before = self.slot.cg.oom_kills();
        self.served += 1;
        let Forked { mut program, mut report, stdout, stderr, init_pid, init_pidfd, .. } = running.0;
        let mut run = Launched {
            events: None,
            control: None,
            stdout: Some(stdout),
            stderr: Some(stderr),
            helper_pid: None,
            init_pid: Some(init_pid),
            warnings: vec![],
        };
        let started = Instant::now();
        let ended: Done<'_> = Box::pin(async { Some(run_ended(&mut program, &mut report, &bounds.id).await) });
        let result = drive(&mut run, bounds, chunks, &mut cancel, started, None, Some(ended)).await;
        // Tearing the fork down (three processes unmapping a copy of the template's
        // memory) waits behind the answer to the run.
        let _ = self.slot.cg.set_idle(true);
        pidfd_kill(&init_pidfd);
        // The run's process may wait for its socket to close: only now.
        drop((program, report));
        let (oom_killed, memory_peak_bytes) = usage(&self.slot, oom_before);
        let mut outcome = result?;
        outcome.oom_killed = oom_killed;
        outcome.memory_peak_bytes = memory_peak_bytes;
        Ok(outcome)
    }

    /// After a run: fork ahead of the next one (`request`), while the template
    /// reaps this run's fork. Once it has, and nothing but the new fork is left in
    /// the cgroup, it may serve another run. Otherwise (an OOM kill in the cgroup,
    /// which may have hit the template; a template that does not answer or cannot
    /// fork) it is destroyed.
    pub async fn recycle(
        mut self,
        oom_before: u64,
        request: &serde_json::Value,
        library: &std::fs::File,
    ) -> Result<Template, Error> {
        let pending = self.request_fork(request, library).await;
        let answered = tokio::time::timeout(Duration::from_secs(5), self.next_message()).await;
        let reaped = matches!(answered, Ok(Ok(Some(TemplateMessage::Reaped(_)))));
        let forked = match pending {
            Ok(p) if reaped => self.await_fork(p).await,
            Ok(_) => Err(Error::Setup { step: "recycle".into(), error: "the template did not reap its fork".into() }),
            Err(e) => Err(e),
        };
        let checked = forked.and_then(|f| {
            let mut keep = vec![self.sandbox.helper_pid, self.sandbox.init_pid, self.python_pid];
            keep.extend([self.slot.pid().map(|p| p as i32), Some(f.outer_pid), Some(f.init_pid), Some(f.program_pid)]);
            if let Some(p) = self.slot.cg.pids().into_iter().find(|p| !keep.contains(&Some(*p))) {
                return Err(Error::Setup { step: "recycle".into(), error: format!("pid {p} is left of the run") });
            }
            if self.slot.cg.oom_kills() != oom_before {
                return Err(Error::Setup { step: "recycle".into(), error: "the run met the OOM killer".into() });
            }
            Ok(f)
        });
        match checked {
            Ok(f) if self.slot.alive() => {
                self.prepared = Some(f);
                Ok(self)
            }
            other => {
                self.destroy().await;
                Err(other.err().unwrap_or(Error::NoStatus))
            }
        }
    }

    /// Runs this template has served.
    pub fn served(&self) -> u64 {
        self.served
    }

    /// OOM kills so far in the template's cgroup.
    pub fn oom_kills(&self) -> u64 {
        self.slot.cg.oom_kills()
    }

    /// End the sandbox and give its slot back.
    pub async fn destroy(self) {
        kill_all(self.sandbox.init_pid, self.sandbox.helper_pid);
        let Template { sandboxes, slot, .. } = self;
        sandboxes.release(slot).await;
    }
}

/// Has the process at the other end of `stream` kept quiet, the stream open? It
/// waits for the daemon; anything to read, or the end of the stream, means it died
/// or misbehaved.
fn quiet(stream: &tokio::net::UnixStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// Send `bytes` with `fds` attached (SCM_RIGHTS) on a non-blocking stream.
async fn send_with_fds(stream: &tokio::net::UnixStream, bytes: &[u8], fds: &[std::os::fd::RawFd]) -> Result<(), Error> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    use std::os::fd::AsRawFd;
    loop {
        stream.writable().await.map_err(Error::Control)?;
        let sent = stream.try_io(tokio::io::Interest::WRITABLE, || {
            let iov = [std::io::IoSlice::new(bytes)];
            let cmsg = [ControlMessage::ScmRights(fds)];
            sendmsg::<()>(stream.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None).map_err(std::io::Error::from)
        });
        match sent {
            Ok(n) if n == bytes.len() => return Ok(()),
            Ok(_) => return Err(Error::Control(std::io::Error::other("a short write to the template"))),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(Error::Control(e)),
        }
    }
}

/// How a run is bounded once its sandbox exists.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// For logs.
    pub id: String,
    pub timeout: Duration,
    /// Between SIGTERM and SIGKILL at the timeout, so the program can save its work.
    pub grace: Duration,
    /// Bytes kept per stream; the rest is read and dropped.
    pub output_limit: usize,
}

impl Run {
    pub fn bounds(&self) -> Bounds {
        Bounds { id: self.id.clone(), timeout: self.timeout, grace: self.grace, output_limit: self.output_limit }
    }
}

/// The daemon's ends of a sandbox whose helper has its spec.
struct Launched {
    /// The helper's events; None for a template's fork, which has no helper.
    events: Option<tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>>,
    control: Option<OwnedWriteHalf>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    helper_pid: Option<i32>,
    init_pid: Option<i32>,
    warnings: Vec<String>,
}

impl Launched {
    /// The next event that is not bookkeeping (the helper's pid and warnings are kept).
    async fn next_event(&mut self) -> Result<Event, Error> {
        let Some(events) = self.events.as_mut() else { return std::future::pending().await };
        loop {
            let line = events.next_line().await.map_err(Error::Control)?.ok_or(Error::NoStatus)?;
            match serde_json::from_str::<Event>(&line) {
                Ok(Event::HelperStarted { pid }) => self.helper_pid = Some(pid),
                Ok(Event::Warning { message }) => {
                    tracing::warn!("{message}");
                    self.warnings.push(message);
                }
                Ok(e) => return Ok(e),
                Err(e) => tracing::warn!(error = %e, "unreadable helper event"),
            }
        }
    }

    async fn wait_started(&mut self) -> Result<(), Error> {
        match self.next_event().await? {
            Event::Started { init_pid } => {
                self.init_pid = Some(init_pid);
                Ok(())
            }
            Event::SetupFailed { step, error } => Err(Error::Setup { step, error }),
            _ => Err(Error::NoStatus),
        }
    }
}

/// Have the slot fork a helper for `spec` and send it the spec.
async fn launch(slot: &slot::Slot, spec: &SandboxSpec, stdin: Option<&OwnedFd>) -> Result<Launched, Error> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(Error::Control)?;
    ours.set_nonblocking(true).map_err(Error::Control)?;
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::Control(e.into()));
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    slot.fork_helper(&OwnedFd::from(theirs), &out_w, &err_w, stdin)
        .map_err(|f| Error::Setup { step: f.step.into(), error: f.error })?;
    // Only the helper holds the write ends now: end-of-file means the sandbox is done.
    drop((out_w, err_w));
    let (read_half, mut control) = tokio::net::UnixStream::from_std(ours).map_err(Error::Control)?.into_split();
    send_line(&mut control, spec).await?;
    Ok(Launched {
        events: Some(BufReader::new(read_half).lines()),
        control: Some(control),
        stdout: Some(out_r),
        stderr: Some(err_r),
        helper_pid: None,
        init_pid: None,
        warnings: vec![],
    })
}

/// Whether the run in `slot` met the OOM killer (its count is past `oom_before`),
/// and the slot's memory peak.
fn usage(slot: &slot::Slot, oom_before: u64) -> (bool, Option<u64>) {
    (slot.cg.oom_kills() > oom_before, slot.cg.memory_peak())
}

/// Kill a slot's process and remove its cgroup.
async fn destroy(mut s: slot::Slot) {
    let _ = s.process.start_kill();
    let _ = s.process.wait().await;
    let cg = s.cg;
    let removed = tokio::task::spawn_blocking(move || {
        cg.kill();
        cg.remove()
    })
    .await;
    if let Ok(Err(e)) = removed {
        tracing::warn!(slot = %s.id, error = %e, "could not remove a slot's cgroup");
    }
}

async fn drive(
    sandbox: &mut Launched,
    run: &Bounds,
    chunks: Option<mpsc::Sender<Chunk>>,
    cancel: &mut watch::Receiver<bool>,
    started: Instant,
    mut started_tx: Option<tokio::sync::oneshot::Sender<i32>>,
    done: Option<Done<'_>>,
) -> Result<Outcome, Error> {
    let receiver = |fd: Option<OwnedFd>| fd.and_then(|fd| tokio::net::unix::pipe::Receiver::from_owned_fd(fd).ok());
    let (out, err) = (receiver(sandbox.stdout.take()), receiver(sandbox.stderr.take()));
    let readers = [
        tokio::spawn(output::capture(out, StreamKind::Stdout, run.output_limit, chunks.clone())),
        tokio::spawn(output::capture(err, StreamKind::Stderr, run.output_limit, chunks)),
    ];
    let mut done_open = done.is_some();
    let mut done: Done<'_> = done.unwrap_or_else(|| Box::pin(std::future::pending()));

    let deadline = tokio::time::sleep(run.timeout);
    tokio::pin!(deadline);
    let mut timed_out = false;
    let mut cancelled = false;
    let mut term_sent_at: Option<Instant> = None;
    let mut final_event: Option<Event> = None;

    loop {
        let grace_left = term_sent_at.map(|t| run.grace.saturating_sub(t.elapsed()));
        let (init_pid, helper_pid) = (sandbox.init_pid, sandbox.helper_pid);
        tokio::select! {
            event = sandbox.next_event() => match event {
                Ok(Event::Started { init_pid: pid }) => {
                    tracing::debug!(run_id = %run.id, elapsed_us = started.elapsed().as_micros() as u64, "sandbox init started");
                    sandbox.init_pid = Some(pid);
                    if let Some(tx) = started_tx.take() {
                        let _ = tx.send(pid);
                    }
                }
                Ok(e) => {
                    tracing::debug!(run_id = %run.id, elapsed_us = started.elapsed().as_micros() as u64, "program ended");
                    final_event = Some(e);
                    break;
                }
                Err(_) => break,
            },
            ended = &mut done, if done_open => match ended {
                // The program reported its own end, after closing its output: the run
                // is over, and the rest of the sandbox is killed.
                Some(event) => {
                    final_event = Some(event);
                    kill_all(init_pid, helper_pid);
                    break;
                }
                // A template's fork has no helper to report for it: its socket closing
                // without a word means its processes are gone.
                None if sandbox.events.is_none() => {
                    final_event = Some(Event::InitKilled { signal: libc::SIGKILL });
                    break;
                }
                None => done_open = false,
            },
            _ = &mut deadline, if !timed_out && !cancelled => {
                timed_out = true;
                match init_pid {
                    // The init forwards SIGTERM to every process in the sandbox.
                    Some(pid) if !run.grace.is_zero() => {
                        signal(pid, nix::sys::signal::Signal::SIGTERM);
                        term_sent_at = Some(Instant::now());
                    }
                    _ => kill_all(init_pid, helper_pid),
                }
            },
            _ = tokio::time::sleep(grace_left.unwrap_or(Duration::MAX)), if grace_left.is_some() => {
                term_sent_at = None;
                kill_all(init_pid, helper_pid);
            },
            changed = cancel.changed(), if !cancelled && !timed_out => {
                if changed.is_err() || *cancel.borrow() {
                    cancelled = true;
                    kill_all(init_pid, helper_pid);
                }
            },
        }
    }
    let (init_pid, helper_pid) = (sandbox.init_pid, sandbox.helper_pid);
    // Without a final event (the helper's socket ended), nothing of the sandbox may
    // live on. After one, its teardown is not waited for: what is left of it is
    // killed with the rest of the slot's processes after the run.
    if final_event.is_none() {
        kill_all(init_pid, helper_pid);
        if let Some(pid) = helper_pid {
            signal(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
    let [out, err] = readers;
    let stdout = out.await.unwrap_or_default();
    let stderr = err.await.unwrap_or_default();
    let duration = started.elapsed();

    let (exit_code, signal) = match final_event {
        Some(Event::Exited { code }) => (Some(code), None),
        Some(Event::Signaled { signal }) | Some(Event::InitKilled { signal }) => (None, Some(signal)),
        Some(Event::SetupFailed { step, error }) => return Err(Error::Setup { step, error }),
        _ => {
            if timed_out || cancelled {
                (None, Some(libc::SIGKILL))
            } else {
                return Err(Error::NoStatus);
            }
        }
    };
    Ok(Outcome {
        exit_code,
        signal,
        timed_out,
        oom_killed: false,
        cancelled,
        duration,
        stdout,
        stderr,
        warnings: std::mem::take(&mut sandbox.warnings),
        memory_peak_bytes: None,
    })
}

fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

/// SIGKILL the sandbox's init: the kernel then kills its whole pid namespace, and the
/// helper reaps the init, reports and exits. Only when the init is not known yet is
/// the helper killed instead (the init, if any, dies with it).
fn kill_all(init_pid: Option<i32>, helper_pid: Option<i32>) {
    if let Some(pid) = init_pid.or(helper_pid) {
        signal(pid, nix::sys::signal::Signal::SIGKILL);
    }
}
