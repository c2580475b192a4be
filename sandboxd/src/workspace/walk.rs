//! Walking a workspace: every regular file below its root, by directory fds,
//! never following a link, in path order, within bounds the sandbox cannot push.
//!
//! Each directory's names are read whole (getdents) before any is looked at, so a
//! level holds one fd while its subdirectories are walked; they are then sorted by
//! their bytes, which makes the walk's order the order of paths compared component
//! by component (`a/x` before `a.txt`), the order listings promise. Each name is
//! looked at with `fstatat(AT_SYMLINK_NOFOLLOW)` and descended into only as a
//! directory opened by fd ([`super::open_dir`]).
//!
//! Sandboxed code chooses how many names there are, how long, how deep (hard
//! links cost no space), so a walk reads at most [`MAX_WALK`] names and
//! [`MAX_WALK_NAME_BYTES`] of them, reports at most [`MAX_WALK_PATH_BYTES`] of
//! paths, none longer than [`super::MAX_PATH`], and descends [`MAX_DEPTH`] levels;
//! past any of these it says it is partial. The visitor may stop it too (a
//! listing that is full).

use super::{open_dir, open_file, Error, MAX_PATH};
use nix::dir::Dir;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::FileStat;
use sha2::{Digest, Sha256};
use std::ffi::{CStr, OsStr};
use std::io::{self, Read};
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Most directory entries looked at in one walk; a bigger workspace is walked partly.
pub const MAX_WALK: usize = 200_000;
/// Most bytes of names one walk reads (and holds while it descends): with
/// [`MAX_WALK`] names of 255 bytes, a directory of hard links would otherwise
/// cost 50 MB to read.
pub const MAX_WALK_NAME_BYTES: usize = 8 * 1024 * 1024;
/// Most bytes of file paths one walk reports in all (what a snapshot of the
/// workspace keeps, and a bound on a listing's size besides its own).
pub const MAX_WALK_PATH_BYTES: usize = 4 * 1024 * 1024;
/// Deepest directory a walk descends into (it holds one fd per level).
pub const MAX_DEPTH: usize = 64;
/// Largest file hashed.
pub const MAX_HASH_FILE: u64 = 64 * 1024 * 1024;
/// Most bytes hashed by one snapshot (or one comparison) in all.
pub const MAX_HASH_TOTAL: u64 = 256 * 1024 * 1024;

/// What a walk found for one regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub ino: u64,
    pub size: u64,
    pub nlink: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl Stat {
    pub(super) fn of(st: &FileStat) -> Stat {
        let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
        Stat {
            ino: st.st_ino,
            size: st.st_size.max(0) as u64,
            nlink: st.st_nlink,
            mtime_ns: ns(st.st_mtime, st.st_mtime_nsec),
            ctime_ns: ns(st.st_ctime, st.st_ctime_nsec),
        }
    }

    pub fn modified(&self) -> SystemTime {
        let ns = self.mtime_ns.max(0);
        SystemTime::UNIX_EPOCH
            + Duration::from_secs((ns / 1_000_000_000) as u64)
            + Duration::from_nanos((ns % 1_000_000_000) as u64)
    }
}

/// A regular file met by a walk, with its directory's fd for hashing.
pub struct Found<'a> {
    dir: BorrowedFd<'a>,
    name: &'a CStr,
    /// Its path below the workspace's root, as raw bytes.
    pub path: &'a Path,
    pub stat: Stat,
}

impl Found<'_> {
    /// SHA-256 of the file's bytes, if it is still the regular file the walk
    /// listed (same inode and size), at most [`MAX_HASH_FILE`] long, and fits in
    /// `budget` (bytes left to hash; what is read is taken from it).
    pub fn sha256(&self, budget: &mut u64) -> Option<[u8; 32]> {
        let size = self.stat.size;
        if size > MAX_HASH_FILE || size > *budget {
            return None;
        }
        let (file, st) = open_file(self.dir, self.name, self.path, OFlag::O_RDONLY, 0).ok()?;
        if st.st_ino != self.stat.ino || st.st_size.max(0) as u64 != size {
            return None;
        }
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut read = 0u64;
        // One byte more than listed tells a file that grew meanwhile.
        let mut limited = file.take(size + 1);
        loop {
            let n = match limited.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return None,
            };
            read += n as u64;
            *budget = budget.saturating_sub(n as u64);
            hasher.update(&buf[..n]);
        }
        (read == size).then(|| hasher.finalize().into())
    }
}

