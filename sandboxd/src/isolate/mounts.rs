//! The sandbox's filesystem: the rootfs read-only as `/`, the workspace read-write
//! at `/mnt/data`, private tmpfs `/tmp` and `/dev/shm`, a minimal `/dev`, a fresh
//! `/proc` with what container runtimes mask in it ([`proc_masks`]), then
//! `pivot_root` so nothing of the host stays reachable.
//!
//! [`plan`] is pure (unit-tested); [`apply`] performs the plan in the sandbox's own
//! mount namespace. A pooled sandbox is built without its workspace, which
//! [`attach_workspace`] mounts later, when a run takes the sandbox.

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::statvfs::{statvfs, FsFlags};
use nix::unistd::{chdir, pivot_root};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct Error {
    op: &'static str,
    path: PathBuf,
    source: nix::Error,
}

/// Device nodes bound from the host into the sandbox's `/dev`.
pub const DEVICES: [&str; 5] = ["null", "zero", "full", "random", "urandom"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountOp {
    /// Stop mount events propagating to or from the host.
    MakeRootPrivate,
    /// Bind `src` onto `dst`; `dst` is created as an empty file first when `file`.
    Bind {
        src: PathBuf,
        dst: PathBuf,
        file: bool,
    },
    /// Make the mount at `path` read-only, nosuid and nodev (keeping flags the
    /// kernel locked on it).
    RemountReadOnly {
        path: PathBuf,
    },
    /// Add nosuid and nodev to the bind mount at `path`.
    RemountNoSuidNoDev {
        path: PathBuf,
    },
    Tmpfs {
        dst: PathBuf,
        size_bytes: u64,
        mode: u32,
        noexec: bool,
    },
    Mkdir {
        path: PathBuf,
    },
    Symlink {
        target: &'static str,
        link: PathBuf,
    },
    Proc {
        dst: PathBuf,
    },
    /// Bind `/dev/null` over the file at `path`, if there is one.
    MaskFile {
        path: PathBuf,
    },
    /// Mount an empty read-only tmpfs over the directory at `path`, if there is one.
    MaskDir {
        path: PathBuf,
    },
    /// Bind `path`, if it exists, onto itself read-only (nosuid, nodev).
    ReadOnly {
        path: PathBuf,
    },
    /// Make `new_root` the root and detach the old one.
    PivotRoot {
        new_root: PathBuf,
    },
}

/// What the plan is made from.
#[derive(Debug, Clone)]
pub struct Layout<'a> {
    pub rootfs: &'a Path,
    /// `None`: the workspace is attached later ([`attach_workspace`]).
    pub workspace: Option<&'a Path>,
    pub tmp_size_bytes: u64,
    pub shm_size_bytes: u64,
    /// Mask `/proc` ([`proc_masks`]). Not for a pooled template: its forks mount a
    /// fresh `/proc` of their own, which the kernel allows only while some `/proc`
    /// in their mount namespace is fully visible; each fork masks its own.
    pub mask_proc: bool,
}

/// Files of `/proc` that tell about the host (its kernel command line, memory,
/// symbols, keys, timers, interrupts): `/dev/null` is bound over each that exists.
pub const PROC_MASKED_FILES: [&str; 15] = [
    "cmdline",
    "config.gz",
    "interrupts",
    "kallsyms",
    "kcore",
    "key-users",
    "keys",
    "kpagecgroup",
    "kpagecount",
    "kpageflags",
    "latency_stats",
    "sched_debug",
    "timer_list",
    "timer_stats",
    "vmallocinfo",
];
/// Directories of `/proc` about the host's hardware: an empty read-only tmpfs each.
pub const PROC_MASKED_DIRS: [&str; 4] = ["acpi", "asound", "driver", "scsi"];
/// What stays readable in `/proc` but never writable, whatever the user namespace.
pub const PROC_READ_ONLY: [&str; 5] = ["bus", "fs", "irq", "sys", "sysrq-trigger"];

/// What is masked in the procfs mounted at `proc` (as container runtimes do).
pub fn proc_masks(proc: &Path) -> Vec<MountOp> {
    let files = PROC_MASKED_FILES.iter().map(|f| MountOp::MaskFile { path: proc.join(f) });
    let dirs = PROC_MASKED_DIRS.iter().map(|d| MountOp::MaskDir { path: proc.join(d) });
    let read_only = PROC_READ_ONLY.iter().map(|p| MountOp::ReadOnly { path: proc.join(p) });
    files.chain(dirs).chain(read_only).collect()
}

