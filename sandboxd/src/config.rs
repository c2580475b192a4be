//! Daemon configuration: `/etc/sandboxd/sandboxd.toml`, then `SANDBOXD_*`
//! environment variables, then flags, each overriding the one before.
//! `sandboxd --print-config` prints the effective values.

use clap::Parser;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading config file {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("config file {0}: {1}")]
    Parse(PathBuf, String),
    #[error("config key `{key}`: {reason}")]
    Invalid { key: &'static str, reason: String },
}

pub const DEFAULT_CONFIG_FILE: &str = "/etc/sandboxd/sandboxd.toml";

/// Every setting, optional: the same struct is read from the config file and from
/// the command line / environment, and the two are merged.
#[derive(Debug, Clone, Default, Parser, Deserialize)]
#[serde(deny_unknown_fields)]
#[command(name = "sandboxd", version, about = "Runs untrusted Python in native Linux sandboxes and serves the results")]
pub struct Settings {
    /// Config file to read (default /etc/sandboxd/sandboxd.toml; a missing default file is fine).
    #[arg(long, env = "SANDBOXD_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    #[serde(skip)]
    pub print_config: bool,
    #[command(subcommand)]
    #[serde(skip)]
    pub command: Option<Command>,

    /// Unix socket path for the API.
    #[arg(long, env = "SANDBOXD_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Group that may use the Unix socket (mode 0660); ignored if it does not exist.
    #[arg(long, env = "SANDBOXD_SOCKET_GROUP")]
    pub socket_group: Option<String>,
    /// HTTP listen address; "off" disables HTTP.
    #[arg(long, env = "SANDBOXD_HTTP")]
    pub http: Option<String>,
    /// A second HTTP listen address that serves only `GET /metrics`, without a
    /// token (e.g. 127.0.0.1:9464 for a Prometheus scraper); default off.
    #[arg(long, env = "SANDBOXD_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Base URL put in artifact links (default: http://<http address>).
    #[arg(long, env = "SANDBOXD_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Bearer tokens, comma-separated. Required to listen on a non-loopback address.
    #[arg(long, env = "SANDBOXD_TOKENS", value_delimiter = ',')]
    pub tokens: Option<Vec<String>>,
    /// Operator bearer tokens, comma-separated: each is also an API token (an id
    /// space of its own), and may read the full health report and GET /metrics.
    #[arg(long, env = "SANDBOXD_OPERATOR_TOKENS", value_delimiter = ',')]
    pub operator_tokens: Option<Vec<String>>,
    /// Directory for sessions and the unpacked rootfs.
    #[arg(long, env = "SANDBOXD_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// The rootfs tarball (with a .sha256 file beside it), made by rootfs/build.sh.
    #[arg(long, env = "SANDBOXD_ROOTFS_TARBALL")]
    pub rootfs_tarball: Option<PathBuf>,
    /// Directory of policy files (*.toml); must contain default.toml.
    #[arg(long, env = "SANDBOXD_POLICIES_DIR")]
    pub policies_dir: Option<PathBuf>,
    /// Most sessions at once.
    #[arg(long, env = "SANDBOXD_MAX_SESSIONS")]
    pub max_sessions: Option<usize>,
    /// Most sessions one bearer token may hold at once (default: half of max_sessions, rounded up).
    #[arg(long, env = "SANDBOXD_TOKEN_MAX_SESSIONS")]
    pub token_max_sessions: Option<usize>,
    /// Most runs one bearer token may have going at once (default: a quarter of max_sessions, rounded up).
    #[arg(long, env = "SANDBOXD_TOKEN_MAX_RUNS")]
    pub token_max_runs: Option<usize>,
    /// Most MCP protocol sessions (`/mcp`'s Mcp-Session-Id) held at once (about 83 KB each).
    #[arg(long, env = "SANDBOXD_MCP_MAX_SESSIONS")]
    pub mcp_max_sessions: Option<usize>,
    /// Most MCP protocol sessions one bearer token may hold at once (default: half of mcp_max_sessions, rounded up).
    #[arg(long, env = "SANDBOXD_TOKEN_MCP_MAX_SESSIONS")]
    pub token_mcp_max_sessions: Option<usize>,
    /// Seconds an MCP protocol session may go with no request (none in flight) before it is closed.
    #[arg(long, env = "SANDBOXD_MCP_SESSION_IDLE_S")]
    pub mcp_session_idle_s: Option<u64>,
    /// Most open connections per listener; more are closed at once.
    #[arg(long, env = "SANDBOXD_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Most connections per listener that no request with a known token (or, where
    /// none is needed, no request at all) has claimed yet; past it, the one waiting
    /// longest is closed (default: a quarter of max_connections, rounded up).
    #[arg(long, env = "SANDBOXD_MAX_ANONYMOUS_CONNECTIONS")]
    pub max_anonymous_connections: Option<usize>,
    /// Most connections per listener one token holds (default: a quarter of
    /// max_connections, rounded up).
    #[arg(long, env = "SANDBOXD_TOKEN_MAX_CONNECTIONS")]
    pub token_max_connections: Option<usize>,
    /// Seconds a client has to send a request's headers; also how long a kept-alive
    /// connection may wait idle for its next request.
    #[arg(long, env = "SANDBOXD_HEADER_TIMEOUT_S")]
    pub header_timeout_s: Option<u64>,
    /// Seconds a JSON body has to arrive whole; an upload may pause this long between chunks.
    #[arg(long, env = "SANDBOXD_BODY_TIMEOUT_S")]
    pub body_timeout_s: Option<u64>,
    /// Seconds a response may wait for its client to take bytes (a download, an
    /// event stream); past that the connection is closed.
    #[arg(long, env = "SANDBOXD_SEND_TIMEOUT_S")]
    pub send_timeout_s: Option<u64>,
    /// Idle time after which a session is closed, in seconds.
    #[arg(long, env = "SANDBOXD_SESSION_TTL_S")]
    pub session_ttl_s: Option<u64>,
    /// First host uid/gid given to sandboxes (each session gets its own).
    #[arg(long, env = "SANDBOXD_UID_BASE")]
    pub uid_base: Option<u32>,
    /// Name of the cgroup directory (below the daemon's own) that holds run cgroups.
    #[arg(long, env = "SANDBOXD_INSTANCE")]
    pub instance: Option<String>,
    /// Sandbox slots (a cgroup with a resident process) made at start-up, ahead of runs.
    #[arg(long, env = "SANDBOXD_READY_SANDBOXES")]
    pub ready_sandboxes: Option<usize>,
    /// Template interpreters kept per policy in use (the policy's preload modules
    /// imported; each forks a sandbox per run, one run at a time); 0 turns the pool off.
    #[arg(long, env = "SANDBOXD_POOL_SIZE")]
    pub pool_size: Option<usize>,
    /// Memory every pooled template together may hold, in MiB (each at its policy's
    /// measured idle size): the pool grows past `pool_size` per policy while runs
    /// queue for templates, never past this.
    #[arg(long, env = "SANDBOXD_POOL_MEMORY_MB")]
    pub pool_memory_mb: Option<u64>,
    /// Seconds the pool keeps a template it grew for after demand fell off: it
    /// shrinks back to `pool_size` per policy by one template per this long.
    #[arg(long, env = "SANDBOXD_POOL_IDLE_S")]
    pub pool_idle_s: Option<u64>,
    /// How many times the free room of the state directory's filesystem the
    /// sessions' images (workspaces, package layers) may add up to, each counted
    /// full: images are sparse and take disk only as they are written. 1 (the
    /// default) reserves each whole; more holds more sessions than the disk could
    /// hold filled up.
    #[arg(long, env = "SANDBOXD_WORKSPACE_OVERCOMMIT")]
    pub workspace_overcommit: Option<f64>,
    /// Seconds a session goes unused before its workspace is unmounted (mounted
    /// again at its next use; its files stay). A session whose kernel lives keeps it.
    #[arg(long, env = "SANDBOXD_WORKSPACE_IDLE_UNMOUNT_S")]
    pub workspace_idle_unmount_s: Option<u64>,
    /// Seconds that running runs get to finish at shutdown before they are killed.
    #[arg(long, env = "SANDBOXD_SHUTDOWN_GRACE_S")]
    pub shutdown_grace_s: Option<u64>,
    /// The host's CA bundle (PEM): the egress proxy verifies real servers against
    /// it, and sandboxes with network trust it (with the proxy's own CA). Default:
    /// the first of /etc/ssl/certs/ca-certificates.crt (Debian, Ubuntu),
    /// /etc/pki/tls/certs/ca-bundle.crt (Fedora), /etc/ssl/ca-bundle.pem (openSUSE)
    /// that exists.
    #[arg(long, env = "SANDBOXD_CA_BUNDLE")]
    pub ca_bundle: Option<PathBuf>,
    /// Directory of the package cache (files of the package index, shared by every
    /// session's installs, checked against their digests); default /var/cache/sandboxd/packages.
    #[arg(long, env = "SANDBOXD_PACKAGE_CACHE_DIR")]
    pub package_cache_dir: Option<PathBuf>,
    /// Most MiB the package cache holds (the files used longest ago go first); 0 turns it off.
    #[arg(long, env = "SANDBOXD_PACKAGE_CACHE_MB")]
    pub package_cache_mb: Option<u64>,
    /// Hosts whose files the package cache keeps (their URLs name each file's
    /// BLAKE2b-256 digest, as PyPI's do), comma-separated; default files.pythonhosted.org.
    #[arg(long, env = "SANDBOXD_PACKAGE_CACHE_HOSTS", value_delimiter = ',')]
    pub package_cache_hosts: Option<Vec<String>>,
    /// The chat's LLM: an OpenAI-compatible API's base URL (http or https); default
    /// http://127.0.0.1:1234/v1 (LM Studio's server); "off" turns the chat off.
    #[arg(long, env = "SANDBOXD_LLM_URL")]
    pub llm_url: Option<String>,
    /// The model the chat asks when a request names none; default: the first the
    /// endpoint lists (GET /models).
    #[arg(long, env = "SANDBOXD_LLM_MODEL")]
    pub llm_model: Option<String>,
    /// The API key sent to the chat's LLM (Authorization: Bearer), if it needs one.
    #[arg(long, env = "SANDBOXD_LLM_API_KEY", hide_env_values = true)]
    pub llm_api_key: Option<String>,
    /// Longest the chat waits for the LLM's next piece of an answer, in seconds; default 300.
    #[arg(long, env = "SANDBOXD_LLM_TIMEOUT_S")]
    pub llm_timeout_s: Option<u64>,
    /// Show the LLM the figures its tool calls made (for models that take images); default false.
    #[arg(long, env = "SANDBOXD_LLM_IMAGES")]
    pub llm_images: Option<bool>,
    /// The most model answers (each perhaps with tool calls) one chat message may take; default 10.
    #[arg(long, env = "SANDBOXD_CHAT_MAX_TURNS")]
    pub chat_max_turns: Option<u32>,
    /// Log format: text or json.
    #[arg(long, env = "SANDBOXD_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// Log filter (tracing EnvFilter syntax), e.g. info or sandboxd=debug.
    #[arg(long, env = "SANDBOXD_LOG")]
    pub log: Option<String>,
}

