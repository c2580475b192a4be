//! The one way the daemon (root) touches a session's workspace: from the
//! workspace's root fd, one component at a time, never by a name sandboxed code
//! can change under it.
//!
//! Sandboxed code owns the workspace and can swap any directory in it for a
//! symlink at any moment (a kernel session keeps running while the daemon works).
//! So no multi-component path ever reaches a syscall: each component is opened
//! with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV)` and `O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC` relative to the fd
//! of its parent, the fd is checked with `fstat` (a directory to descend into, a
//! regular file to read; nothing else is read, hashed, listed or descended into),
//! and `mkdirat`, `unlinkat` and file creation name one component relative to a
//! directory fd reached that way. Walks read directory fds (getdents) and
//! `fstatat(AT_SYMLINK_NOFOLLOW)` each name, bounded in entries and depth.
//!
//! On top of that, every operation runs with the thread's filesystem identity
//! (`setfsuid`/`setfsgid`, no supplementary groups) set to the session's host
//! uid ([`Workspace::open`]'s `uid`, which owns the workspace): the kernel then
//! checks permissions as for the session's user and root's filesystem
//! capabilities are off, so even a mistake reaches only what that user could.
//! Files and directories made here are owned by that uid.
//!
//! Regular files with more than one link are refused for reads: a hard link may
//! name a file the client should not see.

use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode};
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::marker::PhantomData;
use std::ops::ControlFlow;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

mod walk;
pub use walk::{
    Found, Stat, Walked, MAX_DEPTH, MAX_HASH_FILE, MAX_HASH_TOTAL, MAX_WALK, MAX_WALK_NAME_BYTES, MAX_WALK_PATH_BYTES,
};

/// Longest path a route takes, in bytes (PATH_MAX): walks leave longer ones out,
/// so every path they report is one a route reaches.
pub const MAX_PATH: usize = 4096;

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
    #[error("{0} is a symbolic link, which the daemon never follows: name the real file or directory instead")]
    Link(String),
    #[error("{0} is not a directory")]
    NotDir(String),
    #[error("{0}: permission denied to the session's user: make it readable and writable from the sandbox (chmod)")]
    Denied(String),
    #[error("{0}: {1}")]
    Io(String, io::Error),
}

/// The workspace path a client's path in its text form ([`crate::names`]) names:
/// read back to bytes, then checked ([`validate`]).
pub fn path_of_text(text: &str) -> Result<PathBuf, Error> {
    validate(crate::names::parse(text))
}

/// Check a path (raw bytes, as [`crate::names`] reads them from a URL or a text):
/// relative, no `..`, `.` or empty parts, no NUL, at most [`MAX_PATH`] bytes and
/// 255 a part. Anything else a file name can hold is allowed (a backslash, `%`,
/// bytes that are not UTF-8): the daemon acts on one component at a time, so none
/// of it has a meaning here. Returns the path.
pub fn validate(path: impl AsRef<[u8]>) -> Result<PathBuf, Error> {
    let path = path.as_ref();
    let bad = |why: &str| {
        Error::InvalidPath(format!(
            "invalid path {:?}: {why}; use a relative path like `out/chart.png`",
            crate::names::text(path)
        ))
    };
    if path.is_empty() {
        return Err(bad("it is empty"));
    }
    if path.len() > MAX_PATH {
        return Err(bad(&format!("it is longer than {MAX_PATH} bytes")));
    }
    if path.contains(&0) {
        return Err(bad("it contains a NUL byte"));
    }
    if path.starts_with(b"/") {
        return Err(bad("absolute paths are not allowed"));
    }
    let mut out = PathBuf::new();
    for part in path.split(|b| *b == b'/') {
        match part {
            b"" => return Err(bad("it has an empty component")),
            b"." | b".." => return Err(bad("`.` and `..` are not allowed")),
            p if p.len() > 255 => return Err(bad("a component is longer than 255 bytes")),
            p => out.push(OsStr::from_bytes(p)),
        }
    }
    if out.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(bad("it is not a plain relative path"));
    }
    Ok(out)
}

/// A path as messages show it: its text form ([`crate::names`]), never lossy.
fn display(rel: &Path) -> String {
    crate::names::text(rel.as_os_str().as_bytes())
}

