//! Which template a Python run goes to: one of its policy's own, whose interpreter
//! has imported the policy's `preload`, or one of the policy's bare templates, an
//! interpreter that has imported nothing beyond the runner (SOCK's zygote tree,
//! two levels deep).
//!
//! A fork's cost grows with the memory it copies and, at its end, unmaps: three
//! processes per run (the fork, the run's init, its program) each copy the
//! template's page tables. For a template that has imported numpy, pandas and
//! matplotlib (~130 MiB, 70 of them its own) that is most of a pooled run's CPU:
//! measured on this project's 2-core machine, a pooled `print(1)` cost 60 ms of
//! CPU in all from such a template, 19 ms from a bare one, and a cold sandbox 37.
//! Code that imports none of the preload gains nothing from it, so it goes to a
//! bare template.
//!
//! The choice reads the code's import statements with a scan of its words, not a
//! parse ([`imported`]), and leans to the policy's own template: a word `import`
//! inside a string or a comment counts, and so does `__import__` or
//! `import_module` anywhere. Code goes to a bare template only when every module it
//! imports by name is in the standard library ([`STDLIB`]). A wrong guess costs
//! time, never correctness: a bare template's fork imports what the code asks for
//! as a cold interpreter would.

use crate::model::policy::Policy;
use std::collections::HashSet;
use std::sync::OnceLock;

/// The top-level modules of the rootfs's Python standard library, one per line:
/// `sys.stdlib_module_names` of its Python 3.11 (a test compares them).
const STDLIB: &str = include_str!("stdlib.txt");

/// What a bare template's key adds to its policy's name (`default/bare`): no
/// policy's name holds a `/` (it is a file's name).
const BARE: &str = "/bare";

/// The pool's key of `policy`'s bare templates.
pub fn bare_name(policy: &str) -> String {
    format!("{policy}{BARE}")
}

/// The policy a pool key is of, and whether the key is its bare tier's.
pub fn split(key: &str) -> (&str, bool) {
    match key.strip_suffix(BARE) {
        Some(own) => (own, true),
        None => (key, false),
    }
}

/// Code longer than this is not read for its imports: it goes to the policy's own
/// templates (a policy may allow far more code than any import list needs reading).
const SCAN_MAX: usize = 1 << 20;

/// The keys of a policy's two tiers, from either: its bare tier's first (its
/// templates start in milliseconds), then its own.
pub fn both(key: &str) -> [String; 2] {
    let (own, _) = split(key);
    [bare_name(own), own.to_string()]
}

/// The bare tier of `policy`: the same policy, its preload empty, under its own
/// key; `None` for a policy that preloads nothing (its templates are bare already).
pub fn bare_of(policy: &Policy) -> Option<Policy> {
    (!policy.preload.is_empty()).then(|| Policy { name: bare_name(&policy.name), preload: vec![], ..policy.clone() })
}

/// Whether `code` may use what a preloading template imported: it imports by
/// name a module outside the standard library, or imports by a computed name.
pub fn wants_preload(code: &str) -> bool {
    if code.len() > SCAN_MAX {
        return true;
    }
    let stdlib = stdlib();
    let words = Words::new(code).collect::<Vec<_>>();
    if words.iter().any(|w| matches!(w, Token::Word("__import__" | "import_module"))) {
        return true;
    }
    imported(&words).into_iter().any(|m| !stdlib.contains(m))
}

fn stdlib() -> &'static HashSet<&'static str> {
    static SET: OnceLock<HashSet<&'static str>> = OnceLock::new();
    SET.get_or_init(|| STDLIB.split_whitespace().collect())
}

/// The code's pieces as far as import statements go.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Token<'a> {
    Word(&'a str),
    Dot,
    Comma,
    /// The end of a statement: a line's end (not after a backslash) or `;`.
    End,
    Other,
}

struct Words<'a> {
    code: &'a str,
    at: usize,
}

impl<'a> Words<'a> {
    fn new(code: &'a str) -> Words<'a> {
        Words { code, at: 0 }
    }
}

fn is_word_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

impl<'a> Iterator for Words<'a> {
    type Item = Token<'a>;

    fn next(&mut self) -> Option<Token<'a>> {
        loop {
            let rest = &self.code[self.at..];
            let c = rest.chars().next()?;
            if is_word_char(c) {
                let len = rest.find(|c: char| !is_word_char(c)).unwrap_or(rest.len());
                self.at += len;
                return Some(Token::Word(&rest[..len]));
            }
            self.at += c.len_utf8();
            match c {
                '\\' if rest[1..].starts_with('\n') => self.at += 1,
                '\\' if rest[1..].starts_with("\r\n") => self.at += 2,
                ' ' | '\t' | '\r' | '\x0c' | '\\' => {}
                '\n' | ';' => return Some(Token::End),
                '.' => return Some(Token::Dot),
                ',' => return Some(Token::Comma),
                _ => return Some(Token::Other),
            }
        }
    }
}

