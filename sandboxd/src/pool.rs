//! The pool: template interpreters made ahead of one-shot Python runs, the
//! policy's preload modules imported ([`isolate::PooledTemplate`]).
//!
//! A run takes an idle template, which forks; the fork enters a sandbox of its own
//! (fresh namespaces, `/tmp`, `/proc`, privileges dropped, seccomp, Landlock —
//! [`isolate::fork`]), the session's workspace is attached to it, the code is
//! sent, and when the run ends everything of the fork is killed. The template never
//! runs user code: it only forks, one run at a time, and goes back to the pool.
//! One background task makes templates, one at a time, at the least CPU weight, so
//! under load runs fall back to cold sandboxes rather than wait.
//!
//! The protocol with `runner.py --template` is JSON lines, each read bounded and
//! parsed strictly into the types of [`isolate::message`] (a fork's own side is
//! [`isolate::fork`]). On the template's stdin socket: it says
//! `{"ready": {"failed": [modules]}}`; the daemon sends `{"spec"}`
//! with five fds (the library, the run's stdout and stderr, the run's socket, the
//! run's report channel); the template answers `{"reaped": pid}` when that fork is
//! gone.
//!
//! A run's socket is shared by the runner and, once the code is sent, by the user's
//! code, so what it says is a state machine the daemon enforces
//! ([`isolate::Forked`], [`isolate::Running`]): before the code is sent, only
//! `{"entered": true}` (the runner, in its own sandbox, before any user code); the
//! daemon then sends `{"code", "run_id", "autosave"}`; after that, only
//! `{"exit_code": N}` with N in 0..=255, which the runner sends after closing its
//! output and then waits until the daemon hangs up or kills the run. A failure is
//! never accepted once the code is sent: a run cannot turn into a sandbox that
//! failed to build.
//!
//! How the run ended is the report of the fork's outer process, on the report
//! channel that no process of the run holds (`{"ended": {"exited": N}}`,
//! `{"ended": {"signaled": N}}` or, before the code, `{"failed"}`). The run's claim of its exit code is taken when it comes
//! first: it can only say what the run could have chosen anyway by exiting with
//! that code at that moment. It keeps the program's exit (unmapping its copy of the
//! template) and the fork's teardown off the critical path: measured on 2 busy cores,
//! a pooled `print(1)` took 7.6 ms p50 with the claim against 37.6 ms with the
//! report alone (and 7.8 ms before the report channel existed). Signals, failures, timeouts and OOM kills
//! come only from the report, the daemon's timer and the cgroup. Anything else on
//! the run's socket is a protocol violation: the daemon logs a short escaped
//! excerpt at info, hangs up (the runner then exits) and takes the report.

use crate::isolate::message::{RunCode, TemplateMessage};
use crate::isolate::{self, PooledTemplate, Sandboxes};
use crate::model::health::PoolStats;
use crate::model::policy::Policy;
use crate::plan;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch, Notify};
use tokio_util::sync::CancellationToken;

/// How long a pooled interpreter may take to import its preload modules (at the
/// least CPU weight, behind every run).
const READY_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a run waits, at most, for a busy template that should be back soon
/// (see [`Pool::take`]) before it takes a cold sandbox.
const WAIT_FOR_TEMPLATE: Duration = Duration::from_millis(100);
/// A run this young in a template counts as "back soon": most runs are short.
const SHORT_RUN: Duration = Duration::from_millis(50);

/// Why a template could not be made ready. The last one per policy is shown by
/// `GET /v1/health` ([`Pool::start_errors`]) until a template of it starts.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Its sandbox could not be made.
    #[error(transparent)]
    Start(isolate::Error),
    #[error("its imports took longer than {} s", .0.as_secs())]
    ImportsTimedOut(Duration),
    /// It said something that is not a template's message.
    #[error("it broke the protocol: {0}")]
    Protocol(isolate::channel::Error),
    /// Its socket ended (or it said something else) before it said it was ready.
    #[error("the interpreter ended before it was ready")]
    EndedBeforeReady,
    /// The daemon has no `libsandboxd.so` to hand its forks.
    #[error("no pool library")]
    NoLibrary,
    /// It could not fork ahead of its first run.
    #[error("its first fork failed: {0}")]
    FirstFork(isolate::Error),
}

