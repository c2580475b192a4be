//! The pool's bookkeeping, under its one lock: templates idle, busy and being
//! recycled per policy, the runs in line for one, and what the pool's rules
//! ([`super::demand`]) read. Counting only: no sandbox is started or destroyed here.

use super::demand::Demand;
use crate::isolate::PooledTemplate;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;
use tokio::sync::oneshot;

/// What an idle template is taken to hold before one of its policy was measured.
pub(super) const PRIOR_FOOTPRINT: u64 = 192 << 20;

/// A template handed to a run, and when.
pub(super) type Taken = (PooledTemplate, tokio::time::Instant);

#[derive(Default)]
pub(super) struct State {
    pub(super) ready: HashMap<String, VecDeque<PooledTemplate>>,
    /// Templates serving a run, from take to give-back.
    pub(super) busy: HashMap<String, usize>,
    /// Of those, when each run still running started.
    pub(super) running: HashMap<String, Vec<tokio::time::Instant>>,
    /// Of those, the ones whose run is over: back within milliseconds.
    pub(super) recycling: HashMap<String, usize>,
    /// Runs waiting for a template, per policy, first come first served.
    pub(super) waiters: HashMap<String, VecDeque<oneshot::Sender<Taken>>>,
    /// Per policy, the timings and the recent demand the pool's rules read.
    pub(super) demand: HashMap<String, Demand>,
    /// How long a peak of demand holds before the pool shrinks by one template.
    pub(super) idle_hold: Duration,
    /// Policies the pool keeps sandboxes for, in the order they were first wanted.
    pub(super) wanted: Vec<String>,
    pub(super) hits: u64,
    pub(super) misses: u64,
    pub(super) failures: u64,
    /// Per policy, why its last template failed to start (cleared by one that starts).
    pub(super) start_errors: BTreeMap<String, String>,
    /// Where the next template's uid is looked for ([`crate::uids::Leases::take`]).
    pub(super) next_uid: u32,
    pub(super) stopped: bool,
    /// Templates given back after the pool stopped: [`Pool::shutdown`] destroys them.
    pub(super) retiring: Vec<PooledTemplate>,
}

impl State {
    /// The run that started at `at` in one of `policy`'s templates is over.
    pub(super) fn stop_running(&mut self, policy: &str, at: tokio::time::Instant) {
        if let Some(runs) = self.running.get_mut(policy) {
            if let Some(i) = runs.iter().position(|t| *t == at) {
                runs.swap_remove(i);
            }
        }
    }

    /// A template of `policy` is taken for a run that starts `now`.
    pub(super) fn taken(&mut self, policy: &str, now: tokio::time::Instant) {
        self.hits += 1;
        *self.busy.entry(policy.into()).or_default() += 1;
        self.running.entry(policy.into()).or_default().push(now);
    }

    /// How many of `policy`'s templates are due back: their run is over (they are
    /// being recycled), or started less than `within` before `now`.
    pub(super) fn coming_back(&self, policy: &str, now: tokio::time::Instant, within: Duration) -> usize {
        self.recycling.get(policy).copied().unwrap_or(0)
            + self.running.get(policy).map_or(0, |r| r.iter().filter(|t| now.duration_since(**t) < within).count())
    }

    pub(super) fn demand(&mut self, policy: &str, now: tokio::time::Instant) -> &mut Demand {
        let hold = self.idle_hold;
        self.demand.entry(policy.into()).or_insert_with(|| Demand::new(now, hold))
    }

    /// Runs waiting for a template of `policy` (those that gave up excepted).
    pub(super) fn waiting(&self, policy: &str) -> usize {
        self.waiters.get(policy).map_or(0, |w| w.iter().filter(|t| !t.is_closed()).count())
    }

    /// Templates of `policy`: idle and serving runs.
    pub(super) fn count(&self, policy: &str) -> usize {
        self.ready.get(policy).map_or(0, VecDeque::len) + self.busy.get(policy).copied().unwrap_or(0)
    }

    /// Memory the pool's templates hold, as their policies' idle footprints.
    pub(super) fn held_bytes(&self) -> u64 {
        let mut policies: Vec<&String> = self.ready.keys().chain(self.busy.keys()).collect();
        policies.sort();
        policies.dedup();
        policies.into_iter().map(|p| self.count(p) as u64 * self.footprint(p)).sum()
    }

    pub(super) fn footprint(&self, policy: &str) -> u64 {
        self.demand.get(policy).and_then(|d| d.footprint).unwrap_or(PRIOR_FOOTPRINT)
    }

    /// A template handed to a waiting run was not taken after all (the run gave
    /// up just then): undo [`State::taken`].
    pub(super) fn untaken(&mut self, policy: &str, at: tokio::time::Instant) {
        self.hits = self.hits.saturating_sub(1);
        self.stop_running(policy, at);
        self.returned(policy, false);
    }

    /// A template of `policy` is back from its run (`recycled`: after the run
    /// began; then it was counted as recycling).
    pub(super) fn returned(&mut self, policy: &str, recycled: bool) {
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

/// Hand `t`, a template of `policy` ready for a run, to the first run waiting for
/// one (counted as taken), or put it with the idle ones; once the pool stopped,
/// with those its shutdown destroys (a task spawned now might never run).
pub(super) fn place(st: &mut State, policy: &str, mut t: PooledTemplate) {
    if st.stopped {
        st.retiring.push(t);
        return;
    }
    let now = tokio::time::Instant::now();
    while let Some(waiter) = st.waiters.get_mut(policy).and_then(VecDeque::pop_front) {
        if waiter.is_closed() {
            continue;
        }
        st.taken(policy, now);
        match waiter.send((t, now)) {
            Ok(()) => return,
            Err((back, _)) => {
                st.untaken(policy, now);
                t = back;
            }
        }
    }
    st.ready.entry(policy.into()).or_default().push_back(t);
}