/// What to do instead of serving.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Check that this host can run sandboxes: print each requirement with ✓ / ! / ✗
    /// and what to do, and exit 1 when one is not met (the daemon runs the same
    /// checks at start). Reads the config like the daemon (state_dir, rootfs_tarball).
    Check,
}

/// The effective configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    pub socket: PathBuf,
    pub socket_group: String,
    /// None: HTTP disabled.
    pub http: Option<SocketAddr>,
    /// Serves only `GET /metrics`, without a token; None: off.
    pub metrics_listen: Option<SocketAddr>,
    pub public_url: String,
    #[serde(serialize_with = "redact")]
    pub tokens: Vec<String>,
    #[serde(serialize_with = "redact")]
    pub operator_tokens: Vec<String>,
    pub state_dir: PathBuf,
    pub rootfs_tarball: PathBuf,
    pub policies_dir: PathBuf,
    pub max_sessions: usize,
    pub token_max_sessions: usize,
    pub token_max_runs: usize,
    pub mcp_max_sessions: usize,
    pub token_mcp_max_sessions: usize,
    pub mcp_session_idle_s: u64,
    pub max_connections: usize,
    pub max_anonymous_connections: usize,
    pub token_max_connections: usize,
    pub header_timeout_s: u64,
    pub body_timeout_s: u64,
    pub send_timeout_s: u64,
    pub session_ttl_s: u64,
    pub uid_base: u32,
    pub instance: String,
    pub ready_sandboxes: usize,
    pub pool_size: usize,
    pub pool_memory_mb: u64,
    pub pool_idle_s: u64,
    pub workspace_overcommit: f64,
    pub workspace_idle_unmount_s: u64,
    pub shutdown_grace_s: u64,
    pub ca_bundle: PathBuf,
    pub package_cache_dir: PathBuf,
    pub package_cache_mb: u64,
    pub package_cache_hosts: Vec<String>,
    /// None: the chat is off (printed as "off").
    #[serde(serialize_with = "off_when_none")]
    pub llm_url: Option<String>,
    pub llm_model: Option<String>,
    #[serde(serialize_with = "redact_one")]
    pub llm_api_key: Option<String>,
    pub llm_timeout_s: u64,
    pub llm_images: bool,
    pub chat_max_turns: u32,
    pub log_format: String,
    pub log: String,
}

