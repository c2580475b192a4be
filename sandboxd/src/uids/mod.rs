//! The host uids sandboxes run as, and who holds each.
//!
//! A sandbox's user namespace is owned by its host uid, and the kernel charges the
//! sandbox's per-user counters (inotify, queued signals, pipe pages, fds in flight)
//! to it ([`crate::isolate::namespaces::Owner`]). So a uid is one tenant's at a
//! time, and no host account may have one:
//!
//! - sessions take uids in `[uid_base, uid_base + max_sessions)`, each its own,
//!   held until its teardown has ended ([`free`]);
//! - pooled templates take uids in the [`POOL_SPAN`] above every session's (above
//!   the highest a recovered session holds, when a restart lowered `max_sessions`),
//!   each held by a [`Lease`] for as long as the template lives;
//! - the daemon refuses to start when a host account or group has one of them
//!   (`crate::check`, item "uid range"), or when another daemon on the host
//!   claimed one of them ([`claim`]).

pub mod claim;

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// How many uids pooled templates rotate through.
pub const POOL_SPAN: u32 = 256;

/// Spans of uids as an operator reads them: `600000 to 600287, 700004`.
pub fn describe(spans: &[Range<u32>]) -> String {
    let spans: Vec<String> = spans
        .iter()
        .map(|r| match r.end.saturating_sub(r.start) {
            1 => r.start.to_string(),
            _ => format!("{} to {}", r.start, r.end.saturating_sub(1)),
        })
        .collect();
    spans.join(", ")
}

/// The lowest uid of `range` for which `taken` is false.
pub fn free(range: Range<u32>, taken: impl Fn(u32) -> bool) -> Option<u32> {
    range.into_iter().find(|u| !taken(*u))
}

/// The uids of one daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranges {
    pub sessions: Range<u32>,
    pub pool: Range<u32>,
}

impl Ranges {
    /// For `max_sessions` sessions from `uid_base`, with the pool above them, or
    /// above `highest` (a session uid recovered from disk) if that is higher.
    pub fn new(uid_base: u32, max_sessions: usize, highest: Option<u32>) -> Ranges {
        let sessions_end = uid_base.saturating_add(u32::try_from(max_sessions).unwrap_or(u32::MAX));
        let pool_start = highest.map_or(sessions_end, |h| h.saturating_add(1).max(sessions_end));
        Ranges { sessions: uid_base..sessions_end, pool: pool_start..pool_start.saturating_add(POOL_SPAN) }
    }

    /// Every uid a sandbox of this daemon may run as.
    pub fn all(&self) -> Range<u32> {
        self.sessions.start..self.pool.end
    }

    /// Every uid a sandbox of this daemon may run as once it has taken back
    /// sessions that keep `recovered` uids (which an earlier `uid_base` or
    /// `max_sessions` may have put anywhere): the sessions' range, the pool's and
    /// each recovered uid outside them, as ascending disjoint spans (the gaps
    /// between them stay out: they can be wide, and are no sandbox's).
    pub fn spans(&self, recovered: impl IntoIterator<Item = u32>) -> Vec<Range<u32>> {
        let mut all: Vec<Range<u32>> = vec![self.sessions.clone(), self.pool.clone()];
        all.extend(recovered.into_iter().map(|u| u..u.saturating_add(1)));
        all.retain(|r| !r.is_empty());
        all.sort_by_key(|r| (r.start, r.end));
        let mut merged: Vec<Range<u32>> = Vec::with_capacity(all.len());
        for r in all {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        merged
    }
}

/// The pool's uids held by live templates.
#[derive(Debug, Clone, Default)]
pub struct Leases(Arc<Mutex<BTreeSet<u32>>>);

/// One uid of [`Leases`], held until dropped (with the template that runs as it).
#[derive(Debug)]
pub struct Lease {
    held: Arc<Mutex<BTreeSet<u32>>>,
    pub uid: u32,
}

impl Leases {
    /// The first uid of `range`, from `start` on and round, that no live template
    /// holds; `None` when every one is held.
    pub fn take(&self, range: Range<u32>, start: u32) -> Option<Lease> {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let len = range.end.checked_sub(range.start)?;
        let uid = (0..len).map(|i| range.start + (start.wrapping_add(i) % len)).find(|u| !held.contains(u))?;
        held.insert(uid);
        Some(Lease { held: self.0.clone(), uid })
    }

    pub fn held(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_stay_in_their_range_and_the_pool_above_every_session() {
        let r = Ranges::new(600_000, 32, None);
        assert_eq!(r.sessions, 600_000..600_032);
        assert_eq!(r.pool, 600_032..600_288);
        assert_eq!(r.all(), 600_000..600_288);
        // A restart with a lower max_sessions recovered a session at 600_040: the
        // pool moves above it rather than share its uid.
        let r = Ranges::new(600_000, 8, Some(600_040));
        assert_eq!(r.sessions, 600_000..600_008);
        assert_eq!(r.pool, 600_041..600_297);
        assert_eq!(Ranges::new(600_000, 8, Some(600_003)).pool, 600_008..600_264);
    }

    #[test]
    fn the_spans_hold_every_uid_a_sandbox_runs_as_and_no_gap() {
        let r = Ranges::new(600_000, 2, None);
        let whole = 600_000..600_258;
        assert_eq!(r.spans([]), std::slice::from_ref(&whole));
        assert_eq!(r.spans([600_001]), [whole]);
        // uid_base lowered from 600_300: the session kept there moves the pool above it.
        let r = Ranges::new(600_000, 2, Some(600_300));
        assert_eq!(r.spans([600_300]), [600_000..600_002, 600_300..600_557]);
        // uid_base raised past a recovered session: its uid stands alone below.
        let r = Ranges::new(700_000, 2, Some(600_005));
        assert_eq!(r.spans([600_005, 600_004]), [600_004..600_006, 700_000..700_258]);
    }

    #[test]
    fn the_first_free_uid_or_none() {
        assert_eq!(free(10..13, |u| u == 10), Some(11));
        assert_eq!(free(10..13, |_| true), None);
    }

    #[test]
    fn a_live_templates_uid_is_never_taken_again() {
        let leases = Leases::default();
        let a = leases.take(100..103, 0).unwrap();
        assert_eq!(a.uid, 100);
        // Rotating on from 3 (100 + 3 % 3) comes round to 100, held: the next one.
        let b = leases.take(100..103, 3).unwrap();
        assert_eq!(b.uid, 101);
        let c = leases.take(100..103, 0).unwrap();
        assert_eq!(c.uid, 102);
        assert!(leases.take(100..103, 0).is_none(), "all three are live");
        drop(b);
        assert_eq!(leases.held(), 2);
        assert_eq!(leases.take(100..103, 0).map(|l| l.uid), Some(101));
    }
}
