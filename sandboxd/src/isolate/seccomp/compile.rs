//! libseccomp compiles the rules into one program, in the daemon only. The tests
//! run the program in a BPF interpreter on every syscall number and the arguments
//! that matter, and compare each answer with a table written from the module
//! documentation.

use super::program::Program;
use super::rules::{Action, Rule};
use super::Error;

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

#[cfg(test)]
mod tests {
    use super::super::list::*;
    use super::super::program;
    use super::super::program::{Insn, MAX_INSNS};

    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000; // EM_X86_64, 64-bit, little-endian
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000; // EM_AARCH64, 64-bit, little-endian
    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const KILL_PROCESS: u32 = libc::SECCOMP_RET_KILL_PROCESS;
    const fn errno(e: i32) -> u32 {
        libc::SECCOMP_RET_ERRNO | (e as u32 & 0xffff)
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
        } else if is(libc::SYS_fallocate) {
            errno(libc::EOPNOTSUPP)
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
        assert_eq!(call(libc::SYS_fallocate, 3, 0), errno(libc::EOPNOTSUPP));
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
            let expect = match *nr {
                libc::SYS_clone3 => errno(libc::ENOSYS),
                libc::SYS_fallocate => errno(libc::EOPNOTSUPP),
                _ => eperm,
            };
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
