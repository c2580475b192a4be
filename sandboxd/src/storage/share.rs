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
    /// Its inodes (their tables, holes in a fresh image, are written as they are
    /// used).
    pub inodes: u64,
    /// Blocks written to it that ext4 has not allocated yet (delayed
    /// allocation: in the page cache, bound for holes of its image).
    pub pending: u64,
}

/// The journal mkfs.ext4 gives a filesystem of `blocks` blocks, in blocks
/// (e2fsprogs' `ext2fs_default_journal_size`).
pub fn journal_blocks(blocks: u64) -> u64 {
    match blocks {
        0..2048 => 0,
        2048..32_768 => 1024,
        32_768..262_144 => 4096,
        262_144..524_288 => 8192,
        524_288..4_194_304 => 16_384,
        4_194_304..8_388_608 => 32_768,
        8_388_608..16_777_216 => 65_536,
        16_777_216..33_554_432 => 131_072,
        _ => 262_144,
    }
}

/// Bytes of an inode in the images mkfs.ext4 makes.
const INODE_BYTES: u64 = 256;

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
    /// counts as free to its writers: what ext4 itself writes where the image may
    /// still have holes (its journal, its inode tables, its own reserve), and
    /// whatever else of the image is a hole but not free in ext4. Where the image
    /// has room on the host ext4 does not count as free (blocks written once and
    /// deleted) this cannot tell which holes are which, so ext4's own writes are
    /// counted whole: never less than a tenant could make the image grow by.
    pub fn beyond_free(&self) -> u64 {
        let own = (journal_blocks(self.blocks) + self.floor()).saturating_mul(self.block)
            + self.inodes.saturating_mul(INODE_BYTES);
        // What was written and not yet allocated counts too, added: blocks
        // written and deleted would otherwise hide it (they make ext4's free
        // larger than the image's holes, while the new writes go to holes).
        let own = own.saturating_add(self.pending.saturating_mul(self.block));
        let not_free = self.unallocated.saturating_sub(self.free_blocks.saturating_mul(self.block));
        not_free.max(own.min(self.unallocated))
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

/// A mounted image's filesystem, held open from its reading to its reserve's
/// writing: the open root pins the mount (an unmount meanwhile cannot leave the
/// path on the state directory's own filesystem, whose reserve would then be
/// written), and so its loop device (which no other image can take meanwhile).
struct Held {
    /// Its device's name in `/sys/fs/ext4` (a loop device's: never another).
    name: String,
    fs: Fs,
    /// Its blocks free to its writers now (past its reserve).
    available: u64,
}

/// The image `image`'s filesystem mounted at `root`, read while held open.
fn hold(root: &Path, image: &Path) -> io::Result<(std::fs::File, Held)> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW).open(root)?;
    let meta = dir.metadata()?;
    let parent = root.parent().map(std::fs::metadata).transpose()?;
    if parent.is_none_or(|p| p.dev() == meta.dev()) || meta.ino() != 2 {
        return Err(io::Error::other(format!("{} is not a mounted image", root.display())));
    }
    let link = std::fs::read_link(format!("/sys/dev/block/{}:{}", libc::major(meta.dev()), libc::minor(meta.dev())))?;
    let name = link.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    if !name.starts_with("loop") {
        return Err(io::Error::other(format!("{} is on {name:?}, not a loop device", root.display())));
    }
    let stat = nix::sys::statvfs::fstatvfs(&dir).map_err(io::Error::from)?;
    let image = std::fs::metadata(image)?;
    let block = stat.fragment_size().max(1);
    let fs = Fs {
        block,
        blocks: image.len() / block,
        free_blocks: stat.blocks_free(),
        unallocated: image.len().saturating_sub(image.blocks().saturating_mul(512)),
        inodes: stat.files(),
        pending: std::fs::read_to_string(format!("/sys/fs/ext4/{name}/delayed_allocation_blocks"))
            .ok()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0),
    };
    Ok((dir, Held { name, fs, available: stat.blocks_available() }))
}

impl Held {
    fn write_reserved(&self, clusters: u64) -> io::Result<()> {
        let path = format!("/sys/fs/ext4/{}/reserved_clusters", self.name);
        std::fs::write(&path, clusters.to_string()).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))
    }
}

/// A mounted image: its filesystem's root and its image file.
pub type Mounted = (PathBuf, PathBuf);

/// Share `host_free` bytes among the filesystems `mounted` (see the module's
/// notes) and set each one's reserve; the level reached. One that cannot be read
/// (unmounted meanwhile) is left out; one whose reserve cannot be set counts,
/// with a warning.
pub fn apply(host_free: u64, mounted: &[Mounted]) -> u64 {
    let held: Vec<(std::fs::File, Held)> = mounted.iter().filter_map(|m| hold(&m.0, &m.1).ok()).collect();
    let fss: Vec<Fs> = held.iter().map(|(_, h)| h.fs).collect();
    let wants: Vec<u64> = fss.iter().map(Fs::wants).collect();
    let (shares, level) = fill(budget(host_free, &fss), &wants);
    for ((_root, h), share) in held.iter().zip(shares) {
        if let Err(e) = h.write_reserved(h.fs.reserved_for(share)) {
            tracing::warn!(device = %h.name, error = %e, "could not set a workspace's share of the host disk");
        }
    }
    level
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
    let (_root, Held { fs, available, .. }) = hold(root, image)?;
    let free = available.saturating_mul(fs.block);
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
        Fs {
            block: 4096,
            blocks: 262_144,
            free_blocks: free_mib * 256,
            unallocated: (free_mib + 40) * MIB,
            inodes: 0,
            pending: 0,
        }
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
        // Each: 40 MiB of holes ext4 does not count as free, but its journal
        // (32 MiB for 1 GiB) and its own reserve (16 MiB) count whole.
        let fss = [fs(500), fs(100)];
        assert_eq!(fss[0].beyond_free(), 48 * MIB);
        assert_eq!(budget(MARGIN + 96 * MIB + 1000, &fss), 1000);
        assert_eq!(budget(MARGIN + 10 * MIB, &fss), 0);
        assert_eq!(budget(0, &[]), 0);
        // Inode tables too.
        assert_eq!(Fs { inodes: 65_536, ..fs(500) }.beyond_free(), 64 * MIB);
    }

    #[test]
    fn blocks_written_and_deleted_hide_no_holes_ext4_will_write() {
        // 300 MiB written and deleted: free in ext4, but on the host already; the
        // image's holes are now fewer than what ext4 counts free.
        let f =
            Fs { block: 4096, blocks: 262_144, free_blocks: 900 * 256, unallocated: 620 * MIB, inodes: 0, pending: 0 };
        assert_eq!(f.beyond_free(), 48 * MIB, "its journal and reserve still count");
        // And what was written since but is not allocated yet (bound for holes).
        assert_eq!(Fs { pending: 200 * 256, ..f }.beyond_free(), 248 * MIB);
        // An image with almost no holes left: at most those.
        let full = Fs { unallocated: 5 * MIB, ..f };
        assert_eq!(full.beyond_free(), 5 * MIB);
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
        let tiny = Fs { block: 4096, blocks: 10, free_blocks: 10, unallocated: 0, inodes: 0, pending: 0 };
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
