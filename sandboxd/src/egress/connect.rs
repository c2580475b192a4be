//! The way out: a name resolved by the daemon itself (the sandbox has no DNS),
//! every address it gives checked ([`super::rules::forbidden`]), and a connection
//! to an address that was checked, never to the name again (no second resolution
//! between the check and the connection). Through the daemon's own outbound
//! proxy when its environment names one (`HTTPS_PROXY`, `HTTP_PROXY`,
//! `NO_PROXY`): the daemon honours its host's outbound settings, and asks that
//! proxy for the checked address too (a name it resolved itself could lead where
//! the daemon refused to go, its intranet among them).

use super::rules::{code, forbidden, Host, Refusal};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The longest a name takes to resolve.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a connection takes to be made (to the host or the outbound proxy).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest answer read from the outbound proxy to a CONNECT.
const PROXY_ANSWER: usize = 16 * 1024;

/// The daemon's own outbound proxy, from its environment.
#[derive(Debug, Clone, Default)]
pub struct Upstream {
    /// `host:port` of the proxy for https targets, and for http ones.
    https: Option<String>,
    http: Option<String>,
    /// Suffixes and names (and `*`) that go direct.
    no_proxy: Vec<String>,
}

impl Upstream {
    /// From the daemon's environment: `HTTPS_PROXY`/`https_proxy`,
    /// `HTTP_PROXY`/`http_proxy`, `NO_PROXY`/`no_proxy`.
    pub fn from_env() -> Upstream {
        let var = |a: &str, b: &str| std::env::var(a).or_else(|_| std::env::var(b)).ok().filter(|v| !v.is_empty());
        Upstream::new(var("HTTPS_PROXY", "https_proxy"), var("HTTP_PROXY", "http_proxy"), var("NO_PROXY", "no_proxy"))
    }

    pub fn new(https: Option<String>, http: Option<String>, no_proxy: Option<String>) -> Upstream {
        Upstream {
            https: https.and_then(|u| proxy_authority(&u)),
            http: http.and_then(|u| proxy_authority(&u)),
            no_proxy: no_proxy
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().trim_start_matches('.').to_ascii_lowercase())
                .filter(|s| !s.is_empty())
                .collect(),
        }
    }

    /// The proxy a connection to `host` for `tls` (https) goes through, if any.
    pub fn proxy_for(&self, host: &Host, tls: bool) -> Option<&str> {
        let name = match host {
            Host::Name(n) => n.clone(),
            Host::Ip(ip) => ip.to_string(),
        };
        let direct = self.no_proxy.iter().any(|n| n == "*" || name == *n || name.ends_with(&format!(".{n}")));
        if direct {
            return None;
        }
        if tls {
            self.https.as_deref().or(self.http.as_deref())
        } else {
            self.http.as_deref()
        }
    }

    /// Whether any proxy is configured (for the log at start).
    pub fn describe(&self) -> Option<String> {
        match (&self.https, &self.http) {
            (None, None) => None,
            (s, h) => Some(format!(
                "https via {}, http via {}",
                s.as_deref().unwrap_or("direct"),
                h.as_deref().unwrap_or("direct")
            )),
        }
    }
}

/// `host:port` of a proxy URL (`http://host:port/`, or a bare `host:port`).
fn proxy_authority(url: &str) -> Option<String> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let authority = rest.split('/').next()?.rsplit('@').next()?;
    if authority.is_empty() || url.starts_with("https://") || url.starts_with("socks") {
        return None;
    }
    Some(if authority.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) {
        authority.to_string()
    } else {
        format!("{authority}:80")
    })
}

/// Lookups at once, daemon-wide: each holds a thread of the blocking pool (the
/// system resolver blocks), which a name whose servers never answer would keep
/// past its timeout (the lookup's turn is held until it really ends).
static LOOKUPS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(32);
/// Lookups at once for one sandbox: so one cannot take all of [`LOOKUPS`].
pub const TENANT_LOOKUPS: usize = 4;

