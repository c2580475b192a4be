//! Run records: what each run of a session was and how it ended, kept on disk from
//! the moment the run is accepted, so a client learns about a run after its
//! connection went away and after the daemon restarted.
//!
//! A session's records are files in `<state>/sessions/<key>/runs/` (root's, 0700;
//! each file 0600), one per run, named `<sequence>-<run_id>.json` so the names sort
//! oldest first. They go when the session goes. A record is written twice: when the
//! run is accepted (`running`) and when it ends (its status and result). A record
//! still `running` when a daemon starts was cut off by the earlier daemon's end and
//! becomes `interrupted` ([`Records::interrupt_running`]).
//!
//! Bounds: at most [`MAX_RECORDS`] records and [`MAX_BYTES`] per session (the
//! oldest go first when a run begins; the newest is always kept, and may take the
//! bytes past the bound until the next run begins); a record keeps the first
//! [`KEPT_CODE`] bytes of the code and [`KEPT_OUTPUT`] bytes of each output stream.
//!
//! Only one run of a session goes at a time (its lease), so one writer per
//! directory; readers see whole files (each write is a rename). A record always
//! fits in [`MAX_RECORD`] as stored, whatever the run chose ([`fit`]).

mod fit;

use crate::model::records::{RecordStatus, RunPage, RunRecord, RunSummary};
use crate::model::run::{Language, RunResult};
use crate::model::session::Mode;
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The directory of a session's records, in its session directory.
pub const DIR: &str = "runs";
/// Most records kept per session.
pub const MAX_RECORDS: usize = 100;
/// Most bytes of records kept per session.
pub const MAX_BYTES: u64 = 8 * 1024 * 1024;
/// Bytes of a run's code a record keeps.
pub const KEPT_CODE: usize = 256 * 1024;
/// Bytes of each of a run's output streams a record keeps.
pub const KEPT_OUTPUT: usize = 64 * 1024;
/// Bytes of the error a `failed` record keeps.
pub const KEPT_ERROR: usize = 4 * 1024;
/// Largest record, as stored (JSON): a record past it keeps fewer artifacts, then
/// less output and less of the kernel's `result` and `exception`, then less code
/// ([`RunRecord::encode`]).
pub const MAX_RECORD: usize = 1024 * 1024;
/// Room on disk a session's records may take: [`MAX_BYTES`], and the newest record
/// past it until the next run begins.
pub const RESERVE: u64 = MAX_BYTES + MAX_RECORD as u64;
/// Most records a page holds.
pub const MAX_PAGE: usize = 100;
/// Records a page holds when the caller does not say.
pub const DEFAULT_PAGE: usize = 20;

impl RunRecord {
    /// The record of a run accepted now.
    pub fn accepted(run_id: &str, language: Language, mode: Mode, code: &str) -> RunRecord {
        let (code, code_truncated) = cut(code, KEPT_CODE);
        RunRecord {
            run_id: run_id.to_string(),
            language,
            mode,
            status: RecordStatus::Running,
            accepted_at: now(),
            finished_at: None,
            code,
            code_truncated,
            result: None,
            output_cut: false,
            artifacts_cut: false,
            kernel_result_cut: false,
            error: None,
        }
    }

    /// The run ended: with its result, or with the error that stopped it.
    pub fn ended(&mut self, outcome: Result<&RunResult, String>) {
        self.finished_at = Some(now());
        match outcome {
            Ok(result) => {
                let mut kept = result.clone();
                let (out, out_cut) = cut(&kept.stdout, KEPT_OUTPUT);
                let (err, err_cut) = cut(&kept.stderr, KEPT_OUTPUT);
                kept.stdout = out;
                kept.stderr = err;
                self.status = result.status.into();
                self.output_cut = out_cut || err_cut;
                self.result = Some(kept);
            }
            Err(why) => {
                self.status = RecordStatus::Failed;
                self.error = Some(cut(&why, KEPT_ERROR).0);
            }
        }
    }

    fn summary(&self) -> RunSummary {
        RunSummary {
            run_id: self.run_id.clone(),
            language: self.language,
            mode: self.mode,
            status: self.status,
            accepted_at: self.accepted_at.clone(),
            finished_at: self.finished_at.clone(),
            duration_ms: self.result.as_ref().map(|r| r.duration_ms),
            exit_code: self.result.as_ref().and_then(|r| r.exit_code),
        }
    }
}

fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// The first `max` bytes of `s` (at a character boundary), and whether that is less.
fn cut(s: &str, max: usize) -> (String, bool) {
    if s.len() <= max {
        return (s.to_string(), false);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    (s[..end].to_string(), true)
}

/// A run id as the daemon makes them: 32 lowercase hex digits.
pub fn valid_run_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A record's file name: `<sequence>-<run_id>.json`, and its parts.
fn parse_name(name: &str) -> Option<(u64, &str)> {
    let stem = name.strip_suffix(".json")?;
    let (seq, run_id) = stem.split_once('-')?;
    if seq.len() != 10 || !valid_run_id(run_id) {
        return None;
    }
    Some((seq.parse().ok()?, run_id))
}

/// A session's records (see the module doc).
#[derive(Debug, Clone)]
pub struct Records {
    dir: PathBuf,
}

/// A record being kept up to date while its run goes on.
#[derive(Debug)]
pub struct Pending {
    path: PathBuf,
    pub record: RunRecord,
}

impl Records {
    /// The records of the session whose directory is `session_dir`.
    pub fn of(session_dir: &Path) -> Records {
        Records { dir: session_dir.join(DIR) }
    }

    /// Record files, oldest first: (sequence, run id, file name).
    fn entries(&self) -> io::Result<Vec<(u64, String, String)>> {
        let read = match fs::read_dir(&self.dir) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(e),
        };
        let mut v: Vec<(u64, String, String)> = read
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let (seq, run_id) = parse_name(&name)?;
                Some((seq, run_id.to_string(), name))
            })
            .collect();
        v.sort();
        Ok(v)
    }

    /// Keep `record` of a run accepted now, as the newest.
    pub fn begin(&self, record: RunRecord) -> io::Result<Pending> {
        fs::DirBuilder::new().mode(0o700).recursive(true).create(&self.dir)?;
        let seq = self.entries()?.last().map(|e| e.0 + 1).unwrap_or(1);
        let path = self.dir.join(format!("{seq:010}-{}.json", record.run_id));
        let pending = Pending { path, record };
        self.write(&pending)?;
        self.prune(&pending.path)?;
        Ok(pending)
    }

    /// Write the pending record as it is now (its run ended, or it was updated).
    pub fn write(&self, pending: &Pending) -> io::Result<()> {
        write_atomic(&pending.path, &pending.record)
    }

    /// The run ended: write its final record. (The bounds are kept when the next
    /// run begins, beside its sandbox's start: a session holds at most one record
    /// past them, its newest.)
    pub fn finish(&self, pending: &Pending) -> io::Result<()> {
        self.write(pending)
    }

    /// Remove the oldest records past [`MAX_RECORDS`] or [`MAX_BYTES`]; never `keep`.
    fn prune(&self, keep: &Path) -> io::Result<()> {
        let entries = self.entries()?;
        let sized: Vec<(PathBuf, u64)> = entries
            .iter()
            .map(|(_, _, name)| {
                let path = self.dir.join(name);
                let size = fs::symlink_metadata(&path).map(|m| m.len()).unwrap_or(0);
                (path, size)
            })
            .collect();
        crate::kept::prune(&sized, keep, MAX_RECORDS, MAX_BYTES)
    }

    /// The record in file `name`; `None` if it was pruned since it was listed. A
    /// file that is no record (the daemon writes none past [`MAX_RECORD`]) is
    /// `InvalidData`.
    fn read(&self, name: &str) -> io::Result<Option<RunRecord>> {
        crate::kept::read(&self.dir.join(name), MAX_RECORD, "a run record")
    }

    /// [`Records::read`] for a walk over many: a file that is no record is logged
    /// and passed over.
    fn read_listed(&self, name: &str) -> io::Result<Option<RunRecord>> {
        match self.read(name) {
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "passing over an unreadable run record");
                Ok(None)
            }
            other => other,
        }
    }

    /// The record of run `run_id`, if the session still has it.
    pub fn get(&self, run_id: &str) -> io::Result<Option<RunRecord>> {
        if !valid_run_id(run_id) {
            return Ok(None);
        }
        let found = self.entries()?.into_iter().find(|e| e.1 == run_id);
        match found {
            Some((_, _, name)) => self.read(&name),
            None => Ok(None),
        }
    }

    /// Up to `limit` runs, newest first, older than run `before` when given.
    /// `Ok(None)`: `before` names no run the session has.
    pub fn page(&self, before: Option<&str>, limit: usize) -> io::Result<Option<RunPage>> {
        let mut entries = self.entries()?;
        entries.reverse();
        let start = match before {
            None => 0,
            Some(b) => match entries.iter().position(|e| e.1 == b) {
                Some(i) => i + 1,
                None => return Ok(None),
            },
        };
        let mut runs = vec![];
        let mut rest = entries.iter().skip(start);
        for (_, _, name) in rest.by_ref() {
            if let Some(record) = self.read_listed(name)? {
                runs.push(record.summary());
                if runs.len() == limit {
                    break;
                }
            }
        }
        let next = if rest.next().is_some() { runs.last().map(|r| r.run_id.clone()) } else { None };
        Ok(Some(RunPage { runs, next }))
    }

    /// Mark every record still `running` as `interrupted` (the daemon that ran them
    /// is gone). Returns how many there were.
    pub fn interrupt_running(&self) -> io::Result<usize> {
        let mut n = 0;
        for (_, _, name) in self.entries()? {
            if let Some(mut record) = self.read_listed(&name)? {
                if record.status == RecordStatus::Running {
                    record.status = RecordStatus::Interrupted;
                    record.error = Some("the daemon stopped while the run was going: it has no result".into());
                    write_atomic(&self.dir.join(&name), &record)?;
                    n += 1;
                }
            }
        }
        Ok(n)
    }
}

