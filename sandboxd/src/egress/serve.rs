//! One sandbox's listener, served: connections accepted within the sandbox's
//! bound ([`super::MAX_CONNECTIONS`]), each an HTTP/1.1 connection to the proxy
//! (hyper's server: the head read within [`HEAD_TIMEOUT`] and [`MAX_HEAD`]) whose
//! requests are `CONNECT host:port` (a tunnel: relayed, or terminated for a host
//! the proxy looks into) or plain `http://` requests ([`super::forward`]).
//!
//! Everything a connection does runs in its own task, in a set the accept loop
//! owns: when the run's [`super::Serving`] is dropped, the loop is aborted and
//! every connection with it.

use super::bodies::Body;
use super::conn::{reason_text, Conn};
use super::forward::{self, Target};
use super::rules::{code, Host, Refusal};
use super::usage::Usage;
use super::{connect, Egress, Tenant};
use futures_util::future::BoxFuture;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// The longest a request's head may take to arrive.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// The most bytes of a request's head.
const MAX_HEAD: usize = 64 * 1024;

/// Accept the sandbox's connections until aborted.
pub(super) async fn accept(egress: Arc<Egress>, listener: OwnedFd, tenant: Arc<Tenant>) {
    let listener = match TcpListener::from_std(std::net::TcpListener::from(listener)) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(session_id = %tenant.session, error = %e, "could not serve a sandbox's egress listener");
            return;
        }
    };
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                // The proxy answers in small writes (a TLS record, a header block):
                // with Nagle's algorithm each waited out the sandbox's delayed ACK,
                // ~40 ms per answer from the package cache.
                let _ = stream.set_nodelay(true);
                stream
            }
            Err(e) => {
                // Out of fds (the daemon's, not the sandbox's fault): wait, go on.
                tracing::warn!(session_id = %tenant.session, error = %e, "accepting a sandbox's egress connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let current = tenant.current();
        current.usage.connection();
        match tenant.connections.clone().try_acquire_owned() {
            Ok(place) => {
                let (egress, tenant) = (egress.clone(), tenant.clone());
                connections.spawn(async move {
                    connection(egress, tenant, current.run_id, current.usage, stream).await;
                    drop(place);
                });
            }
            Err(_) => {
                let why = Refusal::new(
                    code::TOO_MANY_CONNECTIONS,
                    format!("the sandbox has {} connections open through the proxy already", super::MAX_CONNECTIONS),
                );
                refuse_at_once(&stream, &why);
                current.usage.refused("-", &why);
                crate::metrics::global().egress_refused(why.code);
            }
        }
    }
}

/// Answer a connection the proxy will not serve without waiting for it: a short
/// 503 written if the socket takes it at once, then closed.
fn refuse_at_once(stream: &TcpStream, why: &Refusal) {
    let line = why.line();
    let text = format!(
        "HTTP/1.1 503 {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{line}\n",
        reason_text(&line),
        line.len() + 1
    );
    let _ = stream.try_write(text.as_bytes());
}

async fn connection(egress: Arc<Egress>, tenant: Arc<Tenant>, run_id: String, usage: Arc<Usage>, stream: TcpStream) {
    let began = Instant::now();
    let (after_tx, after_rx) = oneshot::channel();
    let conn = Arc::new(Conn { egress, tenant, run_id, usage: usage.clone(), after: Mutex::new(Some(after_tx)) });
    let counted = Counted { inner: stream, usage };
    let service = {
        let conn = conn.clone();
        let kept = Arc::new(forward::Kept::default());
        hyper::service::service_fn(move |req| {
            let (conn, kept) = (conn.clone(), kept.clone());
            async move { Ok::<_, std::convert::Infallible>(handle(&conn, &kept, req).await) }
        })
    };
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        .serve_connection(TokioIo::new(counted), service)
        .with_upgrades()
        .await;
    if let Err(e) = served {
        tracing::debug!(session_id = %conn.tenant.session, run_id = %conn.run_id, error = %e, "an egress connection ended with an error");
    }
    let tunnel = { conn.after.lock().unwrap_or_else(|p| p.into_inner()).take() };
    drop(tunnel);
    if let Ok(work) = after_rx.await {
        work.await;
    }
    tracing::debug!(session_id = %conn.tenant.session, run_id = %conn.run_id, duration_ms = began.elapsed().as_millis() as u64, "egress connection closed");
}

async fn handle(conn: &Arc<Conn>, kept: &forward::Kept, req: Request<Incoming>) -> Response<Body> {
    if req.method() == Method::CONNECT {
        return tunnel(conn, req).await;
    }
    match (req.uri().scheme_str(), req.uri().authority()) {
        (Some("http"), Some(authority)) => {
            // hyper reads a port past 65535 as none: it is not port 80.
            let written = authority.as_str().rsplit_once(':').map(|(_, p)| p);
            let written = written.filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
            let port = match (written, authority.port_u16()) {
                (_, Some(port)) => port,
                (None, None) => 80,
                (Some(written), None) => {
                    return conn.refuse(
                        authority.host(),
                        Refusal::new(code::BAD_REQUEST, format!("{written} is not a port (1 to 65535)")),
                    )
                }
            };
            let shown = format!("{}:{port}", authority.host());
            let (host, port) = match target_of(authority.host(), port) {
                Ok(t) => t,
                Err(why) => return conn.refuse(&shown, why),
            };
            // A package host's TLS port: carried there over TLS ([`super::plain`]).
            let tls = super::plain::carried(&conn.egress, &conn.tenant, &host, port);
            let target = match checked(conn, &host, port, tls).await {
                Ok(t) => t,
                Err(why) => return conn.refuse(&shown, why),
            };
            forward::plain(conn, kept, target, req).await
        }
        (Some("https"), _) => conn.refuse(
            &req.uri().to_string(),
            Refusal::new(code::BAD_REQUEST, "an https:// URL is asked of the proxy with CONNECT (HTTPS_PROXY)"),
        ),
        _ => conn.refuse(
            "-",
            Refusal::new(
                code::BAD_REQUEST,
                "this is sandboxd's egress proxy: use it as HTTP_PROXY/HTTPS_PROXY (CONNECT host:port, or an absolute http:// URL)",
            ),
        ),
    }
}

