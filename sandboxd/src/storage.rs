//! Session workspaces with a quota the kernel enforces: each workspace is a sparse
//! ext4 image (`workspace.img`, the policy's `workspace_mb`) loop-mounted on the
//! session's `data` directory. A full workspace gives ENOSPC inside the sandbox and
//! `upload_too_large` on upload; the host disk holds at most the image's size.
//!
//! Host modes: only root and the session's uid reach a session's files. The session
//! directory is root's, mode 0710, group the session's host gid (equal to its uid):
//! a cold sandbox passes through it to bind its workspace. The image and
//! `session.json` are 0600 root; the workspace's root is 0700, the session uid's.
//!
//! Images are made with mkfs.ext4 and mounted with mount(8) (e2fsprogs and
//! util-linux): session creation is not a hot path, and they do this job well.
//!
//! The session manager reaches them through the [`Storage`] trait ([`LoopImages`]
//! here), so its create, close, lease, quota, reap and recovery logic is
//! unit-tested on plain directories (`fake::Dirs`), without root.

use futures_util::future::BoxFuture;
use std::fs::Permissions;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tokio::process::Command;

pub const IMAGE: &str = "workspace.img";
pub const DATA: &str = "data";

async fn run(cmd: &mut Command, what: &str) -> io::Result<()> {
    let out = cmd.output().await.map_err(|e| io::Error::new(e.kind(), format!("{what}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("{what} failed: {}", String::from_utf8_lossy(&out.stderr).trim())))
    }
}

/// Is `path` a mount point (listed in our mount table)?
pub fn is_mounted(path: &Path) -> bool {
    crate::mountinfo::is_mount_point(&crate::mountinfo::read_self(), path)
}

/// Make the image, its filesystem (root owned by `uid`), and mount it.
pub async fn create(session_dir: &Path, size_bytes: u64, uid: u32) -> io::Result<()> {
    let image = session_dir.join(IMAGE);
    let file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&image)?;
    file.set_len(size_bytes)?;
    drop(file);
    run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0", "-E"])
            .arg(format!("root_owner={uid}:{uid}"))
            .arg(&image),
        "mkfs.ext4",
    )
    .await?;
    mount(session_dir).await?;
    // An empty workspace is empty: fsck's lost+found would show up in every listing.
    let _ = std::fs::remove_dir(session_dir.join(DATA).join("lost+found"));
    std::fs::set_permissions(session_dir.join(DATA), Permissions::from_mode(0o700))
}

/// Give a session directory its modes (see the module's notes). Fixes what an
/// earlier version left; call it with the workspace mounted.
pub fn restrict(session_dir: &Path, uid: u32) -> io::Result<()> {
    restrict_dir(session_dir, uid)?;
    for name in [IMAGE, "session.json"] {
        let path = session_dir.join(name);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() => {
                std::os::unix::fs::lchown(&path, Some(0), Some(0))?;
                std::fs::set_permissions(&path, Permissions::from_mode(0o600))?;
            }
            Ok(_) => return Err(io::Error::other(format!("{} is not a regular file", path.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    let data = session_dir.join(DATA);
    if is_mounted(&data) {
        std::os::unix::fs::chown(&data, Some(uid), Some(uid))?;
        std::fs::set_permissions(&data, Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// The session directory: root's, 0710, group the session's gid (its uid).
pub fn restrict_dir(session_dir: &Path, uid: u32) -> io::Result<()> {
    std::os::unix::fs::lchown(session_dir, Some(0), Some(uid))?;
    std::fs::set_permissions(session_dir, Permissions::from_mode(0o710))
}

/// Mount the session's image on its `data` directory, unless it already is.
pub async fn mount(session_dir: &Path) -> io::Result<()> {
    let data = session_dir.join(DATA);
    match std::fs::DirBuilder::new().mode(0o700).create(&data) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    if is_mounted(&data) {
        return Ok(());
    }
    run(
        Command::new("mount")
            .args(["-t", "ext4", "-o", "loop,nosuid,nodev,noatime"])
            .arg(session_dir.join(IMAGE))
            .arg(&data),
        "mount",
    )
    .await
}

/// Unmount the session's workspace (lazily, should anything still hold it).
pub async fn unmount(session_dir: &Path) -> io::Result<()> {
    let data = session_dir.join(DATA);
    if !is_mounted(&data) {
        return Ok(());
    }
    nix::mount::umount2(&data, nix::mount::MntFlags::MNT_DETACH).map_err(io::Error::from)
}

/// Every workspace mount below `sessions_dir` (what an earlier instance may have left).
pub fn mounted_below(sessions_dir: &Path) -> Vec<PathBuf> {
    crate::mountinfo::read_self()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(sessions_dir) && p.file_name() == Some(std::ffi::OsStr::new(DATA)))
        .collect()
}

/// Where a session's workspace lives, by session directory: made, mounted again
/// after a restart, unmounted, and how much room it and its filesystem have.
pub trait Storage: Send + Sync {
    /// Make the workspace of `size_bytes` for `uid` in `session_dir` (which
    /// exists) and mount it on its `data` directory, both given their modes.
    fn create<'a>(&'a self, session_dir: &'a Path, size_bytes: u64, uid: u32) -> BoxFuture<'a, io::Result<()>>;

    /// Mount again the workspace an earlier daemon made in `session_dir`, and
    /// give the directory its modes for `uid` (an earlier version left wider ones).
    fn reopen<'a>(&'a self, session_dir: &'a Path, uid: u32) -> BoxFuture<'a, io::Result<()>>;

    /// Unmount the workspace in `session_dir` (lazily); nothing if it is not mounted.
    fn unmount<'a>(&'a self, session_dir: &'a Path) -> BoxFuture<'a, io::Result<()>>;

    /// Every workspace's `data` mounted below `sessions_dir`.
    fn mounted_below(&self, sessions_dir: &Path) -> Vec<PathBuf>;

    /// Bytes free on the filesystem of `sessions_dir`; `None` if it cannot say.
    fn free(&self, sessions_dir: &Path) -> Option<u64>;

    /// How much more of the host disk the workspace in `session_dir` can take:
    /// its image's size less what it already takes (images are sparse); `None`
    /// if it has no image yet.
    fn room(&self, session_dir: &Path) -> Option<u64> {
        let m = std::fs::metadata(session_dir.join(IMAGE)).ok()?;
        Some(m.len().saturating_sub(std::os::unix::fs::MetadataExt::blocks(&m).saturating_mul(512)))
    }
}

/// The real workspaces: loop-mounted ext4 images (see the module's notes).
pub struct LoopImages;

impl Storage for LoopImages {
    fn create<'a>(&'a self, session_dir: &'a Path, size_bytes: u64, uid: u32) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            restrict_dir(session_dir, uid)?;
            create(session_dir, size_bytes, uid).await
        })
    }

    fn reopen<'a>(&'a self, session_dir: &'a Path, uid: u32) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            mount(session_dir).await?;
            restrict(session_dir, uid)
        })
    }

    fn unmount<'a>(&'a self, session_dir: &'a Path) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(unmount(session_dir))
    }

    fn mounted_below(&self, sessions_dir: &Path) -> Vec<PathBuf> {
        mounted_below(sessions_dir)
    }

    fn free(&self, sessions_dir: &Path) -> Option<u64> {
        let fs = nix::sys::statvfs::statvfs(sessions_dir).ok()?;
        Some(fs.blocks_available().saturating_mul(fs.fragment_size()))
    }
}