/// The mount operations, in order.
pub fn plan(l: &Layout) -> Vec<MountOp> {
    use MountOp::*;
    let root = l.rootfs;
    let dev = root.join("dev");
    let mut ops = vec![
        MakeRootPrivate,
        Bind { src: root.into(), dst: root.into(), file: false },
        RemountReadOnly { path: root.into() },
    ];
    if let Some(workspace) = l.workspace {
        ops.push(Bind { src: workspace.into(), dst: root.join("mnt/data"), file: false });
        ops.push(RemountNoSuidNoDev { path: root.join("mnt/data") });
    }
    ops.extend([
        Tmpfs { dst: root.join("tmp"), size_bytes: l.tmp_size_bytes, mode: 0o1777, noexec: false },
        Tmpfs { dst: dev.clone(), size_bytes: 64 * 1024, mode: 0o755, noexec: true },
    ]);
    for name in DEVICES {
        ops.push(Bind { src: Path::new("/dev").join(name), dst: dev.join(name), file: true });
    }
    ops.push(Mkdir { path: dev.join("shm") });
    ops.push(Tmpfs { dst: dev.join("shm"), size_bytes: l.shm_size_bytes, mode: 0o1777, noexec: true });
    for (target, name) in [
        ("/proc/self/fd", "fd"),
        ("/proc/self/fd/0", "stdin"),
        ("/proc/self/fd/1", "stdout"),
        ("/proc/self/fd/2", "stderr"),
    ] {
        ops.push(Symlink { target, link: dev.join(name) });
    }
    ops.push(RemountReadOnly { path: dev });
    ops.push(Proc { dst: root.join("proc") });
    if l.mask_proc {
        ops.extend(proc_masks(&root.join("proc")));
    }
    ops.push(PivotRoot { new_root: root.into() });
    ops
}

/// Mount the host directory `workspace` at `/mnt/data` in a running sandbox whose
/// mount namespace is `sandbox_ns`, nosuid and nodev, with the idmap of `userns`
/// (see [`super::namespaces::idmap_userns`]): a detached copy of the mount is made
/// in the host's namespace, then moved into place from inside the sandbox's.
/// The caller (host root, single-threaded) is back in `host_ns` when this returns.
pub fn attach_workspace(
    workspace: &Path,
    userns: BorrowedFd,
    sandbox_ns: BorrowedFd,
    host_ns: BorrowedFd,
) -> Result<(), Error> {
    let data = Path::new("/mnt/data");
    let tree = rustix::mount::open_tree(
        rustix::fs::CWD,
        workspace,
        rustix::mount::OpenTreeFlags::OPEN_TREE_CLONE | rustix::mount::OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(|e| err("open_tree", workspace)(nix::Error::from_raw(e.raw_os_error())))?;
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: mount_setattr reads `attr` (its size passed along) and the empty path,
    // both alive for the call; it only changes the detached mount behind `tree`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc < 0 {
        return Err(err("mount_setattr (idmap, nosuid, nodev)", workspace)(nix::Error::last()));
    }
    nix::sched::setns(sandbox_ns, nix::sched::CloneFlags::CLONE_NEWNS).map_err(err("setns", data))?;
    let moved = rustix::mount::move_mount(
        &tree,
        c"",
        rustix::fs::CWD,
        data,
        rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| err("move_mount", data)(nix::Error::from_raw(e.raw_os_error())));
    nix::sched::setns(host_ns, nix::sched::CloneFlags::CLONE_NEWNS).map_err(err("setns back", Path::new("/")))?;
    moved
}

fn err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(nix::Error) -> Error + 'a {
    move |source| Error { op, path: path.to_path_buf(), source }
}

