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