/// One path component as a C string (validated paths have no NUL).
fn cname(name: &OsStr, rel: &Path) -> Result<CString, Error> {
    CString::new(name.as_bytes()).map_err(|_| Error::InvalidPath(format!("{} contains a NUL byte", display(rel))))
}

/// The plain components of a validated relative path.
fn parts(rel: &Path) -> Result<Vec<&OsStr>, Error> {
    rel.components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(Error::InvalidPath(format!("{} is not a plain relative path", display(rel)))),
        })
        .collect()
}

fn how(flags: OFlag, mode: u32) -> OpenHow {
    OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK)
        .mode(Mode::from_bits_truncate(mode))
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS
                | ResolveFlag::RESOLVE_NO_XDEV,
        )
}

pub(super) fn is(st: &FileStat, kind: libc::mode_t) -> bool {
    (st.st_mode & libc::S_IFMT) == kind
}

/// Map an errno met at `rel` (whose last component was being opened).
fn at(rel: &Path, wanted_dir: bool) -> impl Fn(nix::Error) -> Error + '_ {
    move |e| match e {
        nix::Error::ENOENT => Error::NotFound(display(rel)),
        nix::Error::EEXIST => Error::Exists(display(rel)),
        nix::Error::ELOOP => Error::Link(display(rel)),
        nix::Error::ENOTDIR if wanted_dir => Error::NotDir(display(rel)),
        nix::Error::EXDEV | nix::Error::ENXIO | nix::Error::ENOTDIR | nix::Error::EISDIR => {
            Error::NotRegular(display(rel))
        }
        nix::Error::EACCES | nix::Error::EPERM => Error::Denied(display(rel)),
        other => Error::Io(display(rel), other.into()),
    }
}

/// Open the single component `name` in `dir` as a directory, checked with fstat.
pub(super) fn open_dir<Fd: AsFd>(dir: Fd, name: &CStr, rel: &Path) -> Result<OwnedFd, Error> {
    let fd = nix::fcntl::openat2(&dir, name, how(OFlag::O_RDONLY | OFlag::O_DIRECTORY, 0)).map_err(|e| {
        // O_DIRECTORY answers ENOTDIR for a symlink too: say which it is.
        let link = e == nix::Error::ENOTDIR
            && nix::sys::stat::fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| is(&st, libc::S_IFLNK));
        if link {
            Error::Link(display(rel))
        } else {
            at(rel, true)(e)
        }
    })?;
    let st = nix::sys::stat::fstat(&fd).map_err(at(rel, true))?;
    if !is(&st, libc::S_IFDIR) {
        return Err(Error::NotDir(display(rel)));
    }
    Ok(fd)
}

/// Open the single component `name` in `dir` as a regular file with `flags`,
/// checked with fstat; returns the fd and what fstat said.
pub(super) fn open_file<Fd: AsFd>(
    dir: Fd,
    name: &CStr,
    rel: &Path,
    flags: OFlag,
    mode: u32,
) -> Result<(File, FileStat), Error> {
    let fd = nix::fcntl::openat2(dir, name, how(flags, mode)).map_err(at(rel, false))?;
    let st = nix::sys::stat::fstat(&fd).map_err(at(rel, false))?;
    if !is(&st, libc::S_IFREG) {
        return Err(Error::NotRegular(display(rel)));
    }
    Ok((File::from(fd), st))
}

/// The calling thread's filesystem identity switched to a session's user (and
/// no supplementary groups) until dropped. Per thread: it must not cross an
/// `.await`, which is why it is neither `Send` nor held by anything async.
struct Identity {
    restore: Option<(u32, u32, Vec<rustix::thread::Gid>)>,
    _thread: PhantomData<*const ()>,
}

/// This thread's supplementary groups (the raw syscall, not glibc's wrapper,
/// which changes every thread's).
fn setgroups_thread(groups: &[rustix::thread::Gid]) -> io::Result<()> {
    rustix::thread::set_thread_groups(groups).map_err(io::Error::from)
}

