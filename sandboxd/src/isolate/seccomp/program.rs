//! A compiled filter ([`Program`]): classic BPF instructions laid out as the
//! kernel's `struct sock_filter`, carried in a sandbox's spec as base64.

use super::Error;

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
pub(super) const MAX_INSNS: usize = 4096;

/// A compiled filter: what the daemon hands each sandbox, which only loads it. On
/// the wire (in [`super::spec::SandboxSpec`] and [`super::spec::ChildSpec`]) the
/// instructions' bytes in base64.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Program(pub(super) Vec<Insn>);

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isolate::seccomp::{apply, program};
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
}
