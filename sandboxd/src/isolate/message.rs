//! Every message between the daemon and the processes it starts, channel by
//! channel. The bytes on each wire are fixed: the Python side
//! (`rootfs/support/sandboxd_runner.py`, `kernel.py`) and the in-sandbox processes
//! of this binary speak exactly these. Everything is read bounded and parsed
//! strictly ([`super::channel`]); a line that is not one of a channel's messages
//! is an [`Error::Malformed`], never a panic.
//!
//! | channel | carrier | daemon → peer | peer → daemon |
//! |---|---|---|---|
//! | slot | SOCK_SEQPACKET, one datagram each | [`Prepare`], then per run `r` + [`HelperFds`] | [`SlotReply`] |
//! | helper control | stream socket, JSON lines | one [`SandboxSpec`], then [`Attach`]es | [`Event`]s |
//! | init report | pipe, text lines | — | [`InitLine`] (init → helper, or → a fork's outer process) |
//! | template | the template's stdin socket, JSON lines | [`ForkRequest`] + [`ForkFds`] | [`TemplateMessage`] |
//! | a pooled run's socket | stream socket, JSON lines | [`RunCode`] | [`ForkMessage`], then [`RunClaim`] |
//! | a pooled run's report | pipe, JSON lines | — | [`Report`] (from the fork's outer process) |
//! | `sandboxd_enter` | a C argument | [`ChildSpec`] as JSON (the `spec` of a [`ForkRequest`]) | — |
//! | kernel | the kernel's stdin socket | [`kernel_source`], then [`KernelCell`] lines | [`KernelMessage`] lines |

pub use super::channel::Error;
pub use super::spec::{ChildSpec, SandboxSpec};
use serde::{Deserialize, Serialize};
use std::os::fd::BorrowedFd;
use std::path::PathBuf;

/// A step of building a sandbox that failed, with its cause, in the in-sandbox
/// processes (slot, helper, init, a template's fork); reported as
/// [`SlotReply::SetupFailed`], [`InitLine::Failed`], [`Event::SetupFailed`] or
/// [`Report::Failed`].
#[derive(Debug)]
pub struct Failure {
    pub step: &'static str,
    pub error: String,
}

impl Failure {
    pub fn at<E: std::fmt::Display>(step: &'static str) -> impl FnOnce(E) -> Failure {
        move |e| Failure { step, error: e.to_string() }
    }

    pub fn line(&self) -> InitLine {
        InitLine::Failed { step: self.step.into(), error: self.error.clone() }
    }
}

// ---- slot ----------------------------------------------------------------------

/// The slot's first datagram: get ready for runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepare {
    /// `cgroup.procs` files the slot joins, once; its helpers are born there.
    pub cgroup_procs: Vec<PathBuf>,
    /// The daemon's pid: the slot exits at once if its parent is already gone.
    pub daemon_pid: u32,
}

/// The slot's answer to [`Prepare`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum SlotReply {
    /// The slot is in its cgroup and waits for runs.
    Ready,
    /// It could not join its cgroup (it then exits).
    SetupFailed { step: String, error: String },
}

/// The byte each run's datagram to a slot carries (its fds are what matter).
pub const RUN_BYTE: &[u8] = b"r";

/// The fds of one run, handed to a slot (SCM_RIGHTS, in this order): the helper's
/// control socket, the run's stdout and stderr pipes, and for a pooled or kernel
/// sandbox the program's stdin socket.
pub struct HelperFds<'a> {
    pub control: BorrowedFd<'a>,
    pub stdout: BorrowedFd<'a>,
    pub stderr: BorrowedFd<'a>,
    pub stdin: Option<BorrowedFd<'a>>,
}

impl<'a> HelperFds<'a> {
    pub fn to_vec(&self) -> Vec<BorrowedFd<'a>> {
        let mut fds = vec![self.control, self.stdout, self.stderr];
        fds.extend(self.stdin);
        fds
    }
}

// ---- helper control --------------------------------------------------------------

/// Sent to the helper of a pooled sandbox after [`Event::Started`]: mount this
/// workspace at `/mnt/data`, its files owned by `owner` on disk appearing as the
/// sandbox user's (an idmapped mount). The helper answers [`Event::Attached`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// A message from the helper to the daemon, one JSON object per line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
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

// ---- init report -------------------------------------------------------------------

/// A line the sandbox's init (or its program's process, before exec) writes on its
/// report pipe: `W msg` (warning), `F step<TAB>msg` (setup failed), `X code`
/// (exited), `S signal` (killed by a signal). Texts never hold a newline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitLine {
    Warning(String),
    Failed { step: String, error: String },
    Exited(i32),
    Signaled(i32),
}

impl InitLine {
    /// The line, with its `'\n'`; newlines inside the texts become spaces.
    pub fn encode(&self) -> String {
        let one = |s: &str| s.replace('\n', " ");
        match self {
            InitLine::Warning(m) => format!("W {}\n", one(m)),
            InitLine::Failed { step, error } => format!("F {}\t{}\n", one(step).replace('\t', " "), one(error)),
            InitLine::Exited(code) => format!("X {code}\n"),
            InitLine::Signaled(sig) => format!("S {sig}\n"),
        }
    }

