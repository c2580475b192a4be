//! One run, from request to result: check the request against the session's
//! policy, snapshot the workspace, run the program in a fresh sandbox
//! ([`crate::isolate`]), find the artifacts and shape the result.

use crate::artifacts::{self, Snapshot};
use crate::isolate::message::{Exception, Exit, Rich};
use crate::isolate::{self, output::Chunk};
use crate::kernel;
use crate::metrics;
use crate::model::policy::Policy;
use crate::model::run::{
    Artifact, ArtifactKind, KernelException, KernelFields, KernelResult, Language, RunRequest, RunResult, RunUsage,
    Status,
};
use crate::model::session::Mode;
use crate::plan;
use crate::pool;
use crate::session::Lease;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;

mod death;
mod disk;
pub mod net;
use death::Death;
use net::Net;

/// Why a run could not be made; the API edge maps each to its HTTP answer. A
/// program that fails is not an error: it is a [`RunResult`] with its status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("code is {len} bytes; policy {policy:?} allows {max} — upload large data as a file (PUT /v1/sessions/ID/files/PATH) and read it from the code")]
    CodeTooLarge { len: usize, policy: String, max: usize },
    #[error("code contains a NUL byte: remove it")]
    NulByte,
    #[error("timeout_s is {given}; policy {policy:?} allows more than 0 and at most {max} seconds")]
    Timeout { given: f64, policy: String, max: u64 },
    /// The session was closed (or expired) while the run was starting.
    #[error(
        "session {0:?} was closed while this run started: create a new session (POST /v1/sessions) and run it there"
    )]
    Closed(String),
    /// A host failure while making or running the sandbox; `context` names the step.
    #[error("{context}: {error}")]
    Internal { context: String, error: String },
}

impl Error {
    fn internal(context: impl Into<String>, error: impl std::fmt::Display) -> Error {
        Error::Internal { context: context.into(), error: error.to_string() }
    }
}

/// What every run needs from the daemon.
#[derive(Clone)]
pub struct Context {
    pub sandboxes: std::sync::Arc<isolate::Sandboxes>,
    /// Sandboxes made ahead of one-shot Python runs.
    pub pool: std::sync::Arc<crate::pool::Pool>,
    pub rootfs: PathBuf,
    pub public_url: String,
    /// The egress proxy, for policies with network (`None` when no policy has any).
    pub egress: Option<std::sync::Arc<crate::egress::Egress>>,
    /// uv's record of the rootfs's Python, given to every install
    /// ([`crate::packages::seed`]): made by the first install that finds none,
    /// shared by the clones.
    pub uv_seed: std::sync::Arc<crate::packages::seed::Seeds>,
}

impl Context {
    /// Where a sandbox of `lease`'s session takes its files from.
    pub(crate) fn at<'a>(
        &'a self,
        workspace: Option<&'a std::path::Path>,
        packages: Option<&'a std::path::Path>,
    ) -> plan::Where<'a> {
        plan::Where {
            rootfs: &self.rootfs,
            workspace,
            packages,
            ca_bundle: self.egress.as_ref().map(|e| e.bundle_path()),
        }
    }
}

/// What decides a run's status, however it ran (a cold or pooled sandbox, a
/// kernel's cell): the daemon's timer, the cgroup, its own findings, then the
/// program's exit.
#[derive(Debug, Clone, Copy, Default)]
struct Ending {
    /// The time limit ended it.
    timed_out: bool,
    /// The OOM killer ended it (a program that exited 0 anyway is not OOM).
    oom_killed: bool,
    /// The sandbox broke the protocol (a kernel's channel): the daemon ended it.
    violation: bool,
    /// A signal or a cancel ended it.
    killed: bool,
    /// It exited 0 (and a cell raised nothing).
    succeeded: bool,
}

impl Ending {
    /// The one place a status is worked out.
    fn status(self) -> Status {
        if self.timed_out {
            Status::Timeout
        } else if self.oom_killed {
            Status::Oom
        } else if self.violation {
            Status::Error
        } else if self.killed {
            Status::Killed
        } else if self.succeeded {
            Status::Ok
        } else {
            Status::Error
        }
    }
}