/// Where the host's CA bundle is on the distributions sandboxd knows, in order.
pub const CA_BUNDLES: [&str; 3] =
    ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/ca-bundle.pem"];

fn default_ca_bundle() -> PathBuf {
    CA_BUNDLES.iter().map(PathBuf::from).find(|p| p.is_file()).unwrap_or_else(|| CA_BUNDLES[0].into())
}

fn off_when_none<S: serde::Serializer>(url: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(url.as_deref().unwrap_or("off"))
}

fn redact_one<S: serde::Serializer>(key: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match key {
        Some(_) => s.serialize_some("********"),
        None => s.serialize_none(),
    }
}

fn redact<S: serde::Serializer>(tokens: &[String], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(tokens.iter().map(|_| "********"))
}

macro_rules! merge {
    ($cli:expr, $file:expr, $($field:ident),*) => {
        Settings { config: $cli.config.clone(), print_config: $cli.print_config, command: $cli.command.clone(),
                   $($field: $cli.$field.clone().or($file.$field.clone())),* }
    };
}

impl Config {
    /// Read the config file named by the settings (or the default one) and merge.
    pub fn load(cli: Settings) -> Result<Config, Error> {
        let (path, required) = match &cli.config {
            Some(p) => (p.clone(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_FILE), false),
        };
        let file = match std::fs::read_to_string(&path) {
            Ok(text) => {
                toml::from_str::<Settings>(&text).map_err(|e| Error::Parse(path.clone(), e.message().to_string()))?
            }
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Settings::default(),
            Err(e) => return Err(Error::Read(path, e)),
        };
        let s = merge!(
            cli,
            file,
            socket,
            socket_group,
            http,
            metrics_listen,
            public_url,
            tokens,
            operator_tokens,
            state_dir,
            rootfs_tarball,
            policies_dir,
            max_sessions,
            token_max_sessions,
            token_max_runs,
            mcp_max_sessions,
            token_mcp_max_sessions,
            mcp_session_idle_s,
            max_connections,
            max_anonymous_connections,
            token_max_connections,
            header_timeout_s,
            body_timeout_s,
            send_timeout_s,
            session_ttl_s,
            uid_base,
            instance,
            ready_sandboxes,
            pool_size,
            pool_memory_mb,
            pool_idle_s,
            workspace_overcommit,
            workspace_idle_unmount_s,
            shutdown_grace_s,
            ca_bundle,
            package_cache_dir,
            package_cache_mb,
            package_cache_hosts,
            llm_url,
            llm_model,
            llm_api_key,
            llm_timeout_s,
            llm_images,
            chat_max_turns,
            log_format,
            log
        );
        Config::from_settings(s)
    }

