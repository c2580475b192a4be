//! A policy, translated into what the isolation layer is given: the sandbox's spec
//! ([`SandboxSpec`]), its cgroup limits, a template fork's [`ChildSpec`], and the
//! program's environment. Pure functions: [`crate::run`], [`crate::kernel`] and
//! [`crate::pool`] all build their sandboxes from here, and nothing here calls back
//! up into them.

use crate::isolate::spec::{self, ChildSpec, Egress, Rlimits, SandboxSpec};
use crate::isolate::{cgroup, seccomp};
use crate::model::policy::{Network, Policy};
use std::path::Path;

/// Where every sandboxed Python lives, inside the rootfs.
pub const PYTHON: &str = "/opt/py/bin/python";
/// The one-shot and pooled runner, inside the rootfs.
pub const RUNNER: &str = "/opt/sandboxd/runner.py";

/// Where the sandbox's proxy is, from inside.
const PROXY_URL: &str = "http://127.0.0.1:3128";
const _: () = assert!(spec::EGRESS_PORT == 3128);
/// The package layer's executables (pip's `--prefix` layout).
const PACKAGES_BIN: &str = "/opt/packages/current/bin";

/// The environment of every sandboxed program: nothing from the host. With
/// network, every client's proxy and CA bundle, and pip's index; with packages,
/// the layer's programs on `PATH`. (A session's secrets' placeholders are added
/// by the run: they are the session's.)
pub fn environment(policy: &Policy) -> Vec<(String, String)> {
    let threads = (policy.cpus.ceil() as u64).max(1).to_string();
    let path = if policy.packages_enabled() {
        format!("{PACKAGES_BIN}:/opt/py/bin:/usr/local/bin:/usr/bin:/bin")
    } else {
        "/opt/py/bin:/usr/local/bin:/usr/bin:/bin".to_string()
    };
    let mut env: Vec<(&str, String)> = vec![
        ("PATH", path),
        ("HOME", "/tmp".into()),
        ("USER", "sandbox".into()),
        ("LANG", "C.UTF-8".into()),
        ("LC_ALL", "C.UTF-8".into()),
        ("TMPDIR", "/tmp".into()),
        ("MPLBACKEND", "Agg".into()),
        ("MPLCONFIGDIR", "/tmp/.mplconfig".into()),
        ("PYTHONUNBUFFERED", "1".into()),
        ("PYTHONDONTWRITEBYTECODE", "1".into()),
        ("OPENBLAS_NUM_THREADS", threads.clone()),
        ("OMP_NUM_THREADS", threads.clone()),
        ("MKL_NUM_THREADS", threads),
    ];
    if policy.network == Network::Allowlist {
        for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"] {
            env.push((name, PROXY_URL.into()));
        }
        for name in ["NO_PROXY", "no_proxy"] {
            env.push((name, "localhost,127.0.0.1,::1".into()));
        }
        for name in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT"] {
            env.push((name, spec::CA_BUNDLE.into()));
        }
        env.push(("PIP_INDEX_URL", policy.index_url.clone()));
        env.push(("UV_INDEX_URL", policy.index_url.clone()));
        env.push(("PIP_ONLY_BINARY", if policy.source_builds { ":none:" } else { ":all:" }.into()));
        env.push(("PIP_NO_CACHE_DIR", "1".into()));
        env.push(("PIP_DISABLE_PIP_VERSION_CHECK", "1".into()));
    }
    env.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Where a sandbox's files come from, on the host.
#[derive(Debug, Clone, Copy)]
pub struct Where<'a> {
    pub rootfs: &'a Path,
    /// The session's workspace (`None`: a pooled sandbox's, attached later).
    pub workspace: Option<&'a Path>,
    /// The session's package layer, if it has one.
    pub packages: Option<&'a Path>,
    /// The egress proxy's CA bundle, which a sandbox with network trusts.
    pub ca_bundle: Option<&'a Path>,
}

/// The rlimits of `policy`.
pub fn rlimits(policy: &Policy) -> Rlimits {
    Rlimits { file_size_bytes: policy.file_size_mb * 1024 * 1024, open_files: policy.open_files }
}

