//! The sandboxes' `/dev`: one small tmpfs the daemon makes at start, as host root,
//! holding the device nodes a sandbox may use ([`DEVICES`]), the links every
//! program expects ([`LINKS`]) and the mount point of each sandbox's own
//! `/dev/shm`. Every sandbox binds it read-only at `/dev` ([`super::mounts`]).
//!
//! Made by host root, it shows nothing of the host in a sandbox's mount table: a
//! tmpfs a sandbox made itself names its host uid in its options, and the host's
//! devtmpfs names the host's memory size. It is read-only for sandboxes (and for
//! the daemon too, once made), shared by all of them, and one bind per sandbox
//! replaces a tmpfs, five binds, a directory and four links.

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::{makedev, mknod, Mode, SFlag};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("the sandboxes' /dev at {path}: {op}: {source}")]
pub struct Error {
    op: String,
    path: PathBuf,
    source: nix::Error,
}

/// The character devices of a sandbox's `/dev`: (name, major, minor), the numbers
/// Linux gives them (`Documentation/admin-guide/devices.txt`).
pub const DEVICES: [(&str, u64, u64); 5] =
    [("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9)];

/// The links of a sandbox's `/dev`: (name, target).
pub const LINKS: [(&str, &str); 4] = [
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
];

/// Directories of a sandbox's `/dev`: mount points for what each sandbox mounts itself.
pub const DIRS: [&str; 1] = ["shm"];

/// The tmpfs's options: a few inodes, no room for data, `rwxr-xr-x`.
const OPTIONS: &str = "size=4k,nr_inodes=32,mode=755";

/// Make the tree at `path` (a directory is created when missing), replacing what
/// an earlier daemon left mounted there, and leave it read-only.
pub fn make(path: &Path) -> Result<(), Error> {
    let fail = |op: &str| {
        let op = op.to_string();
        move |source| Error { op, path: path.to_path_buf(), source }
    };
    unmount(path).map_err(fail("unmount what was there"))?;
    match nix::unistd::mkdir(path, Mode::from_bits_truncate(0o755)) {
        Ok(()) | Err(nix::Error::EEXIST) => {}
        Err(e) => return Err(fail("mkdir")(e)),
    }
    // Mounted on the directory itself, never through a link (mount(2) follows one).
    let st = nix::sys::stat::lstat(path).map_err(fail("lstat"))?;
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFDIR {
        return Err(fail("not a directory (a link or a file is there): remove it")(nix::Error::ENOTDIR));
    }
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
    mount(Some("tmpfs"), path, Some("tmpfs"), flags, Some(OPTIONS)).map_err(fail("mount tmpfs"))?;
    let filled = fill(path);
    if let Err(e) = filled {
        let _ = umount2(path, MntFlags::MNT_DETACH);
        return Err(e);
    }
    let ro = MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | flags;
    mount(None::<&str>, path, None::<&str>, ro, Some(OPTIONS)).map_err(fail("remount read-only"))
}

fn fill(path: &Path) -> Result<(), Error> {
    let at = |op: &'static str, name: &str| {
        let path = path.join(name);
        move |source| Error { op: op.to_string(), path, source }
    };
    // The nodes' modes are exact whatever the daemon's umask.
    let old = nix::sys::stat::umask(Mode::empty());
    let nodes = DEVICES.iter().try_for_each(|(name, major, minor)| {
        mknod(&path.join(name), SFlag::S_IFCHR, Mode::from_bits_truncate(0o666), makedev(*major, *minor))
            .map_err(at("mknod", name))
    });
    nix::sys::stat::umask(old);
    nodes?;
    for dir in DIRS {
        nix::unistd::mkdir(&path.join(dir), Mode::from_bits_truncate(0o755)).map_err(at("mkdir", dir))?;
    }
    for (name, target) in LINKS {
        nix::unistd::symlinkat(target, nix::fcntl::AT_FDCWD, &path.join(name)).map_err(at("symlink", name))?;
    }
    Ok(())
}

/// Unmount the tree at `path`, every layer of it, if it is mounted.
pub fn unmount(path: &Path) -> Result<(), nix::Error> {
    while crate::mountinfo::is_mount_point(&crate::mountinfo::read_self(), path) {
        umount2(path, MntFlags::MNT_DETACH)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_devices_are_the_five_harmless_ones() {
        let names: Vec<_> = DEVICES.iter().map(|d| d.0).collect();
        assert_eq!(names, ["null", "zero", "full", "random", "urandom"]);
        // The memory devices' major; /dev/mem (1,1), /dev/port (1,4) and /dev/kmsg
        // (1,11) are not among them.
        assert!(DEVICES.iter().all(|(_, major, minor)| *major == 1 && ![1, 2, 4, 11].contains(minor)));
    }

    #[test]
    fn the_links_point_into_the_sandboxs_own_proc() {
        assert!(LINKS.iter().all(|(_, target)| target.starts_with("/proc/self/fd")));
        assert_eq!(DIRS, ["shm"]);
    }
}
