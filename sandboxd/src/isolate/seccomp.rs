//! The seccomp filter: an allow-list with a default deny, in one BPF program.
//!
//! - Every syscall not named here fails with `EPERM`; a call made through another
//!   architecture's entry point (32-bit `int 0x80`) kills the process; x32 numbers
//!   are never in the list, so they fail with `EPERM`.
//! - `clone` with namespace flags, `socket` outside AF_UNIX/AF_INET/AF_INET6 and the
//!   TIOCSTI/TIOCLINUX ioctls fail with `EPERM`.
//! - `clone3` fails with `ENOSYS`, so glibc falls back to `clone`, whose flags the
//!   filter can inspect.
//!
//! The program is a binary search over the syscall numbers ([`program`]), built
//! here rather than by seccompiler: seccompiler emits a linear list (1346
//! instructions), and the kernel runs the filter for every syscall number when it
//! loads it, to build its cache of always-allowed calls, which cost ~0.9 ms of
//! every sandbox; the search loads in a tenth of that. seccompiler stays the
//! reference: the unit tests run both programs on every syscall number and
//! argument that matters and expect the same answer, and it applies the filter.
//!
//! The builders are pure and unit-tested; [`apply`] is the only syscall here.

use seccompiler::{sock_filter, BpfProgram};
use std::collections::BTreeMap;

