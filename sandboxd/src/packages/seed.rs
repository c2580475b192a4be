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
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The probe's time limit (it starts uv and a Python once each).
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of the probe's output kept: the record is a few KiB.
const PROBE_OUTPUT: usize = 256 * 1024;

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
        let hex = |s: &str| !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
        let well_formed = match parts.as_slice() {
            [dir, shard, file] => {
                dir.strip_prefix("interpreter-v")
                    .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                    && hex(shard)
                    && file.strip_suffix(".msgpack").is_some_and(hex)
            }
            _ => false,
        };
        let base64 = seed.data.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=');
        (well_formed && base64 && !seed.data.is_empty()).then_some(seed)
    }
}

/// The daemon's seed: made by the first install that asks, kept for the
/// daemon's life (`None` when the probe failed: installs then go without).
pub async fn get(ctx: &Context, lease: &Lease) -> Option<Seed> {
    ctx.uv_seed.get_or_init(|| probe(ctx, lease)).await.clone()
}

/// Run the installer's `--probe` in a sandbox with nothing of the session's: the
/// session's uid (a sandbox of that uid sees nothing of another's), its policy's
/// limits, no workspace, no layer, no network.
async fn probe(ctx: &Context, lease: &Lease) -> Option<Seed> {
    let at = plan::Where { rootfs: &ctx.rootfs, workspace: None, packages: None, ca_bundle: None };
    let argv = vec![plan::PYTHON.to_string(), super::INSTALLER.to_string(), "--probe".to_string()];
    let spec = plan::sandbox_spec(&at, lease.uid, &lease.policy, argv, None);
    let run = isolate::Run {
        id: format!("uv-probe-{}", crate::run::new_run_id()),
        spec,
        limits: plan::cgroup_limits(&lease.policy),
        timeout: PROBE_TIMEOUT,
        grace: Duration::from_secs(lease.policy.grace_s),
        output_limit: PROBE_OUTPUT,
    };
    // Not the session's cancel: the seed serves every session, and a probe cut
    // short would leave every install without it.
    let (_keep, cancel) = tokio::sync::watch::channel(false);
    match crate::run::net::cold(ctx, run, None, None, cancel).await {
        Ok(outcome) => match (outcome.exit, Seed::parse(&outcome.stdout.text())) {
            (isolate::message::Exit::Exited(0), Some(seed)) => {
                tracing::info!(path = %seed.path, "uv's record of the rootfs's Python made: installs will not ask the interpreter");
                Some(seed)
            }
            (exit, _) => {
                tracing::warn!(?exit, stderr = %outcome.stderr.text(), "uv's record of the rootfs's Python could not be made: each install will ask the interpreter (slower)");
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "uv's record of the rootfs's Python could not be made: each install will ask the interpreter (slower)");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_record_of_uvs_form_is_a_seed() {
        let ok = r#"{"path": "interpreter-v5/1697c3caa117b6e6/30ac7a0cb519aa68.msgpack", "data": "kpLOawqJ+/="}"#;
        assert_eq!(
            Seed::parse(&format!("noise\n{ok}\n\n")),
            Some(Seed {
                path: "interpreter-v5/1697c3caa117b6e6/30ac7a0cb519aa68.msgpack".into(),
                data: "kpLOawqJ+/=".into()
            })
        );
        for bad in [
            r#"{"path": "../interpreter-v5/aa/bb.msgpack", "data": "aa"}"#,
            r#"{"path": "interpreter-v5/aa/bb/cc.msgpack", "data": "aa"}"#,
            r#"{"path": "interpreter-v/aa/bb.msgpack", "data": "aa"}"#,
            r#"{"path": "interpreter-v5/a.a/bb.msgpack", "data": "aa"}"#,
            r#"{"path": "interpreter-v5/aa/bb.json", "data": "aa"}"#,
            r#"{"path": "interpreter-v5/aa/bb.msgpack", "data": ""}"#,
            r#"{"path": "interpreter-v5/aa/bb.msgpack", "data": "a\"b"}"#,
            r#"{"path": "interpreter-v5/aa/bb.msgpack", "data": "aa", "more": 1}"#,
            r#"["interpreter-v5/aa/bb.msgpack", "aa"]"#,
            "",
        ] {
            assert_eq!(Seed::parse(bad), None, "{bad}");
        }
    }
}
