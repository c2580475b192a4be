//! How a workspace path is written outside the daemon: as text (a listing's or an
//! artifact's `path`, a `DELETE`'s answer, the paths MCP tools and `sandboxctl`
//! take) and in a URL (a file route's `{path}`, a listing's `url`).
//!
//! A workspace path is bytes: sandboxed code names its files as it likes (any
//! byte but `/` and NUL), so a name need not be UTF-8, and may look like an
//! escape or a percent-encoding. Both forms are lossless, so that every path a
//! listing shows names exactly one file and reaches it:
//!
//! - **text**: the name's UTF-8 as it is, except that each byte of a sequence that
//!   is not UTF-8 is written `\xHH` (two lowercase hex digits) and a backslash is
//!   written `\\`. So `b"a\xffb"` is `a\xffb`, and a file literally named `a\xffb`
//!   is `a\\xffb`: two names, two texts. [`parse`] reads it back (`\xHH` in either
//!   case; a backslash that starts no escape stands for itself).
//! - **URL**: every byte but ASCII letters, digits, `-_.~` and the `/` between
//!   components as `%XX`, and a route decodes it exactly once, to bytes
//!   ([`from_url`]): a name with `%2e` in it is `%252e`, and reaches that file.

use std::fmt::Write;

/// The text form of the raw path `raw` (see the module doc).
pub fn text(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    for chunk in raw.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// The raw path whose text form is `text` (see the module doc): `\\` is a
/// backslash, `\xHH` (either case) the byte HH, and a backslash that starts
/// neither stands for itself, so every text names a path (what a person types,
/// `dir\file.txt`, is the file of that name, as in a URL). Listings always write
/// `\\`, so the paths they give are read back exactly.
pub fn parse(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let hex = |at: usize| bytes.get(at).and_then(|b| (*b as char).to_digit(16));
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = match (bytes[i], bytes.get(i + 1)) {
            (b'\\', Some(b'\\')) => Some((b'\\', 2)),
            (b'\\', Some(b'x')) => hex(i + 2).zip(hex(i + 3)).map(|(hi, lo)| ((hi * 16 + lo) as u8, 4)),
            _ => None,
        };
        let (byte, len) = escape.unwrap_or((bytes[i], 1));
        out.push(byte);
        i += len;
    }
    out
}

/// The URL form of the raw path `raw`: each component percent-encoded byte by
/// byte, `/` between them. A component that is `.` or `..` (a client's path,
/// before the daemon refuses it) is encoded whole, so that nothing on the way (a
/// proxy) can take it for a step up to another route.
pub fn url(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    for (i, part) in raw.split(|b| *b == b'/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        encode_segment(part, part != b"." && part != b"..", &mut out);
    }
    out
}

/// Append `part` to `out` as one URL path segment: unreserved bytes as they are,
/// every other byte (`/` included) as `%XX`. `keep_dot`: `.` as it is too;
/// without it `.` and `..` cannot become path steps either.
pub fn encode_segment(part: &[u8], keep_dot: bool, out: &mut String) {
    for &b in part {
        if b.is_ascii_alphanumeric() || b"-_~".contains(&b) || (keep_dot && b == b'.') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

/// The bytes of a URL's (still encoded) path: each `%XX` decoded, once; a `%` not
/// followed by two hex digits stays as it is.
pub fn from_url(encoded: &str) -> Vec<u8> {
    percent_encoding::percent_decode_str(encoded).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names as sandboxed code can make them: each has one text and one URL, both
    /// read back to its bytes, and no two names share either.
    #[test]
    fn every_name_has_one_text_and_one_url_that_read_back_to_it() {
        let names: [&[u8]; 14] = [
            b"plain.txt",
            b"d/sub/chart.png",
            b"a\xffb",
            b"a\\xffb",
            b"a\\\\xffb",
            "a\u{fffd}b".as_bytes(),
            b"a%FFb",
            b"a%2e%2e%2fb",
            b"%00",
            b"x%5c..%5cy",
            b"back\\slash",
            b"\x01\x02\x1b[31m\n",
            b"\xc3",
            "r\u{e9}sum\u{e9} \u{1f600}".as_bytes(),
        ];
        let mut texts = std::collections::BTreeSet::new();
        let mut urls = std::collections::BTreeSet::new();
        for name in names {
            let t = text(name);
            assert_eq!(parse(&t), name, "{t:?}");
            let u = url(name);
            assert!(u.bytes().all(|b| b.is_ascii_graphic()), "{u}");
            assert_eq!(from_url(&u), name, "{u}");
            assert!(texts.insert(t.clone()), "two names have the text {t:?}");
            assert!(urls.insert(u.clone()), "two names have the URL {u}");
        }
        assert_eq!(text(b"a\xffb"), "a\\xffb");
        assert_eq!(text(b"a\\xffb"), "a\\\\xffb");
        assert_eq!(text("a\u{fffd}b".as_bytes()), "a\u{fffd}b");
        assert_eq!(url(b"a\xffb"), "a%FFb");
        assert_eq!(url(b"a%2e"), "a%252e");
        assert_eq!(url(b"a b/c#d.png"), "a%20b/c%23d.png");
        assert_eq!(url(b"../../x/./..y.z"), "%2E%2E/%2E%2E/x/%2E/..y.z");
    }

    #[test]
    fn a_backslash_that_starts_no_escape_stands_for_itself() {
        for (text, raw) in [
            ("a\\", &b"a\\"[..]),
            ("a\\q", b"a\\q"),
            ("a\\x4", b"a\\x4"),
            ("a\\xg0", b"a\\xg0"),
            ("dir\\file.txt", b"dir\\file.txt"),
            ("\\x41\\xFf", b"A\xff"),
            ("a\\\\q", b"a\\q"),
        ] {
            assert_eq!(parse(text), raw, "{text:?}");
        }
    }
}
