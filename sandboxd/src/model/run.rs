//! A run as callers send and get it: the request, the result, its artifacts,
//! what it used, and what a kernel session's cell adds.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    #[default]
    Python,
    Shell,
}

/// The body of `POST /v1/runs` and `POST /v1/sessions/{id}/runs` (absent fields
/// are left out when a client sends one).
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// Python source (or a shell command with `language: "shell"`).
    pub code: String,
    /// Run in this session; without it a new session is made and returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = r"^([0-9a-f]{16}\.)?[A-Za-z0-9_-]{1,64}$")]
    pub session_id: Option<String>,
    #[serde(default)]
    pub language: Language,
    /// Wall-clock limit in seconds: more than 0, at most the policy's `timeout_s`
    /// (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(exclusive_minimum = 0.0)]
    pub timeout_s: Option<f64>,
    /// Policy for a new session (an existing session keeps its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Save open matplotlib figures (default: the policy's setting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autosave_figures: Option<bool>,
    /// Packages to install into the session's package layer before the code runs
    /// (as `POST /v1/sessions/{id}/packages`): requirement strings such as
    /// `"requests==2.32.3"` or `"tabulate"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = RunStatus)]
pub enum Status {
    Ok,
    Error,
    Timeout,
    Oom,
    Killed,
}

impl Status {
    /// Its name in results and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Error => "error",
            Status::Timeout => "timeout",
            Status::Oom => "oom",
            Status::Killed => "killed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ArtifactKind {
    File,
    Figure,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Artifact {
    pub path: String,
    pub size_bytes: u64,
    pub mime_type: String,
    pub kind: ArtifactKind,
    pub url: String,
}

/// A run's result: also the answer when the program failed (HTTP 200).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunResult {
    pub run_id: String,
    pub session_id: String,
    pub status: Status,
    pub exit_code: Option<i32>,
    /// The signal's name, e.g. "SIGKILL".
    pub signal: Option<String>,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
    pub artifacts: Vec<Artifact>,
    pub artifacts_truncated: bool,
    /// What the run used, measured over this run alone.
    #[serde(default)]
    pub usage: RunUsage,
    /// Kernel sessions only: `result`, `exception`, `kernel_restarted` (the
    /// OpenAPI document lists them as optional properties of `RunResult`).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub kernel: Option<KernelFields>,
}

/// What one run used, from its sandbox's cgroup, as run results report it.
///
/// A sandbox's cgroup can serve many runs (a cold slot, a pooled template, a
/// kernel session), so each figure is measured over the run alone: counters are
/// read when the run begins and when its processes are gone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunUsage {
    /// CPU time (user + system, all cores) used by the run's processes, in
    /// milliseconds: the cgroup's CPU time at the end minus at the start
    /// (`cpuacct.usage`, or `usage_usec` of `cpu.stat` on cgroup v2). It includes
    /// building the sandbox (a cold run) or attaching the workspace (a pooled run).
    /// Null when the host has no CPU accounting.
    pub cpu_ms: Option<u64>,
    /// The most memory the run had charged at once beyond what its sandbox held
    /// when the run began, in bytes: the cgroup's memory peak over the run (reset
    /// when the run begins) minus its charge then. Memory counts anonymous memory,
    /// page cache and kernel memory the run's processes caused; what a pooled
    /// run's fork shares with its template is not counted until written to. Null
    /// when the kernel cannot reset the peak (cgroup v2 before Linux 6.12).
    pub memory_peak_bytes: Option<u64>,
    /// The most tasks (processes and threads) the run had at once, counting the
    /// sandbox's init and the process that made it (a cold run's helper, a pooled
    /// run's outer process); a kernel cell counts the kernel's interpreter. The
    /// kernel's `pids.peak` cannot be reset, so this is the cgroup's peak at the
    /// end minus the tasks present before the run that are not its own: exact for
    /// a run that set a new peak, otherwise at most the sandbox's earlier peak. A
    /// cold slot whose peak passed [`PIDS_KEEP`] tasks besides its own process,
    /// and a pooled template whose run raised its peak to more than that, are
    /// replaced, so a later run there counts at most [`PIDS_KEEP`] more than its
    /// own (a pooled run also counts the peak its template's own forks left, at
    /// most 3: `print(1)` counts 3 to 6 there); a kernel session keeps its
    /// kernel, and its later cells count at least the busiest earlier cell until
    /// the kernel restarts. Null when the kernel does not report `pids.peak`
    /// (before Linux 6.1).
    pub pids_peak: Option<u64>,
    /// What the run did through the egress proxy, the install of its `packages`
    /// included; present when its policy has network (`allowlist`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<NetUsage>,
    /// Present when the run ended with its workspace out of room, and which
    /// room: its own (`workspace_mb`) or its share of the host disk. Its stderr
    /// then says so too, and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_full: Option<DiskFull>,
}

