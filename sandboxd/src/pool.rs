//! The pool: template interpreters made ahead of one-shot Python runs, the
//! policy's preload modules imported ([`isolate::PooledTemplate`]).
//!
//! A run takes an idle template, which forks; the fork enters a sandbox of its own
//! (fresh namespaces, `/tmp`, `/proc`, privileges dropped, seccomp, Landlock —
//! [`isolate::fork`]), the session's workspace is attached to it, the code is
//! sent, and when the run ends everything of the fork is killed. The template never
//! runs user code: it only forks, one run at a time, and goes back to the pool.
//!
//! Under load a run that finds no idle template waits for one, in order of
//! arrival, as long as the wait it can expect is shorter than what a cold sandbox
//! costs over a pooled run ([`demand`]: a template's own start, in CPU time); a
//! template back from its run goes straight to the first run waiting. The pool grows to the recent
//! peak of demand (runs served and waiting at once) and shrinks back, one template
//! per `--pool-idle-s`, to `--pool-size` per policy; every template counts against the
//! memory budget (`--pool-memory-mb`), which no start may pass. One background task
//! makes templates, one at a time: at the least CPU weight, unless runs wait in line
//! for its policy or the policy has no template.
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

pub mod demand;
pub mod kernel;
mod refill;
mod state;
pub mod tier;

use crate::isolate::message::RunCode;
use crate::isolate::{self, PooledTemplate, Sandboxes};
use crate::model::health::PoolStats;
use crate::model::policy::Policy;
use crate::plan;
use state::{place, State, Taken};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio_util::sync::CancellationToken;

/// How long a pooled interpreter may take to import its preload modules (at the
/// least CPU weight, behind every run).
const READY_TIMEOUT: Duration = Duration::from_secs(300);
/// How often the pool looks for idle templates past its target (see [`demand`]), at most.
const SHRINK_EVERY: Duration = Duration::from_secs(5);

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

/// What [`Pool::try_take`] found.
enum Attempt {
    /// Boxed: a template is large beside the other answers.
    Taken(Box<Taken>),
    /// In line for a template due back, for this long at most.
    Wait(oneshot::Receiver<Taken>, Duration),
    Cold,
}

