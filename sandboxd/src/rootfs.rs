//! The Python rootfs: unpacked once from its tarball into the state directory,
//! keyed by the tarball's sha256, verified, and never written again.
//!
//! Unpacking goes to a temporary directory that is renamed into place only when the
//! tarball's hash matched and every entry was written; a half-unpacked directory
//! left by a crash keeps its temporary name and is removed at the next start.

use sha2::{Digest, Sha256};
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("rootfs tarball {0} not found: build it with `rootfs/build.sh` (or `make rootfs`), or set rootfs_tarball")]
    Missing(PathBuf),
    #[error("reading {0}: {1}")]
    Read(PathBuf, io::Error),
    #[error("unpacking {0}: {1}")]
    Unpack(PathBuf, io::Error),
    #[error("rootfs tarball {path} has sha256 {actual}, but {path}.sha256 says {expected}: the file is damaged or was replaced; rebuild it")]
    HashMismatch { path: PathBuf, expected: String, actual: String },
    #[error("rootfs {0} has no /opt/sandboxd/manifest.json: it was not built by rootfs/build.sh")]
    NoManifest(PathBuf),
}

/// An unpacked, verified rootfs.
#[derive(Debug, Clone)]
pub struct Rootfs {
    pub path: PathBuf,
    pub sha256: String,
    pub manifest: serde_json::Value,
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

/// Make sure the tarball is unpacked below `state_dir/rootfs`, and return it.
/// Blocking: call it before the runtime serves requests, or in `spawn_blocking`.
pub fn ensure(tarball: &Path, state_dir: &Path) -> Result<Rootfs, Error> {
    let tarball = fs::canonicalize(tarball).map_err(|_| Error::Missing(tarball.into()))?;
    let sidecar = PathBuf::from(format!("{}.sha256", tarball.display()));
    let expected = fs::read_to_string(&sidecar).map_err(|e| Error::Read(sidecar.clone(), e))?.trim().to_string();
    let dir = state_dir.join("rootfs");
    fs::create_dir_all(&dir).map_err(|e| Error::Unpack(dir.clone(), e))?;
    remove_partial(&dir);
    let target = dir.join(&expected);
    if !target.join("opt/sandboxd/manifest.json").is_file() {
        unpack(&tarball, &dir, &target, &expected)?;
    }
    let manifest_path = target.join("opt/sandboxd/manifest.json");
    let manifest = fs::read_to_string(&manifest_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| Error::NoManifest(target.clone()))?;
    Ok(Rootfs { path: target, sha256: expected, manifest })
}

fn remove_partial(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(".partial-") {
                tracing::info!(path = %entry.path().display(), "removing a half-unpacked rootfs");
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

fn unpack(tarball: &Path, dir: &Path, target: &Path, expected: &str) -> Result<(), Error> {
    let partial = dir.join(format!(".partial-{expected}-{}", std::process::id()));
    tracing::info!(tarball = %tarball.display(), into = %target.display(), "unpacking the rootfs (once)");
    let file = fs::File::open(tarball).map_err(|e| Error::Read(tarball.into(), e))?;
    let mut hashing = HashingReader { inner: io::BufReader::new(file), hasher: Sha256::new() };
    let result = (|| -> io::Result<()> {
        let decoder = zstd::stream::read::Decoder::new(&mut hashing)?;
        let mut archive = tar::Archive::new(decoder);
        archive.set_preserve_permissions(true);
        archive.set_preserve_ownerships(true);
        archive.set_unpack_xattrs(false);
        fs::create_dir(&partial)?;
        archive.unpack(&partial)?;
        // Drain whatever follows the tar's end so the hash covers the whole file.
        io::copy(&mut hashing, &mut io::sink())?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = fs::remove_dir_all(&partial);
        return Err(Error::Unpack(tarball.into(), e));
    }
    let actual = hex(&hashing.hasher.finalize());
    if actual != expected {
        let _ = fs::remove_dir_all(&partial);
        return Err(Error::HashMismatch { path: tarball.into(), expected: expected.into(), actual });
    }
    fs::rename(&partial, target).map_err(|e| Error::Unpack(target.into(), e))?;
    Ok(())
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
