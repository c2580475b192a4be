//! Kernel sessions: one interpreter kept alive in the session's sandbox across
//! runs, so variables survive from one run to the next.
//!
//! The kernel's channel to the daemon is one end of a socket pair, handed to the
//! sandbox as the program's stdin (nothing is bound into the sandbox, no socket is
//! ever on a filesystem). The program is `python -c BOOTSTRAP`: the bootstrap reads
//! `kernel.py` (embedded in this binary) from that socket, length-prefixed, and runs
//! it; kernel.py then moves the socket off fd 0 and says `{"kind": "ready"}`.
//!
//! Cells then go over the socket as JSON lines. The user's code shares the kernel's
//! process, and so the socket: everything read from it is untrusted. Each line is
//! bounded ([`MAX_LINE`], [`crate::isolate::channel`]) and parsed strictly into a
//! [`KernelMessage`]. Each cell carries a random nonce made by the daemon; kernel.py
//! tags the cell's output chunks and its reply with it, and anything with another
//! nonce (late output or a late reply of an earlier cell) is dropped, so late or
//! stray lines never shift later cells. This does not make a session's results
//! trustworthy against its own code: code run in an earlier cell stays in the
//! process, can read the next cell's request (nonce included) from the socket
//! before kernel.py does and answer it, so what a kernel session returns is only
//! as trustworthy as every cell it ran before (the README says so). It is bounded
//! all the same, and it stays inside the session. The cell's
//! output always arrives as chunks, and the daemon keeps at most the policy's output
//! limit of each stream ([`Cell`]); a reply's fields are clipped to fixed bounds. A
//! line over the limit or one that is not a message ends the kernel: the cell's
//! result says the kernel broke the protocol and was restarted.
//!
//! How a cell ended when the kernel died comes from the daemon's own findings (its
//! timer, a cancel, a protocol violation: [`Cutoff`]), the cgroup (OOM) and, for a
//! kernel that ended on its own, its sandbox's report of its exit code or signal
//! (the init's, out of the kernel's reach), never from a message. A timeout sends SIGINT
//! to the sandbox (the init forwards it), which interrupts the cell and keeps the
//! state; a cell that ignores it is killed after the grace period, and the kernel is
//! started afresh next time.

mod cutoff;
pub use cutoff::Cutoff;

use crate::isolate::channel::{self, Channel};
use crate::isolate::drive::{Drive, Step as DriveStep, Target};
use crate::isolate::message::{kernel_source, KernelCell};
pub use crate::isolate::message::{Exception, KernelMessage, Rich, Stream};
use crate::isolate::output::Chunk;
use crate::isolate::{self, Outcome, Sandboxes};
use crate::model::policy::Policy;
use crate::model::run::RunUsage;
use serde::Serialize;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// The kernel's source, sent over its socket at start.
pub const SOURCE: &str = include_str!("../../rootfs/support/kernel.py");
/// Run with `python -c`: reads a 10-digit length and that many bytes of source from
/// fd 0 (exactly: the first cell follows on the same socket), and runs it.
const BOOTSTRAP: &str = "import os
def _read(n):
    b = b''
    while len(b) < n:
        c = os.read(0, n - len(b))
        if not c:
            os._exit(1)
        b += c
    return b
exec(compile(_read(int(_read(10))), 'kernel.py', 'exec'), {'__name__': '__main__'})
";
/// Longest line accepted from a kernel. kernel.py's own lines stay well below it:
/// an output chunk is at most 64 KiB read from a pipe (a character each byte at
/// worst, at most 6 bytes in JSON), a reply's texts are cut to 16 Ki characters.
pub const MAX_LINE: usize = 1024 * 1024;
/// Bytes kept of a result's `text/plain` and `text/html`, an exception's value and
/// traceback.
const MAX_TEXT: usize = 64 * 1024;
/// Bytes kept of an exception's name.
const MAX_NAME: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("preparing the kernel's channel: {0}")]
    Channel(std::io::Error),
    #[error("the kernel did not start: {0}")]
    Start(String),
    /// The run was stopped (cancelled, its session closing, the daemon stopping)
    /// while its kernel started: none is left running.
    #[error("the run was stopped while its kernel started")]
    Stopped,
}

