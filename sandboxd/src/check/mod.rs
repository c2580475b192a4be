//! The host check: every requirement sandboxd has of the machine, each as an
//! [`Item`] that says what was found and, when it falls short, what to do.
//!
//! `sandboxd check` prints it, `GET /v1/check` serves it through the service
//! (`Operations::check_host`; `sandboxctl doctor` prints that), and the daemon
//! runs it at start and refuses to start on a failing item instead of failing on
//! the first run. The checks themselves are pure functions of what was read from
//! the kernel ([`Facts`]), so each is unit-tested on the texts real hosts give;
//! [`Facts::gather`] does the reading.

mod items;

use crate::model::check::{Item, Report, Status};
pub use items::*;
use std::path::{Path, PathBuf};

/// Oldest kernel sandboxd runs on: Landlock (5.13), idmapped ext4 mounts (5.12),
/// `cgroup.kill` (5.14).
pub const MIN_KERNEL: (u32, u32) = (5, 15);
/// Kernel with Landlock ABI 4 (TCP bind/connect rules).
pub const GOOD_KERNEL: (u32, u32) = (6, 7);
/// Below this much free space in the state directory the daemon refuses to start.
pub const MIN_FREE_BYTES: u64 = 512 << 20;
/// Below this much it warns: the rootfs unpacks to about 1 GiB.
pub const LOW_FREE_BYTES: u64 = 2 << 30;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the host cannot run sandboxes: {0} (run `sandboxd check` to see every requirement)")]
    Failed(String),
}

impl Item {
    pub(crate) fn new(name: &str, status: Status, found: impl Into<String>, fix: impl Into<String>) -> Item {
        Item { name: name.into(), status, found: found.into(), fix: fix.into() }
    }
    pub(crate) fn ok(name: &str, found: impl Into<String>) -> Item {
        Item::new(name, Status::Ok, found, "")
    }
}

impl Report {
    pub fn new(items: Vec<Item>) -> Report {
        Report { ok: items.iter().all(|i| i.status != Status::Fail), items }
    }

    /// The failing items in one line each, `name: found; fix`.
    pub fn failures(&self) -> Vec<String> {
        self.items
            .iter()
            .filter(|i| i.status == Status::Fail)
            .map(|i| format!("{}: {}; {}", i.name, i.found, i.fix))
            .collect()
    }

    /// The report as `sandboxd check` and `sandboxctl doctor` print it.
    pub fn render(&self) -> String {
        let width = self.items.iter().map(|i| i.name.chars().count()).max().unwrap_or(0);
        let mut out = String::new();
        for i in &self.items {
            let mark = match i.status {
                Status::Ok => "✓",
                Status::Warn => "!",
                Status::Fail => "✗",
            };
            out.push_str(&format!("{mark} {:<width$}  {}\n", i.name, i.found));
            if !i.fix.is_empty() {
                out.push_str(&format!("  {:<width$}  → {}\n", "", i.fix));
            }
        }
        out.push_str(if self.ok {
            "sandboxd can run sandboxes on this host.\n"
        } else {
            "sandboxd cannot run sandboxes on this host: fix the items marked ✗.\n"
        });
        out
    }

    /// `Err` naming the failing items, for the daemon's start.
    pub fn require(&self) -> Result<(), Error> {
        if self.ok {
            Ok(())
        } else {
            Err(Error::Failed(self.failures().join(" | ")))
        }
    }
}

/// What the checks are about: the daemon's state directory, rootfs tarball and
/// host uids (from its configuration).
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    pub state_dir: PathBuf,
    pub tarball: PathBuf,
    /// Every host uid a sandbox may run as, in spans ([`crate::uids::Ranges::spans`]):
    /// from the configuration alone until the daemon has taken back its sessions.
    pub uids: Vec<std::ops::Range<u32>>,
    pub max_sessions: usize,
}

impl Inputs {
    pub fn of(config: &crate::config::Config) -> Inputs {
        Inputs {
            state_dir: config.state_dir.clone(),
            tarball: config.rootfs_tarball.clone(),
            uids: crate::uids::Ranges::new(config.uid_base, config.max_sessions, None).spans([]),
            max_sessions: config.max_sessions,
        }
    }
}

