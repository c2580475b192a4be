//! Kernel sessions: one interpreter kept alive in the session's sandbox across
//! runs, so variables survive from one run to the next.
//!
//! The daemon makes a root-owned directory with a listening socket, bound read-only
//! at `/run` inside the sandbox, starts `kernel.py` there (embedded in this binary),
//! accepts exactly one connection and removes the socket. Cells then go over that
//! connection as JSON lines. A timeout sends SIGINT to the sandbox (the init
//! forwards it), which interrupts the cell and keeps the state; a cell that ignores
//! it is killed after the grace period, and the kernel is started afresh next time.

use crate::isolate::output::{Chunk, StreamKind};
use crate::isolate::{self, spec, Outcome, Sandboxes};
use crate::policy::Policy;
use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// The kernel's source, run with `python -` (read from stdin).
pub const SOURCE: &str = include_str!("../../rootfs/support/kernel.py");
/// Longest reply line accepted from a kernel (its output is capped well below).
const MAX_REPLY: usize = 8 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("preparing the kernel's control socket {0}: {1}")]
    Socket(PathBuf, std::io::Error),
    #[error("the kernel did not start: {0}")]
    Start(String),
}

/// What a cell sends back.
#[derive(Debug, Clone, Deserialize)]
pub struct CellReply {
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub result: Option<Value>,
    pub exception: Option<Value>,
    pub exit_code: i32,
}

/// A piece of a cell's output, sent while it runs when the cell asked for `stream`.
#[derive(Debug, Deserialize)]
struct StreamLine {
    stream: String,
    run_id: String,
    text: String,
}

/// How a cell ended.
pub enum CellEnd {
    /// The kernel answered; `interrupted` when that took the timeout's SIGINT.
    Done { reply: CellReply, interrupted: bool },
    /// The kernel is gone (killed at the timeout, by the OOM killer, or on request).
    Died { timed_out: bool, cancelled: bool, outcome: Option<Outcome> },
}

pub struct Kernel {
    writer: OwnedWriteHalf,
    lines: Lines<BufReader<OwnedReadHalf>>,
    init_pid: i32,
    cancel: watch::Sender<bool>,
    task: JoinHandle<Result<Outcome, isolate::Error>>,
    dir: PathBuf,
}

/// Everything a kernel needs to start.
pub struct StartSpec<'a> {
    pub session_id: &'a str,
    pub rootfs: &'a Path,
    pub workspace: &'a Path,
    pub uid: u32,
    pub policy: &'a Policy,
    /// Below the state directory; one sub-directory per kernel.
    pub control_root: &'a Path,
}

