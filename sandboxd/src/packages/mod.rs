//! Packages installed at run time into the session's package layer
//! ([`crate::storage`]: an image of the policy's `packages_mb`, mounted at
//! `/opt/packages` in every sandbox of the session), where every later run of the
//! session imports them from: script runs, pooled runs (the fork adds the layer to
//! `sys.path` when it is attached) and kernel cells (without a restart).
//!
//! An install is a sandbox of the session like any run, under its policy, with
//! the layer mounted read-write and no workspace: the rootfs's installer
//! (`/opt/sandboxd/sandboxd_install.py`) resolves against the index through the
//! egress proxy, installs only what the rootfs and the layer do not already hold,
//! wheels only unless the policy allows source builds, and swaps the new layer in
//! whole or not at all. Its files come through the daemon's package cache
//! ([`crate::egress::cache`]); uv's record of the rootfs's Python comes from the
//! daemon ([`seed`]). The daemon trusts nothing it says but for display:
//! how it ended comes from the sandbox, the layer's size from the kernel.

pub mod requirement;
pub mod seed;

use crate::isolate;
use crate::model::packages::{InstallResult, InstalledPackage};
use crate::model::run::NetUsage;
use crate::plan;
use crate::run::net::{self, Net};
use crate::run::Context;
use crate::session::Lease;
use serde::Deserialize;
use std::time::{Duration, Instant};

/// The installer, in the rootfs.
pub const INSTALLER: &str = "/opt/sandboxd/sandboxd_install.py";
/// Output kept of an install (uv's resolution errors can be long).
const OUTPUT: usize = 256 * 1024;
/// The most of the installer's stderr an error message carries.
const MESSAGE_TAIL: usize = 8 * 1024;
/// What the installer (`rootfs/support/sandboxd_install.py`, `FULL`) prints
/// when the layer's filesystem ran out of room.
const LAYER_FULL: &str = "the session's package layer is full";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A requirement or a request that cannot be installed from; the text says why.
    #[error("{0}")]
    Invalid(String),
    /// The installer ran and failed: its own words, and what the sandbox saw.
    #[error("{0}")]
    Failed(String),
    /// The state directory's filesystem cannot hold the session's package layer.
    #[error("{0}")]
    NoRoom(crate::session::Error),
    /// A host failure; `context` names the step.
    #[error("{context}: {error}")]
    Internal { context: String, error: String },
}

fn internal(context: &str, e: impl std::fmt::Display) -> Error {
    Error::Internal { context: context.into(), error: e.to_string() }
}

/// The installer's last line on stdout.
#[derive(Debug, Deserialize)]
struct Summary {
    installed: Vec<InstalledPackage>,
    #[serde(default)]
    unchanged: Vec<String>,
}

/// Check `packages` against `lease`'s policy before anything is made.
pub fn check(lease_policy: &crate::model::policy::Policy, packages: &[String]) -> Result<(), Error> {
    if !lease_policy.packages_enabled() {
        return Err(Error::Invalid(format!(
            "policy {:?} installs no packages ({}): use a session of a policy with network = \"allowlist\", its index in allow_hosts, and packages_mb above 0 (the default policy is one)",
            lease_policy.name,
            if lease_policy.network == crate::model::policy::Network::None { "network = \"none\"" } else { "packages_mb = 0" }
        )));
    }
    requirement::check_all(packages).map_err(Error::Invalid)
}

