//! The seccomp filter: an allow-list with a default deny, in one BPF program.
//!
//! - Every syscall not named here fails with `EPERM`; a call made through another
//!   architecture's entry point (32-bit `int 0x80`) kills the process; x32 numbers
//!   are never in the list, so they fail with `EPERM`.
//! - `clone` with namespace flags, a `socket` other than a Unix one or TCP/UDP over
//!   IPv4/IPv6 ([`ALLOWED_SOCKETS`]: no MPTCP, which Landlock's TCP rules do not
//!   cover, no SCTP, raw, packet or netlink) and the TIOCSTI/TIOCLINUX ioctls fail
//!   with `EPERM`.
//! - `clone3` fails with `ENOSYS`, so glibc falls back to `clone`, whose flags the
//!   filter can inspect.
//!
//! The rules are data ([`allowed`], [`rules`]: pure, unit-tested). libseccomp
//! compiles them ([`compile`]) into one program, a binary tree over the syscall
//! numbers (`set_ctl_optimize(2)`, libseccomp >= 2.5): the kernel runs the filter
//! for every syscall number when it loads it (to cache the calls always allowed),
//! so its depth is most of what loading costs. The daemon compiles it once
//! ([`filter`], at start) and hands the exported BPF ([`Program`]) to every
//! sandbox in its spec; the sandbox's init, or a pooled template's fork, only
//! loads it ([`apply`]: the `seccomp` syscall). Nothing in a sandbox, and nothing
//! in `libsandboxd.so`, links libseccomp. The unit tests run the exported program
//! on every syscall number and the arguments that matter, and compare each answer
//! with a table written from the list above; `sandboxd __seccomp-load-bench`
//! (`bench/bench.py`) measures what loading it costs against an allow-all filter.

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
    // Linux AIO: every context counts against one host-wide limit (fs.aio-max-nr),
    // which one sandbox could hold whole for its session's life.
    ("io_setup", libc::SYS_io_setup),
    ("io_destroy", libc::SYS_io_destroy),
    ("io_getevents", libc::SYS_io_getevents),
    ("io_submit", libc::SYS_io_submit),
    ("io_cancel", libc::SYS_io_cancel),
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

/// The sockets a sandbox may create, as `(family, type, protocol)` (the type
/// without its `SOCK_NONBLOCK`/`SOCK_CLOEXEC` flags): Unix sockets of each type;
/// TCP and UDP over IPv4 and IPv6, named or as the type's default (protocol 0).
/// Nothing else: MPTCP (`IPPROTO_MPTCP` with `SOCK_STREAM`) binds and connects
/// where Landlock refuses TCP, and fills the host's TCP memory; SCTP, raw, packet,
/// netlink and the rest reach kernel code a sandbox has no use for.
pub const ALLOWED_SOCKETS: [(i32, i32, i32); 11] = [
    (libc::AF_UNIX, libc::SOCK_STREAM, 0),
    (libc::AF_UNIX, libc::SOCK_DGRAM, 0),
    (libc::AF_UNIX, libc::SOCK_SEQPACKET, 0),
    (libc::AF_INET, libc::SOCK_STREAM, 0),
    (libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_TCP),
    (libc::AF_INET, libc::SOCK_DGRAM, 0),
    (libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_UDP),
    (libc::AF_INET6, libc::SOCK_STREAM, 0),
    (libc::AF_INET6, libc::SOCK_STREAM, libc::IPPROTO_TCP),
    (libc::AF_INET6, libc::SOCK_DGRAM, 0),
    (libc::AF_INET6, libc::SOCK_DGRAM, libc::IPPROTO_UDP),
];

/// The bits of `socket`'s type argument that are the type (the kernel's
/// `SOCK_TYPE_MASK`); the others are `SOCK_NONBLOCK` and `SOCK_CLOEXEC`.
pub const SOCK_TYPE_MASK: u64 = 0xf;

/// ioctl requests that are refused on every fd: faking terminal input.
pub const DENIED_IOCTLS: [u64; 2] = [libc::TIOCSTI, libc::TIOCLINUX];