/// Perform the plan. Must run in a fresh mount namespace with CAP_SYS_ADMIN there.
pub fn apply(ops: &[MountOp]) -> Result<(), Error> {
    let none: Option<&str> = None;
    for op in ops {
        match op {
            MountOp::MakeRootPrivate => {
                mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
                    .map_err(err("make / private", Path::new("/")))?;
            }
            MountOp::Bind { src, dst, file } => {
                if *file {
                    std::fs::File::create(dst).map_err(|e| Error {
                        op: "create",
                        path: dst.clone(),
                        source: io_errno(e),
                    })?;
                }
                mount(Some(src.as_path()), dst.as_path(), none, MsFlags::MS_BIND | MsFlags::MS_REC, none)
                    .map_err(err("bind", dst))?;
            }
            MountOp::RemountReadOnly { path } => {
                remount(path, MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV)?
            }
            MountOp::RemountNoSuidNoDev { path } => remount(path, MsFlags::MS_NOSUID | MsFlags::MS_NODEV)?,
            MountOp::Tmpfs { dst, size_bytes, mode, noexec } => {
                let mut flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
                if *noexec {
                    flags |= MsFlags::MS_NOEXEC;
                }
                let data = format!("size={size_bytes},mode={mode:o}");
                mount(Some("tmpfs"), dst.as_path(), Some("tmpfs"), flags, Some(data.as_str()))
                    .map_err(err("mount tmpfs", dst))?;
            }
            MountOp::Mkdir { path } => {
                nix::unistd::mkdir(path.as_path(), nix::sys::stat::Mode::from_bits_truncate(0o755))
                    .map_err(err("mkdir", path))?;
            }
            MountOp::Symlink { target, link } => {
                nix::unistd::symlinkat(*target, nix::fcntl::AT_FDCWD, link.as_path()).map_err(err("symlink", link))?;
            }
            MountOp::Proc { dst } => {
                let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
                mount(Some("proc"), dst.as_path(), Some("proc"), flags, none).map_err(err("mount proc", dst))?;
            }
            MountOp::MaskFile { path } => {
                if exists(path)? {
                    mount(Some("/dev/null"), path.as_path(), none, MsFlags::MS_BIND, none)
                        .map_err(err("mask", path))?;
                }
            }
            MountOp::MaskDir { path } => {
                if exists(path)? {
                    let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
                    mount(Some("tmpfs"), path.as_path(), Some("tmpfs"), flags, Some("size=4k,mode=555"))
                        .map_err(err("mask", path))?;
                }
            }
            MountOp::ReadOnly { path } => {
                if exists(path)? {
                    mount(Some(path.as_path()), path.as_path(), none, MsFlags::MS_BIND | MsFlags::MS_REC, none)
                        .map_err(err("bind", path))?;
                    remount(path, MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV)?;
                }
            }
            MountOp::PivotRoot { new_root } => {
                chdir(new_root.as_path()).map_err(err("chdir", new_root))?;
                // pivot_root(".", ".") stacks the old root under the new one; detaching
                // it leaves nothing of the host reachable, with no put_old directory.
                pivot_root(".", ".").map_err(err("pivot_root", new_root))?;
                umount2(".", MntFlags::MNT_DETACH).map_err(err("detach the old root", new_root))?;
                chdir("/").map_err(err("chdir", Path::new("/")))?;
            }
        }
    }
    Ok(())
}

/// Bind-remount `path` adding `add`, keeping the flags already on the mount: in a
/// user namespace the kernel refuses a remount that would clear a locked flag.
fn remount(path: &Path, add: MsFlags) -> Result<(), Error> {
    let current = statvfs(path).map_err(err("statvfs", path))?.flags();
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | add;
    for (st, ms) in [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if current.contains(st) {
            flags |= ms;
        }
    }
    let none: Option<&str> = None;
    mount(none, path, none, flags, none).map_err(err("remount", path))
}

/// Does `path` exist (without following a last symlink)? Other errors are errors.
fn exists(path: &Path) -> Result<bool, Error> {
    match nix::sys::stat::lstat(path) {
        Ok(_) => Ok(true),
        Err(nix::Error::ENOENT) => Ok(false),
        Err(e) => Err(err("lstat", path)(e)),
    }
}