/// Syscalls allowed without conditions.
pub fn allowed() -> Vec<(&'static str, i64)> {
    macro_rules! list {
        ($($name:ident),* $(,)?) => { vec![$((stringify!($name), libc::$name)),*] };
    }
    let mut v = list![
        // files and directories
        SYS_read,
        SYS_write,
        SYS_openat,
        SYS_close,
        SYS_fstat,
        SYS_newfstatat,
        SYS_statx,
        SYS_lseek,
        SYS_pread64,
        SYS_pwrite64,
        SYS_readv,
        SYS_writev,
        SYS_preadv,
        SYS_pwritev,
        SYS_preadv2,
        SYS_pwritev2,
        SYS_faccessat,
        SYS_faccessat2,
        SYS_pipe2,
        SYS_dup,
        SYS_dup3,
        SYS_fcntl,
        SYS_flock,
        SYS_fsync,
        SYS_fdatasync,
        SYS_ftruncate,
        SYS_truncate,
        SYS_getdents64,
        SYS_getcwd,
        SYS_chdir,
        SYS_fchdir,
        SYS_renameat,
        SYS_renameat2,
        SYS_mkdirat,
        SYS_unlinkat,
        SYS_linkat,
        SYS_symlinkat,
        SYS_readlinkat,
        SYS_fchmod,
        SYS_fchmodat,
        SYS_fchown,
        SYS_fchownat,
        SYS_umask,
        SYS_mknodat,
        SYS_utimensat,
        SYS_statfs,
        SYS_fstatfs,
        SYS_fadvise64,
        SYS_fallocate,
        SYS_sendfile,
        SYS_splice,
        SYS_tee,
        SYS_copy_file_range,
        SYS_sync_file_range,
        SYS_close_range,
        SYS_openat2,
        SYS_getxattr,
        SYS_lgetxattr,
        SYS_fgetxattr,
        SYS_listxattr,
        SYS_llistxattr,
        SYS_flistxattr,
        SYS_readahead,
        SYS_memfd_create,
        SYS_inotify_init1,
        SYS_inotify_add_watch,
        SYS_inotify_rm_watch,
        SYS_sync,
        SYS_syncfs,
        // the same calls under their older x86_64 names, used by some binaries
        SYS_open,
        SYS_stat,
        SYS_lstat,
        SYS_access,
        SYS_pipe,
        SYS_dup2,
        SYS_getdents,
        SYS_rename,
        SYS_mkdir,
        SYS_rmdir,
        SYS_creat,
        SYS_link,
        SYS_unlink,
        SYS_symlink,
        SYS_readlink,
        SYS_chmod,
        SYS_chown,
        SYS_lchown,
        SYS_mknod,
        SYS_utime,
        SYS_utimes,
        SYS_futimesat,
        SYS_poll,
        SYS_select,
        SYS_epoll_create,
        SYS_epoll_wait,
        SYS_inotify_init,
        SYS_eventfd,
        SYS_signalfd,
        SYS_alarm,
        SYS_pause,
        SYS_time,
        SYS_fork,
        SYS_vfork,
        // memory
        SYS_mmap,
        SYS_mprotect,
        SYS_munmap,
        SYS_brk,
        SYS_mremap,
        SYS_msync,
        SYS_mincore,
        SYS_madvise,
        SYS_mlock,
        SYS_mlock2,
        SYS_munlock,
        SYS_mlockall,
        SYS_munlockall,
        SYS_get_mempolicy,
        SYS_set_mempolicy,
        SYS_mbind,
        SYS_pkey_mprotect,
        SYS_pkey_alloc,
        SYS_pkey_free,
        SYS_membarrier,
        SYS_mseal,
        // processes, threads and signals
        SYS_execve,
        SYS_execveat,
        SYS_exit,
        SYS_exit_group,
        SYS_wait4,
        SYS_waitid,
        SYS_kill,
        SYS_tgkill,
        SYS_tkill,
        SYS_getpid,
        SYS_getppid,
        SYS_gettid,
        SYS_getpgid,
        SYS_getpgrp,
        SYS_setpgid,
        SYS_getsid,
        SYS_setsid,
        SYS_set_tid_address,
        SYS_set_robust_list,
        SYS_get_robust_list,
        SYS_rseq,
        SYS_futex,
        SYS_futex_waitv,
        SYS_rt_sigaction,
        SYS_rt_sigprocmask,
        SYS_rt_sigreturn,
        SYS_rt_sigpending,
        SYS_rt_sigtimedwait,
        SYS_rt_sigqueueinfo,
        SYS_rt_tgsigqueueinfo,
        SYS_rt_sigsuspend,
        SYS_sigaltstack,
        SYS_pidfd_open,
        SYS_pidfd_send_signal,
        SYS_arch_prctl,
        SYS_prctl,
        SYS_sched_yield,
        SYS_sched_getaffinity,
        SYS_sched_setaffinity,
        SYS_sched_getparam,
        SYS_sched_getscheduler,
        SYS_sched_get_priority_max,
        SYS_sched_get_priority_min,
        SYS_sched_rr_get_interval,
        SYS_sched_getattr,
        SYS_getpriority,
        SYS_setpriority,
        SYS_getcpu,
        SYS_getrlimit,
        SYS_setrlimit,
        SYS_prlimit64,
        SYS_getrusage,
        SYS_times,
        SYS_seccomp,
        SYS_landlock_create_ruleset,
        SYS_landlock_add_rule,
        SYS_landlock_restrict_self,
        // identity: reading it, or changing it within what the process already has
        SYS_getuid,
        SYS_geteuid,
        SYS_getgid,
        SYS_getegid,
        SYS_getresuid,
        SYS_getresgid,
        SYS_getgroups,
        SYS_setuid,
        SYS_setgid,
        SYS_setreuid,
        SYS_setregid,
        SYS_setresuid,
        SYS_setresgid,
        SYS_setgroups,
        SYS_setfsuid,
        SYS_setfsgid,
        SYS_capget,
        // time
        SYS_clock_gettime,
        SYS_clock_getres,
        SYS_clock_nanosleep,
        SYS_nanosleep,
        SYS_gettimeofday,
        SYS_getitimer,
        SYS_setitimer,
        SYS_timer_create,
        SYS_timer_settime,
        SYS_timer_gettime,
        SYS_timer_getoverrun,
        SYS_timer_delete,
        SYS_timerfd_create,
        SYS_timerfd_settime,
        SYS_timerfd_gettime,
        // events and polling
        SYS_ppoll,
        SYS_pselect6,
        SYS_epoll_create1,
        SYS_epoll_ctl,
        SYS_epoll_pwait,
        SYS_epoll_pwait2,
        SYS_eventfd2,
        SYS_signalfd4,
        // sockets (the family is checked on socket/socketpair below)
        SYS_connect,
        SYS_accept,
        SYS_accept4,
        SYS_bind,
        SYS_listen,
        SYS_shutdown,
        SYS_sendto,
        SYS_recvfrom,
        SYS_sendmsg,
        SYS_recvmsg,
        SYS_sendmmsg,
        SYS_recvmmsg,
        SYS_getsockname,
        SYS_getpeername,
        SYS_setsockopt,
        SYS_getsockopt,
        // System V IPC, private to the sandbox's IPC namespace
        SYS_shmget,
        SYS_shmat,
        SYS_shmdt,
        SYS_shmctl,
        SYS_semget,
        SYS_semop,
        SYS_semctl,
        SYS_semtimedop,
        SYS_msgget,
        SYS_msgsnd,
        SYS_msgrcv,
        SYS_msgctl,
        // misc
        SYS_uname,
        SYS_sysinfo,
        SYS_getrandom,
        SYS_restart_syscall,
        SYS_io_setup,
        SYS_io_destroy,
        SYS_io_getevents,
        SYS_io_submit,
        SYS_io_cancel,
    ];
    v.sort_by_key(|(_, nr)| *nr);
    v
}