/// What the filter does with a call that matches a [`Rule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Errno(i32),
}

/// `(args[arg] & mask) == value`: the one kind of argument test the filter makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Masked {
    pub arg: u32,
    pub mask: u64,
    pub value: u64,
}

/// One rule of the filter: `action` for syscall `nr` when every test of `when`
/// holds (always, when it is empty). A call no rule matches fails with `EPERM`;
/// rules for one syscall are alternatives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub nr: i64,
    pub action: Action,
    pub when: Vec<Masked>,
}

/// The low 32 bits of an argument: what the kernel sees of an `int` or `unsigned
/// int` parameter, whatever the upper half of the register holds.
const LOW32: u64 = 0xffff_ffff;

/// Masked comparisons `(x & mask) == value` of a 32-bit `x`, one of which holds
/// exactly when `x` is none of `values`. (libseccomp has no "not equal under a
/// mask", and refuses a rule whose action is the default one, so "any request but
/// these" is written as the branches missing from the binary trie of `values`,
/// walked from the top bit: about 32 comparisons per value.)
pub fn none_of(values: &[u32]) -> Vec<(u32, u32)> {
    fn walk(values: &[u32], bit: u32, above: u32, out: &mut Vec<(u32, u32)>) {
        let b = 1u32 << bit;
        let mask = above | b;
        let (ones, zeros): (Vec<u32>, Vec<u32>) = values.iter().partition(|v| *v & b != 0);
        for (side, set) in [(zeros, 0), (ones, b)] {
            match side.first() {
                // No value takes this branch: everything down it is allowed.
                None => out.push((mask, (values[0] & above) | set)),
                // Down to the last bit: this value itself, which is refused.
                Some(_) if bit == 0 => {}
                Some(_) => walk(&side, bit - 1, mask, out),
            }
        }
    }
    let mut out = vec![];
    if values.is_empty() {
        out.push((0, 0));
    } else {
        walk(values, 31, 0, &mut out);
    }
    out
}

