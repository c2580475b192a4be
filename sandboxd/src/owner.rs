//! Owner ids: who a bearer token is, without the token.
//!
//! A token's owner id names its sessions (their key `<tenant>.<id>`, where the
//! tenant is the id's first 16 hex digits, is also their directory and shows in
//! the log). It is HMAC-SHA256 of the token under a secret of this daemon's own
//! (`state_dir/owner.key`, 32 random bytes, root's, 0600, made at the first
//! start and kept, so ids survive restarts): without the secret, nothing in a log
//! line or a directory name can be tried against guessed tokens. Daemons before
//! this one used an unsalted hash (sha256 of the token, [`legacy_id`]); sessions
//! they left are re-keyed at start ([`OwnerKey::rekeying`],
//! `session::Manager::recover`).

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The secret's file in the state directory.
pub const KEY_FILE: &str = "owner.key";
const KEY_BYTES: usize = 32;
/// An owner id: 32 hex digits (128 bits).
const ID_HEX: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("owner key {path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("owner key {path} is not what this daemon made ({why}): restore it from a backup; or remove it, and the sessions of tokens from before then will no longer be found by their tokens")]
    Invalid { path: PathBuf, why: String },
}

/// The per-daemon secret that owner ids are keyed with. Never logged, never shown.
#[derive(Clone)]
pub struct OwnerKey([u8; KEY_BYTES]);

impl std::fmt::Debug for OwnerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OwnerKey(..)")
    }
}

impl OwnerKey {
    /// The key kept in `state_dir`, made (from the kernel's random source) when
    /// there is none yet. A key file that is not 32 bytes, not a regular file or
    /// not root's stops the daemon: a new key would orphan every token's sessions.
    pub fn load_or_create(state_dir: &Path) -> Result<OwnerKey, Error> {
        let path = state_dir.join(KEY_FILE);
        let io = |error| Error::Io { path: path.clone(), error };
        let mut fresh = [0u8; KEY_BYTES];
        std::fs::File::open("/dev/urandom").and_then(|mut r| r.read_exact(&mut fresh)).map_err(io)?;
        // Written whole under another name, then linked into place: a crash never
        // leaves a short key, and of two starts racing only one key wins.
        let tmp = state_dir.join(format!("{KEY_FILE}.{}.tmp", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&fresh).and_then(|()| f.sync_all()));
        let linked = written.and_then(|()| std::fs::hard_link(&tmp, &path));
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                tracing::info!(path = %path.display(), "made this daemon's owner key (owner ids of tokens are keyed with it)");
                return Ok(OwnerKey(fresh));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(e)),
        }
        let invalid = |why: String| Error::Invalid { path: path.clone(), why };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        // The daemon's own (root's): nobody else may have chosen it.
        if !meta.is_file() || meta.uid() != nix::unistd::geteuid().as_raw() {
            return Err(invalid("not a regular file of the daemon's user".into()));
        }
        if meta.mode() & 0o077 != 0 {
            file.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(io)?;
        }
        let mut bytes = Vec::with_capacity(KEY_BYTES + 1);
        file.take(KEY_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(io)?;
        let key: [u8; KEY_BYTES] =
            bytes.try_into().map_err(|b: Vec<u8>| invalid(format!("{} bytes, not {KEY_BYTES}", b.len())))?;
        Ok(OwnerKey(key))
    }

    /// A key given as bytes (tests).
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> OwnerKey {
        OwnerKey(bytes)
    }

    /// The owner id of `token`: HMAC-SHA256 under this key, 32 hex digits.
    pub fn id(&self, token: &str) -> String {
        // HMAC takes a key of any length: this cannot fail.
        let mut mac = match Hmac::<Sha256>::new_from_slice(&self.0) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC-SHA256 takes keys of any length"),
        };
        mac.update(token.as_bytes());
        hex(&mac.finalize().into_bytes())
    }

    /// For each of `tokens`: (its id under earlier daemons, its id now), to re-key
    /// the sessions an earlier daemon left.
    pub fn rekeying<'a>(&self, tokens: impl IntoIterator<Item = &'a String>) -> Vec<(String, String)> {
        tokens.into_iter().map(|t| (legacy_id(t), self.id(t))).collect()
    }
}

/// A token's owner id as daemons before keyed ids made it: sha256, 32 hex digits.
pub fn legacy_id(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    let mut text = crate::rootfs::hex(bytes);
    text.truncate(ID_HEX);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_hmac_sha256_of_the_token() {
        // RFC 4231, test case 2: key "Jefe", "what do ya want for nothing?".
        let mut key = [0u8; KEY_BYTES];
        key[..4].copy_from_slice(b"Jefe");
        // A key shorter than the block is zero-padded by HMAC: the same MAC.
        assert_eq!(OwnerKey::from_bytes(key).id("what do ya want for nothing?"), "5bdcc146bf60754e6a042426089575c7");
        let a = OwnerKey::from_bytes([1; KEY_BYTES]);
        let b = OwnerKey::from_bytes([2; KEY_BYTES]);
        assert_eq!(a.id("tok").len(), 32);
        assert_ne!(a.id("tok"), b.id("tok"));
        assert_ne!(a.id("tok"), legacy_id("tok"));
        assert_eq!(legacy_id("tok"), crate::rootfs::hex(&Sha256::digest(b"tok"))[..32]);
        assert!(format!("{a:?}").ends_with("(..)"));
    }

    #[test]
    fn the_key_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let first = OwnerKey::load_or_create(dir.path()).unwrap();
        let path = dir.path().join(KEY_FILE);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!((meta.len(), meta.mode() & 0o777), (32, 0o600));
        let again = OwnerKey::load_or_create(dir.path()).unwrap();
        assert_eq!(first.id("t"), again.id("t"));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file is left");
        // A damaged key stops the daemon rather than orphan every token's sessions.
        std::fs::write(&path, b"short").unwrap();
        let err = OwnerKey::load_or_create(dir.path()).unwrap_err().to_string();
        assert!(err.contains("5 bytes, not 32") && err.contains("restore it"), "{err}");
    }
}
