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
            Ok(()) => drive(&slot, &run, chunks, &mut cancel, started, started_tx).await,
            Err(e) => Err(e.into()),
        };
        // Whatever happened, nothing of the run survives it.
        slot.cg.kill_except(slot.pid());
        let oom_killed = slot.cg.oom_kills() > oom_before;
        let memory_peak_bytes = slot.cg.memory_peak();
        tracing::debug!(run_id = %run.id, elapsed_us = started.elapsed().as_micros() as u64, "sandbox ended");
        self.give_back(slot).await;
        let mut outcome = result?;
        outcome.oom_killed = oom_killed;
        outcome.memory_peak_bytes = memory_peak_bytes;
        Ok(outcome)
    }
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
    slot: &slot::Slot,
    run: &Run,
    chunks: Option<mpsc::Sender<Chunk>>,
    cancel: &mut watch::Receiver<bool>,
    started: Instant,
    mut started_tx: Option<tokio::sync::oneshot::Sender<i32>>,
) -> Result<Outcome, Error> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(Error::Control)?;
    ours.set_nonblocking(true).map_err(Error::Control)?;
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::Control(e.into()));
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    slot.fork_helper(&OwnedFd::from(theirs), &out_w, &err_w)
        .map_err(|f| Error::Setup { step: f.step.into(), error: f.error })?;
    // Only the helper holds the write ends now: end-of-file means the sandbox is done.
    drop((out_w, err_w));
    let receiver = |fd: OwnedFd| tokio::net::unix::pipe::Receiver::from_owned_fd(fd).ok();
    let readers = [
        tokio::spawn(output::capture(receiver(out_r), StreamKind::Stdout, run.output_limit, chunks.clone())),
        tokio::spawn(output::capture(receiver(err_r), StreamKind::Stderr, run.output_limit, chunks)),
    ];
    let (read_half, mut control) = tokio::net::UnixStream::from_std(ours).map_err(Error::Control)?.into_split();
    let mut events = BufReader::new(read_half).lines();
    send_line(&mut control, &run.spec).await?;
    let mut helper_pid: Option<i32> = None;

    let deadline = tokio::time::sleep(run.timeout);
    tokio::pin!(deadline);
    let mut init_pid: Option<i32> = None;
    let mut warnings = vec![];
    let mut timed_out = false;
    let mut cancelled = false;
    let mut term_sent_at: Option<Instant> = None;
    let mut final_event: Option<Event> = None;

    loop {
        let grace_left = term_sent_at.map(|t| run.grace.saturating_sub(t.elapsed()));
        tokio::select! {
            line = events.next_line() => match line {
                Ok(Some(line)) => match serde_json::from_str::<Event>(&line) {
                    Ok(Event::HelperStarted { pid }) => helper_pid = Some(pid),
                    Ok(Event::Started { init_pid: pid }) => {
                        tracing::debug!(run_id = %run.id, elapsed_us = started.elapsed().as_micros() as u64, "sandbox init started");
                        init_pid = Some(pid);
                        if let Some(tx) = started_tx.take() {
                            let _ = tx.send(pid);
                        }
                    }
                    Ok(Event::Warning { message }) => {
                        tracing::warn!(run_id = %run.id, "{message}");
                        warnings.push(message);
                    }
                    Ok(e) => {
                        tracing::debug!(run_id = %run.id, elapsed_us = started.elapsed().as_micros() as u64, "program ended");
                        final_event = Some(e);
                        break;
                    }
                    Err(e) => tracing::warn!(run_id = %run.id, error = %e, "unreadable helper event"),
                },
                Ok(None) | Err(_) => break,
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
    // The helper exits right after its last event (its socket then reads end-of-file);
    // if it does not, it is killed.
    let drained =
        tokio::time::timeout(Duration::from_secs(5), async { while let Ok(Some(_)) = events.next_line().await {} });
    if drained.await.is_err() || final_event.is_none() {
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
        warnings,
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