#[derive(Default)]
struct State {
    ready: HashMap<String, VecDeque<PooledTemplate>>,
    /// Templates serving a run, from take to give-back.
    busy: HashMap<String, usize>,
    /// Of those, when each run still running started.
    running: HashMap<String, Vec<tokio::time::Instant>>,
    /// Of those, the ones whose run is over: back within milliseconds.
    recycling: HashMap<String, usize>,
    /// Policies the pool keeps sandboxes for, in the order they were first wanted.
    wanted: Vec<String>,
    hits: u64,
    misses: u64,
    failures: u64,
    /// Per policy, why its last template failed to start (cleared by one that starts).
    start_errors: BTreeMap<String, String>,
    /// Where the next template's uid is looked for ([`crate::uids::Leases::take`]).
    next_uid: u32,
    stopped: bool,
    /// Templates given back after the pool stopped: [`Pool::shutdown`] destroys them.
    retiring: Vec<PooledTemplate>,
}

impl State {
    /// The run that started at `at` in one of `policy`'s templates is over.
    fn stop_running(&mut self, policy: &str, at: tokio::time::Instant) {
        if let Some(runs) = self.running.get_mut(policy) {
            if let Some(i) = runs.iter().position(|t| *t == at) {
                runs.swap_remove(i);
            }
        }
    }

    /// A template of `policy` is taken for a run that starts `now`.
    fn taken(&mut self, policy: &str, now: tokio::time::Instant) {
        self.hits += 1;
        *self.busy.entry(policy.into()).or_default() += 1;
        self.running.entry(policy.into()).or_default().push(now);
    }

    /// Should one of `policy`'s templates be back soon: its run is over (it is
    /// being recycled), or started less than [`SHORT_RUN`] before `now`.
    fn back_soon(&self, policy: &str, now: tokio::time::Instant) -> bool {
        self.recycling.get(policy).is_some_and(|n| *n > 0)
            || self.running.get(policy).is_some_and(|r| r.iter().any(|t| now.duration_since(*t) < SHORT_RUN))
    }

    /// A template of `policy` is back from its run (`recycled`: after the run
    /// began; then it was counted as recycling).
    fn returned(&mut self, policy: &str, recycled: bool) {
        let decrement = |counts: &mut HashMap<String, usize>| {
            if let Some(n) = counts.get_mut(policy) {
                *n = n.saturating_sub(1);
            }
        };
        decrement(&mut self.busy);
        if recycled {
            decrement(&mut self.recycling);
        }
    }
}

