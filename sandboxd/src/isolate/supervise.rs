//! The supervision loop, below both the slot pool ([`super::sandboxes`]) and the
//! pooled templates ([`super::pooled`]): have a slot fork a run's helper
//! ([`launch`]), read the program's stdout and stderr (capped while they are read),
//! enforce the wall-clock limit (SIGTERM, a grace period, then SIGKILL to the
//! whole tree) and cancellation ([`drive`]), and complete the run's [`Outcome`] in
//! one place ([`Ended::complete`]).

use super::cgroup::{self, RunCgroup};
use super::channel::{self, Channel};
use super::message::{Event, HelperFds, Report, RunClaim};
use super::output::{self, Captured, Chunk, StreamKind};
use super::process::{kill_all, pipe, signal, socket_pair};
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
    #[error("the sandbox helper ended without reporting the program's status")]
    NoStatus,
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
            run: RunUsage { cpu_ms, memory_peak_bytes, pids_peak },
        }
    }
}

/// What the run's cgroup says about it, read once its processes are gone.
#[derive(Debug, Clone, Copy)]
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
    exit_code: Option<i32>,
    signal: Option<i32>,
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
            exit_code: self.exit_code,
            signal: self.signal,
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
pub type Done<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Event>> + Send + 'a>>;

/// The daemon's ends of a sandbox whose helper has its spec.
pub struct Launched {
    /// The helper's control socket: [`Event`]s in, [`super::message::Attach`]es
    /// out; None for a template's fork, which has no helper.
    pub control: Option<Channel<tokio::net::UnixStream>>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    pub helper_pid: Option<i32>,
    pub init_pid: Option<i32>,
    pub warnings: Vec<String>,
}

impl Launched {
    /// The next event that is not bookkeeping (the helper's pid and warnings are kept).
    pub async fn next_event(&mut self) -> Result<Event, Error> {
        let Some(control) = self.control.as_mut() else { return std::future::pending().await };
        loop {
            match control.recv::<Event>().await {
                Ok(Some(Event::HelperStarted { pid })) => self.helper_pid = Some(pid),
                Ok(Some(Event::Warning { message })) => {
                    tracing::warn!("{message}");
                    self.warnings.push(message);
                }
                Ok(Some(e)) => return Ok(e),
                Ok(None) => return Err(Error::NoStatus),
                Err(e) if e.is_violation() => {
                    tracing::warn!(error = %e, "unreadable helper event");
                    return Err(Error::NoStatus);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub async fn wait_started(&mut self) -> Result<(), Error> {
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
pub async fn launch(slot: &slot::Slot, spec: &SandboxSpec, stdin: Option<&OwnedFd>) -> Result<Launched, Error> {
    let (ours, theirs) = socket_pair().map_err(Error::Control)?;
    let (out_r, out_w) = pipe().map_err(Error::Control)?;
    let (err_r, err_w) = pipe().map_err(Error::Control)?;
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
    let mut control = Channel::new(ours, HELPER_LINE);
    control.send(spec).await?;
    Ok(Launched {
        control: Some(control),
        stdout: Some(out_r),
        stderr: Some(err_r),
        helper_pid: None,
        init_pid: None,
        warnings: vec![],
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
) -> Event {
    let mut listening = true;
    loop {
        tokio::select! {
            claim = program.recv::<RunClaim>(), if listening => {
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
            ended = report.recv::<Report>() => return match ended {
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

/// Supervise a launched sandbox until its program ends, the limit or a cancel
/// kills it, or `done` (a pooled run's own report) says how it ended.
pub async fn drive(
    sandbox: &mut Launched,
    run: &Bounds,
    chunks: Option<mpsc::Sender<Chunk>>,
    cancel: &mut watch::Receiver<bool>,
    started: Instant,
    mut started_tx: Option<tokio::sync::oneshot::Sender<i32>>,
    done: Option<Done<'_>>,
) -> Result<Ended, Error> {
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
    let mut init_started = None;

    loop {
        let grace_left = term_sent_at.map(|t| run.grace.saturating_sub(t.elapsed()));
        let (init_pid, helper_pid) = (sandbox.init_pid, sandbox.helper_pid);
        tokio::select! {
            event = sandbox.next_event() => match event {
                Ok(Event::Started { init_pid: pid }) => {
                    tracing::debug!(run_id = %run.id, elapsed_us = started.elapsed().as_micros() as u64, "sandbox init started");
                    sandbox.init_pid = Some(pid);
                    init_started = Some(started.elapsed());
                    if let Some(tx) = started_tx.take() {
                        let _ = tx.send(pid);
                    }
                    // A cancel (or a timeout without grace) that came before the
                    // sandbox said who its helper and init are killed nothing: the
                    // init is known now.
                    if cancelled || (timed_out && term_sent_at.is_none()) {
                        kill_all(Some(pid), sandbox.helper_pid);
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
                None if sandbox.control.is_none() => {
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
    Ok(Ended {
        exit_code,
        signal,
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
mod tests {
    use super::*;

    /// A cancel that comes before the helper has said which process is the
    /// sandbox's init (a DELETE right after a run was accepted) once killed
    /// nothing, and the run went on to its end.
    #[tokio::test]
    async fn a_cancel_before_the_init_is_known_still_kills_it() {
        let (ours, theirs) = socket_pair().unwrap();
        let init = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = init.id() as i32;
        let mut sandbox = Launched {
            control: Some(Channel::new(ours, HELPER_LINE)),
            stdout: None,
            stderr: None,
            helper_pid: None,
            init_pid: None,
            warnings: vec![],
        };
        let (cancel_tx, mut cancel) = watch::channel(false);
        cancel_tx.send(true).unwrap();
        // The helper's side: the init started; its end is reported once it died
        // (it stays a zombie of this test until waited for), or after 10 s.
        let helper = tokio::spawn(async move {
            theirs.set_nonblocking(true).unwrap();
            let mut control = Channel::new(tokio::net::UnixStream::from_std(theirs).unwrap(), HELPER_LINE);
            control.send(&Event::Started { init_pid: pid }).await.unwrap();
            let dead = || {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map(|s| s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
                    .unwrap_or(true)
            };
            for _ in 0..100 {
                if dead() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            control.send(&Event::Signaled { signal: libc::SIGKILL }).await.unwrap();
        });
        let bounds =
            Bounds { id: "r".into(), timeout: Duration::from_secs(60), grace: Duration::ZERO, output_limit: 10 };
        let ended = drive(&mut sandbox, &bounds, None, &mut cancel, Instant::now(), None, None).await.unwrap();
        helper.await.unwrap();
        assert!(ended.cancelled);
        let status = { init }.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL), "{status:?}");
    }
}
