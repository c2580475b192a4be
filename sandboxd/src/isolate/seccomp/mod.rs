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
//! - `fallocate` fails with `EOPNOTSUPP`, so glibc's `posix_fallocate` writes the
//!   blocks instead: preallocated blocks would be holes on the host that a later
//!   write fills past the session's share of the host disk (`storage/share.rs`).
//!
//! A file per role: `list.rs` (the allow-list and what is refused, as data),
//! `rules.rs` (the rules made from it: pure, unit-tested), `compile.rs`
//! (libseccomp, and the tests that check its program), `program.rs` (the compiled
//! BPF as it travels), `bench.rs` (what loading it costs). libseccomp
//! compiles the rules ([`compile`]) into one program, a binary tree over the syscall
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

mod bench;
mod compile;
mod list;
mod program;
mod rules;

pub use bench::{bench_main, BENCH_ARG};
pub use compile::compile;
pub use list::{allowed, ALLOWED_SOCKETS, CLONE_NAMESPACE_FLAGS, DENIED, DENIED_IOCTLS, SOCK_TYPE_MASK};
pub use program::{Insn, Program};
pub use rules::{none_of, rules, Action, Masked, Rule};

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