/// A run in line for a template. Dropped with a template in hand (the run gave up,
/// or its request went away, just as one came), it hands the template on.
struct Waiting<'a> {
    pool: &'a Pool,
    policy: &'a str,
    rx: oneshot::Receiver<Taken>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.rx.close();
        if let Ok((t, at)) = self.rx.try_recv() {
            let mut st = self.pool.lock();
            st.untaken(self.policy, at);
            place(&mut st, self.policy, t);
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
    /// What every template together may hold, bytes (`--pool-memory-mb`).
    memory_budget: u64,
    /// Templates (and their forks) run as a uid of this range, not a session's
    /// (the workspace is attached through an idmapped mount), each its own while it
    /// lives ([`crate::uids::Lease`]).
    uids: std::ops::Range<u32>,
    leases: crate::uids::Leases,
    /// Templates that left the pool for kernel sessions' kernels, still alive
    /// ([`kernel`]).
    kernels: Arc<std::sync::atomic::AtomicUsize>,
    state: Mutex<State>,
    /// Wakes the refill task.
    wake: Notify,
    /// Wakes the shutdown, waiting for templates still recycling.
    returned: Notify,
    /// Cancelled at shutdown: a sandbox still importing is destroyed at once.
    stop: CancellationToken,
    refiller: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Pool {
    /// A pool of at least `size` templates per policy in use, more while demand
    /// asks (one less per `idle_hold` once it falls off), all of them within
    /// `memory_budget` bytes; it keeps the default policy's
    /// from the start. `uids` is the pool's range, above every session's
    /// ([`crate::uids::Ranges`]). Without `library` there is no pool.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        sandboxes: Arc<Sandboxes>,
        library: Option<std::fs::File>,
        rootfs: PathBuf,
        ca_bundle: Option<PathBuf>,
        policies: BTreeMap<String, Arc<Policy>>,
        size: usize,
        memory_budget: u64,
        idle_hold: Duration,
        uids: std::ops::Range<u32>,
    ) -> Arc<Pool> {
        let size = if library.is_some() { size } else { 0 };
        // Each policy with a preload has a bare tier beside it ([`tier`]).
        let mut policies = policies;
        let bare: Vec<Policy> = policies.values().filter_map(|p| tier::bare_of(p)).collect();
        policies.extend(bare.into_iter().map(|b| (b.name.clone(), Arc::new(b))));
        // The default policy's templates from the start: its bare ones first, which
        // start in a few milliseconds.
        let wanted = tier::both("default").into_iter().filter(|w| policies.contains_key(w)).collect();
        let state = State { wanted, idle_hold, ..State::default() };
        let pool = Arc::new(Pool {
            sandboxes,
            library,
            rootfs,
            ca_bundle,
            policies,
            size,
            memory_budget,
            uids,
            leases: crate::uids::Leases::default(),
            kernels: Arc::default(),
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

    /// The policy whose templates serve a Python run of `code` under `policy`:
    /// its bare tier when the code imports only the standard library and the
    /// policy has one ([`tier`]), else `policy` itself. The run is served under
    /// what this returns ([`Pool::take`], [`Pool::serve`]); its limits are the same.
    pub fn tier(&self, policy: &Arc<Policy>, code: &str) -> Arc<Policy> {
        if policy.preload.is_empty() || tier::wants_preload(code) {
            return policy.clone();
        }
        self.policies.get(&tier::bare_name(&policy.name)).cloned().unwrap_or_else(|| policy.clone())
    }

    /// An idle template for `policy`, and when it was taken; or None (the run then
    /// uses a cold sandbox). When none is idle, the run waits in line for one that
    /// is due back, as long as [`Demand::patience`] says the wait beats a cold
    /// sandbox: a pooled run costs far less CPU than a cold one, so under load runs
    /// queue for templates instead of crowding the CPU with cold sandboxes. A
    /// template busy with a long run is not waited for.
    ///
    /// A run waiting in line is cancelled with `cancel` (its session's: a cancel
    /// request, the session closing, the daemon stopping): it then leaves the line
    /// and goes on as a cold run would, which the cancel stops at once.
    pub async fn take(&self, policy: &str, mut cancel: watch::Receiver<bool>) -> Option<Taken> {
        if self.size == 0 {
            return None;
        }
        let (rx, patience) = match self.try_take(policy) {
            Attempt::Taken(t) => return Some(*t),
            Attempt::Cold => return None,
            Attempt::Wait(rx, patience) => (rx, patience),
        };
        let mut waiting = Waiting { pool: self, policy, rx };
        let cancelled = async {
            // Dropped (the session is gone) counts as cancelled too.
            let _ = cancel.wait_for(|c| *c).await;
        };
        tokio::select! {
            got = tokio::time::timeout(patience, &mut waiting.rx) => {
                if let Ok(Ok(taken)) = got {
                    return Some(taken);
                }
            }
            _ = cancelled => {}
        }
        // Gave up: a template handed over meanwhile is still taken.
        waiting.rx.close();
        if let Ok(taken) = waiting.rx.try_recv() {
            return Some(taken);
        }
        self.lock().misses += 1;
        None
    }

    /// An idle template now; or a place in line for one due back, and how long to
    /// wait at most; or neither (the miss is counted).
    fn try_take(&self, policy: &str) -> Attempt {
        let preloaded = self.policies.get(policy).is_some_and(|p| !p.preload.is_empty());
        let mut dead = vec![];
        let now = tokio::time::Instant::now();
        let attempt = {
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
            // Both tiers of the policy are kept from its first run, whichever it took.
            for key in tier::both(policy) {
                if !st.wanted.contains(&key) && self.policies.contains_key(&key) {
                    st.wanted.push(key);
                }
            }
            let ahead = st.waiting(policy);
            // Templates wanted at once. A run that finds one idle: those serving runs
            // and this one (not those being recycled: a lone client's next run would
            // count its last). A run that finds none: every template away (being
            // recycled too: it is not there for this run), the runs waiting, this one.
            let wanted = match taken {
                Some(_) => st.running.get(policy).map_or(0, Vec::len) + 1,
                None => st.busy.get(policy).copied().unwrap_or(0) + ahead + 1,
            };
            st.demand(policy, now).wanted(now, wanted);
            match taken {
                // Stopped: no template is handed out, nor is any run put in line.
                _ if st.stopped => {
                    if let Some(t) = taken {
                        place(&mut st, policy, t);
                    }
                    st.misses += 1;
                    Attempt::Cold
                }
                Some(t) => {
                    st.taken(policy, now);
                    Attempt::Taken(Box::new((t, now)))
                }
                None => {
                    let within = st.demand(policy, now).due_back_within(preloaded);
                    let coming_back = st.coming_back(policy, now, within);
                    match st.demand(policy, now).patience(ahead, coming_back, preloaded) {
                        Some(patience) => {
                            let (tx, rx) = oneshot::channel();
                            let line = st.waiters.entry(policy.into()).or_default();
                            // Runs that gave up leave the line here too, not only as
                            // templates come back (they may not for a while).
                            line.retain(|w| !w.is_closed());
                            line.push_back(tx);
                            Attempt::Wait(rx, patience)
                        }
                        None => {
                            st.misses += 1;
                            Attempt::Cold
                        }
                    }
                }
            }
        };
        for t in dead {
            tokio::spawn(t.destroy());
        }
        self.wake.notify_one();
        attempt
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
            let code =
                RunCode { code: job.code, run_id: job.run_id, autosave: job.autosave, env: job.env, kernel: false };
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
                // Its forks share its hash secret and memory layout: a template serves
                // at most the policy's `template_runs`. One whose run spent its task
                // peak or met the OOM killer goes too. Decided now, so that no run
                // waits in line for a template that is not coming back.
                let retired = if template.served() >= policy.template_runs {
                    Some(isolate::Error::Retired(policy.template_runs))
                } else if template.pids_spent() {
                    Some(isolate::Error::PidsSpent(isolate::PIDS_KEEP))
                } else {
                    None
                };
                let recycled = retired.is_none();
                {
                    let mut st = self.lock();
                    if recycled {
                        *st.recycling.entry(policy.name.clone()).or_default() += 1;
                    }
                    st.stop_running(&policy.name, taken_at);
                }
                let me = self.clone();
                let policy = policy.clone();
                tokio::spawn(async move {
                    let back = match (retired, me.library.as_ref()) {
                        (Some(e), _) => {
                            template.destroy().await;
                            Err(e)
                        }
                        (None, Some(library)) => {
                            template.recycle(oom_before, &plan::child_spec(&policy), library).await
                        }
                        (None, None) => Err(isolate::Error::NoLibrary),
                    };
                    match &back {
                        Ok(_) => me.lock().demand(&policy.name, taken_at).turnaround.add(taken_at.elapsed()),
                        Err(e) => {
                            tracing::info!(policy = %policy.name, reason = %e, "a pooled template is replaced after its run")
                        }
                    }
                    me.give_back(&policy.name, back.ok(), recycled);
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

    /// A template is done with its run (`recycled`: after it ran): to the first run
    /// waiting for one, idle again, or gone (`None`).
    fn give_back(&self, policy: &str, template: Option<PooledTemplate>, recycled: bool) {
        {
            let mut st = self.lock();
            st.returned(policy, recycled);
            if let Some(t) = template {
                place(&mut st, policy, t);
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
            templates: st.ready.values().map(VecDeque::len).sum::<usize>() + st.busy.values().sum::<usize>(),
            waiting: st.waiters.keys().map(|p| st.waiting(p)).sum(),
            memory_budget_bytes: self.memory_budget,
            memory_held_bytes: st.held_bytes(),
            kernel_templates: self.kernels.load(std::sync::atomic::Ordering::Acquire),
        }
    }

    /// The policies whose last template failed to start, and why (for `GET /v1/health`).
    pub fn start_errors(&self) -> BTreeMap<String, String> {
        self.lock().start_errors.clone()
    }

    /// Stop refilling and destroy every ready sandbox (daemon shutdown).
    pub async fn shutdown(&self) {
        {
            let mut st = self.lock();
            st.stopped = true;
            // Runs in line take cold sandboxes (or are cancelled themselves).
            st.waiters.clear();
        }
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
