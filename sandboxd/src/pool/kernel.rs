//! A kernel session's kernel started in a fork of a pooled template, so that its
//! first cell finds the policy's preload imported (a first `import pandas` cell in
//! tens of milliseconds, not a cold interpreter's second).
//!
//! The template is taken as a run takes one ([`Pool::take`], its tier chosen from
//! the first cell's code), and then leaves the pool for good: the pool counts it
//! as gone and makes another. Its fork made ahead gets the session's workspace
//! and package layer attached as a run's does, and is sent kernel.py as its code
//! with [`RunCode::kernel`]: the runner makes it the kernel, its run socket the
//! kernel's channel. The fork is the same sandbox as a pooled run's (its own
//! namespaces, Landlock, seccomp, the template's cgroup limits, which are the
//! policy's). The template stays, forking nothing more, for the kernel's life: its
//! fork's processes live in its namespaces. When the kernel ends, both go.
//!
//! Each such kernel holds its template's uid from the pool's range while it
//! lives: at most [`MAX_KERNEL_TEMPLATES`] at once, so the pool always has uids
//! for its own templates; past that, kernels start cold.

use super::{place, Fallback, Job, Pool};
use crate::isolate::cgroup::RunCgroup;
use crate::isolate::message::RunCode;
use crate::isolate::{self, Bounds, Outcome};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Templates kernels may hold at once: a quarter of the pool's uids.
pub const MAX_KERNEL_TEMPLATES: usize = (crate::uids::POOL_SPAN / 4) as usize;

/// One of the [`MAX_KERNEL_TEMPLATES`] places, held while a kernel's template lives.
struct Hold(Arc<AtomicUsize>);

impl Hold {
    fn take(held: &Arc<AtomicUsize>) -> Option<Hold> {
        held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < MAX_KERNEL_TEMPLATES).then_some(n + 1))
            .ok()
            .map(|_| Hold(held.clone()))
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A kernel running in a template's fork: its channel (kernel.py's protocol from
/// the first line on, its `ready` not yet read) and what supervises it.
pub struct KernelFork {
    pub channel: isolate::channel::Channel<tokio::net::UnixStream>,
    /// Host pid of the fork's init, and a pidfd on it: cells are interrupted through
    /// the pidfd (its outer process reaps it, and its pid may be reused then).
    pub init_pid: i32,
    pub init_pidfd: Arc<OwnedFd>,
    /// The template's cgroup, where each cell is measured.
    pub cgroup: RunCgroup,
    /// The egress proxy's listener in the fork's network namespace.
    pub listener: Option<OwnedFd>,
    /// Supervises the fork until the kernel ends or `stop` is set; destroys the
    /// template then. How the fork ended.
    pub task: JoinHandle<Result<Outcome, isolate::Error>>,
    pub stop: watch::Sender<bool>,
}

impl Pool {
    /// Start `job` (kernel.py as its code) in a fork of a template of `tier`, taken
    /// off the pool for good. `None`: no template now, none due in time, or kernels
    /// hold [`MAX_KERNEL_TEMPLATES`] already (a kernel then starts cold);
    /// `Err(Fallback)`: the template could not take it, before any of it ran.
    pub async fn start_kernel(
        &self,
        tier: &str,
        job: &Job<'_>,
        bounds: Bounds,
        cancel: watch::Receiver<bool>,
    ) -> Option<Result<KernelFork, Fallback>> {
        let hold = Hold::take(&self.kernels)?;
        let (mut template, taken_at) = self.take(tier, cancel.clone()).await?;
        {
            let mut st = self.lock();
            if *cancel.borrow() {
                // Handed over just as the run was stopped: it serves another.
                st.untaken(tier, taken_at);
                place(&mut st, tier, template);
                return None;
            }
            // Gone from the pool's books: its refill makes another.
            st.stop_running(tier, taken_at);
            st.returned(tier, false);
        }
        self.wake.notify_one();
        self.returned.notify_waiters();
        let started = async {
            let mut forked = template.take_prepared().ok_or(isolate::Error::NoPreparedFork)?;
            template.attach(&forked, job.workspace, job.packages, job.owner_uid).await?;
            let listener = forked.take_listener();
            let code = RunCode { code: job.code, run_id: job.run_id, autosave: false, env: job.env, kernel: true };
            forked.send_code(&code).await.map(|running| (running, listener))
        }
        .await;
        let (running, listener) = match started {
            Ok(started) => started,
            Err(e) => {
                template.destroy().await;
                self.lock().failures += 1;
                return Some(Err(Fallback(e)));
            }
        };
        let (channel, fork, init_pid, init_pidfd) = running.into_kernel();
        let cgroup = template.cgroup();
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let ended = template.host_kernel(fork, &bounds, stop_rx).await;
            drop(hold);
            ended
        });
        Some(Ok(KernelFork { channel, init_pid, init_pidfd, cgroup, listener, task, stop }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_hold_at_most_a_quarter_of_the_pools_uids() {
        let held = Arc::new(AtomicUsize::new(0));
        let holds: Vec<Hold> = (0..MAX_KERNEL_TEMPLATES).map_while(|_| Hold::take(&held)).collect();
        assert_eq!(holds.len(), MAX_KERNEL_TEMPLATES);
        assert_eq!(MAX_KERNEL_TEMPLATES as u32 * 4, crate::uids::POOL_SPAN);
        assert!(Hold::take(&held).is_none());
        drop(holds);
        assert_eq!(held.load(Ordering::Acquire), 0);
        assert!(Hold::take(&held).is_some());
    }
}