/// Everything the checks read from the host.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub release: String,
    pub landlock_abi: i32,
    pub proc_status: String,
    pub max_user_namespaces: Option<String>,
    pub apparmor_restrict_userns: Option<String>,
    pub unprivileged_userns_clone: Option<String>,
    pub mountinfo: String,
    pub v2_controllers: Option<String>,
    pub loop_control: bool,
    pub loop_module: bool,
    pub state_dir: PathBuf,
    pub free_bytes: Option<u64>,
    pub tarball: PathBuf,
    pub tarball_exists: bool,
    pub tarball_sha256: Option<String>,
    pub content_hash: Option<String>,
    pub uids: Vec<std::ops::Range<u32>>,
    /// Host accounts and groups whose id is in `uids`: `(what, id)`.
    pub accounts: Vec<(String, u32)>,
    pub file_max: Option<u64>,
    pub max_sessions: usize,
}

fn read(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The state directory, or the closest of its parents that exists (the daemon
/// creates it at start).
fn existing_ancestor(dir: &Path) -> PathBuf {
    let mut p = dir;
    loop {
        if p.exists() {
            return p.to_path_buf();
        }
        match p.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => p = parent,
            _ => return PathBuf::from("."),
        }
    }
}

impl Facts {
    /// Read the host. Cheap: a few small files, one statvfs, and a user and group
    /// lookup per uid of the range.
    pub fn gather(inputs: &Inputs) -> Facts {
        let (state_dir, tarball) = (inputs.state_dir.as_path(), inputs.tarball.as_path());
        let release = read("/proc/sys/kernel/osrelease").map(|r| r.trim().to_string()).unwrap_or_default();
        let mountinfo = read(crate::mountinfo::SELF).unwrap_or_default();
        let v2_root =
            crate::mountinfo::parse(&mountinfo).into_iter().find(|m| m.fstype == "cgroup2").map(|m| m.mount_point);
        let v2_controllers = v2_root.and_then(|r| read(r.join("cgroup.controllers")));
        let stat_dir = existing_ancestor(state_dir);
        // The field types of statvfs differ between targets (u64 here, u32 on some).
        #[allow(clippy::unnecessary_cast)]
        let free_bytes = nix::sys::statvfs::statvfs(&stat_dir)
            .ok()
            .map(|s| (s.blocks_available() as u64).saturating_mul(s.fragment_size() as u64));
        let resolved = std::fs::canonicalize(tarball).ok();
        let tarball_exists = resolved.as_ref().is_some_and(|p| p.is_file());
        let tarball_sha256 = resolved.as_ref().and_then(|p| read(format!("{}.sha256", p.display())));
        let content_hash = resolved.as_ref().and_then(|p| {
            let manifest = p.to_string_lossy().strip_suffix(".tar.zst").map(|s| format!("{s}.manifest.json"))?;
            let json: serde_json::Value = serde_json::from_str(&read(manifest)?).ok()?;
            json.get("content_hash")?.as_str().map(str::to_string)
        });
        Facts {
            release,
            landlock_abi: crate::isolate::landlock::kernel_abi(),
            proc_status: read("/proc/self/status").unwrap_or_default(),
            max_user_namespaces: read("/proc/sys/user/max_user_namespaces"),
            apparmor_restrict_userns: read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"),
            unprivileged_userns_clone: read("/proc/sys/kernel/unprivileged_userns_clone"),
            mountinfo,
            v2_controllers,
            loop_control: Path::new("/dev/loop-control").exists(),
            loop_module: Path::new("/sys/module/loop").exists(),
            state_dir: stat_dir,
            free_bytes,
            tarball: tarball.to_path_buf(),
            tarball_exists,
            tarball_sha256,
            content_hash,
            uids: inputs.uids.clone(),
            accounts: accounts_in(&inputs.uids),
            file_max: read("/proc/sys/fs/file-max").and_then(|t| t.trim().parse().ok()),
            max_sessions: inputs.max_sessions,
        }
    }

    pub fn report(&self) -> Report {
        let mut items = vec![
            kernel(&self.release),
            landlock(self.landlock_abi, crate::isolate::landlock::TARGET_ABI as i32),
            seccomp(&self.proc_status),
        ];
        items.extend(user_namespaces(
            self.max_user_namespaces.as_deref(),
            self.apparmor_restrict_userns.as_deref(),
            self.unprivileged_userns_clone.as_deref(),
        ));
        items.push(cgroups(&self.mountinfo, self.v2_controllers.as_deref()));
        items.push(loop_devices(self.loop_control, self.loop_module));
        items.push(free_space(&self.state_dir, self.free_bytes));
        items.push(rootfs(
            &self.tarball,
            self.tarball_exists,
            self.tarball_sha256.as_deref(),
            self.content_hash.as_deref(),
        ));
        items.push(uid_range(&self.uids, &self.accounts));
        items.push(open_files(self.file_max, self.max_sessions));
        Report::new(items)
    }
}

/// The "uid range" item alone, for `uids`: the daemon's start asks again once it
/// knows the uids its recovered sessions keep.
pub fn uid_range_of(uids: &[std::ops::Range<u32>]) -> Item {
    uid_range(uids, &accounts_in(uids))
}

/// The host's users and groups (as the system's name service knows them) whose
/// id is in `uids`. Looked up once per set of spans (a lookup per uid: a few
/// hundred milliseconds for a large range), then remembered: `GET /v1/health` and
/// `/v1/check` read the host again on every call, and the daemon refuses to start
/// when the range holds an account anyway.
fn accounts_in(uids: &[std::ops::Range<u32>]) -> Vec<(String, u32)> {
    type Seen = (Vec<std::ops::Range<u32>>, Vec<(String, u32)>);
    static LOOKED_UP: std::sync::Mutex<Option<Seen>> = std::sync::Mutex::new(None);
    let mut seen = LOOKED_UP.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((range, found)) = seen.as_ref() {
        if range == uids {
            return found.clone();
        }
    }
    let found = look_up_accounts(uids.iter().flat_map(|r| r.clone()));
    *seen = Some((uids.to_vec(), found.clone()));
    found
}

fn look_up_accounts(uids: impl Iterator<Item = u32>) -> Vec<(String, u32)> {
    use nix::unistd::{Gid, Group, Uid, User};
    let mut found = vec![];
    for id in uids {
        if let Ok(Some(u)) = User::from_uid(Uid::from_raw(id)) {
            found.push((format!("user {}", u.name), id));
        }
        if let Ok(Some(g)) = Group::from_gid(Gid::from_raw(id)) {
            found.push((format!("group {}", g.name), id));
        }
    }
    found
}

/// The host check as `inputs` find the host now, read on a blocking thread: the
/// daemon's `GET /v1/check` and health ([`crate::service::Operations::check_host`],
/// with the inputs the daemon started with).
pub async fn now(inputs: Inputs) -> Report {
    tokio::task::spawn_blocking(move || Facts::gather(&inputs).report()).await.unwrap_or_else(|e| {
        Report::new(vec![Item::new(
            "check",
            Status::Fail,
            format!("the check did not finish: {e}"),
            "see the daemon's log",
        )])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_names_the_failing_items() {
        let r = Report::new(vec![kernel("6.12.0"), loop_devices(false, false), landlock(0, 7)]);
        assert!(!r.ok);
        let err = r.require().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("loop devices: no /dev/loop-control") && err.contains("modprobe loop"), "{err}");
        assert!(!err.contains("Landlock"), "a warning is not a failure: {err}");
        let text = r.render();
        assert!(text.contains("✓ kernel") && text.contains("✗ loop devices") && text.contains("! Landlock"), "{text}");
        assert!(Report::new(vec![kernel("6.12.0")]).require().is_ok());
    }

    #[test]
    fn this_host_gathers() {
        // Whatever the host, gathering reads something for every item and never panics.
        let facts = Facts::gather(&Inputs {
            state_dir: "/nonexistent/state".into(),
            tarball: "/nonexistent/rootfs.tar.zst".into(),
            uids: crate::uids::Ranges::new(600_000, 32, None).spans([]),
            max_sessions: 32,
        });
        let report = facts.report();
        assert_eq!(report.items.len(), 11);
        assert!(!facts.release.is_empty());
        assert_eq!(facts.state_dir, Path::new("/"));
        assert_eq!(report.items.iter().find(|i| i.name == "rootfs").map(|i| i.status), Some(Status::Fail));
        assert!(facts.file_max.is_some());
        // Root is an account, and no sandbox runs as it.
        let root = 0..1;
        assert_eq!(accounts_in(&[root]), [("user root".to_string(), 0), ("group root".to_string(), 0)]);
    }
}
