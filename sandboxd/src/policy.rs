//! Named sandbox policies (`policies/*.toml`): limits and switches for a run.
//!
//! A policy file may leave any field out (it takes the default). Unknown fields and
//! values out of range are refused when the policy is loaded, with a message that
//! names the file, the field and the allowed values.

use crate::egress::rules;
use crate::model::policy::{Network, Policy, SecretRule};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading policy directory {0}: {1}")]
    Dir(PathBuf, std::io::Error),
    #[error("reading policy {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("policy {0}: {1}")]
    Parse(PathBuf, String),
    #[error("policy {file}: field `{field}` is {value}; allowed: {allowed}")]
    Invalid { file: PathBuf, field: &'static str, value: String, allowed: String },
    #[error("no policy named `default` in {0}: add default.toml")]
    NoDefault(PathBuf),
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            name: "default".into(),
            description: String::new(),
            memory_mb: 512,
            cpus: 1.0,
            pids: 128,
            timeout_s: 60,
            grace_s: 2,
            output_kb: 100,
            code_kb: 100,
            upload_mb: 50,
            mcp_inline_mb: 10,
            tmp_mb: 64,
            shm_mb: 64,
            workspace_mb: 1024,
            file_size_mb: 1024,
            open_files: 1024,
            network: Network::Allowlist,
            allow_hosts: DEFAULT_INDEX_HOSTS.map(String::from).to_vec(),
            allow_ports: vec![443, 80],
            index_url: DEFAULT_INDEX.into(),
            packages_mb: 512,
            source_builds: false,
            install_timeout_s: 300,
            secrets: vec![],
            autosave_figures: true,
            max_artifacts: 100,
            preload: ["numpy", "pandas", "matplotlib.pyplot"].map(String::from).to_vec(),
            template_runs: 64,
        }
    }
}

const MIB: u64 = 1024 * 1024;
/// The package index a policy uses unless it names another (`index_url`).
pub const DEFAULT_INDEX: &str = "https://pypi.org/simple";
/// The hosts the default index serves from: its pages, and its files.
pub const DEFAULT_INDEX_HOSTS: [&str; 2] = ["pypi.org", "files.pythonhosted.org"];
/// Environment variables a secret may not take: the sandbox's own.
const RESERVED_NAMES: [&str; 6] = ["PATH", "HOME", "LANG", "PYTHONPATH", "SSL_CERT_FILE", "LD_PRELOAD"];
/// The most `code_kb` a policy may set: the sandbox's spec, which carries the code,
/// is read with a bound made from it ([`crate::isolate::spec::MAX_SPEC_LINE`]).
pub const MAX_CODE_KB: u64 = 100 * 1024;

