//! A kernel cell that its kernel did not answer: the cell's status, exit code,
//! signal and the line its stderr ends with, worked out in one place from why the
//! kernel was cut off ([`Cutoff`]) and how its sandbox ended.

use super::{signal_name, Ending};
use crate::isolate;
use crate::isolate::message::Exit;
use crate::kernel::Cutoff;
use crate::model::run::Status;

/// How a cell whose kernel was cut off in the middle of it ended, as its result says.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Death {
    pub status: Status,
    pub exit: Exit,
    /// What happened, for the cell's stderr.
    pub why: String,
}

impl Death {
    /// The daemon's timer, the cgroup and the daemon's own findings first (see
    /// [`Ending`]); then how the kernel ended. A kernel that ended on its own
    /// ([`Cutoff::Gone`], its sandbox not killed) is reported as it ended: its exit
    /// code (70: kernel.py's own failure), or the signal that killed it; one the
    /// daemon killed, as SIGKILL.
    pub fn of(cut: &Cutoff, outcome: Option<&isolate::Outcome>) -> Death {
        let oom = outcome.is_some_and(|o| o.oom_killed);
        // How the kernel ended on its own, when its sandbox said so before anything killed it.
        let own = match (cut, outcome) {
            (Cutoff::Gone { .. }, Some(o)) if !o.cancelled && !o.timed_out => Some(o.exit),
            _ => None,
        };
        let exit = own.unwrap_or(Exit::KILLED);
        let status = Ending {
            timed_out: cut.timed_out(),
            oom_killed: oom,
            violation: cut.violation().is_some(),
            killed: exit.signal().is_some(),
            succeeded: false,
        }
        .status();
        let why = if cut.timed_out() {
            "the cell ignored the interrupt at its time limit and was killed".to_string()
        } else if oom {
            "the cell ran out of memory".to_string()
        } else if let Some(v) = cut.violation() {
            format!("the kernel broke the protocol ({v}) and was killed")
        } else if *cut == Cutoff::Stopped {
            "the run was stopped".to_string()
        } else {
            match own {
                Some(Exit::Exited(code)) => format!("the kernel exited with code {code}"),
                Some(Exit::Signaled(signal)) => format!("the kernel was killed by {}", signal_name(signal)),
                None => "the kernel died".to_string(),
            }
        };
        Death { status, exit, why }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// How a kernel's sandbox ended: exited with `code` or killed by `signal`.
    fn ended(exit_code: Option<i32>, signal: Option<i32>, cancelled: bool, oom_killed: bool) -> isolate::Outcome {
        let exit = match (exit_code, signal) {
            (Some(code), _) => Exit::Exited(code),
            (None, signal) => Exit::Signaled(signal.unwrap_or(libc::SIGKILL)),
        };
        isolate::Outcome {
            exit,
            timed_out: false,
            oom_killed,
            cancelled,
            duration: Duration::ZERO,
            stdout: Default::default(),
            stderr: Default::default(),
            warnings: vec![],
            usage: Default::default(),
            queue: Duration::ZERO,
            setup: Duration::ZERO,
        }
    }

    #[test]
    fn a_kernel_that_ended_on_its_own_is_reported_as_it_ended_and_one_the_daemon_killed_as_sigkill() {
        let gone = Cutoff::Gone { interrupted: false };
        let death = |cut: &Cutoff, o: Option<isolate::Outcome>| {
            let d = Death::of(cut, o.as_ref());
            (d.status, d.exit.code(), d.exit.signal(), d.why)
        };
        let (nine, segv) = (Some(libc::SIGKILL), Some(libc::SIGSEGV));
        // Exited (kernel.py's own failure is 70), or killed by a signal of its own.
        assert_eq!(
            death(&gone, Some(ended(Some(70), None, false, false))),
            (Status::Error, Some(70), None, "the kernel exited with code 70".into())
        );
        assert_eq!(
            death(&gone, Some(ended(None, segv, false, false))),
            (Status::Killed, None, segv, "the kernel was killed by SIGSEGV".into())
        );
        // Killed by the OOM killer: the cgroup says so.
        assert_eq!(
            death(&gone, Some(ended(None, nine, false, true))),
            (Status::Oom, None, nine, "the cell ran out of memory".into())
        );
        // Its sandbox did not say before the daemon killed it, or said nothing.
        assert_eq!(
            death(&gone, Some(ended(Some(70), None, true, false))),
            (Status::Killed, None, nine, "the kernel died".into())
        );
        assert_eq!(death(&gone, None), (Status::Killed, None, nine, "the kernel died".into()));
        // The daemon's own findings come first, whatever the sandbox said.
        let exited = || Some(ended(Some(70), None, false, false));
        assert_eq!(
            death(&Cutoff::TimedOut, exited()),
            (Status::Timeout, None, nine, "the cell ignored the interrupt at its time limit and was killed".into())
        );
        assert_eq!(death(&Cutoff::Stopped, exited()), (Status::Killed, None, nine, "the run was stopped".into()));
        let broke = Cutoff::Violation { what: "a line longer than 8 bytes".into(), interrupted: false };
        assert_eq!(
            death(&broke, exited()),
            (
                Status::Error,
                None,
                nine,
                "the kernel broke the protocol (a line longer than 8 bytes) and was killed".into()
            )
        );
        // After the timeout's interrupt it is a timeout, however the kernel then ended.
        let late = Cutoff::Gone { interrupted: true };
        assert_eq!(death(&late, exited()).0, Status::Timeout);
    }
}
