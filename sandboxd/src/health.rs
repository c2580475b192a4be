//! What `GET /v1/health` reports as degraded: each thing a run needs that is not
//! there now, with what to do. The daemon is `"ok"` when the list is empty.
//!
//! Looked at on each request (all cheap): the rootfs mount and its manifest, the
//! directories run cgroups are made in, the pool's templates that fail to start,
//! and the host check ([`crate::check`]) items that fail now.

use crate::isolate::cgroup::Cgroups;
use crate::model::check::{Item, Report, Status};
use crate::model::health::Problem;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `"ok"` when nothing is degraded, else `"degraded"`.
pub fn status(problems: &[Problem]) -> &'static str {
    if problems.is_empty() {
        "ok"
    } else {
        "degraded"
    }
}

/// What the problems are worked out from.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The rootfs mount point, whether it is mounted, and whether its manifest reads.
    pub rootfs: PathBuf,
    pub rootfs_mounted: bool,
    pub rootfs_manifest: bool,
    /// Directories run cgroups are made in that are gone.
    pub missing_cgroup_dirs: Vec<PathBuf>,
    /// Per policy, why its last pooled template failed to start.
    pub pool_start_errors: BTreeMap<String, String>,
    pub host: Vec<Item>,
}

impl Facts {
    /// Read what is cheap to read here; `host` is the host check's report now.
    pub fn gather(
        rootfs: &Path,
        cgroups: &Cgroups,
        pool_start_errors: BTreeMap<String, String>,
        host: Report,
    ) -> Facts {
        Facts {
            rootfs: rootfs.to_path_buf(),
            rootfs_mounted: crate::mountinfo::is_mount_point(&crate::mountinfo::read_self(), rootfs),
            rootfs_manifest: rootfs.join("opt/sandboxd/manifest.json").is_file(),
            missing_cgroup_dirs: cgroups.bases().into_iter().filter(|d| !d.is_dir()).collect(),
            pool_start_errors,
            host: host.items,
        }
    }

    /// The problems, in a fixed order: rootfs, cgroups, pool (by policy), host.
    pub fn problems(&self) -> Vec<Problem> {
        let mut out = vec![];
        let problem = |name: &str, found: String, fix: &str| Problem { name: name.into(), found, fix: fix.into() };
        if !self.rootfs_mounted {
            out.push(problem(
                "rootfs",
                format!("the rootfs is not mounted at {}: no sandbox can start", self.rootfs.display()),
                "restart sandboxd (it mounts the rootfs at start); see its log if it does not come back",
            ));
        } else if !self.rootfs_manifest {
            out.push(problem(
                "rootfs",
                format!(
                    "{} has no opt/sandboxd/manifest.json: the mounted tree is not a sandboxd rootfs",
                    self.rootfs.display()
                ),
                "restart sandboxd so it mounts its rootfs image again",
            ));
        }
        if !self.missing_cgroup_dirs.is_empty() {
            let dirs: Vec<String> = self.missing_cgroup_dirs.iter().map(|d| d.display().to_string()).collect();
            out.push(problem(
                "cgroups",
                format!("the run cgroup directory is gone: {}; no sandbox can start", dirs.join(", ")),
                "restart sandboxd (it makes its cgroup directories at start), and keep other tools from removing them",
            ));
        }
        for (key, error) in &self.pool_start_errors {
            out.push(match crate::pool::tier::split(key) {
                (policy, true) => problem(
                    "pool",
                    format!(
                        "the bare pooled sandboxes of policy `{policy}` (for code that imports only the standard \
                         library) fail to start ({error}); those runs use cold sandboxes"
                    ),
                    "see the daemon's log for `could not start a pooled sandbox`; check the policy's memory_mb and pids",
                ),
                (policy, false) => problem(
                    "pool",
                    format!("pooled sandboxes of policy `{policy}` fail to start ({error}); its Python runs use cold sandboxes"),
                    "see the daemon's log for `could not start a pooled sandbox`; check the policy's memory_mb, pids and preload",
                ),
            });
        }
        for item in self.host.iter().filter(|i| i.status == Status::Fail) {
            out.push(Problem {
                name: format!("host: {}", item.name),
                found: item.found.clone(),
                fix: item.fix.clone(),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> Facts {
        Facts {
            rootfs: "/var/lib/sandboxd/mnt/rootfs".into(),
            rootfs_mounted: true,
            rootfs_manifest: true,
            host: vec![Item {
                name: "cgroups".into(),
                status: Status::Warn,
                found: "hybrid".into(),
                fix: "boot with v2".into(),
            }],
            ..Facts::default()
        }
    }

    #[test]
    fn nothing_wrong_is_ok_and_warnings_do_not_count() {
        let p = healthy().problems();
        assert_eq!(p, vec![]);
        assert_eq!(status(&p), "ok");
    }

    #[test]
    fn each_fault_is_named_in_order() {
        let mut f = healthy();
        f.rootfs_mounted = false;
        f.missing_cgroup_dirs = vec!["/sys/fs/cgroup/x/sandboxd".into()];
        f.pool_start_errors.insert("strict".into(), "boom".into());
        f.pool_start_errors.insert("default".into(), "bang".into());
        f.host.push(Item {
            name: "free space".into(),
            status: Status::Fail,
            found: "12 MiB free".into(),
            fix: "free some".into(),
        });
        let p = f.problems();
        assert_eq!(status(&p), "degraded");
        let names: Vec<&str> = p.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["rootfs", "cgroups", "pool", "pool", "host: free space"]);
        assert_eq!(p[0].found, "the rootfs is not mounted at /var/lib/sandboxd/mnt/rootfs: no sandbox can start");
        assert!(p[2].found.starts_with("pooled sandboxes of policy `default` fail to start (bang)"), "{:?}", p[2]);
        assert_eq!((p[4].found.as_str(), p[4].fix.as_str()), ("12 MiB free", "free some"));
    }

    #[test]
    fn a_bare_tier_that_fails_is_named_by_its_policy() {
        let mut f = healthy();
        f.pool_start_errors.insert("default/bare".into(), "oom".into());
        let p = f.problems();
        assert_eq!(p.len(), 1);
        assert_eq!(
            p[0].found,
            "the bare pooled sandboxes of policy `default` (for code that imports only the standard library) fail to \
             start (oom); those runs use cold sandboxes"
        );
        assert!(!p[0].fix.contains("preload"), "{:?}", p[0]);
    }

    #[test]
    fn a_mounted_tree_without_a_manifest_is_reported() {
        let mut f = healthy();
        f.rootfs_manifest = false;
        let p = f.problems();
        assert_eq!(p.len(), 1);
        assert!(p[0].found.contains("no opt/sandboxd/manifest.json"), "{p:?}");
    }
}
