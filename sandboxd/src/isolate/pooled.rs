//! The daemon's handle on a pooled template ([`PooledTemplate`]): a sandbox whose
//! interpreter has imported the policy's preload modules and forks once per run,
//! each fork entering a sandbox of its own (inside: [`super::fork`]). Starting
//! one, forking it ahead of a run, attaching a workspace, supervising the run
//! ([`super::supervise`]) and recycling it all live here; the pool of them is
//! [`crate::pool`]. The messages are in [`super::message`].

use super::cgroup;
use super::channel::{self, Channel};
use super::message::{
    Attach, Event, ForkFds, ForkMessage, ForkReply, ForkRequest, HelperRequest, Report, RunCode, TemplateMessage,
};
use super::output::Chunk;
use super::process::{self, children, kill_all, pidfd_kill, pidfd_open, pipe, socket_pair};
use super::sandboxes::Sandboxes;
use super::slot;
use super::spec::{ChildSpec, SandboxSpec};
use super::supervise::{drive, launch, report_ended, run_ended, Baseline, Bounds, Done, Error, Launched, Outcome};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// Longest line read from a template's socket or a run's report channel.
const TEMPLATE_LINE: usize = 64 * 1024;
/// Longest line read from a pooled run's socket (its messages are a few bytes).
const RUN_LINE: usize = 4 * 1024;

/// A pooled sandbox whose interpreter has imported the policy's preload modules and
/// forks once per run; each fork enters a sandbox of its own ([`super::fork`]).
pub struct PooledTemplate {
    sandboxes: Arc<Sandboxes>,
    slot: slot::Slot,
    sandbox: Launched,
    /// The daemon's end of the template's stdin socket ([`TemplateMessage`]s in,
    /// [`ForkRequest`]s out).
    program: Channel<tokio::net::UnixStream>,
    /// Host pid of the template's interpreter, once looked up.
    python_pid: Option<i32>,
    /// The fork made ahead of the next run ([`PooledTemplate::prepare`]).
    prepared: Option<Forked>,
    /// Runs served so far (the pool retires a template after its policy's
    /// `template_runs`).
    served: u64,
    /// A run counted more than [`super::PIDS_KEEP`] tasks: the template is replaced, as
    /// the cgroup's task peak cannot be reset for the next run.
    pids_spent: bool,
    /// The host uid it runs as (its gid too), its alone while it lives.
    uid: crate::uids::Lease,
}

/// A template's fork, in its own namespaces, waiting for its code: its socket has
/// said [`ForkMessage::Entered`] and is quiet. No user code has run.
pub struct Forked {
    /// The daemon's end of the run's socket, shared by the runner and (once it has
    /// its code) the user's code.
    program: Channel<tokio::net::UnixStream>,
    /// The run's report channel, held by its outer process alone ([`Report`]).
    report: Channel<tokio::net::unix::pipe::Receiver>,
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
    /// The egress proxy's listener in the fork's network namespace (a policy with
    /// network), until the run that takes the fork serves it.
    listener: Option<OwnedFd>,
}

/// A template's fork as [`drive`] supervises it: its output pipes and its init, no
/// helper of its own (the template's helper serves it).
fn forks_run(stdout: OwnedFd, stderr: OwnedFd, init_pid: i32) -> Launched {
    Launched {
        control: None,
        stdout: Some(stdout),
        stderr: Some(stderr),
        helper_pid: None,
        init_pid: Some(init_pid),
        warnings: vec![],
        listener: None,
    }
}

fn fork_failed(error: &str) -> Error {
    Error::Setup { step: "fork".into(), error: error.into() }
}