/// Syscall families that must never be allowed; the unit tests check that none of
/// them is in [`allowed`], and the security suite checks the errno each returns.
pub const DENIED: &[(&str, i64)] = &[
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("fsopen", libc::SYS_fsopen),
    ("fsmount", libc::SYS_fsmount),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("process_madvise", libc::SYS_process_madvise),
    ("kcmp", libc::SYS_kcmp),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("clone3", libc::SYS_clone3),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("fanotify_init", libc::SYS_fanotify_init),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("reboot", libc::SYS_reboot),
    ("syslog", libc::SYS_syslog),
    ("acct", libc::SYS_acct),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("sethostname", libc::SYS_sethostname),
    ("setdomainname", libc::SYS_setdomainname),
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("modify_ldt", libc::SYS_modify_ldt),
    ("quotactl", libc::SYS_quotactl),
    ("vhangup", libc::SYS_vhangup),
    ("memfd_secret", libc::SYS_memfd_secret),
    ("personality", libc::SYS_personality),
];

/// Namespace flags that `clone` may not carry.
pub const CLONE_NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u64;

/// Socket families a sandbox may create.
pub const ALLOWED_SOCKET_FAMILIES: [i32; 3] = [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6];

/// ioctl requests that are refused on every fd: faking terminal input.
pub const DENIED_IOCTLS: [u64; 2] = [libc::TIOCSTI, libc::TIOCLINUX];

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the seccomp filter has a block too long to jump over ({0} instructions)")]
    BlockTooLong(usize),
    #[error("installing the seccomp filter: {0}")]
    Apply(#[from] seccompiler::Error),
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000; // EM_X86_64, 64-bit, little-endian
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000; // EM_AARCH64, 64-bit, little-endian

/// Classic BPF, as far as this filter needs it (`linux/filter.h`, `linux/seccomp.h`).
mod bpf {
    use seccompiler::sock_filter;

    const LD_W_ABS: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS (0x20)
    pub const JA: u16 = 0x05; // BPF_JMP (5) | BPF_JA (0)
    pub const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ (0x10) | BPF_K (0)
    pub const JGE: u16 = 0x35; // BPF_JMP | BPF_JGE (0x30) | BPF_K
    pub const JSET: u16 = 0x45; // BPF_JMP | BPF_JSET (0x40) | BPF_K
    pub const RET: u16 = 0x06; // BPF_RET (6) | BPF_K

    /// Offsets in `struct seccomp_data`; an argument's low 32 bits (little-endian).
    pub const NR: u32 = 0;
    pub const ARCH: u32 = 4;
    pub const fn arg_low(i: u32) -> u32 {
        16 + 8 * i
    }

    pub const ALLOW: u32 = 0x7fff_0000;
    pub const KILL_PROCESS: u32 = 0x8000_0000;
    pub const fn errno(e: i32) -> u32 {
        0x0005_0000 | (e as u32 & 0xffff)
    }

    pub fn load(offset: u32) -> sock_filter {
        sock_filter { code: LD_W_ABS, jt: 0, jf: 0, k: offset }
    }
    pub fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
        sock_filter { code, jt, jf, k }
    }
    pub fn ret(action: u32) -> sock_filter {
        sock_filter { code: RET, jt: 0, jf: 0, k: action }
    }
}

/// What the filter does with one syscall number.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    Allow,
    Errno(i32),
    /// Instructions that look at the arguments; each path ends in a return.
    Checked(Vec<sock_filter>),
}

/// `clone`: only without namespace flags (they are all in the low 32 bits).
fn clone_check() -> Vec<sock_filter> {
    vec![
        bpf::load(bpf::arg_low(0)),
        bpf::jump(bpf::JSET, CLONE_NAMESPACE_FLAGS as u32, 0, 1),
        bpf::ret(bpf::errno(libc::EPERM)),
        bpf::ret(bpf::ALLOW),
    ]
}

