//! The host disk shared among the sessions in use, so that a disk that really
//! fills is answered in each session (`ENOSPC` to the writing process) and never
//! by the kernel's I/O errors.
//!
//! Workspaces are sparse images (`workspace_overcommit` lets their sizes add up
//! to more than the disk has free): what a session writes is allocated on the
//! host only when its loop device writes it back, and a host disk full then is an
//! I/O error under the session's ext4 (a write that seemed to succeed is lost, the
//! filesystem may turn read-only). So each mounted image's ext4 is told how much
//! more it may take: its `reserved_clusters` (`/sys/fs/ext4/<device>`, which
//! ext4 holds back from every writer, root included) are raised until its free
//! room is its share of what the host has free, and a write past that is `ENOSPC`
//! at `write(2)` (ext4 reserves a block when it is written to the page cache, not
//! when it reaches the disk).
//!
//! The shares ([`fill`]): what the host has free less [`MARGIN`] and less what
//! each image's host file could still grow by that its ext4 does not count as
//! free (its journal and inode tables, holes in a fresh image) is the budget;
//! each filesystem gets what it has free or the level that spends the budget,
//! whichever is less (water-filling: room one does not need goes to the others).
//! The daemon shares again every second and when a session's images are
//! mounted; a filesystem never gets less reserved than ext4's own default.
//!
//! The arithmetic is pure and unit-tested here; [`apply`] reads the kernel's
//! figures and writes the reserves.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What the host keeps free beyond the shares: the daemon's run records and
/// package cache, and writes the shares do not see until the next round.
pub const MARGIN: u64 = 64 * 1024 * 1024;

/// One mounted image's filesystem, as the kernel and the host see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fs {
    /// Its block (cluster) size, bytes.
    pub block: u64,
    /// Its blocks (its image's size over the block size: what ext4 counts its
    /// own reserve from), and those free (less those written but not yet
    /// allocated).
    pub blocks: u64,
    pub free_blocks: u64,
    /// Bytes of its image the host has not allocated yet (the file is sparse).
    pub unallocated: u64,
}

impl Fs {
    /// What ext4 holds back by itself (`min(2 %, 4096 clusters)`): never less.
    pub fn floor(&self) -> u64 {
        (self.blocks / 50).min(4096)
    }

    /// Bytes it could take but for the shares.
    pub fn wants(&self) -> u64 {
        self.free_blocks.saturating_sub(self.floor()).saturating_mul(self.block)
    }

    /// Bytes its image could still take on the host beyond what its ext4
    /// counts as free (its journal and inode tables, not yet written).
    pub fn beyond_free(&self) -> u64 {
        self.unallocated.saturating_sub(self.free_blocks.saturating_mul(self.block))
    }

    /// The `reserved_clusters` that leave it `allowed` bytes free.
    pub fn reserved_for(&self, allowed: u64) -> u64 {
        let keep = self.free_blocks.saturating_sub(allowed / self.block.max(1));
        keep.max(self.floor()).min(self.blocks.saturating_sub(1))
    }
}

/// What the filesystems `fss` may share of `host_free` bytes (see the module's
/// notes).
pub fn budget(host_free: u64, fss: &[Fs]) -> u64 {
    let beyond: u64 = fss.iter().map(Fs::beyond_free).fold(0, u64::saturating_add);
    host_free.saturating_sub(MARGIN).saturating_sub(beyond)
}

/// Water-filling: each of `wants` gets what it wants or the level, whichever is
/// less, the level the highest that keeps the sum within `budget`. Returns the
/// shares (in `wants`' order) and the level (`u64::MAX` when every want fits).
pub fn fill(budget: u64, wants: &[u64]) -> (Vec<u64>, u64) {
    let mut order: Vec<usize> = (0..wants.len()).collect();
    order.sort_by_key(|&i| wants[i]);
    let mut left = budget;
    let mut level = u64::MAX;
    for (done, &i) in order.iter().enumerate() {
        let even = left / (wants.len() - done) as u64;
        if wants[i] > even {
            level = even;
            break;
        }
        left -= wants[i];
    }
    (wants.iter().map(|&w| w.min(level)).collect(), level)
}

/// The filesystem mounted at `root`, if one is: its device's name in `/sys/fs/ext4`.
fn ext4_name(root: &Path) -> io::Result<String> {
    let dev = std::fs::metadata(root)?.dev();
    let link = std::fs::read_link(format!("/sys/dev/block/{}:{}", libc::major(dev), libc::minor(dev)))?;
    link.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| io::Error::other(format!("{} has no block device name", root.display())))
}

/// What the kernel says of the filesystem at `root` whose image is `image`.
fn read(root: &Path, image: &Path) -> io::Result<Fs> {
    let fs = nix::sys::statvfs::statvfs(root).map_err(io::Error::from)?;
    let meta = std::fs::metadata(image)?;
    let block = fs.fragment_size().max(1);
    Ok(Fs {
        block,
        blocks: meta.len() / block,
        free_blocks: fs.blocks_free(),
        unallocated: meta.len().saturating_sub(meta.blocks().saturating_mul(512)),
    })
}

fn write_reserved(root: &Path, clusters: u64) -> io::Result<()> {
    let path = format!("/sys/fs/ext4/{}/reserved_clusters", ext4_name(root)?);
    std::fs::write(&path, clusters.to_string()).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))
}

/// A mounted image: its filesystem's root and its image file.
pub type Mounted = (PathBuf, PathBuf);

