//! Every message between the daemon and the processes it starts, channel by
//! channel. The bytes on each wire are fixed: the Python side
//! (`rootfs/support/sandboxd_runner.py`, `kernel.py`) and the in-sandbox processes
//! of this binary speak exactly these. Everything is read bounded and parsed
//! strictly ([`super::channel`]); a line that is not one of a channel's messages
//! is an [`Error::Malformed`], never a panic. How a program ended is one type,
//! [`Exit`], on every channel that says it. This table and the "Channels and their
//! messages" section of `ARCHITECTURE.md` (at the repository's root) describe the
//! same protocol, each from its side: change both.
//!
//! | channel | carrier | daemon → peer | peer → daemon |
//! |---|---|---|---|
//! | slot | SOCK_SEQPACKET, one datagram each | [`Prepare`], then per run `r` + [`HelperFds`] | [`SlotReply`] |
//! | helper control | stream socket, JSON lines | one [`SandboxSpec`], then [`HelperRequest`]s | [`Event`]s (`started` and `furnished` with the egress listener attached, SCM_RIGHTS, when they say `"listener":true`) |
//! | init report | pipe, JSON lines | — | [`InitLine`] (init → helper, or → a fork's outer process) |
//! | template | the template's stdin socket, JSON lines | [`ForkRequest`] + [`ForkFds`] | [`TemplateMessage`] |
//! | a pooled run's socket | stream socket, JSON lines | [`ForkReply`], then [`RunCode`] | [`ForkMessage`]s, then [`RunClaim`] |
//! | a pooled run's report | pipe, JSON lines | — | [`Report`] (from the fork's outer process) |
//! | `sandboxd_enter` | a C argument | [`ChildSpec`] as JSON (the `spec` of a [`ForkRequest`]) | — |
//! | kernel | the kernel's stdin socket | [`kernel_source`], then [`KernelCell`] lines | [`KernelMessage`] lines |

pub use super::channel::Error;
pub use super::spec::{ChildSpec, SandboxSpec};
use serde::{Deserialize, Serialize};
#[cfg(test)]
use std::os::fd::AsFd;
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

    /// Write this failure as an [`InitLine`], through a fixed buffer
    /// ([`InitLine::write`]): nothing is allocated.
    pub fn write(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        Wire::Failed { step: self.step, error: &self.error }.write(out)
    }
}

// ---- how a program ended ---------------------------------------------------------

/// How a program ended, as the process that reaped it saw it: the one form on
/// every channel that says it ([`InitLine::Ended`], [`Event::Ended`],
/// [`Report::Ended`]): `{"exited":3}` or `{"signaled":9}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Exit {
    /// It exited with this code.
    Exited(i32),
    /// This signal killed it.
    Signaled(i32),
}

impl Exit {
    /// Killed by SIGKILL: how a run the daemon killed ended.
    pub const KILLED: Exit = Exit::Signaled(libc::SIGKILL);

    /// The exit code, when it exited.
    pub fn code(self) -> Option<i32> {
        match self {
            Exit::Exited(code) => Some(code),
            Exit::Signaled(_) => None,
        }
    }

    /// The signal that killed it, when one did.
    pub fn signal(self) -> Option<i32> {
        match self {
            Exit::Exited(_) => None,
            Exit::Signaled(signal) => Some(signal),
        }
    }

