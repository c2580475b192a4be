//! MCP protocol sessions (streamable HTTP's `Mcp-Session-Id`): bounded, and bound
//! to the token that made them.
//!
//! rmcp keeps each protocol session in memory (a worker task, its channels and
//! caches: about 83 KB) until it is closed: 9,000 `initialize` calls in 8 s once
//! held 750 MB. Three pieces bound that:
//!
//! - [`guard`], in front of rmcp's service at `/mcp` (after `auth`, so it knows
//!   the [`Caller`]). A request that may make a session (a POST without
//!   `Mcp-Session-Id`) first takes a [`Place`] ([`Registry::reserve`]): within the
//!   daemon's `mcp_max_sessions` and the token's `token_mcp_max_sessions`,
//!   counting the initializes still in flight, so a burst cannot pass either; past
//!   them it is answered 429 `max_sessions` with what to do and `Retry-After`. A
//!   request naming a session passes only if the session is the caller's: another
//!   token's id gets exactly the answer an unknown id gets (404
//!   `session_not_found`), for POST, GET and DELETE alike.
//! - [`Bound`], the session manager rmcp calls (rmcp's own in-memory one inside).
//!   When rmcp makes a session it binds it to the place its request took (handed
//!   over in a task-local: rmcp's session manager never sees the HTTP request), and
//!   when rmcp closes one (DELETE, [`reap`], a failed handshake) it frees the
//!   place.
//! - [`reap`] closes each session that has had no request in flight and none for
//!   `mcp_session_idle_s`. rmcp's own keep-alive is off: its clock counts only
//!   messages, so it closed a session in the middle of a tool call that ran longer
//!   than the keep-alive without progress notifications.

use crate::api::error::ApiError;
use crate::model::error::Code;
use crate::service::Caller;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, LocalSessionManagerError};
use rmcp::transport::streamable_http_server::session::{EventStore, ServerSseMessage, SessionId, SessionManager};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The header that names a protocol session.
pub const HEADER: &str = "mcp-session-id";

/// How many protocol sessions may be held, and for how long an idle one is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// In the whole daemon (`mcp_max_sessions`).
    pub max: usize,
    /// By one token (`token_mcp_max_sessions`); callers without a token (no
    /// `tokens` configured) are held to `max` alone.
    pub per_token: usize,
    /// A session with no request in flight and none for this long is closed (`mcp_session_idle_s`).
    pub idle: Duration,
}

/// The protocol sessions of `/mcp` and the places taken for them.
pub struct Registry {
    limits: SessionLimits,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    sessions: HashMap<SessionId, Entry>,
    /// Per owner: its sessions and its places still being initialized.
    per_owner: HashMap<Option<String>, usize>,
    total: usize,
}

struct Entry {
    owner: Option<String>,
    /// When a request naming it last came or ended.
    last_used: Instant,
    /// Requests naming it whose answers are still going (a tool call's, a GET
    /// stream's): a session is never idle while one is.
    in_flight: usize,
}

impl Entry {
    /// How long until it is idle long enough to be closed (None while in use).
    fn expires_in(&self, idle: Duration, now: Instant) -> Option<Duration> {
        (self.in_flight == 0).then(|| idle.saturating_sub(now.saturating_duration_since(self.last_used)))
    }
}

/// A place for one session, taken before its `initialize` reaches rmcp. It
/// becomes the session's when rmcp makes it ([`Bound::create_session`]); a place
/// no session took is given back when its request ends.
pub struct Place {
    registry: Arc<Registry>,
    owner: Option<String>,
    bound: AtomicBool,
}

impl Drop for Place {
    fn drop(&mut self) {
        if !self.bound.load(Ordering::SeqCst) {
            self.registry.lock().give_back(&self.owner);
        }
    }
}

/// Why a place was refused: whose limit is full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Full {
    /// True: the token's own limit; false: the daemon's.
    pub token: bool,
    pub limit: usize,
    /// When the first of the sessions that count against that limit may expire.
    pub retry_after: Duration,
    pub idle: Duration,
}

impl Held {
    fn give_back(&mut self, owner: &Option<String>) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.per_owner.get_mut(owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_owner.remove(owner);
            }
        }
    }
}

impl Registry {
    pub fn new(limits: SessionLimits) -> Arc<Registry> {
        Arc::new(Registry { limits, held: Mutex::new(Held::default()) })
    }

