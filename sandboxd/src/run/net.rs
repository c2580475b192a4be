//! A run's way out, for a policy with network: the session as the egress proxy
//! serves it ([`crate::egress::Tenant`]: its policy's hosts and ports, its secrets)
//! and what the run's environment gains (the secrets' placeholders). Shared by
//! script runs, kernel cells and package installs.

use super::{Context, Error};
use crate::egress::rules::Rules;
use crate::egress::{Egress, Serving, Tenant};
use crate::isolate::{self, Outcome, Started};
use crate::model::policy::Network;
use crate::model::run::RunUsage;
use crate::session::Lease;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};

/// The proxy, and the session as it serves it.
pub struct Net {
    pub egress: Arc<Egress>,
    pub tenant: Arc<Tenant>,
    /// The session's secrets' placeholders, by variable name.
    pub env: BTreeMap<String, String>,
}

impl Net {
    /// The way out of `lease`'s session for run `run_id`; `None` when its policy
    /// has no network.
    pub fn of(ctx: &Context, lease: &Lease, run_id: &str) -> Result<Option<Net>, Error> {
        let policy = &lease.policy;
        if policy.network != Network::Allowlist {
            return Ok(None);
        }
        let Some(egress) = ctx.egress.clone() else {
            return Err(Error::internal(
                "the egress proxy",
                "the daemon has no egress proxy for a policy with network",
            ));
        };
        let rules = Rules::new(&policy.name, &policy.allow_hosts, &policy.allow_ports)
            .map_err(|e| Error::internal("reading the policy's allow_hosts", e))?;
        let secrets = lease.secrets();
        let env = secrets.get().environment();
        // Its package index's pages are kept while fresh (over TLS only).
        let index = crate::policy::index_authority(&policy.index_url)
            .filter(|(_, _, tls)| *tls && policy.packages_enabled())
            .and_then(|(host, port, _)| Some((host, port, crate::policy::index_path(&policy.index_url)?)));
        Ok(Some(Net { tenant: Tenant::new(&lease.id, rules, secrets, run_id, index), egress, env }))
    }

    /// What the run did through the proxy, in its usage; its refusals on its stderr
    /// too (a client may show only "403").
    pub fn finish(net: Option<&Net>, usage: &mut RunUsage, stderr: &mut String) {
        let Some(net) = net else { return };
        let seen = net.tenant.net();
        if let Some(note) = crate::egress::usage::stderr_note(&seen) {
            if !stderr.is_empty() && !stderr.ends_with('\n') {
                stderr.push('\n');
            }
            stderr.push_str(&note);
        }
        usage.net = Some(seen);
    }
}

/// Run `run` in a cold sandbox, its proxy listener (if `net`) served as the
/// session's until the run is over.
pub async fn cold(
    ctx: &Context,
    run: isolate::Run,
    net: Option<&Net>,
    chunks: Option<mpsc::Sender<isolate::output::Chunk>>,
    cancel: watch::Receiver<bool>,
) -> Result<Outcome, isolate::Error> {
    let (started_tx, started_rx) = oneshot::channel::<Started>();
    let serve = async {
        match (net, started_rx.await) {
            (Some(net), Ok(Started { listener: Some(listener), .. })) => {
                Some(net.egress.serve(listener, net.tenant.clone()))
            }
            _ => None,
        }
    };
    let (outcome, serving): (_, Option<Serving>) =
        tokio::join!(ctx.sandboxes.run(run, chunks, cancel, Some(started_tx)), serve);
    drop(serving);
    outcome
}
