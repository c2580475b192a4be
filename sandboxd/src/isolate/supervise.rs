//! The supervision loop, below both the slot pool ([`super::sandboxes`]) and the
//! pooled templates ([`super::pooled`]): have a slot fork a run's helper
//! ([`launch`]), read the program's stdout and stderr (capped while they are read),
//! enforce the wall-clock limit (SIGTERM, a grace period, then SIGKILL to the
//! whole tree) and cancellation ([`drive`], through [`Drive`]), and complete the
//! run's [`Outcome`] in one place ([`Ended::complete`]).

use super::cgroup::{self, RunCgroup};
use super::channel::{self, Channel};
use super::drive::{Drive, Kill, Target};
use super::fdstream::FdStream;
use super::message::{Event, Exit, HelperFds, Report, RunClaim, Stream};
use super::output::{self, Captured, Chunk};
use super::process::{output_pipe, socket_pair};
use super::slot;
use super::spec::SandboxSpec;
use crate::model::run::RunUsage;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};

/// Longest line read from a helper's control socket (its events are small).
const HELPER_LINE: usize = 64 * 1024;
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
    #[error("talking to the sandbox: {0}")]
    Channel(#[from] channel::Error),
    #[error("setting up the sandbox failed at {step}: {error}")]
    Setup { step: String, error: String },
    #[error("the sandbox helper closed its control socket before the program ended")]
    HelperGone,
    #[error("the sandbox helper broke the protocol: {0}")]
    HelperProtocol(channel::Error),
    #[error("the sandbox helper said \"{0}\" where it was to say {1}")]
    Unexpected(&'static str, &'static str),
    #[error("the template's sandbox has no init")]
    NoInit,
    #[error("the template's init has no interpreter: it ended")]
    NoInterpreter,
    #[error("a template's fork has no helper of its own to ask")]
    NoHelper,
    #[error("the fork made ahead for the run is gone: it spoke or ended before its run")]
    NoPreparedFork,
    #[error("the pool has no library for its templates' forks")]
    NoLibrary,
    #[error("the template's slot process is gone")]
    SlotGone,
    #[error("the template served its {0} runs and is replaced")]
    Retired(u64),
    #[error("its run counted more than {0} tasks, a peak its cgroup keeps: it is replaced")]
    PidsSpent(u64),
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

/// How a run ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// How its program ended (killed by SIGKILL when the daemon killed it before
    /// its sandbox could say).
    pub exit: Exit,
    pub timed_out: bool,
    pub oom_killed: bool,
    /// Killed on request (the session was closed, the daemon is stopping).
    pub cancelled: bool,
    pub duration: Duration,
    pub stdout: Captured,
    pub stderr: Captured,
    pub warnings: Vec<String>,
    pub usage: RunUsage,
    /// Of `duration`: waiting for a slot (a cold run), and from then until the
    /// program started (a cold run's set-up; a pooled run's attach is timed by the pool).
    pub queue: Duration,
    pub setup: Duration,
}

/// A sandbox whose run counted more tasks than this is replaced afterwards (see
/// [`RunUsage::pids_peak`]): a `print(1)` counts 3.
pub const PIDS_KEEP: u64 = 5;

/// The cgroup's counters when a run began (see [`RunUsage`]).
#[derive(Debug)]
pub struct Baseline {
    oom: u64,
    cpu_ns: Option<u64>,
    memory: Option<u64>,
    /// Reads the memory peak since the run began.
    peak: Option<std::fs::File>,
    /// Tasks present that are not the run's own.
    others: Option<u64>,
    /// The cgroup's task peak so far.
    pids_peak: Option<u64>,
}

impl Baseline {
    /// Read the counters of `cg` as a run begins there; `own` of the tasks
    /// present now belong to the run (a pooled run's fork: 3; a kernel cell: 1).
    pub fn take(cg: &RunCgroup, own: u64) -> Baseline {
        let peak = cg.reset_peak();
        Baseline {
            oom: cg.oom_kills(),
            cpu_ns: cg.cpu_usage_ns(),
            memory: cg.memory_current(),
            peak,
            others: cg.pids_current().map(|n| n.saturating_sub(own)),
            pids_peak: cg.pids_peak(),
        }
    }

