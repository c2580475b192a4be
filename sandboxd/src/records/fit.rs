//! Fitting a run record into [`MAX_RECORD`] bytes of JSON, whatever the run chose.
//!
//! Everything a run chooses can take more than that: escapes make text up to 6
//! times its bytes (a control character is `\\u0001`), a kernel cell can forge its
//! own `result` and `exception` (its code can read the cell's nonce, and the
//! kernel's line may be 1 MiB), and the artifacts' list has no bound of its own.
//! Past the limit a record loses, in this order and only as much as it must,
//! counted as the JSON it is stored as: artifacts from the end (`artifacts_cut`);
//! the output and the kernel's texts, the longest cut first, each to its start
//! (`output_cut`, `kernel_result_cut`); the code (`code_truncated`). What is left is
//! the daemon's own (ids, times, numbers, statuses, an error of at most
//! [`super::KEPT_ERROR`]), a few hundred bytes.

use super::{RunRecord, MAX_RECORD};
use crate::model::run::{KernelException, KernelResult, RunResult};
use std::io;

impl RunRecord {
    /// The record as stored: JSON of at most [`MAX_RECORD`] bytes (module doc).
    pub(super) fn encode(&self) -> io::Result<Vec<u8>> {
        let mut bytes = serde_json::to_vec(self).map_err(io::Error::other)?;
        if bytes.len() <= MAX_RECORD {
            return Ok(bytes);
        }
        let mut record = self.clone();
        for part in [Part::Artifacts, Part::Texts, Part::Code] {
            while bytes.len() > MAX_RECORD && record.cut(part, bytes.len() - MAX_RECORD) {
                bytes = serde_json::to_vec(&record).map_err(io::Error::other)?;
            }
        }
        if bytes.len() > MAX_RECORD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a run record takes {} bytes with all the run chose cut", bytes.len()),
            ));
        }
        Ok(bytes)
    }

    /// Cut `part` by at least `over` bytes of JSON, if it has them (else all of
    /// it); false when it had nothing left to cut.
    fn cut(&mut self, part: Part, over: usize) -> bool {
        match part {
            Part::Artifacts => {
                let Some(res) = self.result.as_mut().filter(|r| !r.artifacts.is_empty()) else { return false };
                let mut freed = 0;
                while freed < over {
                    let Some(gone) = res.artifacts.pop() else { break };
                    freed += serde_json::to_vec(&gone).map_or(0, |b| b.len()) + 1;
                }
                self.artifacts_cut = true;
                true
            }
            Part::Texts => {
                let Some(res) = self.result.as_mut() else { return false };
                let RunResult { stdout, stderr, kernel, .. } = res;
                let mut texts: Vec<&mut String> = vec![stdout, stderr];
                let outputs = texts.len();
                if let Some(k) = kernel.as_mut() {
                    if let Some(KernelResult(texts_by_type)) = k.result.as_mut() {
                        texts.extend(texts_by_type.values_mut());
                    }
                    if let Some(KernelException { name, traceback, value }) = k.exception.as_mut() {
                        texts.extend([name, traceback, value]);
                    }
                }
                let cut = cut_longest(&mut texts, over);
                self.output_cut |= cut[..outputs].iter().any(|c| *c);
                self.kernel_result_cut |= cut[outputs..].iter().any(|c| *c);
                cut.contains(&true)
            }
            Part::Code => {
                let cut = cut_longest(&mut [&mut self.code], over);
                self.code_truncated |= cut[0];
                cut[0]
            }
        }
    }
}

/// What a record too large to keep loses first, then next ([`RunRecord::encode`]).
#[derive(Debug, Clone, Copy)]
enum Part {
    Artifacts,
    /// The output, and a kernel's `result` and `exception` texts.
    Texts,
    Code,
}

/// Bytes of `c` inside a JSON string, as serde_json writes it.
fn json_char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// Bytes of `s` inside a JSON string.
fn json_len(s: &str) -> usize {
    s.chars().map(json_char_len).sum()
}