/// Write `record` to `path` whole ([`crate::kept::write`]).
fn write_atomic(path: &Path, record: &RunRecord) -> io::Result<()> {
    crate::kept::write(path, &record.encode()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::run::Status;

    pub(super) fn result(stdout: &str) -> RunResult {
        RunResult {
            run_id: "r".into(),
            session_id: "s".into(),
            status: Status::Ok,
            exit_code: Some(0),
            signal: None,
            stdout: stdout.into(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms: 7,
            artifacts: vec![],
            artifacts_truncated: false,
            usage: Default::default(),
            kernel: None,
        }
    }

    pub(super) fn id(i: usize) -> String {
        format!("{i:032x}")
    }

    #[test]
    fn records_page_newest_first_and_end_with_their_result() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::of(dir.path());
        for i in 0..5 {
            let mut p = records.begin(RunRecord::accepted(&id(i), Language::Python, Mode::Script, "print(1)")).unwrap();
            p.record.ended(Ok(&result("1\n")));
            records.finish(&p).unwrap();
        }
        let first = records.page(None, 2).unwrap().unwrap();
        assert_eq!(first.runs.iter().map(|r| r.run_id.clone()).collect::<Vec<_>>(), vec![id(4), id(3)]);
        assert_eq!(first.next.as_deref(), Some(id(3).as_str()));
        let second = records.page(first.next.as_deref(), 2).unwrap().unwrap();
        assert_eq!(second.runs.iter().map(|r| r.run_id.clone()).collect::<Vec<_>>(), vec![id(2), id(1)]);
        let last = records.page(second.next.as_deref(), 2).unwrap().unwrap();
        assert_eq!((last.runs.len(), last.next), (1, None));
        assert!(records.page(Some(&id(99)), 2).unwrap().is_none());
        let got = records.get(&id(2)).unwrap().unwrap();
        assert_eq!((got.status, got.result.unwrap().stdout), (RecordStatus::Ok, "1\n".to_string()));
        assert!(records.get("../../etc/passwd").unwrap().is_none());
    }

    #[test]
    fn records_are_bounded_by_count_and_bytes_and_cut_long_text() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::of(dir.path());
        for i in 0..(MAX_RECORDS + 7) {
            records.begin(RunRecord::accepted(&id(i), Language::Shell, Mode::Script, "true")).unwrap();
        }
        let kept = records.entries().unwrap();
        assert_eq!(kept.len(), MAX_RECORDS);
        assert_eq!(kept[0].1, id(7));
        // Large outputs: the byte bound keeps far fewer, never the newest's loss.
        let big = "é".repeat(KEPT_OUTPUT); // 2 bytes each: cut at a character boundary
        for i in 200..300 {
            let code = "x".repeat(KEPT_CODE + 1);
            let mut p = records.begin(RunRecord::accepted(&id(i), Language::Python, Mode::Kernel, &code)).unwrap();
            let mut r = result(&big);
            r.stderr = big.clone();
            p.record.ended(Ok(&r));
            records.finish(&p).unwrap();
            assert!(p.record.output_cut && p.record.code_truncated);
        }
        let sizes: Vec<u64> = records
            .entries()
            .unwrap()
            .iter()
            .map(|e| fs::metadata(dir.path().join(DIR).join(&e.2)).unwrap().len())
            .collect();
        let newest = *sizes.last().unwrap();
        let total: u64 = sizes.iter().sum();
        assert!(total - newest <= MAX_BYTES && total > MAX_BYTES / 2, "{total}");
        assert_eq!(records.entries().unwrap().last().unwrap().1, id(299));
        let newest = records.get(&id(299)).unwrap().unwrap();
        assert_eq!(newest.result.unwrap().stdout.len(), KEPT_OUTPUT);
    }

    #[test]
    fn a_record_written_before_kernel_result_cut_existed_reads_back() {
        let mut v = serde_json::to_value(RunRecord::accepted(&id(3), Language::Python, Mode::Script, "1")).unwrap();
        v.as_object_mut().unwrap().remove("kernel_result_cut");
        let back: RunRecord = serde_json::from_value(v).unwrap();
        assert!(!back.kernel_result_cut);
        let mut failed = RunRecord::accepted(&id(3), Language::Python, Mode::Script, "1");
        failed.ended(Err("e".repeat(KEPT_ERROR * 3)));
        assert_eq!(failed.error.unwrap().len(), KEPT_ERROR);
    }

    #[test]
    fn running_records_become_interrupted() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::of(dir.path());
        let mut done = records.begin(RunRecord::accepted(&id(1), Language::Python, Mode::Script, "1")).unwrap();
        done.record.ended(Err("the sandbox could not be built".into()));
        records.finish(&done).unwrap();
        records.begin(RunRecord::accepted(&id(2), Language::Python, Mode::Script, "2")).unwrap();
        assert_eq!(records.interrupt_running().unwrap(), 1);
        assert_eq!(records.get(&id(2)).unwrap().unwrap().status, RecordStatus::Interrupted);
        assert_eq!(records.get(&id(1)).unwrap().unwrap().status, RecordStatus::Failed);
        assert_eq!(records.interrupt_running().unwrap(), 0);
    }
}