/// The addresses `host` resolves to, each checked; a host that resolves to any
/// address no sandbox may reach is refused outright (whichever address a client
/// would pick, and whatever a name's next answer would be). Always by the daemon
/// itself, also when an outbound proxy is used (which is then asked for a
/// checked address, never the name: it could resolve it otherwise).
pub async fn resolve(
    host: &Host,
    port: u16,
    local: &[IpAddr],
    tenant_lookups: Arc<tokio::sync::Semaphore>,
) -> Result<Vec<SocketAddr>, Refusal> {
    let addrs: Vec<SocketAddr> = match host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, port)],
        Host::Name(name) => {
            let name_owned = name.clone();
            let looked = tokio::time::timeout(RESOLVE_TIMEOUT, async move {
                // The sandbox's turn, then the daemon's; both go with the lookup
                // itself, which outlives this wait if its servers never answer.
                let (Ok(mine), Ok(daemons)) = (tenant_lookups.acquire_owned().await, LOOKUPS.acquire().await) else {
                    return Err(std::io::Error::other("the proxy is stopping"));
                };
                let lookup = tokio::spawn(async move {
                    let _turns = (mine, daemons);
                    tokio::net::lookup_host((name_owned.as_str(), port)).await.map(|found| found.collect::<Vec<_>>())
                });
                lookup.await.map_err(std::io::Error::other)?
            })
            .await;
            match looked {
                Ok(Ok(found)) => found,
                Ok(Err(e)) => {
                    return Err(Refusal::new(code::NAME_NOT_RESOLVED, format!("{name} did not resolve: {e}")))
                }
                Err(_) => {
                    return Err(Refusal::new(
                        code::NAME_NOT_RESOLVED,
                        format!("{name} did not resolve within {} s", RESOLVE_TIMEOUT.as_secs()),
                    ))
                }
            }
        }
    };
    check(host, &addrs, local)?;
    if addrs.is_empty() {
        return Err(Refusal::new(code::NAME_NOT_RESOLVED, format!("{} has no address", host.text())));
    }
    Ok(addrs)
}

/// Refuse `host` if any of `addrs` is forbidden.
pub fn check(host: &Host, addrs: &[SocketAddr], local: &[IpAddr]) -> Result<(), Refusal> {
    for a in addrs {
        if let Some(why) = forbidden(a.ip(), local) {
            let shown = match host {
                Host::Ip(_) => format!("{} is {why}", host.text()),
                Host::Name(n) => format!("{n} resolves to {}, {why}", a.ip()),
            };
            return Err(Refusal::new(code::ADDRESS_NOT_ALLOWED, format!("{shown}; sandboxes never reach it")));
        }
    }
    Ok(())
}

/// A connection to `host` at one of `addrs` (tried in turn), directly or through
/// the outbound proxy (a CONNECT to the address) when one applies.
pub async fn open(
    host: &Host,
    port: u16,
    addrs: &[SocketAddr],
    upstream: &Upstream,
    tls: bool,
) -> Result<TcpStream, Refusal> {
    let failed = |why: String| Refusal::new(code::CONNECT_FAILED, format!("{}:{port}: {why}", host.text()));
    let proxy = upstream.proxy_for(host, tls);
    let mut last = String::from("no address");
    for addr in addrs {
        let opened = match proxy {
            Some(proxy) => {
                through_proxy(proxy, *addr).await.map_err(|e| format!("through the outbound proxy {proxy}: {e}"))
            }
            None => match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => Ok(stream),
                Ok(Err(e)) => Err(format!("{addr}: {e}")),
                Err(_) => Err(format!("{addr}: no answer within {} s", CONNECT_TIMEOUT.as_secs())),
            },
        };
        match opened {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(e) => last = e,
        }
    }
    Err(failed(last))
}