/// Install `packages` into the layer of `lease`'s session.
pub async fn install(ctx: &Context, lease: &Lease, packages: &[String]) -> Result<InstallResult, Error> {
    let policy = &lease.policy;
    check(policy, packages)?;
    let began = Instant::now();
    let id = format!("install-{}", crate::run::new_run_id());
    let layer = match lease.package_layer().await {
        Ok(Some(layer)) => layer,
        Ok(None) => return Err(internal("the package layer", "the policy allows packages, and there is no layer")),
        Err(e @ crate::session::Error::LayerNoRoom { .. }) => return Err(Error::NoRoom(e)),
        Err(e) => return Err(internal("making the session's package layer", e)),
    };
    let uv_seed = seed::get(ctx, lease).await;
    let net = Net::of(ctx, lease, &id).map_err(|e| internal("the egress proxy", e))?;
    let request = serde_json::json!({
        "packages": packages,
        "index_url": policy.index_url,
        // The same index, asked in plain HTTP that the proxy carries over TLS
        // ([`crate::egress::plain`]): uv then never starts TLS.
        "plain_index_url": net.as_ref().and_then(|n| crate::egress::plain::index_url(&n.tenant)),
        "only_binary": !policy.source_builds,
        "uv_seed": uv_seed,
    });
    let argv = vec![plan::PYTHON.to_string(), INSTALLER.to_string()];
    let mut spec = plan::sandbox_spec(&ctx.at(None, Some(&layer)), lease.uid, policy, argv, Some(request.to_string()));
    if let Some(n) = &net {
        spec.env.extend(n.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let timeout = Duration::from_secs(policy.install_timeout_s);
    let run = isolate::Run {
        id: id.clone(),
        spec,
        limits: plan::cgroup_limits(policy),
        timeout,
        grace: Duration::from_secs(policy.grace_s),
        output_limit: OUTPUT,
    };
    tracing::info!(session_id = %lease.id, install_id = %id, ?packages, "install started");
    let outcome = net::cold(ctx, run, net.as_ref(), None, lease.cancel.clone())
        .await
        .map_err(|e| internal("running the installer", e))?;
    let seen = net.as_ref().map(|n| n.tenant.net()).unwrap_or_default();
    let (layer_bytes, layer_limit_bytes) = layer_usage(&layer, policy.packages_mb);
    let stdout = outcome.stdout.text();
    let summary =
        stdout.lines().rev().find(|l| !l.trim().is_empty()).and_then(|l| serde_json::from_str::<Summary>(l).ok());
    let status = match (&summary, outcome.exit) {
        _ if outcome.timed_out => "timeout",
        (Some(_), isolate::message::Exit::Exited(0)) => "ok",
        _ => "failed",
    };
    crate::metrics::global().package_install(status);
    tracing::info!(session_id = %lease.id, install_id = %id, status, duration_ms = began.elapsed().as_millis() as u64, "install finished");
    match summary {
        Some(summary) if status == "ok" => Ok(InstallResult {
            session_id: lease.public_id.clone(),
            installed: summary.installed,
            unchanged: summary.unchanged,
            duration_ms: began.elapsed().as_millis() as u64,
            layer_bytes,
            layer_limit_bytes,
            net: seen,
        }),
        _ => Err(Error::Failed(failure(packages, &outcome, &seen, policy))),
    }
}

/// What a failed install says: what happened, the installer's own words (the
/// end of its stderr), and what the proxy refused.
fn failure(
    packages: &[String],
    outcome: &isolate::Outcome,
    seen: &NetUsage,
    policy: &crate::model::policy::Policy,
) -> String {
    let mut why = format!("installing {} failed", packages.join(" "));
    let stderr = outcome.stderr.text();
    if outcome.timed_out {
        why.push_str(&format!(
            ": it took longer than the policy's install_timeout_s ({} s); the layer is as it was",
            policy.install_timeout_s
        ));
    } else if outcome.oom_killed {
        why.push_str(&format!(
            ": the installer ran out of memory (policy memory_mb = {}); the layer is as it was",
            policy.memory_mb
        ));
    } else if stderr.contains(LAYER_FULL) {
        // The installer's words: by the time it exits it has removed its stage,
        // so the filesystem itself no longer looks full.
        why.push_str(&format!(
            ": the session's package layer is full (packages_mb = {}); the layer is as it was",
            policy.packages_mb
        ));
    }
    let tail = match stderr.len().checked_sub(MESSAGE_TAIL) {
        Some(cut) => {
            let cut = (cut..stderr.len()).find(|i| stderr.is_char_boundary(*i)).unwrap_or(stderr.len());
            format!("...{}", &stderr[cut..])
        }
        None => stderr,
    };
    if !tail.trim().is_empty() {
        why.push_str(":\n");
        why.push_str(tail.trim_end());
    }
    if let Some(note) = crate::egress::usage::stderr_note(seen) {
        why.push('\n');
        why.push_str(note.trim_end());
    }
    why
}

/// Bytes the layer's filesystem holds, and its size, from the kernel.
fn layer_usage(layer: &std::path::Path, packages_mb: u64) -> (u64, u64) {
    let limit = packages_mb * 1024 * 1024;
    match nix::sys::statvfs::statvfs(layer) {
        Ok(fs) => {
            let used = fs.blocks().saturating_sub(fs.blocks_free()).saturating_mul(fs.fragment_size());
            (used, limit)
        }
        Err(_) => (0, limit),
    }
}