/// The host and port a request names.
fn target_of(host: &str, port: u16) -> Result<(Host, u16), Refusal> {
    let host = Host::parse(host).map_err(|e| Refusal::new(code::BAD_REQUEST, e))?;
    Ok((host, port))
}

/// `host:port` checked against the policy, resolved, and its addresses checked.
async fn checked(conn: &Conn, host: &Host, port: u16, tls: bool) -> Result<Target, Refusal> {
    conn.tenant.rules.check(host, port)?;
    let addrs = connect::resolve(host, port, &conn.egress.local_addresses(), conn.tenant.lookups.clone()).await?;
    Ok(Target { host: host.clone(), port, addrs, tls })
}

/// A `CONNECT host:port`: refused, relayed, or looked into.
async fn tunnel(conn: &Arc<Conn>, mut req: Request<Incoming>) -> Response<Body> {
    let Some(authority) = req.uri().authority().cloned() else {
        return conn.refuse("-", Refusal::new(code::BAD_REQUEST, "CONNECT without host:port"));
    };
    let shown = authority.to_string();
    let Some(port) = authority.port_u16() else {
        return conn.refuse(&shown, Refusal::new(code::BAD_REQUEST, "CONNECT without a port"));
    };
    let (host, port) = match target_of(authority.host(), port) {
        Ok(t) => t,
        Err(why) => return conn.refuse(&shown, why),
    };
    let target = match checked(conn, &host, port, true).await {
        Ok(t) => t,
        Err(why) => return conn.refuse(&shown, why),
    };
    let look_into = conn.tenant.secrets().for_host(&host)
        || conn.egress.caches(&host)
        || conn.egress.pages_for(&conn.tenant, &host, port).is_some();
    let on_upgrade = hyper::upgrade::on(&mut req);
    let work: BoxFuture<'static, ()> = if look_into {
        let acceptor = match conn.egress.tls.acceptor(&host) {
            Ok(a) => a,
            Err(e) => return conn.refuse(&shown, Refusal::new(code::CONNECT_FAILED, e.to_string())),
        };
        let conn = conn.clone();
        Box::pin(async move {
            let Ok(upgraded) = on_upgrade.await else { return };
            match acceptor.accept(TokioIo::new(upgraded)).await {
                Ok(tls) => forward::serve_inside(conn, target, tls).await,
                Err(e) => tracing::info!(
                    session_id = %conn.tenant.session,
                    run_id = %conn.run_id,
                    host = %target.host.text(),
                    error = %e,
                    "a sandbox's TLS to the proxy failed (does its client trust /etc/ssl/certs/ca-certificates.crt?)"
                ),
            }
        })
    } else {
        let shown_tunnel = shown.clone();
        let mut upstream = match connect::open(&host, port, &target.addrs, &conn.egress.upstream, true).await {
            Ok(s) => s,
            Err(why) => return conn.refuse(&shown, why),
        };
        let (conn, host) = (conn.clone(), host.clone());
        Box::pin(async move {
            let Ok(upgraded) = on_upgrade.await else { return };
            let mut sandbox = TokioIo::new(upgraded);
            // The tunnel's TLS must ask for the host the CONNECT named.
            match super::sni::read_hello(&mut sandbox, &host).await {
                Ok(hello) => {
                    if tokio::io::AsyncWriteExt::write_all(&mut upstream, &hello).await.is_ok() {
                        let _ = tokio::io::copy_bidirectional(&mut sandbox, &mut upstream).await;
                    }
                }
                // The 200 is sent: the refusal can only close the tunnel, and be
                // counted and shown on the run's stderr.
                Err(why) => drop(conn.refuse(&shown_tunnel, why)),
            }
        })
    };
    conn.reached(&shown, look_into);
    if let Some(tx) = conn.after.lock().unwrap_or_else(|p| p.into_inner()).take() {
        let _ = tx.send(work);
    }
    Response::new(http_body_util::Empty::new().map_err(|e| match e {}).boxed())
}

/// The sandbox's side of a connection, its bytes counted as the run's.
struct Counted {
    inner: TcpStream,
    usage: Arc<Usage>,
}

impl AsyncRead for Counted {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut me.inner).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        if n > 0 {
            me.usage.sent(n);
            crate::metrics::global().egress_bytes(false, n);
        }
        polled
    }
}

impl AsyncWrite for Counted {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        let polled = Pin::new(&mut me.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            me.usage.received(*n as u64);
            crate::metrics::global().egress_bytes(true, *n as u64);
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
