//! What the daemon tells the sandbox helper, and what the helper reports back.
//!
//! The daemon (multi-threaded, async) never forks. It starts its own binary as a
//! single-threaded slot process (`sandboxd __sandbox`) and sends it a [`Prepare`];
//! the slot joins its cgroup and answers [`Event::Ready`]. For each run, the daemon
//! hands the slot a control socket and the output pipes; the slot forks a helper,
//! which reads one [`SandboxSpec`] as a JSON line and sends [`Event`]s back.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The uid and gid the sandboxed program runs as, inside its user namespace.
pub const SANDBOX_UID: u32 = 1000;
pub const SANDBOX_GID: u32 = 1000;

/// Everything the helper needs to build one sandbox and run one program in it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The unpacked rootfs, mounted read-only as `/`.
    pub rootfs: PathBuf,
    /// The session workspace, mounted read-write at `/mnt/data`. `None` for a pooled
    /// sandbox: its program starts with a socket as stdin, and the workspace is
    /// attached later, when a run takes the sandbox ([`Attach`]).
    pub workspace: Option<PathBuf>,
    /// Program and arguments; `argv[0]` is an absolute path inside the rootfs.
    pub argv: Vec<String>,
    /// The whole environment of the program (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// Bytes the program reads on stdin; `None` gives it `/dev/null`.
    pub stdin: Option<String>,
    /// Host uid/gid that the sandbox uid/gid map to.
    pub host_uid: u32,
    pub host_gid: u32,
    pub tmp_size_bytes: u64,
    pub shm_size_bytes: u64,
    pub rlimits: Rlimits,
    pub hostname: String,
    /// The program is a pooled template interpreter ([`super::template`]): it gets
    /// neither the seccomp filter nor Landlock, which each of its forks applies to
    /// itself once it is in its own namespaces. It never runs user code.
    #[serde(default)]
    pub template: bool,
}

/// What a fork of a template needs to become a sandbox of its own; sent to the
/// template with each run, and handed by it to `sandboxd_enter`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildSpec {
    pub tmp_size_bytes: u64,
    pub shm_size_bytes: u64,
    pub rlimits: Rlimits,
}

/// Sent to the helper of a pooled sandbox after [`Event::Started`]: mount this
/// workspace at `/mnt/data`, its files owned by `owner` on disk appearing as the
/// sandbox user's (an idmapped mount). The helper answers [`Event::Attached`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attach {
    /// Host pid of a process whose mount namespace gets the workspace: a template's
    /// fork. `None`: the sandbox's own.
    #[serde(default)]
    pub pid: Option<i32>,
    pub workspace: PathBuf,
    /// The host uid/gid that owns the workspace's files (the session's).
    pub owner_uid: u32,
    pub owner_gid: u32,
}

/// The first message: get ready for a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Prepare {
    /// `cgroup.procs` files the slot joins, once; its helpers are born there.
    pub cgroup_procs: Vec<PathBuf>,
    /// The daemon's pid: the slot exits at once if its parent is already gone.
    pub daemon_pid: u32,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Rlimits {
    /// Largest file the program may write (RLIMIT_FSIZE), bytes.
    pub file_size_bytes: u64,
    /// Open files (RLIMIT_NOFILE).
    pub open_files: u64,
}

/// A message from the helper to the daemon, one JSON object per line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The slot is in its cgroup and waits for runs.
    Ready,
    /// The run's helper process exists; `pid` is its host pid.
    HelperStarted { pid: i32 },
    /// The sandbox's init process exists; `init_pid` is its host pid.
    Started { init_pid: i32 },
    /// The workspace of a pooled sandbox is mounted.
    Attached,
    /// A degraded protection, e.g. Landlock not fully enforced on an old kernel.
    Warning { message: String },
    /// The program ended by itself.
    Exited { code: i32 },
    /// The program was killed by a signal.
    Signaled { signal: i32 },
    /// The sandbox's init was killed (by the daemon at a timeout, or the OOM killer)
    /// before the program's status could be reported.
    InitKilled { signal: i32 },
    /// Building the sandbox failed before the program ran.
    SetupFailed { step: String, error: String },
}
