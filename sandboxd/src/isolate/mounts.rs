//! The sandbox's filesystem: the rootfs read-only as `/`, the workspace read-write
//! at `/mnt/data`, private tmpfs `/tmp` and `/dev/shm`, the daemon's shared `/dev`
//! ([`super::devfs`]) read-only, a fresh `/proc` with what container runtimes mask
//! in it ([`proc_masks`]), then `pivot_root` so nothing of the host stays reachable.
//!
//! [`plan`] is pure (unit-tested); [`apply`] performs the plan in the sandbox's own
//! mount namespace. The init applies it with root's filesystem ids (see
//! [`super::namespaces::creator`]) and creates no file: the tmpfs mounts it makes
//! belong to host root, which the kernel does not name in their mount options (it
//! would name any other host uid, even inside). A pooled sandbox is built without
//! its workspace, which the helper mounts later, when a run takes the sandbox, and
//! each of its forks gets its own `/tmp`, `/dev/shm` and `/proc` masks from the
//! helper too ([`super::attach`]).

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::statvfs::{statvfs, FsFlags};
use nix::unistd::{chdir, pivot_root};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct Error {
    op: &'static str,
    path: PathBuf,
    source: nix::Error,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountOp {
    /// Stop mount events propagating to or from the host.
    MakeRootPrivate,
    /// Bind `src` onto `dst`.
    Bind {
        src: PathBuf,
        dst: PathBuf,
    },
    /// Make the mount at `path` read-only, nosuid and nodev (keeping flags the
    /// kernel locked on it).
    RemountReadOnly {
        path: PathBuf,
    },
    /// Make the bound `/dev` at `path` read-only, nosuid and noexec: its device
    /// nodes stay usable.
    RemountDevices {
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
    Proc {
        dst: PathBuf,
    },
    /// Bind `null` (the sandbox's `/dev/null`) over the file at `path`, if there is one.
    MaskFile {
        path: PathBuf,
        null: PathBuf,
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

/// What the sandbox's filesystem is made from ([`plan`]'s input). (Where a run's
/// cgroup directories are is another thing: [`super::cgroup::Layout`].)
#[derive(Debug, Clone)]
pub struct Filesystem<'a> {
    pub rootfs: &'a Path,
    /// The daemon's shared `/dev` tree ([`super::devfs`]).
    pub dev: &'a Path,
    /// `None`: the workspace is attached later ([`super::attach::workspace`]).
    pub workspace: Option<&'a Path>,
    /// The session's package layer, bound read-write at `/opt/packages`.
    pub packages: Option<&'a Path>,
    /// The CA bundle bound read-only over the rootfs's (a sandbox with network).
    pub ca_bundle: Option<&'a Path>,
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

/// What is masked in the procfs mounted at `proc`, with `null` (the sandbox's
/// `/dev/null`) bound over files: everything container runtimes mask, the
/// directories included ([`proc_dir_masks`]).
pub fn proc_masks(proc: &Path, null: &Path) -> Vec<MountOp> {
    let mut ops = proc_file_masks(proc, null);
    ops.extend(proc_dir_masks(proc));
    ops
}

/// The files of [`proc_masks`] (`null` over each) and what stays read-only.
pub fn proc_file_masks(proc: &Path, null: &Path) -> Vec<MountOp> {
    let files = PROC_MASKED_FILES.iter().map(|f| MountOp::MaskFile { path: proc.join(f), null: null.into() });
    let read_only = PROC_READ_ONLY.iter().map(|p| MountOp::ReadOnly { path: proc.join(p) });
    files.chain(read_only).collect()
}

/// The directories of [`proc_masks`]: an empty read-only tmpfs over each.
pub fn proc_dir_masks(proc: &Path) -> Vec<MountOp> {
    PROC_MASKED_DIRS.iter().map(|d| MountOp::MaskDir { path: proc.join(d) }).collect()
}

/// The mount operations, in order.
pub fn plan(l: &Filesystem) -> Vec<MountOp> {
    use MountOp::*;
    let root = l.rootfs;
    let dev = root.join("dev");
    let mut ops =
        vec![MakeRootPrivate, Bind { src: root.into(), dst: root.into() }, RemountReadOnly { path: root.into() }];
    if let Some(workspace) = l.workspace {
        ops.push(Bind { src: workspace.into(), dst: root.join("mnt/data") });
        ops.push(RemountNoSuidNoDev { path: root.join("mnt/data") });
    }
    if let Some(packages) = l.packages {
        let dst = root.join(super::spec::PACKAGES_DIR.trim_start_matches('/'));
        ops.push(Bind { src: packages.into(), dst: dst.clone() });
        ops.push(RemountNoSuidNoDev { path: dst });
    }
    if let Some(bundle) = l.ca_bundle {
        let dst = root.join(super::spec::CA_BUNDLE.trim_start_matches('/'));
        ops.push(Bind { src: bundle.into(), dst: dst.clone() });
        ops.push(RemountReadOnly { path: dst });
    }
    ops.extend([
        Tmpfs { dst: root.join("tmp"), size_bytes: l.tmp_size_bytes, mode: 0o1777, noexec: false },
        Bind { src: l.dev.into(), dst: dev.clone() },
        RemountDevices { path: dev.clone() },
        Tmpfs { dst: dev.join("shm"), size_bytes: l.shm_size_bytes, mode: 0o1777, noexec: true },
        Proc { dst: root.join("proc") },
    ]);
    if l.mask_proc {
        ops.extend(proc_masks(&root.join("proc"), &dev.join("null")));
    }
    ops.push(PivotRoot { new_root: root.into() });
    ops
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
            MountOp::Bind { src, dst } => {
                mount(Some(src.as_path()), dst.as_path(), none, MsFlags::MS_BIND | MsFlags::MS_REC, none)
                    .map_err(err("bind", dst))?;
            }
            MountOp::RemountReadOnly { path } => {
                remount(path, MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV)?
            }
            MountOp::RemountDevices { path } => {
                remount(path, MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC)?
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
            MountOp::Proc { dst } => {
                let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
                mount(Some("proc"), dst.as_path(), Some("proc"), flags, none).map_err(err("mount proc", dst))?;
            }
            MountOp::MaskFile { path, null } => {
                if exists(path)? {
                    mount(Some(null.as_path()), path.as_path(), none, MsFlags::MS_BIND, none)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn layout_with(workspace: Option<&Path>, mask_proc: bool) -> Vec<MountOp> {
        plan(&Filesystem {
            rootfs: Path::new("/r"),
            dev: Path::new("/d"),
            workspace,
            packages: None,
            ca_bundle: None,
            tmp_size_bytes: 1 << 20,
            shm_size_bytes: 2 << 20,
            mask_proc,
        })
    }

    fn layout() -> Vec<MountOp> {
        layout_with(Some(Path::new("/w")), true)
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
        assert!(ops.contains(&MountOp::Bind { src: "/w".into(), dst: "/r/mnt/data".into() }));
        assert!(ops.contains(&MountOp::RemountNoSuidNoDev { path: "/r/mnt/data".into() }));
    }

    #[test]
    fn the_package_layer_is_bound_writable_and_the_ca_bundle_read_only() {
        let ops = plan(&Filesystem {
            rootfs: Path::new("/r"),
            dev: Path::new("/d"),
            workspace: Some(Path::new("/w")),
            packages: Some(Path::new("/s/packages")),
            ca_bundle: Some(Path::new("/state/egress/ca-bundle.pem")),
            tmp_size_bytes: 1 << 20,
            shm_size_bytes: 2 << 20,
            mask_proc: true,
        });
        let at = |op: MountOp| ops.iter().position(|o| *o == op).unwrap();
        let layer = at(MountOp::Bind { src: "/s/packages".into(), dst: "/r/opt/packages".into() });
        assert_eq!(at(MountOp::RemountNoSuidNoDev { path: "/r/opt/packages".into() }), layer + 1);
        let bundle = at(MountOp::Bind {
            src: "/state/egress/ca-bundle.pem".into(),
            dst: "/r/etc/ssl/certs/ca-certificates.crt".into(),
        });
        assert_eq!(at(MountOp::RemountReadOnly { path: "/r/etc/ssl/certs/ca-certificates.crt".into() }), bundle + 1);
        // Both after the read-only root, before the pivot.
        assert!(layer > at(MountOp::RemountReadOnly { path: "/r".into() }) && bundle < ops.len() - 1);
        assert_eq!(ops.len(), layout().len() + 4);
    }

    #[test]
    fn nothing_is_bound_at_run() {
        assert!(!layout().iter().any(|o| matches!(o, MountOp::Bind { dst, .. } if dst.starts_with("/r/run"))));
    }

    #[test]
    fn a_pooled_sandbox_starts_without_a_workspace() {
        let ops = layout_with(None, true);
        assert!(!ops.iter().any(|o| matches!(o, MountOp::Bind { dst, .. } if dst == Path::new("/r/mnt/data"))));
        assert_eq!(ops.len() + 2, layout().len());
    }

    #[test]
    fn proc_is_masked_after_it_is_mounted_and_before_the_pivot() {
        let ops = layout();
        let proc = ops.iter().position(|o| *o == MountOp::Proc { dst: "/r/proc".into() }).unwrap();
        let pivot = ops.iter().position(|o| matches!(o, MountOp::PivotRoot { .. })).unwrap();
        // The sandbox's own /dev/null (the daemon's /dev), never the host's.
        let null = Path::new("/r/dev/null");
        let masks = proc_masks(Path::new("/r/proc"), null);
        assert_eq!(ops[proc + 1..pivot], masks[..]);
        for f in ["cmdline", "kcore", "keys", "timer_list", "sched_debug", "latency_stats", "kallsyms", "interrupts"] {
            assert!(
                masks.contains(&MountOp::MaskFile { path: Path::new("/r/proc").join(f), null: null.into() }),
                "{f}"
            );
        }
        for d in ["acpi", "scsi", "asound"] {
            assert!(masks.contains(&MountOp::MaskDir { path: Path::new("/r/proc").join(d) }), "{d}");
        }
        for p in ["sys", "sysrq-trigger", "bus", "fs", "irq"] {
            assert!(masks.contains(&MountOp::ReadOnly { path: Path::new("/r/proc").join(p) }), "{p}");
        }
        assert!(masks.iter().all(|m| match m {
            MountOp::MaskFile { path, .. } | MountOp::MaskDir { path } | MountOp::ReadOnly { path } =>
                path.starts_with("/r/proc") && path != Path::new("/r/proc"),
            _ => false,
        }));
    }

    #[test]
    fn a_template_keeps_its_proc_fully_visible() {
        let ops = layout_with(None, false);
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
    fn dev_is_the_daemons_tree_bound_read_only_with_shm_mounted_on_it() {
        let ops = layout();
        let at = |op: &MountOp| ops.iter().position(|o| o == op);
        let bind = at(&MountOp::Bind { src: "/d".into(), dst: "/r/dev".into() });
        let ro = at(&MountOp::RemountDevices { path: "/r/dev".into() });
        let shm = ops.iter().position(|o| matches!(o, MountOp::Tmpfs { dst, .. } if dst == Path::new("/r/dev/shm")));
        assert!(bind.is_some() && bind < ro && ro < shm, "{ops:?}");
        // Nothing else lands in /dev, and the init creates no file anywhere.
        let in_dev = ops.iter().filter(|o| match o {
            MountOp::Bind { dst, .. } | MountOp::Tmpfs { dst, .. } => dst.starts_with("/r/dev"),
            _ => false,
        });
        assert_eq!(in_dev.count(), 2);
    }
}