impl Identity {
    fn assume(uid: u32) -> Result<Identity, Error> {
        let none = Identity { restore: None, _thread: PhantomData };
        // setfsuid answers the previous id; asking for an invalid one changes nothing.
        let fsuid = nix::unistd::setfsuid(nix::unistd::Uid::from_raw(u32::MAX)).as_raw();
        let fsgid = nix::unistd::setfsgid(nix::unistd::Gid::from_raw(u32::MAX)).as_raw();
        if fsuid == uid && fsgid == uid {
            return Ok(none);
        }
        if !nix::unistd::geteuid().is_root() {
            // Not root (a unit test): the kernel checks as our own user anyway.
            return Ok(none);
        }
        let groups: Vec<rustix::thread::Gid> = nix::unistd::getgroups()
            .map_err(|e| Error::Io("getgroups".into(), e.into()))?
            .into_iter()
            .map(|g| rustix::thread::Gid::from_raw_unchecked(g.as_raw()))
            .collect();
        let mut me = Identity { restore: Some((fsuid, fsgid, groups)), _thread: PhantomData };
        if let Some((_, _, groups)) = &me.restore {
            if !groups.is_empty() {
                setgroups_thread(&[]).map_err(|e| Error::Io("setgroups".into(), e))?;
            }
        }
        nix::unistd::setfsgid(nix::unistd::Gid::from_raw(uid));
        nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid));
        let now_uid = nix::unistd::setfsuid(nix::unistd::Uid::from_raw(u32::MAX)).as_raw();
        let now_gid = nix::unistd::setfsgid(nix::unistd::Gid::from_raw(u32::MAX)).as_raw();
        if now_uid != uid || now_gid != uid {
            let restore = me.restore.take();
            drop(Identity { restore, _thread: PhantomData });
            return Err(Error::Io("setfsuid".into(), io::Error::other(format!("could not act as uid {uid}"))));
        }
        Ok(me)
    }
}

impl Drop for Identity {
    fn drop(&mut self) {
        if let Some((uid, gid, groups)) = self.restore.take() {
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid));
            nix::unistd::setfsgid(nix::unistd::Gid::from_raw(gid));
            if !groups.is_empty() {
                if let Err(e) = setgroups_thread(&groups) {
                    tracing::error!(error = %e, "could not restore this thread's supplementary groups");
                }
            }
        }
    }
}

/// A session workspace root, opened once per operation.
pub struct Workspace {
    root: OwnedFd,
    uid: u32,
}

impl Workspace {
    /// Open the workspace directory `dir` (a path the daemon made, not one the
    /// sandbox can change) of a session whose host user is `uid`.
    pub fn open(dir: &Path, uid: u32) -> Result<Workspace, Error> {
        let root = nix::fcntl::open(
            dir,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| Error::Io(dir.display().to_string(), e.into()))?;
        Ok(Workspace { root, uid })
    }

    /// The directory `rel` (every component a real directory), as an fd.
    fn dir_at(&self, rel: &Path) -> Result<OwnedFd, Error> {
        let mut dir = self.root.try_clone().map_err(|e| Error::Io(display(rel), e))?;
        let mut sofar = PathBuf::new();
        for part in parts(rel)? {
            sofar.push(part);
            dir = open_dir(&dir, &cname(part, rel)?, &sofar)?;
        }
        Ok(dir)
    }

    /// The directory `rel`, made as needed (owned by the session's user), as an fd.
    fn mkdirs_at(&self, rel: &Path) -> Result<OwnedFd, Error> {
        let mut dir = self.root.try_clone().map_err(|e| Error::Io(display(rel), e))?;
        let mut sofar = PathBuf::new();
        for part in parts(rel)? {
            sofar.push(part);
            let name = cname(part, rel)?;
            dir = match open_dir(&dir, &name, &sofar) {
                Err(Error::NotFound(_)) => {
                    match nix::sys::stat::mkdirat(&dir, name.as_c_str(), Mode::from_bits_truncate(0o755)) {
                        Ok(()) | Err(nix::Error::EEXIST) => {}
                        Err(e) => return Err(at(&sofar, true)(e)),
                    }
                    let made = open_dir(&dir, &name, &sofar)?;
                    self.own(&made, &sofar)?;
                    made
                }
                other => other?,
            };
        }
        Ok(dir)
    }

