//! The host check: every requirement sandboxd has of the machine, each as an
//! [`Item`] that says what was found and, when it falls short, what to do.
//!
//! `sandboxd check` prints it, `GET /v1/check` serves it (`sandboxctl doctor`
//! prints that), and the daemon runs it at start and refuses to start on a
//! failing item instead of failing on the first run. The checks themselves are
//! pure functions of what was read from the kernel ([`Facts`]), so each is
//! unit-tested on the texts real hosts give; [`Facts::gather`] does the reading.

use serde::{Deserialize, Serialize};
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = CheckStatus)]
pub enum Status {
    /// Met.
    Ok,
    /// Met in part: sandboxd runs, with less than it could.
    Warn,
    /// Not met: the daemon refuses to start.
    Fail,
}

/// One requirement and how the host meets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Item {
    pub name: String,
    pub status: Status,
    /// What was found on this host.
    pub found: String,
    /// What to do; empty when the requirement is met.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fix: String,
}

impl Item {
    fn new(name: &str, status: Status, found: impl Into<String>, fix: impl Into<String>) -> Item {
        Item { name: name.into(), status, found: found.into(), fix: fix.into() }
    }
    fn ok(name: &str, found: impl Into<String>) -> Item {
        Item::new(name, Status::Ok, found, "")
    }
}

/// Every item; `ok` is false when one of them failed.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Report {
    pub ok: bool,
    pub items: Vec<Item>,
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

/// `"6.18.44-fc-v669"` → `(6, 18)`.
pub fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

pub fn kernel(release: &str) -> Item {
    const NAME: &str = "kernel";
    let upgrade = "boot a newer kernel (Debian 13: 6.12, Ubuntu 24.04: 6.8; on Debian 12 use bookworm-backports' linux-image-amd64)";
    match parse_release(release) {
        None => Item::new(NAME, Status::Fail, format!("cannot read the kernel version from `{release}`"), upgrade),
        Some(v) if v < MIN_KERNEL => Item::new(
            NAME,
            Status::Fail,
            format!("Linux {release} is older than {}.{}", MIN_KERNEL.0, MIN_KERNEL.1),
            upgrade,
        ),
        Some(v) if v < GOOD_KERNEL => Item::new(
            NAME,
            Status::Warn,
            format!(
                "Linux {release}: runs, but {}.{}+ is needed for Landlock's network rules",
                GOOD_KERNEL.0, GOOD_KERNEL.1
            ),
            upgrade,
        ),
        Some(_) => Item::ok(NAME, format!("Linux {release}")),
    }
}

pub fn landlock(abi: i32, target: i32) -> Item {
    const NAME: &str = "Landlock";
    let enable = "enable Landlock: add `landlock` to the kernel's lsm= boot parameter (e.g. lsm=landlock,lockdown,yama,integrity,apparmor,bpf) and reboot";
    if abi <= 0 {
        Item::new(NAME, Status::Warn, "not available: sandboxes rely on mount namespaces and seccomp alone", enable)
    } else if abi < target {
        Item::new(
            NAME,
            Status::Warn,
            format!("ABI {abi}, below the {target} sandboxd uses: the newer rules are not enforced"),
            "boot a newer kernel (6.12+ for ABI 6)",
        )
    } else {
        Item::ok(NAME, format!("ABI {abi}"))
    }
}

/// `status` is `/proc/self/status`: the kernel has seccomp filters when it shows
/// a `Seccomp:` line (CONFIG_SECCOMP) and a `Seccomp_filters:` line (CONFIG_SECCOMP_FILTER).
pub fn seccomp(status: &str) -> Item {
    const NAME: &str = "seccomp";
    let has = |key: &str| status.lines().any(|l| l.starts_with(key));
    if has("Seccomp:") && has("Seccomp_filters:") {
        Item::ok(NAME, "filters available")
    } else if has("Seccomp:") {
        Item::new(NAME, Status::Fail, "seccomp without filters", "use a kernel built with CONFIG_SECCOMP_FILTER=y")
    } else {
        Item::new(
            NAME,
            Status::Fail,
            "not in this kernel",
            "use a kernel built with CONFIG_SECCOMP=y and CONFIG_SECCOMP_FILTER=y",
        )
    }
}

