//! `/proc/self/mountinfo`, parsed once for everyone who needs the mount table
//! (cgroup discovery, workspace mounts, the rootfs, the host check).
//!
//! A line is `id parent major:minor root mount-point options [optional...] -
//! fstype source super-options` (proc(5)). Paths are written with spaces, tabs,
//! newlines and backslashes as octal escapes (`\040`, `\011`, `\012`, `\134`);
//! [`parse`] turns them back into the bytes they stand for.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// Where the calling process's mount table is.
pub const SELF: &str = "/proc/self/mountinfo";

/// One mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The directory of the filesystem that is mounted (`/` for a whole one).
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// Per-mount options (`rw`, `nosuid`, ...).
    pub options: Vec<String>,
    pub fstype: String,
    pub source: String,
    /// Per-superblock options (for cgroup v1: the controllers).
    pub super_options: Vec<String>,
}

impl Mount {
    /// Is `option` among the superblock options (a v1 cgroup controller, say)?
    pub fn has_super_option(&self, option: &str) -> bool {
        self.super_options.iter().any(|o| o == option)
    }
}

/// Parse a mount table. Lines that do not have the documented shape are skipped.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mount> {
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ');
    let _id = l.next()?;
    let _parent = l.next()?;
    let _dev = l.next()?;
    let root = l.next()?;
    let mount_point = l.next()?;
    let options = l.next()?;
    let mut r = right.split(' ');
    let fstype = r.next()?;
    let source = r.next()?;
    let super_options = r.next().unwrap_or("");
    let list = |s: &str| if s.is_empty() { vec![] } else { s.split(',').map(str::to_string).collect() };
    Some(Mount {
        root: unescape(root),
        mount_point: unescape(mount_point),
        options: list(options),
        fstype: unescape(fstype).to_string_lossy().into_owned(),
        source: unescape(source).to_string_lossy().into_owned(),
        super_options: list(super_options),
    })
}

/// Undo the kernel's octal escapes (`\ooo` → that byte); anything else is kept.
pub fn unescape(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let value = b[i + 1..i + 4].iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            if let Ok(byte) = u8::try_from(value) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(OsString::from_vec(out))
}

/// The calling process's mount table (empty when it cannot be read).
pub fn read_self() -> Vec<Mount> {
    std::fs::read_to_string(SELF).map(|t| parse(&t)).unwrap_or_default()
}

/// Is `path` a mount point in `mounts`?
pub fn is_mount_point(mounts: &[Mount], path: &Path) -> bool {
    mounts.iter().any(|m| m.mount_point == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
35 25 0:30 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,memory
36 25 0:31 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:15 - cgroup2 cgroup2 rw,nsdelegate
37 25 0:32 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
";

    #[test]
    fn parses_every_field() {
        let m = parse(HYBRID);
        assert_eq!(m.len(), 4);
        assert_eq!(
            m[1],
            Mount {
                root: "/".into(),
                mount_point: "/sys/fs/cgroup/memory".into(),
                options: ["rw", "nosuid", "nodev", "noexec", "relatime"].map(String::from).to_vec(),
                fstype: "cgroup".into(),
                source: "cgroup".into(),
                super_options: vec!["rw".into(), "memory".into()],
            }
        );
        assert_eq!(m[0].source, "/dev/sda1");
        assert_eq!(m[2].fstype, "cgroup2");
        assert!(m[3].has_super_option("cpu") && m[3].has_super_option("cpuacct") && !m[3].has_super_option("memory"));
        assert_eq!(m[3].mount_point, Path::new("/sys/fs/cgroup/cpu,cpuacct"));
    }

    #[test]
    fn optional_fields_may_be_absent_or_many() {
        let m = parse(
            "1 0 0:1 / /a rw - tmpfs none rw\n2 0 0:2 / /b rw shared:3 master:4 propagate_from:5 - tmpfs none rw\n",
        );
        assert_eq!(m.iter().map(|m| m.mount_point.clone()).collect::<Vec<_>>(), [PathBuf::from("/a"), "/b".into()]);
        assert!(m.iter().all(|m| m.fstype == "tmpfs"));
    }

    #[test]
    fn unescapes_octal() {
        let m = parse("40 22 7:0 /sub\\040dir /srv/my\\040sessions/a\\011b\\012c\\134d/data rw - ext4 /dev/loop0 rw\n");
        assert_eq!(m[0].root, Path::new("/sub dir"));
        assert_eq!(m[0].mount_point, Path::new("/srv/my sessions/a\tb\nc\\d/data"));
        // Not an escape: kept as it is.
        assert_eq!(unescape("a\\09b\\"), Path::new("a\\09b\\"));
        assert_eq!(unescape("\\777x"), Path::new("\\777x"));
        // Bytes that are not UTF-8 survive.
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(unescape("\\377").as_os_str().as_bytes(), [0xff]);
    }

    #[test]
    fn skips_malformed_lines() {
        assert!(parse("").is_empty());
        assert!(parse("garbage\n1 2 3\n1 0 0:1 / /x rw -\n").is_empty());
        assert_eq!(parse("1 0 0:1 / /x rw - proc proc\n")[0].super_options, Vec::<String>::new());
    }

    #[test]
    fn finds_mount_points() {
        let m = parse(HYBRID);
        assert!(is_mount_point(&m, Path::new("/sys/fs/cgroup/unified")));
        assert!(!is_mount_point(&m, Path::new("/sys/fs/cgroup")));
    }

    #[test]
    fn reads_this_process() {
        assert!(read_self().iter().any(|m| m.mount_point == Path::new("/")));
    }
}