    /// What the run used, read once its processes are gone.
    pub fn usage(&self, cg: &RunCgroup) -> Usage {
        let cpu_ms = match (self.cpu_ns, cg.cpu_usage_ns()) {
            (Some(before), Some(after)) => Some(after.saturating_sub(before) / 1_000_000),
            _ => None,
        };
        let memory_peak_bytes = match (&self.peak, self.memory) {
            (Some(file), Some(before)) => RunCgroup::peak_since_reset(file).map(|p| p.saturating_sub(before)),
            _ => None,
        };
        let peak_after = cg.pids_peak();
        let pids_peak = match (self.others, peak_after) {
            (Some(others), Some(peak)) => Some(peak.saturating_sub(others)),
            _ => None,
        };
        // The run set the cgroup's task peak past [`PIDS_KEEP`] of its own: a later
        // run there would count this one's.
        let pids_spent = peak_after > self.pids_peak && pids_peak.is_some_and(|n| n > PIDS_KEEP);
        Usage {
            oom_killed: cg.oom_kills() > self.oom,
            pids_spent,
            run: RunUsage { cpu_ms, memory_peak_bytes, pids_peak, net: None, disk_full: None },
        }
    }
}

/// What the run's cgroup says about it, read once its processes are gone.
#[derive(Debug, Clone)]
pub struct Usage {
    pub oom_killed: bool,
    /// The run raised the cgroup's task peak past [`PIDS_KEEP`] of its own.
    pub pids_spent: bool,
    pub run: RunUsage,
}

/// How a run ended, as [`drive`] saw it: everything of the [`Outcome`] but what
/// the cgroup says.
#[derive(Debug)]
pub struct Ended {
    exit: Exit,
    timed_out: bool,
    cancelled: bool,
    duration: Duration,
    stdout: Captured,
    stderr: Captured,
    warnings: Vec<String>,
    /// When the sandbox's init said it started, after the run's start.
    init_started: Option<Duration>,
}

impl Ended {
    /// The run's outcome: the one place a run's result is completed.
    pub fn complete(self, usage: Usage) -> Outcome {
        Outcome {
            exit: self.exit,
            timed_out: self.timed_out,
            oom_killed: usage.oom_killed,
            cancelled: self.cancelled,
            duration: self.duration,
            stdout: self.stdout,
            stderr: self.stderr,
            warnings: self.warnings,
            usage: usage.run,
            queue: Duration::ZERO,
            setup: self.init_started.unwrap_or_default(),
        }
    }
}

/// Resolves to how a run ended when its processes report it themselves (None: its
/// report ended without a word).
pub type Done<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Exit>> + Send + 'a>>;

/// What a sandbox's start tells the one who launched it: its init's host pid, and
/// the egress proxy's listener in its network namespace (a policy with network).
#[derive(Debug)]
pub struct Started {
    pub init_pid: i32,
    pub listener: Option<OwnedFd>,
}

/// The daemon's ends of a sandbox whose helper has its spec.
pub struct Launched {
    /// The helper's control socket: [`Event`]s in (with the fds they carry),
    /// [`super::message::Attach`]es out; None for a template's fork, which has no
    /// helper.
    pub control: Option<Channel<FdStream>>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    pub helper_pid: Option<i32>,
    pub init_pid: Option<i32>,
    pub warnings: Vec<String>,
    /// The last egress listener the helper sent ([`Event::carries_listener`]), not
    /// yet taken.
    pub listener: Option<OwnedFd>,
}

