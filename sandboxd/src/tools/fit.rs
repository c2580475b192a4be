//! Every tool result fits the official MCP SDKs' 1 MiB message: sizes as JSON,
//! and text cut to a size with a note of what was cut.

use super::images::MAX_RESULT_BYTES;

/// Most bytes of JSON-escaped text one result's text may take: what a result
/// carries ([`MAX_RESULT_BYTES`]) less room for notes and the envelope.
pub const MAX_TEXT: usize = MAX_RESULT_BYTES - 16 * 1024;
/// Of that, what a run's text takes at most; its images share the rest.
pub const MAX_RUN_TEXT: usize = 512 * 1024;

/// Bytes `c` takes in a JSON string.
fn escaped(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// Bytes `s` takes inside a JSON string (without its quotes).
pub fn escaped_len(s: &str) -> usize {
    s.chars().map(escaped).sum()
}

/// The longest start of `s` that takes at most `max` bytes in a JSON string.
pub fn cut(s: &str, max: usize) -> &str {
    let mut used = 0;
    for (i, c) in s.char_indices() {
        used += escaped(c);
        if used > max {
            return &s[..i];
        }
    }
    s
}

/// Shares of `budget` for parts that want `wants` each: all they want when it
/// fits, else an equal share each, what a small one leaves going to the others.
pub fn shares(wants: &[usize], budget: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..wants.len()).collect();
    order.sort_by_key(|&i| wants[i]);
    let mut out = vec![0; wants.len()];
    let mut left = budget;
    for (n, &i) in order.iter().enumerate() {
        let share = left / (wants.len() - n);
        out[i] = wants[i].min(share);
        left -= out[i];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_by_its_json_size() {
        assert_eq!(escaped_len("a\"\n\u{1}é"), 1 + 2 + 2 + 6 + 2);
        assert_eq!(serde_json::to_string("a\"\n\u{1}é").unwrap().len(), escaped_len("a\"\n\u{1}é") + 2);
        assert_eq!(cut("abc", 2), "ab");
        assert_eq!(cut("a\u{1}b", 6), "a");
        assert_eq!(cut("éé", 3), "é");
        assert_eq!(cut("abc", 10), "abc");
        assert_eq!(shares(&[10, 1000, 1000], 510), vec![10, 250, 250]);
        assert_eq!(shares(&[10, 20], 100), vec![10, 20]);
    }
}