    pub fn from_settings(s: Settings) -> Result<Config, Error> {
        let http = match s.http.as_deref().unwrap_or("127.0.0.1:8181") {
            "off" | "" => None,
            addr => Some(addr.parse::<SocketAddr>().map_err(|e| Error::Invalid {
                key: "http",
                reason: format!("`{addr}` is not an address like 127.0.0.1:8181 ({e}); use \"off\" to disable HTTP"),
            })?),
        };
        let metrics_listen = match s.metrics_listen.as_deref().unwrap_or("off") {
            "off" | "" => None,
            addr => Some(addr.parse::<SocketAddr>().map_err(|e| Error::Invalid {
                key: "metrics_listen",
                reason: format!("`{addr}` is not an address like 127.0.0.1:9464 ({e}); use \"off\" to disable it"),
            })?),
        };
        let tokens: Vec<String> = s.tokens.unwrap_or_default().into_iter().filter(|t| !t.is_empty()).collect();
        let operator_tokens: Vec<String> =
            s.operator_tokens.unwrap_or_default().into_iter().filter(|t| !t.is_empty()).collect();
        if operator_tokens.iter().any(|t| tokens.contains(t)) {
            return Err(Error::Invalid {
                key: "operator_tokens",
                reason: "a token is in both `tokens` and `operator_tokens`: give the operator a token of its own"
                    .into(),
            });
        }
        if let Some(addr) = http {
            if !addr.ip().is_loopback() && tokens.is_empty() && operator_tokens.is_empty() {
                return Err(Error::Invalid {
                    key: "http",
                    reason: format!(
                        "{addr} is not a loopback address: set `tokens` so that only clients with a token can run code"
                    ),
                });
            }
        }
        let llm_url = match s.llm_url.as_deref().unwrap_or("http://127.0.0.1:1234/v1") {
            "off" => None,
            url if (url.starts_with("http://") || url.starts_with("https://"))
                && !url.split('/').nth(2).unwrap_or("").contains('@') =>
            {
                Some(url.to_string())
            }
            url if url.contains('@') => {
                return Err(Error::Invalid {
                    key: "llm_url",
                    reason: "it holds credentials: put the key in llm_api_key, and give the URL without them".into(),
                })
            }
            url => {
                return Err(Error::Invalid {
                    key: "llm_url",
                    reason: format!("`{url}`: give an http:// or https:// URL of an OpenAI-compatible API, e.g. http://127.0.0.1:1234/v1, or \"off\""),
                })
            }
        };
        let chat_max_turns = match s.chat_max_turns.unwrap_or(10) {
            n @ 1..=100 => n,
            n => return Err(Error::Invalid { key: "chat_max_turns", reason: format!("{n}; allowed: 1 to 100") }),
        };
        let log_format = s.log_format.unwrap_or_else(|| "text".into());
        if log_format != "text" && log_format != "json" {
            return Err(Error::Invalid { key: "log_format", reason: format!("`{log_format}`; allowed: text, json") });
        }
        let workspace_overcommit = s.workspace_overcommit.unwrap_or(1.0);
        if !(1.0..=1000.0).contains(&workspace_overcommit) {
            return Err(Error::Invalid {
                key: "workspace_overcommit",
                reason: format!("{workspace_overcommit}; allowed: 1 to 1000 (1: each session's images reserved whole)"),
            });
        }
        let max_sessions = s.max_sessions.unwrap_or(32);
        if max_sessions == 0 || max_sessions > 10_000 {
            return Err(Error::Invalid { key: "max_sessions", reason: format!("{max_sessions}; allowed: 1 to 10000") });
        }
        let per_token = |key: &'static str, value: Option<usize>, default: usize| match value {
            None => Ok(default),
            Some(n) if (1..=max_sessions).contains(&n) => Ok(n),
            Some(n) => Err(Error::Invalid { key, reason: format!("{n}; allowed: 1 to max_sessions ({max_sessions})") }),
        };
        let token_max_sessions = per_token("token_max_sessions", s.token_max_sessions, max_sessions.div_ceil(2))?;
        let token_max_runs = per_token("token_max_runs", s.token_max_runs, max_sessions.div_ceil(4))?;
        let mcp_max_sessions = s.mcp_max_sessions.unwrap_or(256);
        if !(1..=10_000).contains(&mcp_max_sessions) {
            return Err(Error::Invalid {
                key: "mcp_max_sessions",
                reason: format!("{mcp_max_sessions}; allowed: 1 to 10000"),
            });
        }
        let token_mcp_max_sessions = match s.token_mcp_max_sessions {
            None => mcp_max_sessions.div_ceil(2),
            Some(n) if (1..=mcp_max_sessions).contains(&n) => n,
            Some(n) => {
                return Err(Error::Invalid {
                    key: "token_mcp_max_sessions",
                    reason: format!("{n}; allowed: 1 to mcp_max_sessions ({mcp_max_sessions})"),
                })
            }
        };
        let mcp_session_idle_s = s.mcp_session_idle_s.unwrap_or(300);
        if !(1..=86_400).contains(&mcp_session_idle_s) {
            return Err(Error::Invalid {
                key: "mcp_session_idle_s",
                reason: format!("{mcp_session_idle_s}; allowed: 1 to 86400 seconds"),
            });
        }
        let max_connections = s.max_connections.unwrap_or(256);
        if !(1..=65_536).contains(&max_connections) {
            return Err(Error::Invalid {
                key: "max_connections",
                reason: format!("{max_connections}; allowed: 1 to 65536"),
            });
        }
        let per_listener = |key: &'static str, value: Option<usize>| match value {
            None => Ok(max_connections.div_ceil(4)),
            Some(n) if (1..=max_connections).contains(&n) => Ok(n),
            Some(n) => {
                Err(Error::Invalid { key, reason: format!("{n}; allowed: 1 to max_connections ({max_connections})") })
            }
        };
        let max_anonymous_connections = per_listener("max_anonymous_connections", s.max_anonymous_connections)?;
        let token_max_connections = per_listener("token_max_connections", s.token_max_connections)?;
        let seconds = |key: &'static str, value: Option<u64>, default: u64| match value.unwrap_or(default) {
            n @ 1..=3600 => Ok(n),
            n => Err(Error::Invalid { key, reason: format!("{n}; allowed: 1 to 3600 seconds") }),
        };
        let header_timeout_s = seconds("header_timeout_s", s.header_timeout_s, 10)?;
        let body_timeout_s = seconds("body_timeout_s", s.body_timeout_s, 30)?;
        let send_timeout_s = seconds("send_timeout_s", s.send_timeout_s, 30)?;
        let uid_base = s.uid_base.unwrap_or(600_000);
        if !(1000..=u32::MAX - 100_000).contains(&uid_base) {
            return Err(Error::Invalid {
                key: "uid_base",
                reason: format!("{uid_base}; allowed: 1000 to {}", u32::MAX - 100_000),
            });
        }
        let instance = s.instance.unwrap_or_else(|| "sandboxd".into());
        if instance.is_empty() || !instance.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(Error::Invalid {
                key: "instance",
                reason: format!("`{instance}`; allowed: letters, digits, - and _"),
            });
        }
        let public_url = match (s.public_url, http) {
            (Some(u), _) => u.trim_end_matches('/').to_string(),
            (None, Some(addr)) => format!("http://{addr}"),
            (None, None) => String::new(),
        };
        Ok(Config {
            socket: s.socket.unwrap_or_else(|| "/run/sandboxd/sandboxd.sock".into()),
            socket_group: s.socket_group.unwrap_or_else(|| "sandboxd".into()),
            http,
            metrics_listen,
            public_url,
            tokens,
            operator_tokens,
            state_dir: s.state_dir.unwrap_or_else(|| "/var/lib/sandboxd".into()),
            rootfs_tarball: s.rootfs_tarball.unwrap_or_else(|| "/var/cache/sandboxd/rootfs/current.tar.zst".into()),
            policies_dir: s.policies_dir.unwrap_or_else(default_policies_dir),
            max_sessions,
            token_max_sessions,
            token_max_runs,
            mcp_max_sessions,
            token_mcp_max_sessions,
            mcp_session_idle_s,
            max_connections,
            max_anonymous_connections,
            token_max_connections,
            header_timeout_s,
            body_timeout_s,
            send_timeout_s,
            session_ttl_s: s.session_ttl_s.unwrap_or(1800),
            uid_base,
            instance,
            ready_sandboxes: s.ready_sandboxes.unwrap_or(2).min(64),
            pool_size: s.pool_size.unwrap_or(2).min(64),
            pool_memory_mb: s.pool_memory_mb.unwrap_or(2048).min(1 << 30),
            pool_idle_s: s.pool_idle_s.unwrap_or(30).clamp(1, 86400),
            workspace_overcommit,
            workspace_idle_unmount_s: s.workspace_idle_unmount_s.unwrap_or(120).clamp(1, 86400),
            shutdown_grace_s: s.shutdown_grace_s.unwrap_or(10),
            ca_bundle: s.ca_bundle.unwrap_or_else(default_ca_bundle),
            package_cache_dir: s.package_cache_dir.unwrap_or_else(|| "/var/cache/sandboxd/packages".into()),
            package_cache_mb: s.package_cache_mb.unwrap_or(4096).min(1 << 30),
            package_cache_hosts: s.package_cache_hosts.unwrap_or_else(|| vec!["files.pythonhosted.org".into()]),
            llm_url,
            llm_model: s.llm_model.filter(|m| !m.is_empty()),
            llm_api_key: s.llm_api_key.filter(|k| !k.is_empty()),
            llm_timeout_s: s.llm_timeout_s.unwrap_or(300).clamp(1, 86400),
            llm_images: s.llm_images.unwrap_or(false),
            chat_max_turns,
            log_format,
            log: s.log.unwrap_or_else(|| "info".into()),
        })
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot print the config: {e}\n"))
    }
}

/// `/etc/sandboxd/policies` when installed; else the `policies/` of a source tree.
fn default_policies_dir() -> PathBuf {
    let etc = Path::new("/etc/sandboxd/policies");
    if etc.is_dir() {
        return etc.into();
    }
    PathBuf::from("policies")
}

#[cfg(test)]
mod tests;
