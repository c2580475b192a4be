//! A run's time limit and its cancel, in one place ([`Drive`]): when the time is
//! up, the program is asked to stop (a signal its sandbox's init forwards to every
//! process of the sandbox), given a grace period, then killed with its whole
//! sandbox; a cancel kills at once. Every run is driven by it: a cold one and a
//! pooled one ([`super::supervise::drive`]) and a kernel's cell
//! ([`crate::kernel::Kernel::exec`], which asks with SIGINT to keep the kernel).
//!
//! What it does to processes goes through a [`Kill`] (the daemon's is
//! [`super::process::signal`]), so its logic is unit-tested without root.

use nix::sys::signal::Signal;
use std::time::Duration;

/// How a [`Drive`] signals a process: `(host pid, signal)`.
pub trait Kill: Send {
    fn signal(&mut self, pid: i32, signal: Signal);
}

impl<F: FnMut(i32, Signal) + Send> Kill for F {
    fn signal(&mut self, pid: i32, signal: Signal) {
        self(pid, signal)
    }
}

/// The processes a [`Drive`] signals: the sandbox's init, once known (killing it
/// ends its whole pid namespace), else its helper (the init, if any, dies with it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Target {
    pub init: Option<i32>,
    pub helper: Option<i32>,
}

/// What [`Drive::tick`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The time was up: the program was asked to stop, and has its grace period.
    Asked,
    /// The sandbox was killed: at the end of the grace period, or at the time
    /// limit when there was no grace or no init to ask yet.
    Killed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Asked,
    Killed,
}

/// Timeout → ask → grace → kill, and cancel, for one run.
pub struct Drive<K> {
    kill: K,
    target: Target,
    /// The time limit, then the end of the grace period.
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    grace: Duration,
    /// The signal that asks the program to stop.
    ask: Signal,
    state: State,
    timed_out: bool,
    cancelled: bool,
}

impl<K: Kill> Drive<K> {
    /// A run limited to `timeout` from now, asked to stop with `ask` and killed
    /// `grace` later.
    pub fn new(kill: K, timeout: Duration, grace: Duration, ask: Signal) -> Drive<K> {
        Drive {
            kill,
            target: Target::default(),
            deadline: Box::pin(tokio::time::sleep(timeout)),
            grace,
            ask,
            state: State::Running,
            timed_out: false,
            cancelled: false,
        }
    }

    /// The processes to signal from now on. A kill that came before the sandbox's
    /// init was known reached at most its helper: the init, now known, is killed.
    pub fn retarget(&mut self, target: Target) {
        let newly_known = self.target.init.is_none() && target.init.is_some();
        self.target = target;
        if newly_known && self.state == State::Killed {
            self.kill_now();
        }
    }

    /// Wait for the next step of the time limit and take it. Pending for ever
    /// once the sandbox was killed. Cancel-safe: a step is taken, whole, only when
    /// its time has come.
    pub async fn tick(&mut self) -> Step {
        match self.state {
            State::Running => {
                self.deadline.as_mut().await;
                self.timed_out = true;
                match self.target.init {
                    // The init forwards the signal to every process in the sandbox.
                    Some(init) if !self.grace.is_zero() => {
                        self.kill.signal(init, self.ask);
                        self.state = State::Asked;
                        let end = tokio::time::Instant::now() + self.grace;
                        self.deadline.as_mut().reset(end);
                        Step::Asked
                    }
                    _ => {
                        self.kill_now();
                        Step::Killed
                    }
                }
            }
            State::Asked => {
                self.deadline.as_mut().await;
                self.kill_now();
                Step::Killed
            }
            State::Killed => std::future::pending().await,
        }
    }

    /// Neither timed out nor cancelled: a cancel still counts.
    pub fn running(&self) -> bool {
        !self.timed_out && !self.cancelled
    }

    /// Kill the sandbox now, on request (its session closes, the daemon stops).
    /// Nothing once the time limit has passed: the run ends as timed out.
    pub fn cancel(&mut self) {
        if self.running() {
            self.cancelled = true;
            self.kill_now();
        }
    }

    /// Kill the sandbox now: the program said how it ended, and the rest of its
    /// sandbox goes.
    pub fn kill(&mut self) {
        self.kill_now();
    }

    /// Kill the sandbox and its helper: nothing of it may live on.
    pub fn kill_everything(&mut self) {
        self.kill_now();
        if let Some(helper) = self.target.helper {
            self.kill.signal(helper, Signal::SIGKILL);
        }
    }

    pub fn timed_out(&self) -> bool {
        self.timed_out
    }

    pub fn cancelled(&self) -> bool {
        self.cancelled
    }

