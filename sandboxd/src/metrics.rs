//! `GET /metrics`: the daemon's counters in the Prometheus text format.
//!
//! Counted where they happen, in one process-wide [`Metrics`] ([`global`]): runs by
//! status, language and mode, and their phases' latencies ([`Metrics::run_ended`],
//! called by [`crate::run`] for every run and cell); API errors by code
//! ([`Metrics::api_error`], called where a `service::Error` becomes an answer,
//! `api/error.rs`). What the daemon holds now (idle templates per policy, the pool's
//! hits and misses, sessions by mode) is read when scraped ([`Live`]). The encoding
//! is `prometheus-client`'s (the Prometheus project's Rust client).

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::LazyLock;
use std::time::Duration;

/// The content type of the answer: the Prometheus text format, version 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

type Labels = Vec<(&'static str, String)>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// Where a run ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A fresh sandbox in a slot (every shell run, and Python runs the pool missed).
    Cold,
    /// A fork of a pooled template.
    Pooled,
    /// A cell in a kernel session's interpreter.
    Kernel,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Cold => "cold",
            Mode::Pooled => "pooled",
            Mode::Kernel => "kernel",
        }
    }
}

/// How long each phase of one run took.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// Waiting for a sandbox: a slot, a template (the pool's short wait), or
    /// nothing (a kernel cell).
    pub queue: Duration,
    /// Making it ready: a cold sandbox from its slot to its program started; a
    /// pooled one, attaching the workspace; a kernel cell, starting the kernel
    /// when the session had none.
    pub setup: Duration,
    /// The program (or cell) from then until its end.
    pub execution: Duration,
    /// The workspace walked before the run (what files it held, to find the
    /// run's artifacts after), and after it (what it created or changed).
    pub snapshot: Duration,
    pub artifacts: Duration,
}

/// Latency buckets, seconds: from a pooled `print(1)` (milliseconds) to long runs.
fn buckets() -> Histogram {
    Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0])
}

/// The daemon's counters (cheap to clone: each is shared).
#[derive(Debug, Clone)]
pub struct Metrics {
    runs: Family<Labels, Counter>,
    queue: Histograms,
    setup: Histograms,
    execution: Histograms,
    /// The workspace walks around a run, by mode and `when` (before, after).
    workspace_walk: Histograms,
    /// A run's whole time in the daemon.
    handling: Histogram,
    oom_kills: Counter,
    timeouts: Counter,
    api_errors: Family<Labels, Counter>,
    egress_connections: Counter,
    egress_refusals: Family<Labels, Counter>,
    egress_bytes: Family<Labels, Counter>,
    package_cache: Family<Labels, Counter>,
    index_pages: Family<Labels, Counter>,
    package_installs: Family<Labels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            runs: Family::default(),
            queue: Family::new_with_constructor(buckets),
            setup: Family::new_with_constructor(buckets),
            execution: Family::new_with_constructor(buckets),
            workspace_walk: Family::new_with_constructor(buckets),
            handling: buckets(),
            oom_kills: Counter::default(),
            timeouts: Counter::default(),
            api_errors: Family::default(),
            egress_connections: Counter::default(),
            egress_refusals: Family::default(),
            egress_bytes: Family::default(),
            package_cache: Family::default(),
            index_pages: Family::default(),
            package_installs: Family::default(),
        }
    }
}

static GLOBAL: LazyLock<Metrics> = LazyLock::new(Metrics::default);

/// The daemon's one set of counters.
pub fn global() -> &'static Metrics {
    &GLOBAL
}

/// What the daemon holds at the moment of a scrape.
#[derive(Debug, Clone, Default)]
pub struct Live {
    /// Idle templates per policy.
    pub pool_idle: Vec<(String, usize)>,
    pub pool_hits: u64,
    pub pool_misses: u64,
    /// Open sessions per mode (`script`, `kernel`).
    pub sessions: Vec<(String, usize)>,
    /// Sandbox slots ready for a cold run.
    pub ready_sandboxes: usize,
}