/// Wait for the fork's next message, which must be `want` ([`ForkMessage`]s come in
/// order). A fork that ended first says why in its report (written by the time its
/// socket closes).
async fn fork_says(
    program: &mut Channel<tokio::net::UnixStream>,
    report: &mut Channel<tokio::net::unix::pipe::Receiver>,
    want: ForkMessage,
) -> Result<(), Error> {
    let why = |ended: Result<Option<Report>, channel::Error>| match ended {
        Ok(Some(Report::Failed { step, error })) => Error::Setup { step, error },
        _ => fork_failed("the template's fork ended"),
    };
    tokio::select! {
        said = program.recv::<ForkMessage>() => match said {
            Ok(Some(m)) if m == want => Ok(()),
            Ok(None) => {
                let ended = tokio::time::timeout(Duration::from_secs(1), report.recv::<Report>()).await;
                Err(ended.map(why).unwrap_or_else(|_| fork_failed("the template's fork ended")))
            }
            Ok(Some(_)) | Err(_) => Err(fork_failed("the template's fork broke the protocol")),
        },
        ended = report.recv::<Report>() => Err(why(ended)),
    }
}

/// A fork requested, not yet known to be in its namespaces.
struct PendingFork {
    program: Channel<tokio::net::UnixStream>,
    report: Channel<tokio::net::unix::pipe::Receiver>,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

/// A template's fork that was sent its code. From here on its socket is the user's
/// too: it may carry the run's [`super::message::RunClaim`] and nothing else, and a
/// failure is never accepted (the run cannot turn into a sandbox that failed to
/// build).
pub struct Running(Forked);

/// A template's fork that became a kernel session's kernel ([`RunCode::kernel`]),
/// its socket taken for the kernel's channel: what the template supervises.
pub struct KernelFork {
    report: Channel<tokio::net::unix::pipe::Receiver>,
    stdout: OwnedFd,
    stderr: OwnedFd,
    init_pid: i32,
    /// Shared with the kernel, which interrupts its cells through it.
    init_pidfd: Arc<OwnedFd>,
}

impl Running {
    /// The fork was sent kernel.py: its socket is the kernel's channel from now on
    /// (kernel.py's protocol, not a run's claim), and the rest is supervised by
    /// [`PooledTemplate::host_kernel`]. Also the init's host pid and a pidfd on it.
    pub fn into_kernel(self) -> (Channel<tokio::net::UnixStream>, KernelFork, i32, Arc<OwnedFd>) {
        let Forked { program, report, stdout, stderr, init_pid, init_pidfd, .. } = self.0;
        let init_pidfd = Arc::new(init_pidfd);
        let fork = KernelFork { report, stdout, stderr, init_pid, init_pidfd: init_pidfd.clone() };
        (program, fork, init_pid, init_pidfd)
    }
}

impl Forked {
    /// Send the run its code: the fork becomes [`Running`].
    pub async fn send_code(mut self, code: &RunCode<'_>) -> Result<Running, Error> {
        self.program.send(code).await?;
        Ok(Running(self))
    }

    /// The egress listener in the fork's network namespace, for the run's proxy.
    pub fn take_listener(&mut self) -> Option<OwnedFd> {
        self.listener.take()
    }

    /// Still waiting for its code: nothing said, nothing closed.
    fn quiet(&self) -> bool {
        self.program.quiet() && self.report.quiet()
    }
}

impl PooledTemplate {
    /// Start a pooled sandbox in a slot of `sandboxes`: built without a workspace,
    /// its program (a template interpreter) started with a socket as stdin, at the
    /// least CPU weight while it imports unless runs wait for it (`urgent`).
    /// `spec.workspace` must be `None` and `spec.template` true; `uid` is the lease
    /// on `spec.host_uid`.
    pub async fn start(
        sandboxes: &Arc<Sandboxes>,
        spec: &SandboxSpec,
        limits: &cgroup::Limits,
        uid: crate::uids::Lease,
        urgent: bool,
    ) -> Result<PooledTemplate, Error> {
        let slot = sandboxes.take().await?;
        let launched = async {
            slot.cg.set_limits(limits)?;
            slot.cg.set_idle(!urgent)?;
            let (program, theirs) = socket_pair().map_err(Error::Control)?;
            let mut sandbox = launch(&slot, spec, Some(&OwnedFd::from(theirs))).await?;
            let waited = tokio::time::timeout(Duration::from_secs(60), sandbox.wait_started()).await;
            waited.map_err(|_| Error::Setup { step: "start".into(), error: "no init within 60 s".into() })??;
            // The template's own output goes nowhere: each run has its own pipes.
            sandbox.stdout = None;
            sandbox.stderr = None;
            Ok::<_, Error>((sandbox, program))
        };
        match launched.await {
            Ok((sandbox, program)) => Ok(PooledTemplate {
                sandboxes: sandboxes.clone(),
                slot,
                sandbox,
                program: Channel::new(program, TEMPLATE_LINE),
                python_pid: None,
                prepared: None,
                served: 0,
                pids_spent: false,
                uid,
            }),
            Err(e) => {
                sandboxes.release(slot).await;
                Err(e)
            }
        }
    }

