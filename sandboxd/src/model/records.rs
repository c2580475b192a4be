//! Run records as they are served: what each run of a session was and how it
//! ended (`GET /v1/sessions/{id}/runs`, `GET /v1/sessions/{id}/runs/{run_id}`).

use super::run::{Language, RunResult, Status};
use super::session::Mode;
use serde::{Deserialize, Serialize};

/// Where a run is, or how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = RunRecordStatus)]
pub enum RecordStatus {
    /// Accepted and not ended yet.
    Running,
    Ok,
    Error,
    Timeout,
    Oom,
    Killed,
    /// The daemon stopped (or was killed) while the run was going: it has no result.
    Interrupted,
    /// The daemon could not run it (`error` says why): no program ran to its end.
    Failed,
}

impl From<Status> for RecordStatus {
    fn from(s: Status) -> RecordStatus {
        match s {
            Status::Ok => RecordStatus::Ok,
            Status::Error => RecordStatus::Error,
            Status::Timeout => RecordStatus::Timeout,
            Status::Oom => RecordStatus::Oom,
            Status::Killed => RecordStatus::Killed,
        }
    }
}

/// One run of a session, as `GET /v1/sessions/{id}/runs/{run_id}` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunRecord {
    pub run_id: String,
    pub language: Language,
    /// The session's mode when the run was accepted (`kernel`: a cell).
    pub mode: Mode,
    pub status: RecordStatus,
    /// When the daemon accepted the run (RFC 3339, UTC, milliseconds).
    pub accepted_at: String,
    /// When it ended; null while `running` and for `interrupted`.
    pub finished_at: Option<String>,
    /// The run's code: its first 256 KiB (`code_truncated` says when it was longer).
    pub code: String,
    pub code_truncated: bool,
    /// The result its caller got, with only the first 64 KiB of each output stream;
    /// a record that would take more than 1 MiB as JSON keeps fewer artifacts, then
    /// the start of its output and of a kernel's `result` and `exception` texts
    /// (the longest cut first), then the start of its code, until it fits. The
    /// flags say what it holds less of than the caller got. Null until the run
    /// ends, and for `interrupted` and `failed`.
    pub result: Option<RunResult>,
    /// `stdout` or `stderr` holds less than the caller got.
    pub output_cut: bool,
    /// `artifacts` holds only the first of those the caller got.
    pub artifacts_cut: bool,
    /// A kernel cell's `result` or `exception` holds the start of its texts only.
    #[serde(default)]
    pub kernel_result_cut: bool,
    /// Why the daemon could not run it (`failed`), or what cut it off (`interrupted`).
    pub error: Option<String>,
}

/// A run in a page of `GET /v1/sessions/{id}/runs`: the record without its code,
/// output and artifacts.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunSummary {
    pub run_id: String,
    pub language: Language,
    pub mode: Mode,
    pub status: RecordStatus,
    pub accepted_at: String,
    pub finished_at: Option<String>,
    pub duration_ms: Option<u64>,
    pub exit_code: Option<i32>,
}

/// A page of a session's runs, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunPage {
    pub runs: Vec<RunSummary>,
    /// Pass it as `before` for the next (older) page; null on the last page.
    pub next: Option<String>,
}
