//! Named sandbox policies (`policies/*.toml`): limits and switches for a run.
//!
//! A policy file may leave any field out (it takes the default). Unknown fields and
//! values out of range are refused when the policy is loaded, with a message that
//! names the file, the field and the allowed values.

use crate::model::policy::{NoNetwork, Policy};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading policy directory {0}: {1}")]
    Dir(PathBuf, std::io::Error),
    #[error("reading policy {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("policy {0}: {1}")]
    Parse(PathBuf, String),
    #[error("policy {file}: field `{field}` is {value}; allowed: {allowed}")]
    Invalid { file: PathBuf, field: &'static str, value: String, allowed: String },
    #[error("no policy named `default` in {0}: add default.toml")]
    NoDefault(PathBuf),
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            name: "default".into(),
            description: String::new(),
            memory_mb: 512,
            cpus: 1.0,
            pids: 128,
            timeout_s: 60,
            grace_s: 2,
            output_kb: 100,
            code_kb: 100,
            upload_mb: 50,
            mcp_inline_mb: 10,
            tmp_mb: 64,
            shm_mb: 64,
            workspace_mb: 1024,
            file_size_mb: 1024,
            open_files: 1024,
            network: NoNetwork,
            autosave_figures: true,
            max_artifacts: 100,
            preload: ["numpy", "pandas", "matplotlib.pyplot"].map(String::from).to_vec(),
            template_runs: 64,
        }
    }
}

const MIB: u64 = 1024 * 1024;
/// The most `code_kb` a policy may set: the sandbox's spec, which carries the code,
/// is read with a bound made from it ([`crate::isolate::spec::MAX_SPEC_LINE`]).
pub const MAX_CODE_KB: u64 = 100 * 1024;