/// Cut `texts` by at least `over` bytes of JSON in all (or to nothing), the
/// longest first: each is cut to its start of at most the same length, the
/// largest length that frees enough. Returns which were cut.
fn cut_longest(texts: &mut [&mut String], over: usize) -> Vec<bool> {
    let lens: Vec<usize> = texts.iter().map(|t| json_len(t)).collect();
    let freed = |keep: usize| lens.iter().map(|l| l.saturating_sub(keep)).sum::<usize>();
    // freed(lo) >= over > freed(hi): the largest `keep` that frees enough is lo.
    let (mut lo, mut hi) = (0, lens.iter().copied().max().unwrap_or(0));
    if freed(lo) >= over {
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if freed(mid) >= over {
                lo = mid;
            } else {
                hi = mid;
            }
        }
    }
    texts
        .iter_mut()
        .zip(&lens)
        .map(|(text, len)| {
            if *len <= lo {
                return false;
            }
            let (mut used, mut end) = (0, 0);
            for (i, c) in text.char_indices() {
                used += json_char_len(c);
                if used > lo {
                    break;
                }
                end = i + c.len_utf8();
            }
            text.truncate(end);
            true
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::tests::{id, result};
    use super::super::{Records, KEPT_CODE, KEPT_OUTPUT};
    use super::*;
    use crate::model::run::{Artifact, ArtifactKind, KernelFields, Language};
    use crate::model::session::Mode;
    use std::fs;

    #[test]
    fn a_record_fits_in_its_bound_whatever_its_text_escapes_to() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::of(dir.path());
        // Control bytes take 6 bytes each as JSON; 100 artifacts of long such names.
        let nasty = "\u{1}".repeat(4000);
        let mut r = result(&"\u{1}".repeat(KEPT_OUTPUT));
        r.stderr = r.stdout.clone();
        r.artifacts = (0..100)
            .map(|i| Artifact {
                path: format!("{nasty}{i}"),
                size_bytes: 1,
                mime_type: "text/plain".into(),
                kind: ArtifactKind::File,
                url: format!("http://x/{}", "%01".repeat(4000)),
            })
            .collect();
        let mut p = records.begin(RunRecord::accepted(&id(1), Language::Python, Mode::Script, &nasty)).unwrap();
        p.record.ended(Ok(&r));
        records.finish(&p).unwrap();
        let stored = fs::metadata(&p.path).unwrap().len();
        assert!(stored <= MAX_RECORD as u64, "{stored}");
        let got = records.get(&id(1)).unwrap().unwrap();
        let kept = got.result.unwrap();
        assert!(got.artifacts_cut && !kept.artifacts.is_empty() && kept.artifacts.len() < 100);
        assert_eq!(kept.stdout.len(), KEPT_OUTPUT, "the output stays whole once the artifacts fit");
        // A file that is no record is an error for the one asking for it, and is
        // passed over by a listing.
        fs::write(&p.path, b"{").unwrap();
        assert_eq!(records.get(&id(1)).unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert_eq!(records.page(None, 10).unwrap().unwrap().runs.len(), 0);
    }

    #[test]
    fn json_lengths_are_serde_jsons() {
        let mut all: String = (0u8..0x80).map(char::from).collect();
        all.push_str("\u{e9}\u{2028}\u{fffd}\u{1f600}");
        for c in all.chars() {
            let encoded = serde_json::to_string(&c.to_string()).unwrap();
            assert_eq!(json_char_len(c), encoded.len() - 2, "{c:?}: {encoded}");
        }
        assert_eq!(json_len(&all), serde_json::to_string(&all).unwrap().len() - 2);
    }

    /// A kernel cell's record with everything the run chooses as large as it can
    /// be: artifacts go first, then the texts (the longest first), then the code.
    fn forged() -> RunResult {
        let ctrl = |n: usize| "\u{1}".repeat(n);
        let mut r = result(&ctrl(KEPT_OUTPUT));
        r.stderr = ctrl(KEPT_OUTPUT);
        r.artifacts = (0..300)
            .map(|i| Artifact {
                path: format!("{}{i}", ctrl(4000)),
                size_bytes: 1,
                mime_type: "text/plain".into(),
                kind: ArtifactKind::File,
                url: format!("http://x/{}", "%01".repeat(4000)),
            })
            .collect();
        r.kernel = Some(KernelFields {
            result: Some(KernelResult(
                [(KernelResult::PLAIN, ctrl(65536)), (KernelResult::HTML, ctrl(65536))]
                    .map(|(k, v)| (k.to_string(), v))
                    .into(),
            )),
            exception: Some(KernelException { name: ctrl(256), value: ctrl(65536), traceback: ctrl(65536) }),
            kernel_restarted: false,
        });
        r
    }

    fn kernel_texts(r: &RunResult) -> Vec<String> {
        let k = r.kernel.as_ref().unwrap();
        let mut v = vec![];
        if let Some(result) = &k.result {
            v.extend(result.0.values().cloned());
        }
        if let Some(e) = &k.exception {
            v.extend([e.name.clone(), e.traceback.clone(), e.value.clone()]);
        }
        v
    }

    #[test]
    fn a_record_of_everything_at_its_largest_fits_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::of(dir.path());
        let code = "\u{1}".repeat(KEPT_CODE);
        let full = forged();
        let mut p = records.begin(RunRecord::accepted(&id(1), Language::Python, Mode::Kernel, &code)).unwrap();
        p.record.ended(Ok(&full));
        assert!(serde_json::to_vec(&p.record).unwrap().len() > 3 * MAX_RECORD);
        records.finish(&p).unwrap();
        let stored = fs::metadata(&p.path).unwrap().len();
        assert!(stored <= MAX_RECORD as u64 && stored > MAX_RECORD as u64 - 64, "{stored}");
        let got = records.get(&id(1)).unwrap().unwrap();
        assert!(got.artifacts_cut && got.output_cut && got.kernel_result_cut && got.code_truncated);
        let kept = got.result.clone().unwrap();
        assert!(kept.artifacts.is_empty());
        assert!(kept.stdout.is_empty() && kept.stderr.is_empty());
        assert!(kernel_texts(&kept).iter().all(String::is_empty));
        assert!(!got.code.is_empty() && code.starts_with(&got.code), "the code keeps what fits");
        assert_eq!(records.page(None, 10).unwrap().unwrap().runs.len(), 1);
    }

    #[test]
    fn an_oversized_kernel_result_is_cut_longest_first_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::of(dir.path());
        let mut r = forged();
        r.artifacts.clear();
        r.stdout = "hello\n".into();
        r.stderr = String::new();
        let mut p = records.begin(RunRecord::accepted(&id(2), Language::Python, Mode::Kernel, "x")).unwrap();
        p.record.ended(Ok(&r));
        records.finish(&p).unwrap();
        let got = records.get(&id(2)).unwrap().unwrap();
        assert!(got.kernel_result_cut && !got.output_cut && !got.artifacts_cut && !got.code_truncated);
        let kept = got.result.unwrap();
        assert_eq!((kept.stdout.as_str(), got.code.as_str()), ("hello\n", "x"));
        // Each text keeps its start; the longest were cut to one length, the short
        // exception name (256 characters) kept whole.
        let (before, after) = (kernel_texts(&r), kernel_texts(&kept));
        for (b, a) in before.iter().zip(&after) {
            assert!(b.starts_with(a.as_str()));
        }
        let mut lens: Vec<usize> = after.iter().map(|a| a.len()).collect();
        lens.sort();
        assert_eq!(lens[0], 256);
        assert!(lens[1] > 30_000 && lens[1..].iter().all(|l| *l == lens[1]), "{lens:?}");
        assert!(fs::metadata(&p.path).unwrap().len() <= MAX_RECORD as u64);
    }
}
