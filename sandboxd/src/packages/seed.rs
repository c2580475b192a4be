//! uv's record of the rootfs's Python, made once per daemon and given to every
//! install ([`Seed`]).
//!
//! uv learns about an interpreter by starting it (`python -I -B -c …`) and keeps
//! what it learnt in its cache, keyed by the executable's path and change time.
//! An install's uv cache is new each time (it lives and dies with the install), so
//! without a seed every install starts a Python for that alone (~35 ms). The
//! record depends only on the rootfs image, so the daemon has the installer make
//! it once (`sandboxd_install.py --probe`) in a sandbox of its own: no workspace,
//! no session's package layer (whose `.pth` files would run in that Python), no
//! network. Nothing a tenant wrote goes into it, so it can be given to every
//! session's installs. The installer ignores a seed that does not fit and uv
//! ignores one that does not match: the worst a wrong seed costs is the query.

use crate::isolate;
use crate::plan;
use crate::run::Context;
use crate::session::Lease;
use base64::Engine;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// The probe's time limit (it starts uv and a Python once each).
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of the probe's output kept: the record is a few KiB.
const PROBE_OUTPUT: usize = 256 * 1024;
/// The largest record given to installs (the installer takes up to 1 MiB of base64).
const MAX_SEED: usize = 512 * 1024;

/// A file of uv's cache: its path under the cache, and its bytes in base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seed {
    pub path: String,
    pub data: String,
}

impl Seed {
    /// The probe's last line, if it is a record of the form uv keeps:
    /// `interpreter-v<N>/<hex>/<hex>.msgpack`, within `PROBE_OUTPUT`.
    pub fn parse(stdout: &str) -> Option<Seed> {
        let line = stdout.lines().rev().find(|l| !l.trim().is_empty())?;
        // An object (serde would read a struct from an array too).
        if !line.trim_start().starts_with('{') {
            return None;
        }
        let seed: Seed = serde_json::from_str(line).ok()?;
        let parts: Vec<&str> = seed.path.split('/').collect();
        // The installer's own check, `SEED_PATH`: lower-case hex, up to 4 digits of version.
        let hex = |s: &str| !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let well_formed = match parts.as_slice() {
            [dir, shard, file] => {
                dir.strip_prefix("interpreter-v")
                    .is_some_and(|v| (1..=4).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_digit()))
                    && hex(shard)
                    && file.strip_suffix(".msgpack").is_some_and(hex)
            }
            _ => false,
        };
        let decodes = base64::engine::general_purpose::STANDARD
            .decode(&seed.data)
            .is_ok_and(|bytes| !bytes.is_empty() && bytes.len() <= MAX_SEED);
        (well_formed && decodes).then_some(seed)
    }
}

/// The daemon's seed, as far as it got.
#[derive(Default)]
pub struct Seeds(std::sync::Mutex<State>);

#[derive(Default)]
enum State {
    /// Not made yet; or the last probe failed, and another may try from then on.
    #[default]
    Unmade,
    Failed(Instant),
    /// An install is making it.
    Making,
    Made(Seed),
}

/// How long after a failed probe the next install tries again.
const RETRY_AFTER: Duration = Duration::from_secs(60);

impl Seeds {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The seed for an install in `lease`'s session. Made, it is given at once; while
/// another install makes it, this one goes without (no install ever waits for
/// another's probe); not made yet, or the last try failed over a minute ago, this
/// install makes it first, inside its own lease (its session's uid is its own
/// until the probe is over), under the daemon's built-in limits (not its
/// policy's: a policy of a hundredth of a CPU, or too few processes for uv, would
/// otherwise decide every other session's installs).
pub async fn get(ctx: &Context, lease: &Lease) -> Option<Seed> {
    let seeds = &ctx.uv_seed;
    {
        let mut state = seeds.lock();
        match &*state {
            State::Made(seed) => return Some(seed.clone()),
            State::Making => return None,
            State::Failed(at) if at.elapsed() < RETRY_AFTER => return None,
            State::Unmade | State::Failed(_) => *state = State::Making,
        }
    }
    // Cancelled (its install given up) before the probe ended: the next install tries.
    struct Unclaim<'a>(&'a Seeds);
    impl Drop for Unclaim<'_> {
        fn drop(&mut self) {
            let mut state = self.0.lock();
            if matches!(*state, State::Making) {
                *state = State::Unmade;
            }
        }
    }
    let _unclaim = Unclaim(seeds);
    let made = probe(ctx, lease.uid).await;
    *seeds.lock() = match &made {
        Some(seed) => State::Made(seed.clone()),
        None => State::Failed(Instant::now()),
    };
    made
}

