//! The whole filter as rules ([`rules`]): pure data made from [`super::list`],
//! which [`super::compile`] hands to libseccomp.

use super::list::{allowed, ALLOWED_SOCKETS, CLONE_NAMESPACE_FLAGS, DENIED_IOCTLS, SOCK_TYPE_MASK};

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
/// requests, `clone3` → `ENOSYS`, `fallocate` → `EOPNOTSUPP`.
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
    rules.push(Rule { nr: libc::SYS_fallocate, action: Action::Errno(libc::EOPNOTSUPP), when: vec![] });
    rules
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
