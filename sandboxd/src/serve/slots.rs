//! Who holds a listener's connections, and who gives way when they are all taken.
//!
//! A connection is *anonymous* until one of its requests passes `auth`
//! ([`Connection::claim`]): then it belongs to that request's token (or to the
//! tokenless caller, where no token is needed: the Unix socket's operator, or
//! every client of a daemon without tokens). So a client that sends nothing, half
//! a request, or only requests refused 401 holds anonymous connections only, and:
//!
//! - anonymous connections are at most `anonymous` at once: a new connection past
//!   that (or past `max` in all) closes the anonymous one that has waited longest
//!   since it was opened or last answered. One whose request is being served
//!   (whole, and not refused) goes only after every other, unless such ones take
//!   more than half the places. So a flood of half-sent requests closes its own
//!   connections, not a client's that sent its request and is being answered.
//!   And every connection gets [`GRACE`] to send its request before it can be
//!   the one to go: when the one to go is younger, the new connection waits (the
//!   listener accepts no other meanwhile). A flood of connections then only slows
//!   the accepting down; it cannot close a client's before its request is in;
//! - one token holds at most `per_token` connections: its request that would claim
//!   one more is refused (429 `max_connections`), and that connection closed;
//! - when every connection is claimed, a new one is closed at once.
//!
//! Every connection also has a cut switch ([`Connection::cut`]): a session's
//! teardown uses it to end, at once, a response body that holds the session.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// The least time an anonymous connection has to send its request (or, answered,
/// its next one) before a newcomer may close it.
pub const GRACE: Duration = Duration::from_millis(250);
use tokio_util::sync::CancellationToken;

/// The limits of one listener's connections.
#[derive(Debug, Clone, Copy)]
pub struct SlotLimits {
    /// Open connections at once.
    pub max: usize,
    /// Connections not (yet) claimed by a request with a token.
    pub anonymous: usize,
    /// Connections one token holds.
    pub per_token: usize,
}

/// Whose a connection is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Claim {
    /// No request of it has passed `auth` yet.
    Anonymous,
    /// A caller that needs no token (the socket's operator, or a daemon without tokens).
    Tokenless,
    /// The token with this owner id.
    Token(String),
}

struct Entry {
    claim: Claim,
    /// When it was opened, or last began or finished a request (anonymous ones
    /// give way oldest first).
    since: Instant,
    /// Requests begun and not yet answered (their response body not yet dropped).
    in_flight: usize,
    /// Requests begun so far: which one is in progress.
    requests: u64,
    /// The request in progress is being refused (its body taken in, a 4xx sent):
    /// nothing worth keeping the connection for.
    refused: bool,
    cut: CancellationToken,
}

#[derive(Default)]
struct State {
    next: u64,
    open: HashMap<u64, Entry>,
    /// Anonymous connections without a request in progress, by `since`.
    waiting: BTreeSet<(Instant, u64)>,
    /// Anonymous connections with one, by `since`: they give way only when no
    /// idle one is left.
    serving: BTreeSet<(Instant, u64)>,
    /// Connections held per token owner id.
    held: HashMap<String, usize>,
}