/// `socket`/`socketpair`: only the allowed families (an `int`: its low 32 bits).
fn family_check() -> Vec<sock_filter> {
    let mut v = vec![bpf::load(bpf::arg_low(0))];
    for family in ALLOWED_SOCKET_FAMILIES {
        v.extend([bpf::jump(bpf::JEQ, family as u32, 0, 1), bpf::ret(bpf::ALLOW)]);
    }
    v.push(bpf::ret(bpf::errno(libc::EPERM)));
    v
}

/// `ioctl`: anything but the denied requests (an `unsigned int`: its low 32 bits).
fn ioctl_check() -> Vec<sock_filter> {
    let mut v = vec![bpf::load(bpf::arg_low(1))];
    for request in DENIED_IOCTLS {
        v.extend([bpf::jump(bpf::JEQ, request as u32, 0, 1), bpf::ret(bpf::errno(libc::EPERM))]);
    }
    v.push(bpf::ret(bpf::ALLOW));
    v
}

/// Every syscall number the filter does not simply refuse, and what it does with it.
fn verdicts() -> BTreeMap<u32, Verdict> {
    let mut map: BTreeMap<u32, Verdict> = allowed().into_iter().map(|(_, nr)| (nr as u32, Verdict::Allow)).collect();
    map.insert(libc::SYS_clone as u32, Verdict::Checked(clone_check()));
    map.insert(libc::SYS_socket as u32, Verdict::Checked(family_check()));
    map.insert(libc::SYS_socketpair as u32, Verdict::Checked(family_check()));
    map.insert(libc::SYS_ioctl as u32, Verdict::Checked(ioctl_check()));
    map.insert(libc::SYS_clone3 as u32, Verdict::Errno(libc::ENOSYS));
    map
}

/// Numbers tested one after another at the bottom of the search.
const LEAF: usize = 4;

/// Emit the search over `entries` (sorted): at most [`LEAF`] of them are compared
/// one by one; more are split in two by `nr >= middle`. Conditional jumps reach at
/// most one block ahead (their offsets are 8 bits); the long jump over the lower
/// half is a `JA`, whose offset is 32 bits.
fn search(entries: &[(u32, Verdict)], out: &mut Vec<sock_filter>) -> Result<(), Error> {
    if entries.len() <= LEAF {
        for (nr, verdict) in entries {
            let block = match verdict {
                Verdict::Allow => vec![bpf::ret(bpf::ALLOW)],
                Verdict::Errno(e) => vec![bpf::ret(bpf::errno(*e))],
                Verdict::Checked(block) => block.clone(),
            };
            let skip = u8::try_from(block.len()).map_err(|_| Error::BlockTooLong(block.len()))?;
            out.push(bpf::jump(bpf::JEQ, *nr, 0, skip));
            out.extend(block);
        }
        out.push(bpf::ret(bpf::errno(libc::EPERM)));
        return Ok(());
    }
    let (lower, upper) = entries.split_at(entries.len() / 2);
    // nr >= upper[0]: take the JA to the upper half; else fall into the lower half.
    out.push(bpf::jump(bpf::JGE, upper[0].0, 0, 1));
    let ja = out.len();
    out.push(bpf::jump(bpf::JA, 0, 0, 0));
    search(lower, out)?;
    out[ja].k = (out.len() - ja - 1) as u32;
    search(upper, out)
}

/// The whole filter, compiled to BPF.
pub fn program() -> Result<BpfProgram, Error> {
    let mut out = vec![
        bpf::load(bpf::ARCH),
        bpf::jump(bpf::JEQ, AUDIT_ARCH, 1, 0),
        bpf::ret(bpf::KILL_PROCESS),
        bpf::load(bpf::NR),
    ];
    let entries: Vec<(u32, Verdict)> = verdicts().into_iter().collect();
    search(&entries, &mut out)?;
    Ok(out)
}

