//! Files from a sandbox written onto the operator's disk (`sandboxctl run --save`,
//! `sandboxctl files get -o`): streamed with bounded memory, holes kept as holes,
//! within a byte budget per command, and never left half-written.
//!
//! What a sandbox writes costs it little: a sparse file of any size up to its
//! `file_size_mb` takes no space in its workspace. Read whole and written byte for
//! byte, three sparse 300 MiB files once became 901 MB on the operator's disk, at
//! 629 MB of memory. Here each download goes to its file as it arrives
//! ([`Sparse`]: a block of zeros becomes a seek, and the length is set at the
//! end), counted against the command's [`Budget`] (`--max-bytes`), into a
//! temporary name that is renamed into place only once whole ([`Pending`]; a
//! failure removes it).
//!
//! The names come from the sandbox. `--save DIR` makes each file below `DIR`
//! ([`SaveDir`]): the name must be a plain relative path
//! ([`crate::workspace::validate`]: no `..`, no absolute path), and each directory
//! on the way is opened from the one before with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)`, so a symlink already in the operator's directory is
//! never followed somewhere else.

use crate::client::{ClientError, Download};
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};

/// A run of zeros this long, aligned in the file, becomes a hole (the usual
/// filesystem block).
pub const BLOCK: usize = 4096;

/// What `--max-bytes` is when not given: 1 GiB (the default policy's workspace).
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "{name}: saving it would write more than {limit} bytes in this command (--max-bytes); nothing of it was \
         kept: pass a larger --max-bytes, or fetch the files you need one at a time with `sandboxctl files get`"
    )]
    OverBudget { name: String, limit: u64 },
    #[error(
        "the run's {count} files hold {total} bytes, more than --max-bytes ({limit}); nothing was saved: pass a \
         larger --max-bytes, or fetch the files you need one at a time with `sandboxctl files get`"
    )]
    RunOverBudget { count: usize, total: u64, limit: u64 },
    #[error("{name}: {why}")]
    Name { name: String, why: String },
    #[error(
        "{count} of the run's {of} files were not saved (named above): fetch them with `sandboxctl files get \
         SESSION PATH -o FILE` from a session given with --session or kept with --keep"
    )]
    NotSaved { count: usize, of: usize },
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error(transparent)]
    Client(#[from] ClientError),
}

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::Io(what.to_string(), e)
}

fn errno(what: impl std::fmt::Display) -> impl FnOnce(Errno) -> Error {
    move |e| Error::Io(what.to_string(), e.into())
}

/// A name sandboxed code chose, for a terminal: control characters (escape
/// sequences, newlines) are shown escaped, never sent to the terminal as they are.
pub fn printable(name: &str) -> std::borrow::Cow<'_, str> {
    if name.chars().any(char::is_control) {
        std::borrow::Cow::Owned(
            name.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect(),
        )
    } else {
        std::borrow::Cow::Borrowed(name)
    }
}

/// The bytes one command may still write (a file's length, holes included).
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    limit: u64,
    used: u64,
}

impl Budget {
    pub fn new(limit: u64) -> Budget {
        Budget { limit, used: 0 }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Whether `n` more bytes fit.
    pub fn fits(&self, n: u64) -> bool {
        self.used.saturating_add(n) <= self.limit
    }

    fn take(&mut self, n: u64, name: &str) -> Result<(), Error> {
        if !self.fits(n) {
            return Err(Error::OverBudget { name: name.to_string(), limit: self.limit });
        }
        self.used += n;
        Ok(())
    }
}

/// A size on the command line: bytes, or a number with K, M, G or T (powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("{text:?}: use bytes, or a number with K, M, G or T (e.g. 500M)")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 =
        digits.parse().map_err(|_| format!("{text:?}: use bytes, or a number with K, M, G or T (e.g. 500M)"))?;
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("{text:?} is too large"))
}

/// A file written as it arrives, with every aligned [`BLOCK`] of zeros left as a
/// hole: memory holds at most one block beyond the chunk being written.
pub struct Sparse<'a> {
    file: &'a File,
    /// The file's length so far (written and skipped).
    pos: u64,
    /// The start of a block not yet whole.
    carry: Vec<u8>,
}

