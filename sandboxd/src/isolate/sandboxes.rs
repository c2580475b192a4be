//! The slot pool: reusable slots ([`super::slot`]), some kept ready, and one run
//! in a fresh sandbox ([`Sandboxes::run`]) supervised by [`super::supervise`].

use super::cgroup;
use super::output::Chunk;
use super::process;
use super::slot::{self, HELPER_ARG};
use super::supervise::{drive, launch, Baseline, Error, Outcome, Run, Started, Usage, PIDS_KEEP};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{mpsc, watch};

/// Where the helper binary is: this very executable.
fn helper_exe() -> PathBuf {
    PathBuf::from("/proc/self/exe")
}

/// How long no slot is made ahead after making one failed (each run would
/// otherwise try again, and say so).
const REFILL_PAUSE: std::time::Duration = std::time::Duration::from_secs(5);

/// Makes sandboxes in reusable slots ([`slot`]), keeping some ready.
pub struct Sandboxes {
    pub cgroups: cgroup::Cgroups,
    idle: Mutex<Vec<slot::Slot>>,
    /// Slots kept ready: made at start-up, and made again in the background when
    /// runs take them or use them up ([`Sandboxes::refill`]).
    prewarm: usize,
    /// Most idle slots kept; more are made under load and removed afterwards.
    max_idle: usize,
    /// A refill is under way (one at a time).
    refilling: AtomicBool,
    /// When a refill last failed: none is tried for [`REFILL_PAUSE`] after.
    refill_failed: Mutex<Option<Instant>>,
    /// Shut down: no slot is made any more.
    stopped: AtomicBool,
}

impl Sandboxes {
    pub fn new(cgroups: cgroup::Cgroups, prewarm: usize, max_idle: usize) -> Arc<Sandboxes> {
        Arc::new(Sandboxes {
            cgroups,
            idle: Mutex::new(vec![]),
            prewarm,
            max_idle: max_idle.max(prewarm),
            refilling: AtomicBool::new(false),
            refill_failed: Mutex::new(None),
            stopped: AtomicBool::new(false),
        })
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
        self.refill();
    }