/// The whole filter as data: every call of [`allowed`], `clone` without namespace
/// flags, `socket`/`socketpair` of [`ALLOWED_SOCKETS`], `ioctl` but the denied
/// requests, `clone3` → `ENOSYS`.
pub fn rules() -> Vec<Rule> {
    let allow = |nr, when| Rule { nr, action: Action::Allow, when };
    let mut rules: Vec<Rule> = allowed().into_iter().map(|(_, nr)| allow(nr, vec![])).collect();
    rules.push(allow(libc::SYS_clone, vec![Masked { arg: 0, mask: CLONE_NAMESPACE_FLAGS, value: 0 }]));
    for nr in [libc::SYS_socket, libc::SYS_socketpair] {
        for (family, kind, protocol) in ALLOWED_SOCKETS {
            rules.push(allow(
                nr,
                vec![
                    Masked { arg: 0, mask: LOW32, value: family as u64 },
                    Masked { arg: 1, mask: SOCK_TYPE_MASK, value: kind as u64 },
                    Masked { arg: 2, mask: LOW32, value: protocol as u64 },
                ],
            ));
        }
    }
    let denied: Vec<u32> = DENIED_IOCTLS.iter().map(|r| *r as u32).collect();
    for (mask, value) in none_of(&denied) {
        rules.push(allow(libc::SYS_ioctl, vec![Masked { arg: 1, mask: mask.into(), value: value.into() }]));
    }
    rules.push(Rule { nr: libc::SYS_clone3, action: Action::Errno(libc::ENOSYS), when: vec![] });
    rules
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("libseccomp could not {step}: {source}")]
    Compile { step: &'static str, source: libseccomp::error::SeccompError },
    #[error("{0} is not a syscall number")]
    Number(i64),
    #[error("exporting the seccomp filter: {0}")]
    Export(#[from] std::io::Error),
    #[error("the seccomp filter is {0} bytes, not whole BPF instructions")]
    Malformed(usize),
    #[error("the seccomp filter has {0} instructions (the kernel takes 1 to 4096)")]
    Length(usize),
    #[error("no seccomp filter: the daemon could not compile it ({0})")]
    Unavailable(String),
    #[error("installing the seccomp filter: {0}")]
    Apply(nix::Error),
}

/// One classic BPF instruction, laid out as the kernel's `struct sock_filter`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

const _: () = assert!(std::mem::size_of::<Insn>() == std::mem::size_of::<libc::sock_filter>());
const _: () = assert!(std::mem::align_of::<Insn>() == std::mem::align_of::<libc::sock_filter>());

/// The kernel's limit on a classic BPF program (`BPF_MAXINSNS`).
const MAX_INSNS: usize = 4096;

/// A compiled filter: what the daemon hands each sandbox, which only loads it. On
/// the wire (in [`super::spec::SandboxSpec`] and [`super::spec::ChildSpec`]) the
/// instructions' bytes in base64.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Program(Vec<Insn>);

impl Program {
    /// The instructions as `struct sock_filter`s in memory (native byte order).
    pub fn from_bytes(bytes: &[u8]) -> Result<Program, Error> {
        if !bytes.len().is_multiple_of(8) {
            return Err(Error::Malformed(bytes.len()));
        }
        if bytes.len() / 8 > MAX_INSNS {
            return Err(Error::Length(bytes.len() / 8));
        }
        let word = |b: &[u8]| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        Ok(Program(
            bytes
                .chunks_exact(8)
                .map(|b| Insn { code: u16::from_ne_bytes([b[0], b[1]]), jt: b[2], jf: b[3], k: word(&b[4..]) })
                .collect(),
        ))
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.0
            .iter()
            .flat_map(|i| {
                let mut b = [0u8; 8];
                b[..2].copy_from_slice(&i.code.to_ne_bytes());
                b[2] = i.jt;
                b[3] = i.jf;
                b[4..].copy_from_slice(&i.k.to_ne_bytes());
                b
            })
            .collect()
    }

    pub fn instructions(&self) -> &[Insn] {
        &self.0
    }

    /// A one-instruction filter that allows everything: the baseline of the
    /// benchmark of loading a filter.
    pub fn allow_all() -> Program {
        Program(vec![Insn { code: 0x06, jt: 0, jf: 0, k: libc::SECCOMP_RET_ALLOW }])
    }
}

impl serde::Serialize for Program {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::Engine;
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(self.to_bytes()))
    }
}

impl<'de> serde::Deserialize<'de> for Program {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Program, D::Error> {
        use base64::Engine;
        let text = String::deserialize(d)?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(text).map_err(serde::de::Error::custom)?;
        Program::from_bytes(&bytes).map_err(serde::de::Error::custom)
    }
}

/// Compile `rules` with libseccomp into one BPF program: default `EPERM`; a call
/// through another architecture's entry point kills the process; x32 numbers fail
/// with `EPERM`; a binary tree over the syscall numbers (`set_ctl_optimize(2)`).
/// Runs in the daemon only: the sandboxes (and `libsandboxd.so`) never link it.
pub fn compile(rules: &[Rule]) -> Result<Program, Error> {
    use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext};
    let at = |step: &'static str| move |source| Error::Compile { step, source };
    let action = |a: Action| match a {
        Action::Allow => ScmpAction::Allow,
        Action::Errno(e) => ScmpAction::Errno(e),
    };
    let new = || -> Result<ScmpFilterContext, Error> {
        let mut f = ScmpFilterContext::new(ScmpAction::Errno(libc::EPERM)).map_err(at("make a filter"))?;
        f.set_act_badarch(ScmpAction::KillProcess).map_err(at("set the bad-architecture action"))?;
        f.set_ctl_optimize(2).map_err(at("ask for a binary tree (libseccomp >= 2.5)"))?;
        Ok(f)
    };
    let mut filter = new()?;
    for rule in rules {
        let nr = i32::try_from(rule.nr).map_err(|_| Error::Number(rule.nr))?;
        let tests: Vec<ScmpArgCompare> =
            rule.when.iter().map(|m| ScmpArgCompare::new(m.arg, ScmpCompareOp::MaskedEqual(m.mask), m.value)).collect();
        match tests.is_empty() {
            true => filter.add_rule(action(rule.action), nr),
            false => filter.add_rule_conditional(action(rule.action), nr, &tests),
        }
        .map_err(at("add a rule"))?;
    }
    // x32 calls come through the native entry point with the native architecture;
    // without x32 in the filter, libseccomp would send their numbers to the
    // bad-architecture action. An x32 part without rules gives them the default.
    #[cfg(target_arch = "x86_64")]
    {
        let mut x32 = new()?;
        x32.add_arch(libseccomp::ScmpArch::X32).map_err(at("add x32"))?;
        x32.remove_arch(libseccomp::ScmpArch::native()).map_err(at("add x32"))?;
        filter.merge(x32).map_err(at("add x32"))?;
    }
    let memfd = nix::sys::memfd::memfd_create(c"seccomp", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .map_err(std::io::Error::from)?;
    filter.export_bpf(&memfd).map_err(at("export the filter"))?;
    let mut file = std::fs::File::from(memfd);
    let mut bytes = vec![];
    use std::io::{Read, Seek};
    file.rewind()?;
    file.read_to_end(&mut bytes)?;
    let program = Program::from_bytes(&bytes)?;
    if program.0.is_empty() {
        return Err(Error::Length(0));
    }
    Ok(program)
}

