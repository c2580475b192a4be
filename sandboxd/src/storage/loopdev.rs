//! An image mounted through a loop device by the kernel's own calls: a free
//! device from `/dev/loop-control` (`LOOP_CTL_GET_FREE`), the image bound to it in
//! one step (`LOOP_CONFIGURE`, with autoclear: the device lets the image go when
//! its filesystem is unmounted), then `mount(2)`. What `mount -o loop` does, in
//! about a tenth of its time (no program started, no mount table parsed): a
//! session's two images are mounted on the way to its first run.
//!
//! Two daemons, or mount(8), may pick the same free device at once: the one that
//! loses gets `EBUSY` from `LOOP_CONFIGURE` and asks again.
//!
//! An image is mounted again after an idle unmount. Should its filesystem still
//! be alive then (a namespace that has not let go of it yet), its device is still
//! bound: that device is mounted again, the same filesystem, never a second
//! device on the same image (two filesystems writing one image would corrupt it).

use linux_raw_sys::loop_device::{
    loop_config, loop_info64, LOOP_CLR_FD, LOOP_CONFIGURE, LOOP_CTL_GET_FREE, LOOP_GET_STATUS64, LO_FLAGS_AUTOCLEAR,
};
use nix::mount::MsFlags;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Times a device is asked for when another takes each one first.
const ATTEMPTS: usize = 32;

nix::ioctl_write_int_bad!(ctl_get_free, LOOP_CTL_GET_FREE);
nix::ioctl_write_ptr_bad!(configure, LOOP_CONFIGURE, loop_config);
nix::ioctl_write_int_bad!(clear_fd, LOOP_CLR_FD);
nix::ioctl_read_bad!(get_status, LOOP_GET_STATUS64, loop_info64);

const FLAGS: MsFlags = MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV).union(MsFlags::MS_NOATIME);

/// Mount the ext4 filesystem in `image` on `target` (nosuid, nodev, noatime).
pub fn mount_image(image: &Path, target: &Path) -> io::Result<()> {
    let backing = OpenOptions::new().read(true).write(true).open(image)?;
    if let Some((device, bound)) = bound_device(&backing, image)? {
        // `device` stays open until the mount is made: the kernel cannot let the
        // image go (autoclear) and bind the device to another meanwhile. A failure
        // is the caller's to see: never a second device on the image.
        let mounted = nix::mount::mount(Some(bound.as_path()), target, Some("ext4"), FLAGS, None::<&str>);
        drop(device);
        return mounted.map_err(|e| {
            io::Error::other(format!(
                "mount {} (still bound to {}, its filesystem in use elsewhere) on {}: {e}",
                bound.display(),
                image.display(),
                target.display()
            ))
        });
    }
    let (device, path) = attach(&backing, image)?;
    drop(backing);
    let mounted = nix::mount::mount(Some(path.as_path()), target, Some("ext4"), FLAGS, None::<&str>);
    if let Err(e) = mounted {
        // SAFETY: LOOP_CLR_FD takes no argument; `device` is an open loop device.
        let _ = unsafe { clear_fd(device.as_raw_fd(), 0) };
        return Err(io::Error::other(format!("mount {} on {}: {e}", path.display(), target.display())));
    }
    Ok(())
}