/// The sysctls that allow or forbid user namespaces; `None` when the file does
/// not exist. Pooled runs make a user namespace from inside another, without
/// capabilities on the host, so they count as unprivileged.
pub fn user_namespaces(
    max: Option<&str>,
    apparmor_restrict: Option<&str>,
    unprivileged_clone: Option<&str>,
) -> Vec<Item> {
    const NAME: &str = "user namespaces";
    let mut items = Vec::new();
    let max_item = match max.map(str::trim) {
        None => Item::new(
            NAME,
            Status::Fail,
            "not in this kernel (no /proc/sys/user/max_user_namespaces)",
            "use a kernel built with CONFIG_USER_NS=y",
        ),
        Some("0") => Item::new(
            NAME,
            Status::Fail,
            "user.max_user_namespaces is 0",
            "sysctl -w user.max_user_namespaces=63000 (and put it in /etc/sysctl.d/60-sandboxd.conf)",
        ),
        Some(n) => match unprivileged_clone.map(str::trim) {
            Some("0") => Item::new(
                NAME,
                Status::Fail,
                "kernel.unprivileged_userns_clone is 0: nested user namespaces are refused",
                "sysctl -w kernel.unprivileged_userns_clone=1 (and put it in /etc/sysctl.d/60-sandboxd.conf)",
            ),
            _ => Item::ok(NAME, format!("user.max_user_namespaces = {n}")),
        },
    };
    items.push(max_item);
    let apparmor = match apparmor_restrict.map(str::trim) {
        None => Item::ok("AppArmor userns restriction", "not present"),
        Some("0") => Item::ok("AppArmor userns restriction", "kernel.apparmor_restrict_unprivileged_userns = 0"),
        Some(v) => Item::new(
            "AppArmor userns restriction",
            Status::Fail,
            format!("kernel.apparmor_restrict_unprivileged_userns = {v}: nested user namespaces get no capabilities (Ubuntu 23.10+)"),
            "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (and put it in /etc/sysctl.d/60-sandboxd.conf)",
        ),
    };
    items.push(apparmor);
    items
}

/// `mountinfo` is `/proc/self/mountinfo`; `v2_controllers` the cgroup2 root's
/// `cgroup.controllers`, when there is a cgroup2 mount.
pub fn cgroups(mountinfo: &str, v2_controllers: Option<&str>) -> Item {
    const NAME: &str = "cgroups";
    const NEEDED: [&str; 3] = ["memory", "cpu", "pids"];
    let mounts = crate::mountinfo::parse(mountinfo);
    let has_v1 = |c: &str| mounts.iter().any(|m| m.fstype == "cgroup" && m.has_super_option(c));
    let has_v2 = mounts.iter().any(|m| m.fstype == "cgroup2");
    if has_v2 {
        let have: Vec<&str> = v2_controllers.unwrap_or("").split_whitespace().collect();
        let missing: Vec<&str> = NEEDED.iter().copied().filter(|c| !have.contains(c)).collect();
        if missing.is_empty() {
            return Item::ok(NAME, format!("v2, controllers {}", have.join(" ")));
        }
        let v1_missing: Vec<&str> = NEEDED.iter().copied().filter(|c| !has_v1(c)).collect();
        if v1_missing.is_empty() {
            return Item::new(
                NAME,
                Status::Warn,
                "hybrid: memory, cpu and pids as v1 controllers",
                "boot with systemd.unified_cgroup_hierarchy=1 for cgroup v2 (the default on Debian 11+ and Ubuntu 21.10+)",
            );
        }
        return Item::new(
            NAME,
            Status::Fail,
            format!("cgroup v2 without the {} controller(s)", missing.join(", ")),
            "enable them (cgroup_enable=memory on the kernel command line for memory), or run sandboxd as the systemd service (Delegate=yes)",
        );
    }
    let v1_missing: Vec<&str> = NEEDED.iter().copied().filter(|c| !has_v1(c)).collect();
    if v1_missing.is_empty() {
        Item::new(
            NAME,
            Status::Warn,
            "v1 only: no cgroup.kill, runs are killed process by process",
            "boot with systemd.unified_cgroup_hierarchy=1 for cgroup v2",
        )
    } else {
        Item::new(
            NAME,
            Status::Fail,
            format!("no cgroup hierarchy with the {} controller(s)", v1_missing.join(", ")),
            "mount cgroup2 on /sys/fs/cgroup (mount -t cgroup2 none /sys/fs/cgroup)",
        )
    }
}

/// Workspaces are ext4 images on loop devices: `/dev/loop-control` must exist.
pub fn loop_devices(loop_control: bool, loop_module_loaded: bool) -> Item {
    const NAME: &str = "loop devices";
    if loop_control {
        Item::ok(NAME, "/dev/loop-control present")
    } else if loop_module_loaded {
        Item::new(
            NAME,
            Status::Fail,
            "the loop driver is loaded but /dev/loop-control is missing",
            "mknod /dev/loop-control c 10 237 (or bind /dev into this container)",
        )
    } else {
        Item::new(
            NAME,
            Status::Fail,
            "no /dev/loop-control: the loop driver is not loaded",
            "modprobe loop (and add `loop` to /etc/modules)",
        )
    }
}