/// The whole filter, compiled.
pub fn program() -> Result<Program, Error> {
    compile(&rules())
}

/// The daemon's filter, compiled once (by the first call) and handed to every
/// sandbox in its spec.
pub fn filter() -> Result<&'static Program, Error> {
    static FILTER: std::sync::OnceLock<Result<Program, String>> = std::sync::OnceLock::new();
    FILTER.get_or_init(|| program().map_err(|e| e.to_string())).as_ref().map_err(|e| Error::Unavailable(e.clone()))
}

/// Install `program` on the calling thread. Needs no-new-privs first. An empty
/// program (the daemon could not compile one) is refused: no sandbox runs without
/// its filter.
pub fn apply(program: &Program) -> Result<(), Error> {
    if program.0.is_empty() {
        return Err(Error::Unavailable("the sandbox's spec carries none".into()));
    }
    let len = u16::try_from(program.0.len()).map_err(|_| Error::Length(program.0.len()))?;
    let fprog = libc::sock_fprog { len, filter: program.0.as_ptr().cast::<libc::sock_filter>().cast_mut() };
    // SAFETY: `fprog` points at `len` instructions laid out as `struct sock_filter`
    // (`Insn` is repr(C) with the same fields, size and alignment), alive for the
    // call; the kernel copies them and does not write through the pointer.
    let rc = unsafe {
        libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &fprog as *const libc::sock_fprog)
    };
    if rc != 0 {
        return Err(Error::Apply(nix::Error::last()));
    }
    Ok(())
}

/// The hidden first argument of `sandboxd` that measures loading the filter
/// ([`bench_main`]); `bench/bench.py` runs it.
pub const BENCH_ARG: &str = "__seccomp-load-bench";

/// `sandboxd __seccomp-load-bench [LOADS]`: fork children that each load a
/// one-instruction allow-all filter or the real one, timing the `seccomp` call
/// itself (the kernel checks the program, runs it for every syscall number to
/// cache the calls always allowed, and compiles it), and exit. The kinds take
/// turns, round after round, so that whatever else the machine does weighs on
/// all alike. Prints one JSON object: the median milliseconds per load of each
/// kind and the real filter's length. Needs no privilege (each child sets
/// no-new-privs). Never returns.
pub fn bench_main() -> ! {
    let loads: usize = std::env::args().nth(2).and_then(|n| n.parse().ok()).unwrap_or(200);
    let fail = |e: &dyn std::fmt::Display| -> ! {
        eprintln!("sandboxd: {e}");
        std::process::exit(1)
    };
    let program = program().unwrap_or_else(|e| fail(&e));
    let allow_all = Program::allow_all();
    let kinds: Vec<(&str, &Program)> = vec![("allow_all", &allow_all), ("filter", &program)];
    const ROUNDS: usize = 10;
    let per_round = loads.div_ceil(ROUNDS);
    let mut samples: Vec<Vec<u64>> = vec![vec![]; kinds.len()];
    for _ in 0..ROUNDS {
        for (i, (_, prog)) in kinds.iter().enumerate() {
            for _ in 0..per_round {
                samples[i].push(time_load(prog).unwrap_or_else(|e| fail(&e)));
            }
        }
    }
    let ms: serde_json::Map<String, serde_json::Value> = kinds
        .iter()
        .zip(&mut samples)
        .map(|((name, _), s)| {
            s.sort_unstable();
            (name.to_string(), (s[s.len() / 2] as f64 / 1e6).into())
        })
        .collect();
    println!(
        "{}",
        serde_json::json!({"loads": per_round * ROUNDS, "instructions": program.0.len(), "ms_per_load": ms})
    );
    std::process::exit(0)
}