/// Share `host_free` bytes among the filesystems `mounted` (see the module's
/// notes) and set each one's reserve; the level reached. One that cannot be read
/// or set (unmounted meanwhile) is left out, with a warning.
pub fn apply(host_free: u64, mounted: &[Mounted]) -> u64 {
    let read: Vec<(&Mounted, Fs)> = mounted.iter().filter_map(|m| read(&m.0, &m.1).ok().map(|fs| (m, fs))).collect();
    let fss: Vec<Fs> = read.iter().map(|(_, fs)| *fs).collect();
    let wants: Vec<u64> = fss.iter().map(Fs::wants).collect();
    let (shares, level) = fill(budget(host_free, &fss), &wants);
    for ((m, fs), share) in read.iter().zip(shares) {
        if let Err(e) = write_reserved(&m.0, fs.reserved_for(share)) {
            tracing::warn!(root = %m.0.display(), error = %e, "could not set a workspace's share of the host disk");
        }
    }
    level
}

/// Give the filesystem newly mounted at `root` (image `image`) at most `level`
/// bytes free, the level of the last sharing, until the next.
pub fn clamp(root: &Path, image: &Path, level: u64) -> io::Result<()> {
    let fs = read(root, image)?;
    write_reserved(root, fs.reserved_for(fs.wants().min(level)))
}

/// How full a mounted image's filesystem is ([`room_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// Bytes free to its writers.
    pub free: u64,
    /// Its size, bytes.
    pub size: u64,
    /// Its share of the host disk, not its own size, is what holds it back (a
    /// reserve above ext4's own).
    pub held_back: bool,
}

/// How full the filesystem at `root` (image `image`) is.
pub fn room_at(root: &Path, image: &Path) -> io::Result<Room> {
    let fs = read(root, image)?;
    let free = nix::sys::statvfs::statvfs(root).map_err(io::Error::from)?.blocks_available().saturating_mul(fs.block);
    Ok(Room {
        free,
        size: fs.blocks.saturating_mul(fs.block),
        held_back: fs.wants() > free.saturating_add(2 * fs.block),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn fs(free_mib: u64) -> Fs {
        // A 1 GiB image of 4 KiB blocks, with 40 MiB of journal and inode
        // tables not yet on the host.
        Fs { block: 4096, blocks: 262_144, free_blocks: free_mib * 256, unallocated: (free_mib + 40) * MIB }
    }

    #[test]
    fn water_filling_gives_small_wants_in_full_and_splits_the_rest_evenly() {
        assert_eq!(fill(100, &[10, 50, 60]), (vec![10, 45, 45], 45));
        assert_eq!(fill(1000, &[10, 50, 60]), (vec![10, 50, 60], u64::MAX));
        assert_eq!(fill(0, &[10, 50]), (vec![0, 0], 0));
        assert_eq!(fill(7, &[]), (vec![], u64::MAX));
        // Never more than the budget in all.
        let (shares, _) = fill(101, &[40, 40, 40]);
        assert!(shares.iter().sum::<u64>() <= 101 && shares.iter().all(|&s| s == 33));
    }

    #[test]
    fn the_budget_is_what_the_host_has_free_less_the_margin_and_what_images_take_beyond_their_free() {
        let fss = [fs(500), fs(100)];
        assert_eq!(budget(MARGIN + 80 * MIB + 1000, &fss), 1000);
        assert_eq!(budget(MARGIN + 10 * MIB, &fss), 0);
        assert_eq!(budget(0, &[]), 0);
    }

    #[test]
    fn a_reserve_leaves_the_share_free_and_never_less_than_ext4s_own() {
        let f = fs(500);
        assert_eq!(f.floor(), 4096);
        assert_eq!(f.wants(), 500 * MIB - 4096 * 4096);
        // Its share: 100 MiB free, the rest held back.
        assert_eq!(f.reserved_for(100 * MIB), (500 - 100) * 256);
        // All it wants: ext4's own reserve only.
        assert_eq!(f.reserved_for(f.wants()), 4096);
        assert_eq!(f.reserved_for(u64::MAX), 4096);
        // Nothing: all it has free (the kernel refuses one as large as the disk).
        assert_eq!(f.reserved_for(0), 500 * 256);
        let tiny = Fs { block: 4096, blocks: 10, free_blocks: 10, unallocated: 0 };
        assert_eq!(tiny.reserved_for(0), 9);
    }

    #[test]
    fn shares_never_add_up_to_more_than_the_host_can_take() {
        for host_free in [0, 70 * MIB, 300 * MIB, 5000 * MIB] {
            let fss = [fs(900), fs(20), fs(300), fs(0)];
            let wants: Vec<u64> = fss.iter().map(Fs::wants).collect();
            let (shares, _) = fill(budget(host_free, &fss), &wants);
            let could_take: u64 = fss.iter().zip(&shares).map(|(f, s)| s + f.beyond_free()).sum();
            assert!(could_take <= host_free.saturating_sub(MARGIN).max(fss.iter().map(Fs::beyond_free).sum()));
            for (f, s) in fss.iter().zip(&shares) {
                let free_after = f.free_blocks.saturating_sub(f.reserved_for(*s)) * f.block;
                assert!(free_after <= (*s).max(f.wants()), "{f:?} {s}");
                assert!(free_after <= *s + f.block, "{f:?} {s}");
            }
        }
    }
}
