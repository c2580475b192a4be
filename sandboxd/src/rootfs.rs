//! The Python rootfs: made once from its tarball into a read-only ext4 image in the
//! state directory, keyed by the tarball's sha256, verified, and never written again;
//! each daemon loop-mounts the image read-only at `state_dir/mnt/rootfs` while it
//! runs. The rootfs is thus the root of a filesystem of its own: a sandbox's
//! `/proc/self/mountinfo` shows `/`, never a host path.
//!
//! The tarball is unpacked into a temporary directory, checked against its hash, and
//! turned into an image (`mkfs.ext4 -d`, e2fsprogs) under a temporary name, which is
//! renamed into place only when the image is whole and on disk. A half-made tree or
//! image left by a crash keeps its temporary name and is removed at the next start.
//! Several daemons may share one `rootfs` directory (and mount its image at once).

use sha2::{Digest, Sha256};
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("rootfs tarball {0} not found: build it with `rootfs/build.sh` (or `make rootfs`), or set rootfs_tarball")]
    Missing(PathBuf),
    #[error("reading {0}: {1}")]
    Read(PathBuf, io::Error),
    #[error("unpacking {0}: {1}")]
    Unpack(PathBuf, io::Error),
    #[error("making the rootfs image {0}: {1} (mkfs.ext4 from e2fsprogs is required)")]
    Image(PathBuf, io::Error),
    #[error("mounting the rootfs image {0} on {1}: {2}")]
    Mount(PathBuf, PathBuf, io::Error),
    #[error(transparent)]
    Dev(#[from] crate::isolate::devfs::Error),
    #[error("rootfs tarball {path} has sha256 {actual}, but {path}.sha256 says {expected}: the file is damaged or was replaced; rebuild it")]
    HashMismatch { path: PathBuf, expected: String, actual: String },
    #[error("rootfs {0} has no /opt/sandboxd/manifest.json: it was not built by rootfs/build.sh")]
    NoManifest(PathBuf),
}

/// A verified rootfs, mounted read-only at `path`.
#[derive(Debug, Clone)]
pub struct Rootfs {
    /// The mount point (the root of the image's filesystem).
    pub path: PathBuf,
    pub sha256: String,
    pub manifest: serde_json::Value,
}

impl Rootfs {
    /// Unmount the image (daemon shutdown), the loop device going with it, and the
    /// sandboxes' `/dev` beside it.
    pub fn unmount(&self) {
        let dev = dev_beside(&self.path);
        if let Err(e) = crate::isolate::devfs::unmount(&dev) {
            tracing::warn!(path = %dev.display(), error = %e, "could not unmount the sandboxes' /dev");
        }
        if crate::storage::is_mounted(&self.path) {
            if let Err(e) = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH) {
                tracing::warn!(path = %self.path.display(), error = %e, "could not unmount the rootfs");
            }
        }
    }
}

struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Where the image of the tarball with hash `sha256` lives below `state_dir`.
pub fn image_path(state_dir: &Path, sha256: &str) -> PathBuf {
    state_dir.join("rootfs").join(format!("{sha256}.img"))
}

/// Where a daemon mounts its rootfs.
pub fn mount_point(state_dir: &Path) -> PathBuf {
    state_dir.join("mnt/rootfs")
}

/// Where the sandboxes' shared `/dev` ([`crate::isolate::devfs`]) is mounted:
/// beside the rootfs mounted at `rootfs`.
pub fn dev_beside(rootfs: &Path) -> PathBuf {
    rootfs.with_file_name("dev")
}