/// In a fork: set no-new-privs, then time loading `program`. The nanoseconds it
/// took, as the child reports them on a pipe.
fn time_load(program: &Program) -> Result<u64, std::io::Error> {
    use nix::unistd::{fork, ForkResult};
    use std::io::{Read, Write};
    let (r, w) = nix::unistd::pipe()?;
    // SAFETY: called from `main` before any thread exists; the child makes a few
    // syscalls and leaves through _exit.
    match unsafe { fork() }? {
        ForkResult::Child => {
            drop(r);
            let ok = nix::sys::prctl::set_no_new_privs().is_ok();
            let start = std::time::Instant::now();
            let ok = ok && apply(program).is_ok();
            let ns = start.elapsed().as_nanos() as u64;
            let ok = ok && std::fs::File::from(w).write_all(&ns.to_ne_bytes()).is_ok();
            // SAFETY: leave the child at once, without destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) }
        }
        ForkResult::Parent { child } => {
            drop(w);
            let mut bytes = [0u8; 8];
            let read = std::fs::File::from(r).read_exact(&mut bytes);
            let status = nix::sys::wait::waitpid(child, None)?;
            match (read, status) {
                (Ok(()), nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(u64::from_ne_bytes(bytes)),
                _ => Err(std::io::Error::other("a child could not load the filter")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000; // EM_X86_64, 64-bit, little-endian
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000; // EM_AARCH64, 64-bit, little-endian
    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const KILL_PROCESS: u32 = libc::SECCOMP_RET_KILL_PROCESS;
    const fn errno(e: i32) -> u32 {
        libc::SECCOMP_RET_ERRNO | (e as u32 & 0xffff)
    }

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

    #[test]
    fn none_of_holds_exactly_off_the_values() {
        let holds = |cmps: &[(u32, u32)], x: u32| cmps.iter().any(|(m, v)| x & m == *v);
        for values in [vec![], vec![0], vec![u32::MAX], vec![0x5412, 0x541c], vec![1, 2, 3, 0x8000_0000]] {
            let cmps = none_of(&values);
            let near = values.iter().flat_map(|v| (0..32).map(move |b| v ^ (1 << b)).chain([*v, v.wrapping_add(1)]));
            for x in (0..0x1_0000).chain([u32::MAX, 0x8000_0000, 0x7fff_ffff]).chain(near) {
                assert_eq!(holds(&cmps, x), !values.contains(&x), "{x:#x} against {values:x?}");
            }
        }
        assert!(none_of(&[0x5412, 0x541c]).len() <= 64);
    }

    #[test]
    fn a_program_travels_as_base64_and_bad_ones_are_refused() {
        let prog = program().unwrap();
        let json = serde_json::to_string(&prog).unwrap();
        assert_eq!(serde_json::from_str::<Program>(&json).unwrap(), prog);
        assert!(serde_json::from_str::<Program>("\"AAAA\"").is_err(), "3 bytes are no instruction");
        assert!(serde_json::from_str::<Program>("\"not base64!\"").is_err());
        let huge = Program(vec![Program::allow_all().0[0]; MAX_INSNS + 1]);
        assert!(serde_json::from_str::<Program>(&serde_json::to_string(&huge).unwrap()).is_err());
        // An empty program (the daemon could not compile one) parses, and is refused
        // when a sandbox would load it.
        let empty: Program = serde_json::from_str("\"\"").unwrap();
        assert!(matches!(apply(&empty), Err(Error::Unavailable(_))));
    }

    /// Run a classic BPF program on one `seccomp_data` (nr, arch, args), as the
    /// kernel would (the instructions these filters use, and nothing else): its
    /// answer and how many instructions it ran.
    fn steps(prog: &[Insn], nr: u32, arch: u32, args: [u64; 6]) -> (u32, usize) {
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

    fn run(prog: &[Insn], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        steps(prog, nr, arch, args).0
    }

    /// What the filter must answer, written from the module's documentation and
    /// nothing else (not from [`rules`]).
    fn intended(nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let low = |i: usize| args[i] as u32;
        if arch != AUDIT_ARCH {
            return KILL_PROCESS;
        }
        let is = |sys: i64| nr as i64 == sys;
        if allowed().iter().any(|(_, n)| is(*n)) {
            ALLOW
        } else if is(libc::SYS_clone) {
            if low(0) as u64 & CLONE_NAMESPACE_FLAGS == 0 {
                ALLOW
            } else {
                errno(libc::EPERM)
            }
        } else if is(libc::SYS_socket) || is(libc::SYS_socketpair) {
            let asked = (low(0) as i32, (args[1] & SOCK_TYPE_MASK) as i32, low(2) as i32);
            if ALLOWED_SOCKETS.contains(&asked) {
                ALLOW
            } else {
                errno(libc::EPERM)
            }
        } else if is(libc::SYS_ioctl) {
            if DENIED_IOCTLS.iter().any(|r| *r as u32 == low(1)) {
                errno(libc::EPERM)
            } else {
                ALLOW
            }
        } else if is(libc::SYS_clone3) {
            errno(libc::ENOSYS)
        } else {
            errno(libc::EPERM)
        }
    }

    /// Every syscall number (and x32's, and a few beyond), under every architecture
    /// that matters, with the arguments the conditions look at.
    fn cases() -> Vec<(u32, u32, [u64; 6])> {
        let ns = (libc::CLONE_NEWUSER | libc::CLONE_NEWNET) as u64;
        let thread = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
        let arg_sets: Vec<[u64; 6]> = [
            0,
            ns,
            thread,
            thread | libc::CLONE_NEWPID as u64,
            libc::CLONE_NEWNS as u64 | 1 << 40,
            1 << 40, // high half only: ignored, as the kernel truncates these `int` arguments
            libc::AF_UNIX as u64,
            libc::AF_INET6 as u64,
            libc::AF_INET as u64 | 0xffff_ffff_0000_0000,
            libc::AF_NETLINK as u64,
            libc::AF_PACKET as u64 | 1 << 32,
        ]
        .iter()
        .flat_map(|&a0| {
            [
                0,
                libc::TIOCSTI,
                libc::TIOCLINUX,
                libc::TIOCSTI | 1 << 32,
                libc::TIOCLINUX | 1 << 63,
                libc::TCGETS,
                0x5413,
                libc::SOCK_STREAM as u64,
                libc::SOCK_DGRAM as u64 | libc::SOCK_CLOEXEC as u64,
                libc::SOCK_SEQPACKET as u64 | libc::SOCK_NONBLOCK as u64,
                libc::SOCK_RAW as u64,
            ]
            .map(|a1| [a0, a1, 0, 0, 0, 0])
        })
        .flat_map(|args| {
            // Protocols: the default, TCP, UDP, MPTCP (262), SCTP, and TCP with a
            // high half the kernel drops.
            [0u64, 6, 17, 262, 132, 6 | 1 << 32].map(|a2| [args[0], args[1], a2, 0, 0, 0])
        })
        .collect();
        let numbers = (0..1024).chain((0..1024).map(|n| 0x4000_0000 + n)).chain([0x3fff_ffff, 0x8000_0000, u32::MAX]);
        let mut out = vec![];
        for nr in numbers {
            for args in &arg_sets {
                for arch in [AUDIT_ARCH, 0x4000_0003 /* i386 */, 0] {
                    out.push((nr, arch, *args));
                }
            }
        }
        out
    }

    #[test]
    fn libseccomps_program_answers_as_intended() {
        let prog = program().unwrap();
        assert!(prog.0.len() <= MAX_INSNS);
        let mut checked = 0;
        for (nr, arch, args) in cases() {
            assert_eq!(
                run(&prog.0, nr, arch, args),
                intended(nr, arch, args),
                "nr {nr:#x} arch {arch:#x} args {args:x?}"
            );
            checked += 1;
        }
        assert!(checked > 100_000);
    }

    #[test]
    fn the_program_gives_the_documented_answers() {
        let prog = program().unwrap();
        let eperm = errno(libc::EPERM);
        let call = |nr: i64, a0: u64, a1: u64| run(&prog.0, nr as u32, AUDIT_ARCH, [a0, a1, 0, 0, 0, 0]);
        assert_eq!(call(libc::SYS_read, 0, 0), ALLOW);
        assert_eq!(call(libc::SYS_mount, 0, 0), eperm);
        assert_eq!(call(libc::SYS_clone3, 0, 0), errno(libc::ENOSYS));
        assert_eq!(call(libc::SYS_clone, libc::SIGCHLD as u64, 0), ALLOW);
        assert_eq!(call(libc::SYS_clone, libc::CLONE_NEWUSER as u64, 0), eperm);
        let socket = |f: i32, t: i32, p: i32| {
            run(&prog.0, libc::SYS_socket as u32, AUDIT_ARCH, [f as u64, t as u64, p as u64, 0, 0, 0])
        };
        assert_eq!(socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0), ALLOW);
        assert_eq!(socket(libc::AF_INET6, libc::SOCK_DGRAM, libc::IPPROTO_UDP), ALLOW);
        assert_eq!(socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0), ALLOW);
        assert_eq!(socket(libc::AF_INET, libc::SOCK_STREAM, 262), eperm, "MPTCP");
        assert_eq!(socket(libc::AF_INET, libc::SOCK_SEQPACKET, libc::IPPROTO_SCTP), eperm, "SCTP");
        assert_eq!(socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP), eperm, "raw");
        assert_eq!(socket(libc::AF_NETLINK, libc::SOCK_RAW, 0), eperm);
        assert_eq!(call(libc::SYS_ioctl, 1, libc::TIOCSTI), eperm);
        assert_eq!(call(libc::SYS_ioctl, 1, libc::TIOCSTI | 1 << 32), eperm, "the kernel truncates the request");
        assert_eq!(call(libc::SYS_ioctl, 1, libc::TCGETS), ALLOW);
        assert_eq!(call(0x4000_0000 + libc::SYS_read, 0, 0), eperm, "x32");
        assert_eq!(run(&prog.0, 3, 0x4000_0003, [0; 6]), KILL_PROCESS, "i386");
        for (name, nr) in DENIED {
            let expect = if *nr == libc::SYS_clone3 { errno(libc::ENOSYS) } else { eperm };
            assert_eq!(call(*nr, 0, 0), expect, "{name}");
        }
    }

    #[test]
    fn the_program_is_a_shallow_tree() {
        // Few instructions from the top to the answer for any syscall number whose
        // answer does not depend on its arguments: the kernel runs the filter for
        // every number when it loads it (to cache the calls always allowed), and
        // on every call. (`ioctl` tests its request against the branches of
        // [`none_of`], a few dozen.)
        let prog = program().unwrap();
        let conditional = [libc::SYS_clone, libc::SYS_socket, libc::SYS_socketpair, libc::SYS_ioctl];
        let depth = |nr: u32| steps(&prog.0, nr, AUDIT_ARCH, [0; 6]).1;
        let longest = (0..1024).filter(|nr| !conditional.contains(&(*nr as i64))).map(depth).max().unwrap_or(0);
        eprintln!("{} instructions, at most {longest} run for a syscall number", prog.0.len());
        assert!(longest <= 32, "{longest} instructions");
        assert!(depth(libc::SYS_ioctl as u32) <= 160);
    }
}