    /// One line, without its `'\n'`. A failure without a step is the sandbox's.
    pub fn parse(line: &str) -> Result<InitLine, Error> {
        let bad = |reason: &str| Error::Malformed {
            reason: reason.into(),
            excerpt: super::channel::excerpt(line.as_bytes()),
        };
        let (kind, rest) = line.split_at_checked(1).ok_or_else(|| bad("an empty report line"))?;
        let rest = rest.trim_start();
        match kind {
            "W" => Ok(InitLine::Warning(rest.into())),
            "X" => rest.parse().map(InitLine::Exited).map_err(|_| bad("an exit code that is not a number")),
            "S" => rest.parse().map(InitLine::Signaled).map_err(|_| bad("a signal that is not a number")),
            "F" => {
                let (step, error) = rest.split_once('\t').unwrap_or(("sandbox", rest));
                Ok(InitLine::Failed { step: step.into(), error: error.into() })
            }
            _ => Err(bad("an unknown report kind")),
        }
    }

    /// The helper's [`Event`] for this line.
    pub fn into_event(self) -> Event {
        match self {
            InitLine::Warning(message) => Event::Warning { message },
            InitLine::Failed { step, error } => Event::SetupFailed { step, error },
            InitLine::Exited(code) => Event::Exited { code },
            InitLine::Signaled(signal) => Event::Signaled { signal },
        }
    }
}

// ---- template ------------------------------------------------------------------------

/// What a template says on its stdin socket (it runs no user code; still read
/// bounded and strictly).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TemplateMessage {
    /// The preload modules are imported (those in `failed` could not be).
    Ready { failed: Vec<String> },
    /// A run's fork (this pid in the template's namespace) is gone.
    Reaped(i32),
}

/// Sent to a template, with [`ForkFds`]: fork once for a run; the fork hands
/// `spec` to `sandboxd_enter` (`{"spec": {...}}`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    pub spec: ChildSpec,
}

/// The five fds of a [`ForkRequest`] (SCM_RIGHTS, in this order).
pub struct ForkFds<'a> {
    /// `libsandboxd.so`, which the template loads once for `sandboxd_enter`.
    pub library: BorrowedFd<'a>,
    pub stdout: BorrowedFd<'a>,
    pub stderr: BorrowedFd<'a>,
    /// The run's socket ([`ForkMessage`], [`RunCode`], [`RunClaim`]).
    pub socket: BorrowedFd<'a>,
    /// The run's report channel ([`Report`]).
    pub report: BorrowedFd<'a>,
}

impl<'a> ForkFds<'a> {
    pub fn to_vec(&self) -> Vec<BorrowedFd<'a>> {
        vec![self.library, self.stdout, self.stderr, self.socket, self.report]
    }
}

// ---- a pooled run's socket -------------------------------------------------------

/// What a run's process says on the run's socket before it gets its code: it is in
/// its own sandbox, locked down, and waits. The user's code has not run yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForkMessage {
    Entered(bool),
}

/// A run's code, sent on its socket once the fork said [`ForkMessage::Entered`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunCode<'a> {
    pub code: &'a str,
    pub run_id: &'a str,
    pub autosave: bool,
}

/// What a run's process may say on the run's socket once it has its code: the exit
/// code it is about to leave with, after closing its output. The user's code shares
/// the socket, so this is a claim (see [`crate::pool`] for what it can decide).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunClaim {
    ExitCode(u8),
}

// ---- a pooled run's report ---------------------------------------------------------

/// How a run ended, from its outer process on the report channel, which no
/// process of the run holds: trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Report {
    /// The run's process exited with this code.
    ExitCode(i32),
    /// The run's process (or its init) was killed by this signal.
    Signal(i32),
    /// The sandbox could not be made; the run's process never got to run anything.
    Failed { step: String, error: String },
}

// ---- kernel ---------------------------------------------------------------------------

/// The first bytes on a kernel's socket: kernel.py's source, after its length in
/// 10 decimal digits (the bootstrap reads exactly that much).
pub fn kernel_source(source: &str) -> Vec<u8> {
    let mut bytes = format!("{:010}", source.len()).into_bytes();
    bytes.extend_from_slice(source.as_bytes());
    bytes
}

/// One cell, as the daemon sends it to a kernel, with the nonce that tags its
/// answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelCell<'a> {
    pub code: &'a str,
    pub run_id: &'a str,
    pub autosave: bool,
    /// Bytes of each stream the kernel keeps (the daemon keeps no more either).
    pub output_limit: usize,
    pub nonce: &'a str,
}

/// What a kernel (or the user's code in its process) may write, one per line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum KernelMessage {
    /// kernel.py is running and serves cells.
    Ready {},
    /// Output of the cell with `nonce`, as it was produced.
    Chunk { nonce: String, stream: Stream, text: String },
    /// The cell with `nonce` is over. Its output came as chunks before.
    Reply {
        nonce: String,
        result: Option<Rich>,
        exception: Option<Exception>,
        exit_code: u8,
        /// The kernel dropped output past the limit.
        stdout_truncated: bool,
        stderr_truncated: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A final expression's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rich {
    #[serde(rename = "text/plain")]
    pub plain: String,
    #[serde(rename = "text/html", default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
}

/// An exception a cell raised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exception {
    pub name: String,
    pub value: String,
    pub traceback: String,
}
