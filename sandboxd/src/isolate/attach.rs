//! Mounts the helper (host root) makes from outside, into the mount namespace of a
//! running pooled sandbox: a session's workspace at `/mnt/data` ([`workspace`]) and
//! its package layer at `/opt/packages` ([`packages`]), and a template fork's own
//! `/tmp`, `/dev/shm` and `/proc` masks ([`furnish`]).
//!
//! Each mount is made in the host's namespace as a detached mount (`open_tree`,
//! or `fsopen` + `fsmount` for a fresh tmpfs), then moved into place from inside
//! the sandbox's namespace (`setns`, `move_mount`). A tmpfs made here belongs to
//! host root, which the kernel does not name in its mount options: one a fork made
//! itself would show the template's host uid to the code it runs. The caller (host
//! root, single-threaded) is back in the host's namespace when a call returns,
//! whatever happened in between.

use super::mounts::PROC_MASKED_DIRS;
use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags, OpenTreeFlags};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct Error {
    op: &'static str,
    path: PathBuf,
    source: std::io::Error,
}

fn err<'a, E: Into<std::io::Error>>(op: &'static str, path: &'a Path) -> impl FnOnce(E) -> Error + 'a {
    move |source| Error { op, path: path.to_path_buf(), source: source.into() }
}

/// A fresh tmpfs a fork gets from the helper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fresh {
    /// Where, in the fork's namespace.
    pub dst: PathBuf,
    pub size_bytes: u64,
    pub mode: u32,
    pub noexec: bool,
    /// An empty read-only mask (put only where its directory exists).
    pub mask: bool,
}

/// What a template's fork is furnished with, in order: its own `/tmp` and
/// `/dev/shm` (the sizes of its policy), then an empty read-only tmpfs over each
/// directory of `/proc` that tells about the host's hardware (the fork's init has
/// masked the files already, by binding its `/dev/null`).
pub fn furnishings(tmp_size_bytes: u64, shm_size_bytes: u64) -> Vec<Fresh> {
    let mut all = vec![
        Fresh { dst: "/tmp".into(), size_bytes: tmp_size_bytes, mode: 0o1777, noexec: false, mask: false },
        Fresh { dst: "/dev/shm".into(), size_bytes: shm_size_bytes, mode: 0o1777, noexec: true, mask: false },
    ];
    all.extend(PROC_MASKED_DIRS.iter().map(|d| Fresh {
        dst: Path::new("/proc").join(d),
        size_bytes: 4096,
        mode: 0o555,
        noexec: true,
        mask: true,
    }));
    all
}

/// Mount `fresh` into the mount namespace `target` (a template fork's).
pub fn furnish(fresh: &[Fresh], target: BorrowedFd, host_ns: BorrowedFd) -> Result<(), Error> {
    // Made (and sized) in the host's namespace, as host root; placed from inside.
    let mounts = fresh.iter().map(|f| tmpfs(f).map(|fd| (f, fd))).collect::<Result<Vec<_>, _>>()?;
    inside(target, host_ns, || {
        for (f, fd) in &mounts {
            if f.mask && !exists(&f.dst)? {
                continue;
            }
            move_into_place(fd, &f.dst)?;
        }
        Ok(())
    })
}

/// Mount the host directory `workspace` at `/mnt/data` in a running sandbox whose
/// mount namespace is `sandbox_ns`, nosuid and nodev, with the idmap of `userns`
/// (see [`super::namespaces::idmap_userns`]).
pub fn workspace(
    workspace: &Path,
    userns: BorrowedFd,
    sandbox_ns: BorrowedFd,
    host_ns: BorrowedFd,
) -> Result<(), Error> {
    idmapped(workspace, Path::new("/mnt/data"), userns, sandbox_ns, host_ns)
}

