//! Blank filesystem images, made once per size and copied for each new image.
//!
//! `mkfs.ext4` costs a process and ~5 ms for a 1 GiB image, and leaves ~33 MiB of
//! it allocated on the host (the journal, as unwritten extents); every session of a
//! policy with packages makes two. A new session's image is instead a sparse copy
//! of a blank of its size, made by `mkfs.ext4` the first time that size is asked
//! for: only the blank's data extents are copied (`SEEK_DATA`/`SEEK_HOLE`, ~0.5 MiB
//! for 1 GiB), and blocks of zeros in them are left holes, so the copy takes well
//! under a millisecond and holds on the host only what its filesystem wrote. The copy's
//! root is root's; the caller gives it to the session's uid once it is mounted.
//!
//! Copies of one blank share its filesystem UUID and directory hash seed. Neither
//! guards anything between sessions: each image is mounted on its own, and a
//! hash seed only spreads names within one directory of one filesystem.

use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use tokio::process::Command;

/// Where blanks are kept (root's, 0700), one per size.
pub struct Blanks {
    dir: PathBuf,
    /// One blank made at a time (two creates of a new size make it once).
    making: tokio::sync::Mutex<()>,
}

impl Blanks {
    pub fn new(dir: PathBuf) -> Blanks {
        Blanks { dir, making: tokio::sync::Mutex::new(()) }
    }

    /// Make `image` (which must not exist), `size_bytes` long, holding an empty
    /// ext4 filesystem whose root is root's, mode 0755.
    pub async fn make(&self, image: &Path, size_bytes: u64) -> io::Result<()> {
        let blank = self.blank(size_bytes).await?;
        let image = image.to_path_buf();
        tokio::task::spawn_blocking(move || sparse_copy(&blank, &image)).await.map_err(io::Error::other)?
    }

    /// The blank of `size_bytes`, open, made now if it is not there yet, or made
    /// again if what is there is not one this daemon made ([`check`]).
    async fn blank(&self, size_bytes: u64) -> io::Result<File> {
        let path = self.dir.join(format!("ext4-{size_bytes}.img"));
        if let Ok(file) = open_checked(&path, size_bytes) {
            return Ok(file);
        }
        let _one = self.making.lock().await;
        match open_checked(&path, size_bytes) {
            Ok(file) => return Ok(file),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(blank = %path.display(), error = %e, "a blank image that is not as this daemon makes them: made again");
                std::fs::remove_file(&path)?;
            }
        }
        own_dir(&self.dir)?;
        // Made under a name of its own and renamed into place whole: a blank is
        // never half made, and no other process's part can become it.
        let part = self.dir.join(format!("ext4-{size_bytes}.img.{}.part", std::process::id()));
        let _ = std::fs::remove_file(&part);
        let file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&part)?;
        file.set_len(size_bytes)?;
        drop(file);
        let made = super::run(
            Command::new("mkfs.ext4").args(["-q", "-F", "-m", "0", "-E", "root_owner=0:0"]).arg(&part),
            "mkfs.ext4",
        )
        .await;
        if let Err(e) = made {
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
        std::fs::rename(&part, &path)?;
        open_checked(&path, size_bytes)
    }
}

/// The blanks' directory, made root's and 0700 whatever it was (never through a
/// link).
fn own_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!("{} is not a directory", dir.display())));
    }
    std::os::unix::fs::lchown(dir, Some(0), Some(0))?;
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
}

/// `path` open for reading, if it is a blank as this daemon makes them: a
/// regular file (not a link) of the daemon's user (root), no other name, no other
/// user's access, `size_bytes` long.
fn open_checked(path: &Path, size_bytes: u64) -> io::Result<File> {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path)?;
    let meta = file.metadata()?;
    check(&meta, size_bytes).map_err(|why| io::Error::new(io::ErrorKind::InvalidData, why))?;
    Ok(file)
}

/// Why `meta` is not a blank's of `size_bytes`, if it is not.
fn check(meta: &std::fs::Metadata, size_bytes: u64) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() || meta.nlink() != 1 || meta.mode() & 0o077 != 0 {
        return Err(format!("owner {}, {} names, mode {:o}", meta.uid(), meta.nlink(), meta.mode() & 0o7777));
    }
    if meta.len() != size_bytes {
        return Err(format!("{} bytes long", meta.len()));
    }
    Ok(())
}

/// What [`sparse_copy`] reads and writes at a time.
const BLOCK: usize = 64 * 1024;

