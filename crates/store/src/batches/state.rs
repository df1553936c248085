//! A batch's status and the moves between them, the one table the store and the runner
//! follow: `validating` to `in_progress` (its lines stored) or `failed` (its input refused);
//! `validating` or `in_progress` to `cancelling` when asked; `in_progress` or `cancelling` to
//! `finalizing` as it ends, its files written, and from there to `completed`, `expired` or
//! `cancelled` in the same transaction. `completed`, `failed`, `expired` and `cancelled` are
//! final.

use std::fmt;
use std::str::FromStr;

/// A batch's status, as the database and the wire spell it ([`BatchState::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BatchState {
    #[default]
    Validating,
    InProgress,
    Finalizing,
    Completed,
    Failed,
    Expired,
    Cancelling,
    Cancelled,
}

use BatchState::*;

impl BatchState {
    /// Every status, in the order of a batch's life (for the gauge of batches by status).
    pub(crate) const ALL: [BatchState; 8] = [
        Validating, InProgress, Finalizing, Completed, Failed, Expired, Cancelling, Cancelled,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Validating => "validating",
            InProgress => "in_progress",
            Finalizing => "finalizing",
            Completed => "completed",
            Failed => "failed",
            Expired => "expired",
            Cancelling => "cancelling",
            Cancelled => "cancelled",
        }
    }

    /// Whether a batch may move from this status to `to`.
    pub(crate) const fn can_move_to(self, to: BatchState) -> bool {
        matches!(
            (self, to),
            (Validating, InProgress | Failed | Cancelling)
                | (InProgress, Cancelling | Finalizing)
                | (Cancelling, Finalizing)
                | (Finalizing, Completed | Expired | Cancelled)
        )
    }

    /// The statuses a batch may move to `self` from.
    pub(crate) fn sources(self) -> Vec<BatchState> {
        BatchState::ALL
            .into_iter()
            .filter(|from| from.can_move_to(self))
            .collect()
    }

    /// Whether a batch in it still runs or is to be finished (it may move on).
    pub(crate) fn active(self) -> bool {
        BatchState::ALL.iter().any(|to| self.can_move_to(*to))
    }

    /// The column of the time a batch took this status.
    pub(crate) const fn time_column(self) -> &'static str {
        match self {
            Validating => "created_at",
            InProgress => "in_progress_at",
            Finalizing => "finalizing_at",
            Completed => "completed_at",
            Failed => "failed_at",
            Expired => "expired_at",
            Cancelling => "cancelling_at",
            Cancelled => "cancelled_at",
        }
    }
}

impl fmt::Display for BatchState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status no batch has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is no batch status")]
pub struct NoSuchState(pub(crate) String);

impl FromStr for BatchState {
    type Err = NoSuchState;

    fn from_str(s: &str) -> Result<BatchState, NoSuchState> {
        BatchState::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| NoSuchState(s.to_string()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_transition_table_allows_exactly_the_batch_lifecycle() {
        let allowed = [
            (Validating, InProgress),
            (Validating, Failed),
            (Validating, Cancelling),
            (InProgress, Cancelling),
            (InProgress, Finalizing),
            (Cancelling, Finalizing),
            (Finalizing, Completed),
            (Finalizing, Expired),
            (Finalizing, Cancelled),
        ];
        for from in BatchState::ALL {
            for to in BatchState::ALL {
                assert_eq!(
                    from.can_move_to(to),
                    allowed.contains(&(from, to)),
                    "{from} -> {to}"
                );
            }
        }
    }

    #[test]
    fn final_statuses_are_the_ones_with_no_way_out() {
        let active: Vec<_> = BatchState::ALL.into_iter().filter(|s| s.active()).collect();
        assert_eq!(active, [Validating, InProgress, Finalizing, Cancelling]);
        assert_eq!(Cancelling.sources(), [Validating, InProgress]);
        assert_eq!(Finalizing.sources(), [InProgress, Cancelling]);
        assert_eq!(Validating.sources(), []);
    }

    #[test]
    fn each_status_reads_back_from_its_name_and_no_other_does() {
        for s in BatchState::ALL {
            assert_eq!(s.as_str().parse::<BatchState>().unwrap(), s);
            assert!(s.time_column().ends_with("_at"));
        }
        assert_eq!(
            "done".parse::<BatchState>(),
            Err(NoSuchState("done".into()))
        );
    }
}