/// A tunnel to `addr` through the HTTP proxy at `proxy`.
async fn through_proxy(proxy: &str, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let connect = async {
        let mut stream = TcpStream::connect(proxy).await?;
        let target = addr.to_string();
        stream.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes()).await?;
        // The answer's head, a byte at a time: what follows it is the tunnel's.
        let mut head = Vec::with_capacity(256);
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if head.len() >= PROXY_ANSWER || stream.read(&mut byte).await? == 0 {
                return Err(std::io::Error::other("the proxy closed the connection"));
            }
            head.push(byte[0]);
        }
        let status = head.split(|b| *b == b' ').nth(1).unwrap_or_default();
        if status != b"200" {
            let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
            return Err(std::io::Error::other(format!("it answered {}", String::from_utf8_lossy(line))));
        }
        Ok(stream)
    };
    tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| std::io::Error::other(format!("no answer within {} s", CONNECT_TIMEOUT.as_secs())))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemons_outbound_proxy_is_read_from_its_environment() {
        let u = Upstream::new(
            Some("http://proxy.corp:3128".into()),
            Some("http://user:pw@proxy.corp:8080/".into()),
            Some("internal.corp, .example.net,localhost".into()),
        );
        let h = |n: &str| Host::parse(n).unwrap();
        assert_eq!(u.proxy_for(&h("pypi.org"), true), Some("proxy.corp:3128"));
        assert_eq!(u.proxy_for(&h("pypi.org"), false), Some("proxy.corp:8080"));
        assert_eq!(u.proxy_for(&h("a.internal.corp"), true), None);
        assert_eq!(u.proxy_for(&h("x.example.net"), true), None);
        assert_eq!(u.proxy_for(&h("example.net"), true), None);
        assert_eq!(u.proxy_for(&h("badexample.net"), true), Some("proxy.corp:3128"));
        assert_eq!(Upstream::new(None, Some("proxy:3128".into()), None).proxy_for(&h("a.b"), true), Some("proxy:3128"));
        assert_eq!(Upstream::new(Some("proxy".into()), None, None).proxy_for(&h("a.b"), true), Some("proxy:80"));
        assert_eq!(Upstream::new(Some("http://p:1".into()), None, Some("*".into())).proxy_for(&h("a.b"), true), None);
        assert!(Upstream::default().describe().is_none());
    }

    #[test]
    fn a_name_with_any_forbidden_address_is_refused_naming_it() {
        let host = Host::parse("mixed.test.example").unwrap();
        let ok: SocketAddr = "198.51.100.11:443".parse().unwrap();
        let bad: SocketAddr = "127.0.0.1:443".parse().unwrap();
        assert!(check(&host, &[ok], &[]).is_ok());
        let r = check(&host, &[ok, bad], &[]).unwrap_err();
        assert_eq!(
            r.line(),
            "address_not_allowed: mixed.test.example resolves to 127.0.0.1, a loopback address; sandboxes never reach it"
        );
        let ip = Host::parse("169.254.169.254").unwrap();
        let r = check(&ip, &["169.254.169.254:80".parse().unwrap()], &[]).unwrap_err();
        assert!(r.message.starts_with("169.254.169.254 is a link-local address"), "{}", r.message);
    }

    #[tokio::test]
    async fn names_resolve_through_the_hosts_resolver_and_are_checked() {
        let local = [];
        let turns = || Arc::new(tokio::sync::Semaphore::new(TENANT_LOOKUPS));
        let r = resolve(&Host::parse("localhost").unwrap(), 80, &local, turns()).await.unwrap_err();
        assert_eq!(r.code, code::ADDRESS_NOT_ALLOWED);
        // Also with an outbound proxy: a name the daemon cannot resolve is refused,
        // never left to the proxy to resolve.
        let r = resolve(&Host::parse("no-such-name.invalid").unwrap(), 80, &local, turns()).await.unwrap_err();
        assert_eq!(r.code, code::NAME_NOT_RESOLVED);
    }

    #[tokio::test]
    async fn the_outbound_proxy_is_asked_for_the_checked_address_not_the_name() {
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = proxy.local_addr().unwrap().to_string();
        let asked = tokio::spawn(async move {
            let (mut s, _) = proxy.accept().await.unwrap();
            let mut head = vec![0u8; 512];
            let n = s.read(&mut head).await.unwrap();
            s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.unwrap();
            String::from_utf8_lossy(&head[..n]).to_string()
        });
        let upstream = Upstream::new(Some(format!("http://{at}")), None, None);
        let host = Host::parse("api.test.example").unwrap();
        let addr: SocketAddr = "198.51.100.11:443".parse().unwrap();
        open(&host, 443, &[addr], &upstream, true).await.unwrap();
        let head = asked.await.unwrap();
        assert!(head.starts_with("CONNECT 198.51.100.11:443 HTTP/1.1\r\n"), "{head}");
        assert!(!head.contains("api.test.example"), "{head}");
    }
}