    /// Give `fd` to the session's user, unless it already has it (it does when
    /// this thread acted as that user).
    fn own(&self, fd: &impl AsFd, rel: &Path) -> Result<(), Error> {
        let st = nix::sys::stat::fstat(fd).map_err(at(rel, false))?;
        if st.st_uid != self.uid || st.st_gid != self.uid {
            nix::unistd::fchown(fd, Some(self.uid.into()), Some(self.uid.into())).map_err(at(rel, false))?;
        }
        Ok(())
    }

    /// The parent's fd and the last component's name of `rel`.
    fn split(rel: &Path) -> Result<(&Path, CString), Error> {
        let name = rel.file_name().ok_or_else(|| Error::InvalidPath(format!("{} has no file name", display(rel))))?;
        Ok((rel.parent().unwrap_or(Path::new("")), cname(name, rel)?))
    }

    /// Open a regular file for reading; refuses links, directories, devices,
    /// FIFOs, sockets and multiply-linked files, in any component.
    pub fn open_read(&self, rel: &Path) -> Result<(File, Stat), Error> {
        let _as = Identity::assume(self.uid)?;
        let (parent, name) = Self::split(rel)?;
        let dir = self.dir_at(parent)?;
        let (file, st) = open_file(&dir, &name, rel, OFlag::O_RDONLY, 0)?;
        if st.st_nlink > 1 {
            return Err(Error::NotRegular(display(rel)));
        }
        Ok((file, Stat::of(&st)))
    }

    /// Create (or, with `overwrite`, replace) a regular file owned by the
    /// session's user, making parent directories as needed.
    pub fn create(&self, rel: &Path, overwrite: bool) -> Result<File, Error> {
        let _as = Identity::assume(self.uid)?;
        let (parent, name) = Self::split(rel)?;
        let dir = self.mkdirs_at(parent)?;
        let mut flags = OFlag::O_WRONLY | OFlag::O_CREAT;
        if !overwrite {
            flags |= OFlag::O_EXCL;
        }
        // Truncated only once it is known to be this workspace's own regular file.
        let (file, st) = open_file(&dir, &name, rel, flags, 0o644)?;
        if st.st_nlink > 1 {
            return Err(Error::NotRegular(display(rel)));
        }
        self.own(&file, rel)?;
        file.set_len(0).map_err(|e| Error::Io(display(rel), e))?;
        Ok(file)
    }

    /// Delete a file or link (never a directory), naming it in its parent's fd.
    pub fn remove(&self, rel: &Path) -> Result<(), Error> {
        let _as = Identity::assume(self.uid)?;
        let (parent, name) = Self::split(rel)?;
        let dir = self.dir_at(parent)?;
        let st =
            nix::sys::stat::fstatat(&dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW).map_err(at(rel, false))?;
        let is_dir =
            |rel: &Path| Error::InvalidPath(format!("{} is a directory; delete the files in it", display(rel)));
        if is(&st, libc::S_IFDIR) {
            return Err(is_dir(rel));
        }
        nix::unistd::unlinkat(&dir, name.as_c_str(), nix::unistd::UnlinkatFlags::NoRemoveDir).map_err(|e| match e {
            nix::Error::EISDIR => is_dir(rel),
            e => at(rel, false)(e),
        })
    }