/// One cell, as the daemon sends it.
#[derive(Debug, Clone, Serialize)]
pub struct CellRequest {
    pub code: String,
    pub run_id: String,
    pub autosave: bool,
    /// Bytes of each stream the kernel keeps (the daemon keeps no more either).
    pub output_limit: usize,
    /// What the kernel's environment takes before the cell (the session's secrets'
    /// placeholders, which a session may set between cells).
    pub env: std::collections::BTreeMap<String, String>,
}

/// What a cell sends back, within the daemon's bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellReply {
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub result: Option<Rich>,
    pub exception: Option<Exception>,
    pub exit_code: i32,
}

/// A stream's output kept so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kept {
    pub text: String,
    pub truncated: bool,
}

impl Kept {
    /// Keep what fits of `text` under `limit` bytes in all; returns what was kept.
    fn push(&mut self, mut text: String, limit: usize) -> Option<String> {
        let room = limit.saturating_sub(self.text.len());
        self.truncated |= channel::clip(&mut text, room);
        if text.is_empty() {
            return None;
        }
        self.text.push_str(&text);
        Some(text)
    }
}

/// What one message meant for the running cell.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Output of this cell, kept: forward it to a streaming client.
    Output(Chunk),
    /// Nothing for this cell (another cell's, or output past the limit).
    Nothing,
    /// The cell is over.
    Reply(CellReply),
}

/// A message the kernel may not send.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("a \"ready\" in the middle of a cell")]
pub struct Unexpected;

/// The daemon's side of one cell: matches messages to it by nonce and enforces the
/// output limit on what the kernel sends.
#[derive(Debug)]
pub struct Cell {
    nonce: String,
    limit: usize,
    pub stdout: Kept,
    pub stderr: Kept,
}

impl Cell {
    pub fn new(nonce: String, limit: usize) -> Cell {
        Cell { nonce, limit, stdout: Kept::default(), stderr: Kept::default() }
    }

    pub fn take(&mut self, msg: KernelMessage) -> Result<Step, Unexpected> {
        match msg {
            KernelMessage::Ready {} => Err(Unexpected),
            KernelMessage::Chunk { nonce, .. } | KernelMessage::Reply { nonce, .. } if nonce != self.nonce => {
                Ok(Step::Nothing)
            }
            KernelMessage::Chunk { stream, text, .. } => {
                let kept = match stream {
                    Stream::Stdout => &mut self.stdout,
                    Stream::Stderr => &mut self.stderr,
                };
                Ok(match kept.push(text, self.limit) {
                    Some(text) => Step::Output(Chunk { stream, text }),
                    None => Step::Nothing,
                })
            }
            KernelMessage::Reply { result, exception, exit_code, stdout_truncated, stderr_truncated, .. } => {
                let result = result.map(|mut r| {
                    channel::clip(&mut r.plain, MAX_TEXT);
                    if let Some(h) = r.html.as_mut() {
                        channel::clip(h, MAX_TEXT);
                    }
                    r
                });
                let exception = exception.map(|mut e| {
                    channel::clip(&mut e.name, MAX_NAME);
                    channel::clip(&mut e.value, MAX_TEXT);
                    channel::clip(&mut e.traceback, MAX_TEXT);
                    e
                });
                let (out, err) = (std::mem::take(&mut self.stdout), std::mem::take(&mut self.stderr));
                Ok(Step::Reply(CellReply {
                    stdout: out.text,
                    stderr: err.text,
                    stdout_truncated: out.truncated || stdout_truncated,
                    stderr_truncated: err.truncated || stderr_truncated,
                    result,
                    exception,
                    exit_code: i32::from(exit_code),
                }))
            }
        }
    }
}

/// How a cell ended.
pub enum CellEnd {
    /// The kernel answered; `interrupted` when that took the timeout's SIGINT.
    /// `usage`: what the cell used (see [`RunUsage`]).
    Done { reply: CellReply, interrupted: bool, usage: RunUsage },
    /// The kernel is gone, for the reason `cut` says; `outcome`: how its sandbox
    /// ended. `stdout`/`stderr`: the cell's output until then.
    Died { cut: Cutoff, outcome: Option<Box<Outcome>>, stdout: Kept, stderr: Kept, usage: RunUsage },
}

/// How long a kernel may live: as long as its session (cells have their own limit).
const LIFE: Duration = Duration::from_secs(400 * 86400);
/// How long a kernel may take to say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// Bytes kept of what a kernel writes outside its cells (kernel.py captures a
/// cell's own output): shown when it ends at once.
const OUTSIDE_CELLS: usize = 64 * 1024;