fn io_errno(e: std::io::Error) -> nix::Error {
    nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Vec<MountOp> {
        plan(&Layout {
            rootfs: Path::new("/r"),
            workspace: Some(Path::new("/w")),
            tmp_size_bytes: 1 << 20,
            shm_size_bytes: 2 << 20,
            mask_proc: true,
        })
    }

    #[test]
    fn root_is_private_first_and_pivoted_last() {
        let ops = layout();
        assert_eq!(ops[0], MountOp::MakeRootPrivate);
        assert_eq!(ops.last(), Some(&MountOp::PivotRoot { new_root: "/r".into() }));
    }

    #[test]
    fn rootfs_is_read_only_and_workspace_is_bound_without_suid_or_devices() {
        let ops = layout();
        let bind = ops.iter().position(|o| matches!(o, MountOp::Bind { dst, .. } if dst == Path::new("/r")));
        let ro = ops.iter().position(|o| *o == MountOp::RemountReadOnly { path: "/r".into() });
        assert!(bind.is_some() && ro > bind);
        assert!(ops.contains(&MountOp::Bind { src: "/w".into(), dst: "/r/mnt/data".into(), file: false }));
        assert!(ops.contains(&MountOp::RemountNoSuidNoDev { path: "/r/mnt/data".into() }));
    }

    #[test]
    fn nothing_is_bound_at_run() {
        assert!(!layout().iter().any(|o| matches!(o, MountOp::Bind { dst, .. } if dst.starts_with("/r/run"))));
    }

    #[test]
    fn a_pooled_sandbox_starts_without_a_workspace() {
        let ops = plan(&Layout {
            rootfs: Path::new("/r"),
            workspace: None,
            tmp_size_bytes: 1,
            shm_size_bytes: 1,
            mask_proc: true,
        });
        assert!(!ops.iter().any(|o| matches!(o, MountOp::Bind { dst, .. } if dst == Path::new("/r/mnt/data"))));
        assert_eq!(ops.len() + 2, layout().len());
    }

    #[test]
    fn proc_is_masked_after_it_is_mounted_and_before_the_pivot() {
        let ops = layout();
        let proc = ops.iter().position(|o| *o == MountOp::Proc { dst: "/r/proc".into() }).unwrap();
        let pivot = ops.iter().position(|o| matches!(o, MountOp::PivotRoot { .. })).unwrap();
        let masks = proc_masks(Path::new("/r/proc"));
        assert_eq!(ops[proc + 1..pivot], masks[..]);
        for f in ["cmdline", "kcore", "keys", "timer_list", "sched_debug", "latency_stats", "kallsyms", "interrupts"] {
            assert!(masks.contains(&MountOp::MaskFile { path: Path::new("/r/proc").join(f) }), "{f}");
        }
        for d in ["acpi", "scsi", "asound"] {
            assert!(masks.contains(&MountOp::MaskDir { path: Path::new("/r/proc").join(d) }), "{d}");
        }
        for p in ["sys", "sysrq-trigger", "bus", "fs", "irq"] {
            assert!(masks.contains(&MountOp::ReadOnly { path: Path::new("/r/proc").join(p) }), "{p}");
        }
        assert!(masks.iter().all(|m| match m {
            MountOp::MaskFile { path } | MountOp::MaskDir { path } | MountOp::ReadOnly { path } =>
                path.starts_with("/r/proc") && path != Path::new("/r/proc"),
            _ => false,
        }));
    }

    #[test]
    fn a_template_keeps_its_proc_fully_visible() {
        let ops = plan(&Layout {
            rootfs: Path::new("/r"),
            workspace: None,
            tmp_size_bytes: 1,
            shm_size_bytes: 1,
            mask_proc: false,
        });
        assert!(ops.contains(&MountOp::Proc { dst: "/r/proc".into() }));
        assert!(!ops
            .iter()
            .any(|o| matches!(o, MountOp::MaskFile { .. } | MountOp::MaskDir { .. } | MountOp::ReadOnly { .. })));
    }

    #[test]
    fn tmp_and_shm_are_sized_tmpfs() {
        let ops = layout();
        assert!(ops.contains(&MountOp::Tmpfs {
            dst: "/r/tmp".into(),
            size_bytes: 1 << 20,
            mode: 0o1777,
            noexec: false
        }));
        assert!(ops.contains(&MountOp::Tmpfs {
            dst: "/r/dev/shm".into(),
            size_bytes: 2 << 20,
            mode: 0o1777,
            noexec: true
        }));
    }

    #[test]
    fn dev_holds_only_the_listed_devices_and_ends_read_only() {
        let ops = layout();
        let devices: Vec<_> = ops
            .iter()
            .filter_map(|o| match o {
                MountOp::Bind { src, file: true, .. } => Some(src.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(devices.len(), DEVICES.len());
        assert!(devices.iter().all(|d| d.starts_with("/dev")));
        let ro = ops.iter().position(|o| *o == MountOp::RemountReadOnly { path: "/r/dev".into() });
        let last_dev = ops.iter().rposition(|o| matches!(o, MountOp::Symlink { .. }));
        assert!(ro > last_dev);
    }
}
