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
//! | helper control | stream socket, JSON lines | one [`SandboxSpec`], then [`HelperRequest`]s | [`Event`]s |
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

/// Mount this workspace at `/mnt/data`, its files owned by `owner` on disk
/// appearing as the sandbox user's (an idmapped mount).
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
    /// A template fork's own `/tmp`, `/dev/shm` and `/proc` masks are mounted.
    Furnished,
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

impl Event {
    /// Its tag on the wire, for errors and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Event::HelperStarted { .. } => "helper_started",
            Event::Started { .. } => "started",
            Event::Attached => "attached",
            Event::Furnished => "furnished",
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
/// ([`super::init::REPORT_LINE`]). Longer texts are cut to fit.
pub const INIT_LINE_MAX: usize = 4096;
const _: () = assert!(INIT_LINE_MAX <= super::init::REPORT_LINE && INIT_LINE_MAX <= libc::PIPE_BUF);
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
mod tests {
    use super::super::channel::{encode, parse, Channel};
    use super::super::spec::Rlimits;
    use super::*;

    fn child() -> ChildSpec {
        ChildSpec {
            rlimits: Rlimits { file_size_bytes: 3, open_files: 4 },
            seccomp: crate::isolate::seccomp::Program::allow_all(),
        }
    }

    /// `msg` encodes to exactly `wire` (plus the newline) and `wire` parses back.
    fn exact<T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(wire: &str, msg: T) {
        assert_eq!(encode(&msg).unwrap(), format!("{wire}\n").into_bytes());
        assert_eq!(parse::<T>(wire.as_bytes()).unwrap(), msg);
    }