impl Metrics {
    /// A run (or cell) ended with `status` (`ok`, `error`, `timeout`, `oom`, `killed`).
    pub fn run_ended(&self, mode: Mode, language: &str, status: &str, phases: &Phases) {
        let labels =
            vec![("status", status.to_string()), ("language", language.to_string()), ("mode", mode.as_str().into())];
        self.runs.get_or_create(&labels).inc();
        let by_mode = vec![("mode", mode.as_str().to_string())];
        self.queue.get_or_create(&by_mode).observe(phases.queue.as_secs_f64());
        self.setup.get_or_create(&by_mode).observe(phases.setup.as_secs_f64());
        self.execution.get_or_create(&by_mode).observe(phases.execution.as_secs_f64());
        for (when, took) in [("before", phases.snapshot), ("after", phases.artifacts)] {
            let labels = vec![("mode", mode.as_str().to_string()), ("when", when.to_string())];
            self.workspace_walk.get_or_create(&labels).observe(took.as_secs_f64());
        }
        match status {
            "oom" => {
                self.oom_kills.inc();
            }
            "timeout" => {
                self.timeouts.inc();
            }
            _ => {}
        }
    }

    /// A run's whole time in the daemon, from its request's operation to its result
    /// ready: the session's lease, the sandbox, the workspace walks, the result and
    /// its record written (what is not one of [`Phases`] is the daemon's own).
    pub fn run_handled(&self, took: Duration) {
        self.handling.observe(took.as_secs_f64());
    }

    /// The API answered an error with `code` (the envelope's `error.code`).
    pub fn api_error(&self, code: &str) {
        self.api_errors.get_or_create(&vec![("code", code.to_string())]).inc();
    }

    /// A sandbox reached a host through the egress proxy.
    pub fn egress_connection(&self) {
        self.egress_connections.inc();
    }

    /// The egress proxy refused a sandbox's request with `code`.
    pub fn egress_refused(&self, code: &str) {
        self.egress_refusals.get_or_create(&vec![("code", code.to_string())]).inc();
    }

    /// `n` bytes went through the egress proxy to a sandbox (`to_sandbox`) or from one.
    pub fn egress_bytes(&self, to_sandbox: bool, n: u64) {
        let direction = if to_sandbox { "in" } else { "out" };
        self.egress_bytes.get_or_create(&vec![("direction", direction.to_string())]).inc_by(n);
    }

    /// A package file was asked of the cache: there (`hit`), or fetched from the index.
    pub fn package_cache(&self, hit: bool) {
        let result = if hit { "hit" } else { "miss" };
        self.package_cache.get_or_create(&vec![("result", result.to_string())]).inc();
    }

    /// A package index page was asked for: answered from memory (`hit`), or
    /// fetched from the index (`miss`, kept if it may be).
    pub fn index_page(&self, hit: bool) {
        let result = if hit { "hit" } else { "miss" };
        self.index_pages.get_or_create(&vec![("result", result.to_string())]).inc();
    }

    /// A package install ended (`ok`, `failed`, `timeout`).
    pub fn package_install(&self, status: &str) {
        self.package_installs.get_or_create(&vec![("status", status.to_string())]).inc();
    }