impl Launched {
    /// The next event that is not bookkeeping (the helper's pid and warnings are kept).
    pub async fn next_event(&mut self) -> Result<Event, Error> {
        let Some(control) = self.control.as_mut() else { return std::future::pending().await };
        loop {
            match control.recv::<Event>().await {
                Ok(Some(Event::HelperStarted { pid })) => self.helper_pid = Some(pid),
                Ok(Some(e)) if e.carries_listener() => {
                    // Sent with the line's bytes, so here by now.
                    match control.get_mut().take_fd() {
                        Some(fd) => self.listener = Some(fd),
                        None => {
                            return Err(Error::Setup {
                                step: "egress".into(),
                                error: "the helper said it sent the egress listener, and none came".into(),
                            })
                        }
                    }
                    return Ok(e);
                }
                Ok(Some(Event::Warning { message })) => {
                    tracing::warn!("{message}");
                    self.warnings.push(message);
                }
                Ok(Some(e)) => return Ok(e),
                Ok(None) => return Err(Error::HelperGone),
                Err(e) if e.is_violation() => {
                    tracing::warn!(error = %e, "unreadable helper event");
                    return Err(Error::HelperProtocol(e));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub async fn wait_started(&mut self) -> Result<(), Error> {
        match self.next_event().await? {
            Event::Started { init_pid, .. } => {
                self.init_pid = Some(init_pid);
                Ok(())
            }
            Event::SetupFailed { step, error } => Err(Error::Setup { step, error }),
            other => Err(Error::Unexpected(other.name(), "that the init started")),
        }
    }

    /// Whom a [`Drive`] signals.
    fn target(&self) -> Target {
        Target { init: self.init_pid, helper: self.helper_pid }
    }
}

/// Have the slot fork a helper for `spec` and send it the spec.
pub async fn launch(slot: &slot::Slot, spec: &SandboxSpec, stdin: Option<&OwnedFd>) -> Result<Launched, Error> {
    let (ours, theirs) = socket_pair().map_err(Error::Control)?;
    let (out_r, out_w) = output_pipe(spec.host_uid, spec.host_gid).map_err(Error::Control)?;
    let (err_r, err_w) = output_pipe(spec.host_uid, spec.host_gid).map_err(Error::Control)?;
    let theirs = OwnedFd::from(theirs);
    let fds = HelperFds {
        control: theirs.as_fd(),
        stdout: out_w.as_fd(),
        stderr: err_w.as_fd(),
        stdin: stdin.map(|s| s.as_fd()),
    };
    slot.fork_helper(&fds).map_err(|f| Error::Setup { step: f.step.into(), error: f.error })?;
    // Only the helper holds the write ends now: end-of-file means the sandbox is done.
    drop((out_w, err_w, theirs));
    let mut control = Channel::new(FdStream::new(ours), HELPER_LINE);
    control.send(spec).await?;
    Ok(Launched {
        control: Some(control),
        stdout: Some(out_r),
        stderr: Some(err_r),
        helper_pid: None,
        init_pid: None,
        warnings: vec![],
        listener: None,
    })
}

/// How a pooled run that has its code ended: its outer process's [`Report`], or
/// (with [`ACCEPT_CLAIMS`]) the run's own [`RunClaim`] of an exit code, whichever
/// comes first. A claim can only say what the run could have chosen by exiting
/// with that code; a signal, a failure, a timeout or an OOM kill come only from
/// the report, the daemon's timer and the cgroup. Anything else on the run's
/// socket is ignored and the daemon hangs up on it (the runner waits for either).
pub async fn run_ended(
    program: &mut Channel<tokio::net::UnixStream>,
    report: &mut Channel<tokio::net::unix::pipe::Receiver>,
    run_id: &str,
) -> Exit {
    let mut listening = true;
    loop {
        // What the run wrote on its socket before it ended is read before its
        // report: "whichever comes first" holds when both are already there, and a
        // forged line is always seen (and logged) rather than by a coin's toss.
        tokio::select! {
            biased;
            claim = program.recv::<RunClaim>(), if listening => {
                match claim {
                    Ok(Some(RunClaim::ExitCode(code))) if ACCEPT_CLAIMS => return Exit::Exited(i32::from(code)),
                    Ok(Some(_)) | Ok(None) => {}
                    Err(e) if e.is_violation() => {
                        tracing::info!(run_id, error = %e, "a pooled run's socket broke the protocol; how it ended comes from its outer process");
                    }
                    Err(_) => {}
                }
                listening = false;
                let _ = program.get_mut().shutdown().await;
            }
            ended = report.recv::<Report>() => return reported(ended, run_id),
        }
    }
}

/// How a pooled fork ended by its outer process's report alone: a kernel's fork,
/// whose socket is the kernel's channel and carries no claim.
pub async fn report_ended(report: &mut Channel<tokio::net::unix::pipe::Receiver>, run_id: &str) -> Exit {
    reported(report.recv::<Report>().await, run_id)
}

/// What the report channel said, as how the run ended.
fn reported(ended: Result<Option<Report>, channel::Error>, run_id: &str) -> Exit {
    match ended {
        Ok(Some(Report::Ended(exit))) => exit,
        Ok(Some(Report::Failed { step, .. })) => {
            tracing::warn!(run_id, step = %channel::excerpt(step.as_bytes()), "a pooled run's init failed after the run had its code; taken as killed");
            Exit::KILLED
        }
        // Its outer process is gone (killed with the template).
        Ok(None) | Err(_) => Exit::KILLED,
    }
}

/// How the sandbox's side ended a run, as [`drive`] heard it.
enum Heard {
    /// How the program ended: from its helper ([`Event::Ended`], or the signal that
    /// killed its init), or from its own report (`done`).
    Exit(Exit),
    /// Its sandbox could not be built.
    Failed { step: String, error: String },
    /// The helper said nothing more, or something else.
    Lost(Error),
}

/// Supervise a launched sandbox until its program ends, the limit or a cancel
/// kills it, or `done` (a pooled run's own report) says how it ended. Signals go
/// through `kill` (the daemon's: [`super::process::signal`]).
#[allow(clippy::too_many_arguments)]
pub async fn drive<K: Kill>(
    sandbox: &mut Launched,
    run: &Bounds,
    chunks: Option<mpsc::Sender<Chunk>>,
    cancel: &mut watch::Receiver<bool>,
    started: Instant,
    mut started_tx: Option<tokio::sync::oneshot::Sender<Started>>,
    done: Option<Done<'_>>,
    kill: K,
) -> Result<Ended, Error> {
    let receiver = |fd: Option<OwnedFd>| fd.and_then(|fd| tokio::net::unix::pipe::Receiver::from_owned_fd(fd).ok());
    let (out, err) = (receiver(sandbox.stdout.take()), receiver(sandbox.stderr.take()));
    let readers = [
        tokio::spawn(output::capture(out, Stream::Stdout, run.output_limit, chunks.clone())),
        tokio::spawn(output::capture(err, Stream::Stderr, run.output_limit, chunks)),
    ];
    let mut done_open = done.is_some();
    let mut done: Done<'_> = done.unwrap_or_else(|| Box::pin(std::future::pending()));
    // The init forwards SIGTERM to every process in the sandbox.
    let mut drive = Drive::new(kill, run.timeout, run.grace, nix::sys::signal::Signal::SIGTERM);
    drive.retarget(sandbox.target());
    let mut init_started = None;

    let heard = loop {
        tokio::select! {
            event = sandbox.next_event() => {
                // The helper's pid comes as bookkeeping: known from now on.
                drive.retarget(sandbox.target());
                match event {
                    Ok(Event::Started { init_pid: pid, .. }) => {
                        tracing::debug!(run_id = %run.id, elapsed_us = started.elapsed().as_micros() as u64, "sandbox init started");
                        sandbox.init_pid = Some(pid);
                        init_started = Some(started.elapsed());
                        if let Some(tx) = started_tx.take() {
                            let _ = tx.send(Started { init_pid: pid, listener: sandbox.listener.take() });
                        }
                        // A cancel (or a kill at the limit) that came before the
                        // sandbox said who its init is reached at most its helper:
                        // the drive kills the init now.
                        drive.retarget(sandbox.target());
                    }
                    Ok(e) => {
                        tracing::debug!(run_id = %run.id, elapsed_us = started.elapsed().as_micros() as u64, "program ended");
                        break match e {
                            Event::Ended { exit } => Heard::Exit(exit),
                            Event::InitKilled { signal } => Heard::Exit(Exit::Signaled(signal)),
                            Event::SetupFailed { step, error } => Heard::Failed { step, error },
                            other => Heard::Lost(Error::Unexpected(other.name(), "how the program ended")),
                        };
                    }
                    Err(e) => break Heard::Lost(e),
                }
            },
            ended = &mut done, if done_open => match ended {
                // The program reported its own end, after closing its output: the run
                // is over, and the rest of the sandbox is killed.
                Some(exit) => {
                    drive.kill();
                    break Heard::Exit(exit);
                }
                // A template's fork has no helper to report for it: its socket closing
                // without a word means its processes are gone.
                None if sandbox.control.is_none() => break Heard::Exit(Exit::KILLED),
                None => done_open = false,
            },
            _ = drive.tick() => {},
            changed = cancel.changed(), if drive.running() => {
                if changed.is_err() || *cancel.borrow() {
                    drive.cancel();
                }
            },
        }
    };
    // Without how the program ended (the helper's socket ended), nothing of the
    // sandbox may live on. After it, its teardown is not waited for: what is left
    // of it is killed with the rest of the slot's processes after the run.
    if matches!(heard, Heard::Lost(_)) {
        drive.kill_everything();
    }
    let [out, err] = readers;
    let stdout = out.await.unwrap_or_default();
    let stderr = err.await.unwrap_or_default();
    let duration = started.elapsed();
    let (timed_out, cancelled) = (drive.timed_out(), drive.cancelled());
    let exit = match heard {
        Heard::Exit(exit) => exit,
        Heard::Failed { step, error } => return Err(Error::Setup { step, error }),
        // The daemon killed it: that is how it ended.
        Heard::Lost(_) if timed_out || cancelled => Exit::KILLED,
        Heard::Lost(e) => return Err(e),
    };
    Ok(Ended {
        exit,
        timed_out,
        cancelled,
        duration,
        stdout,
        stderr,
        warnings: std::mem::take(&mut sandbox.warnings),
        init_started,
    })
}

#[cfg(test)]
mod tests;
