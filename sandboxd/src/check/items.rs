//! The checks themselves: each a pure function of what was read from the host
//! ([`super::Facts`]), giving one [`Item`] (or a few), unit-tested on the texts
//! real hosts give.

use super::{GOOD_KERNEL, LOW_FREE_BYTES, MIN_FREE_BYTES, MIN_KERNEL};
use crate::model::check::{Item, Status};
use std::path::Path;

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

/// No host account or group may have a uid a sandbox runs as: a sandbox's user
/// namespace is owned by its host uid, so a process of that account would hold
/// every capability over it (enter its mounts, read its workspace).
pub fn uid_range(uids: &[std::ops::Range<u32>], accounts: &[(String, u32)]) -> Item {
    let range = format!("host uids {}", crate::uids::describe(uids));
    if accounts.is_empty() {
        return Item::ok("uid range", format!("{range} (sessions and pooled templates): no account or group has one"));
    }
    let held: Vec<String> = accounts.iter().take(8).map(|(what, id)| format!("{what} ({id})")).collect();
    Item::new(
        "uid range",
        Status::Fail,
        format!("{range} (sessions and pooled templates) hold {}", held.join(", ")),
        "set uid_base to a range no account or group has (the default is 600000): a process of such an account would own a sandbox's user namespace, with every capability over it",
    )
}

/// Open files a sandbox can keep within its memory limit (a file mapped and then
/// closed keeps its open file, about 420 bytes of kernel memory each): what each
/// session should find room for in `fs.file-max`.
pub const FILES_PER_SESSION: u64 = 1 << 21;

/// `fs.file-max` is shared by every process of the host: sandboxes holding most of
/// it would leave the host's other processes (and other tenants) none.
pub fn open_files(file_max: Option<u64>, max_sessions: usize) -> Item {
    let wanted = FILES_PER_SESSION.saturating_mul(max_sessions as u64);
    match file_max {
        Some(max) if max >= wanted => Item::ok("open files", format!("fs.file-max is {max}")),
        Some(max) => Item::new(
            "open files",
            Status::Warn,
            format!("fs.file-max is {max}: a sandbox can keep about {FILES_PER_SESSION} files open within its memory limit, and {max_sessions} sessions could take all of it"),
            "raise it, as systemd does: sysctl -w fs.file-max=9223372036854775807 (and in /etc/sysctl.d)",
        ),
        None => Item::new("open files", Status::Warn, "fs.file-max could not be read", "check /proc/sys/fs/file-max"),
    }
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
    fn a_uid_range_with_an_account_in_it_is_refused() {
        let nobody = 65_532..65_820;
        let range = [nobody];
        assert_eq!(uid_range(&range, &[]).status, Status::Ok);
        let held = uid_range(&range, &[("user nobody".into(), 65_534), ("group nogroup".into(), 65_534)]);
        assert_eq!(held.status, Status::Fail);
        assert!(
            held.found.contains("host uids 65532 to 65819") && held.found.contains("user nobody (65534)"),
            "{held:?}"
        );
        assert!(held.fix.contains("uid_base"), "{held:?}");
        // A recovered session's uid, apart from the ranges, is named on its own.
        let apart = uid_range(&[600_000..600_258, 600_300..600_301], &[("group g".into(), 600_300)]);
        assert!(apart.found.starts_with("host uids 600000 to 600257, 600300 (sessions"), "{apart:?}");
    }

    #[test]
    fn file_max_below_what_the_sessions_could_hold_warns() {
        assert_eq!(open_files(Some(u64::MAX / 2), 32).status, Status::Ok);
        let low = open_files(Some(2_466_186), 32);
        assert_eq!(low.status, Status::Warn);
        assert!(low.found.contains("fs.file-max is 2466186") && low.fix.contains("sysctl -w fs.file-max"), "{low:?}");
        assert_eq!(open_files(None, 32).status, Status::Warn);
    }
}