    fn kill_now(&mut self) {
        self.state = State::Killed;
        if let Some(pid) = self.target.init.or(self.target.helper) {
            self.kill.signal(pid, Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::time::Instant;

    type Sent = Arc<Mutex<Vec<(i32, Signal)>>>;

    /// A drive whose signals are recorded, not sent.
    fn recorded(timeout_ms: u64, grace_ms: u64, ask: Signal) -> (Drive<impl Kill>, Sent) {
        let sent: Sent = Default::default();
        let log = sent.clone();
        let kill = move |pid: i32, sig: Signal| log.lock().unwrap().push((pid, sig));
        let drive = Drive::new(kill, Duration::from_millis(timeout_ms), Duration::from_millis(grace_ms), ask);
        (drive, sent)
    }

    fn taken(sent: &Sent) -> Vec<(i32, Signal)> {
        std::mem::take(&mut *sent.lock().unwrap())
    }

    const INIT: Target = Target { init: Some(10), helper: Some(20) };

    #[tokio::test]
    async fn at_the_time_limit_the_program_is_asked_then_killed_after_its_grace() {
        let (mut drive, sent) = recorded(50, 150, Signal::SIGTERM);
        drive.retarget(INIT);
        let began = Instant::now();
        assert_eq!(drive.tick().await, Step::Asked);
        let asked = began.elapsed();
        assert!(asked >= Duration::from_millis(50), "{asked:?}");
        assert_eq!(taken(&sent), [(10, Signal::SIGTERM)]);
        assert!(drive.timed_out() && !drive.cancelled() && !drive.running());
        // A cancel after the time limit changes nothing: the run timed out.
        drive.cancel();
        assert!(taken(&sent).is_empty() && !drive.cancelled());
        assert_eq!(drive.tick().await, Step::Killed);
        assert!(began.elapsed() >= asked + Duration::from_millis(150), "{:?}", began.elapsed());
        assert_eq!(taken(&sent), [(10, Signal::SIGKILL)]);
        // Then nothing more is due.
        assert!(tokio::time::timeout(Duration::from_millis(100), drive.tick()).await.is_err());
        assert!(taken(&sent).is_empty());
    }

    #[tokio::test]
    async fn a_kernel_is_asked_with_its_own_signal() {
        let (mut drive, sent) = recorded(10, 10, Signal::SIGINT);
        drive.retarget(Target { init: Some(3), helper: None });
        assert_eq!(drive.tick().await, Step::Asked);
        assert_eq!(drive.tick().await, Step::Killed);
        assert_eq!(taken(&sent), [(3, Signal::SIGINT), (3, Signal::SIGKILL)]);
    }

    #[tokio::test]
    async fn without_grace_or_an_init_to_ask_the_sandbox_is_killed_at_the_limit() {
        let (mut drive, sent) = recorded(10, 0, Signal::SIGTERM);
        drive.retarget(INIT);
        assert_eq!(drive.tick().await, Step::Killed);
        assert_eq!(taken(&sent), [(10, Signal::SIGKILL)]);

        // The init is not known yet: its helper is killed; once the init is known,
        // it is killed too (the helper's kill may have come too late for it).
        let (mut drive, sent) = recorded(10, 1000, Signal::SIGTERM);
        drive.retarget(Target { init: None, helper: Some(20) });
        assert_eq!(drive.tick().await, Step::Killed);
        assert_eq!(taken(&sent), [(20, Signal::SIGKILL)]);
        drive.retarget(INIT);
        assert_eq!(taken(&sent), [(10, Signal::SIGKILL)]);
        drive.retarget(INIT);
        assert!(taken(&sent).is_empty(), "killed once");

        // Nothing known at all: nothing to signal, the run is over all the same.
        let (mut drive, sent) = recorded(10, 1000, Signal::SIGTERM);
        assert_eq!(drive.tick().await, Step::Killed);
        assert!(taken(&sent).is_empty() && drive.timed_out());
    }

    #[tokio::test]
    async fn a_cancel_kills_at_once_and_no_time_limit_follows() {
        let (mut drive, sent) = recorded(30, 30, Signal::SIGTERM);
        drive.retarget(Target { init: None, helper: None });
        drive.cancel();
        assert!(drive.cancelled() && !drive.timed_out() && !drive.running());
        assert!(taken(&sent).is_empty());
        // The init became known after the cancel: it is killed then.
        drive.retarget(INIT);
        assert_eq!(taken(&sent), [(10, Signal::SIGKILL)]);
        assert!(tokio::time::timeout(Duration::from_millis(100), drive.tick()).await.is_err());
        assert!(taken(&sent).is_empty() && !drive.timed_out());
    }

    #[tokio::test]
    async fn a_program_that_ended_has_the_rest_of_its_sandbox_killed() {
        let (mut drive, sent) = recorded(1000, 1000, Signal::SIGTERM);
        drive.retarget(INIT);
        drive.kill();
        assert_eq!(taken(&sent), [(10, Signal::SIGKILL)]);
        assert!(drive.running(), "neither timed out nor cancelled");
        drive.kill_everything();
        assert_eq!(taken(&sent), [(10, Signal::SIGKILL), (20, Signal::SIGKILL)]);
    }

    /// A tick dropped before its time (another branch of a select won) takes no
    /// step: the next one does, at the same time.
    #[tokio::test]
    async fn a_tick_dropped_early_takes_no_step() {
        let (mut drive, sent) = recorded(80, 1000, Signal::SIGTERM);
        drive.retarget(INIT);
        let began = Instant::now();
        assert!(tokio::time::timeout(Duration::from_millis(20), drive.tick()).await.is_err());
        assert!(taken(&sent).is_empty() && drive.running());
        assert_eq!(drive.tick().await, Step::Asked);
        let at = began.elapsed();
        assert!(at >= Duration::from_millis(80) && at < Duration::from_millis(800), "{at:?}");
    }
}
