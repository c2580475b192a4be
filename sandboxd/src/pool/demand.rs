//! The pool's rules, as pure functions of what it observes: whether a run should
//! wait for a busy template rather than build a cold sandbox, and how many
//! templates a policy's recent demand asks for. [`super::Pool`] applies them.
//!
//! What a cold sandbox costs over a pooled run is what a template spent, in CPU
//! time, from its start until its imports were done: the interpreter's start and
//! the preload modules a cold run imports again. It is measured in the template's
//! own cgroup, before any run: no tenant's code moves it, and neither does the load
//! (under load every run takes longer by the clock, and cold sandboxes are why).
//! Whatever is measured, no run waits longer than [`MAX_PATIENCE`].

use std::time::Duration;
use tokio::time::Instant;

/// A cold sandbox's cost over a pooled one, before a template of the policy was
/// measured: an interpreter that imports the preload modules, or a bare one.
const PRIOR_COLD_EXTRA_PRELOADED: Duration = Duration::from_millis(500);
const PRIOR_COLD_EXTRA_BARE: Duration = Duration::from_millis(30);
/// How long a template is away for one run, before any was timed.
const PRIOR_TURNAROUND: Duration = Duration::from_millis(50);
/// The least a cold sandbox is taken to cost over a pooled run.
const MIN_COLD_EXTRA: Duration = Duration::from_millis(5);
/// The longest a run waits in line, whatever the measures say.
pub const MAX_PATIENCE: Duration = Duration::from_secs(1);
/// Templates per policy, at most, whatever the demand.
pub const MAX_PER_POLICY: usize = 64;
/// The weight of a new sample in a moving average.
const ALPHA: f64 = 0.2;

/// An exponentially weighted moving average of durations.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Ewma(Option<f64>);

impl Ewma {
    pub fn add(&mut self, sample: Duration) {
        let s = sample.as_secs_f64();
        self.0 = Some(self.0.map_or(s, |avg| avg + ALPHA * (s - avg)));
    }

    pub fn get(&self) -> Option<Duration> {
        self.0.map(Duration::from_secs_f64)
    }
}

/// What the pool has seen of one policy's templates and runs.
#[derive(Debug, Clone)]
pub struct Demand {
    /// A template's time away from the pool for one run: taken to given back
    /// (its run, then its recycling).
    pub turnaround: Ewma,
    /// A template's CPU time from its start to its imports done.
    pub start_cpu: Ewma,
    /// The most templates wanted at once lately (serving runs, and runs waiting),
    /// and since when it holds; it decays by one per `hold`.
    peak: usize,
    peak_at: Instant,
    hold: Duration,
    /// Memory an idle template of the policy holds, bytes.
    pub footprint: Option<u64>,
}

impl Demand {
    /// `hold`: how long a peak of demand holds before it decays by one template.
    pub fn new(now: Instant, hold: Duration) -> Demand {
        Demand {
            hold: hold.max(Duration::from_millis(1)),
            turnaround: Ewma::default(),
            start_cpu: Ewma::default(),
            peak: 0,
            peak_at: now,
            footprint: None,
        }
    }

    /// What a cold sandbox costs over a pooled run: a template's measured start,
    /// or a prior (`preloaded`: the policy imports modules ahead).
    pub fn cold_extra(&self, preloaded: bool) -> Duration {
        match self.start_cpu.get() {
            Some(cpu) => cpu.max(MIN_COLD_EXTRA),
            None if preloaded => PRIOR_COLD_EXTRA_PRELOADED,
            None => PRIOR_COLD_EXTRA_BARE,
        }
    }

    fn turnaround(&self) -> Duration {
        self.turnaround.get().unwrap_or(PRIOR_TURNAROUND)
    }

    /// How long a run that finds `ahead` runs already waiting should expect to wait,
    /// with `coming_back` templates due back (none: it would wait indefinitely).
    pub fn expected_wait(&self, ahead: usize, coming_back: usize) -> Option<Duration> {
        if coming_back == 0 {
            return None;
        }
        let rounds = u32::try_from((ahead / coming_back).saturating_add(1)).unwrap_or(u32::MAX);
        Some(self.turnaround().saturating_mul(rounds))
    }

    /// How long a run should wait for a template, at most, rather than build a
    /// cold sandbox: while the wait it can expect is shorter than what a cold
    /// sandbox costs over a pooled run, it waits up to that cost (at most
    /// [`MAX_PATIENCE`]). `None`: build a cold one now.
    pub fn patience(&self, ahead: usize, coming_back: usize, preloaded: bool) -> Option<Duration> {
        let extra = self.cold_extra(preloaded).min(MAX_PATIENCE);
        let expected = self.expected_wait(ahead, coming_back)?;
        (expected < extra).then_some(extra)
    }

    /// A template is busy with a run "due back" when its run started less than this
    /// long ago: longer runs are not waited for.
    pub fn due_back_within(&self, preloaded: bool) -> Duration {
        self.cold_extra(preloaded).min(MAX_PATIENCE).saturating_add(self.turnaround().min(MAX_PATIENCE))
    }

    /// `in_use` templates are wanted now (serving runs, and runs waiting): the
    /// peak rises at once, and decays by one per `hold` below it.
    pub fn wanted(&mut self, now: Instant, in_use: usize) {
        self.decay(now);
        if in_use >= self.peak {
            self.peak = in_use;
            self.peak_at = now;
        }
    }