/// Which room a workspace ran out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DiskFull {
    /// Its own size (the policy's `workspace_mb`) is used up: delete files, or
    /// use a policy with a larger workspace.
    Workspace,
    /// The host disk is nearly full: the session's share of what it has free
    /// is used up. The operator's to free; closing sessions helps.
    Host,
}

/// A run's use of the network, as the egress proxy saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NetUsage {
    /// Connections the proxy accepted from the sandbox (refused ones included).
    pub connections: u64,
    /// The hosts it reached, `host:port`, in the order first reached (at most 64).
    pub hosts: Vec<String>,
    /// Bytes the sandbox received through the proxy.
    pub bytes_in: u64,
    /// Bytes the sandbox sent through the proxy.
    pub bytes_out: u64,
    /// Of `bytes_in`: package files served from the daemon's cache, not the index.
    pub cached_bytes: u64,
    /// What the proxy refused (the first 16; `refused_total` counts them all).
    pub refused: Vec<NetRefusal>,
    pub refused_total: u64,
}

impl NetUsage {
    /// The most hosts a result lists.
    pub const MAX_HOSTS: usize = 64;
    /// The most refusals a result lists (`refused_total` counts them all).
    pub const MAX_REFUSALS: usize = 16;

    /// Count `other` (an earlier part of the same request: the install of a run's
    /// packages) in this one: it comes first.
    pub fn add_before(&mut self, other: &NetUsage) {
        self.connections += other.connections;
        self.bytes_in += other.bytes_in;
        self.bytes_out += other.bytes_out;
        self.cached_bytes += other.cached_bytes;
        self.refused_total += other.refused_total;
        let mut hosts = other.hosts.clone();
        for h in self.hosts.drain(..) {
            if !hosts.contains(&h) {
                hosts.push(h);
            }
        }
        hosts.truncate(Self::MAX_HOSTS);
        self.hosts = hosts;
        let mut refused = other.refused.clone();
        refused.append(&mut self.refused);
        refused.truncate(Self::MAX_REFUSALS);
        self.refused = refused;
    }
}

/// One request the egress proxy refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NetRefusal {
    /// `host:port` as the request named it.
    pub host: String,
    /// `host_not_allowed`, `port_not_allowed`, `address_not_allowed`,
    /// `name_not_resolved`, `connect_failed`, `secret_not_allowed`,
    /// `answer_refused`, `tunnel_refused`, `too_many_connections` or `bad_request`.
    pub code: String,
    pub message: String,
}

/// What kernel sessions add to a run result.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct KernelFields {
    /// The final expression's value: `{"text/plain": ..., "text/html": ...}`, or null.
    #[schema(value_type = Option<serde_json::Value>)]
    pub result: Option<KernelResult>,
    /// `{name, value, traceback}` when the cell raised, else null.
    #[schema(value_type = Option<serde_json::Value>)]
    pub exception: Option<KernelException>,
    /// The session's earlier variables are gone: the kernel was killed during this
    /// cell, or this is the first cell since the daemon restarted.
    pub kernel_restarted: bool,
}

/// A cell's final expression's value: its text in each mime type it was shown
/// in (`text/plain`, and `text/html` when it has one). A map, so it is written
/// in its keys' order, as it always was.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct KernelResult(pub BTreeMap<String, String>);

impl KernelResult {
    /// The mime type of the plain text every value has.
    pub const PLAIN: &'static str = "text/plain";
    /// The mime type of the HTML some values have.
    pub const HTML: &'static str = "text/html";

    /// The value as plain text, if it has it.
    pub fn plain(&self) -> Option<&str> {
        self.0.get(Self::PLAIN).map(String::as_str)
    }
}

/// The exception a cell raised. Its fields are in the order their names sort
/// (`name`, `traceback`, `value`): the order it has always been written in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelException {
    /// The exception's class name.
    pub name: String,
    /// The formatted traceback.
    pub traceback: String,
    /// `str()` of the exception.
    pub value: String,
}
