//! What `GET /v1/health` answers: the daemon's status, what is degraded, and its
//! counters.

use serde::Serialize;
use std::collections::HashMap;

/// The health report. Every field but `status` and `version` is left out for a
/// caller without a known token when the daemon has tokens (over HTTP): they
/// show the host (cgroup paths, the rootfs) and every tenant's counts.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok`, or `degraded` when `problems` lists something; `draining` while the
    /// daemon stops (every other route answers 503 `unavailable` then).
    #[schema(example = "ok")]
    pub status: &'static str,
    pub version: &'static str,
    /// What is degraded now and what to do (empty when `ok`); see [`crate::health`].
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub problems: Option<Vec<Problem>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub rootfs_sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub cgroup: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub landlock_abi: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub sessions: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub busy_sessions: Option<usize>,
    /// Template interpreters for one-shot Python runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub pool: Option<PoolStats>,
    /// The sessions' workspaces and the state directory's disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub storage: Option<StorageStats>,
}

impl Health {
    /// What anyone may see: the status and the version, nothing else.
    pub fn short(status: &'static str, version: &'static str) -> Self {
        Health {
            status,
            version,
            problems: None,
            rootfs_sha256: None,
            cgroup: None,
            landlock_abi: None,
            sessions: None,
            busy_sessions: None,
            pool: None,
            storage: None,
        }
    }
}

/// The sessions' workspaces and the state directory's disk, for `GET /v1/health`.
#[derive(Debug, Clone, Serialize, Default, utoipa::ToSchema)]
pub struct StorageStats {
    /// Sessions whose workspace is mounted now. A session's workspace is made at
    /// its first use and unmounted once it has been idle for
    /// `workspace_idle_unmount_s`; it is mounted again at its next use.
    pub workspaces_mounted: usize,
    /// How many times the free room of the state directory's filesystem the
    /// sessions' images (workspaces, package layers) may add up to, each counted
    /// full (`workspace_overcommit`; 1: each reserved whole).
    pub workspace_overcommit: f64,
    /// Bytes free on the state directory's filesystem; absent when it cannot say.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub free_bytes: Option<u64>,
    /// Bytes the sessions held could still write, their images filled up (with
    /// their run records' room): a new session is refused (507) when this and its
    /// own would pass `free_bytes` × `workspace_overcommit`.
    pub held_bytes: u64,
    /// The most a mounted workspace (or package layer) may write now, when the
    /// host disk is nearly full and its free room is shared among them: a
    /// session past its share gets `ENOSPC` and a run result with
    /// `usage.disk_full` = `host`. Absent while each may fill its own size.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub disk_share_bytes: Option<u64>,
}

/// One thing that is degraded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// `rootfs`, `cgroups`, `pool`, or `host: <check item>`.
    pub name: String,
    /// What is wrong now.
    pub found: String,
    /// What to do.
    pub fix: String,
}

/// Counters and sizes, for `GET /v1/health`.
#[derive(Debug, Clone, Serialize, Default, utoipa::ToSchema)]
#[schema(as = Stats)]
pub struct PoolStats {
    /// Template interpreters kept at least per policy in use (0: the pool is off);
    /// each serves one run at a time.
    pub size_per_policy: usize,
    /// Templates idle now, all policies.
    pub ready: usize,
    /// Idle templates per policy.
    pub ready_by_policy: HashMap<String, usize>,
    /// Templates serving a run now.
    pub busy: usize,
    /// Runs served by a fork of a template.
    pub hits: u64,
    /// Python runs that found no idle template and used a cold sandbox.
    pub misses: u64,
    /// Templates that failed to start or to fork, or died idle.
    pub failures: u64,
    /// Memory held by the idle templates, bytes.
    pub memory_bytes: u64,
    /// Templates held now, idle and serving runs, all policies: `size_per_policy`
    /// for each policy in use, more while demand asks (the pool shrinks back as it
    /// falls off).
    pub templates: usize,
    /// Runs waiting now for a template to come back from its run.
    pub waiting: usize,
    /// What the pool's templates may hold together, bytes (`--pool-memory-mb`):
    /// no template is started past it.
    pub memory_budget_bytes: u64,
    /// What the pool counts its templates as holding against the budget, bytes:
    /// each at its policy's measured idle footprint.
    pub memory_held_bytes: u64,
    /// Templates that left the pool for kernel sessions' kernels, alive now (at most
    /// 64): not among `templates`, nor counted against the budget; each is its
    /// kernel's, within its session's policy limits.
    pub kernel_templates: usize,
}