/// How a walk ended.
#[derive(Debug, Default, Clone, Copy)]
pub struct Walked {
    /// Entries were left out: past one of the walk's bounds (see the module doc),
    /// or the visitor stopped it.
    pub partial: bool,
}

/// One directory's names, read whole, in one buffer (each NUL-terminated).
#[derive(Default)]
struct Names {
    bytes: Vec<u8>,
    starts: Vec<u32>,
}

impl Names {
    fn push(&mut self, name: &CStr) {
        // The walk's name budget keeps offsets far below u32::MAX.
        self.starts.push(self.bytes.len() as u32);
        self.bytes.extend_from_slice(name.to_bytes_with_nul());
    }

    fn get(&self, i: usize) -> &CStr {
        let start = self.starts.get(i).map_or(self.bytes.len(), |s| *s as usize);
        self.bytes.get(start..).and_then(|b| CStr::from_bytes_until_nul(b).ok()).unwrap_or(c"")
    }

    /// In byte order: the order of paths compared component by component.
    fn sort(&mut self) {
        let mut order: Vec<usize> = (0..self.starts.len()).collect();
        order.sort_unstable_by(|a, b| self.get(*a).cmp(self.get(*b)));
        self.starts = order.into_iter().map(|i| self.starts[i]).collect();
    }

    fn len(&self) -> usize {
        self.starts.len()
    }
}

struct WalkState {
    seen: usize,
    name_bytes: usize,
    path_bytes: usize,
    partial: bool,
}

/// Walk the tree below `root` (see the module doc), calling `visit` for each
/// regular file until it breaks.
pub(super) fn walk(root: OwnedFd, visit: &mut dyn FnMut(&Found) -> ControlFlow<()>) -> Result<Walked, Error> {
    let mut state = WalkState { seen: 0, name_bytes: 0, path_bytes: 0, partial: false };
    let _ = walk_dir(root, &mut PathBuf::new(), 0, &mut state, visit);
    Ok(Walked { partial: state.partial })
}

fn walk_dir(
    fd: OwnedFd,
    rel: &mut PathBuf,
    depth: usize,
    state: &mut WalkState,
    visit: &mut dyn FnMut(&Found) -> ControlFlow<()>,
) -> ControlFlow<()> {
    let Ok(mut dir) = Dir::from_fd(fd) else { return ControlFlow::Continue(()) };
    let mut names = Names::default();
    for entry in dir.iter() {
        let Ok(entry) = entry else { break };
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        state.seen += 1;
        state.name_bytes += name.to_bytes_with_nul().len();
        if state.seen > MAX_WALK || state.name_bytes > MAX_WALK_NAME_BYTES {
            state.partial = true;
            break;
        }
        names.push(name);
    }
    names.sort();
    for i in 0..names.len() {
        let name = names.get(i);
        rel.push(OsStr::from_bytes(name.to_bytes()));
        let flow = match nix::sys::stat::fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if super::is(&st, libc::S_IFREG) => {
                let len = rel.as_os_str().len();
                state.path_bytes += if len > MAX_PATH { 0 } else { len };
                if len > MAX_PATH {
                    // No route takes a path this long: not listed, not reported.
                    state.partial = true;
                    ControlFlow::Continue(())
                } else if state.path_bytes > MAX_WALK_PATH_BYTES {
                    state.partial = true;
                    ControlFlow::Break(())
                } else {
                    let flow = visit(&Found { dir: dir.as_fd(), name, path: rel, stat: Stat::of(&st) });
                    state.partial |= flow.is_break();
                    flow
                }
            }
            Ok(st) if super::is(&st, libc::S_IFDIR) => {
                if depth + 1 >= MAX_DEPTH || rel.as_os_str().len() >= MAX_PATH {
                    state.partial = true;
                    ControlFlow::Continue(())
                } else if let Ok(sub) = open_dir(&dir, name, rel) {
                    walk_dir(sub, rel, depth + 1, state, visit)
                } else {
                    // Swapped for a link meanwhile: openat2 refuses it, skipped.
                    ControlFlow::Continue(())
                }
            }
            // Links, FIFOs, sockets, devices, or gone: never listed.
            _ => ControlFlow::Continue(()),
        };
        rel.pop();
        flow?;
    }
    ControlFlow::Continue(())
}