impl Kernel {
    pub async fn start(sandboxes: &Arc<Sandboxes>, s: StartSpec<'_>) -> Result<Kernel, Error> {
        use std::os::unix::fs::PermissionsExt;
        let dir = s.control_root.join(s.session_id);
        let _ = std::fs::remove_dir_all(&dir);
        let prepared = std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::set_permissions(s.control_root, std::fs::Permissions::from_mode(0o711)))
            .and_then(|_| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)));
        prepared.map_err(|e| Error::Socket(dir.clone(), e))?;
        let sock = dir.join("kernel.sock");
        let listener = tokio::net::UnixListener::bind(&sock).map_err(|e| Error::Socket(sock.clone(), e))?;
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777))
            .map_err(|e| Error::Socket(sock.clone(), e))?;

        let policy = s.policy;
        let run = isolate::Run {
            id: format!("kernel-{}", s.session_id),
            spec: spec::SandboxSpec {
                control_dir: Some(dir.clone()),
                // The source arrives on stdin (`python -`): ps shows a short command line.
                ..crate::run::sandbox_spec(
                    s.rootfs,
                    Some(s.workspace),
                    s.uid,
                    policy,
                    vec!["/opt/py/bin/python".into(), "-".into(), "/run/kernel.sock".into()],
                    Some(SOURCE.into()),
                )
            },
            limits: crate::run::cgroup_limits(policy),
            // The kernel lives as long as its session; cells have their own limit.
            timeout: Duration::from_secs(400 * 86400),
            grace: Duration::from_secs(policy.grace_s),
            output_limit: 64 * 1024,
        };
        let (cancel, cancel_rx) = watch::channel(false);
        let (started_tx, started_rx) = oneshot::channel();
        let sb = sandboxes.clone();
        let mut task = tokio::spawn(async move { sb.run(run, None, cancel_rx, Some(started_tx)).await });

        let connected = async {
            let init_pid = started_rx.await.map_err(|_| "the sandbox did not start".to_string())?;
            let (stream, _) = listener.accept().await.map_err(|e| e.to_string())?;
            Ok::<_, String>((init_pid, stream))
        };
        let outcome = tokio::select! {
            r = tokio::time::timeout(Duration::from_secs(60), connected) => r.map_err(|_| "it did not connect within 60 s".to_string()).and_then(|r| r),
            ended = &mut task => Err(match ended {
                Ok(Ok(o)) => format!("it exited at once (exit code {:?}, signal {:?}): {}", o.exit_code, o.signal, o.stderr.text()),
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            }),
        };
        let _ = std::fs::remove_file(&sock);
        drop(listener);
        match outcome {
            Ok((init_pid, stream)) => {
                let (read, writer) = stream.into_split();
                Ok(Kernel { writer, lines: BufReader::new(read).lines(), init_pid, cancel, task, dir })
            }
            Err(e) => {
                let _ = cancel.send(true);
                let _ = task.await;
                let _ = std::fs::remove_dir_all(&dir);
                Err(Error::Start(e))
            }
        }
    }

    /// Run one cell. `stop` set to true kills the kernel (the session is closing).
    /// With `chunks`, the cell's output is streamed there as it is produced (the
    /// message must then ask for `stream`).
    pub async fn exec(
        mut self,
        msg: Value,
        timeout: Duration,
        grace: Duration,
        mut stop: watch::Receiver<bool>,
        chunks: Option<mpsc::Sender<Chunk>>,
    ) -> (Option<Kernel>, CellEnd) {
        let run_id = msg.get("run_id").and_then(Value::as_str).unwrap_or_default().to_string();
        // A slow streaming client must not hold up the cell's time limit: chunks go
        // through a queue that the kernel's output cap keeps small.
        let forward = chunks.map(|tx| {
            let (queue, mut rx) = mpsc::unbounded_channel::<Chunk>();
            tokio::spawn(async move {
                while let Some(chunk) = rx.recv().await {
                    // A client that went away must not stop the cell.
                    let _ = tx.send(chunk).await;
                }
            });
            queue
        });
        let mut line = msg.to_string().into_bytes();
        line.push(b'\n');
        if self.writer.write_all(&line).await.is_err() {
            let outcome = self.stop().await;
            return (None, CellEnd::Died { timed_out: false, cancelled: false, outcome });
        }
        let mut interrupted = false;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let answer = loop {
            tokio::select! {
                l = self.lines.next_line() => match l {
                    // kernel.py writes the "stream" key first in a chunk line, and
                    // never in a reply.
                    Ok(Some(l)) if l.starts_with("{\"stream\"") => {
                        // Output of this cell, or late output of an earlier one (dropped).
                        if let (Some(queue), Ok(s)) = (&forward, serde_json::from_str::<StreamLine>(&l)) {
                            let stream = if s.stream == "stderr" { StreamKind::Stderr } else { StreamKind::Stdout };
                            if s.run_id == run_id {
                                let _ = queue.send(Chunk { stream, text: s.text });
                            }
                        }
                    }
                    other => break other,
                },
                _ = &mut deadline => {
                    if interrupted {
                        let outcome = self.stop().await;
                        return (None, CellEnd::Died { timed_out: true, cancelled: false, outcome });
                    }
                    interrupted = true;
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.init_pid), nix::sys::signal::SIGINT);
                    deadline.as_mut().reset(tokio::time::Instant::now() + grace);
                }
                _ = stop.changed() => {
                    let outcome = self.stop().await;
                    return (None, CellEnd::Died { timed_out: false, cancelled: true, outcome });
                }
            }
        };
        let reply = match answer {
            Ok(Some(l)) if l.len() <= MAX_REPLY => serde_json::from_str::<CellReply>(&l).ok(),
            _ => None,
        };
        match reply {
            Some(reply) => (Some(self), CellEnd::Done { reply, interrupted }),
            None => {
                let outcome = self.stop().await;
                (None, CellEnd::Died { timed_out: interrupted, cancelled: false, outcome })
            }
        }
    }

    /// End the kernel and its sandbox; returns how the sandbox ended.
    pub async fn stop(self) -> Option<Outcome> {
        let _ = self.cancel.send(true);
        drop(self.writer);
        let outcome = self.task.await.ok().and_then(|r| r.ok());
        let _ = std::fs::remove_dir_all(&self.dir);
        outcome
    }
}
