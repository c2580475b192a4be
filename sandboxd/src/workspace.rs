//! Safe access to a session's workspace from the daemon, which runs as root.
//!
//! Every path a client gives is validated ([`validate`]) and every open goes
//! through `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)`
//! relative to the workspace directory, so no symlink (in any component), `..` or
//! mount crossing can take the daemon outside the workspace. Regular files with
//! more than one link are refused: a hard link may point at a file elsewhere.

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidPath(String),
    #[error("no such file: {0}")]
    NotFound(String),
    #[error("{0} already exists: pass overwrite=true to replace it")]
    Exists(String),
    #[error("{0} is a link or special file, which is never served; only regular files are")]
    NotRegular(String),
    #[error("{0}: {1}")]
    Io(String, io::Error),
}

/// Check a client path: relative, no `..`, no NUL, no empty or `.` parts, not too
/// long. Returns the normalised relative path.
pub fn validate(path: &str) -> Result<PathBuf, Error> {
    let bad = |why: &str| {
        Error::InvalidPath(format!("invalid path {path:?}: {why}; use a relative path like `out/chart.png`"))
    };
    if path.is_empty() {
        return Err(bad("it is empty"));
    }
    if path.len() > 1024 {
        return Err(bad("it is longer than 1024 bytes"));
    }
    if path.contains('\0') {
        return Err(bad("it contains a NUL byte"));
    }
    if path.starts_with('/') {
        return Err(bad("absolute paths are not allowed"));
    }
    if path.contains('\\') {
        return Err(bad("backslashes are not allowed"));
    }
    let mut out = PathBuf::new();
    for part in path.split('/') {
        match part {
            "" => return Err(bad("it has an empty component")),
            "." | ".." => return Err(bad("`.` and `..` are not allowed")),
            p if p.len() > 255 => return Err(bad("a component is longer than 255 bytes")),
            p => out.push(p),
        }
    }
    if out.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(bad("it is not a plain relative path"));
    }
    Ok(out)
}

fn how(flags: OFlag, mode: u32) -> OpenHow {
    OpenHow::new().flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW).mode(Mode::from_bits_truncate(mode)).resolve(
        ResolveFlag::RESOLVE_BENEATH
            | ResolveFlag::RESOLVE_NO_SYMLINKS
            | ResolveFlag::RESOLVE_NO_MAGICLINKS
            | ResolveFlag::RESOLVE_NO_XDEV,
    )
}

fn display(rel: &Path) -> String {
    rel.display().to_string()
}

fn open_at<Fd: AsFd>(dir: Fd, rel: &Path, flags: OFlag, mode: u32) -> Result<OwnedFd, Error> {
    nix::fcntl::openat2(dir, rel, how(flags, mode)).map_err(|e| match e {
        nix::Error::ENOENT => Error::NotFound(display(rel)),
        nix::Error::EEXIST => Error::Exists(display(rel)),
        nix::Error::ELOOP | nix::Error::EXDEV => Error::NotRegular(display(rel)),
        other => Error::Io(display(rel), other.into()),
    })
}

/// A session workspace root, opened once per operation.
pub struct Workspace {
    root: OwnedFd,
}

impl Workspace {
    pub fn open(dir: &Path) -> Result<Workspace, Error> {
        let root = nix::fcntl::open(dir, OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| Error::Io(dir.display().to_string(), e.into()))?;
        Ok(Workspace { root })
    }

