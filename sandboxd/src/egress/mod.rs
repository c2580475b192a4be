//! The egress proxy: the only way out of a sandbox whose policy says
//! `network = "allowlist"`.
//!
//! Each such sandbox has a socket listening on its own `127.0.0.1:3128`, made in
//! its network namespace by its helper ([`crate::isolate::netns`]); its
//! environment points `HTTP_PROXY`, `HTTPS_PROXY` and pip there. The daemon serves
//! that socket for the run (or the kernel) that holds the sandbox
//! ([`Egress::serve`]) as the session's [`Tenant`]: who it is, what its policy
//! allows ([`rules`]), its secrets ([`secrets`]), and what the run did
//! ([`usage`]). A connection is one of:
//!
//! - `CONNECT host:port` ([`serve`]): the host and port are checked against the
//!   policy, the name is resolved by the daemon and every address checked
//!   ([`connect`]), and the bytes are relayed to a connection made to a checked
//!   address once the tunnel's TLS asks for that same host ([`sni`]); or, for a
//!   host that carries one of the session's secrets, is the package cache's, or
//!   is the session's own package index, TLS is terminated with the daemon's CA
//!   ([`tls`]) and each request forwarded ([`forward`]) over a verified connection
//!   to the real host, the secrets put in ([`secrets`]), the index's files served
//!   from or kept in the cache ([`cache`]) and its pages from or in memory while
//!   fresh ([`pages`]);
//! - a plain `http://` request, checked and forwarded the same way.
//!
//! A refusal is an HTTP 403 (502 when the host cannot be reached) whose status
//! line and body say `code: reason`, which `pip` and `requests` print; every
//! refusal is also in the run's `usage.net.refused` and on its stderr. Each
//! connection is logged with its session and run, and counted in `/metrics`.

mod bodies;
pub mod cache;
mod conn;
pub mod connect;
mod forward;
mod pages;
pub mod plain;
pub mod rules;
pub mod secrets;
mod serve;
mod sni;
pub mod tls;
pub mod usage;

use rules::Rules;
use secrets::{Live, Secrets};
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use usage::Usage;

pub use crate::isolate::spec::EGRESS_PORT;

/// Connections one sandbox may have open through the proxy at once.
pub const MAX_CONNECTIONS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Tls(#[from] tls::Error),
    #[error("reading the CA bundle {0}: {1}; set ca_bundle (SANDBOXD_CA_BUNDLE) to the host's PEM bundle of CA certificates")]
    Bundle(PathBuf, std::io::Error),
    #[error("writing {0}: {1}")]
    Write(PathBuf, std::io::Error),
    #[error("the sandboxes' CA bundle at {0}: {1}")]
    Mount(PathBuf, nix::Error),
    #[error("the package cache {0}: {1}")]
    Cache(PathBuf, std::io::Error),
}

/// What the proxy is made from (the daemon's configuration).
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the daemon keeps its state: the sandboxes' CA bundle is written here.
    pub state_dir: PathBuf,
    /// The host's CA bundle: the real servers are verified against it, and
    /// sandboxes trust it (with the proxy's CA).
    pub ca_bundle: PathBuf,
    /// The package cache's directory and size; 0 turns the cache off.
    pub cache_dir: PathBuf,
    pub cache_bytes: u64,
    /// The hosts whose files the cache keeps (PyPI's: `files.pythonhosted.org`).
    pub cache_hosts: Vec<String>,
}

/// The daemon's egress proxy: one for all sandboxes.
pub struct Egress {
    tls: tls::Tls,
    /// The bundle sandboxes trust, written for their mounts.
    bundle_path: PathBuf,
    cache: Option<Arc<cache::Cache>>,
    cache_hosts: Vec<rules::Host>,
    /// The package indexes' pages kept while fresh, with the cache ([`pages`]).
    pages: Option<Arc<pages::Pages>>,
    upstream: connect::Upstream,
    /// The host's own addresses, refused like loopback, looked up again every few
    /// seconds.
    local: Mutex<(Option<Instant>, Arc<Vec<IpAddr>>)>,
}

/// How long the host's addresses are taken as known.
const LOCAL_ADDRESSES_FOR: Duration = Duration::from_secs(5);