    /// Memory the sandbox holds now.
    pub fn memory_bytes(&self) -> Option<u64> {
        self.slot.cg.memory_current()
    }

    /// CPU time the sandbox used so far: read once its imports are done, what a
    /// cold sandbox of the policy spends again before it runs any code.
    pub fn start_cpu(&self) -> Option<Duration> {
        self.slot.cg.cpu_usage_ns().map(Duration::from_nanos)
    }

    /// Host pid of the template's interpreter: the init's only child.
    fn python_pid(&mut self) -> Result<i32, Error> {
        if let Some(pid) = self.python_pid {
            return Ok(pid);
        }
        let init = self.sandbox.init_pid.ok_or(Error::NoInit)?;
        let pid = children(init).first().copied().ok_or(Error::NoInterpreter)?;
        self.python_pid = Some(pid);
        Ok(pid)
    }

    /// Fork ahead of the next run: see [`PooledTemplate::fork`]. Taken by
    /// [`PooledTemplate::take_prepared`].
    pub async fn prepare(&mut self, spec: &ChildSpec, library: &std::fs::File) -> Result<(), Error> {
        // Its imports done, the template and its forks have full CPU weight from now
        // on: a fork ahead is milliseconds of CPU, and at the least weight it starved
        // behind cold sandboxes under load until its template was given up (5 s to
        // reap the last fork, 10 s to enter the next).
        self.slot.cg.set_idle(false)?;
        let forked = self.fork(spec, library).await?;
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
        self.program.quiet()
    }

    /// The template's next message (`None`: its socket closed).
    pub async fn next_message(&mut self) -> Result<Option<TemplateMessage>, channel::Error> {
        self.program.recv::<TemplateMessage>().await
    }

    /// Have the template fork for one run, sending it `spec` with the library, the
    /// run's output pipes and its socket, and wait until the fork is in its own
    /// namespaces.
    async fn fork(&mut self, spec: &ChildSpec, library: &std::fs::File) -> Result<Forked, Error> {
        let pending = self.request_fork(spec, library).await?;
        self.await_fork(pending).await
    }

    /// Send the fork request; the template forks at once.
    async fn request_fork(&mut self, spec: &ChildSpec, library: &std::fs::File) -> Result<PendingFork, Error> {
        // Its forks run as its own host ids (plan::template_spec: gid = uid).
        let (out_r, out_w) = process::output_pipe(self.uid.uid, self.uid.uid).map_err(Error::Control)?;
        let (err_r, err_w) = process::output_pipe(self.uid.uid, self.uid.uid).map_err(Error::Control)?;
        let (report_r, report_w) = pipe().map_err(Error::Control)?;
        let (program, theirs) = socket_pair().map_err(Error::Control)?;
        let fds = ForkFds {
            library: library.as_fd(),
            stdout: out_w.as_fd(),
            stderr: err_w.as_fd(),
            socket: theirs.as_fd(),
            report: report_w.as_fd(),
        };
        self.program.send_with_fds(&ForkRequest { spec: spec.clone() }, &fds.to_vec()).await?;
        let report = tokio::net::unix::pipe::Receiver::from_owned_fd(report_r).map_err(Error::Control)?;
        Ok(PendingFork {
            program: Channel::new(program, RUN_LINE),
            report: Channel::new(report, TEMPLATE_LINE),
            stdout: out_r,
            stderr: err_r,
        })
    }

