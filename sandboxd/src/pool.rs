//! The pool: sandboxes made ahead of one-shot Python runs, their interpreter started
//! and the policy's preload modules imported ([`isolate::Pooled`]).
//!
//! A run takes one, the session's workspace is attached, the code is sent, and the
//! sandbox is destroyed when the run ends: a pooled sandbox serves exactly one run.
//! One background task refills the pool, one sandbox at a time, at the least CPU
//! weight, so under load refills wait and runs fall back to cold sandboxes.
//!
//! The protocol with `runner.py --pooled` on the program's stdin socket is JSON
//! lines: the runner says `{"ready": true, "failed": [modules]}`, the daemon sends
//! `{"code", "run_id", "autosave"}` once the workspace is attached, and the runner
//! answers `{"exit_code": N}` after closing its output.

use crate::isolate::{self, Pooled, Sandboxes};
use crate::policy::Policy;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How long a pooled interpreter may take to import its preload modules (at the
/// least CPU weight, behind every run).
const READY_TIMEOUT: Duration = Duration::from_secs(300);
/// How many host uids pooled sandboxes cycle through, above the sessions' range.
const UID_SPAN: u32 = 256;

/// Counters and sizes, for `GET /v1/health`.
#[derive(Debug, Clone, Serialize, Default, utoipa::ToSchema)]
pub struct Stats {
    /// Pooled sandboxes kept ready per policy in use (0: the pool is off).
    pub size_per_policy: usize,
    /// Sandboxes ready now, all policies.
    pub ready: usize,
    /// Ready sandboxes per policy.
    pub ready_by_policy: HashMap<String, usize>,
    /// Runs served by a pooled sandbox.
    pub hits: u64,
    /// Python runs that found none ready and used a cold sandbox.
    pub misses: u64,
    /// Pooled sandboxes that failed to start, or died before a run took them.
    pub failures: u64,
    /// Memory held by the ready sandboxes, bytes.
    pub memory_bytes: u64,
}

#[derive(Default)]
struct State {
    ready: HashMap<String, VecDeque<Pooled>>,
    /// Policies the pool keeps sandboxes for, in the order they were first wanted.
    wanted: Vec<String>,
    hits: u64,
    misses: u64,
    failures: u64,
    next_uid: u32,
    stopped: bool,
}

pub struct Pool {
    sandboxes: Arc<Sandboxes>,
    rootfs: PathBuf,
    policies: BTreeMap<String, Arc<Policy>>,
    size: usize,
    /// Pooled sandboxes run as `uid_base + n` (n < UID_SPAN), not a session's uid:
    /// the workspace is attached through an idmapped mount.
    uid_base: u32,
    state: Mutex<State>,
    wake: Notify,
    /// Cancelled at shutdown: a sandbox still importing is destroyed at once.
    stop: CancellationToken,
    refiller: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Pool {
    /// A pool of `size` sandboxes per policy in use; it keeps the default policy's
    /// from the start. `uid_base` is the first host uid above the sessions' range.
    pub fn new(
        sandboxes: Arc<Sandboxes>,
        rootfs: PathBuf,
        policies: BTreeMap<String, Arc<Policy>>,
        size: usize,
        uid_base: u32,
    ) -> Arc<Pool> {
        let state = State { wanted: vec!["default".into()], ..State::default() };
        let pool = Arc::new(Pool {
            sandboxes,
            rootfs,
            policies,
            size,
            uid_base,
            state: Mutex::new(state),
            wake: Notify::new(),
            stop: CancellationToken::new(),
            refiller: Mutex::new(None),
        });
        if size > 0 {
            let task = tokio::spawn(pool.clone().refill());
            *pool.refiller.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        }
        pool
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A ready sandbox for `policy`, or None (the run then uses a cold one).
    pub fn take(&self, policy: &str) -> Option<Pooled> {
        if self.size == 0 {
            return None;
        }
        let mut dead = vec![];
        let taken = {
            let mut st = self.lock();
            let mut taken = None;
            while let Some(mut p) = st.ready.get_mut(policy).and_then(VecDeque::pop_front) {
                if alive(&mut p) {
                    taken = Some(p);
                    break;
                }
                dead.push(p);
            }
            st.failures += dead.len() as u64;
            match taken {
                Some(_) => st.hits += 1,
                None => st.misses += 1,
            }
            if !st.wanted.iter().any(|w| w == policy) && self.policies.contains_key(policy) {
                st.wanted.push(policy.into());
            }
            taken
        };
        for p in dead {
            tokio::spawn(p.destroy());
        }
        self.wake.notify_one();
        taken
    }

    pub fn stats(&self) -> Stats {
        let st = self.lock();
        Stats {
            size_per_policy: self.size,
            ready: st.ready.values().map(VecDeque::len).sum(),
            ready_by_policy: st.ready.iter().map(|(k, v)| (k.clone(), v.len())).collect(),
            hits: st.hits,
            misses: st.misses,
            failures: st.failures,
            memory_bytes: st.ready.values().flatten().filter_map(Pooled::memory_bytes).sum(),
        }
    }

    /// Stop refilling and destroy every ready sandbox (daemon shutdown).
    pub async fn shutdown(&self) {
        self.lock().stopped = true;
        self.stop.cancel();
        let refiller = self.refiller.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = refiller {
            let _ = task.await;
        }
        let all: Vec<Pooled> = self.lock().ready.drain().flat_map(|(_, v)| v).collect();
        for p in all {
            p.destroy().await;
        }
    }

    /// The policy that is short of ready sandboxes, if any, and a uid for the next one.
    fn next_job(&self) -> Option<(Arc<Policy>, u32)> {
        let mut st = self.lock();
        if st.stopped {
            return None;
        }
        let short = st.wanted.iter().find(|w| st.ready.get(*w).map_or(0, VecDeque::len) < self.size)?.clone();
        let policy = self.policies.get(&short)?.clone();
        let uid = self.uid_base + st.next_uid % UID_SPAN;
        st.next_uid = st.next_uid.wrapping_add(1);
        Some((policy, uid))
    }

    async fn refill(self: Arc<Self>) {
        let mut backoff = Duration::from_secs(1);
        loop {
            let Some((policy, uid)) = self.next_job() else {
                tokio::select! {
                    _ = self.wake.notified() => continue,
                    _ = self.stop.cancelled() => return,
                }
            };
            match self.start(&policy, uid).await {
                Ok(p) => {
                    backoff = Duration::from_secs(1);
                    let unwanted = {
                        let mut st = self.lock();
                        if st.stopped {
                            Some(p)
                        } else {
                            st.ready.entry(policy.name.clone()).or_default().push_back(p);
                            None
                        }
                    };
                    if let Some(p) = unwanted {
                        p.destroy().await;
                        return;
                    }
                }
                Err(_) if self.stop.is_cancelled() => return,
                Err(e) => {
                    self.lock().failures += 1;
                    tracing::warn!(policy = %policy.name, error = %e, retry_in_s = backoff.as_secs(), "could not start a pooled sandbox");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = self.stop.cancelled() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(60));
                }
            }
        }
    }

    /// Start one pooled sandbox and wait until its interpreter has its imports.
    async fn start(&self, policy: &Policy, uid: u32) -> Result<Pooled, String> {
        let argv = vec![
            "/opt/py/bin/python".to_string(),
            "/opt/sandboxd/runner.py".to_string(),
            "--pooled".to_string(),
            policy.preload.join(","),
        ];
        let spec = crate::run::sandbox_spec(&self.rootfs, None, uid, policy, argv, None);
        let limits = crate::run::cgroup_limits(policy);
        let mut pooled = self.sandboxes.start_pooled(&spec, &limits).await.map_err(|e| e.to_string())?;
        let ready = tokio::select! {
            r = tokio::time::timeout(READY_TIMEOUT, read_message(&mut pooled.program)) => r,
            _ = self.stop.cancelled() => Ok(None),
        };
        match ready {
            Ok(Some(msg)) if msg.get("ready").and_then(|v| v.as_bool()) == Some(true) => {
                if let Some(failed) = msg.get("failed").and_then(|v| v.as_array()).filter(|a| !a.is_empty()) {
                    tracing::warn!(policy = %policy.name, ?failed, "preload modules that could not be imported (fix the policy's `preload`)");
                }
                Ok(pooled)
            }
            other => {
                pooled.destroy().await;
                Err(match other {
                    Err(_) => format!("its imports took longer than {} s", READY_TIMEOUT.as_secs()),
                    Ok(_) => "the interpreter ended before it was ready".into(),
                })
            }
        }
    }
}

/// Has the pooled program kept quiet, its socket open? (Anything to read, or the
/// end of the stream, means it died or misbehaved.)
fn alive(p: &mut Pooled) -> bool {
    let mut byte = [0u8; 1];
    matches!(p.program.try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// One JSON line from the program. The runner writes nothing after a message until
/// it gets an answer, so reading through a buffer loses nothing.
async fn read_message(stream: &mut tokio::net::UnixStream) -> Option<serde_json::Value> {
    let mut line = String::new();
    let mut reader = BufReader::new(stream.take(64 * 1024));
    match reader.read_line(&mut line).await {
        Ok(n) if n > 0 => serde_json::from_str(&line).ok(),
        _ => None,
    }
}

/// What a pooled run needs besides its sandbox.
pub struct Job<'a> {
    pub workspace: &'a std::path::Path,
    pub owner_uid: u32,
    pub code: &'a str,
    pub run_id: &'a str,
    pub autosave: bool,
}

/// Attach the workspace and hand the code to the pooled interpreter.
pub async fn send(pooled: &mut Pooled, job: &Job<'_>) -> Result<(), isolate::Error> {
    pooled.attach(job.workspace, job.owner_uid).await?;
    let mut line = serde_json::to_vec(&serde_json::json!({
        "code": job.code,
        "run_id": job.run_id,
        "autosave": job.autosave,
    }))
    .map_err(|e| isolate::Error::Control(e.into()))?;
    line.push(b'\n');
    pooled.program.write_all(&line).await.map_err(isolate::Error::Control)
}

/// Resolves to the exit code the runner reports when the run is over.
pub fn done(mut stream: tokio::net::UnixStream) -> isolate::Done {
    Box::pin(async move {
        let msg = read_message(&mut stream).await?;
        msg.get("exit_code")?.as_i64().map(|c| c as i32)
    })
}
