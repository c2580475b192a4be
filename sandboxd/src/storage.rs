//! Session workspaces with a quota the kernel enforces: each workspace is a sparse
//! ext4 image (`workspace.img`, the policy's `workspace_mb`) loop-mounted on the
//! session's `data` directory. A full workspace gives ENOSPC inside the sandbox and
//! `upload_too_large` on upload; the host disk holds at most the image's size.
//!
//! A session costs nothing until it is used: its image is made and mounted by the
//! first run or file operation ([`Storage::open`]), and an idle session's images
//! are unmounted again (the session manager's `unmount_idle`) and mounted at its
//! next use, so the mounts (each a loop device, a kernel thread and kernel memory,
//! and a mount every new sandbox's namespace starts from) follow the sessions in
//! use, not the sessions held.
//!
//! A session whose policy allows packages gets a second image, made beside its
//! workspace when the session is (`packages.img`, the policy's `packages_mb`), and loop-mounted on
//! its `packages` directory: its package layer, outside the workspace, mounted at
//! `/opt/packages` in its sandboxes. A full layer gives ENOSPC to the installer
//! and harms nothing else.
//!
//! Host modes: only root and the session's uid reach a session's files. The session
//! directory is root's, mode 0710, group the session's host gid (equal to its uid):
//! a cold sandbox passes through it to bind its workspace. The image and
//! `session.json` are 0600 root; the workspace's root is 0700, the session uid's.
//!
//! Images are sparse copies of a blank made once per size with mkfs.ext4
//! (e2fsprogs does this job well; [`blank`]: running it for each image cost ~5 ms
//! and left ~33 MiB of each allocated) and are mounted by the kernel's own calls
//! ([`loopdev`]): a one-shot run makes a session, so its images and mounts are on
//! the run's path, and starting mount(8) twice cost ~10 ms.
//!
//! The session manager reaches them through the [`Storage`] trait ([`LoopImages`]
//! here), so its create, close, lease, quota, reap and recovery logic is
//! unit-tested on plain directories (`fake::Dirs`), without root.

pub mod blank;
mod loopdev;
pub mod share;

use blank::Blanks;
use futures_util::future::BoxFuture;
use std::fs::Permissions;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tokio::process::Command;

pub const IMAGE: &str = "workspace.img";
pub const DATA: &str = "data";
/// The package layer's image, and where it is mounted, in the session directory.
pub const LAYER_IMAGE: &str = "packages.img";
pub const LAYER: &str = "packages";

