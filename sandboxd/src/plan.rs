//! A policy, translated into what the isolation layer is given: the sandbox's spec
//! ([`SandboxSpec`]), its cgroup limits, a template fork's [`ChildSpec`], and the
//! program's environment. Pure functions: [`crate::run`], [`crate::kernel`] and
//! [`crate::pool`] all build their sandboxes from here, and nothing here calls back
//! up into them.

use crate::isolate::spec::{ChildSpec, Rlimits, SandboxSpec};
use crate::isolate::{cgroup, seccomp};
use crate::model::policy::Policy;
use std::path::Path;

/// Where every sandboxed Python lives, inside the rootfs.
pub const PYTHON: &str = "/opt/py/bin/python";
/// The one-shot and pooled runner, inside the rootfs.
pub const RUNNER: &str = "/opt/sandboxd/runner.py";

/// The environment of every sandboxed program: nothing from the host.
pub fn environment(policy: &Policy) -> Vec<(String, String)> {
    let threads = (policy.cpus.ceil() as u64).max(1).to_string();
    [
        ("PATH", "/opt/py/bin:/usr/local/bin:/usr/bin:/bin"),
        ("HOME", "/tmp"),
        ("USER", "sandbox"),
        ("LANG", "C.UTF-8"),
        ("LC_ALL", "C.UTF-8"),
        ("TMPDIR", "/tmp"),
        ("MPLBACKEND", "Agg"),
        ("MPLCONFIGDIR", "/tmp/.mplconfig"),
        ("PYTHONUNBUFFERED", "1"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("OPENBLAS_NUM_THREADS", threads.as_str()),
        ("OMP_NUM_THREADS", threads.as_str()),
        ("MKL_NUM_THREADS", threads.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The rlimits of `policy`.
pub fn rlimits(policy: &Policy) -> Rlimits {
    Rlimits { file_size_bytes: policy.file_size_mb * 1024 * 1024, open_files: policy.open_files }
}

/// The sandbox of a session under `policy`, running `argv`; without a workspace for
/// a pooled sandbox (it is attached when a run takes it).
pub fn sandbox_spec(
    rootfs: &Path,
    workspace: Option<&Path>,
    uid: u32,
    policy: &Policy,
    argv: Vec<String>,
    stdin: Option<String>,
) -> SandboxSpec {
    SandboxSpec {
        rootfs: rootfs.into(),
        dev: crate::rootfs::dev_beside(rootfs),
        workspace: workspace.map(Into::into),
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
    }
}

/// A pooled template interpreter's sandbox under `policy` (host uid `uid`, no
/// workspace): `runner.py --template` importing the policy's preload modules.
pub fn template_spec(rootfs: &Path, uid: u32, policy: &Policy) -> SandboxSpec {
    let argv = vec![PYTHON.to_string(), RUNNER.to_string(), "--template".to_string(), policy.preload.join(",")];
    let mut spec = sandbox_spec(rootfs, None, uid, policy, argv, None);
    spec.template = true;
    spec
}

/// What each fork of a template under `policy` makes of itself: the same limits
/// as a cold sandbox's.
pub fn child_spec(policy: &Policy) -> ChildSpec {
    ChildSpec { rlimits: rlimits(policy), seccomp: seccomp_filter() }
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
        let s = sandbox_spec(Path::new("/r"), Some(Path::new("/w")), 4242, &p, vec!["/bin/true".into()], None);
        assert_eq!((s.host_uid, s.host_gid), (4242, 4242));
        assert_eq!((s.tmp_size_bytes, s.shm_size_bytes), (3 << 20, 2 << 20));
        assert_eq!(s.rlimits, Rlimits { file_size_bytes: 5 << 20, open_files: 77 });
        assert_eq!(s.workspace.as_deref(), Some(Path::new("/w")));
        // The daemon's shared /dev, mounted beside the rootfs.
        assert_eq!(s.dev, Path::new("/dev"));
        let s = sandbox_spec(Path::new("/s/mnt/rootfs"), None, 1, &p, vec![], None);
        assert_eq!(s.dev, Path::new("/s/mnt/dev"));
        assert_eq!(s.hostname, "sandbox");
        assert!(!s.template);
        assert_eq!(s.env, environment(&p));
    }

    #[test]
    fn the_environment_is_fixed_and_its_thread_counts_follow_the_cpus() {
        let env = environment(&policy());
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
    fn a_template_runs_the_runner_with_the_preload_and_no_workspace() {
        let s = template_spec(Path::new("/r"), 7, &policy());
        assert!(s.template && s.workspace.is_none() && s.stdin.is_none());
        assert_eq!(s.argv, [PYTHON, RUNNER, "--template", "numpy,pandas"]);
    }

    #[test]
    fn a_forks_spec_matches_the_cold_sandboxs_limits() {
        let p = policy();
        let (cold, child) = (template_spec(Path::new("/r"), 1, &p), child_spec(&p));
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