/// Workspaces as plain directories, for unit tests: "mounted" is a set the fake
/// keeps, the image a sparse file of the workspace's size, the free space what
/// the test sets, and a create fails when the test asks.
#[cfg(test)]
pub mod fake {
    use super::{BoxFuture, Storage, DATA, IMAGE};
    use std::collections::BTreeSet;
    use std::io;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Mutex;

    pub struct Dirs {
        mounted: Mutex<BTreeSet<PathBuf>>,
        /// What [`Storage::free`] says (`u64::MAX` until set).
        pub free: AtomicU64,
        /// The next create fails (once its image is made).
        pub fail_create: AtomicBool,
    }

    impl Default for Dirs {
        fn default() -> Dirs {
            Dirs { mounted: Mutex::default(), free: AtomicU64::new(u64::MAX), fail_create: AtomicBool::new(false) }
        }
    }

    impl Dirs {
        /// The `data` directories mounted now.
        pub fn mounted(&self) -> BTreeSet<PathBuf> {
            self.mounted.lock().unwrap_or_else(|p| p.into_inner()).clone()
        }

        /// Say `session_dir`'s workspace is mounted (as an earlier daemon left it).
        pub fn mount(&self, session_dir: &Path) {
            self.mounted.lock().unwrap_or_else(|p| p.into_inner()).insert(session_dir.join(DATA));
        }
    }

    impl Storage for Dirs {
        fn create<'a>(&'a self, session_dir: &'a Path, size_bytes: u64, _uid: u32) -> BoxFuture<'a, io::Result<()>> {
            Box::pin(async move {
                std::fs::File::create_new(session_dir.join(IMAGE))?.set_len(size_bytes)?;
                if self.fail_create.swap(false, Ordering::Relaxed) {
                    return Err(io::Error::other("mkfs.ext4 failed (the fake's)"));
                }
                std::fs::create_dir(session_dir.join(DATA))?;
                self.mount(session_dir);
                Ok(())
            })
        }

        fn reopen<'a>(&'a self, session_dir: &'a Path, _uid: u32) -> BoxFuture<'a, io::Result<()>> {
            Box::pin(async move {
                if !session_dir.join(IMAGE).is_file() {
                    return Err(io::Error::other("mount: no image (the fake's)"));
                }
                std::fs::create_dir_all(session_dir.join(DATA))?;
                self.mount(session_dir);
                Ok(())
            })
        }

        fn unmount<'a>(&'a self, session_dir: &'a Path) -> BoxFuture<'a, io::Result<()>> {
            Box::pin(async move {
                self.mounted.lock().unwrap_or_else(|p| p.into_inner()).remove(&session_dir.join(DATA));
                Ok(())
            })
        }

        fn mounted_below(&self, sessions_dir: &Path) -> Vec<PathBuf> {
            self.mounted().into_iter().filter(|p| p.starts_with(sessions_dir)).collect()
        }

        fn free(&self, _sessions_dir: &Path) -> Option<u64> {
            Some(self.free.load(Ordering::Relaxed))
        }
    }
}