/// Once the run is cancelled (a cancel request, its session closing, the daemon
/// stopping; dropped counts too): a kernel still starting then is ended, not
/// handed to a session that may be closed.
async fn stopped(mut cancel: watch::Receiver<bool>) {
    let _ = cancel.wait_for(|c| *c).await;
}

/// End a kernel whose start failed: stop its sandbox and wait for its task, unless
/// the task's end is what failed the start (its handle is spent then).
async fn abandon(stop: &watch::Sender<bool>, task: JoinHandle<Result<Outcome, isolate::Error>>) {
    let _ = stop.send(true);
    if !task.is_finished() {
        let _ = task.await;
    }
}

/// Wait for the kernel's first line, which must be `ready`.
async fn ready(channel: &mut Channel<tokio::net::UnixStream>) -> Result<(), String> {
    match channel.recv::<KernelMessage>().await {
        Ok(Some(KernelMessage::Ready {})) => Ok(()),
        Ok(Some(_)) => Err("it sent something else than \"ready\" first".to_string()),
        Ok(None) => Err("it closed its channel".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Why a kernel whose sandbox ended before it was ready did not start.
fn ended_at_once(ended: Result<Result<Outcome, isolate::Error>, tokio::task::JoinError>) -> String {
    match ended {
        Ok(Ok(o)) => format!(
            "it exited at once (exit code {:?}, signal {:?}): {}",
            o.exit.code(),
            o.exit.signal(),
            o.stderr.text()
        ),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    }
}

pub struct Kernel {
    /// Cells out ([`KernelCell`]), [`KernelMessage`]s in.
    channel: Channel<tokio::net::UnixStream>,
    init_pid: i32,
    /// A pidfd on the init, for a kernel in a template's fork, whose init's pid may
    /// be reused as soon as its outer process reaped it: signals go through it.
    init_pidfd: Option<Arc<OwnedFd>>,
    cancel: watch::Sender<bool>,
    task: JoinHandle<Result<Outcome, isolate::Error>>,
    /// The kernel's sandbox's cgroup, where each cell is measured.
    cgroup: Option<isolate::cgroup::RunCgroup>,
    /// The egress proxy serving the kernel's sandbox (a policy with network), and
    /// the session as it serves it: each cell's use is counted apart.
    egress: Option<(crate::egress::Serving, Arc<crate::egress::Tenant>)>,
}

/// How sending a cell to the kernel ended.
enum Written {
    Yes,
    Failed,
    TimedOut,
    Stopped,
}

/// Everything a kernel needs to start.
pub struct StartSpec<'a> {
    pub session_id: &'a str,
    /// Where its sandbox's files come from (the workspace and package layer given).
    pub at: crate::plan::Where<'a>,
    pub uid: u32,
    pub policy: &'a Policy,
    /// What its environment gains (the session's secrets' placeholders).
    pub env: &'a std::collections::BTreeMap<String, String>,
    /// The egress proxy and the session as it serves it, for a policy with network.
    pub egress: Option<(Arc<crate::egress::Egress>, Arc<crate::egress::Tenant>)>,
}

impl Kernel {
    /// Start the session's kernel: in a fork of a pooled template of `tier` (the
    /// first cell's tier, [`crate::pool::Pool::tier`]) when the pool has one for it
    /// ([`crate::pool::kernel`]), its preload already imported; else in a sandbox of
    /// its own, where the interpreter starts cold. Returns whether it came from a
    /// template. `cancel` (the session's) ends a wait for a template.
    pub async fn start(
        sandboxes: &Arc<Sandboxes>,
        pool: &crate::pool::Pool,
        tier: &str,
        s: StartSpec<'_>,
        cancel: watch::Receiver<bool>,
    ) -> Result<(Kernel, bool), Error> {
        match Kernel::from_template(pool, tier, &s, cancel.clone()).await {
            Some(Ok(kernel)) => return Ok((kernel, true)),
            Some(Err(e @ Error::Stopped)) => return Err(e),
            // Nothing of the session's ran: a cold kernel takes over.
            Some(Err(e)) => {
                tracing::warn!(session_id = %s.session_id, error = %e, "a kernel could not start in a pooled template; starting it cold")
            }
            None => {}
        }
        if *cancel.borrow() {
            return Err(Error::Stopped);
        }
        Kernel::cold(sandboxes, s, cancel).await.map(|k| (k, false))
    }

    /// The kernel in a template's fork; `None` when the pool has none for it.
    async fn from_template(
        pool: &crate::pool::Pool,
        tier: &str,
        s: &StartSpec<'_>,
        cancel: watch::Receiver<bool>,
    ) -> Option<Result<Kernel, Error>> {
        let workspace = s.at.workspace?;
        let id = format!("kernel-{}", s.session_id);
        let job = crate::pool::Job {
            workspace,
            packages: s.at.packages,
            owner_uid: s.uid,
            code: SOURCE,
            run_id: &id,
            autosave: false,
            env: s.env,
            egress: None,
        };
        let bounds = isolate::Bounds {
            id: id.clone(),
            timeout: LIFE,
            grace: Duration::from_secs(s.policy.grace_s),
            output_limit: OUTSIDE_CELLS,
        };
        let fork = match pool.start_kernel(tier, &job, bounds, cancel.clone()).await? {
            Ok(fork) => fork,
            Err(crate::pool::Fallback(e)) => return Some(Err(Error::Start(e.to_string()))),
        };
        let crate::pool::kernel::KernelFork { mut channel, init_pid, init_pidfd, cgroup, listener, mut task, stop } =
            fork;
        // The fork's socket carries kernel.py's lines from here.
        channel.set_max(MAX_LINE);
        let egress = match (s.egress.clone(), listener) {
            (Some((proxy, tenant)), Some(listener)) => Some((proxy.serve(listener, tenant.clone()), tenant)),
            _ => None,
        };
        let ready = ready(&mut channel);
        let outcome = tokio::select! {
            r = tokio::time::timeout(READY_WITHIN, ready) => r.map_err(|_| Error::Start(format!("it was not ready within {} s", READY_WITHIN.as_secs()))).and_then(|r| r.map_err(Error::Start)),
            ended = &mut task => Err(Error::Start(ended_at_once(ended))),
            () = stopped(cancel) => Err(Error::Stopped),
        };
        Some(match outcome {
            Ok(()) => Ok(Kernel {
                channel,
                init_pid,
                init_pidfd: Some(init_pidfd),
                cancel: stop,
                task,
                cgroup: Some(cgroup),
                egress,
            }),
            Err(e) => {
                abandon(&stop, task).await;
                Err(e)
            }
        })
    }

    /// The kernel in a sandbox of its own: `python -P -c BOOTSTRAP`, kernel.py sent
    /// on its stdin.
    async fn cold(
        sandboxes: &Arc<Sandboxes>,
        s: StartSpec<'_>,
        closing: watch::Receiver<bool>,
    ) -> Result<Kernel, Error> {
        let (mut stream, theirs) = isolate::process::socket_pair().map_err(Error::Channel)?;
        // The source goes first: the socket's buffer holds it until the kernel reads.
        stream.write_all(&kernel_source(SOURCE)).await.map_err(Error::Channel)?;

        let policy = s.policy;
        // -P: the working directory (the workspace) is not put first on sys.path, so
        // a file there (`json.py`, `threading.py`) cannot replace a module kernel.py
        // imports; kernel.py adds the workspace for the user's code after its imports.
        let argv = vec![crate::plan::PYTHON.into(), "-P".into(), "-c".into(), BOOTSTRAP.into()];
        let mut spec = crate::plan::sandbox_spec(&s.at, s.uid, policy, argv, None);
        spec.env.extend(s.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let run = isolate::Run {
            id: format!("kernel-{}", s.session_id),
            spec,
            limits: crate::plan::cgroup_limits(policy),
            timeout: LIFE,
            grace: Duration::from_secs(policy.grace_s),
            output_limit: OUTSIDE_CELLS,
        };
        let (cancel, cancel_rx) = watch::channel(false);
        let (started_tx, started_rx) = oneshot::channel();
        let (cgroup_tx, mut cgroup_rx) = oneshot::channel();
        let sb = sandboxes.clone();
        let stdin = OwnedFd::from(theirs);
        let mut task = tokio::spawn(async move {
            sb.run_with_stdin(run, Some(stdin), None, cancel_rx, Some(started_tx), Some(cgroup_tx)).await
        });

        let mut channel = Channel::new(stream, MAX_LINE);
        let egress = s.egress;
        let ready = async {
            let started = started_rx.await.map_err(|_| "the sandbox did not start".to_string())?;
            // The kernel's proxy is served from its start: a cell may reach out.
            let serving = match (egress, started.listener) {
                (Some((proxy, tenant)), Some(listener)) => Some((proxy.serve(listener, tenant.clone()), tenant)),
                _ => None,
            };
            ready(&mut channel).await.map(|()| (started.init_pid, serving))
        };
        let outcome = tokio::select! {
            r = tokio::time::timeout(READY_WITHIN, ready) => r.map_err(|_| Error::Start(format!("it was not ready within {} s", READY_WITHIN.as_secs()))).and_then(|r| r.map_err(Error::Start)),
            ended = &mut task => Err(Error::Start(ended_at_once(ended))),
            () = stopped(closing) => Err(Error::Stopped),
        };
        match outcome {
            // The cgroup was sent before the sandbox started.
            Ok((init_pid, egress)) => Ok(Kernel {
                channel,
                init_pid,
                init_pidfd: None,
                cancel,
                task,
                cgroup: cgroup_rx.try_recv().ok(),
                egress,
            }),
            Err(e) => {
                abandon(&cancel, task).await;
                Err(e)
            }
        }
    }

    /// Run one cell. `stop` set to true kills the kernel (the session is closing).
    /// With `chunks`, the cell's output is streamed there as it is produced.
    pub async fn exec(
        mut self,
        cell: &CellRequest,
        timeout: Duration,
        grace: Duration,
        mut stop: watch::Receiver<bool>,
        chunks: Option<mpsc::Sender<Chunk>>,
    ) -> (Option<Kernel>, CellEnd) {
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let mut state = Cell::new(nonce.clone(), cell.output_limit);
        if let Some((_, tenant)) = &self.egress {
            tenant.begin(&cell.run_id);
        }
        // The kernel's interpreter is the cell's own task; the rest of the sandbox is not.
        let baseline = self.cgroup.as_ref().map(|cg| isolate::Baseline::take(cg, 1));
        // A slow streaming client must not hold up the cell's time limit: chunks go
        // through a queue that the output limit keeps small.
        let forward = chunks.map(|tx| {
            let (queue, mut rx) = mpsc::unbounded_channel::<Chunk>();
            tokio::spawn(async move {
                while let Some(chunk) = rx.recv().await {
                    // A client that went away must not stop the cell.
                    let _ = tx.send(chunk).await;
                }
            });
            queue
        });
        // The cell's time limit: at it, SIGINT to the sandbox (the init forwards it),
        // which interrupts the cell and keeps the kernel; after the grace, killed.
        let pidfd = self.init_pidfd.clone();
        let signal = move |pid: i32, sig| match &pidfd {
            Some(fd) => crate::isolate::process::pidfd_signal(fd, sig),
            None => crate::isolate::process::signal(pid, sig),
        };
        let mut drive = Drive::new(signal, timeout, grace, nix::sys::signal::SIGINT);
        // The cell goes out under the same limit and stop as its answer: a kernel
        // that stopped reading (user code can make it) leaves the line in a full
        // socket buffer, and the write must not outlast the cell's time limit, a
        // cancel, the session's close or the daemon's shutdown. Until the kernel has
        // its cell there is nothing to interrupt: the drive has no init to ask, and
        // its limit ends the kernel at once.
        let sent = KernelCell {
            code: &cell.code,
            run_id: &cell.run_id,
            autosave: cell.autosave,
            output_limit: cell.output_limit,
            nonce: &nonce,
            env: &cell.env,
        };
        let written = tokio::select! {
            r = self.channel.send(&sent) => if r.is_ok() { Written::Yes } else { Written::Failed },
            _ = drive.tick() => Written::TimedOut,
            _ = stop.changed() => Written::Stopped,
        };
        match written {
            Written::Yes => {}
            // Its socket is closed: the kernel is gone.
            Written::Failed => return self.died(state, Cutoff::Gone { interrupted: false }, baseline).await,
            Written::TimedOut => return self.died(state, Cutoff::TimedOut, baseline).await,
            Written::Stopped => return self.died(state, Cutoff::Stopped, baseline).await,
        }
        drive.retarget(Target { init: Some(self.init_pid), helper: None });
        loop {
            let interrupted = drive.timed_out();
            tokio::select! {
                line = self.channel.recv::<KernelMessage>() => {
                    let step = match line {
                        Ok(Some(msg)) => state.take(msg).map_err(|e| e.to_string()),
                        // The kernel is gone (it exited, was killed, or ran out of memory).
                        Ok(None) => return self.died(state, Cutoff::Gone { interrupted }, baseline).await,
                        Err(e) if !e.is_violation() => return self.died(state, Cutoff::Gone { interrupted }, baseline).await,
                        Err(e) => Err(e.to_string()),
                    };
                    match step {
                        Ok(Step::Output(chunk)) => {
                            if let Some(queue) = &forward {
                                let _ = queue.send(chunk);
                            }
                        }
                        Ok(Step::Nothing) => {}
                        Ok(Step::Reply(reply)) => {
                            let mut usage = self.usage(baseline.as_ref());
                            usage.net = self.egress.as_ref().map(|(_, tenant)| tenant.net());
                            return (Some(self), CellEnd::Done { reply, interrupted, usage });
                        }
                        Err(what) => {
                            tracing::info!(init_pid = self.init_pid, violation = %what, "a kernel broke the protocol; it is killed");
                            return self.died(state, Cutoff::Violation { what, interrupted }, baseline).await;
                        }
                    }
                }
                step = drive.tick() => match step {
                    DriveStep::Asked => {}
                    DriveStep::Killed => return self.died(state, Cutoff::TimedOut, baseline).await,
                },
                _ = stop.changed() => return self.died(state, Cutoff::Stopped, baseline).await,
            }
        }
    }

    /// The kernel is cut off in the middle of `cell`: end it (once it had its
    /// [`Cutoff::patience`]) and say how the cell ended.
    async fn died(self, cell: Cell, cut: Cutoff, baseline: Option<isolate::Baseline>) -> (Option<Kernel>, CellEnd) {
        let cgroup = self.cgroup.clone();
        let net = self.egress.as_ref().map(|(_, tenant)| tenant.net());
        let outcome = self.end(cut.patience()).await;
        // Read once the kernel's processes are gone (its slot is idle again, or
        // removed: then the figures are null).
        let mut usage = match (cgroup, baseline) {
            (Some(cg), Some(b)) => b.usage(&cg).run,
            _ => RunUsage::default(),
        };
        usage.net = net;
        let Cell { stdout, stderr, .. } = cell;
        (None, CellEnd::Died { cut, outcome: outcome.map(Box::new), stdout, stderr, usage })
    }

    /// What the cell that began at `baseline` used.
    fn usage(&self, baseline: Option<&isolate::Baseline>) -> RunUsage {
        match (&self.cgroup, baseline) {
            (Some(cg), Some(b)) => b.usage(cg).run,
            _ => RunUsage::default(),
        }
    }

    /// End the kernel and its sandbox; returns how the sandbox ended.
    pub async fn stop(self) -> Option<Outcome> {
        self.end(Duration::ZERO).await
    }

    /// End the kernel and its sandbox, once it had `patience` to end on its own;
    /// returns how the sandbox ended.
    async fn end(self, patience: Duration) -> Option<Outcome> {
        let Kernel { channel, cancel, mut task, .. } = self;
        if !patience.is_zero() {
            if let Ok(ended) = tokio::time::timeout(patience, &mut task).await {
                return ended.ok().and_then(|r| r.ok());
            }
        }
        let _ = cancel.send(true);
        drop(channel);
        task.await.ok().and_then(|r| r.ok())
    }
}

/// The live kernels of kernel-mode sessions, by session key: their one owner. A
/// run takes its session's kernel out while a cell runs and puts it back after.
#[derive(Default)]
pub struct Kernels(tokio::sync::Mutex<HashMap<String, Kernel>>);

impl Kernels {
    /// The session's kernel, taken out (None: it has none, or a cell holds it).
    pub async fn take(&self, key: &str) -> Option<Kernel> {
        self.0.lock().await.remove(key)
    }

    /// Give the session's kernel back after a cell.
    pub async fn put(&self, key: &str, kernel: Kernel) {
        self.0.lock().await.insert(key.to_string(), kernel);
    }

    /// Whether the session has a live kernel idle between cells.
    pub async fn has(&self, key: &str) -> bool {
        self.0.lock().await.contains_key(key)
    }

    /// End the session's kernel, if it has one idle.
    pub async fn stop(&self, key: &str) {
        if let Some(k) = self.take(key).await {
            k.stop().await;
        }
    }

    /// End every kernel (daemon shutdown).
    pub async fn stop_all(&self) {
        let all: Vec<Kernel> = self.0.lock().await.drain().map(|(_, k)| k).collect();
        for k in all {
            k.stop().await;
        }
    }
}

#[cfg(test)]
mod tests;