    /// How the process of a wait status ended; `None` when it has not ended (a
    /// stopped or continued process, or none).
    pub fn of(status: nix::sys::wait::WaitStatus) -> Option<Exit> {
        match status {
            nix::sys::wait::WaitStatus::Exited(_, code) => Some(Exit::Exited(code)),
            nix::sys::wait::WaitStatus::Signaled(_, signal, _) => Some(Exit::Signaled(signal as i32)),
            _ => None,
        }
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

/// What the daemon asks of a pooled sandbox's helper after [`Event::Started`],
/// one at a time, each answered by one [`Event`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum HelperRequest {
    /// Mount a template fork's own `/tmp` and `/dev/shm`, and mask `/proc`'s
    /// directories, in the mount namespace of `pid` (the fork's outer process),
    /// before it is sent any code. Answered by [`Event::Furnished`].
    Furnish { pid: i32 },
    /// Answered by [`Event::Attached`].
    Attach(Attach),
}

/// Mount this workspace at `/mnt/data` (and the session's package layer, if it has
/// one, at `/opt/packages`), their files owned by `owner` on disk appearing as the
/// sandbox user's (idmapped mounts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attach {
    /// Host pid of a process whose mount namespace gets the workspace: a template's
    /// fork. `None`: the sandbox's own.
    #[serde(default)]
    pub pid: Option<i32>,
    pub workspace: PathBuf,
    /// The session's package layer (a host directory), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages: Option<PathBuf>,
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
    /// The sandbox's init process exists; `init_pid` is its host pid. `listener`:
    /// the egress listener ([`super::netns`]) is attached to this line.
    Started {
        init_pid: i32,
        #[serde(default, skip_serializing_if = "is_false")]
        listener: bool,
    },
    /// The workspace of a pooled sandbox is mounted.
    Attached,
    /// A template fork's own `/tmp`, `/dev/shm` and `/proc` masks are mounted;
    /// `listener`: the fork's egress listener is attached to this line.
    Furnished {
        #[serde(default, skip_serializing_if = "is_false")]
        listener: bool,
    },
    /// A degraded protection, e.g. Landlock not fully enforced on an old kernel.
    Warning { message: String },
    /// The program ended, as the init reaped it.
    Ended { exit: Exit },
    /// The sandbox's init was killed (by the daemon at a timeout, or the OOM killer)
    /// before the program's status could be reported.
    InitKilled { signal: i32 },
    /// Building the sandbox failed before the program ran.
    SetupFailed { step: String, error: String },
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Event {
    /// Whether an fd (the egress listener) travels with this line.
    pub fn carries_listener(&self) -> bool {
        matches!(self, Event::Started { listener: true, .. } | Event::Furnished { listener: true })
    }

    /// Its tag on the wire, for errors and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Event::HelperStarted { .. } => "helper_started",
            Event::Started { .. } => "started",
            Event::Attached => "attached",
            Event::Furnished { .. } => "furnished",
            Event::Warning { .. } => "warning",
            Event::Ended { .. } => "ended",
            Event::InitKilled { .. } => "init_killed",
            Event::SetupFailed { .. } => "setup_failed",
        }
    }
}

// ---- init report -------------------------------------------------------------------

/// A line the sandbox's init (or its program's process, before exec) writes on its
/// report pipe, as JSON: `{"warning":"..."}`, `{"failed":{"step":"...","error":"..."}}`
/// (setting up failed), `{"ended":{"exited":3}}` or `{"ended":{"signaled":9}}` (how
/// the program ended, [`Exit`]). Written through a fixed buffer ([`InitLine::write`]),
/// read bounded and strictly ([`super::init::read_report`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum InitLine {
    Warning(String),
    Failed { step: String, error: String },
    Ended(Exit),
}

/// The most bytes an [`InitLine`] takes on its pipe, its `'\n'` included: one
/// pipe buffer's atomic write (`PIPE_BUF`), and below what a reader accepts
/// ([`REPORT_LINE`]). Longer texts are cut to fit.
pub const INIT_LINE_MAX: usize = 4096;
/// Longest line of a report ([`InitLine`]) a reader takes (`init::read_report`):
/// more than a writer makes ([`INIT_LINE_MAX`]).
pub const REPORT_LINE: usize = 16 * 1024;
const _: () = assert!(INIT_LINE_MAX <= REPORT_LINE && INIT_LINE_MAX <= libc::PIPE_BUF);
/// The most bytes a failure's step takes, escaped, in an [`InitLine`].
const STEP_MAX: usize = 256;

/// [`InitLine`] with borrowed texts: what the init and a fork encode, into a fixed
/// buffer, so that writing a line allocates nothing. Its bytes are [`InitLine`]'s
/// (a test pins both).
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum Wire<'a> {
    Warning(&'a str),
    Failed { step: &'a str, error: &'a str },
    Ended(Exit),
}