/// The top-level names of the modules the statements in `words` import:
/// `import a.b as c, d` gives `a` and `d`, `from a.b import c` gives `a`, a relative
/// `from . import c` or `from .m import c` gives `.`.
fn imported<'a>(words: &[Token<'a>]) -> Vec<&'a str> {
    let mut found = vec![];
    let mut i = 0;
    while i < words.len() {
        match words[i] {
            Token::Word("from") => {
                i += 1;
                let module = match words.get(i) {
                    Some(Token::Dot) => Some("."),
                    Some(Token::Word(name)) => Some(*name),
                    _ => None,
                };
                // The dotted name, then `import` (else this `from` is `yield from`,
                // `raise ... from`, or a word in a string).
                while matches!(words.get(i), Some(Token::Word(_) | Token::Dot))
                    && words.get(i) != Some(&Token::Word("import"))
                {
                    i += 1;
                }
                if let (Some(module), Some(Token::Word("import"))) = (module, words.get(i)) {
                    found.push(module);
                    // What follows are names in that module, not modules: skip them.
                    while !matches!(words.get(i), None | Some(Token::End)) {
                        i += 1;
                    }
                }
            }
            Token::Word("import") => {
                i += 1;
                while let Some(Token::Word(name)) = words.get(i) {
                    found.push(*name);
                    i += 1;
                    while let (Some(Token::Dot), Some(Token::Word(_))) = (words.get(i), words.get(i + 1)) {
                        i += 2;
                    }
                    if words.get(i) == Some(&Token::Word("as")) {
                        i += 2;
                    }
                    if words.get(i) != Some(&Token::Comma) {
                        break;
                    }
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modules(code: &str) -> Vec<&str> {
        imported(&Words::new(code).collect::<Vec<_>>())
    }

    #[test]
    fn import_statements_name_their_top_level_modules() {
        assert_eq!(modules("print(1)"), Vec::<&str>::new());
        assert_eq!(modules("import os, sys\nprint(os.getpid())"), ["os", "sys"]);
        assert_eq!(modules("import numpy as np, os.path as p, json"), ["numpy", "os", "json"]);
        assert_eq!(modules("from matplotlib import pyplot as plt"), ["matplotlib"]);
        assert_eq!(modules("from os.path import (join,\n  dirname)\nimport re"), ["os", "re"]);
        assert_eq!(modules("import json; import pandas"), ["json", "pandas"]);
        assert_eq!(modules("x = 1\nif x: import collections.abc as c"), ["collections"]);
        assert_eq!(modules("    try:\n        import tabulate\n    except ImportError: pass"), ["tabulate"]);
        // A backslash continues the statement on the next line.
        assert_eq!(modules("import os, \\\n    numpy"), ["os", "numpy"]);
        assert_eq!(modules("import os, \\\r\n    numpy"), ["os", "numpy"]);
        // Relative imports, and `from` that is not an import.
        assert_eq!(modules("from . import x\nfrom .m import y"), [".", "."]);
        assert_eq!(modules("def g():\n    yield from numpy_gen()\nraise E from err"), Vec::<&str>::new());
        assert_eq!(modules("from_x = 1\nimported = 2\nimport_it()"), Vec::<&str>::new());
        assert_eq!(modules("import ünïcode"), ["ünïcode"]);
    }

    #[test]
    fn code_goes_to_a_bare_template_only_when_it_imports_only_the_standard_library() {
        for code in [
            "print(1)",
            "import os, sys, json\nfrom collections import Counter\nprint(Counter('abc'))",
            "import math\nprint(math.pi)",
            "from __future__ import annotations\nimport typing",
            "def g():\n    yield from range(3)\nprint(list(g()))",
        ] {
            assert!(!wants_preload(code), "{code}");
        }
        for code in [
            "import numpy as np",
            "from matplotlib import pyplot",
            "import os\nimport tabulate",
            "from . import sibling",
            "m = __import__('numpy')",
            "import importlib\nimportlib.import_module('pandas')",
            // Leaning to the preload: a comment and a string count.
            "# import pandas\nprint(1)",
            "print('import numpy')",
            // Past what is read for imports.
            &format!("print(1)\n{}", "#".repeat(SCAN_MAX)),
        ] {
            assert!(wants_preload(code), "{code}");
        }
    }

    #[test]
    fn a_policy_with_a_preload_has_a_bare_tier_of_its_own_name() {
        let policy = Policy { name: "default".into(), preload: vec!["numpy".into()], ..Policy::default() };
        let bare = bare_of(&policy).unwrap_or_default();
        assert_eq!((bare.name.as_str(), bare.preload.len()), ("default/bare", 0));
        assert_eq!(Policy { name: policy.name.clone(), preload: policy.preload.clone(), ..bare }, policy);
        assert!(bare_of(&Policy { preload: vec![], ..policy }).is_none());
        assert_eq!(both("default"), ["default/bare", "default"]);
        assert_eq!(both("default/bare"), ["default/bare", "default"]);
        assert_eq!(split("default/bare"), ("default", true));
        assert_eq!(split("default"), ("default", false));
    }

    #[test]
    fn the_standard_library_list_holds_the_standard_library_alone() {
        let set = stdlib();
        assert_eq!(set.len(), 305);
        for m in ["os", "sys", "json", "__future__", "collections", "importlib", "asyncio", "zoneinfo"] {
            assert!(set.contains(m), "{m}");
        }
        for m in ["numpy", "pandas", "matplotlib", "requests", "tabulate"] {
            assert!(!set.contains(m), "{m}");
        }
    }
}
