//! Start-up, serving and shutdown.
//!
//! Start-up: logging, root check, policies, cgroups (removing what an earlier
//! instance left), the rootfs (unpacked once), sessions taken back from disk, then
//! the Unix socket and HTTP listeners, and `READY=1` to systemd.
//! Shutdown (SIGTERM/SIGINT): drain (every new request but `GET /v1/health`, which
//! says `draining`, is answered 503 `unavailable` with `Retry-After`; the
//! listeners keep accepting), let running runs finish within the grace period,
//! then kill them; then close the listeners, letting answers in progress go out.
//! Session files stay.

use crate::api::surface::Surface;
use crate::api::{self, AppState};
use crate::config::Config;
use crate::isolate::{cgroup::Cgroups, landlock, Sandboxes};
use crate::pool::Pool;
use crate::run::Context;
use crate::serve::{serve_until_stopped, Limits, SlotLimits};
use crate::session::Manager;
use crate::{policy, rootfs};
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("sandboxd must run as root: it creates namespaces, cgroups and mounts (run it with sudo, or as the systemd service)")]
    NotRoot,
    #[error(transparent)]
    Policy(#[from] policy::Error),
    #[error(transparent)]
    Cgroup(#[from] crate::isolate::cgroup::Error),
    #[error(transparent)]
    Rootfs(#[from] rootfs::Error),
    #[error("state directory {0}: {1}")]
    State(std::path::PathBuf, std::io::Error),
    #[error("listening on {0}: {1}")]
    Listen(String, std::io::Error),
    #[error(transparent)]
    HostCheck(#[from] crate::check::Error),
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Seccomp(#[from] crate::isolate::seccomp::Error),
    #[error(transparent)]
    OwnerKey(#[from] crate::owner::Error),
    #[error(transparent)]
    Uids(#[from] crate::uids::claim::Error),
    #[error(transparent)]
    Egress(#[from] crate::egress::Error),
    #[error("{0}")]
    Secrets(String),
    #[error("{0}: give an OpenAI-compatible API's base URL, e.g. http://127.0.0.1:1234/v1, or \"off\"")]
    Chat(#[from] crate::chat::llm::BadUrl),
}

/// The chat's engine, its LLM endpoint checked now (a bad `llm_url` stops the
/// start, before anything is mounted).
fn chat_engine(config: &Config) -> Result<crate::chat::Engine, Error> {
    let endpoint = match &config.llm_url {
        None => None,
        Some(url) => Some(crate::chat::llm::Endpoint::new(
            url,
            config.llm_api_key.clone(),
            &config.ca_bundle,
            Duration::from_secs(config.llm_timeout_s),
        )?),
    };
    match &config.llm_url {
        Some(url) => tracing::info!(llm_url = %url, model = ?config.llm_model, "the chat asks this LLM endpoint"),
        None => tracing::info!("the chat is off (llm_url = \"off\")"),
    }
    Ok(crate::chat::Engine::new(crate::chat::Settings {
        endpoint,
        model: config.llm_model.clone(),
        max_turns: config.chat_max_turns,
        images: config.llm_images,
    }))
}

fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal: a log file or the journal gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    if config.log_format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

pub fn run(config: Config) -> Result<(), Error> {
    init_logging(&config);
    if !nix::unistd::geteuid().is_root() {
        return Err(Error::NotRoot);
    }
    // The host's requirements, all at once, before anything is made: a host that
    // cannot run sandboxes is refused here, naming what to fix.
    let report = crate::check::Facts::gather(&crate::check::Inputs::of(&config)).report();
    for item in report.items.iter().filter(|i| i.status == crate::model::check::Status::Warn) {
        tracing::warn!(item = %item.name, found = %item.found, fix = %item.fix, "host check");
    }
    report.require()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(Error::Runtime)?;
    runtime.block_on(serve(config))
}

async fn serve(mut config: Config) -> Result<(), Error> {
    std::fs::create_dir_all(&config.state_dir).map_err(|e| Error::State(config.state_dir.clone(), e))?;
    // Its real path, once: mounts below it are found again by that path (in
    // mountinfo), at shutdown and at the next start.
    config.state_dir =
        std::fs::canonicalize(&config.state_dir).map_err(|e| Error::State(config.state_dir.clone(), e))?;
    let policies = policy::load_dir(&config.policies_dir)?;
    tracing::info!(dir = %config.policies_dir.display(), names = ?policies.keys().collect::<Vec<_>>(), "policies loaded");

    let cgroups = Cgroups::detect(&config.instance)?;
    let stale = cgroups.remove_stale()?;
    tracing::info!(cgroup = %cgroups.describe(), removed_stale = stale, "cgroups ready");
    // From here on the instance has cgroup directories: a start that fails past
    // this point removes them (a clean stop does so itself).
    let made = cgroups.clone();
    let served = serve_with(config, policies, cgroups).await;
    if served.is_err() {
        if let Err(e) = made.remove_all() {
            tracing::warn!(error = %e, "could not remove the instance's cgroup directories");
        }
    }
    served
}

/// [`serve`] once the instance's cgroups are made.
async fn serve_with(
    config: Config,
    policies: std::collections::BTreeMap<String, crate::model::policy::Policy>,
    cgroups: Cgroups,
) -> Result<(), Error> {
    let chat = Arc::new(chat_engine(&config)?);
    let abi = landlock::kernel_abi();
    if abi < landlock::TARGET_ABI as i32 {
        tracing::warn!(kernel_abi = abi, wanted = landlock::TARGET_ABI as i32, "Landlock is missing or older than expected: sandboxes are enforced partly, relying on mount namespaces and seccomp for the rest");
    }
    // The seccomp filter, compiled once here; every sandbox only loads it.
    let filter = crate::isolate::seccomp::filter()?;
    tracing::info!(instructions = filter.instructions().len(), "seccomp filter compiled (libseccomp)");

    let tarball = config.rootfs_tarball.clone();
    let state_dir = config.state_dir.clone();
    let rootfs = tokio::task::spawn_blocking(move || rootfs::ensure(&tarball, &state_dir))
        .await
        .map_err(|e| Error::State(config.state_dir.clone(), std::io::Error::other(e)))??;
    tracing::info!(path = %rootfs.path.display(), python = %rootfs.manifest["python_version"], "rootfs ready");

    // Every policy's secrets, read now: a policy whose secret cannot be read stops
    // the start, naming it.
    let secrets = crate::session::secrets::resolve(policies.values()).map_err(Error::Secrets)?;
    let network = policies.values().any(|p| p.network == crate::model::policy::Network::Allowlist);
    let sessions =
        Manager::new(&config.state_dir, policies, config.max_sessions, config.session_ttl_s, config.uid_base)
            .map_err(|e| Error::State(config.state_dir.clone(), e))?
            .with_token_quotas(config.token_max_sessions, config.token_max_runs)
            .with_overcommit(config.workspace_overcommit)
            .with_secrets(secrets);
    // Owner ids of tokens are keyed with this daemon's secret; sessions an
    // earlier daemon keyed the old way are moved to theirs as they are taken back.
    let owner_key = crate::owner::OwnerKey::load_or_create(&config.state_dir)?;
    let rekey = owner_key.rekeying(config.tokens.iter().chain(&config.operator_tokens));
    let recovered = sessions.recover(&rekey).await;
    if recovered > 0 {
        tracing::info!(sessions = recovered, "took back sessions from an earlier run");
    }
    // The pool's uids: above every session's, a recovered one's included. Those
    // and the uids recovered sessions keep may lie outside the range checked at
    // start: no host account may have one either.
    let held = sessions.uids();
    let uids = crate::uids::Ranges::new(config.uid_base, config.max_sessions, held.iter().copied().max());
    let inputs = crate::check::Inputs { uids: uids.spans(held), ..crate::check::Inputs::of(&config) };
    // Nor may another daemon on the host run sandboxes as them: the claim is held
    // until this function returns.
    let uid_check = crate::model::check::Report::new(vec![crate::check::uid_range_of(&inputs.uids)]);
    let claimed = uid_check
        .require()
        .map_err(Error::from)
        .and_then(|()| crate::uids::claim::claim(&inputs.uids).map_err(Error::from));
    // The egress proxy, when any policy has network: its CA, the bundle sandboxes
    // trust, the package cache. Made once the claim is held: its bundle is mounted
    // in the state directory, which a start that fails must leave as it was.
    let started = claimed.and_then(|claim| Ok((claim, egress(&config, network)?)));
    let (_uids_claimed, egress) = match started {
        Ok(both) => both,
        Err(e) => {
            sessions.unmount_all().await;
            rootfs.unmount();
            return Err(e);
        }
    };
    let sandboxes = Sandboxes::new(cgroups, config.ready_sandboxes, config.max_sessions);
    sandboxes.prewarm();
    let library = if config.pool_size > 0 { pool_library() } else { None };
    let pool = Pool::new(
        sandboxes.clone(),
        library,
        rootfs.path.clone(),
        egress.as_ref().map(|e| e.bundle_path().to_path_buf()),
        sessions.policies().map(|p| (p.name.clone(), p.clone())).collect(),
        config.pool_size,
        config.pool_memory_mb << 20,
        Duration::from_secs(config.pool_idle_s),
        uids.pool,
    );
    let sessions = Arc::new(sessions);
    let ctx = Context {
        sandboxes: sandboxes.clone(),
        pool: pool.clone(),
        rootfs: rootfs.path.clone(),
        public_url: config.public_url.clone(),
        egress: egress.clone(),
        uv_seed: Default::default(),
    };
    // `GET /v1/check` and health check the host with the uids found here.
    let service = crate::service::Service::new(sessions.clone(), ctx, inputs);
    let state = Arc::new(AppState {
        service: Arc::new(service.clone()),
        tokens: api::Tokens::new(owner_key, &config.tokens, &config.operator_tokens),
        version: env!("CARGO_PKG_VERSION"),
        rootfs_sha256: rootfs.sha256.clone(),
        landlock_abi: abi,
        shutdown: tokio_util::sync::CancellationToken::new(),
        mcp_sessions: api::mcp::SessionLimits {
            max: config.mcp_max_sessions,
            per_token: config.token_mcp_max_sessions,
            idle: Duration::from_secs(config.mcp_session_idle_s),
        },
        mcp: Default::default(),
        chat,
    });

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut servers = tokio::task::JoinSet::new();
    let body_timeout = Duration::from_secs(config.body_timeout_s);
    let limits = Limits {
        slots: SlotLimits {
            max: config.max_connections,
            anonymous: config.max_anonymous_connections,
            per_token: config.token_max_connections,
        },
        header_timeout: Duration::from_secs(config.header_timeout_s),
        send_timeout: Duration::from_secs(config.send_timeout_s),
        // Runs have ended when the listeners close; answers still going out (a
        // download) get this long, then whatever a client still holds open is cut.
        drain: Duration::from_secs(config.shutdown_grace_s + 10),
    };

    let unix = bind_unix(&config)?;
    tracing::info!(path = %config.socket.display(), "listening on the Unix socket");
    let app = api::router(state.clone(), Surface::unix(body_timeout).draining(state.shutdown.clone()));
    serve_until_stopped(&mut servers, unix, "unix", app, limits.clone(), stop_rx.clone());
    if let Some(addr) = config.http {
        let (tcp, bound) = bind_tcp(addr).await?;
        tracing::info!(addr = %bound, "listening on HTTP");
        let surface = Surface::http(bound, &config.public_url, body_timeout).draining(state.shutdown.clone());
        let app = api::router(state.clone(), surface);
        serve_until_stopped(&mut servers, tcp, "http", app, limits.clone(), stop_rx.clone());
    }
    if let Some(addr) = config.metrics_listen {
        let (tcp, bound) = bind_tcp(addr).await?;
        tracing::info!(addr = %bound, "serving GET /metrics without a token");
        let surface = Surface::http(bound, &config.public_url, body_timeout).draining(state.shutdown.clone());
        let app = api::metrics_router(state.clone(), surface);
        serve_until_stopped(&mut servers, tcp, "metrics", app, limits, stop_rx.clone());
    }

    let (reaper, unmount_after) = (sessions.clone(), Duration::from_secs(config.workspace_idle_unmount_s));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            reaper.reap_expired().await;
            reaper.unmount_idle(unmount_after).await;
            reaper.share_disk().await;
        }
    });

    notify_systemd("READY=1");
    wait_for_signal().await;
    tracing::info!(grace_s = config.shutdown_grace_s, running = sessions.busy_count(), "shutting down");
    notify_systemd("STOPPING=1");
    // Drain: new requests are answered 503 `unavailable` with `Retry-After` (the
    // listeners keep accepting), runs in flight get the grace period to finish.
    service.drain();
    state.shutdown.cancel();
    let killer = sessions.clone();
    let grace = Duration::from_secs(config.shutdown_grace_s);
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        if killer.busy_count() > 0 {
            tracing::warn!("grace period over: killing the runs still going");
            killer.cancel_all();
        }
    });
    // Wait for the runs (killed after the grace period), but not past the kill's
    // own time: what is still busy then is torn down with everything else below.
    let hard_stop = tokio::time::Instant::now() + grace + Duration::from_secs(30);
    while sessions.busy_count() > 0 {
        if tokio::time::Instant::now() >= hard_stop {
            tracing::error!(busy = sessions.busy_count(), "runs did not end after the kill: stopping anyway");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The drain is over: stop accepting, let the answers in progress go out.
    let _ = stop_tx.send(true);
    while servers.join_next().await.is_some() {}
    sessions.stop_kernels().await;
    pool.shutdown().await;
    sandboxes.shutdown().await;
    match sandboxes.cgroups.remove_all() {
        Ok(0) => {}
        Ok(left) => tracing::warn!(left, "run cgroups were still there at the end: killed and removed"),
        Err(e) => tracing::warn!(error = %e, "could not remove the instance's cgroup directories"),
    }
    sessions.unmount_all().await;
    rootfs.unmount();
    if let Some(e) = &egress {
        e.unmount();
    }
    let _ = std::fs::remove_file(&config.socket);
    tracing::info!("stopped");
    Ok(())
}

/// The egress proxy, when some policy has network (`network`).
fn egress(config: &Config, network: bool) -> Result<Option<Arc<crate::egress::Egress>>, Error> {
    if !network {
        return Ok(None);
    }
    let egress = crate::egress::Egress::new(&crate::egress::Config {
        state_dir: config.state_dir.clone(),
        ca_bundle: config.ca_bundle.clone(),
        cache_dir: config.package_cache_dir.clone(),
        cache_bytes: config.package_cache_mb * 1024 * 1024,
        cache_hosts: config.package_cache_hosts.clone(),
    })?;
    tracing::info!(ca_bundle = %config.ca_bundle.display(), package_cache = %config.package_cache_dir.display(), "egress proxy ready");
    Ok(Some(egress))
}

/// A TCP listener on `addr`, and the address it got (the port, when `addr` asked for 0).
async fn bind_tcp(addr: std::net::SocketAddr) -> Result<(tokio::net::TcpListener, std::net::SocketAddr), Error> {
    let tcp = tokio::net::TcpListener::bind(addr).await.map_err(|e| Error::Listen(addr.to_string(), e))?;
    let bound = tcp.local_addr().map_err(|e| Error::Listen(addr.to_string(), e))?;
    Ok((tcp, bound))
}

fn bind_unix(config: &Config) -> Result<tokio::net::UnixListener, Error> {
    let path = &config.socket;
    let err = |e| Error::Listen(path.display().to_string(), e);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            "another sandboxd is serving this socket: stop it, or use --socket",
        )));
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(err)?;
    match nix::unistd::Group::from_name(&config.socket_group) {
        Ok(Some(group)) => std::os::unix::fs::chown(path, None, Some(group.gid.as_raw())).map_err(err)?,
        _ => {
            tracing::info!(group = %config.socket_group, "socket group does not exist: the socket is usable by root only")
        }
    }
    Ok(listener)
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        // Without signal handlers the daemon can only be killed; keep serving.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
}

/// Tell systemd (Type=notify) about our state, when started by it.
fn notify_systemd(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sock = match std::os::unix::net::UnixDatagram::unbound() {
        Ok(s) => s,
        Err(_) => return,
    };
    let bytes = path.as_encoded_bytes();
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name)
            .and_then(|addr| sock.send_to_addr(state.as_bytes(), &addr))
    } else {
        sock.send_to(state.as_bytes(), std::path::Path::new(&path))
    };
    if let Err(e) = sent {
        tracing::warn!(error = %e, "could not notify systemd");
    }
}

/// Where `libsandboxd.so` (built with the daemon; pooled templates load it to make
/// each fork a sandbox of its own) is looked for: beside the executable (the build
/// tree), then `../lib/sandboxd/` from it (`make install`).
pub const POOL_LIBRARY: &str = "libsandboxd.so";

fn pool_library() -> Option<std::fs::File> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let candidates = [dir.join(POOL_LIBRARY), dir.join("../lib/sandboxd").join(POOL_LIBRARY)];
    for path in &candidates {
        if let Ok(file) = std::fs::File::open(path) {
            tracing::info!(path = %path.display(), "pool library");
            return Some(file);
        }
    }
    tracing::warn!(
        looked_in = ?candidates,
        "the pool is off: {POOL_LIBRARY} is missing (build it with `cargo build --release`, or install it with `make install`)"
    );
    None
}
