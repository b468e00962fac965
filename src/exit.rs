//! Exit statuses. Scripts and tests rely on these numbers.
//!
//! [`RUN_FORM`] and [`SUBCOMMANDS`] are the one place their meanings are
//! written: `--help` and the man page are rendered from them, and a test
//! checks that the README's exit table says the same, row for row.

/// Usage error: bad flags, bad durations, a bad lease name, an unknown store.
pub const USAGE: i32 = 2;
/// The lease was lost while the child ran, or `--max-term` passed; the child was stopped.
pub const LOST: i32 = 75;
/// `--timeout` passed without leading.
pub const TIMEOUT: i32 = 124;
/// leaderrun's own failure: store unreachable, permission denied, …
pub const FAILURE: i32 = 125;
/// The command exists but cannot be executed.
pub const NOT_EXECUTABLE: i32 = 126;
/// The command was not found.
pub const NOT_FOUND: i32 = 127;
/// A subcommand's "no": no such lease, nothing to release, not live at that epoch.
pub const NO: i32 = 1;

/// `128 + N` for death by signal `N`, the shell's convention.
pub fn for_signal(sig: i32) -> i32 {
    128 + sig
}

/// How a run or a subcommand ends. Every ending is one of these, and
/// [`Exit::code`] is the one place where they become numbers; a failure
/// (`crate::error::Error`) says which of them it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: a subcommand's "yes", `--help`, `--version`.
    Yes,
    /// 1: a subcommand's "no".
    No,
    /// The command ran: its own status, or `128 + N` when it died of
    /// signal `N` (as `supervisor::status_code` computes it).
    Command(i32),
    /// leaderrun got signal `N` while waiting; the command never started.
    Signal(i32),
    /// Try-once found the lease held: `--conflict-exit-code`.
    Held(i32),
    /// The lease was lost, or `--max-term` passed.
    Lost,
    /// `--timeout` passed without leading.
    Timeout,
    /// A usage error.
    Usage,
    /// leaderrun's own failure.
    Failure,
    /// The command exists but cannot be executed.
    NotExecutable,
    /// The command was not found.
    NotFound,
}

impl Exit {
    pub fn code(self) -> i32 {
        match self {
            Exit::Yes => 0,
            Exit::No => NO,
            Exit::Command(c) | Exit::Held(c) => c,
            Exit::Signal(n) => for_signal(n),
            Exit::Lost => LOST,
            Exit::Timeout => TIMEOUT,
            Exit::Usage => USAGE,
            Exit::Failure => FAILURE,
            Exit::NotExecutable => NOT_EXECUTABLE,
            Exit::NotFound => NOT_FOUND,
        }
    }
}

/// One row of an exit table. `status` is what a reader looks up (a number,
/// or a rule such as `128+N`); `meaning` may mark code with backticks, which
/// each renderer turns into its own markup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub status: &'static str,
    /// The number, when the status is one fixed number.
    pub code: Option<i32>,
    pub meaning: &'static str,
}

const fn row(status: &'static str, code: Option<i32>, meaning: &'static str) -> Status {
    Status {
        status,
        code,
        meaning,
    }
}

/// The run form's exit statuses.
pub const RUN_FORM: &[Status] = &[
    row("the command's own", None, "the command ran and exited"),
    row(
        "128+N",
        None,
        "the command died of signal N (or leaderrun got signal N while waiting)",
    ),
    row(
        "75",
        Some(LOST),
        "the lease was lost while the command ran, or `--max-term` passed; the command was stopped \
         (the log says which: `stopped` or `stepped_down`); or the lease was lost before the \
         command could start, and it never started (`lost`)",
    ),
    row("124", Some(TIMEOUT), "`--timeout` passed without leading"),
    row(
        "125",
        Some(FAILURE),
        "leaderrun's own failure: store unreachable, wrong password, permission denied",
    ),
    row(
        "126",
        Some(NOT_EXECUTABLE),
        "the command, or the interpreter its `#!` line names, is not executable (found before the \
         lease is taken)",
    ),
    row(
        "127",
        Some(NOT_FOUND),
        "the command, or the interpreter its `#!` line names, was not found (found before the lease \
         is taken; a `#!/bin/sh` saved with Windows line endings is named as such)",
    ),
    row(
        "2",
        Some(USAGE),
        "usage error: bad flag, duration, lease name, store URL, or timing relation",
    ),
    row(
        "`--conflict-exit-code` (0)",
        None,
        "try-once found the lease held elsewhere",
    ),
];

/// The subcommands' (`status`, `release`, `check`, `watch`, `init`) exit statuses.
pub const SUBCOMMANDS: &[Status] = &[
    row(
        "0",
        Some(0),
        "yes, done: status read, lease released, lease live at that epoch, table ready, watch ended by SIGINT, SIGTERM or a closed stdout",
    ),
    row(
        "1",
        Some(NO),
        "no: no such lease, nothing to release, or not live at that epoch",
    ),
    row("125", Some(FAILURE), "cannot tell: the store failed"),
    row("2", Some(USAGE), "usage error"),
];

/// `text` without the backticks that mark code (for `--help`).
pub fn plain(text: &str) -> String {
    text.replace('`', "")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every numbered constant has its row, so a new status cannot be
    /// added here without being documented.
    #[test]
    fn every_status_has_a_row() {
        let codes: Vec<i32> = RUN_FORM.iter().filter_map(|s| s.code).collect();
        for c in [USAGE, LOST, TIMEOUT, FAILURE, NOT_EXECUTABLE, NOT_FOUND] {
            assert!(codes.contains(&c), "{c} is not in RUN_FORM");
        }
        let subs: Vec<i32> = SUBCOMMANDS.iter().filter_map(|s| s.code).collect();
        for c in [0, NO, FAILURE, USAGE] {
            assert!(subs.contains(&c), "{c} is not in SUBCOMMANDS");
        }
        for s in RUN_FORM.iter().chain(SUBCOMMANDS) {
            if let Some(c) = s.code {
                assert_eq!(s.status, c.to_string());
            }
        }
    }
}