impl Egress {
    /// Make the proxy: its CA, the bundle sandboxes trust (the host's and the
    /// CA), the package cache.
    pub fn new(config: &Config) -> Result<Arc<Egress>, Error> {
        let bundle = std::fs::read(&config.ca_bundle).map_err(|e| Error::Bundle(config.ca_bundle.clone(), e))?;
        let tls = tls::Tls::new(&bundle, &config.ca_bundle.display().to_string())?;
        let bundle_path = publish(&config.state_dir.join("mnt").join("egress"), tls.bundle())?;
        let cache = match config.cache_bytes {
            0 => None,
            n => Some(Arc::new(
                cache::Cache::open(&config.cache_dir, n).map_err(|e| Error::Cache(config.cache_dir.clone(), e))?,
            )),
        };
        let cache_hosts = config.cache_hosts.iter().filter_map(|h| rules::Host::parse(h).ok()).collect();
        let pages = cache.as_ref().map(|_| Arc::new(pages::Pages::default()));
        let upstream = connect::Upstream::from_env();
        if let Some(via) = upstream.describe() {
            tracing::info!(%via, "the egress proxy goes out through the daemon's own outbound proxy");
        }
        Ok(Arc::new(Egress {
            tls,
            bundle_path,
            cache,
            cache_hosts,
            pages,
            upstream,
            local: Mutex::new((None, Arc::default())),
        }))
    }

    /// The file sandboxes bind over their CA bundle ([`crate::isolate::spec::Egress`]).
    pub fn bundle_path(&self) -> &Path {
        &self.bundle_path
    }

    /// The proxy's CA, PEM.
    pub fn ca_pem(&self) -> &str {
        self.tls.ca_pem()
    }

    /// Unmount the sandboxes' CA bundle (daemon shutdown, once no sandbox runs).
    pub fn unmount(&self) {
        if let Some(dir) = self.bundle_path.parent() {
            unpublish(dir);
        }
    }

    /// Serve `listener` (a sandbox's, [`crate::isolate::netns`]) for `tenant`
    /// until the returned [`Serving`] is dropped: then every connection of it ends
    /// too.
    pub fn serve(self: &Arc<Self>, listener: OwnedFd, tenant: Arc<Tenant>) -> Serving {
        let me = self.clone();
        Serving(tokio::spawn(serve::accept(me, listener, tenant)))
    }

    /// Does the cache keep files of `host`?
    fn caches(&self, host: &rules::Host) -> bool {
        self.cache.is_some() && self.cache_hosts.contains(host)
    }

    /// The pages kept of `host:port`, if it is `tenant`'s package index (over
    /// TLS) and the cache is on, and the index's path (pages are kept below it
    /// only). The proxy then ends TLS for it.
    fn pages_for<'a>(
        &'a self,
        tenant: &'a Tenant,
        host: &rules::Host,
        port: u16,
    ) -> Option<(&'a Arc<pages::Pages>, &'a str)> {
        let pages = self.pages.as_ref()?;
        match &tenant.index {
            Some((h, p, prefix)) if h == host && *p == port => Some((pages, prefix.as_str())),
            _ => None,
        }
    }

    /// The host's own addresses (refreshed every [`LOCAL_ADDRESSES_FOR`]).
    fn local_addresses(&self) -> Arc<Vec<IpAddr>> {
        let mut local = self.local.lock().unwrap_or_else(|p| p.into_inner());
        if local.0.is_none_or(|at| at.elapsed() > LOCAL_ADDRESSES_FOR) {
            let found: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
                .map(|all| {
                    all.filter_map(|i| i.address)
                        .filter_map(|a| {
                            a.as_sockaddr_in()
                                .map(|v4| IpAddr::V4(v4.ip()))
                                .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
                        })
                        .collect()
                })
                .unwrap_or_default();
            *local = (Some(Instant::now()), Arc::new(found));
        }
        local.1.clone()
    }
}

/// The file the CA bundle is in, on the tmpfs [`publish`] mounts.
const BUNDLE: &str = "ca-bundle.pem";