/// Make sure the tarball's image exists below `state_dir/rootfs`, mount it, and
/// return it. Blocking: call it before the runtime serves requests, or in
/// `spawn_blocking`.
pub fn ensure(tarball: &Path, state_dir: &Path) -> Result<Rootfs, Error> {
    let tarball = fs::canonicalize(tarball).map_err(|_| Error::Missing(tarball.into()))?;
    let sidecar = PathBuf::from(format!("{}.sha256", tarball.display()));
    let expected = fs::read_to_string(&sidecar).map_err(|e| Error::Read(sidecar.clone(), e))?.trim().to_string();
    if expected.len() != 64 || !expected.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::Read(sidecar, io::Error::other("not a sha256 in hex")));
    }
    let dir = state_dir.join("rootfs");
    // Only root reads the images: sandboxes see the mounted tree, never this directory.
    fs::create_dir_all(&dir)
        .and_then(|()| fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)))
        .map_err(|e| Error::Unpack(dir.clone(), e))?;
    remove_partial(&dir);
    note_unpacked_trees(&dir);
    let image = image_path(state_dir, &expected);
    if !image.is_file() {
        make_image(&tarball, &dir, &image, &expected)?;
    }
    fs::set_permissions(&image, fs::Permissions::from_mode(0o600)).map_err(|e| Error::Image(image.clone(), e))?;
    let target = mount_point(state_dir);
    mount(&image, &target)?;
    let rootfs = Rootfs { path: target.clone(), sha256: expected, manifest: serde_json::Value::Null };
    if let Err(e) = crate::isolate::devfs::make(&dev_beside(&target)) {
        rootfs.unmount();
        return Err(e.into());
    }
    let manifest =
        fs::read_to_string(target.join("opt/sandboxd/manifest.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
    match manifest {
        Some(manifest) => Ok(Rootfs { manifest, ..rootfs }),
        None => {
            rootfs.unmount();
            Err(Error::NoManifest(image))
        }
    }
}

/// Mount `image` read-only on `target` (the sandboxes, an unprivileged uid, pass
/// through `mnt/`), replacing whatever an earlier instance left mounted there.
fn mount(image: &Path, target: &Path) -> Result<(), Error> {
    let merr = |e| Error::Mount(image.into(), target.into(), e);
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent)
            .and_then(|()| fs::set_permissions(parent, fs::Permissions::from_mode(0o711)))
            .map_err(merr)?;
    }
    while crate::storage::is_mounted(target) {
        tracing::info!(path = %target.display(), "unmounting a rootfs left mounted by an earlier run");
        nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH).map_err(|e| merr(e.into()))?;
    }
    match fs::create_dir(target) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(merr(e)),
    }
    // Mounted on the directory itself, never through a link (mount(8) follows one).
    if !fs::symlink_metadata(target).map_err(merr)?.is_dir() {
        return Err(merr(io::Error::other("not a directory (a link or a file is there): remove it")));
    }
    // The mount point under the image: nothing for others to read when unmounted.
    fs::set_permissions(target, fs::Permissions::from_mode(0o700)).map_err(merr)?;
    // mount(8) sets up the loop device (autoclear: it goes at unmount) and reuses
    // one another daemon already attached read-only to the same image.
    let out = std::process::Command::new("mount")
        .args(["-t", "ext4", "-o", "loop,ro,nosuid,nodev"])
        .arg(image)
        .arg(target)
        .output()
        .map_err(merr)?;
    if !out.status.success() {
        return Err(merr(io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string())));
    }
    Ok(())
}

/// Remove what a crashed unpack left: `.partial-<sha>-<pid>` trees and images whose
/// process is gone (another daemon sharing the directory may be making one now).
fn remove_partial(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(".partial-") else { continue };
        let pid = rest.trim_end_matches(".img").rsplit('-').next().and_then(|p| p.parse::<i32>().ok());
        let alive = pid.is_some_and(|p| {
            p > 0
                && p != std::process::id() as i32
                && nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None).is_ok()
        });
        if alive {
            continue;
        }
        tracing::info!(path = %entry.path().display(), "removing a half-made rootfs");
        let path = entry.path();
        let _ = if path.is_dir() && !path.is_symlink() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
    }
}

/// Earlier versions used the unpacked tree (`rootfs/<sha256>/`) itself; a daemon of
/// that version may still be running on a shared directory, so it is left in place.
fn note_unpacked_trees(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) && entry.path().is_dir() {
            tracing::info!(path = %entry.path().display(), "a rootfs unpacked by an earlier version is unused now: remove it once no older sandboxd runs on this directory");
        }
    }
}

fn make_image(tarball: &Path, dir: &Path, image: &Path, expected: &str) -> Result<(), Error> {
    let partial = dir.join(format!(".partial-{expected}-{}", std::process::id()));
    let partial_image = dir.join(format!(".partial-{expected}-{}.img", std::process::id()));
    let made = unpack(tarball, &partial, expected).and_then(|()| {
        tracing::info!(image = %image.display(), "making the rootfs image (once)");
        mkfs(&partial, &partial_image).map_err(|e| Error::Image(image.into(), e))
    });
    let _ = fs::remove_dir_all(&partial);
    let placed = made.and_then(|()| {
        fs::rename(&partial_image, image)
            .and_then(|()| fs::File::open(dir)?.sync_all())
            .map_err(|e| Error::Image(image.into(), e))
    });
    if placed.is_err() {
        let _ = fs::remove_file(&partial_image);
    }
    placed
}