/// `a.b_c.d`: identifiers joined by dots.
fn is_module_name(name: &str) -> bool {
    name.len() <= 200
        && name.split('.').all(|part| {
            let mut chars = part.chars();
            chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

impl Policy {
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mb * MIB
    }
    pub fn output_bytes(&self) -> usize {
        (self.output_kb * 1024) as usize
    }
    pub fn code_bytes(&self) -> usize {
        (self.code_kb * 1024) as usize
    }
    pub fn upload_bytes(&self) -> u64 {
        self.upload_mb * MIB
    }
    pub fn workspace_bytes(&self) -> u64 {
        self.workspace_mb * MIB
    }

    /// Check every field against its allowed range.
    pub fn validate(&self, file: &Path) -> Result<(), Error> {
        let int = |field: &'static str, v: u64, lo: u64, hi: u64| -> Result<(), Error> {
            if v < lo || v > hi {
                return Err(Error::Invalid {
                    file: file.into(),
                    field,
                    value: v.to_string(),
                    allowed: format!("a whole number from {lo} to {hi}"),
                });
            }
            Ok(())
        };
        int("memory_mb", self.memory_mb, 16, 1024 * 1024)?;
        if !(self.cpus >= 0.01 && self.cpus <= 1024.0) {
            return Err(Error::Invalid {
                file: file.into(),
                field: "cpus",
                value: self.cpus.to_string(),
                allowed: "a number of cores from 0.01 to 1024".into(),
            });
        }
        int("pids", self.pids, 4, 65536)?;
        int("template_runs", self.template_runs, 1, 1_000_000)?;
        int("timeout_s", self.timeout_s, 1, 86400)?;
        int("grace_s", self.grace_s, 0, 60)?;
        int("output_kb", self.output_kb, 1, 64 * 1024)?;
        int("code_kb", self.code_kb, 1, MAX_CODE_KB)?;
        int("upload_mb", self.upload_mb, 1, 64 * 1024)?;
        int("mcp_inline_mb", self.mcp_inline_mb, 1, 1024)?;
        int("tmp_mb", self.tmp_mb, 1, 64 * 1024)?;
        int("shm_mb", self.shm_mb, 1, 64 * 1024)?;
        int("workspace_mb", self.workspace_mb, 16, 1024 * 1024)?;
        int("file_size_mb", self.file_size_mb, 1, 1024 * 1024)?;
        int("open_files", self.open_files, 16, 1 << 20)?;
        int("max_artifacts", self.max_artifacts as u64, 1, 100_000)?;
        if let Some(bad) = self.preload.iter().find(|m| !is_module_name(m)) {
            return Err(Error::Invalid {
                file: file.into(),
                field: "preload",
                value: bad.clone(),
                allowed: "dotted Python module names, e.g. \"matplotlib.pyplot\"".into(),
            });
        }
        int("preload (count)", self.preload.len() as u64, 0, 64)?;
        Ok(())
    }
}

/// Parse and validate one policy file's text.
pub fn parse(name: &str, text: &str, file: &Path) -> Result<Policy, Error> {
    let mut policy: Policy = toml::from_str(text).map_err(|e| Error::Parse(file.into(), e.message().to_string()))?;
    policy.name = name.to_string();
    policy.validate(file)?;
    Ok(policy)
}

/// All policies of a directory, by name (the file stem). `default` must be there.
pub fn load_dir(dir: &Path) -> Result<BTreeMap<String, Policy>, Error> {
    let mut out = BTreeMap::new();
    let entries = std::fs::read_dir(dir).map_err(|e| Error::Dir(dir.into(), e))?;
    for entry in entries {
        let path = entry.map_err(|e| Error::Dir(dir.into(), e))?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Read(path.clone(), e))?;
        out.insert(name.to_string(), parse(name, &text, &path)?);
    }
    if !out.contains_key("default") {
        return Err(Error::NoDefault(dir.into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Policy, Error> {
        parse("t", text, Path::new("t.toml"))
    }

    #[test]
    fn missing_fields_take_the_defaults() {
        let policy = p("memory_mb = 256").unwrap();
        assert_eq!(policy.memory_mb, 256);
        assert_eq!(policy.pids, Policy::default().pids);
        assert_eq!(policy.name, "t");
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let err = p("memroy_mb = 256").unwrap_err().to_string();
        assert!(err.contains("memroy_mb"), "{err}");
    }

    #[test]
    fn out_of_range_values_name_the_field_and_the_range() {
        let err = p("pids = 1").unwrap_err().to_string();
        assert!(err.contains("`pids`") && err.contains("from 4 to 65536"), "{err}");
        let err = p("cpus = 0.0").unwrap_err().to_string();
        assert!(err.contains("`cpus`"), "{err}");
        let err = p("network = \"host\"").unwrap_err().to_string();
        assert!(err.contains("none"), "{err}");
    }

    #[test]
    fn network_none_is_read_and_shown_as_before() {
        assert_eq!(p("network = \"none\"").unwrap(), Policy { name: "t".into(), ..Policy::default() });
        let err = p("network = \"host\"").unwrap_err().to_string();
        assert!(err.contains(r#"network is "host"; allowed: "none""#), "{err}");
        assert!(p("network = 1").is_err());
        let shown = serde_json::to_value(Policy::default()).unwrap();
        assert_eq!(shown["network"], "none");
    }

    #[test]
    fn preload_takes_only_module_names() {
        assert_eq!(p("preload = [\"a.b_c\", \"_x1\"]").unwrap().preload, ["a.b_c", "_x1"]);
        for bad in ["os; import x", "a..b", "1abc", "", "a.", "a b"] {
            let err = p(&format!("preload = [{bad:?}]")).unwrap_err().to_string();
            assert!(err.contains("`preload`") && err.contains("module names"), "{bad}: {err}");
        }
    }

    #[test]
    fn shipped_policies_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
        let all = load_dir(&dir).unwrap();
        assert_eq!(all["default"].memory_mb, 512);
        assert_eq!(all["default"].timeout_s, 60);
        let strict = &all["strict"];
        assert!(strict.memory_mb < all["default"].memory_mb && strict.pids < all["default"].pids);
    }
}
