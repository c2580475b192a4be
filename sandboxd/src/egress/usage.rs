//! What one run did through the egress proxy ([`Usage`]), counted as it happens by
//! every connection of the run's sandbox, read once the run is over as the
//! result's `usage.net` ([`NetUsage`]). Bounded: a run that reaches thousands of
//! hosts or is refused thousands of times keeps the first few of each.

use super::rules::Refusal;
use crate::model::run::{NetRefusal, NetUsage};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Hosts kept in a result.
pub const MAX_HOSTS: usize = NetUsage::MAX_HOSTS;
/// Refusals kept in a result (all are counted).
pub const MAX_REFUSALS: usize = NetUsage::MAX_REFUSALS;

#[derive(Debug, Default)]
pub struct Usage {
    connections: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    cached_bytes: AtomicU64,
    refused_total: AtomicU64,
    lists: Mutex<Lists>,
}

#[derive(Debug, Default)]
struct Lists {
    hosts: Vec<String>,
    refused: Vec<NetRefusal>,
}

impl Usage {
    fn lists(&self) -> std::sync::MutexGuard<'_, Lists> {
        self.lists.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn connection(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    pub fn received(&self, n: u64) {
        self.bytes_in.fetch_add(n, Ordering::Relaxed);
    }

    pub fn sent(&self, n: u64) {
        self.bytes_out.fetch_add(n, Ordering::Relaxed);
    }

    pub fn from_cache(&self, n: u64) {
        self.cached_bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// The run reached `host` (`name:port`).
    pub fn reached(&self, host: &str) {
        let mut lists = self.lists();
        if lists.hosts.len() < MAX_HOSTS && !lists.hosts.iter().any(|h| h == host) {
            lists.hosts.push(host.to_string());
        }
    }

    /// The proxy refused the run a request to `host` (`name:port`).
    pub fn refused(&self, host: &str, why: &Refusal) {
        self.refused_total.fetch_add(1, Ordering::Relaxed);
        let mut lists = self.lists();
        if lists.refused.len() < MAX_REFUSALS {
            lists.refused.push(NetRefusal {
                host: host.to_string(),
                code: why.code.into(),
                message: why.message.clone(),
            });
        }
    }

    /// As a result shows it.
    pub fn net(&self) -> NetUsage {
        let lists = self.lists();
        NetUsage {
            connections: self.connections.load(Ordering::Relaxed),
            hosts: lists.hosts.clone(),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            cached_bytes: self.cached_bytes.load(Ordering::Relaxed),
            refused: lists.refused.clone(),
            refused_total: self.refused_total.load(Ordering::Relaxed),
        }
    }
}

/// What the run's stderr gains when the proxy refused it something: one line per
/// refusal kept, so the reason is seen even where a client prints only "403"
/// (curl, uv), then how many more there were.
pub fn stderr_note(net: &NetUsage) -> Option<String> {
    if net.refused.is_empty() {
        return None;
    }
    let mut note = String::new();
    for r in &net.refused {
        note.push_str(&format!("sandboxd: the egress proxy refused {}: {}: {}\n", r.host, r.code, r.message));
    }
    let more = net.refused_total.saturating_sub(net.refused.len() as u64);
    if more > 0 {
        note.push_str(&format!("sandboxd: ... and {more} more refusals\n"));
    }
    Some(note)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_keeps_counts_and_the_first_hosts_and_refusals() {
        let u = Usage::default();
        u.connection();
        u.connection();
        u.received(10);
        u.sent(3);
        u.from_cache(7);
        for i in 0..100 {
            u.reached(&format!("h{i}:443"));
            u.reached("h0:443");
        }
        let why = Refusal::new("host_not_allowed", "evil.example is not in allow_hosts");
        for _ in 0..20 {
            u.refused("evil.example:443", &why);
        }
        let net = u.net();
        assert_eq!((net.connections, net.bytes_in, net.bytes_out, net.cached_bytes), (2, 10, 3, 7));
        assert_eq!(net.hosts.len(), MAX_HOSTS);
        assert_eq!(net.hosts[0], "h0:443");
        assert_eq!((net.refused.len(), net.refused_total), (MAX_REFUSALS, 20));
        let note = stderr_note(&net).unwrap();
        assert!(note.starts_with(
            "sandboxd: the egress proxy refused evil.example:443: host_not_allowed: evil.example is not in allow_hosts\n"
        ));
        assert!(note.ends_with("sandboxd: ... and 4 more refusals\n"), "{note}");
        assert_eq!(stderr_note(&Usage::default().net()), None);
    }
}