/// Run `cmd` (in the C locale, so its messages can be read); its failure as an
/// error with what it printed, `StorageFull` when that was a full disk.
async fn run(cmd: &mut Command, what: &str) -> io::Result<()> {
    let out = cmd.env("LC_ALL", "C").output().await.map_err(|e| io::Error::new(e.kind(), format!("{what}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr);
    let kind = match said.contains("No space left on device") {
        true => io::ErrorKind::StorageFull,
        false => io::ErrorKind::Other,
    };
    Err(io::Error::new(kind, format!("{what} failed: {}", said.trim())))
}

/// Is `path` a mount point (listed in our mount table)?
pub fn is_mounted(path: &Path) -> bool {
    crate::mountinfo::is_mount_point(&crate::mountinfo::read_self(), path)
}

/// Make the image, its filesystem, and mount it (its root `uid`'s). Only the
/// workspace's: the package layer is made at the session's first run
/// ([`open_layer`]).
/// The image is copied under a name of its own and renamed into place whole:
/// a daemon stopped midway leaves no half image for a later use to mount.
pub async fn create(blanks: &Blanks, session_dir: &Path, size_bytes: u64, uid: u32) -> io::Result<()> {
    let part = session_dir.join(format!("{IMAGE}.part"));
    let _ = std::fs::remove_file(&part);
    blanks.make(&part, size_bytes).await?;
    std::fs::rename(&part, session_dir.join(IMAGE))?;
    mount_one(session_dir, IMAGE, DATA).await?;
    empty_root(&session_dir.join(DATA), uid)
}

/// Mount the session's package layer, making its image first if it has none
/// (see the module's notes). A layer that could not be made whole leaves no
/// image behind; one already there (made by an earlier use, left unmounted by a
/// daemon stopped midway or an unmount that failed halfway) is mounted as it is.
pub async fn open_layer(blanks: &Blanks, session_dir: &Path, size_bytes: u64, uid: u32) -> io::Result<()> {
    let image = session_dir.join(LAYER_IMAGE);
    match std::fs::symlink_metadata(&image) {
        Ok(meta) if meta.is_file() => return mount_one(session_dir, LAYER_IMAGE, LAYER).await,
        Ok(_) => return Err(io::Error::other(format!("{} is not a regular file", image.display()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // Copied under a name of its own and renamed into place whole, as the workspace.
    let part = session_dir.join(format!("{LAYER_IMAGE}.part"));
    let _ = std::fs::remove_file(&part);
    blanks.make(&part, size_bytes).await.inspect_err(|_| {
        let _ = std::fs::remove_file(&part);
    })?;
    std::fs::rename(&part, &image)?;
    let made = async {
        mount_one(session_dir, LAYER_IMAGE, LAYER).await?;
        empty_root(&session_dir.join(LAYER), uid)
    }
    .await;
    if made.is_err() {
        let _ = unmount_one(&session_dir.join(LAYER));
        let _ = std::fs::remove_file(&image);
    }
    made
}

/// A new filesystem's root, as a session's: empty (fsck's lost+found would show
/// up in every listing), `uid`'s, 0700.
fn empty_root(root: &Path, uid: u32) -> io::Result<()> {
    let _ = std::fs::remove_dir(root.join("lost+found"));
    std::os::unix::fs::chown(root, Some(uid), Some(uid))?;
    std::fs::set_permissions(root, Permissions::from_mode(0o700))
}

/// Give a session directory its modes (see the module's notes). Fixes what an
/// earlier version left (at start, and again when its workspace is mounted).
pub fn restrict(session_dir: &Path, uid: u32) -> io::Result<()> {
    restrict_dir(session_dir, uid)?;
    for name in [IMAGE, LAYER_IMAGE, "session.json"] {
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
    for root in [session_dir.join(DATA), session_dir.join(LAYER)] {
        if is_mounted(&root) {
            std::os::unix::fs::chown(&root, Some(uid), Some(uid))?;
            std::fs::set_permissions(&root, Permissions::from_mode(0o700))?;
        }
    }
    Ok(())
}

/// The session directory: root's, 0710, group the session's gid (its uid).
pub fn restrict_dir(session_dir: &Path, uid: u32) -> io::Result<()> {
    std::os::unix::fs::lchown(session_dir, Some(0), Some(uid))?;
    std::fs::set_permissions(session_dir, Permissions::from_mode(0o710))
}

/// Mount the session's image on its `data` directory, and its package layer's on
/// `packages` if it has one, unless they already are.
pub async fn mount(session_dir: &Path) -> io::Result<()> {
    mount_one(session_dir, IMAGE, DATA).await?;
    if session_dir.join(LAYER_IMAGE).is_file() {
        // Both or neither: a workspace left mounted alone would be no use's.
        if let Err(e) = mount_one(session_dir, LAYER_IMAGE, LAYER).await {
            let _ = unmount_one(&session_dir.join(DATA));
            return Err(io::Error::new(e.kind(), format!("the package layer: {e}")));
        }
    }
    Ok(())
}

/// Mount the image `image` of `session_dir` on its directory `on`.
async fn mount_one(session_dir: &Path, image: &str, on: &str) -> io::Result<()> {
    let target = session_dir.join(on);
    match std::fs::DirBuilder::new().mode(0o700).create(&target) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    if is_root(session_dir, on) {
        return Ok(());
    }
    let image = session_dir.join(image);
    tokio::task::spawn_blocking(move || loopdev::mount_image(&image, &target)).await.map_err(io::Error::other)?
}

/// Unmount the session's workspace and package layer (lazily, should anything
/// still hold them).
pub async fn unmount(session_dir: &Path) -> io::Result<()> {
    unmount_one(&session_dir.join(LAYER))?;
    unmount_one(&session_dir.join(DATA))
}

fn unmount_one(target: &Path) -> io::Result<()> {
    if !is_mounted(target) {
        return Ok(());
    }
    nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH).map_err(io::Error::from)
}

/// Every workspace and package layer mount below `sessions_dir` (what an earlier
/// instance may have left).
pub fn mounted_below(sessions_dir: &Path) -> Vec<PathBuf> {
    crate::mountinfo::read_self()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| {
            p.starts_with(sessions_dir)
                && (p.file_name() == Some(std::ffi::OsStr::new(DATA))
                    || p.file_name() == Some(std::ffi::OsStr::new(LAYER)))
        })
        .collect()
}

/// Whether `session_dir`'s directory `name` is the root of a filesystem other
/// than the session directory's (mounted: what the mount table would say, without
/// reading a table as long as the mounts).
fn is_root(session_dir: &Path, name: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(session_dir), std::fs::symlink_metadata(session_dir.join(name))) {
        (Ok(dir), Ok(root)) => root.is_dir() && dir.dev() != root.dev() && root.ino() == 2,
        _ => false,
    }
}

/// Where a session's workspace lives, by session directory: made at first use,
/// mounted again after an idle unmount or a restart, unmounted, and how much room
/// it and its filesystem have.
pub trait Storage: Send + Sync {
    /// Give a new session's directory (which exists, with nothing in it yet) its
    /// modes for `uid`.
    fn prepare(&self, session_dir: &Path, uid: u32) -> io::Result<()>;

    /// Mount the session's workspace on its `data` directory (and its package
    /// layer, if it has one, on `packages`), making the workspace of `size_bytes`
    /// for `uid` first if the session has none yet; nothing if mounted already.
    fn open<'a>(&'a self, session_dir: &'a Path, size_bytes: u64, uid: u32) -> BoxFuture<'a, io::Result<()>>;

    /// Give the directory an earlier daemon left in `session_dir` its modes for
    /// `uid` (an earlier version left wider ones); whether its workspace is still
    /// mounted (that daemon's end left it so).
    fn reopen<'a>(&'a self, session_dir: &'a Path, uid: u32) -> BoxFuture<'a, io::Result<bool>>;

    /// Unmount the workspace in `session_dir`, and its package layer (lazily);
    /// nothing if they are not mounted.
    fn unmount<'a>(&'a self, session_dir: &'a Path) -> BoxFuture<'a, io::Result<()>>;

    /// Every workspace's `data`, and package layer's `packages`, mounted below
    /// `sessions_dir`.
    fn mounted_below(&self, sessions_dir: &Path) -> Vec<PathBuf>;

    /// Mount the session's package layer on its `packages` directory, making it
    /// of `size_bytes` for `uid` first if it has none ([`Storage::has_layer_image`]).
    fn open_layer<'a>(&'a self, session_dir: &'a Path, size_bytes: u64, uid: u32) -> BoxFuture<'a, io::Result<()>>;

    /// Whether the session's workspace is mounted now, and its package layer with
    /// it if it has one made: each the root of a filesystem of its own.
    fn is_open(&self, session_dir: &Path) -> bool {
        is_root(session_dir, DATA) && (!self.has_layer_image(session_dir) || self.has_layer(session_dir))
    }

    /// Whether the session's package layer is mounted.
    fn has_layer(&self, session_dir: &Path) -> bool {
        is_root(session_dir, LAYER)
    }

    /// Whether the session's package layer has been made (mounted or not).
    fn has_layer_image(&self, session_dir: &Path) -> bool {
        session_dir.join(LAYER_IMAGE).is_file()
    }

    /// Bytes free on the filesystem of `sessions_dir`; `None` if it cannot say.
    fn free(&self, sessions_dir: &Path) -> Option<u64>;

    /// Share `host_free` bytes of the host disk among the images mounted in
    /// `session_dirs`, each held to its share ([`share`]); the level reached
    /// (`u64::MAX`: each has all it has free). Storage whose images do not take
    /// the host disk as they fill has nothing to share.
    fn share(&self, _session_dirs: &[PathBuf], _host_free: u64) -> u64 {
        u64::MAX
    }

    /// How much the session in `session_dir` holds in its workspace and package
    /// layer: what each filesystem has in use while it is mounted (written data
    /// counts before it reaches the image), else the blocks its image takes on the
    /// host disk; `None` if it has no workspace image yet.
    fn taken(&self, session_dir: &Path) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        let dir_dev = std::fs::metadata(session_dir).ok()?.dev();
        let held = |root: &str, image: &str| {
            let root = session_dir.join(root);
            let mounted = std::fs::metadata(&root).is_ok_and(|m| m.dev() != dir_dev);
            let in_use = mounted
                .then(|| nix::sys::statvfs::statvfs(&root).ok())
                .flatten()
                .map(|s| s.blocks().saturating_sub(s.blocks_free()).saturating_mul(s.fragment_size()));
            in_use.or_else(|| std::fs::metadata(session_dir.join(image)).ok().map(|m| m.blocks().saturating_mul(512)))
        };
        let workspace = held(DATA, IMAGE)?;
        Some(workspace.saturating_add(held(LAYER, LAYER_IMAGE).unwrap_or(0)))
    }

    /// How much more of the host disk the session in `session_dir` can take: its
    /// images' sizes (the workspace's and, once made, the package layer's: any
    /// run may write into either) less what they already take (images are
    /// sparse); `None` if it has no workspace image yet.
    fn room(&self, session_dir: &Path) -> Option<u64> {
        let unallocated = |name: &str| {
            std::fs::metadata(session_dir.join(name))
                .ok()
                .map(|m| m.len().saturating_sub(std::os::unix::fs::MetadataExt::blocks(&m).saturating_mul(512)))
        };
        let workspace = unallocated(IMAGE)?;
        Some(workspace.saturating_add(unallocated(LAYER_IMAGE).unwrap_or(0)))
    }
}

/// The images of `session_dir`, each filesystem's root and image (those not
/// mounted are left out when they are read: [`share::apply`]).
fn images_of(session_dir: &Path) -> [share::Mounted; 2] {
    [(DATA, IMAGE), (LAYER, LAYER_IMAGE)].map(|(root, image)| (session_dir.join(root), session_dir.join(image)))
}

/// The real workspaces and package layers: loop-mounted ext4 images (see the
/// module's notes), copied from the blanks of their sizes.
pub struct LoopImages {
    blanks: std::sync::Arc<Blanks>,
}

impl LoopImages {
    /// Images whose blanks are kept in `blanks_dir` (made at first use).
    pub fn new(blanks_dir: PathBuf) -> LoopImages {
        LoopImages { blanks: std::sync::Arc::new(Blanks::new(blanks_dir)) }
    }
}

/// Run `made` to its end even if its caller goes away (a client that hung up):
/// an image copied and mounted but not yet given to the session's uid would stay
/// mounted with root's root.
async fn whole<F>(made: F) -> io::Result<()>
where
    F: std::future::Future<Output = io::Result<()>> + Send + 'static,
{
    tokio::spawn(made).await.map_err(io::Error::other)?
}

impl Storage for LoopImages {
    fn prepare(&self, session_dir: &Path, uid: u32) -> io::Result<()> {
        restrict_dir(session_dir, uid)
    }

    fn open<'a>(&'a self, session_dir: &'a Path, size_bytes: u64, uid: u32) -> BoxFuture<'a, io::Result<()>> {
        let (blanks, dir) = (self.blanks.clone(), session_dir.to_path_buf());
        Box::pin(whole(async move {
            match std::fs::symlink_metadata(dir.join(IMAGE)) {
                // Mounted again: its modes fixed (an earlier version left wider ones).
                Ok(_) => {
                    mount(&dir).await?;
                    restrict(&dir, uid)
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // A workspace half made (the daemon stopped midway) is made again.
                    let _ = unmount_one(&dir.join(DATA));
                    create(&blanks, &dir, size_bytes, uid).await.inspect_err(|_| {
                        let _ = unmount_one(&dir.join(DATA));
                        let _ = std::fs::remove_file(dir.join(IMAGE));
                    })?;
                    // A package layer an earlier use made is mounted with it.
                    mount(&dir).await
                }
                Err(e) => Err(e),
            }
        }))
    }

    fn reopen<'a>(&'a self, session_dir: &'a Path, uid: u32) -> BoxFuture<'a, io::Result<bool>> {
        Box::pin(async move {
            restrict(session_dir, uid)?;
            Ok(is_mounted(&session_dir.join(DATA)))
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

    fn open_layer<'a>(&'a self, session_dir: &'a Path, size_bytes: u64, uid: u32) -> BoxFuture<'a, io::Result<()>> {
        let (blanks, dir) = (self.blanks.clone(), session_dir.to_path_buf());
        Box::pin(whole(async move { open_layer(&blanks, &dir, size_bytes, uid).await }))
    }

    fn share(&self, session_dirs: &[PathBuf], host_free: u64) -> u64 {
        let images: Vec<share::Mounted> = session_dirs.iter().flat_map(|dir| images_of(dir)).collect();
        share::apply(host_free, &images)
    }
}

/// Workspaces as plain directories, for unit tests: "mounted" is a set the fake
/// keeps, the image a sparse file of the workspace's size, the free space what
/// the test sets, and a create fails when the test asks.
#[cfg(test)]
pub mod fake {
    use super::{BoxFuture, Storage, DATA, IMAGE, LAYER, LAYER_IMAGE};
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
        /// The `data` (and `packages`) directories mounted now.
        pub fn mounted(&self) -> BTreeSet<PathBuf> {
            self.mounted.lock().unwrap_or_else(|p| p.into_inner()).clone()
        }

        /// Say `session_dir`'s workspace is mounted (as an earlier daemon left it).
        pub fn mount(&self, session_dir: &Path) {
            self.mounted.lock().unwrap_or_else(|p| p.into_inner()).insert(session_dir.join(DATA));
        }
    }

    impl Storage for Dirs {
        fn prepare(&self, _session_dir: &Path, _uid: u32) -> io::Result<()> {
            Ok(())
        }

        fn open<'a>(&'a self, session_dir: &'a Path, size_bytes: u64, _uid: u32) -> BoxFuture<'a, io::Result<()>> {
            Box::pin(async move {
                if !session_dir.join(IMAGE).is_file() {
                    std::fs::File::create_new(session_dir.join(IMAGE))?.set_len(size_bytes)?;
                    if self.fail_create.swap(false, Ordering::Relaxed) {
                        let _ = std::fs::remove_file(session_dir.join(IMAGE));
                        return Err(io::Error::other("mkfs.ext4 failed (the fake's)"));
                    }
                }
                std::fs::create_dir_all(session_dir.join(DATA))?;
                self.mount(session_dir);
                if session_dir.join(LAYER_IMAGE).is_file() {
                    self.mounted.lock().unwrap_or_else(|p| p.into_inner()).insert(session_dir.join(LAYER));
                }
                Ok(())
            })
        }

        fn reopen<'a>(&'a self, session_dir: &'a Path, _uid: u32) -> BoxFuture<'a, io::Result<bool>> {
            Box::pin(async move { Ok(self.mounted().contains(&session_dir.join(DATA))) })
        }

        fn unmount<'a>(&'a self, session_dir: &'a Path) -> BoxFuture<'a, io::Result<()>> {
            Box::pin(async move {
                let mut mounted = self.mounted.lock().unwrap_or_else(|p| p.into_inner());
                mounted.remove(&session_dir.join(DATA));
                mounted.remove(&session_dir.join(LAYER));
                Ok(())
            })
        }

        fn mounted_below(&self, sessions_dir: &Path) -> Vec<PathBuf> {
            self.mounted().into_iter().filter(|p| p.starts_with(sessions_dir)).collect()
        }

        fn free(&self, _sessions_dir: &Path) -> Option<u64> {
            Some(self.free.load(Ordering::Relaxed))
        }

        fn open_layer<'a>(
            &'a self,
            session_dir: &'a Path,
            size_bytes: u64,
            _uid: u32,
        ) -> BoxFuture<'a, io::Result<()>> {
            Box::pin(async move {
                if !session_dir.join(LAYER_IMAGE).is_file() {
                    std::fs::File::create_new(session_dir.join(LAYER_IMAGE))?.set_len(size_bytes)?;
                }
                std::fs::create_dir_all(session_dir.join(LAYER))?;
                self.mounted.lock().unwrap_or_else(|p| p.into_inner()).insert(session_dir.join(LAYER));
                Ok(())
            })
        }

        fn has_layer(&self, session_dir: &Path) -> bool {
            self.mounted().contains(&session_dir.join(LAYER))
        }

        fn is_open(&self, session_dir: &Path) -> bool {
            let mounted = self.mounted();
            mounted.contains(&session_dir.join(DATA))
                && (!self.has_layer_image(session_dir) || mounted.contains(&session_dir.join(LAYER)))
        }
    }
}