impl State {
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.open.remove(&id)?;
        self.unclaim(id, &entry);
        Some(entry)
    }

    /// Change entry `id` with `f`, and file it again where it now belongs.
    fn refile(&mut self, id: u64, f: impl FnOnce(&mut Entry)) {
        let Some(mut entry) = self.open.remove(&id) else { return };
        self.unclaim(id, &entry);
        f(&mut entry);
        entry.since = Instant::now();
        if let Claim::Token(owner) = &entry.claim {
            *self.held.entry(owner.clone()).or_default() += 1;
        }
        self.file(id, &entry);
        self.open.insert(id, entry);
    }

    fn anonymous(&self) -> usize {
        self.waiting.len() + self.serving.len()
    }

    /// The anonymous connection to close first (of at most `anonymous`), and
    /// since when it waits: the oldest one not being served, unless those being
    /// served take more than half the places (then the oldest of them).
    fn victim(&self, anonymous: usize) -> Option<(Instant, u64)> {
        let oldest = |set: &BTreeSet<(Instant, u64)>| set.iter().next().copied();
        if self.serving.len() * 2 > anonymous {
            return oldest(&self.serving);
        }
        oldest(&self.waiting).or_else(|| oldest(&self.serving))
    }

    /// File an anonymous `entry` under `waiting` or `serving`.
    fn file(&mut self, id: u64, entry: &Entry) {
        if entry.claim == Claim::Anonymous {
            let set = if entry.in_flight > 0 && !entry.refused { &mut self.serving } else { &mut self.waiting };
            set.insert((entry.since, id));
        }
    }

    fn unclaim(&mut self, id: u64, entry: &Entry) {
        match &entry.claim {
            Claim::Anonymous => {
                self.waiting.remove(&(entry.since, id));
                self.serving.remove(&(entry.since, id));
            }
            Claim::Token(owner) => {
                if let Some(n) = self.held.get_mut(owner) {
                    *n -= 1;
                    if *n == 0 {
                        self.held.remove(owner);
                    }
                }
            }
            Claim::Tokenless => {}
        }
    }
}

/// The connections of one listener.
pub struct Slots {
    limits: SlotLimits,
    grace: Duration,
    state: Mutex<State>,
}

/// What [`Slots::admit`] did.
pub struct Admitted {
    /// The new connection's place, or None: every connection is claimed (close
    /// it), or (with `later`) none may be closed yet.
    pub slot: Option<Slot>,
    /// An anonymous connection was closed to make room.
    pub evicted: bool,
    /// Nothing was done: the anonymous connection to close is within its grace
    /// until then; ask again at that time.
    pub later: Option<Instant>,
}

/// A connection's place; dropping it (when the connection ends) frees it.
pub struct Slot {
    conn: Connection,
}

impl Slot {
    /// The handle requests of this connection carry (see [`Connection`]).
    pub fn connection(&self) -> Connection {
        self.conn.clone()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.conn.slots.lock().remove(self.conn.id);
    }
}

/// A connection, as its requests see it (a request extension): claim it for the
/// caller, or cut it.
#[derive(Clone)]
pub struct Connection {
    slots: Arc<Slots>,
    id: u64,
    cut: CancellationToken,
}

/// A token already holds its most connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    pub per_token: usize,
}

impl Slots {
    pub fn new(limits: SlotLimits) -> Arc<Slots> {
        Slots::with_grace(limits, GRACE)
    }

    /// With a grace other than [`GRACE`] (tests).
    pub fn with_grace(limits: SlotLimits, grace: Duration) -> Arc<Slots> {
        Arc::new(Slots { limits, grace, state: Mutex::default() })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain counters behind the lock: a panic elsewhere leaves them usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a connection just accepted (see the module's rules).
    pub fn admit(self: &Arc<Self>) -> Admitted {
        let mut state = self.lock();
        let mut evicted = false;
        if state.anonymous() >= self.limits.anonymous || state.open.len() >= self.limits.max {
            if let Some((since, victim)) = state.victim(self.limits.anonymous) {
                let ripe = since + self.grace;
                if Instant::now() < ripe {
                    return Admitted { slot: None, evicted: false, later: Some(ripe) };
                }
                if let Some(entry) = state.remove(victim) {
                    entry.cut.cancel();
                    evicted = true;
                }
            }
        }
        if state.open.len() >= self.limits.max {
            return Admitted { slot: None, evicted, later: None };
        }
        let id = state.next;
        state.next += 1;
        let now = Instant::now();
        let cut = CancellationToken::new();
        let entry =
            Entry { claim: Claim::Anonymous, since: now, in_flight: 0, requests: 0, refused: false, cut: cut.clone() };
        state.file(id, &entry);
        state.open.insert(id, entry);
        Admitted { slot: Some(Slot { conn: Connection { slots: self.clone(), id, cut } }), evicted, later: None }
    }

    /// (open, anonymous) connections now.
    pub fn counts(&self) -> (usize, usize) {
        let state = self.lock();
        (state.open.len(), state.anonymous())
    }
}

/// A request in progress on its connection ([`Connection::begin`]); dropping it
/// (with the response body, once sent) ends it.
pub struct InFlight {
    conn: Connection,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.conn.update(|entry| entry.in_flight = entry.in_flight.saturating_sub(1));
    }
}

impl Connection {
    /// Change this connection's entry with `f`, refiling it (and making it the
    /// newest of the anonymous ones).
    fn update(&self, f: impl FnOnce(&mut Entry)) {
        self.slots.lock().refile(self.id, f);
    }