    pub fn limits(&self) -> SessionLimits {
        self.limits
    }

    /// The counts stay right even if a holder of the lock panicked: every change
    /// to them is made whole under the lock.
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take a place for a session of `owner`'s, within both limits.
    pub fn reserve(self: &Arc<Self>, owner: Option<String>) -> Result<Place, Full> {
        let mut held = self.lock();
        let now = Instant::now();
        let soonest = |held: &Held, token: bool| {
            let mut counted = held.sessions.values().filter(|e| !token || e.owner == owner).peekable();
            let soonest = match counted.peek() {
                // Only initializes in flight hold it: they end within moments.
                None => Duration::ZERO,
                // The first idle one to expire; if every one is in use, a whole idle time.
                Some(_) => {
                    counted.filter_map(|e| e.expires_in(self.limits.idle, now)).min().unwrap_or(self.limits.idle)
                }
            };
            // Whole seconds, and the reaper's second.
            Duration::from_secs(soonest.as_secs() + 1)
        };
        let mine = held.per_owner.get(&owner).copied().unwrap_or(0);
        if owner.is_some() && mine >= self.limits.per_token {
            let retry_after = soonest(&held, true);
            return Err(Full { token: true, limit: self.limits.per_token, retry_after, idle: self.limits.idle });
        }
        if held.total >= self.limits.max {
            let retry_after = soonest(&held, false);
            return Err(Full { token: false, limit: self.limits.max, retry_after, idle: self.limits.idle });
        }
        held.total += 1;
        *held.per_owner.entry(owner.clone()).or_default() += 1;
        Ok(Place { registry: self.clone(), owner, bound: AtomicBool::new(false) })
    }

    /// Session `id`, just made, takes `place` (which must not have one yet).
    fn bind(&self, place: &Place, id: &SessionId) -> bool {
        let mut held = self.lock();
        if place.bound.swap(true, Ordering::SeqCst) {
            return false;
        }
        held.sessions.insert(id.clone(), Entry { owner: place.owner.clone(), last_used: Instant::now(), in_flight: 0 });
        true
    }

    /// Session `id` is gone: its place is free (nothing when it was never bound).
    fn release(&self, id: &str) {
        let mut held = self.lock();
        if let Some(entry) = held.sessions.remove(id) {
            held.give_back(&entry.owner);
        }
    }

    /// A request of `owner`'s naming session `id`: in use until the [`Visit`] is
    /// dropped (its answer ended). None when `id` is not a session of `owner`'s.
    pub fn enter(self: &Arc<Self>, id: &str, owner: &Option<String>) -> Option<Visit> {
        let mut held = self.lock();
        let (key, entry) = held.sessions.get_key_value(id)?;
        if entry.owner != *owner {
            return None;
        }
        let key = key.clone();
        let entry = held.sessions.get_mut(id)?;
        entry.in_flight += 1;
        entry.last_used = Instant::now();
        Some(Visit { registry: self.clone(), id: key })
    }

    /// The sessions idle for the idle time: no request in flight, none for that long.
    pub fn expired(&self) -> Vec<SessionId> {
        let now = Instant::now();
        let held = self.lock();
        held.sessions
            .iter()
            .filter(|(_, e)| e.expires_in(self.limits.idle, now).is_some_and(|left| left.is_zero()))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Sessions held, and places in flight, in the whole daemon.
    pub fn total(&self) -> usize {
        self.lock().total
    }
}

/// A request naming a session, from when it came until its answer ended.
pub struct Visit {
    registry: Arc<Registry>,
    id: SessionId,
}

impl Drop for Visit {
    fn drop(&mut self) {
        let mut held = self.registry.lock();
        if let Some(entry) = held.sessions.get_mut(&self.id) {
            entry.in_flight = entry.in_flight.saturating_sub(1);
            entry.last_used = Instant::now();
        }
    }
}

/// Close, once a second, every session [`Registry::expired`] names, until `stop`.
pub async fn reap(registry: Arc<Registry>, sessions: Arc<LocalSessionManager>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        for id in registry.expired() {
            registry.release(&id);
            if let Err(e) = sessions.close_session(&id).await {
                tracing::warn!(error = %e, "could not close an idle MCP session");
            }
        }
    }
}