    fn decay(&mut self, now: Instant) {
        while self.peak > 0 && now.saturating_duration_since(self.peak_at) >= self.hold {
            self.peak -= 1;
            self.peak_at += self.hold;
        }
    }

    /// How many templates the policy should have: at least `size` (the pool's
    /// configured count), as many as the recent peak of demand, at most
    /// [`MAX_PER_POLICY`].
    pub fn target(&mut self, now: Instant, size: usize) -> usize {
        self.decay(now);
        self.peak.clamp(size, MAX_PER_POLICY.max(size))
    }
}

/// Whether one more template of `footprint` bytes fits `budget` beside the
/// `held` bytes the pool's templates hold.
pub fn fits(held: u64, footprint: u64, budget: u64) -> bool {
    held.saturating_add(footprint) <= budget
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEAK_HOLD: Duration = Duration::from_secs(30);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_moving_average_starts_at_its_first_sample_and_moves_a_fifth_of_the_way() {
        let mut e = Ewma::default();
        assert_eq!(e.get(), None);
        e.add(ms(100));
        assert_eq!(e.get(), Some(ms(100)));
        e.add(ms(200));
        assert_eq!(e.get().map(|d| d.as_millis()), Some(120));
    }

    #[test]
    fn a_run_waits_while_the_expected_wait_is_shorter_than_a_cold_sandboxs_extra_cost() {
        let now = Instant::now();
        let mut d = Demand::new(now, PEAK_HOLD);
        // Priors: a preloaded policy's cold sandbox is dear, a bare one's cheap.
        assert_eq!(d.cold_extra(true), PRIOR_COLD_EXTRA_PRELOADED);
        assert_eq!(d.patience(0, 1, true), Some(PRIOR_COLD_EXTRA_PRELOADED));
        assert_eq!(d.patience(0, 1, false), None, "50 ms of turnaround against 30 ms of cold cost");
        // Nothing due back: never wait.
        assert_eq!(d.patience(0, 0, true), None);
        // Measured: a template took 600 ms of CPU to import; one is back in 80 ms.
        d.start_cpu.add(ms(600));
        d.turnaround.add(ms(80));
        assert_eq!(d.cold_extra(true), ms(600));
        assert_eq!(d.cold_extra(false), ms(600), "measured, the prior no longer counts");
        assert_eq!(d.expected_wait(7, 2), Some(ms(320)), "7 ahead, 2 templates: the 4th round");
        assert_eq!(d.patience(7, 2, true), Some(ms(600)));
        assert_eq!(d.patience(15, 2, true), None, "8 rounds of 80 ms: 640 ms, cold is cheaper");
        assert_eq!(d.due_back_within(true), ms(680));
        // However dear a cold sandbox, no run waits past MAX_PATIENCE, nor waits for a
        // template busy longer than that (plus a turnaround, itself capped).
        let mut slow = Demand::new(now, PEAK_HOLD);
        slow.start_cpu.add(Duration::from_secs(3600));
        slow.turnaround.add(Duration::from_secs(3600));
        assert_eq!(slow.patience(0, 1, true), None);
        assert_eq!(slow.due_back_within(true), MAX_PATIENCE * 2);
        slow.turnaround = Ewma::default();
        assert_eq!(slow.patience(0, 1, true), Some(MAX_PATIENCE));
        // A cold sandbox never costs less than the floor; huge lines do not overflow.
        let mut fast = Demand::new(now, PEAK_HOLD);
        fast.start_cpu.add(ms(1));
        assert_eq!(fast.cold_extra(false), MIN_COLD_EXTRA);
        assert_eq!(fast.expected_wait(usize::MAX, 1), Some(PRIOR_TURNAROUND.saturating_mul(u32::MAX)));
    }

    #[test]
    fn the_target_follows_the_peak_of_demand_up_at_once_and_down_slowly() {
        let t0 = Instant::now();
        let mut d = Demand::new(t0, PEAK_HOLD);
        assert_eq!(d.target(t0, 2), 2, "never below the configured size");
        d.wanted(t0, 8);
        assert_eq!(d.target(t0, 2), 8);
        d.wanted(t0 + ms(10), 3);
        assert_eq!(d.target(t0 + PEAK_HOLD - ms(1), 2), 8, "held for a while");
        // Demand seen after a decay is never dropped below.
        let mut e = Demand::new(t0, PEAK_HOLD);
        e.wanted(t0, 8);
        e.wanted(t0 + PEAK_HOLD * 4, 6);
        assert_eq!(e.target(t0 + PEAK_HOLD * 4, 2), 6);
        assert_eq!(d.target(t0 + PEAK_HOLD, 2), 7, "then one less per hold");
        assert_eq!(d.target(t0 + PEAK_HOLD * 3, 2), 5);
        assert_eq!(d.target(t0 + PEAK_HOLD * 100, 2), 2);
        d.wanted(t0 + PEAK_HOLD * 100, 1000);
        assert_eq!(d.target(t0 + PEAK_HOLD * 100, 2), MAX_PER_POLICY);
        assert_eq!(d.target(t0, 0), MAX_PER_POLICY);
    }

    #[test]
    fn a_template_fits_the_budget_only_whole() {
        assert!(fits(0, 100, 100));
        assert!(!fits(1, 100, 100));
        assert!(!fits(u64::MAX, 1, u64::MAX - 1));
        assert!(fits(300, 100, 400));
    }
}