/// `available` is what statvfs says non-root users may still use below `dir`.
pub fn free_space(dir: &Path, available: Option<u64>) -> Item {
    const NAME: &str = "free space";
    let mib = |b: u64| b >> 20;
    match available {
        None => Item::new(
            NAME,
            Status::Fail,
            format!("cannot stat {}", dir.display()),
            "create the state directory, or set state_dir to a directory that exists",
        ),
        Some(b) if b < MIN_FREE_BYTES => Item::new(
            NAME,
            Status::Fail,
            format!("{} MiB free in {}", mib(b), dir.display()),
            format!(
                "free space there (at least {} MiB), or set state_dir to a larger file system",
                mib(MIN_FREE_BYTES)
            ),
        ),
        Some(b) if b < LOW_FREE_BYTES => Item::new(
            NAME,
            Status::Warn,
            format!("{} MiB free in {}: workspaces may run out", mib(b), dir.display()),
            format!("keep at least {} MiB free there", mib(LOW_FREE_BYTES)),
        ),
        Some(b) => Item::ok(NAME, format!("{} MiB free in {}", mib(b), dir.display())),
    }
}

/// `sha256` is the tarball's `.sha256` file, `content_hash` the `content_hash` of
/// the manifest beside it, each `None` when missing.
pub fn rootfs(tarball: &Path, exists: bool, sha256: Option<&str>, content_hash: Option<&str>) -> Item {
    const NAME: &str = "rootfs";
    let build = "build it: sudo make rootfs (runs rootfs/build.sh), or set rootfs_tarball";
    if !exists {
        return Item::new(NAME, Status::Fail, format!("rootfs tarball {} not found", tarball.display()), build);
    }
    match sha256.map(str::trim) {
        Some(s) if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) => {
            let content = content_hash.map(|c| format!(", content {c}")).unwrap_or_default();
            Item::ok(NAME, format!("{} (sha256 {s}{content})", tarball.display()))
        }
        _ => Item::new(
            NAME,
            Status::Fail,
            format!("{} has no valid {}.sha256 beside it", tarball.display(), tarball.display()),
            format!("rebuild it with rootfs/build.sh; {build}"),
        ),
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
    /// Read the host. Cheap: a few small files and one statvfs.
    pub fn gather(state_dir: &Path, tarball: &Path) -> Facts {
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
        Report::new(items)
    }
}

/// Where the daemon's `GET /v1/check` looks (set once at start).
static INPUTS: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();

/// Remember the daemon's state directory and rootfs tarball for `GET /v1/check`.
pub fn remember(state_dir: &Path, tarball: &Path) {
    let _ = INPUTS.set((state_dir.to_path_buf(), tarball.to_path_buf()));
}

/// `GET /v1/check`: the host check, as the daemon sees the host now.
#[utoipa::path(get, path = "/v1/check", operation_id = "check_host", tag = "daemon", responses((status = 200, body = Report, description = "every host requirement: status ok, warn or fail, what was found, and what to do")))]
pub async fn route() -> axum::Json<Report> {
    axum::Json(now().await)
}