pub struct Pool {
    sandboxes: Arc<Sandboxes>,
    /// `libsandboxd.so`, handed to each template's fork ([`isolate::fork`]).
    library: Option<std::fs::File>,
    rootfs: PathBuf,
    /// The egress proxy's CA bundle, bound into templates of policies with network
    /// (their forks inherit it).
    ca_bundle: Option<PathBuf>,
    policies: BTreeMap<String, Arc<Policy>>,
    size: usize,
    /// Templates (and their forks) run as a uid of this range, not a session's
    /// (the workspace is attached through an idmapped mount), each its own while it
    /// lives ([`crate::uids::Lease`]).
    uids: std::ops::Range<u32>,
    leases: crate::uids::Leases,
    state: Mutex<State>,
    /// Wakes the refill task.
    wake: Notify,
    /// Wakes runs waiting for a busy template to come back.
    returned: Notify,
    /// Cancelled at shutdown: a sandbox still importing is destroyed at once.
    stop: CancellationToken,
    refiller: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Pool {
    /// A pool of `size` templates per policy in use; it keeps the default policy's
    /// from the start. `uids` is the pool's range, above every session's
    /// ([`crate::uids::Ranges`]). Without `library` there is no pool.
    pub fn new(
        sandboxes: Arc<Sandboxes>,
        library: Option<std::fs::File>,
        rootfs: PathBuf,
        ca_bundle: Option<PathBuf>,
        policies: BTreeMap<String, Arc<Policy>>,
        size: usize,
        uids: std::ops::Range<u32>,
    ) -> Arc<Pool> {
        let size = if library.is_some() { size } else { 0 };
        let state = State { wanted: vec!["default".into()], ..State::default() };
        let pool = Arc::new(Pool {
            sandboxes,
            library,
            rootfs,
            ca_bundle,
            policies,
            size,
            uids,
            leases: crate::uids::Leases::default(),
            state: Mutex::new(state),
            wake: Notify::new(),
            returned: Notify::new(),
            stop: CancellationToken::new(),
            refiller: Mutex::new(None),
        });
        if size > 0 {
            let task = tokio::spawn(pool.clone().refill());
            *pool.refiller.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        }
        pool
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle template for `policy`, and when it was taken; or None (the run then
    /// uses a cold sandbox). When none is idle but one should be back soon (its run
    /// is over, or started less than [`SHORT_RUN`] ago), waits up to
    /// [`WAIT_FOR_TEMPLATE`] for one: a template is back within milliseconds of its
    /// run, and a run it serves costs far less CPU than a cold sandbox, so under load
    /// runs queue for templates instead of crowding the CPU with cold sandboxes. A
    /// template busy with a long run is not waited for.
    pub async fn take(&self, policy: &str) -> Option<(PooledTemplate, tokio::time::Instant)> {
        if self.size == 0 {
            return None;
        }
        let deadline = tokio::time::Instant::now() + WAIT_FOR_TEMPLATE;
        loop {
            let returned = self.returned.notified();
            tokio::pin!(returned);
            returned.as_mut().enable();
            let (taken, soon) = self.try_take(policy);
            if taken.is_some() {
                return taken;
            }
            if !soon || tokio::time::timeout_at(deadline, returned).await.is_err() {
                self.lock().misses += 1;
                return None;
            }
        }
    }

    /// An idle template now, or None and whether one should be back soon.
    fn try_take(&self, policy: &str) -> (Option<(PooledTemplate, tokio::time::Instant)>, bool) {
        let mut dead = vec![];
        let now = tokio::time::Instant::now();
        let (taken, soon) = {
            let mut st = self.lock();
            let mut taken = None;
            while let Some(t) = st.ready.get_mut(policy).and_then(VecDeque::pop_front) {
                // A template whose socket speaks or closed died or misbehaved; its
                // prepared fork is checked when taken.
                if t.quiet() {
                    taken = Some(t);
                    break;
                }
                dead.push(t);
            }
            st.failures += dead.len() as u64;
            if taken.is_some() {
                st.taken(policy, now);
            }
            if !st.wanted.iter().any(|w| w == policy) && self.policies.contains_key(policy) {
                st.wanted.push(policy.into());
            }
            let soon = st.back_soon(policy, now);
            (taken.map(|t| (t, now)), soon)
        };
        for t in dead {
            tokio::spawn(t.destroy());
        }
        self.wake.notify_one();
        (taken, soon)
    }

    /// Serve one run with `template` (from [`Pool::take`]): take the fork it made
    /// ahead, attach the workspace to it, send the code, supervise; then, in the
    /// background, recycle the template. `Err(Fallback)` when the run could not
    /// start there, before any of its code ran: the caller uses a cold sandbox.
    pub async fn serve(
        self: &Arc<Self>,
        (mut template, taken_at): (PooledTemplate, tokio::time::Instant),
        policy: &Arc<Policy>,
        job: &Job<'_>,
        bounds: &isolate::Bounds,
        chunks: Option<mpsc::Sender<isolate::output::Chunk>>,
        cancel: watch::Receiver<bool>,
    ) -> Result<Result<isolate::Outcome, isolate::Error>, Fallback> {
        let oom_before = template.oom_kills();
        let baseline = template.baseline();
        let attach_began = std::time::Instant::now();
        let started = async {
            let mut forked = template.take_prepared().ok_or(isolate::Error::NoPreparedFork)?;
            template.attach(&forked, job.workspace, job.packages, job.owner_uid).await?;
            // The fork's proxy listener is the session's from now: its code may reach out.
            let serving = match (job.egress, forked.take_listener()) {
                (Some((egress, tenant)), Some(listener)) => Some(egress.serve(listener, tenant.clone())),
                _ => None,
            };
            let code = RunCode { code: job.code, run_id: job.run_id, autosave: job.autosave, env: job.env };
            forked.send_code(&code).await.map(|running| (running, serving))
        }
        .await;
        match started {
            Ok((running, _serving)) => {
                let setup = attach_began.elapsed();
                let outcome = template.finish(running, bounds, chunks, cancel, &baseline).await.map(|mut o| {
                    o.setup = setup;
                    o
                });
                {
                    let mut st = self.lock();
                    *st.recycling.entry(policy.name.clone()).or_default() += 1;
                    st.stop_running(&policy.name, taken_at);
                }
                let me = self.clone();
                let policy = policy.clone();
                tokio::spawn(async move {
                    let back = match me.library.as_ref() {
                        // Its forks share its hash secret and memory layout: a template
                        // serves at most the policy's `template_runs`.
                        _ if template.served() >= policy.template_runs => {
                            template.destroy().await;
                            Err(isolate::Error::Retired(policy.template_runs))
                        }
                        _ if template.pids_spent() => {
                            template.destroy().await;
                            Err(isolate::Error::PidsSpent(isolate::PIDS_KEEP))
                        }
                        Some(library) => template.recycle(oom_before, &plan::child_spec(&policy), library).await,
                        None => Err(isolate::Error::NoLibrary),
                    };
                    if let Err(e) = &back {
                        tracing::info!(policy = %policy.name, reason = %e, "a pooled template is replaced after its run");
                    }
                    me.give_back(&policy.name, back.ok(), true);
                });
                Ok(outcome)
            }
            Err(e) => {
                // Whatever the fork made dies with the template.
                template.destroy().await;
                {
                    let mut st = self.lock();
                    st.failures += 1;
                    st.stop_running(&policy.name, taken_at);
                }
                self.give_back(&policy.name, None, false);
                Err(Fallback(e))
            }
        }
    }

    /// Have `template` fork ahead of its first run (destroyed if it cannot).
    async fn prepare(&self, mut template: PooledTemplate, policy: &Policy) -> Result<PooledTemplate, Error> {
        let Some(library) = self.library.as_ref() else { return Err(Error::NoLibrary) };
        match template.prepare(&plan::child_spec(policy), library).await {
            Ok(()) => Ok(template),
            Err(e) => {
                template.destroy().await;
                Err(Error::FirstFork(e))
            }
        }
    }

    /// A template is done with its run (`recycled`: after it ran): idle again, or
    /// gone (`None`).
    fn give_back(&self, policy: &str, template: Option<PooledTemplate>, recycled: bool) {
        {
            let mut st = self.lock();
            st.returned(policy, recycled);
            match template {
                Some(t) if !st.stopped => st.ready.entry(policy.into()).or_default().push_back(t),
                // The daemon is stopping: its shutdown waits for these and destroys
                // them (a task spawned now might never run).
                Some(t) => st.retiring.push(t),
                None => {}
            }
        }
        self.wake.notify_one();
        self.returned.notify_waiters();
    }

    pub fn stats(&self) -> PoolStats {
        let st = self.lock();
        PoolStats {
            size_per_policy: self.size,
            ready: st.ready.values().map(VecDeque::len).sum(),
            ready_by_policy: st.ready.iter().map(|(k, v)| (k.clone(), v.len())).collect(),
            busy: st.busy.values().sum(),
            hits: st.hits,
            misses: st.misses,
            failures: st.failures,
            memory_bytes: st.ready.values().flatten().filter_map(PooledTemplate::memory_bytes).sum(),
        }
    }

    /// The policies whose last template failed to start, and why (for `GET /v1/health`).
    pub fn start_errors(&self) -> BTreeMap<String, String> {
        self.lock().start_errors.clone()
    }

    /// Stop refilling and destroy every ready sandbox (daemon shutdown).
    pub async fn shutdown(&self) {
        self.lock().stopped = true;
        self.stop.cancel();
        let refiller = self.refiller.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = refiller {
            let _ = task.await;
        }
        // Templates still being recycled after their last run come back (to
        // `retiring`) within moments; wait for them, within a bound.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let returned = self.returned.notified();
            tokio::pin!(returned);
            returned.as_mut().enable();
            if self.lock().recycling.values().all(|n| *n == 0) {
                break;
            }
            if tokio::time::timeout_at(deadline, returned).await.is_err() {
                tracing::warn!("pooled templates still recycling at shutdown: left to the cgroup clean-up");
                break;
            }
        }
        let all: Vec<PooledTemplate> = {
            let mut st = self.lock();
            let mut all: Vec<PooledTemplate> = st.ready.drain().flat_map(|(_, v)| v).collect();
            all.append(&mut st.retiring);
            all
        };
        for p in all {
            p.destroy().await;
        }
    }

    /// The policy that is short of templates, if any, and a uid for the next one
    /// (none while every uid of the pool is a live template's).
    fn next_job(&self) -> Option<(Arc<Policy>, crate::uids::Lease)> {
        let mut st = self.lock();
        if st.stopped {
            return None;
        }
        let count = |w: &String| st.ready.get(w).map_or(0, VecDeque::len) + st.busy.get(w).copied().unwrap_or(0);
        let short = st.wanted.iter().find(|w| count(w) < self.size)?.clone();
        let policy = self.policies.get(&short)?.clone();
        let lease = self.leases.take(self.uids.clone(), st.next_uid)?;
        st.next_uid = st.next_uid.wrapping_add(1);
        Some((policy, lease))
    }

    async fn refill(self: Arc<Self>) {
        let mut backoff = Duration::from_secs(1);
        loop {
            let Some((policy, uid)) = self.next_job() else {
                tokio::select! {
                    _ = self.wake.notified() => continue,
                    _ = self.stop.cancelled() => return,
                }
            };
            match self.start(&policy, uid).await {
                Ok(p) => {
                    backoff = Duration::from_secs(1);
                    let unwanted = {
                        let mut st = self.lock();
                        st.start_errors.remove(&policy.name);
                        if st.stopped {
                            Some(p)
                        } else {
                            st.ready.entry(policy.name.clone()).or_default().push_back(p);
                            None
                        }
                    };
                    if let Some(p) = unwanted {
                        p.destroy().await;
                        return;
                    }
                }
                Err(_) if self.stop.is_cancelled() => return,
                Err(e) => {
                    {
                        let mut st = self.lock();
                        st.failures += 1;
                        st.start_errors.insert(policy.name.clone(), e.to_string());
                    }
                    tracing::warn!(policy = %policy.name, error = %e, retry_in_s = backoff.as_secs(), "could not start a pooled sandbox");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = self.stop.cancelled() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(60));
                }
            }
        }
    }

    /// Start one template and wait until its interpreter has its imports.
    async fn start(&self, policy: &Policy, uid: crate::uids::Lease) -> Result<PooledTemplate, Error> {
        let spec = plan::template_spec(&self.rootfs, self.ca_bundle.as_deref(), uid.uid, policy);
        let limits = plan::cgroup_limits(policy);
        let mut template = PooledTemplate::start(&self.sandboxes, &spec, &limits, uid).await.map_err(Error::Start)?;
        let ready = tokio::select! {
            r = tokio::time::timeout(READY_TIMEOUT, template.next_message()) => r,
            _ = self.stop.cancelled() => Ok(Ok(None)),
        };
        match ready {
            Ok(Ok(Some(TemplateMessage::Ready { failed }))) => {
                if !failed.is_empty() {
                    let failed: Vec<String> =
                        failed.iter().take(16).map(|m| isolate::channel::excerpt(m.as_bytes())).collect();
                    tracing::warn!(policy = %policy.name, ?failed, "preload modules that could not be imported (fix the policy's `preload`)");
                }
                self.prepare(template, policy).await
            }
            other => {
                template.destroy().await;
                Err(match other {
                    Err(_) => Error::ImportsTimedOut(READY_TIMEOUT),
                    Ok(Err(e)) => Error::Protocol(e),
                    Ok(Ok(_)) => Error::EndedBeforeReady,
                })
            }
        }
    }
}

/// A run that could not start in a template (nothing of it ran).
#[derive(Debug)]
pub struct Fallback(pub isolate::Error);

/// What a pooled run needs besides its template.
pub struct Job<'a> {
    pub workspace: &'a std::path::Path,
    /// The session's package layer, if it has one.
    pub packages: Option<&'a std::path::Path>,
    pub owner_uid: u32,
    pub code: &'a str,
    pub run_id: &'a str,
    pub autosave: bool,
    /// What the run's environment gains (its session's secrets' placeholders).
    pub env: &'a BTreeMap<String, String>,
    /// The egress proxy and the session as it serves it, for a policy with network.
    pub egress: Option<(&'a Arc<crate::egress::Egress>, &'a Arc<crate::egress::Tenant>)>,
}

#[cfg(test)]
mod tests;