/// Mount the session's package layer (a host directory) at `/opt/packages`, as
/// [`workspace`] mounts the workspace.
pub fn packages(layer: &Path, userns: BorrowedFd, sandbox_ns: BorrowedFd, host_ns: BorrowedFd) -> Result<(), Error> {
    idmapped(layer, Path::new(super::spec::PACKAGES_DIR), userns, sandbox_ns, host_ns)
}

/// Mount the host directory `src` at `dst` in the mount namespace `sandbox_ns`,
/// nosuid and nodev, with the idmap of `userns`.
fn idmapped(
    src: &Path,
    dst: &Path,
    userns: BorrowedFd,
    sandbox_ns: BorrowedFd,
    host_ns: BorrowedFd,
) -> Result<(), Error> {
    let tree = rustix::mount::open_tree(
        rustix::fs::CWD,
        src,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(err("open_tree", src))?;
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
        return Err(err("mount_setattr (idmap, nosuid, nodev)", src)(std::io::Error::last_os_error()));
    }
    inside(sandbox_ns, host_ns, || move_into_place(&tree, dst))
}

/// A detached tmpfs as `f` says: made by host root, so it names no host uid.
fn tmpfs(f: &Fresh) -> Result<OwnedFd, Error> {
    let fs = rustix::mount::fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC).map_err(err("fsopen tmpfs", &f.dst))?;
    rustix::mount::fsconfig_set_string(fs.as_fd(), "size", f.size_bytes.to_string())
        .and_then(|()| rustix::mount::fsconfig_set_string(fs.as_fd(), "mode", format!("{:o}", f.mode)))
        .and_then(|()| rustix::mount::fsconfig_create(fs.as_fd()))
        .map_err(err("configure tmpfs", &f.dst))?;
    let mut attr = MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV;
    if f.noexec {
        attr |= MountAttrFlags::MOUNT_ATTR_NOEXEC;
    }
    if f.mask {
        attr |= MountAttrFlags::MOUNT_ATTR_RDONLY;
    }
    rustix::mount::fsmount(fs.as_fd(), FsMountFlags::FSMOUNT_CLOEXEC, attr).map_err(err("fsmount tmpfs", &f.dst))
}

fn move_into_place(mount: &OwnedFd, dst: &Path) -> Result<(), Error> {
    rustix::mount::move_mount(mount.as_fd(), c"", rustix::fs::CWD, dst, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
        .map_err(err("move_mount", dst))
}

/// Run `f` in the mount namespace `target`, then go back to `host_ns`.
fn inside<T>(target: BorrowedFd, host_ns: BorrowedFd, f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    nix::sched::setns(target, nix::sched::CloneFlags::CLONE_NEWNS).map_err(err("setns", Path::new("/")))?;
    let done = f();
    nix::sched::setns(host_ns, nix::sched::CloneFlags::CLONE_NEWNS).map_err(err("setns back", Path::new("/")))?;
    done
}

/// Does `path` exist (without following a last symlink)?
fn exists(path: &Path) -> Result<bool, Error> {
    match nix::sys::stat::lstat(path) {
        Ok(_) => Ok(true),
        Err(nix::Error::ENOENT) => Ok(false),
        Err(e) => Err(err("lstat", path)(std::io::Error::from(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_gets_its_own_tmp_and_shm_then_the_proc_dir_masks() {
        let all = furnishings(64 << 20, 8 << 20);
        assert_eq!(
            all[0],
            Fresh { dst: "/tmp".into(), size_bytes: 64 << 20, mode: 0o1777, noexec: false, mask: false }
        );
        assert_eq!(
            all[1],
            Fresh { dst: "/dev/shm".into(), size_bytes: 8 << 20, mode: 0o1777, noexec: true, mask: false }
        );
        let masks: Vec<_> = all[2..].iter().map(|f| f.dst.clone()).collect();
        assert_eq!(masks, PROC_MASKED_DIRS.iter().map(|d| Path::new("/proc").join(d)).collect::<Vec<_>>());
        assert!(all[2..].iter().all(|f| f.mask && f.noexec && f.mode == 0o555));
    }
}