    /// Wait until the fork says it is in its own namespaces; have its own
    /// filesystems mounted when it asks; find its host pids.
    async fn await_fork(&mut self, pending: PendingFork) -> Result<Forked, Error> {
        let PendingFork { mut program, mut report, stdout, stderr } = pending;
        let entered = async {
            // Before Landlock, the run's process asks for its own /tmp, /dev/shm and
            // /proc masks: the helper (host root) mounts them, and it is told so.
            fork_says(&mut program, &mut report, ForkMessage::Furnish(true)).await?;
            let python = self.python_pid()?;
            // The template's only fork still running: the others were reaped, or are
            // being torn down (their outer process has no child left).
            let outer_pid = children(python)
                .into_iter()
                .find(|p| !children(*p).is_empty())
                .ok_or_else(|| fork_failed("the fork is not there"))?;
            let init_pid = children(outer_pid).first().copied().ok_or_else(|| fork_failed("the fork has no init"))?;
            let init_pidfd = pidfd_open(init_pid).map_err(Error::Control)?;
            // The run's process is waiting (for its filesystems, then its code), so its
            // init (which waits for it) is still the process behind `init_pid`.
            let program_pid =
                children(init_pid).first().copied().ok_or_else(|| fork_failed("the fork's init has no run process"))?;
            self.ask_helper(&HelperRequest::Furnish { pid: outer_pid }, "furnished").await?;
            let listener = self.sandbox.listener.take();
            program.send(&ForkReply::Furnished(true)).await?;
            fork_says(&mut program, &mut report, ForkMessage::Entered(true)).await?;
            Ok::<_, Error>((outer_pid, init_pid, program_pid, init_pidfd, listener))
        };
        let (outer_pid, init_pid, program_pid, init_pidfd, listener) =
            match tokio::time::timeout(Duration::from_secs(10), entered).await {
                Ok(found) => found?,
                Err(_) => return Err(fork_failed("no fork within 10 s")),
            };
        Ok(Forked { program, report, stdout, stderr, outer_pid, init_pid, program_pid, init_pidfd, listener })
    }

    /// Mount the session's workspace (owned by `owner` on the host) at `/mnt/data`
    /// in the fork's mount namespace, and its package layer, if it has one, at
    /// `/opt/packages`.
    pub async fn attach(
        &mut self,
        forked: &Forked,
        workspace: &std::path::Path,
        packages: Option<&std::path::Path>,
        owner: u32,
    ) -> Result<(), Error> {
        let req = Attach {
            pid: Some(forked.outer_pid),
            workspace: workspace.into(),
            packages: packages.map(Into::into),
            owner_uid: owner,
            owner_gid: owner,
        };
        self.ask_helper(&HelperRequest::Attach(req), "attached").await
    }

