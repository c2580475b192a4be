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

    /// The blank of `size_bytes`, made now if it is not there yet.
    async fn blank(&self, size_bytes: u64) -> io::Result<PathBuf> {
        let path = self.dir.join(format!("ext4-{size_bytes}.img"));
        if path.is_file() {
            return Ok(path);
        }
        let _one = self.making.lock().await;
        if path.is_file() {
            return Ok(path);
        }
        match std::fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", self.dir.display()))),
        }
        // Made beside its name and renamed into it whole: a blank is never half made.
        let part = self.dir.join(format!("ext4-{size_bytes}.img.part"));
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
        Ok(path)
    }
}

/// What [`sparse_copy`] reads and writes at a time.
const BLOCK: usize = 64 * 1024;

/// Copy `from` into a new file `to` (0600), the same length, writing only
/// `from`'s data extents, and of them only blocks that are not all zeros: its
/// holes stay holes. A copy that fails leaves no file.
pub fn sparse_copy(from: &Path, to: &Path) -> io::Result<()> {
    let src = File::open(from)?;
    let len = src.metadata()?.len();
    let dst = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(to)?;
    let copied = (|| {
        dst.set_len(len)?;
        let end = i64::try_from(len).map_err(io::Error::other)?;
        let mut at: i64 = 0;
        let mut block = vec![0u8; BLOCK];
        while at < end {
            let data = match nix::unistd::lseek(&src, at, nix::unistd::Whence::SeekData) {
                Ok(d) => d,
                // No data past `at`: the rest is a hole.
                Err(nix::errno::Errno::ENXIO) => break,
                Err(e) => return Err(e.into()),
            };
            let hole = nix::unistd::lseek(&src, data, nix::unistd::Whence::SeekHole)?;
            let (Ok(mut offset), Ok(until)) = (u64::try_from(data), u64::try_from(hole)) else {
                return Err(io::Error::other("a negative offset"));
            };
            // Block by block, and a block of zeros is left a hole: a filesystem that
            // cannot tell its holes says the whole file is data.
            while offset < until {
                let want = usize::try_from((until - offset).min(BLOCK as u64)).map_err(io::Error::other)?;
                let got = src.read_at(&mut block[..want], offset)?;
                if got == 0 {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("{} shrank", from.display())));
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
        sparse_copy(&from, &to).unwrap();
        let (mut a, mut b) = (vec![], vec![]);
        File::open(&from).unwrap().read_to_end(&mut a).unwrap();
        File::open(&to).unwrap().read_to_end(&mut b).unwrap();
        assert!(a == b);
        let meta = std::fs::metadata(&to).unwrap();
        assert_eq!(meta.len(), 64 << 20);
        // Three small extents, not 64 MiB.
        assert!(meta.blocks() * 512 < 1 << 20, "{} bytes allocated", meta.blocks() * 512);
        // It never writes over a file that is there.
        assert_eq!(sparse_copy(&from, &to).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
    }

    #[test]
    fn a_copy_of_a_missing_file_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let to = dir.path().join("b");
        assert!(sparse_copy(&dir.path().join("none"), &to).is_err());
        assert!(!to.exists());
    }
}