    /// Bring the ready slots back to `prewarm`, in the background: a run that
    /// comes after one that took the last (or used its slot up: an install's, a
    /// busy program's) finds one made, not ~15 ms of cgroup and helper to wait for.
    fn refill(self: &Arc<Self>) {
        let paused = { *self.refill_failed.lock().unwrap_or_else(|p| p.into_inner()) }
            .is_some_and(|at| at.elapsed() < REFILL_PAUSE);
        if paused || !self.short() || self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                while me.short() {
                    match me.new_slot().await {
                        Ok(s) => {
                            // Kept only while still short (runs give slots back
                            // meanwhile) and not shut down.
                            let extra = {
                                let mut idle = me.lock();
                                match me.wants(idle.len()) {
                                    true => {
                                        idle.push(s);
                                        None
                                    }
                                    false => Some(s),
                                }
                            };
                            if let Some(s) = extra {
                                destroy(s).await;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, pause_s = REFILL_PAUSE.as_secs(), "could not make a sandbox slot ahead of time");
                            *me.refill_failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                            me.refilling.store(false, Ordering::Release);
                            return;
                        }
                    }
                }
                me.refilling.store(false, Ordering::Release);
                // A take between the last check and the store found a refill under
                // way and left it to this one.
                if !me.short() || me.refilling.swap(true, Ordering::AcqRel) {
                    return;
                }
            }
        });
    }

    /// Fewer slots ready than `prewarm`, and not shut down.
    fn short(&self) -> bool {
        self.wants(self.lock().len())
    }

    /// Whether, with `ready` slots idle, one more is wanted.
    fn wants(&self, ready: usize) -> bool {
        ready < self.prewarm && !self.stopped.load(Ordering::Acquire)
    }

    pub(super) async fn take(self: &Arc<Self>) -> Result<slot::Slot, Error> {
        loop {
            let popped = self.lock().pop();
            match popped {
                Some(mut s) => {
                    if s.alive() {
                        self.refill();
                        return Ok(s);
                    }
                    destroy(s).await;
                }
                None => {
                    self.refill();
                    return self.new_slot().await;
                }
            }
        }
    }

    async fn give_back(self: &Arc<Self>, mut s: slot::Slot) {
        // The cgroup's task peak cannot be reset: a slot that held more tasks than
        // a run may count over its own (a template's, a busy run's) is replaced, so
        // the next run there counts its own (see [`super::RunUsage::pids_peak`]).
        let spent = s.cg.pids_peak().is_some_and(|n| n > 1 + PIDS_KEEP);
        if s.alive() && !spent && !self.stopped.load(Ordering::Acquire) {
            let mut idle = self.lock();
            if idle.len() < self.max_idle {
                idle.push(s);
                return;
            }
        }
        destroy(s).await;
        self.refill();
    }

    /// How many slots wait for runs.
    pub fn idle_slots(&self) -> usize {
        self.lock().len()
    }

    /// Remove every idle slot (daemon shutdown).
    pub async fn shutdown(&self) {
        self.stopped.store(true, Ordering::Release);
        let slots: Vec<slot::Slot> = self.lock().drain(..).collect();
        for s in slots {
            destroy(s).await;
        }
    }

    /// Run the program in a new sandbox. `chunks`, when given, receives the output
    /// as it is produced (within the caps). Setting `cancel` to true kills the run.
    /// `started`, when given, receives the host pid of the sandbox's init (to signal it)
    /// and its egress listener (a policy with network).
    pub async fn run(
        self: &Arc<Self>,
        run: Run,
        chunks: Option<mpsc::Sender<Chunk>>,
        cancel: watch::Receiver<bool>,
        started_tx: Option<tokio::sync::oneshot::Sender<Started>>,
    ) -> Result<Outcome, Error> {
        self.run_with_stdin(run, None, chunks, cancel, started_tx, None).await
    }

    /// [`Sandboxes::run`], the program's stdin being `stdin` when given (a kernel's
    /// channel to the daemon) instead of `run.spec.stdin`. `cgroup_tx`, when given,
    /// receives the sandbox's cgroup (a kernel measures each cell in it).
    pub async fn run_with_stdin(
        self: &Arc<Self>,
        run: Run,
        stdin: Option<OwnedFd>,
        chunks: Option<mpsc::Sender<Chunk>>,
        mut cancel: watch::Receiver<bool>,
        started_tx: Option<tokio::sync::oneshot::Sender<Started>>,
        cgroup_tx: Option<tokio::sync::oneshot::Sender<cgroup::RunCgroup>>,
    ) -> Result<Outcome, Error> {
        let started = Instant::now();
        let slot = self.take().await?;
        if let Some(tx) = cgroup_tx {
            let _ = tx.send(slot.cg.clone());
        }
        let queue = started.elapsed();
        tracing::debug!(run_id = %run.id, slot = %slot.id, elapsed_us = started.elapsed().as_micros() as u64, "slot taken");
        // Only the slot's own process is there: none of it is the run's.
        let baseline = Baseline::take(&slot.cg, 0);
        let result = match slot.cg.set_limits(&run.limits) {
            Ok(()) => match launch(&slot, &run.spec, stdin.as_ref()).await {
                Ok(mut sandbox) => {
                    // Only the sandbox holds the program's end now.
                    drop(stdin);
                    let bounds = run.bounds();
                    drive(&mut sandbox, &bounds, chunks, &mut cancel, started, started_tx, None, process::signal).await
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e.into()),
        };
        tracing::debug!(run_id = %run.id, elapsed_us = started.elapsed().as_micros() as u64, "sandbox ended");
        let usage = self.end(slot, &baseline).await;
        let mut outcome = result?.complete(usage);
        outcome.setup = outcome.setup.saturating_sub(queue);
        outcome.queue = queue;
        Ok(outcome)
    }

    /// After a run: kill whatever is left in the slot, read what the run used, and
    /// give the slot back.
    async fn end(self: &Arc<Self>, slot: slot::Slot, baseline: &Baseline) -> Usage {
        slot.cg.kill_except(slot.pid());
        let usage = baseline.usage(&slot.cg);
        self.give_back(slot).await;
        usage
    }

    /// Kill whatever is left in the slot and give it back.
    pub(super) async fn release(self: &Arc<Self>, slot: slot::Slot) {
        slot.cg.kill_except(slot.pid());
        self.give_back(slot).await;
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