/// Check what can be checked before a sandbox is made.
pub fn validate(req: &RunRequest, policy: &Policy) -> Result<Duration, Error> {
    if req.code.len() > policy.code_bytes() {
        return Err(Error::CodeTooLarge { len: req.code.len(), policy: policy.name.clone(), max: policy.code_bytes() });
    }
    if req.code.contains('\0') {
        return Err(Error::NulByte);
    }
    match req.timeout_s {
        None => Ok(Duration::from_secs(policy.timeout_s)),
        Some(t) if t > 0.0 && t <= policy.timeout_s as f64 => Ok(Duration::from_secs_f64(t)),
        Some(t) => Err(Error::Timeout { given: t, policy: policy.name.clone(), max: policy.timeout_s }),
    }
}

/// A new run's id: 32 lowercase hex digits.
pub fn new_run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Run `req` in the leased session, as run `run_id` ([`new_run_id`]).
pub async fn execute(
    ctx: &Context,
    lease: &Lease,
    req: &RunRequest,
    run_id: &str,
    chunks: Option<mpsc::Sender<Chunk>>,
) -> Result<RunResult, Error> {
    if lease.mode == Mode::Kernel && req.language == Language::Python {
        return execute_cell(ctx, lease, req, run_id, chunks).await;
    }
    let policy = &lease.policy;
    let timeout = validate(req, policy)?;
    let run_id = run_id.to_string();
    let autosave = req.autosave_figures.unwrap_or(policy.autosave_figures);
    let (argv, stdin) = match req.language {
        Language::Python => (
            vec![
                plan::PYTHON.to_string(),
                plan::RUNNER.to_string(),
                run_id.clone(),
                if autosave { "1" } else { "0" }.to_string(),
            ],
            Some(req.code.clone()),
        ),
        Language::Shell => (vec!["/bin/bash".to_string(), "-c".to_string(), req.code.clone()], None),
    };
    let layer = layer_of(lease).await?;
    let net = Net::of(ctx, lease, &run_id)?;
    let secrets_env = net.as_ref().map(|n| n.env.clone()).unwrap_or_default();
    let walk_began = std::time::Instant::now();
    let snapshot = snapshot(lease).await?;
    let snapshot_took = walk_began.elapsed();
    let mut spec =
        plan::sandbox_spec(&ctx.at(Some(&lease.workspace), layer.as_deref()), lease.uid, policy, argv, stdin);
    spec.env.extend(secrets_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let run = isolate::Run {
        id: run_id.clone(),
        spec,
        limits: plan::cgroup_limits(policy),
        timeout,
        grace: Duration::from_secs(policy.grace_s),
        output_limit: policy.output_bytes(),
    };
    tracing::info!(run_id = %run_id, session_id = %lease.id, language = ?req.language, "run started");
    tracing::debug!(run_id = %run_id, code = ?req.code, "run code");
    let take_began = std::time::Instant::now();
    // The templates that serve it: the policy's own, or its bare ones for code that
    // imports only the standard library (pool/tier.rs). Same limits either way.
    let (tier, pooled) = match req.language {
        Language::Python => {
            let tier = ctx.pool.tier(policy, &req.code);
            let taken = ctx.pool.take(&tier.name, lease.cancel.clone()).await;
            (tier, taken)
        }
        Language::Shell => (policy.clone(), None),
    };
    let pool_wait = take_began.elapsed();
    let mut mode = metrics::Mode::Cold;
    let job = pool::Job {
        workspace: &lease.workspace,
        packages: layer.as_deref(),
        owner_uid: lease.uid,
        code: &req.code,
        run_id: &run_id,
        autosave,
        env: &secrets_env,
        egress: net.as_ref().map(|n| (&n.egress, &n.tenant)),
    };
    let served = match pooled {
        Some(template) => {
            let served =
                ctx.pool.serve(template, &tier, &job, &run.bounds(), chunks.clone(), lease.cancel.clone()).await;
            match served {
                Ok(outcome) => {
                    mode = metrics::Mode::Pooled;
                    Some(outcome)
                }
                Err(pool::Fallback(e)) => {
                    // Nothing ran yet: a cold sandbox takes the run instead.
                    tracing::warn!(run_id = %run_id, error = %e, "a pooled template could not take the run; using a cold sandbox");
                    None
                }
            }
        }
        None => None,
    };
    let outcome = match served {
        Some(outcome) => outcome,
        None => net::cold(ctx, run, net.as_ref(), chunks, lease.cancel.clone()).await,
    };
    let outcome = outcome.map_err(|e| match e {
        isolate::Error::Setup { step, error } => Error::internal(format!("building the sandbox ({step})"), error),
        other => Error::internal("running the sandbox", other),
    })?;

    let walk_began = std::time::Instant::now();
    let (artifacts, artifacts_truncated) = find_artifacts(ctx, lease, snapshot, &run_id).await?;
    let artifacts_took = walk_began.elapsed();

    let status = Ending {
        timed_out: outcome.timed_out,
        oom_killed: outcome.oom_killed && outcome.exit != Exit::Exited(0),
        violation: false,
        killed: outcome.cancelled || outcome.exit.signal().is_some(),
        succeeded: outcome.exit == Exit::Exited(0),
    }
    .status();
    let mut usage = outcome.usage.clone();
    let mut stderr = outcome.stderr.text();
    Net::finish(net.as_ref(), &mut usage, &mut stderr);
    disk::note_full(&lease.workspace, policy, &mut usage, &mut stderr);
    let result = RunResult {
        run_id: run_id.clone(),
        session_id: lease.public_id.clone(),
        status,
        exit_code: outcome.exit.code(),
        signal: outcome.exit.signal().map(signal_name),
        stdout: outcome.stdout.text(),
        stderr,
        stdout_truncated: outcome.stdout.truncated,
        stderr_truncated: outcome.stderr.truncated,
        duration_ms: outcome.duration.as_millis() as u64,
        artifacts,
        artifacts_truncated,
        usage,
        kernel: None,
    };
    let phases = match mode {
        metrics::Mode::Pooled => metrics::Phases {
            queue: pool_wait,
            setup: outcome.setup,
            execution: outcome.duration,
            snapshot: snapshot_took,
            artifacts: artifacts_took,
        },
        _ => metrics::Phases {
            queue: pool_wait + outcome.queue,
            setup: outcome.setup,
            execution: outcome.duration.saturating_sub(outcome.queue + outcome.setup),
            snapshot: snapshot_took,
            artifacts: artifacts_took,
        },
    };
    let language = if req.language == Language::Shell { "shell" } else { "python" };
    metrics::global().run_ended(mode, language, result.status.as_str(), &phases);
    tracing::info!(
        run_id = %run_id,
        session_id = %lease.id,
        status = ?result.status,
        duration_ms = result.duration_ms,
        cpu_ms = outcome.usage.cpu_ms,
        memory_peak_bytes = outcome.usage.memory_peak_bytes,
        pids_peak = outcome.usage.pids_peak,
        "run finished"
    );
    Ok(result)
}

/// The files the run created or changed since `snapshot`, capped by the policy.
async fn find_artifacts(
    ctx: &Context,
    lease: &Lease,
    snapshot: Snapshot,
    run_id: &str,
) -> Result<(Vec<Artifact>, bool), Error> {
    let (dir, uid) = (lease.workspace.clone(), lease.uid);
    let changed = tokio::task::spawn_blocking(move || {
        crate::workspace::Workspace::open(&dir, uid).and_then(|ws| snapshot.changed(&ws))
    })
    .await
    .map_err(|e| Error::internal("finding artifacts", e))?
    .map_err(|e| Error::internal("finding artifacts", e))?;
    let figure_prefix = format!("figure-{}-", &run_id[..8]);
    let max = lease.policy.max_artifacts;
    let truncated = changed.len() > max;
    let list = changed
        .into_iter()
        .take(max)
        .map(|e| {
            let name = crate::names::text(e.path.as_os_str().as_bytes());
            let kind = if name.starts_with(&figure_prefix) && name.ends_with(".png") {
                ArtifactKind::Figure
            } else {
                ArtifactKind::File
            };
            Artifact {
                mime_type: artifacts::mime_type(&e.path),
                url: format!(
                    "{}/v1/sessions/{}/files/{}",
                    ctx.public_url,
                    lease.public_id,
                    crate::names::url(e.path.as_os_str().as_bytes())
                ),
                size_bytes: e.size,
                path: name,
                kind,
            }
        })
        .collect();
    Ok((list, truncated))
}

async fn snapshot(lease: &Lease) -> Result<Snapshot, Error> {
    let (dir, uid) = (lease.workspace.clone(), lease.uid);
    tokio::task::spawn_blocking(move || crate::workspace::Workspace::open(&dir, uid).and_then(|ws| Snapshot::take(&ws)))
        .await
        .map_err(|e| Error::internal("snapshotting the workspace", e))?
        .map_err(|e| Error::internal("snapshotting the workspace", e))
}

/// A Python run in a kernel session: a cell in the session's live interpreter.
async fn execute_cell(
    ctx: &Context,
    lease: &Lease,
    req: &RunRequest,
    run_id: &str,
    chunks: Option<mpsc::Sender<Chunk>>,
) -> Result<RunResult, Error> {
    let policy = &lease.policy;
    let timeout = validate(req, policy)?;
    let run_id = run_id.to_string();
    let started = std::time::Instant::now();
    let secrets = lease.secrets();
    let Some((existing, fresh)) = lease_kernel(ctx, lease, &req.code, &run_id).await? else {
        return Ok(stopped_before_its_kernel(lease, &run_id, started.elapsed()));
    };
    if fresh {
        lease.mark_kernel_started();
    }
    // Starting the kernel, when the session had none running.
    let setup = started.elapsed();
    let walk_began = std::time::Instant::now();
    let snapshot = snapshot(lease).await?;
    let snapshot_took = walk_began.elapsed();
    tracing::info!(run_id = %run_id, session_id = %lease.id, "cell started");
    tracing::debug!(run_id = %run_id, code = ?req.code, "cell code");
    let cell = kernel::CellRequest {
        code: req.code.clone(),
        run_id: run_id.clone(),
        autosave: req.autosave_figures.unwrap_or(policy.autosave_figures),
        output_limit: policy.output_bytes(),
        env: secrets.get().environment(),
    };
    let grace = Duration::from_secs(policy.grace_s.max(1));
    let (kernel, end) = existing.exec(&cell, timeout, grace, lease.cancel.clone(), chunks).await;
    // The session's kernel from before a daemon restart is gone, with its variables:
    // the first cell that ran in a new one says so.
    let lost = fresh && lease.take_kernel_lost();
    if let Some(k) = kernel {
        lease.put_kernel(k).await;
    }
    let walk_began = std::time::Instant::now();
    let (artifacts, artifacts_truncated) = find_artifacts(ctx, lease, snapshot, &run_id).await?;
    let artifacts_took = walk_began.elapsed();
    let mut result = RunResult {
        run_id: run_id.clone(),
        session_id: lease.public_id.clone(),
        status: Status::Ok,
        exit_code: None,
        signal: None,
        stdout: String::new(),
        stderr: String::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        duration_ms: started.elapsed().as_millis() as u64,
        artifacts,
        artifacts_truncated,
        usage: RunUsage::default(),
        kernel: Some(KernelFields { result: None, exception: None, kernel_restarted: false }),
    };
    match end {
        kernel::CellEnd::Done { reply, interrupted, usage } => {
            result.usage = usage;
            result.status = Ending {
                timed_out: interrupted,
                oom_killed: false,
                violation: false,
                killed: false,
                succeeded: reply.exception.is_none() && reply.exit_code == 0,
            }
            .status();
            result.exit_code = Some(reply.exit_code);
            result.stdout = reply.stdout;
            result.stderr = if lost { format!("{KERNEL_LOST}{}", reply.stderr) } else { reply.stderr };
            refusals_on_stderr(&result.usage, &mut result.stderr);
            result.stdout_truncated = reply.stdout_truncated;
            result.stderr_truncated = reply.stderr_truncated;
            result.kernel = Some(KernelFields {
                result: reply.result.map(kernel_result),
                exception: reply.exception.map(kernel_exception),
                kernel_restarted: lost,
            });
        }
        kernel::CellEnd::Died { cut, outcome, stdout, stderr, usage } => {
            result.usage = usage;
            let death = Death::of(&cut, outcome.as_deref());
            result.status = death.status;
            result.exit_code = death.exit.code();
            result.signal = death.exit.signal().map(signal_name);
            let why = death.why;
            result.stdout = stdout.text;
            result.stdout_truncated = stdout.truncated;
            result.stderr_truncated = stderr.truncated;
            let mut err = stderr.text;
            if !err.is_empty() && !err.ends_with('\n') {
                err.push('\n');
            }
            result.stderr = format!("{err}sandboxd: {why}; the kernel was restarted and its variables are gone\n");
            result.kernel = Some(KernelFields { result: None, exception: None, kernel_restarted: true });
        }
    }
    disk::note_full(&lease.workspace, &lease.policy, &mut result.usage, &mut result.stderr);
    let phases = metrics::Phases {
        queue: Duration::ZERO,
        setup,
        execution: started.elapsed().saturating_sub(setup + snapshot_took + artifacts_took),
        snapshot: snapshot_took,
        artifacts: artifacts_took,
    };
    metrics::global().run_ended(metrics::Mode::Kernel, "python", result.status.as_str(), &phases);
    tracing::info!(
        run_id = %run_id,
        session_id = %lease.id,
        status = ?result.status,
        duration_ms = result.duration_ms,
        cpu_ms = result.usage.cpu_ms,
        memory_peak_bytes = result.usage.memory_peak_bytes,
        pids_peak = result.usage.pids_peak,
        "cell finished"
    );
    Ok(result)
}

/// A cell stopped (cancelled, its session closing, the daemon stopping) while its
/// kernel started: nothing of it ran, as a running cell stopped says.
fn stopped_before_its_kernel(lease: &Lease, run_id: &str, took: Duration) -> RunResult {
    let status = Ending { killed: true, ..Ending::default() }.status();
    metrics::global().run_ended(
        metrics::Mode::Kernel,
        "python",
        status.as_str(),
        &metrics::Phases { setup: took, ..metrics::Phases::default() },
    );
    tracing::info!(run_id = %run_id, session_id = %lease.id, "cell stopped before its kernel started");
    RunResult {
        run_id: run_id.to_string(),
        session_id: lease.public_id.clone(),
        status,
        exit_code: None,
        signal: Some(signal_name(libc::SIGKILL)),
        stdout: String::new(),
        stderr: "sandboxd: the run was stopped before its kernel started; nothing of it ran\n".to_string(),
        stdout_truncated: false,
        stderr_truncated: false,
        duration_ms: took.as_millis() as u64,
        artifacts: vec![],
        artifacts_truncated: false,
        usage: RunUsage::default(),
        kernel: Some(KernelFields { result: None, exception: None, kernel_restarted: false }),
    }
}

/// The session's package layer for a run; none when the disk has no room for one
/// (the run goes on without: its code's `pip install` has nowhere to go).
async fn layer_of(lease: &Lease) -> Result<Option<PathBuf>, Error> {
    match lease.package_layer().await {
        Ok(layer) => Ok(layer),
        Err(e @ crate::session::Error::LayerNoRoom { .. }) => {
            tracing::warn!(session_id = %lease.id, error = %e, "no package layer for the run");
            Ok(None)
        }
        Err(crate::session::Error::Layer(e)) if e.kind() == std::io::ErrorKind::StorageFull => {
            tracing::warn!(session_id = %lease.id, error = %e, "no package layer for the run: the disk is full");
            Ok(None)
        }
        Err(crate::session::Error::NotFound(_)) => Err(Error::Closed(lease.public_id.clone())),
        Err(e) => Err(Error::internal("making the session's package layer", e)),
    }
}

/// A cell's refusals by the egress proxy, on its stderr (as a script run's).
fn refusals_on_stderr(usage: &RunUsage, stderr: &mut String) {
    if let Some(note) = usage.net.as_ref().and_then(crate::egress::usage::stderr_note) {
        if !stderr.is_empty() && !stderr.ends_with('\n') {
            stderr.push('\n');
        }
        stderr.push_str(&note);
    }
}

/// What the first cell after a daemon restart says on stderr, before its own output.
const KERNEL_LOST: &str =
    "sandboxd: the daemon restarted since this session's last cell: this kernel is new, and earlier variables are gone\n";

/// The session's kernel, started now if it has none (or its last one died), and
/// whether it was started now; `None` when the run was stopped while it started.
/// A new kernel starts in a fork of a pooled template of the tier `code` (the cell
/// it starts for) would run in as a script run ([`crate::pool::kernel`]), or cold
/// when the pool has none.
async fn lease_kernel(
    ctx: &Context,
    lease: &Lease,
    code: &str,
    run_id: &str,
) -> Result<Option<(kernel::Kernel, bool)>, Error> {
    if let Some(k) = lease.take_kernel().await {
        return Ok(Some((k, false)));
    }
    // Made before the kernel starts: packages installed later are seen in it.
    let layer = layer_of(lease).await?;
    let net = Net::of(ctx, lease, run_id)?;
    let env = net.as_ref().map(|n| n.env.clone()).unwrap_or_default();
    let tier = ctx.pool.tier(&lease.policy, code);
    let started = kernel::Kernel::start(
        &ctx.sandboxes,
        &ctx.pool,
        &tier.name,
        kernel::StartSpec {
            session_id: &lease.id,
            at: ctx.at(Some(&lease.workspace), layer.as_deref()),
            uid: lease.uid,
            policy: &lease.policy,
            env: &env,
            egress: net.map(|n| (n.egress, n.tenant)),
        },
        lease.cancel.clone(),
    )
    .await;
    match started {
        Ok((kernel, pooled)) => {
            tracing::info!(session_id = %lease.id, pooled, tier = %tier.name, "kernel started");
            Ok(Some((kernel, true)))
        }
        Err(kernel::Error::Stopped) => Ok(None),
        Err(e) => Err(Error::internal("starting the session's kernel", e)),
    }
}

/// A cell's final value as results show it: its text by mime type.
fn kernel_result(value: Rich) -> KernelResult {
    let mut texts = std::collections::BTreeMap::new();
    texts.insert(KernelResult::PLAIN.to_string(), value.plain);
    if let Some(html) = value.html {
        texts.insert(KernelResult::HTML.to_string(), html);
    }
    KernelResult(texts)
}

/// The exception a cell raised, as results show it.
fn kernel_exception(e: Exception) -> KernelException {
    KernelException { name: e.name, traceback: e.traceback, value: e.value }
}

pub fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig).map(|s| s.as_str().to_string()).unwrap_or_else(|_| format!("SIG{sig}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_comes_from_the_timer_then_the_cgroup_then_the_program() {
        let e = Ending::default();
        assert_eq!(Ending { succeeded: true, ..e }.status(), Status::Ok);
        assert_eq!(e.status(), Status::Error);
        assert_eq!(Ending { killed: true, ..e }.status(), Status::Killed);
        assert_eq!(Ending { killed: true, violation: true, ..e }.status(), Status::Error);
        assert_eq!(Ending { killed: true, violation: true, oom_killed: true, ..e }.status(), Status::Oom);
        assert_eq!(Ending { oom_killed: true, timed_out: true, killed: true, ..e }.status(), Status::Timeout);
    }

    /// A cell's value and exception are written as the kernel's reply was, field
    /// for field and in the same order.
    #[test]
    fn a_cells_reply_is_written_as_the_kernel_sent_it() {
        let values = [
            Rich { plain: "1".into(), html: None },
            Rich { plain: "<b> \"x\"".into(), html: Some("<b>x</b>\n".into()) },
        ];
        for value in values {
            let typed = serde_json::to_string(&kernel_result(value.clone())).unwrap();
            assert_eq!(typed, serde_json::to_value(&value).unwrap().to_string());
            let back: KernelResult = serde_json::from_str(&typed).unwrap();
            assert_eq!(back.plain(), Some(value.plain.as_str()));
        }
        let e = Exception { name: "ValueError".into(), value: "bad \u{1}".into(), traceback: "Traceback\n".into() };
        let typed = serde_json::to_string(&kernel_exception(e.clone())).unwrap();
        assert_eq!(typed, serde_json::to_value(&e).unwrap().to_string());
        assert_eq!(typed, r#"{"name":"ValueError","traceback":"Traceback\n","value":"bad \u0001"}"#);
    }
}