/// Copy `from` into a new file `to` (0600), the same length, writing only
/// `from`'s data extents, and of them only blocks that are not all zeros: its
/// holes stay holes. A copy that fails leaves no file.
pub fn sparse_copy(src: &File, to: &Path) -> io::Result<()> {
    let len = src.metadata()?.len();
    let dst = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(to)?;
    let copied = (|| {
        dst.set_len(len)?;
        let end = i64::try_from(len).map_err(io::Error::other)?;
        let mut at: i64 = 0;
        let mut block = vec![0u8; BLOCK];
        while at < end {
            let data = match nix::unistd::lseek(src, at, nix::unistd::Whence::SeekData) {
                Ok(d) => d,
                // No data past `at`: the rest is a hole.
                Err(nix::errno::Errno::ENXIO) => break,
                Err(e) => return Err(e.into()),
            };
            let hole = nix::unistd::lseek(src, data, nix::unistd::Whence::SeekHole)?;
            let (Ok(mut offset), Ok(until)) = (u64::try_from(data), u64::try_from(hole)) else {
                return Err(io::Error::other("a negative offset"));
            };
            // Block by block, and a block of zeros is left a hole: a filesystem that
            // cannot tell its holes says the whole file is data.
            while offset < until {
                let want = usize::try_from((until - offset).min(BLOCK as u64)).map_err(io::Error::other)?;
                let got = src.read_at(&mut block[..want], offset)?;
                if got == 0 {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the blank shrank while it was copied"));
                }
                if block[..got].iter().any(|b| *b != 0) {
                    dst.write_all_at(&block[..got], offset)?;
                }
                offset += got as u64;
            }
            at = hole;
        }
        Ok(())
    })();
    if copied.is_err() {
        let _ = std::fs::remove_file(to);
    }
    copied
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_sparse_copy_has_the_same_bytes_and_keeps_the_holes() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("a"), dir.path().join("b"));
        let mut f = File::create(&from).unwrap();
        f.set_len(64 << 20).unwrap();
        for (at, text) in [(0u64, &b"head"[..]), (10 << 20, b"middle"), ((64 << 20) - 4, b"tail")] {
            f.seek(SeekFrom::Start(at)).unwrap();
            f.write_all(text).unwrap();
        }
        // Zeros written out are data to SEEK_DATA, and stay holes in the copy.
        f.seek(SeekFrom::Start(20 << 20)).unwrap();
        f.write_all(&vec![0u8; 8 << 20]).unwrap();
        f.sync_all().unwrap();
        drop(f);
        assert!(std::fs::metadata(&from).unwrap().blocks() * 512 >= 8 << 20);
        sparse_copy(&File::open(&from).unwrap(), &to).unwrap();
        let (mut a, mut b) = (vec![], vec![]);
        File::open(&from).unwrap().read_to_end(&mut a).unwrap();
        File::open(&to).unwrap().read_to_end(&mut b).unwrap();
        assert!(a == b);
        let meta = std::fs::metadata(&to).unwrap();
        assert_eq!(meta.len(), 64 << 20);
        // Three small extents, not 64 MiB.
        assert!(meta.blocks() * 512 < 1 << 20, "{} bytes allocated", meta.blocks() * 512);
        // It never writes over a file that is there.
        assert_eq!(sparse_copy(&File::open(&from).unwrap(), &to).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
    }

    #[test]
    fn a_copy_that_fails_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let to = dir.path().join("b");
        // A directory opened as the source: reading it fails.
        let not_a_file = File::open(dir.path()).unwrap();
        assert!(sparse_copy(&not_a_file, &to).is_err());
        assert!(!to.exists());
    }

    #[test]
    fn only_a_blank_as_the_daemon_makes_them_is_taken() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let blank = dir.path().join("ext4-4096.img");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&blank)
            .unwrap()
            .set_len(4096)
            .unwrap();
        assert!(open_checked(&blank, 4096).is_ok());
        assert_eq!(open_checked(&blank, 8192).unwrap_err().kind(), io::ErrorKind::InvalidData);
        std::fs::set_permissions(&blank, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(open_checked(&blank, 4096).is_err(), "readable by others");
        std::fs::set_permissions(&blank, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::hard_link(&blank, dir.path().join("other-name")).unwrap();
        assert!(open_checked(&blank, 4096).is_err(), "a second name");
        std::fs::remove_file(dir.path().join("other-name")).unwrap();
        let link = dir.path().join("ext4-link.img");
        std::os::unix::fs::symlink(&blank, &link).unwrap();
        assert!(open_checked(&link, 4096).is_err(), "a link");
        assert!(open_checked(&blank, 4096).is_ok());
    }
}