    /// A request of this connection begins (its headers are in): until the
    /// returned guard is dropped, an anonymous connection gives way only after
    /// every idle one.
    pub fn begin(&self) -> InFlight {
        self.update(|entry| {
            entry.in_flight += 1;
            entry.requests += 1;
            entry.refused = false;
        });
        InFlight { conn: self.clone() }
    }

    /// The request in progress is refused before its handler: it no longer
    /// keeps an anonymous connection from giving way.
    pub fn refusing(&self) {
        self.update(|entry| entry.refused = true);
    }

    /// The connection is the caller's (`owner`: its token's owner id; None: a
    /// caller that needs no token). `Err` when that token holds its most.
    pub fn claim(&self, owner: Option<&str>) -> Result<(), Full> {
        let mut state = self.slots.lock();
        let want = match owner {
            Some(o) => Claim::Token(o.to_string()),
            None => Claim::Tokenless,
        };
        let Some(entry) = state.open.get(&self.id) else { return Ok(()) };
        if entry.claim == want {
            return Ok(());
        }
        if let Some(o) = owner {
            if state.held.get(o).copied().unwrap_or(0) >= self.slots.limits.per_token {
                return Err(Full { per_token: self.slots.limits.per_token });
            }
        }
        state.refile(self.id, |entry| entry.claim = want);
        Ok(())
    }

    /// End the connection now (its task drops it: the socket closes, and the
    /// response body being sent, with whatever it holds, is dropped).
    pub fn cut(&self) {
        self.cut.cancel();
    }

    /// Which request of the connection is in progress (see [`Connection::cut_during`]).
    pub fn request(&self) -> u64 {
        self.slots.lock().open.get(&self.id).map_or(0, |e| e.requests)
    }

    /// [`Connection::cut`], only while request `request` is still being answered:
    /// a body's hold that ends as its answer does must not cut the next request.
    pub fn cut_during(&self, request: u64) {
        let state = self.slots.lock();
        if state.open.get(&self.id).is_some_and(|e| e.requests == request && e.in_flight > 0) {
            self.cut.cancel();
        }
    }

