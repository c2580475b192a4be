//! The allow-list and what is refused, as data: the syscalls allowed without
//! conditions, the families that must never be, and the arguments the conditional
//! rules look at ([`super::rules`]).

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
    // EOPNOTSUPP (glibc's posix_fallocate then writes the blocks itself): blocks
    // preallocated in a workspace's ext4 are holes in its image on the host, and
    // writing into them later takes host disk past the session's share of it
    // (storage/share.rs), which ext4 checks only when it allocates.
    ("fallocate", libc::SYS_fallocate),
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
}
