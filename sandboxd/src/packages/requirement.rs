//! What an install may ask for: requirement strings of names, extras and version
//! specifiers only (`requests==2.32.3`, `pandas[parquet]>=2,<3`, `tabulate`),
//! checked before anything runs. No URL, path, option (`--index-url`), marker or
//! anything else an installer would read as more than a package to fetch from the
//! policy's index.

/// The most packages one install names.
pub const MAX_PACKAGES: usize = 32;
/// The most bytes of one requirement.
pub const MAX_LENGTH: usize = 200;

const OPERATORS: [&str; 8] = ["===", "==", "!=", "<=", ">=", "~=", "<", ">"];

/// Check a list of requirements; the first bad one is the error, saying why.
pub fn check_all(list: &[String]) -> Result<(), String> {
    if list.is_empty() || list.len() > MAX_PACKAGES {
        return Err(format!("packages lists {} requirements: give 1 to {MAX_PACKAGES}", list.len()));
    }
    list.iter().try_for_each(|r| check(r))
}

/// Check one requirement.
pub fn check(req: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "{:?} is not a requirement sandboxd installs ({why}): use a package name, optional [extras] and version specifiers, e.g. \"requests==2.32.3\" or \"pandas>=2,<3\"",
            crate::isolate::channel::excerpt(req.as_bytes())
        ))
    };
    if req.len() > MAX_LENGTH {
        return bad("too long");
    }
    let req = req.trim();
    let name_end =
        req.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))).unwrap_or(req.len());
    let (name, mut rest) = req.split_at(name_end);
    if !is_name(name) {
        return bad("no package name first");
    }
    rest = rest.trim_start();
    if let Some(after) = rest.strip_prefix('[') {
        let Some((extras, after)) = after.split_once(']') else { return bad("an [extras] list not closed") };
        if !extras.split(',').all(|e| is_name(e.trim())) {
            return bad("extras are names");
        }
        rest = after.trim_start();
    }
    if rest.is_empty() {
        return Ok(());
    }
    for spec in rest.split(',') {
        let spec = spec.trim();
        let Some(op) = OPERATORS.iter().find(|op| spec.starts_with(**op)) else {
            return bad("only version specifiers may follow the name (==, !=, <=, >=, ~=, <, >, ===)");
        };
        let version = spec[op.len()..].trim();
        if version.is_empty()
            || !version.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '*' | '+' | '!' | '_' | '-'))
        {
            return bad("a version is letters, digits and . * + ! _ -");
        }
    }
    Ok(())
}

/// A project name: letters, digits, `.`, `_`, `-`, beginning and ending with a
/// letter or digit.
fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_extras_and_version_specifiers_pass() {
        for ok in [
            "tabulate",
            "requests==2.32.3",
            "pandas>=2,<3",
            "pandas >= 2 , < 3",
            "scikit-learn~=1.6",
            "zope.interface!=5.*",
            "foo[bar,baz]==1.0.post1",
            "torch===2.5.1+cpu",
            "a",
            "X_y",
        ] {
            assert!(check(ok).is_ok(), "{ok}: {:?}", check(ok));
        }
    }

    #[test]
    fn urls_paths_options_and_markers_are_refused() {
        for bad in [
            "",
            "--index-url=https://evil.example/simple",
            "-e .",
            "requests @ https://evil.example/r.whl",
            "https://evil.example/r.whl",
            "./local",
            "/abs/path.whl",
            "git+https://x/y",
            "requests; python_version>'3'",
            "requests==",
            "requests==1.0 --hash=sha256:0",
            "requests == 1 0",
            "req uests",
            "-requests",
            "requests-",
            "foo[bar",
            "foo[ba r]",
            "requests\n--index-url x",
            "requests==1.0\u{0}",
        ] {
            let e = check(bad).unwrap_err();
            assert!(e.contains("is not a requirement sandboxd installs"), "{bad:?}: {e}");
        }
        assert!(check(&"a".repeat(MAX_LENGTH + 1)).is_err());
        assert!(check_all(&[]).is_err());
        assert!(check_all(&vec!["a".to_string(); MAX_PACKAGES + 1]).is_err());
        assert!(check_all(&["a".into(), "b==1".into()]).is_ok());
    }
}