/// The sandbox of a session under `policy`, running `argv`; without a workspace for
/// a pooled sandbox (it is attached when a run takes it). With network (and the
/// proxy's CA bundle given), the egress proxy's listener and bundle.
pub fn sandbox_spec(at: &Where, uid: u32, policy: &Policy, argv: Vec<String>, stdin: Option<String>) -> SandboxSpec {
    SandboxSpec {
        rootfs: at.rootfs.into(),
        dev: crate::rootfs::dev_beside(at.rootfs),
        workspace: at.workspace.map(Into::into),
        argv,
        env: environment(policy),
        stdin,
        host_uid: uid,
        host_gid: uid,
        tmp_size_bytes: policy.tmp_mb * 1024 * 1024,
        shm_size_bytes: policy.shm_mb * 1024 * 1024,
        rlimits: rlimits(policy),
        hostname: "sandbox".into(),
        template: false,
        seccomp: seccomp_filter(),
        egress: egress(policy, at.ca_bundle),
        packages: at.packages.map(Into::into),
    }
}

/// The egress proxy of a sandbox under `policy`, if it has network.
fn egress(policy: &Policy, ca_bundle: Option<&Path>) -> Option<Egress> {
    match (policy.network, ca_bundle) {
        (Network::Allowlist, Some(bundle)) => Some(Egress { port: spec::EGRESS_PORT, ca_bundle: bundle.into() }),
        _ => None,
    }
}

/// A pooled template interpreter's sandbox under `policy` (host uid `uid`, no
/// workspace): `runner.py --template` importing the policy's preload modules.
/// Its forks inherit its filesystem, the CA bundle included.
pub fn template_spec(rootfs: &Path, ca_bundle: Option<&Path>, uid: u32, policy: &Policy) -> SandboxSpec {
    let argv = vec![PYTHON.to_string(), RUNNER.to_string(), "--template".to_string(), policy.preload.join(",")];
    let at = Where { rootfs, workspace: None, packages: None, ca_bundle };
    let mut spec = sandbox_spec(&at, uid, policy, argv, None);
    spec.template = true;
    spec
}

/// What each fork of a template under `policy` makes of itself: the same limits
/// as a cold sandbox's, and the egress port Landlock lets it connect to.
pub fn child_spec(policy: &Policy) -> ChildSpec {
    let egress_port = (policy.network == Network::Allowlist).then_some(spec::EGRESS_PORT);
    ChildSpec { rlimits: rlimits(policy), seccomp: seccomp_filter(), egress_port }
}

/// The daemon's seccomp filter, compiled once. The daemon does not start without
/// it; were it missing all the same, the spec carries an empty program, which the
/// sandbox refuses to run without.
fn seccomp_filter() -> seccomp::Program {
    seccomp::filter().cloned().unwrap_or_default()
}

