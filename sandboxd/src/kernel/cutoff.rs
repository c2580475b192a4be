//! Why a kernel was cut off in the middle of a cell ([`Cutoff`]), in one place:
//! each place [`super::Kernel::exec`] gives up on a kernel names what happened,
//! and the cell's result ([`crate::run`]) reads its status from it.

use std::time::Duration;

/// Why a kernel was cut off in the middle of a cell. Only [`Cutoff::Gone`] comes
/// from the kernel's side (its channel ended); the others are the daemon's own
/// findings: its timer, a cancel, the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cutoff {
    /// Its channel ended, or took no cell: it exited or was killed (by the OOM
    /// killer, by a signal of its own making), its sandbox says how.
    /// `interrupted`: after the timeout's SIGINT.
    Gone { interrupted: bool },
    /// It did not answer within the cell's time limit and the grace after the
    /// interrupt (or took no cell within the limit): the daemon killed it.
    TimedOut,
    /// The run was cancelled, its session is closing or the daemon stopping: the
    /// daemon killed it.
    Stopped,
    /// It sent what the protocol does not allow (`what`): the daemon killed it.
    /// `interrupted`: after the timeout's SIGINT.
    Violation { what: String, interrupted: bool },
}

impl Cutoff {
    /// The cell's time limit had passed: its timeout's interrupt was sent.
    pub fn timed_out(&self) -> bool {
        match self {
            Cutoff::TimedOut => true,
            Cutoff::Gone { interrupted } | Cutoff::Violation { interrupted, .. } => *interrupted,
            Cutoff::Stopped => false,
        }
    }

    /// What the kernel sent that the protocol does not allow.
    pub fn violation(&self) -> Option<&str> {
        match self {
            Cutoff::Violation { what, .. } => Some(what),
            _ => None,
        }
    }

    /// How long its sandbox is given to end on its own, and report how, before the
    /// daemon kills it: a kernel whose channel ended has (almost always) exited.
    pub(super) fn patience(&self) -> Duration {
        match self {
            Cutoff::Gone { .. } => GONE_PATIENCE,
            _ => Duration::ZERO,
        }
    }
}

/// How long a kernel whose channel ended is given to end, and its sandbox to say
/// how (its exit code, or the signal that killed it), before it is killed. A kernel
/// that exited is reported within milliseconds; one that closed its channel and
/// lives on is killed after this.
const GONE_PATIENCE: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cutoff_says_whether_the_limit_had_passed_what_broke_the_protocol_and_how_long_to_wait() {
        let broke = |interrupted| Cutoff::Violation { what: "x".into(), interrupted };
        let all = [
            Cutoff::Gone { interrupted: false },
            Cutoff::Gone { interrupted: true },
            Cutoff::TimedOut,
            Cutoff::Stopped,
            broke(false),
            broke(true),
        ];
        assert_eq!(all.clone().map(|c| c.timed_out()), [false, true, true, false, false, true]);
        assert_eq!(all.clone().map(|c| c.violation().is_some()), [false, false, false, false, true, true]);
        assert_eq!(broke(false).violation(), Some("x"));
        // Only a kernel whose channel ended may still say how it ended: the daemon
        // kills the others at once.
        let waits = all.map(|c| c.patience());
        assert_eq!(
            waits,
            [GONE_PATIENCE, GONE_PATIENCE, Duration::ZERO, Duration::ZERO, Duration::ZERO, Duration::ZERO]
        );
    }
}