    /// Send the sandbox's helper `req` and wait for its answer, the event named
    /// `done` (an fd it carries is the sandbox's `listener` then).
    async fn ask_helper(&mut self, req: &HelperRequest, done: &str) -> Result<(), Error> {
        let control = self.sandbox.control.as_mut().ok_or(Error::NoHelper)?;
        control.send(req).await?;
        loop {
            match self.sandbox.next_event().await? {
                Event::SetupFailed { step, error } => return Err(Error::Setup { step, error }),
                e if e.name() == done => return Ok(()),
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
        baseline: &Baseline,
    ) -> Result<Outcome, Error> {
        self.served += 1;
        let Forked { mut program, mut report, stdout, stderr, init_pid, init_pidfd, .. } = running.0;
        let mut run = forks_run(stdout, stderr, init_pid);
        let started = Instant::now();
        let ended: Done<'_> = Box::pin(async { Some(run_ended(&mut program, &mut report, &bounds.id).await) });
        // A pooled run's only target is its init, signalled through its pidfd: the
        // fork's outer process reaps the init as soon as it reported, and a signal
        // by pid could then reach whatever process got that pid since.
        let kill = |_init: i32, sig| process::pidfd_signal(&init_pidfd, sig);
        let result = drive(&mut run, bounds, chunks, &mut cancel, started, None, Some(ended), kill).await;
        pidfd_kill(&init_pidfd);
        // The run's process may wait for its socket to close: only now.
        drop((program, report));
        let usage = baseline.usage(&self.slot.cg);
        if usage.pids_spent {
            // The task peak cannot be reset: the next run here would count this one's.
            self.pids_spent = true;
        }
        Ok(result?.complete(usage))
    }

    /// Supervise a kernel's fork (taken out of the pool for good: this template
    /// serves nothing else) until its kernel ends, `bounds` runs out or `cancel`
    /// (the kernel is stopped); then destroy the template. Its output outside cells
    /// (kernel.py captures a cell's own) is kept within `bounds`, for a kernel that
    /// ends at once.
    pub async fn host_kernel(
        self,
        fork: KernelFork,
        bounds: &Bounds,
        mut cancel: watch::Receiver<bool>,
    ) -> Result<Outcome, Error> {
        let KernelFork { mut report, stdout, stderr, init_pid, init_pidfd } = fork;
        let baseline = Baseline::take(&self.slot.cg, 1);
        let mut run = forks_run(stdout, stderr, init_pid);
        let ended: Done<'_> = Box::pin(async { Some(report_ended(&mut report, &bounds.id).await) });
        // Through the pidfd, as a pooled run's: its outer process reaps the init.
        let kill = |_init: i32, sig| process::pidfd_signal(&init_pidfd, sig);
        let result = drive(&mut run, bounds, None, &mut cancel, Instant::now(), None, Some(ended), kill).await;
        pidfd_kill(&init_pidfd);
        let usage = baseline.usage(&self.slot.cg);
        self.destroy().await;
        Ok(result?.complete(usage))
    }

    /// The template's cgroup (a kernel's cells are measured there).
    pub fn cgroup(&self) -> cgroup::RunCgroup {
        self.slot.cg.clone()
    }

    /// After a run: fork ahead of the next one (`spec`), while the template reaps
    /// this run's fork. Once it has, and nothing but the new fork is left in
    /// the cgroup, it may serve another run. Otherwise (an OOM kill in the cgroup,
    /// which may have hit the template; a template that does not answer or cannot
    /// fork) it is destroyed.
    pub async fn recycle(
        mut self,
        oom_before: u64,
        spec: &ChildSpec,
        library: &std::fs::File,
    ) -> Result<PooledTemplate, Error> {
        let pending = self.request_fork(spec, library).await;
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
                Err(other.err().unwrap_or(Error::SlotGone))
            }
        }
    }

    /// Runs this template has served.
    pub fn served(&self) -> u64 {
        self.served
    }

    /// Whether a run raised the cgroup's task peak past [`super::PIDS_KEEP`] (the
    /// template is then replaced rather than recycled).
    pub fn pids_spent(&self) -> bool {
        self.pids_spent
    }

    /// The cgroup's counters as a run begins (before its workspace is attached):
    /// the prepared fork's three processes are the run's.
    pub fn baseline(&self) -> Baseline {
        Baseline::take(&self.slot.cg, 3)
    }

    /// OOM kills so far in the template's cgroup.
    pub fn oom_kills(&self) -> u64 {
        self.slot.cg.oom_kills()
    }