/// `e` with the error it wraps, if any, in its text: the tar crate's errors name
/// the entry and keep the system's answer (EPERM, ENOSPC...) as their source.
fn with_cause(e: io::Error) -> io::Error {
    let cause = e.get_ref().and_then(|inner| inner.source()).map(|c| c.to_string());
    match cause {
        Some(c) => io::Error::new(e.kind(), format!("{e}: {c}")),
        None => e,
    }
}

fn unpack(tarball: &Path, partial: &Path, expected: &str) -> Result<(), Error> {
    tracing::info!(tarball = %tarball.display(), "unpacking the rootfs (once)");
    let file = fs::File::open(tarball).map_err(|e| Error::Read(tarball.into(), e))?;
    let mut hashing = HashingReader { inner: io::BufReader::new(file), hasher: Sha256::new() };
    let result = (|| -> io::Result<()> {
        let decoder = zstd::stream::read::Decoder::new(&mut hashing)?;
        let mut archive = tar::Archive::new(decoder);
        // Modes without setuid/setgid/sticky bits: nothing in a sandbox may gain
        // privileges from a file (the image is mounted nosuid too), and the unit's
        // RestrictSUIDSGID= forbids the daemon to make such files at all.
        archive.set_preserve_permissions(false);
        archive.set_preserve_ownerships(true);
        archive.set_unpack_xattrs(false);
        fs::create_dir(partial)?;
        archive.unpack(partial)?;
        // Drain whatever follows the tar's end so the hash covers the whole file.
        io::copy(&mut hashing, &mut io::sink())?;
        Ok(())
    })();
    result.map_err(|e| Error::Unpack(tarball.into(), with_cause(e)))?;
    let actual = hex(&hashing.hasher.finalize());
    if actual != expected {
        return Err(Error::HashMismatch { path: tarball.into(), expected: expected.into(), actual });
    }
    Ok(())
}

/// Blocks and inodes an ext4 image of `tree` needs.
fn measure(tree: &Path) -> io::Result<(u64, u64)> {
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let mut stack = vec![tree.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            inodes += 1;
            bytes += meta.len().div_ceil(4096) * 4096;
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok((bytes, inodes))
}

/// The size of an image for `bytes` of data and `inodes` entries (ext4 metadata,
/// and room to spare: mkfs fails rather than truncate when the image is too small).
pub fn image_size(bytes: u64, inodes: u64) -> u64 {
    let size = bytes + bytes / 8 + inodes * 512 + (64 << 20);
    size.div_ceil(4096) * 4096
}

/// Make a read-only-to-be ext4 image of `tree` at `image`, on disk when it returns.
fn mkfs(tree: &Path, image: &Path) -> io::Result<()> {
    let (bytes, inodes) = measure(tree)?;
    let mut size = image_size(bytes, inodes);
    for attempt in 0..2 {
        let _ = fs::remove_file(image);
        let file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(image)?;
        file.set_len(size)?;
        let out = std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096", "-m", "0", "-O", "^has_journal", "-E", "nodiscard"])
            .arg("-N")
            .arg((inodes + 1024).to_string())
            .arg("-d")
            .arg(tree)
            .arg(image)
            .output()?;
        if out.status.success() {
            return file.sync_all();
        }
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if attempt == 1 {
            return Err(io::Error::other(format!("mkfs.ext4 failed: {err}")));
        }
        tracing::info!(error = %err, size, "the rootfs image was too small: trying twice the size");
        size *= 2;
    }
    Ok(())
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_leave_room_for_ext4_and_are_whole_blocks() {
        let size = image_size(600 << 20, 14_000);
        assert!(size >= (600 << 20) + (600 << 20) / 8 + (64 << 20));
        assert_eq!(size % 4096, 0);
        assert_eq!(image_path(Path::new("/s"), "ab"), PathBuf::from("/s/rootfs/ab.img"));
        assert_eq!(mount_point(Path::new("/s")), PathBuf::from("/s/mnt/rootfs"));
    }
}