    #[test]
    fn slot_messages_keep_their_wire_form() {
        exact(
            r#"{"cgroup_procs":["/c/cgroup.procs"],"daemon_pid":7}"#,
            Prepare { cgroup_procs: vec!["/c/cgroup.procs".into()], daemon_pid: 7 },
        );
        exact(r#"{"event":"ready"}"#, SlotReply::Ready);
        exact(
            r#"{"event":"setup_failed","step":"s","error":"e"}"#,
            SlotReply::SetupFailed { step: "s".into(), error: "e".into() },
        );
        assert_eq!(RUN_BYTE, b"r");
    }

    #[test]
    fn helper_messages_keep_their_wire_form() {
        exact(r#"{"event":"helper_started","pid":3}"#, Event::HelperStarted { pid: 3 });
        exact(r#"{"event":"started","init_pid":4}"#, Event::Started { init_pid: 4 });
        exact(r#"{"event":"attached"}"#, Event::Attached);
        exact(r#"{"event":"warning","message":"w"}"#, Event::Warning { message: "w".into() });
        exact(r#"{"event":"ended","exit":{"exited":-1}}"#, Event::Ended { exit: Exit::Exited(-1) });
        exact(r#"{"event":"ended","exit":{"signaled":9}}"#, Event::Ended { exit: Exit::Signaled(9) });
        exact(r#"{"event":"init_killed","signal":9}"#, Event::InitKilled { signal: 9 });
        exact(
            r#"{"event":"setup_failed","step":"mounts","error":"x"}"#,
            Event::SetupFailed { step: "mounts".into(), error: "x".into() },
        );
        exact(r#"{"event":"furnished"}"#, Event::Furnished);
        // Each event's name is its tag.
        for e in [
            Event::HelperStarted { pid: 1 },
            Event::Started { init_pid: 1 },
            Event::Attached,
            Event::Furnished,
            Event::Warning { message: "w".into() },
            Event::Ended { exit: Exit::KILLED },
            Event::InitKilled { signal: 9 },
            Event::SetupFailed { step: "s".into(), error: "e".into() },
        ] {
            let wire = serde_json::to_value(&e).unwrap();
            assert_eq!(wire["event"], e.name());
        }
        exact(
            r#"{"op":"attach","pid":12,"workspace":"/w","owner_uid":5,"owner_gid":6}"#,
            HelperRequest::Attach(Attach { pid: Some(12), workspace: "/w".into(), owner_uid: 5, owner_gid: 6 }),
        );
        exact(r#"{"op":"furnish","pid":12}"#, HelperRequest::Furnish { pid: 12 });
        // A pid may be left out: the sandbox's own mount namespace.
        let a: HelperRequest = parse(br#"{"op":"attach","workspace":"/w","owner_uid":5,"owner_gid":6}"#).unwrap();
        assert!(matches!(a, HelperRequest::Attach(Attach { pid: None, .. })));
        for bad in [&br#"{"workspace":"/w","owner_uid":5,"owner_gid":6}"#[..], br#"{"op":"furnish"}"#, br#"{"op":"x"}"#]
        {
            assert!(parse::<HelperRequest>(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        for bad in [&br#"{"event":"ready"}"#[..], br#"{"event":"nope"}"#, br#"{"started":1}"#, b"{", b""] {
            assert!(parse::<Event>(bad).unwrap_err().is_violation(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn an_exit_has_one_wire_form_on_every_channel() {
        exact(r#"{"exited":3}"#, Exit::Exited(3));
        exact(r#"{"exited":-1}"#, Exit::Exited(-1));
        exact(r#"{"signaled":9}"#, Exit::Signaled(9));
        assert_eq!(Exit::KILLED, Exit::Signaled(libc::SIGKILL));
        assert_eq!((Exit::Exited(3).code(), Exit::Exited(3).signal()), (Some(3), None));
        assert_eq!((Exit::Signaled(11).code(), Exit::Signaled(11).signal()), (None, Some(11)));
        use nix::sys::wait::WaitStatus;
        let pid = nix::unistd::Pid::from_raw(2);
        assert_eq!(Exit::of(WaitStatus::Exited(pid, 70)), Some(Exit::Exited(70)));
        assert_eq!(Exit::of(WaitStatus::Signaled(pid, nix::sys::signal::SIGSEGV, true)), Some(Exit::Signaled(11)));
        assert_eq!(Exit::of(WaitStatus::StillAlive), None);
        for bad in [
            &br#"{"exited":3,"signaled":9}"#[..],
            br#"{"exited":"3"}"#,
            br#"{"exited":4294967296}"#,
            br#"{"killed":9}"#,
            br#""exited""#,
            br#"{"code":3}"#,
        ] {
            assert!(parse::<Exit>(bad).unwrap_err().is_violation(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn init_lines_keep_their_wire_form_and_are_written_through_a_fixed_buffer() {
        for (wire, msg) in [
            (r#"{"ended":{"exited":3}}"#, InitLine::Ended(Exit::Exited(3))),
            (r#"{"ended":{"signaled":9}}"#, InitLine::Ended(Exit::Signaled(9))),
            (r#"{"warning":"careful"}"#, InitLine::Warning("careful".into())),
            (
                r#"{"failed":{"step":"mounts","error":"bind /x: EPERM"}}"#,
                InitLine::Failed { step: "mounts".into(), error: "bind /x: EPERM".into() },
            ),
        ] {
            exact(wire, msg.clone());
            // What the init writes (a fixed buffer) is what serde makes of the line.
            assert_eq!(msg.encode(), format!("{wire}\n").into_bytes());
        }
        let f = Failure { step: "exec", error: "a\nb\t\"c\"".into() };
        let mut written = vec![];
        f.write(&mut written).unwrap();
        assert_eq!(written, b"{\"failed\":{\"step\":\"exec\",\"error\":\"a\\nb\\t\\\"c\\\"\"}}\n");
        assert_eq!(written, f.line().encode());
        assert_eq!(parse::<InitLine>(&written[..written.len() - 1]).unwrap(), f.line());
        assert_eq!(InitLine::Ended(Exit::Exited(3)).into_event(), Event::Ended { exit: Exit::Exited(3) });
        assert_eq!(
            InitLine::Failed { step: "s".into(), error: "e".into() }.into_event(),
            Event::SetupFailed { step: "s".into(), error: "e".into() }
        );
        for bad in [
            &b""[..],
            b"X 3",
            b"W careful",
            br#"{"ended":{"exited":3},"warning":"x"}"#,
            br#"{"failed":{"step":"s"}}"#,
            br#"{"failed":{"step":"s","error":"e","x":1}}"#,
            br#"{"ended":3}"#,
            br#"{"warning":null}"#,
            b"\xff",
        ] {
            assert!(parse::<InitLine>(bad).unwrap_err().is_violation(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_long_init_line_is_cut_to_fit_its_buffer_on_a_character_boundary() {
        // The worst case: every byte escaped to 6.
        for text in ["\u{1}".repeat(10_000), "é".repeat(10_000), "\"".repeat(10_000), "x".repeat(10_000)] {
            for msg in [InitLine::Warning(text.clone()), InitLine::Failed { step: text.clone(), error: text.clone() }] {
                let line = msg.encode();
                assert!(line.len() <= INIT_LINE_MAX && line.len() > INIT_LINE_MAX / 2, "{}", line.len());
                assert_eq!(line.last(), Some(&b'\n'));
                match parse::<InitLine>(&line[..line.len() - 1]).unwrap() {
                    InitLine::Warning(m) => assert!(text.starts_with(&m) && !m.is_empty()),
                    InitLine::Failed { step, error } => {
                        assert!(text.starts_with(&step) && text.starts_with(&error) && !error.is_empty());
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
        assert_eq!(fit("aé", 2), "a");
        assert_eq!(fit("aé", 3), "aé");
        assert_eq!(fit("\n\n", 11), "\n");
    }

    #[test]
    fn template_messages_are_what_the_runner_sends_and_reads() {
        // sandboxd_runner.py: json.dumps({"ready": {"failed": failed}}) and {"reaped": pid}.
        exact(r#"{"ready":{"failed":["nope"]}}"#, TemplateMessage::Ready { failed: vec!["nope".into()] });
        exact(r#"{"reaped":12}"#, TemplateMessage::Reaped(12));
        assert_eq!(
            parse::<TemplateMessage>(br#"{"ready": {"failed": []}}"#).unwrap(),
            TemplateMessage::Ready { failed: vec![] }
        );
        // The runner reads json.loads(data)["spec"] and hands it to sandboxd_enter.
        let req = encode(&ForkRequest { spec: child() }).unwrap();
        assert_eq!(
            String::from_utf8(req).unwrap(),
            "{\"spec\":{\"rlimits\":{\"file_size_bytes\":3,\"open_files\":4},\"seccomp\":\"BgAAAAAA/38=\"}}\n"
        );
        for bad in [&br#"{"reaped":"x"}"#[..], br#"{"ready":{}}"#, br#"{"forked":1}"#, b"null"] {
            assert!(parse::<TemplateMessage>(bad).unwrap_err().is_violation(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_pooled_runs_messages_are_what_the_runner_sends_and_reads() {
        // sandboxd_runner.py sends b'{"entered": true}\n', then
        // json.dumps({"exit_code": exit_code}); it reads msg["code"], ["run_id"], ["autosave"].
        assert_eq!(parse::<ForkMessage>(br#"{"entered": true}"#).unwrap(), ForkMessage::Entered(true));
        // Before it, sandboxd_enter asks for the fork's own filesystems, and is answered.
        exact(r#"{"furnish":true}"#, ForkMessage::Furnish(true));
        exact(r#"{"furnished":true}"#, ForkReply::Furnished(true));
        assert_eq!(parse::<RunClaim>(br#"{"exit_code": 255}"#).unwrap(), RunClaim::ExitCode(255));
        exact(r#"{"exit_code":0}"#, RunClaim::ExitCode(0));
        let code = RunCode { code: "print(1)\n", run_id: "r1", autosave: true };
        assert_eq!(encode(&code).unwrap(), b"{\"code\":\"print(1)\\n\",\"run_id\":\"r1\",\"autosave\":true}\n");
        exact(r#"{"ended":{"exited":-1}}"#, Report::Ended(Exit::Exited(-1)));
        exact(r#"{"ended":{"signaled":9}}"#, Report::Ended(Exit::Signaled(9)));
        for bad in [&br#"{"exit_code":0}"#[..], br#"{"signal":9}"#, br#"{"ended":{"exited":0},"failed":{}}"#] {
            assert!(parse::<Report>(bad).unwrap_err().is_violation(), "{}", String::from_utf8_lossy(bad));
        }
        exact(r#"{"failed":{"step":"s","error":"e"}}"#, Report::Failed { step: "s".into(), error: "e".into() });
        // What the user's code could write instead is none of the claims.
        for bad in [
            &br#"{"failed":{"step":"x","error":"evil"}}"#[..],
            br#"{"signal":9}"#,
            br#"{"ended":{"exited":0}}"#,
            br#"{"exit_code":256}"#,
            br#"{"exit_code":-1}"#,
            br#"{"exit_code":0,"signal":9}"#,
            br#"{"entered":true}"#,
        ] {
            assert!(parse::<RunClaim>(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        for bad in [&br#"{"failed":{"step":"x","error":"evil"}}"#[..], br#"{"entered":true,"x":1}"#, br#""entered""#] {
            assert!(parse::<ForkMessage>(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn kernel_messages_are_what_kernel_py_sends_and_reads() {
        // kernel.py: json.dumps(obj, ensure_ascii=False), with its default separators.
        assert_eq!(parse::<KernelMessage>(br#"{"kind": "ready"}"#).unwrap(), KernelMessage::Ready {});
        assert_eq!(
            parse::<KernelMessage>(
                "{\"kind\": \"chunk\", \"nonce\": \"n\", \"stream\": \"stdout\", \"text\": \"é\"}".as_bytes()
            )
            .unwrap(),
            KernelMessage::Chunk { nonce: "n".into(), stream: Stream::Stdout, text: "é".into() }
        );
        let cell = KernelCell { code: "1", run_id: "r", autosave: false, output_limit: 10, nonce: "n" };
        assert_eq!(
            encode(&cell).unwrap(),
            b"{\"code\":\"1\",\"run_id\":\"r\",\"autosave\":false,\"output_limit\":10,\"nonce\":\"n\"}\n"
        );
        assert_eq!(kernel_source("abc"), b"0000000003abc");
        assert!(parse::<KernelMessage>(br#"{"kind":"nope"}"#).unwrap_err().is_violation());
    }

    #[tokio::test]
    async fn a_channel_sends_and_receives_typed_lines_and_refuses_the_rest() {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (mut a, mut b) = (Channel::new(a, 64), Channel::new(b, 64));
        a.send(&Event::Attached).await.unwrap();
        a.send(&Event::Ended { exit: Exit::Exited(2) }).await.unwrap();
        assert_eq!(b.recv::<Event>().await.unwrap(), Some(Event::Attached));
        assert_eq!(b.recv::<Event>().await.unwrap(), Some(Event::Ended { exit: Exit::Exited(2) }));
        // An unknown tag: a typed error, and the channel is out of step from then on.
        use tokio::io::AsyncWriteExt;
        a.get_mut().write_all(b"{\"event\":\"evil\"}\n").await.unwrap();
        assert!(b.recv::<Event>().await.unwrap_err().is_violation());
        assert!(matches!(b.recv::<Event>().await, Err(Error::Broken)));
        // An oversized line costs the limit and is refused.
        let (c, d) = tokio::net::UnixStream::pair().unwrap();
        let (mut c, mut d) = (Channel::new(c, 64), Channel::new(d, 64));
        c.send(&Event::Warning { message: "x".repeat(100) }).await.unwrap();
        assert!(matches!(d.recv::<Event>().await, Err(Error::TooLong(64))));
        drop(c);
        // A clean end of the stream is None.
        let (e, f) = tokio::net::UnixStream::pair().unwrap();
        drop(e);
        assert_eq!(Channel::new(f, 64).recv::<Event>().await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_channel_passes_fds_with_its_message() {
        use std::io::{Read, Write};
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let a = Channel::new(tokio::net::UnixStream::from_std(a).unwrap(), 1024);
        let (r, w) = super::super::process::pipe().unwrap();
        a.send_with_fds(&ForkRequest { spec: child() }, &[w.as_fd()]).await.unwrap();
        drop(w);
        let got = tokio::task::spawn_blocking(move || {
            let fds = super::super::channel::recv_fds::<5>(b.as_fd(), &[1]).unwrap().unwrap();
            let mut pipe = std::fs::File::from(fds.into_iter().next().unwrap());
            pipe.write_all(b"through").unwrap();
        })
        .await;
        assert!(got.is_ok());
        let mut text = String::new();
        std::fs::File::from(r).read_to_string(&mut text).unwrap();
        assert_eq!(text, "through");
    }
}