/// The host check as the daemon sees the host now (inputs from [`remember`]).
pub async fn now() -> Report {
    let (state_dir, tarball) = INPUTS.get().cloned().unwrap_or_default();
    tokio::task::spawn_blocking(move || Facts::gather(&state_dir, &tarball).report()).await.unwrap_or_else(|e| {
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
    fn kernel_versions() {
        assert_eq!(parse_release("6.18.44-fc-v669"), Some((6, 18)));
        assert_eq!(parse_release("6.8.0-49-generic"), Some((6, 8)));
        assert_eq!(parse_release("5.15"), Some((5, 15)));
        assert_eq!(parse_release("garbage"), None);
        assert_eq!(kernel("6.12.48+deb13-amd64").status, Status::Ok);
        assert_eq!(kernel("6.1.0-26-amd64").status, Status::Warn);
        let old = kernel("5.10.0-30-amd64");
        assert_eq!(old.status, Status::Fail);
        assert!(old.found.contains("older than 5.15") && old.fix.contains("newer kernel"), "{old:?}");
        assert_eq!(kernel("").status, Status::Fail);
    }

    #[test]
    fn landlock_abis() {
        assert_eq!(landlock(7, 7).status, Status::Ok);
        assert_eq!(landlock(4, 7).status, Status::Warn);
        let none = landlock(0, 7);
        assert_eq!(none.status, Status::Warn);
        assert!(none.fix.contains("lsm="), "{none:?}");
    }

    #[test]
    fn seccomp_from_proc_status() {
        let full = "Name:\tcat\nNoNewPrivs:\t0\nSeccomp:\t0\nSeccomp_filters:\t0\nSpeculation_Store_Bypass:\tthread vulnerable\n";
        assert_eq!(seccomp(full).status, Status::Ok);
        assert_eq!(seccomp("Name:\tcat\nSeccomp:\t0\n").status, Status::Fail);
        let none = seccomp("Name:\tcat\n");
        assert_eq!(none.status, Status::Fail);
        assert!(none.fix.contains("CONFIG_SECCOMP_FILTER"));
    }

    #[test]
    fn user_namespace_sysctls() {
        // Debian 13: no AppArmor restriction sysctl beyond the default 0, no Debian clone knob.
        let debian = user_namespaces(Some("63437\n"), None, None);
        assert!(debian.iter().all(|i| i.status == Status::Ok), "{debian:?}");
        // Ubuntu 24.04 as installed.
        let ubuntu = user_namespaces(Some("63437\n"), Some("1\n"), Some("1\n"));
        assert_eq!(ubuntu[0].status, Status::Ok);
        assert_eq!(ubuntu[1].status, Status::Fail);
        assert!(ubuntu[1].fix.contains("kernel.apparmor_restrict_unprivileged_userns=0"), "{:?}", ubuntu[1]);
        let zero = user_namespaces(Some("0\n"), Some("0"), None);
        assert_eq!(zero[0].status, Status::Fail);
        assert!(zero[0].fix.contains("user.max_user_namespaces"));
        assert_eq!(zero[1].status, Status::Ok);
        assert_eq!(user_namespaces(None, None, None)[0].status, Status::Fail);
        let clone_off = user_namespaces(Some("100"), None, Some("0"));
        assert_eq!(clone_off[0].status, Status::Fail);
        assert!(clone_off[0].fix.contains("unprivileged_userns_clone=1"));
    }

    const V2: &str = "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
    const V1: &str = "\
40 24 0:35 / /sys/fs/cgroup/memory rw shared:15 - cgroup cgroup rw,memory
41 24 0:36 / /sys/fs/cgroup/cpu,cpuacct rw shared:16 - cgroup cgroup rw,cpu,cpuacct
42 24 0:37 / /sys/fs/cgroup/pids rw shared:17 - cgroup cgroup rw,pids
";

    #[test]
    fn cgroup_modes() {
        assert_eq!(cgroups(V2, Some("cpuset cpu io memory hugetlb pids rdma misc\n")).status, Status::Ok);
        let partial = cgroups(V2, Some("cpu io pids\n"));
        assert_eq!(partial.status, Status::Fail);
        assert!(partial.found.contains("memory"), "{partial:?}");
        assert_eq!(cgroups(V1, None).status, Status::Warn);
        let hybrid = format!("{V1}43 24 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
        assert_eq!(cgroups(&hybrid, Some("")).status, Status::Warn);
        let none = cgroups("22 1 0:21 / /proc rw - proc proc rw\n", None);
        assert_eq!(none.status, Status::Fail);
        assert!(none.fix.contains("mount -t cgroup2"));
    }

    #[test]
    fn loop_and_space() {
        assert_eq!(loop_devices(true, true).status, Status::Ok);
        let missing = loop_devices(false, false);
        assert_eq!(missing.status, Status::Fail);
        assert!(missing.fix.contains("modprobe loop"));
        assert_eq!(loop_devices(false, true).status, Status::Fail);
        let dir = Path::new("/var/lib/sandboxd");
        assert_eq!(free_space(dir, Some(100 << 30)).status, Status::Ok);
        assert_eq!(free_space(dir, Some(1 << 30)).status, Status::Warn);
        let full = free_space(dir, Some(10 << 20));
        assert_eq!(full.status, Status::Fail);
        assert!(full.found.contains("10 MiB free in /var/lib/sandboxd"), "{full:?}");
        assert_eq!(free_space(dir, None).status, Status::Fail);
    }

    #[test]
    fn rootfs_presence_and_hash() {
        let t = Path::new("/var/cache/sandboxd/rootfs/current.tar.zst");
        let sha = "a".repeat(64);
        let ok = rootfs(t, true, Some(&format!("{sha}\n")), Some("sha256:beef"));
        assert_eq!(ok.status, Status::Ok);
        assert!(ok.found.contains(&sha) && ok.found.contains("sha256:beef"), "{ok:?}");
        let missing = rootfs(t, false, None, None);
        assert_eq!(missing.status, Status::Fail);
        assert!(missing.found.contains("not found") && missing.fix.contains("rootfs/build.sh"), "{missing:?}");
        assert_eq!(rootfs(t, true, Some("nonsense"), None).status, Status::Fail);
        assert_eq!(rootfs(t, true, None, None).status, Status::Fail);
    }

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
        let facts = Facts::gather(Path::new("/nonexistent/state"), Path::new("/nonexistent/rootfs.tar.zst"));
        let report = facts.report();
        assert_eq!(report.items.len(), 9);
        assert!(!facts.release.is_empty());
        assert_eq!(facts.state_dir, Path::new("/"));
        assert_eq!(report.items.last().map(|i| i.status), Some(Status::Fail));
    }
}