    /// Cancelled once the connection is to end.
    pub fn cut_token(&self) -> &CancellationToken {
        &self.cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(max: usize, anonymous: usize, per_token: usize) -> Arc<Slots> {
        Slots::with_grace(SlotLimits { max, anonymous, per_token }, Duration::ZERO)
    }

    #[tokio::test]
    async fn a_new_connection_has_its_grace_before_it_can_be_closed() {
        let s = Slots::with_grace(SlotLimits { max: 8, anonymous: 1, per_token: 2 }, Duration::from_millis(200));
        let first = s.admit().slot.unwrap();
        // Full, and the one to close is younger than its grace: nothing is done yet.
        let wait = s.admit();
        assert!(wait.slot.is_none() && !wait.evicted && !first.connection().cut_token().is_cancelled());
        let ripe = wait.later.unwrap();
        assert!(ripe > Instant::now() && ripe <= Instant::now() + Duration::from_millis(200));
        tokio::time::sleep_until(ripe).await;
        let next = s.admit();
        assert!(next.slot.is_some() && next.evicted && first.connection().cut_token().is_cancelled());
    }

    #[tokio::test]
    async fn a_flood_of_anonymous_connections_closes_its_own_oldest() {
        let s = slots(8, 3, 2);
        let claimed = s.admit().slot.unwrap();
        claimed.connection().claim(Some("a")).unwrap();
        let flood: Vec<Slot> = (0..3).map(|_| s.admit().slot.unwrap()).collect();
        assert_eq!(s.counts(), (4, 3));
        // One more: the oldest anonymous one gives way, never the claimed one.
        let next = s.admit();
        assert!(next.evicted);
        assert!(flood[0].connection().cut_token().is_cancelled());
        assert!(!flood[1].connection().cut_token().is_cancelled());
        assert!(!claimed.connection().cut_token().is_cancelled());
        assert_eq!(s.counts(), (4, 3));
        // A request in progress gives way only after every idle one: the next to
        // go is flood[2], then `next`, then flood[1].
        let serving = flood[1].connection().begin();
        let _more = s.admit();
        assert!(flood[2].connection().cut_token().is_cancelled());
        assert!(!flood[1].connection().cut_token().is_cancelled());
        let _more = s.admit();
        assert!(next.slot.as_ref().unwrap().connection().cut_token().is_cancelled());
        assert!(!flood[1].connection().cut_token().is_cancelled());
        // Answered, it is idle again, and the newest.
        drop(serving);
        let _more = s.admit();
        assert!(!flood[1].connection().cut_token().is_cancelled());
        // Gone ones free their place once, however often they are dropped or cut.
        drop(flood);
        assert_eq!(s.counts(), (3, 2));
    }

    #[tokio::test]
    async fn a_cut_meant_for_one_answer_spares_the_next_request() {
        let s = slots(4, 4, 2);
        let slot = s.admit().slot.unwrap();
        let conn = slot.connection();
        let first = conn.begin();
        let during = conn.request();
        drop(first);
        // Answered: a cut for that answer comes too late, and does nothing.
        conn.cut_during(during);
        let _second = conn.begin();
        conn.cut_during(during);
        assert!(!conn.cut_token().is_cancelled());
        conn.cut_during(conn.request());
        assert!(conn.cut_token().is_cancelled());
    }

    #[tokio::test]
    async fn refused_requests_are_not_kept_and_served_ones_keep_at_most_half() {
        let s = slots(16, 4, 2);
        let a = s.admit().slot.unwrap();
        let b = s.admit().slot.unwrap();
        let _a_req = a.connection().begin();
        let _b_req = b.connection().begin();
        b.connection().refusing();
        let _c = s.admit().slot.unwrap();
        let _d = s.admit().slot.unwrap();
        // Full (4): the refused one goes first, though newer than `a`'s request.
        let _e = s.admit();
        assert!(b.connection().cut_token().is_cancelled() && !a.connection().cut_token().is_cancelled());
        // Three being served of four places: more than half, so the oldest of them goes.
        let (e, f) = (_e.slot.unwrap(), s.admit().slot.unwrap());
        let (_e_req, _f_req) = (e.connection().begin(), f.connection().begin());
        let _g = s.admit();
        assert!(a.connection().cut_token().is_cancelled());
    }

    #[tokio::test]
    async fn a_token_holds_at_most_its_share_and_a_full_listener_closes_new_ones() {
        let s = slots(4, 4, 2);
        let conns: Vec<Slot> = (0..4).map(|_| s.admit().slot.unwrap()).collect();
        conns[0].connection().claim(Some("a")).unwrap();
        conns[1].connection().claim(Some("a")).unwrap();
        // Again on the same connection: still one.
        conns[1].connection().claim(Some("a")).unwrap();
        assert_eq!(conns[2].connection().claim(Some("a")), Err(Full { per_token: 2 }));
        // Another token, and the tokenless caller (no per-token cap), are not held up.
        conns[2].connection().claim(Some("b")).unwrap();
        conns[3].connection().claim(None).unwrap();
        // Every connection is claimed: a new one has no place, nothing is evicted.
        let refused = s.admit();
        assert!(refused.slot.is_none() && !refused.evicted);
        // A connection that changes hands moves its count.
        conns[1].connection().claim(Some("b")).unwrap();
        conns[2].connection().claim(Some("a")).unwrap();
        drop(conns);
        assert_eq!(s.counts(), (0, 0));
        assert!(s.lock().held.is_empty());
    }
}