#[cfg(test)]
mod tests {
    use super::super::{Workspace, MAX_PATH};
    use super::*;
    use nix::sys::stat::Mode;
    use std::os::unix::fs::symlink;

    fn me() -> u32 {
        nix::unistd::getuid().as_raw()
    }

    fn files(ws: &Workspace) -> (Vec<(PathBuf, Stat)>, Walked) {
        let mut out = vec![];
        let walked = ws
            .walk(|f| {
                out.push((f.path.to_path_buf(), f.stat));
                ControlFlow::Continue(())
            })
            .unwrap();
        (out, walked)
    }

    fn listed(ws: &Workspace) -> Vec<String> {
        files(ws).0.into_iter().map(|(p, _)| p.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn a_walk_stops_at_its_path_budget_and_says_it_is_partial() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b"), b"x").unwrap();
        // Hard links with 250-byte names: more path bytes than one walk reports.
        let long = "n".repeat(245);
        let count = MAX_WALK_PATH_BYTES / 250 + 100;
        for i in 0..count {
            std::fs::hard_link(dir.path().join("b"), dir.path().join(format!("{long}{i:05}"))).unwrap();
        }
        let ws = Workspace::open(dir.path(), me()).unwrap();
        let (files, walked) = files(&ws);
        assert!(walked.partial);
        let bytes: usize = files.iter().map(|(p, _)| p.as_os_str().len()).sum();
        assert!(bytes <= MAX_WALK_PATH_BYTES && files.len() < count + 1, "{} files, {bytes} bytes", files.len());
        assert!(files.len() > count - 200, "the walk reports up to its budget: {}", files.len());
        // What it reports is the first part, in path order.
        assert_eq!(files[0].0, PathBuf::from("b"));
        assert!(files.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn a_walk_reads_a_bounded_number_of_name_bytes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b"), b"x").unwrap();
        // Symlinks with 255-byte names: never reported, but their names are read.
        let fit = MAX_WALK_NAME_BYTES / 256 - 10;
        let name = |i: usize| dir.path().join(format!("{i:06}{}", "m".repeat(249)));
        for i in 0..fit {
            symlink("b", name(i)).unwrap();
        }
        let ws = Workspace::open(dir.path(), me()).unwrap();
        let (found, walked) = files(&ws);
        assert!(!walked.partial && found.len() == 1, "{}", found.len());
        for i in fit..fit + 20 {
            symlink("b", name(i)).unwrap();
        }
        let (_, walked) = files(&ws);
        assert!(walked.partial, "past {MAX_WALK_NAME_BYTES} bytes of names, well below {MAX_WALK} names");
    }

    #[test]
    fn a_walk_goes_in_path_order_and_its_visitor_may_stop_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/x")).unwrap();
        for f in ["a.txt", "a/x/1", "a/b", "a-", "b", "A"] {
            std::fs::write(root.join(f), b"1").unwrap();
        }
        let ws = Workspace::open(root, me()).unwrap();
        assert_eq!(listed(&ws), ["A", "a/b", "a/x/1", "a-", "a.txt", "b"]);
        let mut seen = vec![];
        let walked = ws
            .walk(|f| {
                seen.push(f.path.to_path_buf());
                if seen.len() == 3 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .unwrap();
        assert!(walked.partial);
        assert_eq!(seen, ["A", "a/b", "a/x/1"].map(PathBuf::from));
        let (all, walked) = files(&ws);
        assert!(!walked.partial && all.len() == 6);
    }

    #[test]
    fn a_path_longer_than_any_route_takes_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        // 16 levels of 250-byte names: 4015 bytes, made fd by fd (the absolute path
        // is past PATH_MAX). Below it, "short" fits in MAX_PATH, a 255-byte name not.
        let part = "d".repeat(250);
        let mut fd: OwnedFd = nix::fcntl::open(dir.path(), OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        for _ in 0..16 {
            nix::sys::stat::mkdirat(&fd, part.as_str(), Mode::from_bits_truncate(0o755)).unwrap();
            fd = nix::fcntl::openat(&fd, part.as_str(), OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        }
        let long = "n".repeat(255);
        for name in ["short", long.as_str()] {
            nix::fcntl::openat(&fd, name, OFlag::O_CREAT | OFlag::O_WRONLY, Mode::from_bits_truncate(0o644)).unwrap();
        }
        let ws = Workspace::open(dir.path(), me()).unwrap();
        let (files, walked) = files(&ws);
        assert!(walked.partial);
        assert_eq!(files.len(), 1, "{files:?}");
        assert!(files[0].0.ends_with("short") && files[0].0.as_os_str().len() == 4021);
        const { assert!(4015 + 256 > MAX_PATH) };
    }

    #[test]
    fn walk_lists_regular_files_only_and_never_follows_links() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("host-secret"), b"s").unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
        std::fs::write(root.join("sub/deeper/a.csv"), b"1").unwrap();
        std::fs::write(root.join("top.txt"), b"2").unwrap();
        symlink(outside.path(), root.join("sub/dirlink")).unwrap();
        symlink(outside.path().join("host-secret"), root.join("filelink")).unwrap();
        nix::unistd::mkfifo(&root.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
        let ws = Workspace::open(root, me()).unwrap();
        assert_eq!(listed(&ws), vec!["sub/deeper/a.csv", "top.txt"]);
    }

    #[test]
    fn never_hashes_or_blocks_on_a_fifo_swapped_in_after_listing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("f"), b"abc").unwrap();
        let ws = Workspace::open(root, me()).unwrap();
        let mut hashes = vec![];
        ws.walk(|found| {
            // The name becomes a FIFO between the listing and the open.
            std::fs::remove_file(root.join("f")).unwrap();
            nix::unistd::mkfifo(&root.join("f"), Mode::from_bits_truncate(0o600)).unwrap();
            let mut budget = MAX_HASH_TOTAL;
            hashes.push(found.sha256(&mut budget));
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(hashes, vec![None]);
        // And a symlink to a FIFO outside is never opened either.
        let outside = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(&outside.path().join("p"), Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::remove_file(root.join("f")).unwrap();
        std::fs::write(root.join("f"), b"abc").unwrap();
        let mut hashes = vec![];
        ws.walk(|found| {
            std::fs::remove_file(root.join("f")).unwrap();
            symlink(outside.path().join("p"), root.join("f")).unwrap();
            let mut budget = MAX_HASH_TOTAL;
            hashes.push(found.sha256(&mut budget));
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(hashes, vec![None]);
    }

    #[test]
    fn hashing_is_bounded_in_total() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..4 {
            std::fs::write(dir.path().join(format!("f{i}")), vec![b'x'; 1000]).unwrap();
        }
        let ws = Workspace::open(dir.path(), me()).unwrap();
        let mut budget = 2500u64;
        let mut hashed = 0;
        ws.walk(|f| {
            hashed += usize::from(f.sha256(&mut budget).is_some());
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(hashed, 2, "two files of 1000 bytes fit in 2500");
        assert_eq!(budget, 500);
    }

    #[test]
    fn walks_are_bounded_in_depth() {
        let dir = tempfile::tempdir().unwrap();
        let mut deep = dir.path().to_path_buf();
        for _ in 0..MAX_DEPTH + 5 {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("deep.txt"), b"x").unwrap();
        std::fs::write(dir.path().join("shallow.txt"), b"x").unwrap();
        let ws = Workspace::open(dir.path(), me()).unwrap();
        let (files, walked) = files(&ws);
        assert!(walked.partial);
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].0, PathBuf::from("shallow.txt"));
    }
}
