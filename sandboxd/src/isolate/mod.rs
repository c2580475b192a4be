//! Running one program in a fresh sandbox.
//!
//! The daemon side lives here ([`run`]): it creates the run's cgroup, starts the
//! single-threaded helper (`sandboxd __sandbox`, [`helper`]) with a control socket,
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
pub mod spec;

use output::{Captured, Chunk, StreamKind};
use spec::{Event, SandboxSpec};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
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

/// Run the program in a new sandbox. `chunks`, when given, receives the output as
/// it is produced (within the caps). Setting `cancel` to true kills the run.
pub async fn run(
    cgroups: &cgroup::Cgroups,
    run: Run,
    chunks: Option<mpsc::Sender<Chunk>>,
    mut cancel: watch::Receiver<bool>,
) -> Result<Outcome, Error> {
    let started = Instant::now();
    let cg = cgroups.create(&run.id, &run.limits)?;
    let result = drive(&cg, &run, chunks, &mut cancel, started).await;
    // Whatever happened, nothing of the run survives it.
    cg.kill();
    let oom_killed = cg.oom_killed();
    let memory_peak_bytes = cg.memory_peak();
    let removed = tokio::task::spawn_blocking(move || cg.remove()).await;
    if let Ok(Err(e)) = removed {
        tracing::warn!(run_id = %run.id, error = %e, "could not remove the run's cgroup");
    }
    let mut outcome = result?;
    outcome.oom_killed = oom_killed;
    outcome.memory_peak_bytes = memory_peak_bytes;
    Ok(outcome)
}

async fn drive(
    cg: &cgroup::RunCgroup,
    run: &Run,
    chunks: Option<mpsc::Sender<Chunk>>,
    cancel: &mut watch::Receiver<bool>,
    started: Instant,
) -> Result<Outcome, Error> {
    let mut spec = run.spec.clone();
    spec.cgroup_procs = cg.procs_files();
    spec.daemon_pid = std::process::id();

    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(Error::Control)?;
    ours.set_nonblocking(true).map_err(Error::Control)?;
    let exe = helper_exe();
    let mut child = tokio::process::Command::new(&exe)
        .arg(HELPER_ARG)
        .env_clear()
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::Spawn(exe.clone(), e))?;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let readers = [
        tokio::spawn(output::capture(stdout, StreamKind::Stdout, run.output_limit, chunks.clone())),
        tokio::spawn(output::capture(stderr, StreamKind::Stderr, run.output_limit, chunks)),
    ];
    let mut spec_line = serde_json::to_vec(&spec).map_err(|e| Error::Control(e.into()))?;
    spec_line.push(b'\n');
    let control = tokio::net::UnixStream::from_std(ours).map_err(Error::Control)?;
    let (read_half, mut write_half) = control.into_split();
    write_half.write_all(&spec_line).await.map_err(Error::Control)?;
    let mut events = BufReader::new(read_half).lines();

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
                    Ok(Event::Started { init_pid: pid }) => init_pid = Some(pid),
                    Ok(Event::Warning { message }) => {
                        tracing::warn!(run_id = %run.id, "{message}");
                        warnings.push(message);
                    }
                    Ok(e) => { final_event = Some(e); break; }
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
                    _ => kill_all(cg, init_pid),
                }
            },
            _ = tokio::time::sleep(grace_left.unwrap_or(Duration::MAX)), if grace_left.is_some() => {
                term_sent_at = None;
                kill_all(cg, init_pid);
            },
            changed = cancel.changed(), if !cancelled && !timed_out => {
                if changed.is_err() || *cancel.borrow() {
                    cancelled = true;
                    kill_all(cg, init_pid);
                }
            },
        }
    }
    // The helper exits right after its last event; if it does not, it is killed.
    if tokio::time::timeout(Duration::from_secs(5), child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
    kill_all(cg, init_pid);
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

/// SIGKILL the sandbox's init (the kernel then kills its whole pid namespace) and
/// everything in the run's cgroup.
fn kill_all(cg: &cgroup::RunCgroup, init_pid: Option<i32>) {
    if let Some(pid) = init_pid {
        signal(pid, nix::sys::signal::Signal::SIGKILL);
    }
    cg.kill();
}