    /// Call `visit` for every regular file below the root, in path order, until
    /// it breaks ([`walk`]: by fd, never following a link, bounded).
    pub fn walk(&self, mut visit: impl FnMut(&Found) -> ControlFlow<()>) -> Result<Walked, Error> {
        let _as = Identity::assume(self.uid)?;
        let root = self.root.try_clone().map_err(|e| Error::Io(".".into(), e))?;
        walk::walk(root, &mut visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn me() -> u32 {
        nix::unistd::getuid().as_raw()
    }

    #[test]
    fn accepts_plain_relative_paths() {
        assert_eq!(validate("a.txt").unwrap(), PathBuf::from("a.txt"));
        assert_eq!(validate("out/sub/c.png").unwrap(), PathBuf::from("out/sub/c.png"));
        assert_eq!(validate("..hidden").unwrap(), PathBuf::from("..hidden"));
        // Whatever a file name can hold: a route reaches every file a walk reports.
        for name in [&b"a\\..\\b"[..], b"%2e%2e%2fx", b"a%00", b"\xff\xfe/x", b"\x01\n"] {
            assert_eq!(validate(name).unwrap().as_os_str().as_bytes(), name);
        }
        let longest = vec!["d".repeat(255); 16].join("/");
        assert_eq!(validate(&longest).unwrap().as_os_str().len(), MAX_PATH - 1);
    }

    #[test]
    fn refuses_traversal_absolute_nul_and_empty_parts() {
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "a/./b", "a//b", "a/", "x\0y", ".", "..", "a/.."] {
            assert!(validate(bad).is_err(), "{bad:?} must be refused");
        }
        let too_long = format!("{}/xy", vec!["d".repeat(255); 16].join("/"));
        assert!(validate(too_long).is_err());
        assert!(validate("n".repeat(256)).is_err());
        // Messages name a path by its text form, whatever its bytes.
        let e = validate(b"\xff/../x").unwrap_err().to_string();
        assert!(e.starts_with("invalid path \"\\\\xff/../x\""), "{e}");
    }

    #[test]
    fn never_follows_symlinks_or_hardlinks() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        symlink(outside.path(), dir.path().join("link")).unwrap();
        symlink("/etc", dir.path().join("dirlink")).unwrap();
        std::fs::write(dir.path().join("real"), b"x").unwrap();
        std::fs::hard_link(dir.path().join("real"), dir.path().join("hard")).unwrap();
        let ws = Workspace::open(dir.path(), me()).unwrap();
        assert!(matches!(ws.open_read(Path::new("link")), Err(Error::Link(_))));
        assert!(matches!(ws.open_read(Path::new("dirlink/passwd")), Err(Error::Link(_))));
        assert!(matches!(ws.open_read(Path::new("hard")), Err(Error::NotRegular(_))));
        assert!(ws.create(Path::new("link"), true).is_err());
        assert!(matches!(ws.create(Path::new("dirlink/x"), true), Err(Error::Link(_))));
        assert!(matches!(ws.open_read(Path::new("missing")), Err(Error::NotFound(_))));
        // Overwriting a hard-linked file is refused before anything is truncated.
        assert!(matches!(ws.create(Path::new("hard"), true), Err(Error::NotRegular(_))));
        assert_eq!(std::fs::read(dir.path().join("real")).unwrap(), b"x");
    }

    #[test]
    fn create_refuses_to_clobber_without_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path(), me()).unwrap();
        ws.create(Path::new("d/e/f.txt"), false).unwrap();
        assert!(matches!(ws.create(Path::new("d/e/f.txt"), false), Err(Error::Exists(_))));
        ws.create(Path::new("d/e/f.txt"), true).unwrap();
        ws.remove(Path::new("d/e/f.txt")).unwrap();
        assert!(matches!(ws.remove(Path::new("d/e/f.txt")), Err(Error::NotFound(_))));
        assert!(matches!(ws.remove(Path::new("d/e")), Err(Error::InvalidPath(_))));
    }

    #[test]
    fn mkdirs_refuses_a_symlinked_component_and_writes_nothing_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        symlink(outside.path(), dir.path().join("real/a")).unwrap();
        symlink(outside.path(), dir.path().join("top")).unwrap();
        std::fs::write(dir.path().join("file"), b"x").unwrap();
        let ws = Workspace::open(dir.path(), me()).unwrap();
        assert!(matches!(ws.create(Path::new("top/new/x.txt"), false), Err(Error::Link(p)) if p == "top"));
        assert!(matches!(ws.create(Path::new("real/a/x.txt"), false), Err(Error::Link(p)) if p == "real/a"));
        assert!(matches!(ws.create(Path::new("file/x.txt"), false), Err(Error::NotDir(p)) if p == "file"));
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0, "nothing made outside");
        ws.create(Path::new("real/b/c/x.txt"), false).unwrap();
        assert!(dir.path().join("real/b/c/x.txt").is_file());
    }
}
