//! Session ids and tenant keys: how the id a caller names becomes the key the
//! manager, the session's directory and its kernel go by (see the module doc of
//! [`super`]), and how a stored session is shown back to its caller.

use super::Error;
use crate::model::session::SessionInfo;
use std::time::SystemTime;

/// A time as the API shows it: RFC 3339, UTC, to the second.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Session ids: `^[A-Za-z0-9_-]{1,64}$`.
pub fn validate_id(id: &str) -> Result<(), Error> {
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err(Error::InvalidId(id.to_string()));
    }
    Ok(())
}

/// An id for a session whose caller chose none.
pub fn new_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The tenant label of a token identity (its hash): 16 hex digits.
fn tenant(owner: &str) -> &str {
    owner.get(..16).unwrap_or(owner)
}

/// The key of session `id` as addressed by `owner`: a token's caller addresses its
/// own id space; a caller without a token addresses keys (`id`, or `tenant.id`).
pub fn key(id: &str, owner: Option<&str>) -> Result<String, Error> {
    match owner {
        Some(o) => {
            validate_id(id)?;
            Ok(format!("{}.{id}", tenant(o)))
        }
        None => {
            let is_key = id.split_once('.').is_some_and(|(t, rest)| {
                t.len() == 16
                    && t.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                    && validate_id(rest).is_ok()
            });
            if !is_key {
                validate_id(id)?;
            }
            Ok(id.to_string())
        }
    }
}

/// The key of a stored session.
pub(super) fn key_of(info: &SessionInfo) -> String {
    match &info.owner {
        Some(o) => format!("{}.{}", tenant(o), info.id),
        None => info.id.clone(),
    }
}

/// `info` as `owner` sees it: its id in the caller's space.
pub(super) fn shown(info: &SessionInfo, busy: bool, disk_bytes: u64, owner: Option<&str>) -> SessionInfo {
    let id = if owner.is_some() { info.id.clone() } else { key_of(info) };
    SessionInfo { id, busy, disk_bytes, ..info.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_token_has_its_own_id_space_and_the_operator_addresses_keys() {
        let a = "0123456789abcdef0123456789abcdef";
        let b = "fedcba9876543210fedcba9876543210";
        assert_eq!(key("x", Some(a)).unwrap(), "0123456789abcdef.x");
        assert_ne!(key("x", Some(a)).unwrap(), key("x", Some(b)).unwrap());
        assert_eq!(key("x", None).unwrap(), "x");
        assert_eq!(key("0123456789abcdef.x", None).unwrap(), "0123456789abcdef.x");
        // A token cannot name a key, and nobody names a malformed one.
        assert!(matches!(key("0123456789abcdef.x", Some(b)), Err(Error::InvalidId(_))));
        for bad in [
            "0123456789ABCDEF.x",
            "0123.x",
            "0123456789abcdef.",
            "0123456789abcdef.x.y",
            "../x",
            "",
            "S/files/x",
            "a b",
        ] {
            assert!(matches!(key(bad, None), Err(Error::InvalidId(_))), "{bad}");
        }
    }
}