/// Run the installer's `--probe` as host uid `uid`, in a sandbox with nothing of
/// a session's: no workspace, no layer, no network, the built-in default
/// policy's limits.
async fn probe(ctx: &Context, uid: u32) -> Option<Seed> {
    let policy = crate::model::policy::Policy::default();
    let at = plan::Where { rootfs: &ctx.rootfs, workspace: None, packages: None, ca_bundle: None };
    let argv = vec![plan::PYTHON.to_string(), super::INSTALLER.to_string(), "--probe".to_string()];
    let spec = plan::sandbox_spec(&at, uid, &policy, argv, None);
    let run = isolate::Run {
        id: format!("uv-probe-{}", crate::run::new_run_id()),
        spec,
        limits: plan::cgroup_limits(&policy),
        timeout: PROBE_TIMEOUT,
        grace: Duration::from_secs(1),
        output_limit: PROBE_OUTPUT,
    };
    // Not the session's cancel: a probe cut short leaves every install without
    // the seed until the next one tries.
    let (_keep, cancel) = tokio::sync::watch::channel(false);
    match crate::run::net::cold(ctx, run, None, None, cancel).await {
        Ok(outcome) => match (outcome.exit, Seed::parse(&outcome.stdout.text())) {
            (isolate::message::Exit::Exited(0), Some(seed)) => {
                tracing::info!(path = %seed.path, "uv's record of the rootfs's Python made: installs will not ask the interpreter");
                Some(seed)
            }
            (exit, _) => {
                tracing::warn!(?exit, stderr = %outcome.stderr.text(), "uv's record of the rootfs's Python could not be made: installs ask the interpreter (slower) until a later try makes it");
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "uv's record of the rootfs's Python could not be made: installs ask the interpreter (slower) until a later try makes it");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_record_of_uvs_form_is_a_seed() {
        let ok = r#"{"path": "interpreter-v5/1697c3caa117b6e6/30ac7a0cb519aa68.msgpack", "data": "kpLOawqJ+/8="}"#;
        assert_eq!(
            Seed::parse(&format!("noise\n{ok}\n\n")),
            Some(Seed {
                path: "interpreter-v5/1697c3caa117b6e6/30ac7a0cb519aa68.msgpack".into(),
                data: "kpLOawqJ+/8=".into()
            })
        );
        for bad in [
            r#"{"path": "../interpreter-v5/aa/bb.msgpack", "data": "aa=="}"#,
            r#"{"path": "interpreter-v5/aa/bb/cc.msgpack", "data": "aa=="}"#,
            r#"{"path": "interpreter-v/aa/bb.msgpack", "data": "aa=="}"#,
            r#"{"path": "interpreter-v5/a.a/bb.msgpack", "data": "aa=="}"#,
            r#"{"path": "interpreter-v5/aa/bb.json", "data": "aa=="}"#,
            r#"{"path": "interpreter-v5/aa/bb.msgpack", "data": ""}"#,
            r#"{"path": "interpreter-v5/aa/bb.msgpack", "data": "a\"b"}"#,
            r#"{"path": "interpreter-v5/aa/bb.msgpack", "data": "kpLOawqJ+/="}"#,
            r#"{"path": "interpreter-v5/AA/bb.msgpack", "data": "aa=="}"#,
            r#"{"path": "interpreter-v12345/aa/bb.msgpack", "data": "aa=="}"#,
            r#"{"path": "interpreter-v5/aa/bb.msgpack", "data": "aa==", "more": 1}"#,
            r#"["interpreter-v5/aa/bb.msgpack", "aa=="]"#,
            "",
        ] {
            assert_eq!(Seed::parse(bad), None, "{bad}");
        }
    }
}