    /// End the sandbox and give its slot back.
    pub async fn destroy(self) {
        kill_all(self.sandbox.init_pid, self.sandbox.helper_pid);
        let PooledTemplate { sandboxes, slot, .. } = self;
        sandboxes.release(slot).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A fork's two channels as the daemon holds them, and their other ends: the
    /// run's socket and the report pipe's write end.
    fn fork_channels() -> (
        Channel<tokio::net::UnixStream>,
        Channel<tokio::net::unix::pipe::Receiver>,
        std::os::unix::net::UnixStream,
        std::fs::File,
    ) {
        let (ours, theirs) = socket_pair().unwrap();
        let (r, w) = pipe().unwrap();
        let report = tokio::net::unix::pipe::Receiver::from_owned_fd(r).unwrap();
        (Channel::new(ours, RUN_LINE), Channel::new(report, TEMPLATE_LINE), theirs, std::fs::File::from(w))
    }

    async fn says(lines: &[&[u8]], report: Option<&Report>, close: bool) -> Result<(), Error> {
        let (mut program, mut reports, mut socket, mut pipe) = fork_channels();
        for l in lines {
            socket.write_all(l).unwrap();
        }
        if let Some(r) = report {
            channel::write_line(&mut pipe, r).unwrap();
        }
        if close {
            drop((socket, pipe));
            return fork_says(&mut program, &mut reports, ForkMessage::Furnish(true)).await;
        }
        let said = fork_says(&mut program, &mut reports, ForkMessage::Furnish(true)).await;
        drop((socket, pipe));
        said
    }

    #[tokio::test]
    async fn a_fork_says_each_message_in_turn_or_why_it_ended() {
        assert!(says(&[b"{\"furnish\":true}\n"], None, false).await.is_ok());
        // Out of turn, or not a fork's message at all.
        for bad in [&b"{\"entered\":true}\n"[..], b"{\"furnish\":false}\n", b"{\"exit_code\":0}\n", b"nope\n"] {
            let e = says(&[bad], None, false).await.unwrap_err();
            assert_eq!(e.to_string(), "setting up the sandbox failed at fork: the template's fork broke the protocol");
        }
        // It ended: its report says why, when it says.
        let failed = Report::Failed { step: "landlock".into(), error: "EPERM".into() };
        let e = says(&[], Some(&failed), true).await.unwrap_err();
        assert_eq!(e.to_string(), "setting up the sandbox failed at landlock: EPERM");
        let e = says(&[], None, true).await.unwrap_err();
        assert_eq!(e.to_string(), "setting up the sandbox failed at fork: the template's fork ended");
        // A report of an end before the run had code is no failure of a step.
        let e = says(&[], Some(&Report::Ended(super::super::message::Exit::KILLED)), false).await.unwrap_err();
        assert_eq!(e.to_string(), "setting up the sandbox failed at fork: the template's fork ended");
    }

    #[tokio::test]
    async fn a_run_ends_with_its_claim_or_its_outer_process_report() {
        use super::super::message::Exit;
        async fn ended(claim: &[u8], report: Option<&Report>) -> Exit {
            let (mut program, mut reports, mut socket, mut pipe) = fork_channels();
            socket.write_all(claim).unwrap();
            if let Some(r) = report {
                channel::write_line(&mut pipe, r).unwrap();
            }
            drop(pipe);
            run_ended(&mut program, &mut reports, "r").await
        }
        // The run's claim of its exit code, when it comes first (its outer process
        // still waits).
        let (mut program, mut reports, mut socket, _pipe) = fork_channels();
        socket.write_all(b"{\"exit_code\":3}\n").unwrap();
        assert_eq!(run_ended(&mut program, &mut reports, "r").await, Exit::Exited(3));
        // Anything else on its socket is no claim: the report says.
        let segv = Report::Ended(Exit::Signaled(libc::SIGSEGV));
        assert_eq!(ended(b"{\"signal\":9}\n", Some(&segv)).await, Exit::Signaled(libc::SIGSEGV));
        assert_eq!(ended(b"{\"exit_code\":-1}\n", Some(&segv)).await, Exit::Signaled(libc::SIGSEGV));
        assert_eq!(ended(b"", Some(&Report::Ended(Exit::Exited(0)))).await, Exit::Exited(0));
        // A failure once the run has its code, or no report at all: killed.
        let failed = Report::Failed { step: "x".into(), error: "y".into() };
        assert_eq!(ended(b"", Some(&failed)).await, Exit::KILLED);
        assert_eq!(ended(b"", None).await, Exit::KILLED);
    }
}