/// The cgroup limits of `policy`.
pub fn cgroup_limits(policy: &Policy) -> cgroup::Limits {
    cgroup::Limits { memory_bytes: policy.memory_bytes(), cpus: policy.cpus, pids: policy.pids }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            tmp_mb: 3,
            shm_mb: 2,
            file_size_mb: 5,
            open_files: 77,
            cpus: 2.5,
            memory_mb: 100,
            pids: 9,
            preload: vec!["numpy".into(), "pandas".into()],
            ..Policy::default()
        }
    }

    #[test]
    fn a_sandbox_spec_takes_the_policys_sizes_and_nothing_from_the_host() {
        let p = policy();
        let at = |rootfs, workspace| Where { rootfs, workspace, packages: None, ca_bundle: None };
        let s = sandbox_spec(&at(Path::new("/r"), Some(Path::new("/w"))), 4242, &p, vec!["/bin/true".into()], None);
        assert_eq!((s.host_uid, s.host_gid), (4242, 4242));
        assert_eq!((s.tmp_size_bytes, s.shm_size_bytes), (3 << 20, 2 << 20));
        assert_eq!(s.rlimits, Rlimits { file_size_bytes: 5 << 20, open_files: 77 });
        assert_eq!(s.workspace.as_deref(), Some(Path::new("/w")));
        // The daemon's shared /dev, mounted beside the rootfs.
        assert_eq!(s.dev, Path::new("/dev"));
        let s = sandbox_spec(&at(Path::new("/s/mnt/rootfs"), None), 1, &p, vec![], None);
        assert_eq!(s.dev, Path::new("/s/mnt/dev"));
        assert_eq!(s.hostname, "sandbox");
        assert!(!s.template);
        assert_eq!(s.env, environment(&p));
    }

    #[test]
    fn the_environment_is_fixed_and_its_thread_counts_follow_the_cpus() {
        let none = Policy { network: Network::None, ..policy() };
        let env = environment(&none);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("OMP_NUM_THREADS"), Some("3"));
        assert_eq!(get("HOME"), Some("/tmp"));
        assert_eq!(get("PATH"), Some("/opt/py/bin:/usr/local/bin:/usr/bin:/bin"));
        assert_eq!(env.len(), 13);
        let mut small = policy();
        small.cpus = 0.1;
        let env = environment(&small);
        assert!(env.contains(&("MKL_NUM_THREADS".into(), "1".into())));
    }

    #[test]
    fn a_sandbox_with_network_gets_the_proxy_its_ca_and_the_index() {
        let p = policy();
        let env = environment(&p);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "https_proxy"] {
            assert_eq!(get(name), Some("http://127.0.0.1:3128"), "{name}");
        }
        assert_eq!(get("SSL_CERT_FILE"), Some("/etc/ssl/certs/ca-certificates.crt"));
        assert_eq!(get("PIP_INDEX_URL"), Some("https://pypi.org/simple"));
        assert_eq!(get("PIP_ONLY_BINARY"), Some(":all:"));
        assert_eq!(get("PATH"), Some("/opt/packages/current/bin:/opt/py/bin:/usr/local/bin:/usr/bin:/bin"));
        let builds = environment(&Policy { source_builds: true, ..policy() });
        assert!(builds.contains(&("PIP_ONLY_BINARY".into(), ":none:".into())));
        let at = Where {
            rootfs: Path::new("/r"),
            workspace: Some(Path::new("/w")),
            packages: Some(Path::new("/s/packages")),
            ca_bundle: Some(Path::new("/state/egress/ca-bundle.pem")),
        };
        let s = sandbox_spec(&at, 1, &p, vec![], None);
        assert_eq!(s.egress, Some(Egress { port: 3128, ca_bundle: "/state/egress/ca-bundle.pem".into() }));
        assert_eq!(s.packages.as_deref(), Some(Path::new("/s/packages")));
        assert_eq!(child_spec(&p).egress_port, Some(3128));
        // No network: no proxy, no listener, no port for Landlock.
        let none = Policy { network: Network::None, ..policy() };
        assert_eq!(sandbox_spec(&at, 1, &none, vec![], None).egress, None);
        assert_eq!(child_spec(&none).egress_port, None);
        assert!(!environment(&none).iter().any(|(k, _)| k.contains("PROXY")));
    }

    #[test]
    fn a_template_runs_the_runner_with_the_preload_and_no_workspace() {
        let s = template_spec(Path::new("/r"), None, 7, &policy());
        assert!(s.template && s.workspace.is_none() && s.stdin.is_none());
        assert_eq!(s.argv, [PYTHON, RUNNER, "--template", "numpy,pandas"]);
    }

    #[test]
    fn a_forks_spec_matches_the_cold_sandboxs_limits() {
        let p = policy();
        let (cold, child) = (template_spec(Path::new("/r"), None, 1, &p), child_spec(&p));
        assert_eq!(child.rlimits, cold.rlimits);
        // A fork's /tmp and /dev/shm are its template's sizes (the helper mounts them).
        assert_eq!((cold.tmp_size_bytes, cold.shm_size_bytes), (3 << 20, 2 << 20));
    }

    #[test]
    fn cgroup_limits_are_the_policys() {
        let l = cgroup_limits(&policy());
        assert_eq!((l.memory_bytes, l.cpus, l.pids), (100 << 20, 2.5, 9));
    }
}
