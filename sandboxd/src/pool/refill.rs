//! The pool's background task: it makes templates, one at a time, for the policy
//! short of them ([`Pool::next_job`]: every policy in use up to `--pool-size`,
//! then growth with demand within the memory budget), and destroys idle ones past
//! their policy's target ([`Pool::shrink`]).

use super::{demand, place, Error, Pool, State, READY_TIMEOUT, SHRINK_EVERY};
use crate::isolate::message::TemplateMessage;
use crate::isolate::{self, PooledTemplate};
use crate::model::policy::Policy;
use crate::plan;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

impl Pool {
    /// The policy that is short of templates, if any, a uid for the next one
    /// (none while every uid of the pool is a live template's), and whether it is
    /// urgent (imported at full CPU weight).
    fn next_job(&self) -> Option<(Arc<Policy>, crate::uids::Lease, bool)> {
        let mut st = self.lock();
        if st.stopped {
            return None;
        }
        let now = tokio::time::Instant::now();
        let wanted = st.wanted.clone();
        let fits = |st: &State, w: &str| demand::fits(st.held_bytes(), st.footprint(w), self.memory_budget);
        // Every policy in use up to `size` first, the one with the fewest first but
        // after those whose last start failed (one that keeps failing must not hold
        // up the others' refill), its first template whatever the budget says (an
        // unmeasured policy is only guessed at); then growth with demand.
        let below_size = wanted
            .iter()
            .filter(|w| {
                let count = st.count(w);
                count < self.size && (count == 0 || fits(&st, w))
            })
            .min_by_key(|w| (st.start_errors.contains_key(*w), st.count(w)));
        let short = match below_size {
            Some(w) => w.clone(),
            None => {
                let mut grow = None;
                for w in wanted {
                    if st.count(&w) < st.demand(&w, now).target(now, self.size) && fits(&st, &w) {
                        grow = Some(w);
                        break;
                    }
                }
                grow?
            }
        };
        let policy = self.policies.get(&short)?.clone();
        let lease = self.leases.take(self.uids.clone(), st.next_uid)?;
        st.next_uid = st.next_uid.wrapping_add(1);
        // Full CPU weight only while runs wait in line for the policy, or it has no
        // template at all: a run that gets its template replaced (by spending its
        // task peak, say) does not buy a full-weight import with it.
        let urgent = st.waiting(&policy.name) > 0 || st.count(&policy.name) == 0;
        Some((policy, lease, urgent))
    }

    /// Destroy idle templates past their policy's target (its demand has fallen
    /// off), or past the memory budget.
    async fn shrink(&self) {
        let surplus: Vec<PooledTemplate> = {
            let mut st = self.lock();
            let now = tokio::time::Instant::now();
            let mut surplus = vec![];
            for policy in st.wanted.clone() {
                let over = st.count(&policy).saturating_sub(st.demand(&policy, now).target(now, self.size));
                for _ in 0..over {
                    match st.ready.get_mut(&policy).and_then(VecDeque::pop_back) {
                        Some(t) => surplus.push(t),
                        None => break,
                    }
                }
            }
            // Past the budget: idle templates go from the policy with the most
            // templates over its size first.
            while st.held_bytes() > self.memory_budget {
                let mut idle: Vec<(usize, String)> =
                    st.ready.iter().filter(|(_, r)| !r.is_empty()).map(|(p, _)| (st.count(p), p.clone())).collect();
                idle.sort();
                let Some((_, policy)) = idle.pop() else { break };
                match st.ready.get_mut(&policy).and_then(VecDeque::pop_back) {
                    Some(t) => surplus.push(t),
                    None => break,
                }
            }
            surplus
        };
        if !surplus.is_empty() {
            tracing::info!(templates = surplus.len(), "the pool shrinks: demand fell off");
        }
        for t in surplus {
            t.destroy().await;
        }
    }

    pub(super) async fn refill(self: Arc<Self>) {
        let mut backoff = Duration::from_secs(1);
        loop {
            let Some((policy, uid, urgent)) = self.next_job() else {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(SHRINK_EVERY.min(self.lock().idle_hold)) => {}
                    _ = self.stop.cancelled() => return,
                }
                self.shrink().await;
                continue;
            };
            match self.start(&policy, uid, urgent).await {
                Ok(p) => {
                    backoff = Duration::from_secs(1);
                    let stopped = {
                        let mut st = self.lock();
                        st.start_errors.remove(&policy.name);
                        let d = st.demand(&policy.name, tokio::time::Instant::now());
                        if let Some(bytes) = p.memory_bytes() {
                            // The first template also holds the rootfs's page cache: the
                            // average settles on what each one adds.
                            d.footprint = Some(d.footprint.map_or(bytes, |f| f / 4 * 3 + bytes / 4));
                        }
                        if let Some(cpu) = p.start_cpu() {
                            d.start_cpu.add(cpu);
                        }
                        place(&mut st, &policy.name, p);
                        st.stopped
                    };
                    if stopped {
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

    /// Start one template and wait until its interpreter has its imports (at the
    /// least CPU weight, unless `urgent`).
    async fn start(&self, policy: &Policy, uid: crate::uids::Lease, urgent: bool) -> Result<PooledTemplate, Error> {
        let spec = plan::template_spec(&self.rootfs, self.ca_bundle.as_deref(), uid.uid, policy);
        let limits = plan::cgroup_limits(policy);
        let mut template =
            PooledTemplate::start(&self.sandboxes, &spec, &limits, uid, urgent).await.map_err(Error::Start)?;
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