/// The loop device still bound to `backing` (the file at `image`), if any, open,
/// and its path. Every bound loop device (`/sys/block/loopN/loop` is there) is
/// asked, open, which device and inode it reads: a path can mislead (the one the
/// kernel shows is the one given at binding, and a state directory reached
/// another way shows another), a device and inode cannot. A device whose backing
/// file has the image's name that cannot be asked is an error, as is a system
/// that cannot list them: binding a second device is never a guess. Another
/// device that cannot be asked (the host's, in a container that may not open it)
/// is not the image's; one let go meanwhile (`ENXIO`, `ENOENT`) is not bound.
fn bound_device(backing: &File, image: &Path) -> io::Result<Option<(File, std::path::PathBuf)>> {
    use std::os::unix::fs::MetadataExt;
    let meta = backing.metadata()?;
    let gone = |e: &io::Error| matches!(e.raw_os_error(), Some(libc::ENXIO) | Some(libc::ENOENT));
    let devices = std::fs::read_dir("/sys/block").map_err(|e| {
        io::Error::new(e.kind(), format!("listing /sys/block for a device bound to {}: {e}", image.display()))
    })?;
    for entry in devices {
        let entry = entry?;
        let name = entry.file_name();
        if !name.as_bytes().starts_with(b"loop") || !entry.path().join("loop").exists() {
            continue;
        }
        // Could it be the image's? Its backing file has the image's name (the
        // path around it may differ).
        let shown = std::fs::read(entry.path().join("loop/backing_file")).unwrap_or_default();
        let shown = shown.strip_suffix(b"\n").unwrap_or(&shown);
        let maybe_ours = image.file_name().is_some_and(|n| shown.ends_with(n.as_bytes()));
        let path = Path::new("/dev").join(&name);
        let device = match OpenOptions::new().read(true).open(&path) {
            Ok(device) => device,
            Err(e) if gone(&e) || !maybe_ours => continue,
            Err(e) => {
                return Err(io::Error::new(e.kind(), format!("{} (asking what it is bound to): {e}", path.display())))
            }
        };
        // SAFETY: loop_info64 is plain integers and byte arrays: all zeroes is a
        // valid value for the kernel to fill.
        let mut info: loop_info64 = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a loop_info64 that outlives the call; `device` is open.
        match unsafe { get_status(device.as_raw_fd(), &mut info) }.map_err(io::Error::from) {
            Ok(_) if info.lo_inode == meta.ino() && info.lo_device == meta.dev() => return Ok(Some((device, path))),
            Ok(_) => {}
            Err(e) if gone(&e) || !maybe_ours => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("LOOP_GET_STATUS64 {}: {e}", path.display()))),
        }
    }
    Ok(None)
}

/// A free loop device bound to `backing` (the file at `image`), open, and its path.
fn attach(backing: &File, image: &Path) -> io::Result<(File, std::path::PathBuf)> {
    let control = OpenOptions::new().read(true).write(true).open("/dev/loop-control")?;
    let mut config = loop_config {
        fd: backing.as_raw_fd() as u32,
        block_size: 0,
        // SAFETY: loop_info64 is plain integers and byte arrays: all zeroes is
        // its "nothing set" value.
        info: unsafe { std::mem::zeroed() },
        __reserved: [0; 8],
    };
    config.info.lo_flags = LO_FLAGS_AUTOCLEAR as u32;
    let name = image.as_os_str().as_bytes();
    let n = name.len().min(config.info.lo_file_name.len() - 1);
    config.info.lo_file_name[..n].copy_from_slice(&name[..n]);
    let mut last = io::Error::other("no free loop device");
    for _ in 0..ATTEMPTS {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let number = unsafe { ctl_get_free(control.as_raw_fd(), 0) }.map_err(io::Error::from)?;
        let path = std::path::PathBuf::from(format!("/dev/loop{number}"));
        let device = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(d) => d,
            Err(e) => {
                last = e;
                continue;
            }
        };
        // SAFETY: `config` is a valid loop_config that outlives the call; its fd
        // is `backing`, open for the call's length.
        match unsafe { configure(device.as_raw_fd(), &config) } {
            Ok(_) => return Ok((device, path)),
            // Taken by another between the two calls: ask again.
            Err(nix::Error::EBUSY) => last = io::Error::from(nix::Error::EBUSY),
            Err(e) => return Err(io::Error::other(format!("LOOP_CONFIGURE {}: {e}", path.display()))),
        }
    }
    Err(io::Error::other(format!("attaching {} to a loop device: {last}", image.display())))
}