impl Wire<'_> {
    /// Encode into a buffer on the stack, the texts cut to fit it, and write it in
    /// one `write_all` (at most [`INIT_LINE_MAX`] bytes: atomic on a pipe).
    fn write(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let mut buf = [0u8; INIT_LINE_MAX];
        let n = self.encode_into(&mut buf);
        out.write_all(&buf[..n])
    }

    /// The line, with its `'\n'`, in `buf`; its length. The texts are cut (on a
    /// character boundary) so that, escaped at the most (6 bytes a control
    /// character), the line fits: serializing never runs out of room, and so never
    /// allocates an error.
    fn encode_into(&self, buf: &mut [u8; INIT_LINE_MAX]) -> usize {
        // Room for the keys, quotes and braces of the longest form, and the '\n'.
        const FRAME: usize = 64;
        let cut = match *self {
            Wire::Warning(m) => Wire::Warning(fit(m, INIT_LINE_MAX - FRAME)),
            Wire::Failed { step, error } => {
                Wire::Failed { step: fit(step, STEP_MAX), error: fit(error, INIT_LINE_MAX - FRAME - STEP_MAX) }
            }
            Wire::Ended(exit) => Wire::Ended(exit),
        };
        let mut rest = &mut buf[..INIT_LINE_MAX - 1];
        // Cannot fail: the texts were cut to fit, and integers take at most 11 bytes.
        let _ = serde_json::to_writer(&mut rest, &cut);
        let n = INIT_LINE_MAX - 1 - rest.len();
        buf[n] = b'\n';
        n + 1
    }
}

/// The longest prefix of `text`, cut on a character boundary, whose JSON string
/// form takes at most `room` bytes however it is escaped.
fn fit(text: &str, room: usize) -> &str {
    let mut used = 0;
    for (i, c) in text.char_indices() {
        used += match c {
            '"' | '\\' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        };
        if used > room {
            return &text[..i];
        }
    }
    text
}

impl InitLine {
    /// Write the line on `out` (the init's report pipe, or the program's set-up
    /// pipe) without allocating: it is encoded into a fixed buffer on the stack, its
    /// texts cut to fit [`INIT_LINE_MAX`].
    pub fn write(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        match self {
            InitLine::Warning(m) => Wire::Warning(m),
            InitLine::Failed { step, error } => Wire::Failed { step, error },
            InitLine::Ended(exit) => Wire::Ended(*exit),
        }
        .write(out)
    }

    /// The line as [`InitLine::write`] writes it, with its `'\n'`.
    #[cfg(test)]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![];
        let _ = self.write(&mut out);
        out
    }

    /// The helper's [`Event`] for this line.
    pub fn into_event(self) -> Event {
        match self {
            InitLine::Warning(message) => Event::Warning { message },
            InitLine::Failed { step, error } => Event::SetupFailed { step, error },
            InitLine::Ended(exit) => Event::Ended { exit },
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

/// What a run's process says on the run's socket before it gets its code, in this
/// order: from `sandboxd_enter`, that it is in its own namespaces and waits for its
/// own `/tmp`, `/dev/shm` and `/proc` masks (answered by [`ForkReply::Furnished`],
/// before Landlock, whose rules name those mounts); from the runner, that it is
/// in its own sandbox, locked down, and waits. The user's code has not run yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForkMessage {
    Furnish(bool),
    Entered(bool),
}

/// The daemon's answer to [`ForkMessage::Furnish`], on the run's socket: the fork's
/// own filesystems are mounted (by the template's helper, from outside).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForkReply {
    Furnished(bool),
}

/// A run's code, sent on its socket once the fork said [`ForkMessage::Entered`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunCode<'a> {
    pub code: &'a str,
    pub run_id: &'a str,
    pub autosave: bool,
    /// Variables the run's environment gains (its session's: the secrets'
    /// placeholders): the template started before the run's session was known.
    pub env: &'a std::collections::BTreeMap<String, String>,
    /// `code` is kernel.py: the fork becomes a kernel session's kernel, its socket
    /// the kernel's channel ([`crate::kernel`]); no [`RunClaim`] follows. Not sent
    /// when false: a run's message is as before.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub kernel: bool,
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
    /// How the run's process ended (killed by a signal: it, or its init).
    Ended(Exit),
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
    /// Variables the kernel's environment takes before the cell (its session's
    /// secrets' placeholders, which may change between cells).
    pub env: &'a std::collections::BTreeMap<String, String>,
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

/// One of a program's two output streams: in a kernel's [`KernelMessage::Chunk`],
/// and in the daemon wherever output is kept or streamed ([`super::output`]).
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

#[cfg(test)]
mod tests;