    /// Open a regular file for reading; refuses links, devices, fifos and
    /// multiply-linked files.
    pub fn open_read(&self, rel: &Path) -> Result<(File, std::fs::Metadata), Error> {
        let fd = open_at(&self.root, rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK, 0)?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| Error::Io(display(rel), e))?;
        use std::os::unix::fs::MetadataExt;
        if !meta.is_file() || meta.nlink() > 1 {
            return Err(Error::NotRegular(display(rel)));
        }
        Ok((file, meta))
    }

    /// Create (or, with `overwrite`, replace) a regular file owned by `uid`,
    /// creating parent directories as needed.
    pub fn create(&self, rel: &Path, overwrite: bool, uid: u32) -> Result<File, Error> {
        if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
            self.mkdirs(parent, uid)?;
        }
        let mut flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC;
        if !overwrite {
            flags |= OFlag::O_EXCL;
        }
        let fd = open_at(&self.root, rel, flags, 0o644)?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| Error::Io(display(rel), e))?;
        use std::os::unix::fs::MetadataExt;
        if !meta.is_file() || meta.nlink() > 1 {
            return Err(Error::NotRegular(display(rel)));
        }
        nix::unistd::fchown(&file, Some(uid.into()), Some(uid.into()))
            .map_err(|e| Error::Io(display(rel), e.into()))?;
        Ok(file)
    }

    fn mkdirs(&self, rel: &Path, uid: u32) -> Result<(), Error> {
        let mut sofar = PathBuf::new();
        for part in rel.components() {
            sofar.push(part);
            match nix::sys::stat::mkdirat(&self.root, &sofar, Mode::from_bits_truncate(0o755)) {
                Ok(()) => {
                    let fd = open_at(&self.root, &sofar, OFlag::O_DIRECTORY | OFlag::O_RDONLY, 0)?;
                    nix::unistd::fchown(&fd, Some(uid.into()), Some(uid.into()))
                        .map_err(|e| Error::Io(display(&sofar), e.into()))?;
                }
                Err(nix::Error::EEXIST) => {
                    // Must be a real directory, reached without links.
                    open_at(&self.root, &sofar, OFlag::O_DIRECTORY | OFlag::O_RDONLY, 0)?;
                }
                Err(e) => return Err(Error::Io(display(&sofar), e.into())),
            }
        }
        Ok(())
    }

    /// Delete a file (never a directory, never through a link).
    pub fn remove(&self, rel: &Path) -> Result<(), Error> {
        let parent = rel.parent().filter(|p| !p.as_os_str().is_empty());
        let name = rel.file_name().ok_or_else(|| Error::InvalidPath(display(rel)))?;
        let dir = match parent {
            Some(p) => open_at(&self.root, p, OFlag::O_DIRECTORY | OFlag::O_RDONLY, 0)?,
            None => self.root.try_clone().map_err(|e| Error::Io(display(rel), e))?,
        };
        let st =
            nix::sys::stat::fstatat(&dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).map_err(|e| match e {
                nix::Error::ENOENT => Error::NotFound(display(rel)),
                other => Error::Io(display(rel), other.into()),
            })?;
        if (st.st_mode & libc::S_IFMT) == libc::S_IFDIR {
            return Err(Error::InvalidPath(format!("{} is a directory; delete the files in it", display(rel))));
        }
        nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir)
            .map_err(|e| Error::Io(display(rel), e.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_relative_paths() {
        assert_eq!(validate("a.txt").unwrap(), PathBuf::from("a.txt"));
        assert_eq!(validate("out/sub/c.png").unwrap(), PathBuf::from("out/sub/c.png"));
        assert_eq!(validate("..hidden").unwrap(), PathBuf::from("..hidden"));
    }

    #[test]
    fn refuses_traversal_absolute_nul_and_empty_parts() {
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "a/./b", "a//b", "a/", "x\0y", "a\\..\\b", "."] {
            assert!(validate(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn never_follows_symlinks_or_hardlinks() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("dirlink")).unwrap();
        std::fs::write(dir.path().join("real"), b"x").unwrap();
        std::fs::hard_link(dir.path().join("real"), dir.path().join("hard")).unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        assert!(matches!(ws.open_read(Path::new("link")), Err(Error::NotRegular(_))));
        assert!(ws.open_read(Path::new("dirlink/passwd")).is_err());
        assert!(matches!(ws.open_read(Path::new("hard")), Err(Error::NotRegular(_))));
        assert!(ws.create(Path::new("link"), true, 0).is_err());
        assert!(ws.create(Path::new("dirlink/x"), true, 0).is_err());
        assert!(matches!(ws.open_read(Path::new("missing")), Err(Error::NotFound(_))));
    }

    #[test]
    fn create_refuses_to_clobber_without_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let uid = nix::unistd::getuid().as_raw();
        ws.create(Path::new("d/e/f.txt"), false, uid).unwrap();
        assert!(matches!(ws.create(Path::new("d/e/f.txt"), false, uid), Err(Error::Exists(_))));
        ws.create(Path::new("d/e/f.txt"), true, uid).unwrap();
        ws.remove(Path::new("d/e/f.txt")).unwrap();
        assert!(matches!(ws.remove(Path::new("d/e/f.txt")), Err(Error::NotFound(_))));
    }
}