    /// Everything, in the Prometheus text format.
    pub fn render(&self, live: &Live) -> String {
        let mut reg = Registry::with_prefix("sandboxd");
        reg.register("runs", "Runs ended, by status, language and mode (cold, pooled, kernel)", self.runs.clone());
        reg.register(
            "run_queue_wait_seconds",
            "Time a run waited for a sandbox (a slot, a pooled template), by mode",
            self.queue.clone(),
        );
        reg.register(
            "run_setup_seconds",
            "Time making a run's sandbox ready (cold: until its program started; pooled: attaching the workspace; kernel: starting the kernel), by mode",
            self.setup.clone(),
        );
        reg.register("run_execution_seconds", "Time a run's program ran, by mode", self.execution.clone());
        reg.register(
            "run_workspace_walk_seconds",
            "Time walking a run's workspace as the session's user, by mode and when: before (what it held) and after (the run's artifacts)",
            self.workspace_walk.clone(),
        );
        reg.register(
            "run_handling_seconds",
            "A run's whole time in the daemon, from its request to its result and record (the phases above, and the daemon's own work around them)",
            self.handling.clone(),
        );
        reg.register("oom_kills", "Runs ended by the OOM killer", self.oom_kills.clone());
        reg.register("timeouts", "Runs ended by their time limit", self.timeouts.clone());
        reg.register("api_errors", "Error answers of the API, by error code", self.api_errors.clone());
        reg.register(
            "egress_connections",
            "Hosts sandboxes reached through the egress proxy",
            self.egress_connections.clone(),
        );
        reg.register("egress_refusals", "Requests the egress proxy refused, by code", self.egress_refusals.clone());
        reg.register(
            "egress_bytes",
            "Bytes through the egress proxy, into sandboxes (in) and out of them (out)",
            self.egress_bytes.clone(),
        );
        reg.register(
            "package_cache_requests",
            "Package files asked of the daemon's cache, by result (hit: served from it; miss: fetched and kept)",
            self.package_cache.clone(),
        );
        reg.register(
            "package_index_pages",
            "Package index pages asked for, by result (hit: answered from the daemon's memory while fresh; miss: fetched from the index)",
            self.index_pages.clone(),
        );
        reg.register("package_installs", "Package installs, by status", self.package_installs.clone());

        let idle: Family<Labels, Gauge> = Family::default();
        for (policy, n) in &live.pool_idle {
            idle.get_or_create(&vec![("policy", policy.clone())]).set(*n as i64);
        }
        reg.register("pool_idle_templates", "Pooled templates ready for a run, by policy", idle);
        reg.register("pool_hits", "Python runs served by a pooled template", ConstCounter::new(live.pool_hits));
        reg.register("pool_misses", "Python runs that found no pooled template", ConstCounter::new(live.pool_misses));
        let sessions: Family<Labels, Gauge> = Family::default();
        for (mode, n) in &live.sessions {
            sessions.get_or_create(&vec![("mode", mode.clone())]).set(*n as i64);
        }
        reg.register("sessions", "Open sessions, by mode", sessions);
        let ready: Gauge = Gauge::default();
        ready.set(live.ready_sandboxes as i64);
        reg.register("ready_sandboxes", "Sandbox slots ready for a cold run (ready_sandboxes keeps them made)", ready);

        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_text::encode(&mut text, &reg);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_phases_and_errors_are_counted_and_rendered() {
        let m = Metrics::default();
        let phases = Phases {
            queue: Duration::from_millis(2),
            setup: Duration::from_millis(30),
            execution: Duration::from_millis(700),
            snapshot: Duration::from_micros(300),
            artifacts: Duration::from_millis(3),
        };
        m.run_handled(Duration::from_millis(4));
        m.run_ended(Mode::Cold, "python", "ok", &phases);
        m.run_ended(Mode::Cold, "python", "ok", &phases);
        m.run_ended(Mode::Kernel, "python", "oom", &phases);
        m.run_ended(Mode::Pooled, "python", "timeout", &phases);
        m.api_error("session_not_found");
        m.egress_connection();
        m.egress_refused("host_not_allowed");
        m.egress_bytes(true, 100);
        m.egress_bytes(false, 7);
        m.package_cache(true);
        m.package_install("ok");
        let live = Live {
            pool_idle: vec![("default".into(), 2)],
            pool_hits: 7,
            pool_misses: 1,
            sessions: vec![("script".into(), 3), ("kernel".into(), 1)],
            ready_sandboxes: 2,
        };
        let text = m.render(&live);
        for line in [
            "# TYPE sandboxd_runs_total counter",
            r#"sandboxd_runs_total{status="ok",language="python",mode="cold"} 2"#,
            r#"sandboxd_runs_total{status="oom",language="python",mode="kernel"} 1"#,
            "sandboxd_oom_kills_total 1",
            "sandboxd_timeouts_total 1",
            r#"sandboxd_api_errors_total{code="session_not_found"} 1"#,
            r#"sandboxd_pool_idle_templates{policy="default"} 2"#,
            "sandboxd_pool_hits_total 7",
            "sandboxd_pool_misses_total 1",
            r#"sandboxd_sessions{mode="kernel"} 1"#,
            "sandboxd_ready_sandboxes 2",
            r#"sandboxd_run_setup_seconds_bucket{mode="cold",le="0.05"} 2"#,
            r#"sandboxd_run_execution_seconds_count{mode="cold"} 2"#,
            r#"sandboxd_run_workspace_walk_seconds_bucket{mode="cold",when="before",le="0.001"} 2"#,
            r#"sandboxd_run_workspace_walk_seconds_bucket{mode="cold",when="after",le="0.001"} 0"#,
            r#"sandboxd_run_workspace_walk_seconds_bucket{mode="cold",when="after",le="0.005"} 2"#,
            "sandboxd_run_handling_seconds_count 1",
            "sandboxd_egress_connections_total 1",
            r#"sandboxd_egress_refusals_total{code="host_not_allowed"} 1"#,
            r#"sandboxd_egress_bytes_total{direction="in"} 100"#,
            r#"sandboxd_egress_bytes_total{direction="out"} 7"#,
            r#"sandboxd_package_cache_requests_total{result="hit"} 1"#,
            r#"sandboxd_package_installs_total{status="ok"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing from:\n{text}");
        }
    }
}