impl Full {
    pub fn message(&self) -> String {
        let (whose, key) = if self.token {
            ("this token holds", "token_mcp_max_sessions")
        } else {
            ("the daemon holds", "mcp_max_sessions")
        };
        format!(
            "{whose} {limit} MCP sessions, its most ({key}): end one you no longer use with DELETE /mcp and its \
             Mcp-Session-Id header, or retry in {retry} s (a session is closed once it has had no request for \
             {idle} s)",
            limit = self.limit,
            retry = self.retry_after.as_secs(),
            idle = self.idle.as_secs(),
        )
    }
}

impl IntoResponse for Full {
    fn into_response(self) -> Response {
        let mut response = ApiError::new(Code::MaxSessions, self.message()).into_response();
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(self.retry_after.as_secs()));
        response
    }
}

/// The answer to a request that names no session of the caller's, whether the id
/// is unknown, expired or another token's: the same, whatever the id.
pub fn unknown(limits: SessionLimits) -> Response {
    ApiError::new(
        Code::SessionNotFound,
        format!(
            "no such MCP session: it was closed, or expired after {} s without a request; start a new one with an \
             initialize request (POST /mcp without Mcp-Session-Id)",
            limits.idle.as_secs()
        ),
    )
    .into_response()
}

tokio::task_local! {
    /// The place the request being served took, for the session rmcp makes for it.
    static PLACE: Arc<Place>;
}

/// In front of rmcp's `/mcp` service: places for new sessions, and each request
/// that names a session let through only to the caller's own.
pub async fn guard(State(registry): State<Arc<Registry>>, req: Request, next: Next) -> Response {
    let Some(caller) = req.extensions().get::<Caller>().cloned() else {
        return ApiError::internal("serving /mcp", "a request reached MCP without a caller").into_response();
    };
    let mut ids = req.headers().get_all(HEADER).iter();
    match (ids.next(), ids.next()) {
        // Only a POST makes a session (an initialize); rmcp answers the rest.
        (None, _) if req.method() == Method::POST => match registry.reserve(caller.owner) {
            Ok(place) => PLACE.scope(Arc::new(place), next.run(req)).await,
            Err(full) => {
                tracing::debug!(token = full.token, limit = full.limit, "MCP session refused: at its limit");
                full.into_response()
            }
        },
        (None, _) => next.run(req).await,
        (Some(id), None) => match id.to_str().ok().and_then(|id| registry.enter(id, &caller.owner)) {
            Some(visit) => {
                // In use until its answer (a tool call's events, a GET stream) has ended.
                let (parts, body) = next.run(req).await.into_parts();
                let body = body.into_data_stream().map(move |chunk| {
                    let _in_use = &visit;
                    chunk
                });
                Response::from_parts(parts, axum::body::Body::from_stream(body))
            }
            None => unknown(registry.limits),
        },
        (Some(_), Some(_)) => {
            ApiError::new(Code::InvalidRequest, "more than one Mcp-Session-Id header: send the session's id once")
                .into_response()
        }
    }
}

/// Why [`Bound`] could not do what rmcp asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
    /// rmcp asked for a session outside a request that took a place for it
    /// ([`guard`] is not in front), or twice in one request.
    #[error("an MCP session was asked for by a request without a place for it")]
    NoPlace,
}

/// rmcp's in-memory session manager, with every session bound to its place.
pub struct Bound {
    inner: Arc<LocalSessionManager>,
    registry: Arc<Registry>,
}

impl Bound {
    /// Sessions are closed by [`reap`] (give it [`Bound::sessions`]), not by rmcp's keep-alive.
    pub fn new(registry: Arc<Registry>) -> Bound {
        let mut inner = LocalSessionManager::default();
        inner.session_config.keep_alive = None;
        Bound { inner: Arc::new(inner), registry }
    }

    /// rmcp's session manager inside, for [`reap`].
    pub fn sessions(&self) -> Arc<LocalSessionManager> {
        self.inner.clone()
    }
}