/// Install the compiled filter on the calling thread. Needs no-new-privs first.
pub fn apply(program: &BpfProgram) -> Result<(), Error> {
    Ok(seccompiler::apply_filter(program)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_denied_family_is_allowed() {
        let allowed: Vec<i64> = allowed().iter().map(|(_, nr)| *nr).collect();
        for (name, nr) in DENIED {
            assert!(!allowed.contains(nr), "{name} must not be allowed");
        }
        for nr in [libc::SYS_clone, libc::SYS_socket, libc::SYS_socketpair, libc::SYS_ioctl] {
            assert!(!allowed.contains(&nr), "{nr} is allowed only with conditions");
        }
    }

    #[test]
    fn allow_list_has_no_duplicates() {
        let mut nrs: Vec<i64> = allowed().iter().map(|(_, nr)| *nr).collect();
        let len = nrs.len();
        nrs.dedup();
        assert_eq!(nrs.len(), len);
    }

    #[test]
    fn namespace_flags_cover_every_namespace_clone_can_make() {
        for flag in [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWCGROUP,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
        ] {
            assert_ne!(CLONE_NAMESPACE_FLAGS & flag as u64, 0);
        }
        // Thread creation flags stay allowed.
        let thread = (libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES | libc::CLONE_THREAD) as u64;
        assert_eq!(CLONE_NAMESPACE_FLAGS & thread, 0);
    }

    /// Run a classic BPF program on one `seccomp_data` (nr, arch, args), as the
    /// kernel would (the instructions these filters use, and nothing else): its
    /// answer and how many instructions it ran.
    fn steps(prog: &[sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> (u32, usize) {
        let word = |off: u32| -> u32 {
            match off {
                0 => nr,
                4 => arch,
                o if (16..64).contains(&o) && o % 4 == 0 => {
                    let a = args[((o - 16) / 8) as usize];
                    if o % 8 == 0 {
                        a as u32
                    } else {
                        (a >> 32) as u32
                    }
                }
                o => panic!("load from offset {o}"),
            }
        };
        let (mut pc, mut acc) = (0usize, 0u32);
        for ran in 1.. {
            let i = &prog[pc];
            let next = |taken: bool| pc + 1 + if taken { i.jt as usize } else { i.jf as usize };
            pc = match i.code {
                0x20 => {
                    acc = word(i.k);
                    pc + 1
                }
                0x54 => {
                    acc &= i.k;
                    pc + 1
                }
                0x05 => pc + 1 + i.k as usize,
                0x15 => next(acc == i.k),
                0x25 => next(acc > i.k),
                0x35 => next(acc >= i.k),
                0x45 => next(acc & i.k != 0),
                0x06 => return (i.k, ran),
                code => panic!("instruction {code:#x} at {pc}"),
            };
        }
        unreachable!()
    }

    fn run(prog: &[sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        steps(prog, nr, arch, args).0
    }

    /// The same rules through seccompiler: a linear filter.
    fn linear() -> BpfProgram {
        use seccompiler::{
            SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
        };
        #[cfg(target_arch = "x86_64")]
        const ARCH: seccompiler::TargetArch = seccompiler::TargetArch::x86_64;
        #[cfg(target_arch = "aarch64")]
        const ARCH: seccompiler::TargetArch = seccompiler::TargetArch::aarch64;
        let cond = |arg, op, value| SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).unwrap();
        let mut rules: BTreeMap<i64, Vec<SeccompRule>> = allowed().into_iter().map(|(_, nr)| (nr, vec![])).collect();
        let clone = cond(0, SeccompCmpOp::MaskedEq(CLONE_NAMESPACE_FLAGS), 0);
        rules.insert(libc::SYS_clone, vec![SeccompRule::new(vec![clone]).unwrap()]);
        let families: Vec<SeccompRule> = ALLOWED_SOCKET_FAMILIES
            .iter()
            .map(|f| SeccompRule::new(vec![cond(0, SeccompCmpOp::Eq, *f as u64)]).unwrap())
            .collect();
        rules.insert(libc::SYS_socket, families.clone());
        rules.insert(libc::SYS_socketpair, families);
        let ioctl = DENIED_IOCTLS.iter().map(|req| cond(1, SeccompCmpOp::Ne, *req)).collect();
        rules.insert(libc::SYS_ioctl, vec![SeccompRule::new(ioctl).unwrap()]);
        let filter =
            SeccompFilter::new(rules, SeccompAction::Errno(libc::EPERM as u32), SeccompAction::Allow, ARCH).unwrap();
        filter.try_into().unwrap()
    }

    /// The linear filter's answer, plus what the filter that used to follow it
    /// said for clone3: what [`program`] must agree with.
    fn reference(linear: &[sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        match run(linear, nr, arch, args) {
            bpf::KILL_PROCESS => bpf::KILL_PROCESS,
            _ if nr == libc::SYS_clone3 as u32 => bpf::errno(libc::ENOSYS),
            other => other,
        }
    }

    #[test]
    fn the_search_answers_as_the_linear_filter_does() {
        let (prog, linear) = (program().unwrap(), linear());
        assert!(prog.len() < 4096, "BPF_MAXINSNS");
        let ns = (libc::CLONE_NEWUSER | libc::CLONE_NEWNET) as u64;
        let thread = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
        let arg_sets: Vec<[u64; 6]> = [
            0,
            ns,
            thread,
            thread | libc::CLONE_NEWPID as u64,
            1 << 40, // high half only: ignored, as the kernel truncates these `int` arguments
            libc::AF_UNIX as u64,
            libc::AF_INET6 as u64,
            libc::AF_NETLINK as u64,
            libc::AF_PACKET as u64 | 1 << 32,
        ]
        .iter()
        .flat_map(|&a0| {
            [0, libc::TIOCSTI, libc::TIOCLINUX, libc::TIOCSTI | 1 << 32, libc::TCGETS].map(|a1| [a0, a1, 0, 0, 0, 0])
        })
        .collect();
        let numbers = (0..1024).chain([0x4000_0000, 0x4000_0000 + 1, 0x4000_0000 + 59, 0x4000_0000 + 513, u32::MAX]);
        let mut checked = 0;
        for nr in numbers {
            for args in &arg_sets {
                for arch in [AUDIT_ARCH, 0x4000_0003 /* i386 */, 0] {
                    let (ours, theirs) = (run(&prog, nr, arch, *args), reference(&linear, nr, arch, *args));
                    assert_eq!(ours, theirs, "nr {nr:#x} arch {arch:#x} args {args:x?}");
                    checked += 1;
                }
            }
        }
        assert!(checked > 100_000);
    }

    #[test]
    fn the_search_gives_the_documented_answers() {
        let prog = program().unwrap();
        let eperm = bpf::errno(libc::EPERM);
        let call = |nr: i64, a0: u64, a1: u64| run(&prog, nr as u32, AUDIT_ARCH, [a0, a1, 0, 0, 0, 0]);
        assert_eq!(call(libc::SYS_read, 0, 0), bpf::ALLOW);
        assert_eq!(call(libc::SYS_mount, 0, 0), eperm);
        assert_eq!(call(libc::SYS_clone3, 0, 0), bpf::errno(libc::ENOSYS));
        assert_eq!(call(libc::SYS_clone, libc::SIGCHLD as u64, 0), bpf::ALLOW);
        assert_eq!(call(libc::SYS_clone, libc::CLONE_NEWUSER as u64, 0), eperm);
        assert_eq!(call(libc::SYS_socket, libc::AF_INET as u64, 0), bpf::ALLOW);
        assert_eq!(call(libc::SYS_socket, libc::AF_NETLINK as u64, 0), eperm);
        assert_eq!(call(libc::SYS_ioctl, 1, libc::TIOCSTI), eperm);
        assert_eq!(call(libc::SYS_ioctl, 1, libc::TCGETS), bpf::ALLOW);
        assert_eq!(call(0x4000_0000 + libc::SYS_read, 0, 0), eperm, "x32");
        assert_eq!(run(&prog, 3, 0x4000_0003, [0; 6]), bpf::KILL_PROCESS, "i386");
        for (name, nr) in DENIED {
            let expect = if *nr == libc::SYS_clone3 { bpf::errno(libc::ENOSYS) } else { eperm };
            assert_eq!(call(*nr, 0, 0), expect, "{name}");
        }
    }

    #[test]
    fn the_search_is_shallow() {
        // Few instructions from the top to any answer, where the linear filter runs
        // hundreds: the kernel runs it for every number when it loads it.
        let (prog, linear) = (program().unwrap(), linear());
        let longest = |p: &[sock_filter]| (0..1024).map(|nr| steps(p, nr, AUDIT_ARCH, [0; 6]).1).max().unwrap_or(0);
        let (ours, theirs) = (longest(&prog), longest(&linear));
        assert!(ours <= 32 && theirs > 10 * ours, "{ours} vs {theirs} instructions");
    }
}