impl<'a> Sparse<'a> {
    pub fn new(file: &'a File) -> Sparse<'a> {
        Sparse { file, pos: 0, carry: Vec::with_capacity(BLOCK) }
    }

    pub fn write(&mut self, mut data: &[u8]) -> std::io::Result<()> {
        if !self.carry.is_empty() {
            let take = (BLOCK - self.carry.len()).min(data.len());
            self.carry.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.carry.len() < BLOCK {
                return Ok(());
            }
            let block = std::mem::take(&mut self.carry);
            self.put(&block)?;
        }
        let whole = data.len() / BLOCK * BLOCK;
        self.put(&data[..whole])?;
        self.carry.extend_from_slice(&data[whole..]);
        Ok(())
    }

    /// `data` at the end of what is written (whole blocks, or the file's last
    /// part): each run of blocks with data in one write, blocks of zeros skipped.
    fn put(&mut self, data: &[u8]) -> std::io::Result<()> {
        let mut run = 0;
        for (i, block) in data.chunks(BLOCK).enumerate() {
            let at = i * BLOCK;
            if block.iter().all(|&b| b == 0) {
                if run < at {
                    self.file.write_all_at(&data[run..at], self.pos + run as u64)?;
                }
                run = at + block.len();
            }
        }
        if run < data.len() {
            self.file.write_all_at(&data[run..], self.pos + run as u64)?;
        }
        self.pos += data.len() as u64;
        Ok(())
    }

    /// Write what is left and set the file's length (a hole at its end too).
    pub fn finish(mut self) -> std::io::Result<u64> {
        let last = std::mem::take(&mut self.carry);
        self.put(&last)?;
        self.file.set_len(self.pos)?;
        Ok(self.pos)
    }
}

/// A file being written under a temporary name in its directory:
/// [`Pending::commit`] renames it into place; dropped before that, it is removed.
pub struct Pending {
    dir: OwnedFd,
    name: OsString,
    temp: OsString,
    file: File,
    shown: String,
    committed: bool,
}

impl Pending {
    fn create_in(dir: OwnedFd, name: &OsStr, shown: String) -> Result<Pending, Error> {
        let temp = OsString::from(format!(".sandboxctl-{}.part", uuid::Uuid::new_v4().simple()));
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&dir, &temp, flags, Mode::from_raw_mode(0o666)).map_err(errno(&shown))?;
        Ok(Pending { dir, name: name.to_os_string(), temp, file: File::from(fd), shown, committed: false })
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// The file is whole: give it its name (replacing what had it; a symlink
    /// there is replaced, never followed).
    pub fn commit(mut self) -> Result<(), Error> {
        rustix::fs::renameat(&self.dir, &self.temp, &self.dir, &self.name).map_err(errno(&self.shown))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.committed {
            let _ = rustix::fs::unlinkat(&self.dir, &self.temp, AtFlags::empty());
        }
    }
}

/// The directory `--save` writes into, opened once; every file is made below it.
pub struct SaveDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl SaveDir {
    /// Open `path` (made if missing), the operator's own choice of directory.
    pub fn open(path: &Path) -> Result<SaveDir, Error> {
        std::fs::create_dir_all(path).map_err(io(path.display()))?;
        let fd = rustix::fs::open(path, OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
            .map_err(errno(path.display()))?;
        Ok(SaveDir { fd, path: path.to_path_buf() })
    }

    /// A new file at `name` (a sandbox's name for it, in its text form: see
    /// [`crate::names`]; saved under the raw bytes it stands for) below this
    /// directory: the directories on its way are made, or opened without following
    /// a symlink.
    pub fn create(&self, name: &str) -> Result<Pending, Error> {
        let refused = |why: &str| Error::Name { name: printable(name).into_owned(), why: why.to_string() };
        let rel = crate::workspace::path_of_text(name).map_err(|e| refused(&e.to_string()))?;
        let parts: Vec<&OsStr> = rel
            .components()
            .map(|c| match c {
                Component::Normal(part) => Ok(part),
                _ => Err(refused("not a plain relative path")),
            })
            .collect::<Result<_, _>>()?;
        let Some((file, dirs)) = parts.split_last() else { return Err(refused("it is empty")) };
        let shown = printable(&self.path.join(&rel).display().to_string()).into_owned();
        let mut dir = rustix::io::dup(&self.fd).map_err(errno(self.path.display()))?;
        for part in dirs {
            dir = match beneath(&dir, part) {
                Err(Errno::NOENT) => {
                    match rustix::fs::mkdirat(&dir, *part, Mode::from_raw_mode(0o777)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(errno(&shown)(e)),
                    }
                    beneath(&dir, part)
                }
                other => other,
            }
            .map_err(|e| match e {
                Errno::LOOP | Errno::XDEV => refused(SYMLINK),
                // What is there is not a directory: a file, or a symlink to anything.
                Errno::NOTDIR => match rustix::fs::statat(&dir, *part, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink => {
                        refused(SYMLINK)
                    }
                    _ => refused("a directory on its way is a file in the save directory"),
                },
                e => errno(&shown)(e),
            })?;
        }
        Pending::create_in(dir, file, shown)
    }
}

const SYMLINK: &str = "a directory on its way is a symlink in the save directory: not followed";

/// Directory `name` in `dir`, never through a symlink or out of `dir`.
fn beneath(dir: &OwnedFd, name: &OsStr) -> rustix::io::Result<OwnedFd> {
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat2(dir, name, flags, Mode::empty(), resolve)
}

/// A new file at `path`, the operator's own choice (`files get -o`): a symlink
/// there is the operator's, and is followed to name the file.
pub fn create_at(path: &Path) -> Result<Pending, Error> {
    let resolved = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(path).map_err(io(path.display()))?,
        _ => path.to_path_buf(),
    };
    let name = resolved
        .file_name()
        .ok_or_else(|| Error::Name { name: path.display().to_string(), why: "name a file to write".into() })?;
    let parent = match resolved.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = rustix::fs::open(parent, OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
        .map_err(errno(parent.display()))?;
    Pending::create_in(dir, name, path.display().to_string())
}

/// Receive `download` into `into` within `budget`, and give it its name once it
/// is whole: on any failure (the budget, the disk, the connection) nothing of it
/// is left. Returns its length.
pub async fn save(download: &mut Download, into: Pending, budget: &mut Budget, name: &str) -> Result<u64, Error> {
    if let Some(size) = download.size {
        if !budget.fits(size) {
            return Err(Error::OverBudget { name: name.to_string(), limit: budget.limit() });
        }
    }
    let mut sparse = Sparse::new(into.file());
    while let Some(chunk) = download.chunk().await? {
        budget.take(chunk.len() as u64, name)?;
        sparse.write(&chunk).map_err(io(&into.shown))?;
    }
    let length = sparse.finish().map_err(io(&into.shown))?;
    into.commit()?;
    Ok(length)
}

/// Receive `download` into `out` (stdout, a device) as it arrives, within `budget`.
pub async fn stream(
    download: &mut Download,
    out: &mut impl std::io::Write,
    budget: &mut Budget,
    name: &str,
) -> Result<u64, Error> {
    if let Some(size) = download.size {
        if !budget.fits(size) {
            return Err(Error::OverBudget { name: name.to_string(), limit: budget.limit() });
        }
    }
    let mut length = 0;
    while let Some(chunk) = download.chunk().await? {
        budget.take(chunk.len() as u64, name)?;
        out.write_all(&chunk).map_err(io(name))?;
        length += chunk.len() as u64;
    }
    out.flush().map_err(io(name))?;
    Ok(length)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn sparse_copy(parts: &[&[u8]]) -> (Vec<u8>, u64) {
        let dir = tempfile::tempdir().unwrap();
        let file = File::create(dir.path().join("f")).unwrap();
        let mut w = Sparse::new(&file);
        for p in parts {
            w.write(p).unwrap();
        }
        w.finish().unwrap();
        let meta = file.metadata().unwrap();
        (std::fs::read(dir.path().join("f")).unwrap(), meta.blocks() * 512)
    }

    #[test]
    fn zeros_become_holes_and_data_stays_in_place() {
        let mut data = vec![0u8; 10 * BLOCK + 17];
        data[3 * BLOCK + 5] = 7; // one block with data
        data[10 * BLOCK + 16] = 9; // and the file's last, partial block
                                   // In uneven chunks, as they come off a connection.
        let parts: Vec<&[u8]> = vec![&data[..100], &data[100..5000], &data[5000..20_001], &data[20_001..]];
        let (back, on_disk) = sparse_copy(&parts);
        assert_eq!(back, data);
        assert!(on_disk <= 2 * BLOCK as u64 * 2, "{on_disk} bytes on disk");
    }

    #[test]
    fn a_file_of_zeros_is_all_hole_with_its_length() {
        let zeros = vec![0u8; 64 * BLOCK + 3];
        let (back, on_disk) = sparse_copy(&[&zeros]);
        assert_eq!(back.len(), zeros.len());
        assert!(back.iter().all(|&b| b == 0));
        assert_eq!(on_disk, 0);
        let (back, _) = sparse_copy(&[]);
        assert!(back.is_empty());
    }

    #[test]
    fn the_budget_counts_lengths() {
        let mut b = Budget::new(10);
        assert!(b.take(6, "a").is_ok());
        assert!(b.fits(4) && !b.fits(5));
        assert!(matches!(b.take(5, "b"), Err(Error::OverBudget { limit: 10, .. })));
    }

    #[test]
    fn sizes_read_like_people_write_them() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("500M"), Ok(500 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("2K"), Ok(2048));
        assert!(parse_size("1.5G").is_err() && parse_size("12Q").is_err() && parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn names_stay_below_the_save_directory_and_symlinks_are_not_followed() {
        use std::os::unix::ffi::OsStrExt;
        let base = tempfile::tempdir().unwrap();
        let outside = base.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        let save = SaveDir::open(&base.path().join("save")).unwrap();
        std::os::unix::fs::symlink(&outside, base.path().join("save/link")).unwrap();
        for bad in ["../x", "/etc/x", "a/../../x", "link/x", ""] {
            assert!(matches!(save.create(bad), Err(Error::Name { .. })), "{bad:?}");
        }
        let why = save.create("link/x").err().unwrap().to_string();
        assert!(why.contains("is a symlink in the save directory: not followed"), "{why}");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        // A symlink at the file's own name is replaced, not written through.
        std::os::unix::fs::symlink(outside.join("target"), base.path().join("save/f")).unwrap();
        let p = save.create("sub/dir/g").unwrap();
        p.file().write_all_at(b"x", 0).unwrap();
        p.commit().unwrap();
        let p = save.create("f").unwrap();
        p.commit().unwrap();
        assert!(!outside.join("target").exists());
        assert!(std::fs::symlink_metadata(base.path().join("save/f")).unwrap().is_file());
        assert_eq!(std::fs::read(base.path().join("save/sub/dir/g")).unwrap(), b"x");
        // A name in its text form is saved under the bytes it stands for: one file.
        save.create("back\\\\..\\\\slash\\xff").unwrap().commit().unwrap();
        let raw = std::ffi::OsStr::from_bytes(b"back\\..\\slash\xff");
        assert!(std::fs::symlink_metadata(base.path().join("save").join(raw)).unwrap().is_file());
        std::fs::remove_file(base.path().join("save").join(raw)).unwrap();
        // A pending file dropped before its commit leaves nothing.
        drop(save.create("h").unwrap());
        let mut left: Vec<_> =
            std::fs::read_dir(base.path().join("save")).unwrap().map(|e| e.unwrap().file_name()).collect();
        left.sort();
        assert_eq!(left, ["f", "link", "sub"]);
    }
}