impl SessionManager for Bound {
    type Error = Error;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Error> {
        let place = PLACE.try_with(Arc::clone).map_err(|_| Error::NoPlace)?;
        if place.bound.load(Ordering::SeqCst) {
            return Err(Error::NoPlace);
        }
        let (id, transport) = self.inner.create_session().await?;
        // rmcp closes a session only through this manager, and not before the
        // caller has the transport: the binding is in place first.
        if !self.registry.bind(&place, &id) {
            let _ = self.inner.close_session(&id).await;
            return Err(Error::NoPlace);
        }
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Error> {
        self.registry.release(id);
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Error> {
        Ok(self.inner.create_stream(id, message).await?)
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Error> {
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Error> {
        Ok(self.inner.resume(id, last_event_id).await?)
    }

    // `restore_session` keeps the trait's default (not supported): a session is
    // made only by an initialize that took a place.

    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per_token: usize) -> SessionLimits {
        SessionLimits { max, per_token, idle: Duration::from_secs(300) }
    }

    fn bound(registry: &Arc<Registry>, owner: Option<&str>, id: &str) -> SessionId {
        let place = registry.reserve(owner.map(String::from)).unwrap();
        let id: SessionId = id.into();
        assert!(registry.bind(&place, &id));
        id
    }

    #[test]
    fn places_in_flight_count_and_are_given_back() {
        let r = Registry::new(limits(2, 2));
        let a = r.reserve(None).unwrap();
        let b = r.reserve(None).unwrap();
        let full = r.reserve(None).err().unwrap();
        assert!(!full.token && full.limit == 2, "{full:?}");
        assert_eq!(full.retry_after, Duration::from_secs(1), "only initializes in flight: retry at once");
        drop(a);
        assert_eq!(r.total(), 1);
        let c = r.reserve(None).unwrap();
        drop((b, c));
        assert_eq!(r.total(), 0);
    }

    #[test]
    fn a_bound_place_is_held_until_its_session_is_released() {
        let r = Registry::new(limits(1, 1));
        let id = bound(&r, Some("t1"), "s1");
        assert_eq!(r.total(), 1);
        assert!(r.reserve(Some("t2".into())).is_err());
        r.release(&id);
        r.release(&id);
        assert_eq!(r.total(), 0);
        assert!(r.reserve(Some("t2".into())).is_ok());
    }

    #[test]
    fn one_token_at_its_limit_leaves_room_for_another() {
        let r = Registry::new(limits(4, 2));
        bound(&r, Some("t1"), "a");
        bound(&r, Some("t1"), "b");
        let full = r.reserve(Some("t1".into())).err().unwrap();
        assert!(full.token && full.limit == 2);
        assert!((300..=301).contains(&full.retry_after.as_secs()), "{full:?}");
        assert!(full.message().contains("token_mcp_max_sessions") && full.message().contains("DELETE /mcp"));
        bound(&r, Some("t2"), "c");
        // No per-token limit without a token: only the daemon's.
        bound(&r, None, "d");
        let full = r.reserve(None).err().unwrap();
        assert!(!full.token && full.message().contains("mcp_max_sessions"));
    }

    #[test]
    fn a_session_answers_only_its_owner() {
        let r = Registry::new(limits(4, 4));
        let id = bound(&r, Some("t1"), "s1");
        assert!(r.enter(&id, &Some("t1".into())).is_some());
        assert!(r.enter(&id, &Some("t2".into())).is_none());
        assert!(r.enter(&id, &None).is_none());
        assert!(r.enter("unknown", &Some("t1".into())).is_none());
        let place = r.reserve(Some("t1".into())).unwrap();
        assert!(r.bind(&place, &"s2".into()));
        assert!(!r.bind(&place, &"s3".into()), "one session per place");
    }

    #[test]
    fn a_session_in_use_never_expires_and_an_idle_one_does() {
        let r = Registry::new(SessionLimits { max: 4, per_token: 4, idle: Duration::from_millis(50) });
        let busy = bound(&r, None, "busy");
        let idle = bound(&r, None, "idle");
        let visit = r.enter(&busy, &None).unwrap();
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(r.expired(), vec![idle.clone()]);
        // Full, with only sessions in use: a whole idle time (rounded up to seconds).
        r.release(&idle);
        let r2 = Registry::new(SessionLimits { max: 1, per_token: 1, idle: Duration::from_secs(7) });
        let only = bound(&r2, None, "only");
        let _in_use = r2.enter(&only, &None).unwrap();
        assert_eq!(r2.reserve(None).err().unwrap().retry_after, Duration::from_secs(8));
        // Its answer ended: idle from now on.
        drop(visit);
        assert!(r.expired().is_empty());
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(r.expired(), vec![busy]);
    }
}
