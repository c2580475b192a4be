//! Running one program in a fresh sandbox.
//!
//! The daemon side lives here ([`Sandboxes::run`]): it takes a slot (a cgroup with
//! a resident process, [`slot`]), has it fork the run's helper ([`helper`]),
//! reads the program's stdout and stderr (capped while they are read), enforces the
//! wall-clock limit (SIGTERM, a grace period, then SIGKILL to the whole tree), and
//! turns what the helper reports into an [`Outcome`].
//!
//! One file per mechanism: [`namespaces`], [`mounts`], [`cgroup`], [`caps`],
//! [`rlimits`], [`landlock`], [`seccomp`]; [`init`] is pid 1 inside the sandbox.

pub mod caps;
pub mod cgroup;
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

use output::{Captured, Chunk, StreamKind};
use spec::{Event, SandboxSpec};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{mpsc, watch};

/// The hidden first argument that turns the `sandboxd` binary into the helper.
pub const HELPER_ARG: &str = "__sandbox";

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
        mut cancel: watch::Receiver<bool>,
        started_tx: Option<tokio::sync::oneshot::Sender<i32>>,
    ) -> Result<Outcome, Error> {
        let started = Instant::now();
        let slot = self.take().await?;
        tracing::debug!(run_id = %run.id, slot = %slot.id, elapsed_us = started.elapsed().as_micros() as u64, "slot taken");
        let oom_before = slot.cg.oom_kills();
        slot.cg.reset_peak();
        let result = match slot.cg.set_limits(&run.limits) {
            Ok(()) => match launch(&slot, &run.spec, None).await {
                Ok(mut sandbox) => {
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

    /// Start a pooled sandbox: built without its workspace, its program started with
    /// a socket as stdin ([`Pooled::program`]), at the least CPU weight until a run
    /// takes it. `spec.workspace` must be `None`.
    pub async fn start_pooled(self: &Arc<Self>, spec: &SandboxSpec, limits: &cgroup::Limits) -> Result<Pooled, Error> {
        let slot = self.take().await?;
        let oom_before = slot.cg.oom_kills();
        slot.cg.reset_peak();
        let launched = async {
            slot.cg.set_limits(limits)?;
            slot.cg.set_idle(true)?;
            let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(Error::Control)?;
            ours.set_nonblocking(true).map_err(Error::Control)?;
            let mut sandbox = launch(&slot, spec, Some(&OwnedFd::from(theirs))).await?;
            let program = tokio::net::UnixStream::from_std(ours).map_err(Error::Control)?;
            let waited = tokio::time::timeout(Duration::from_secs(60), sandbox.wait_started()).await;
            waited.map_err(|_| Error::Setup { step: "start".into(), error: "no init within 60 s".into() })??;
            Ok::<_, Error>((sandbox, program))
        };
        match launched.await {
            Ok((sandbox, program)) => Ok(Pooled { sandboxes: self.clone(), slot, sandbox, program, oom_before }),
            Err(e) => {
                self.release(slot).await;
                Err(e)
            }
        }
    }
}

/// A sandbox started ahead of its run, its program waiting on [`Pooled::program`].
pub struct Pooled {
    sandboxes: Arc<Sandboxes>,
    slot: slot::Slot,
    sandbox: Launched,
    /// The daemon's end of the program's stdin socket.
    pub program: tokio::net::UnixStream,
    oom_before: u64,
}

/// Resolves to the exit code a pooled program reports itself (None: it did not).
pub type Done = std::pin::Pin<Box<dyn std::future::Future<Output = Option<i32>> + Send>>;

impl Pooled {
    /// Memory the sandbox holds now.
    pub fn memory_bytes(&self) -> Option<u64> {
        self.slot.cg.memory_current()
    }

    /// Mount the session's workspace (owned by `owner` on the host) at `/mnt/data`
    /// and give the sandbox its full CPU weight. Only once the program said it is
    /// ready: the sandbox's filesystem is built by then.
    pub async fn attach(&mut self, workspace: &std::path::Path, owner: u32) -> Result<(), Error> {
        self.slot.cg.set_idle(false)?;
        let req = spec::Attach { workspace: workspace.into(), owner_uid: owner, owner_gid: owner };
        send_line(&mut self.sandbox.control, &req).await?;
        loop {
            match self.sandbox.next_event().await? {
                Event::Attached => return Ok(()),
                Event::SetupFailed { step, error } => return Err(Error::Setup { step, error }),
                _ => continue,
            }
        }
    }

    /// Supervise the run the program was just sent, as [`Sandboxes::run`] does.
    /// `done`, given the program's socket, resolves to the exit code when the
    /// program reports one itself, which ends the run at once (the rest of the
    /// sandbox is then killed).
    pub async fn finish(
        self,
        bounds: &Bounds,
        chunks: Option<mpsc::Sender<Chunk>>,
        mut cancel: watch::Receiver<bool>,
        done: impl FnOnce(tokio::net::UnixStream) -> Done,
    ) -> Result<Outcome, Error> {
        let Pooled { sandboxes, slot, mut sandbox, program, oom_before } = self;
        let started = Instant::now();
        let result = drive(&mut sandbox, bounds, chunks, &mut cancel, started, None, Some(done(program))).await;
        kill_all(sandbox.init_pid, sandbox.helper_pid);
        let (oom_killed, memory_peak_bytes) = usage(&slot, oom_before);
        // The rest of the sandbox is torn down (and its slot given back) after the answer.
        tokio::spawn(async move { sandboxes.release(slot).await });
        let mut outcome = result?;
        outcome.oom_killed = oom_killed;
        outcome.memory_peak_bytes = memory_peak_bytes;
        Ok(outcome)
    }

    /// End the sandbox and give its slot back.
    pub async fn destroy(self) {
        kill_all(self.sandbox.init_pid, self.sandbox.helper_pid);
        let Pooled { sandboxes, slot, .. } = self;
        sandboxes.release(slot).await;
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
    events: tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    control: OwnedWriteHalf,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    helper_pid: Option<i32>,
    init_pid: Option<i32>,
    warnings: Vec<String>,
}

impl Launched {
    /// The next event that is not bookkeeping (the helper's pid and warnings are kept).
    async fn next_event(&mut self) -> Result<Event, Error> {
        loop {
            let line = self.events.next_line().await.map_err(Error::Control)?.ok_or(Error::NoStatus)?;
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
        events: BufReader::new(read_half).lines(),
        control,
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
    done: Option<Done>,
) -> Result<Outcome, Error> {
    let receiver = |fd: Option<OwnedFd>| fd.and_then(|fd| tokio::net::unix::pipe::Receiver::from_owned_fd(fd).ok());
    let (out, err) = (receiver(sandbox.stdout.take()), receiver(sandbox.stderr.take()));
    let readers = [
        tokio::spawn(output::capture(out, StreamKind::Stdout, run.output_limit, chunks.clone())),
        tokio::spawn(output::capture(err, StreamKind::Stderr, run.output_limit, chunks)),
    ];
    let mut done_open = done.is_some();
    let mut done: Done = done.unwrap_or_else(|| Box::pin(std::future::pending()));

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
            code = &mut done, if done_open => match code {
                // The program reported its own end, after closing its output: the run
                // is over, and the rest of the sandbox is killed.
                Some(code) => {
                    final_event = Some(Event::Exited { code });
                    kill_all(init_pid, helper_pid);
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
