//! `--once-per`: what an acquire under the rule found, and the run record a
//! store keeps per name (docs/stores.md, "Once per period").

use std::time::Duration;

/// The rule one `--once-per` acquire applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    /// Half the period: a run that started less than this long ago (by the
    /// store's clock) is this period's.
    pub half: Duration,
    /// `--retry-failed`: a period whose run failed (any outcome but
    /// [`SUCCEEDED`], or no end while the lease is free or expired) may
    /// run again. A run still holding the lease is never run beside.
    pub retry_failed: bool,
}

impl Period {
    /// The rule without `--retry-failed`.
    pub fn new(half: Duration) -> Period {
        Period {
            half,
            retry_failed: false,
        }
    }
}

/// The one outcome `--retry-failed` never repeats.
pub const SUCCEEDED: &str = "exit 0";

/// How far in the future a record's start may be before it is taken for
/// one no clock of this store wrote (a newer or broken release, a hand
/// edit): a store's clock stepped back by less is a clock, and the rule
/// still reads the start (the period is done until the clock catches up);
/// a record beyond it would hold the period shut for longer than any step
/// an operator would not notice, so it is refused instead.
pub const FUTURE_LIMIT: Duration = Duration::from_secs(24 * 3600);

/// Whether `outcome` is one this release writes (`exit N`, `signal N`,
/// `lost`, `killed`, `not started`): anything else is a record written by
/// a newer or broken release, which a `--once-per` run refuses to decide
/// on (exit 125), and `status` shows marked.
pub fn known_outcome(outcome: &str) -> bool {
    let number = |n: &str| !n.is_empty() && n.len() <= 10 && n.bytes().all(|b| b.is_ascii_digit());
    match outcome.split_once(' ') {
        Some(("exit" | "signal", n)) => number(n),
        _ => matches!(outcome, "lost" | "killed" | NOT_STARTED),
    }
}

/// The refusal of a `--once-per` run that met a run record the store
/// cannot make sense of: never a guess, never a run (exit 125, one line).
pub fn unreadable(store: &str, name: &str, why: &str) -> crate::store::StoreError {
    crate::store::StoreError::fatal(format!(
        "cannot decide --once-per for lease {name} in the store {store}: its run record {why}, \
         which no run of this release writes (a newer or broken release, or a hand edit); \
         not running the command (`leaderrun status --name {name}` shows it)"
    ))
}

/// What an acquire found. Without `--once-per` only `Taken` and `Held`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// The lease is ours at this epoch (and, under the rule, so is the period).
    Taken(i64),
    /// Someone else holds the lease.
    Held,
    /// A run of this name started less than half a period ago by the
    /// store's clock: this firing's run has happened (or is happening).
    DoneThisPeriod {
        /// How long ago, by the store's clock, that run started.
        started_ms_ago: i64,
    },
}

impl Acquired {
    /// The epoch, where the lease was taken: what a plain acquire (no
    /// period) answers, since only the rule can say "done this period".
    pub fn epoch(self) -> Option<i64> {
        match self {
            Acquired::Taken(epoch) => Some(epoch),
            Acquired::Held | Acquired::DoneThisPeriod { .. } => None,
        }
    }
}

/// The last `--once-per` run of a name, as the store keeps it; it outlives
/// the lease. Times are by the store's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord {
    pub name: String,
    /// When the run started (acquired the lease and the period), RFC 3339, UTC.
    pub started_at: String,
    pub started_ms_ago: i64,
    /// When its end was written; `None` while it runs, and for a run whose
    /// leaderrun was killed before it could write one (never made up).
    pub ended_at: Option<String>,
    pub ended_ms_ago: Option<i64>,
    pub holder: Option<String>,
    pub epoch: i64,
    /// `exit N`, `signal N`, `lost`, `killed`, `not started`; `None` with no end.
    pub outcome: Option<String>,
}

/// The outcome of a run whose command never started (handed back after a
/// freeze, a confirmation too late, a commit not durable, a failed spawn).
/// The rule does not count it: the period is still to run.
pub const NOT_STARTED: &str = "not started";

/// How a `--once-per` run ended, as the record's outcome says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The command exited with this status.
    Exit(i32),
    /// The command died of this signal.
    Signal(i32),
    /// The lease was lost; the command was stopped.
    Lost,
    /// leaderrun stopped the command (`--max-term`, no watchdog).
    Killed,
    /// The lease was had, but the command never started.
    NotStarted,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Exit(n) => write!(f, "exit {n}"),
            Outcome::Signal(n) => write!(f, "signal {n}"),
            Outcome::Lost => f.write_str("lost"),
            Outcome::Killed => f.write_str("killed"),
            Outcome::NotStarted => f.write_str(NOT_STARTED),
        }
    }
}

impl Outcome {
    /// How a reaped command ended.
    pub fn of(st: std::process::ExitStatus) -> Outcome {
        use std::os::unix::process::ExitStatusExt;
        match (st.code(), st.signal()) {
            (Some(c), _) => Outcome::Exit(c),
            (None, Some(s)) => Outcome::Signal(s),
            // Neither: a stopped or continued status, never a reaped one.
            (None, None) => Outcome::Killed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_written_is_known_and_nothing_else() {
        for o in [
            Outcome::Exit(0),
            Outcome::Exit(255),
            Outcome::Signal(9),
            Outcome::Lost,
            Outcome::Killed,
            Outcome::NotStarted,
        ] {
            assert!(known_outcome(&o.to_string()), "{o}");
        }
        for o in [
            "",
            "exit",
            "exit ",
            "exit -1",
            "exit 1x",
            "exit 12345678901",
            "Exit 0",
            "signal",
            "lost ",
            "timeout",
            "exit 0 ",
            "ok",
        ] {
            assert!(!known_outcome(o), "{o:?}");
        }
    }
}