/// `a.b_c.d`: identifiers joined by dots.
fn is_module_name(name: &str) -> bool {
    name.len() <= 200
        && name.split('.').all(|part| {
            let mut chars = part.chars();
            chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// The host of an index URL (`http://` or `https://`), if it is one.
pub fn index_host(url: &str) -> Option<rules::Host> {
    index_authority(url).map(|(host, _, _)| host)
}

/// The host, port and scheme (`true`: https) of an index URL, if it is one.
pub fn index_authority(url: &str) -> Option<(rules::Host, u16, bool)> {
    let (rest, tls) = match url.strip_prefix("https://") {
        Some(rest) => (rest, true),
        None => (url.strip_prefix("http://")?, false),
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    authority_of(authority, tls)
}

/// The path of an index URL (`/simple` of `https://pypi.org/simple/`, without
/// its last `/`; `""` for none), if it is one.
pub fn index_path(url: &str) -> Option<String> {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"))?;
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    let path = path.split(['?', '#']).next().unwrap_or("");
    Some(path.trim_end_matches('/').to_string())
}

fn authority_of(authority: &str, tls: bool) -> Option<(rules::Host, u16, bool)> {
    if authority.contains('@') {
        return None;
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, port)) if !h.ends_with(':') && !authority.ends_with(']') => match port.parse::<u16>() {
            Ok(p) => (h, p),
            Err(_) => (authority, if tls { 443 } else { 80 }),
        },
        _ => (authority, if tls { 443 } else { 80 }),
    };
    Some((rules::Host::parse(host).ok()?, port, tls))
}

/// Whether `name` may name a secret's variable: a plain environment name, not
/// one the sandbox's environment sets itself.
pub fn is_secret_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 128
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !RESERVED_NAMES.contains(&name)
        && !name.to_ascii_uppercase().ends_with("_PROXY")
        && !name.starts_with("SANDBOXD_")
}

/// A secret's name, hosts (each allowed by the policy: `allowed`) and source.
fn validate_secret(s: &SecretRule, allowed: &[rules::HostPattern]) -> Result<(), String> {
    if !is_secret_name(&s.name) {
        return Err("a name of letters, digits and _ (not PATH, HOME, LANG, PYTHONPATH, SSL_CERT_FILE, LD_PRELOAD, *_PROXY or SANDBOXD_*)".into());
    }
    let hosts = rules::patterns(&s.hosts)?;
    if hosts.is_empty() {
        return Err("at least one host in its hosts".into());
    }
    for (pattern, text) in hosts.iter().zip(&s.hosts) {
        if !rules::covers(allowed, pattern) {
            return Err(format!("hosts that allow_hosts allows ({text} is not)"));
        }
    }
    if s.substitute_in.is_empty() {
        return Err("substitute_in naming at least one of \"headers\", \"url\", \"body\"".into());
    }
    match s.value_from.split_once(':') {
        Some(("env", var)) if !var.is_empty() => Ok(()),
        Some(("file", path)) if path.starts_with('/') => Ok(()),
        _ => Err("value_from = \"env:VARIABLE\" or \"file:/absolute/path\"".into()),
    }
}

impl Policy {
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mb * MIB
    }
    pub fn output_bytes(&self) -> usize {
        (self.output_kb * 1024) as usize
    }
    pub fn code_bytes(&self) -> usize {
        (self.code_kb * 1024) as usize
    }
    pub fn upload_bytes(&self) -> u64 {
        self.upload_mb * MIB
    }
    pub fn workspace_bytes(&self) -> u64 {
        self.workspace_mb * MIB
    }
    /// The size of a session's package layer; 0 when the policy installs nothing.
    pub fn layer_bytes(&self) -> u64 {
        if self.packages_enabled() {
            self.packages_mb * MIB
        } else {
            0
        }
    }

    /// Check every field against its allowed range.
    pub fn validate(&self, file: &Path) -> Result<(), Error> {
        let int = |field: &'static str, v: u64, lo: u64, hi: u64| -> Result<(), Error> {
            if v < lo || v > hi {
                return Err(Error::Invalid {
                    file: file.into(),
                    field,
                    value: v.to_string(),
                    allowed: format!("a whole number from {lo} to {hi}"),
                });
            }
            Ok(())
        };
        int("memory_mb", self.memory_mb, 16, 1024 * 1024)?;
        if !(self.cpus >= 0.01 && self.cpus <= 1024.0) {
            return Err(Error::Invalid {
                file: file.into(),
                field: "cpus",
                value: self.cpus.to_string(),
                allowed: "a number of cores from 0.01 to 1024".into(),
            });
        }
        int("pids", self.pids, 4, 65536)?;
        int("template_runs", self.template_runs, 1, 1_000_000)?;
        int("timeout_s", self.timeout_s, 1, 86400)?;
        int("grace_s", self.grace_s, 0, 60)?;
        int("output_kb", self.output_kb, 1, 64 * 1024)?;
        int("code_kb", self.code_kb, 1, MAX_CODE_KB)?;
        int("upload_mb", self.upload_mb, 1, 64 * 1024)?;
        int("mcp_inline_mb", self.mcp_inline_mb, 1, 1024)?;
        int("tmp_mb", self.tmp_mb, 1, 64 * 1024)?;
        int("shm_mb", self.shm_mb, 1, 64 * 1024)?;
        int("workspace_mb", self.workspace_mb, 16, 1024 * 1024)?;
        int("file_size_mb", self.file_size_mb, 1, 1024 * 1024)?;
        int("open_files", self.open_files, 16, 1 << 20)?;
        int("max_artifacts", self.max_artifacts as u64, 1, 100_000)?;
        if let Some(bad) = self.preload.iter().find(|m| !is_module_name(m)) {
            return Err(Error::Invalid {
                file: file.into(),
                field: "preload",
                value: bad.clone(),
                allowed: "dotted Python module names, e.g. \"matplotlib.pyplot\"".into(),
            });
        }
        int("preload (count)", self.preload.len() as u64, 0, 64)?;
        int("packages_mb", self.packages_mb, 0, 1024 * 1024)?;
        int("install_timeout_s", self.install_timeout_s, 1, 86400)?;
        self.validate_network(file)
    }

    /// `network` and what goes with it: hosts, ports, the index, secrets.
    fn validate_network(&self, file: &Path) -> Result<(), Error> {
        let invalid = |field: &'static str, value: String, allowed: String| Error::Invalid {
            file: file.into(),
            field,
            value,
            allowed,
        };
        let hosts = rules::patterns(&self.allow_hosts)
            .map_err(|e| invalid("allow_hosts", e, "names, *.names and IP addresses".into()))?;
        if self.allow_hosts.len() > 256 {
            return Err(invalid("allow_hosts", format!("{} hosts", self.allow_hosts.len()), "at most 256".into()));
        }
        if self.allow_ports.is_empty() || self.allow_ports.len() > 32 || self.allow_ports.contains(&0) {
            return Err(invalid(
                "allow_ports",
                format!("{:?}", self.allow_ports),
                "1 to 32 ports from 1 to 65535".into(),
            ));
        }
        let index_host = index_host(&self.index_url).ok_or_else(|| {
            invalid(
                "index_url",
                format!("{:?}", self.index_url),
                "an http:// or https:// URL of a package index".into(),
            )
        })?;
        if self.network == Network::None {
            if let Some(s) = self.secrets.first() {
                return Err(invalid(
                    "secrets",
                    format!("{:?} with network = \"none\"", s.name),
                    "secrets only with network = \"allowlist\" (they are used through the egress proxy)".into(),
                ));
            }
            return Ok(());
        }
        if hosts.is_empty() {
            return Err(invalid(
                "allow_hosts",
                "[] with network = \"allowlist\"".into(),
                "at least one host (or network = \"none\")".into(),
            ));
        }
        if self.packages_mb > 0 && !hosts.iter().any(|p| p.matches(&index_host)) {
            return Err(invalid(
                "index_url",
                format!("{:?}, whose host {} is not in allow_hosts", self.index_url, index_host.text()),
                "an index whose host allow_hosts names (add it, and the host its files come from), or packages_mb = 0"
                    .into(),
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for s in &self.secrets {
            validate_secret(s, &hosts).map_err(|e| invalid("secrets", format!("{:?}", s.name), e))?;
            if !names.insert(s.name.as_str()) {
                return Err(invalid("secrets", format!("{:?} twice", s.name), "each name once".into()));
            }
        }
        if self.secrets.len() > 64 {
            return Err(invalid("secrets", format!("{} secrets", self.secrets.len()), "at most 64".into()));
        }
        Ok(())
    }
}

/// Parse and validate one policy file's text.
pub fn parse(name: &str, text: &str, file: &Path) -> Result<Policy, Error> {
    let mut policy: Policy = toml::from_str(text).map_err(|e| Error::Parse(file.into(), e.message().to_string()))?;
    policy.name = name.to_string();
    policy.validate(file)?;
    Ok(policy)
}

/// All policies of a directory, by name (the file stem). `default` must be there.
pub fn load_dir(dir: &Path) -> Result<BTreeMap<String, Policy>, Error> {
    let mut out = BTreeMap::new();
    let entries = std::fs::read_dir(dir).map_err(|e| Error::Dir(dir.into(), e))?;
    for entry in entries {
        let path = entry.map_err(|e| Error::Dir(dir.into(), e))?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Read(path.clone(), e))?;
        out.insert(name.to_string(), parse(name, &text, &path)?);
    }
    if !out.contains_key("default") {
        return Err(Error::NoDefault(dir.into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Policy, Error> {
        parse("t", text, Path::new("t.toml"))
    }

    #[test]
    fn missing_fields_take_the_defaults() {
        let policy = p("memory_mb = 256").unwrap();
        assert_eq!(policy.memory_mb, 256);
        assert_eq!(policy.pids, Policy::default().pids);
        assert_eq!(policy.name, "t");
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let err = p("memroy_mb = 256").unwrap_err().to_string();
        assert!(err.contains("memroy_mb"), "{err}");
    }

    #[test]
    fn out_of_range_values_name_the_field_and_the_range() {
        let err = p("pids = 1").unwrap_err().to_string();
        assert!(err.contains("`pids`") && err.contains("from 4 to 65536"), "{err}");
        let err = p("cpus = 0.0").unwrap_err().to_string();
        assert!(err.contains("`cpus`"), "{err}");
        let err = p("network = \"host\"").unwrap_err().to_string();
        assert!(err.contains("none"), "{err}");
    }

    #[test]
    fn network_is_none_or_an_allowlist_of_hosts() {
        let none = p("network = \"none\"").unwrap();
        assert_eq!(none.network, Network::None);
        assert!(!none.packages_enabled());
        let err = p("network = \"host\"").unwrap_err().to_string();
        assert!(err.contains(r#"network is "host"; allowed: "none" (no network) or "allowlist""#), "{err}");
        assert!(p("network = 1").is_err());
        let shown = serde_json::to_value(Policy::default()).unwrap();
        assert_eq!(shown["network"], "allowlist");
        assert_eq!(shown["allow_hosts"], serde_json::json!(["pypi.org", "files.pythonhosted.org"]));
        assert!(Policy::default().packages_enabled());
        let err = p("allow_hosts = []").unwrap_err().to_string();
        assert!(err.contains("`allow_hosts` is [] with network = \"allowlist\"; allowed: at least one host"), "{err}");
        let err = p("allow_hosts = [\"*.com\"]").unwrap_err().to_string();
        assert!(err.contains("`allow_hosts`") && err.contains("not a host pattern"), "{err}");
        let err = p("allow_ports = [0]").unwrap_err().to_string();
        assert!(err.contains("`allow_ports`"), "{err}");
        // The index must be reachable when packages are on; not when they are off.
        let err = p("index_url = \"https://mirror.example/simple\"").unwrap_err().to_string();
        assert!(err.contains("whose host mirror.example is not in allow_hosts"), "{err}");
        assert!(p("index_url = \"https://mirror.example/simple\"\npackages_mb = 0").is_ok());
        let mirror = p("index_url = \"https://mirror.example:8443/simple\"\nallow_hosts = [\"mirror.example\"]\nallow_ports = [8443]");
        assert!(mirror.is_ok(), "{mirror:?}");
        assert!(p("index_url = \"ftp://x\"").is_err() && p("index_url = \"https://u:p@pypi.org/\"").is_err());
    }

    #[test]
    fn secrets_name_a_variable_hosts_the_policy_allows_and_a_source() {
        let ok = |rest: &str| {
            p(&format!("allow_hosts = [\"api.example.com\", \"*.example.org\"]\npackages_mb = 0\n[[secrets]]\nname = \"API_KEY\"\n{rest}"))
        };
        assert!(ok("hosts = [\"api.example.com\"]\nvalue_from = \"env:API_KEY\"").is_ok());
        assert!(ok("hosts = [\"*.a.example.org\", \"x.example.org\"]\nvalue_from = \"file:/etc/k\"").is_ok());
        for (rest, why) in [
            ("hosts = [\"other.example\"]\nvalue_from = \"env:K\"", "other.example is not"),
            ("hosts = []\nvalue_from = \"env:K\"", "at least one host"),
            ("hosts = [\"api.example.com\"]\nvalue_from = \"K\"", "value_from"),
            ("hosts = [\"api.example.com\"]\nvalue_from = \"file:rel\"", "value_from"),
            ("hosts = [\"api.example.com\"]\nvalue_from = \"env:K\"\nextra = 1", "extra"),
        ] {
            let err = ok(rest).unwrap_err().to_string();
            assert!(err.contains(why), "{rest}: {err}");
        }
        for bad in ["PATH", "HTTPS_PROXY", "https_proxy", "1X", "A-B", "SANDBOXD_X", ""] {
            assert!(!is_secret_name(bad), "{bad}");
        }
        let err = p("network = \"none\"\n[[secrets]]\nname = \"K\"\nhosts = [\"pypi.org\"]\nvalue_from = \"env:K\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("only with network = \"allowlist\""), "{err}");
    }

    #[test]
    fn an_index_urls_host_is_read_with_or_without_a_port() {
        let h = |u: &str| index_host(u).map(|h| h.text());
        assert_eq!(h("https://pypi.org/simple"), Some("pypi.org".into()));
        assert_eq!(h("http://mirror.example:8080/simple/"), Some("mirror.example".into()));
        assert_eq!(h("https://[2001:db8::1]/simple"), Some("[2001:db8::1]".into()));
        assert_eq!(h("https://[2001:db8::1]:8443/simple"), Some("[2001:db8::1]".into()));
        assert_eq!(h("pypi.org/simple"), None);
        assert_eq!(h("https://user@pypi.org/"), None);
        let a = |u: &str| index_authority(u).map(|(h, port, tls)| (h.text(), port, tls));
        assert_eq!(a("https://pypi.org/simple"), Some(("pypi.org".into(), 443, true)));
        assert_eq!(a("http://mirror.example/simple/"), Some(("mirror.example".into(), 80, false)));
        assert_eq!(a("https://mirror.example:8443/simple"), Some(("mirror.example".into(), 8443, true)));
        assert_eq!(a("https://[2001:db8::1]:8443/simple"), Some(("[2001:db8::1]".into(), 8443, true)));
        assert_eq!(a("https://mirror.example:http/simple"), None);
        assert_eq!(index_path("https://pypi.org/simple/").as_deref(), Some("/simple"));
        assert_eq!(
            index_path("https://mirror.example:8443/root/pypi/+simple?x=1").as_deref(),
            Some("/root/pypi/+simple")
        );
        assert_eq!(index_path("https://mirror.example").as_deref(), Some(""));
    }

    #[test]
    fn preload_takes_only_module_names() {
        assert_eq!(p("preload = [\"a.b_c\", \"_x1\"]").unwrap().preload, ["a.b_c", "_x1"]);
        for bad in ["os; import x", "a..b", "1abc", "", "a.", "a b"] {
            let err = p(&format!("preload = [{bad:?}]")).unwrap_err().to_string();
            assert!(err.contains("`preload`") && err.contains("module names"), "{bad}: {err}");
        }
    }

    #[test]
    fn shipped_policies_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
        let all = load_dir(&dir).unwrap();
        assert_eq!(all["default"].memory_mb, 512);
        assert_eq!(all["default"].timeout_s, 60);
        let strict = &all["strict"];
        assert!(strict.memory_mb < all["default"].memory_mb && strict.pids < all["default"].pids);
    }
}