/// Put `bytes` (the sandboxes' CA bundle) in a small tmpfs of its own at `dir`,
/// made by host root and left read-only, replacing whatever an earlier daemon
/// left mounted there: the file sandboxes bind. On a filesystem of its own, the
/// bind shows a sandbox's mount table no host path (`/ca-bundle.pem` of a tmpfs),
/// and its mode (0644: public certificates, read by every sandbox user) opens
/// nothing of the state directory.
fn publish(dir: &Path, bytes: &[u8]) -> Result<PathBuf, Error> {
    use nix::mount::{mount, MsFlags};
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |e| Error::Mount(dir.to_path_buf(), e);
    unpublish(dir);
    match nix::unistd::mkdir(dir, nix::sys::stat::Mode::from_bits_truncate(0o755)) {
        Ok(()) | Err(nix::Error::EEXIST) => {}
        Err(e) => return Err(fail(e)),
    }
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let options = format!("size={},nr_inodes=8,mode=755", bytes.len() + 64 * 1024);
    mount(Some("tmpfs"), dir, Some("tmpfs"), flags, Some(options.as_str())).map_err(fail)?;
    let path = dir.join(BUNDLE);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&path)
        .and_then(|mut f| f.write_all(bytes));
    if let Err(e) = written {
        unpublish(dir);
        return Err(Error::Write(path, e));
    }
    let none: Option<&str> = None;
    mount(none, dir, none, flags | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY, none).map_err(fail)?;
    Ok(path)
}

/// Unmount the bundle's tmpfs at `dir`, if one is there.
fn unpublish(dir: &Path) {
    while crate::mountinfo::is_mount_point(&crate::mountinfo::read_self(), dir) {
        if nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH).is_err() {
            break;
        }
    }
}

/// One session as the proxy serves it: what its policy allows, its secrets (as
/// they are now: a change applies to the next request), and the run whose use is
/// counted now.
pub struct Tenant {
    /// The session's key, for logs.
    pub session: String,
    rules: Rules,
    secrets: Arc<Live>,
    /// The current run's id and what it did.
    run: Mutex<Current>,
    /// Places for connections at once ([`MAX_CONNECTIONS`]).
    connections: Arc<tokio::sync::Semaphore>,
    /// KiB of request bodies read whole at once ([`BODIES_KIB`]).
    bodies: Arc<tokio::sync::Semaphore>,
    /// Name lookups at once ([`connect::TENANT_LOOKUPS`]): one sandbox asking for
    /// names whose servers never answer holds these, not the daemon's.
    pub lookups: Arc<tokio::sync::Semaphore>,
    /// Its policy's package index (`index_url`'s host, port and path, over TLS)
    /// when it installs packages: its pages are kept ([`pages`]).
    index: Option<(rules::Host, u16, String)>,
}

/// What a [`Tenant`] serves now.
#[derive(Clone)]
struct Current {
    run_id: String,
    usage: Arc<Usage>,
}

/// The most KiB of request bodies the proxy holds whole for one sandbox at once
/// (to put a secret's value in and set their length); past that, bodies are
/// rewritten as they stream.
pub const BODIES_KIB: usize = 8 * 1024;

impl Tenant {
    pub fn new(
        session: &str,
        rules: Rules,
        secrets: Arc<Live>,
        run_id: &str,
        index: Option<(rules::Host, u16, String)>,
    ) -> Arc<Tenant> {
        Arc::new(Tenant {
            index,
            session: session.to_string(),
            rules,
            secrets,
            run: Mutex::new(Current { run_id: run_id.to_string(), usage: Arc::default() }),
            connections: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
            bodies: Arc::new(tokio::sync::Semaphore::new(BODIES_KIB)),
            lookups: Arc::new(tokio::sync::Semaphore::new(connect::TENANT_LOOKUPS)),
        })
    }

    fn current(&self) -> Current {
        self.run.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The session's secrets as they are now.
    fn secrets(&self) -> Arc<Secrets> {
        self.secrets.get()
    }

    /// A kernel's next cell: its use is counted from now on, apart.
    pub fn begin(&self, run_id: &str) {
        *self.run.lock().unwrap_or_else(|p| p.into_inner()) =
            Current { run_id: run_id.to_string(), usage: Arc::default() };
    }

    /// What the current run did, as its result shows it.
    pub fn net(&self) -> crate::model::run::NetUsage {
        self.current().usage.net()
    }
}

/// A sandbox's listener being served; dropping it ends that, and every
/// connection of it.
pub struct Serving(tokio::task::JoinHandle<()>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.abort();
    }
}
