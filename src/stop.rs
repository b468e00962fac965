//! When a stop sends what (docs/contract.md §3, §6, §10): the one place that
//! turns a lease's last `sent` and the [`Timing`] into SIGTERM and SIGKILL
//! instants, and the one sequence every stop follows, whoever runs it
//! (leaderrun's supervisor, or its watchdog while leaderrun lives or after
//! it died).
//!
//! The arithmetic, and why it is safe: the store set the lease's expiry at
//! `≥ sent + L` by its own clock, and the holder counts on the boot clock
//! from `sent`, which it read before sending. At `sent + G` the command gets
//! SIGTERM and at `sent + G + K` SIGKILL; `G + K < L` (checked at start,
//! timing.rs), so it is dead before any rival can acquire. A stop begun
//! early (a renewal that matched nothing, `--max-term`) still sends SIGKILL
//! `K` after its SIGTERM, but never later than `sent + G + K`. A stop begun
//! late (a process that wakes past `G + K`) sends SIGTERM and SIGKILL
//! together: both are due.
//!
//! Both are pure: a plan is a value, and a [`Stop`] is told the time and
//! whether anything still runs, and answers with the next step. The callers
//! do the signalling (tree.rs) and the waiting.

use std::time::Duration;

use crate::clock::Stamp;
use crate::timing::Timing;

/// The deadlines of one lease, from the last renewal (or acquisition) that
/// the store confirmed: `sent` is when it was sent, on the boot clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopPlan {
    sent: Stamp,
    t: Timing,
}

/// The watchdog's SIGTERM comes this long after `G` at most: leaderrun,
/// when it runs, sends its own at `G` exactly and so takes the SIGTERM
/// token first (tree.rs); a watchdog that acted at `G` too would race it
/// for nothing. A quarter of `K` when that is less, so the SIGKILL still
/// comes `K` after `G`, well after the SIGTERM.
const WATCHDOG_GRACE: Duration = Duration::from_millis(100);

impl StopPlan {
    pub fn new(sent: Stamp, t: Timing) -> StopPlan {
        StopPlan { sent, t }
    }

    /// A later renewal was confirmed: its `sent` becomes the plan's. An
    /// earlier one (read out of order) changes nothing: deadlines only move
    /// on.
    pub fn renewed(&mut self, sent: Stamp) {
        self.sent = self.sent.max(sent);
    }

    pub fn sent(&self) -> Stamp {
        self.sent
    }

    pub fn timing(&self) -> Timing {
        self.t
    }

    /// `sent + G`: the give-up deadline. From here on the lease may not be
    /// ours for long: leaderrun stops the command, and no command starts.
    pub fn give_up_at(&self) -> Stamp {
        self.sent + self.t.give_up
    }

    /// `sent + G + K`: SIGKILL, whoever sends it; never later.
    pub fn kill_at(&self) -> Stamp {
        self.give_up_at() + self.t.kill_after
    }

    /// `sent + L`: when the store lets the lease go by itself (by our
    /// reckoning; a store whose failover re-extends leases may hold it
    /// longer). Handing the lease back is pointless from here on.
    pub fn expires(&self) -> Stamp {
        self.sent + self.t.lease
    }

    /// How long after `G` the watchdog sends its SIGTERM.
    pub fn grace(&self) -> Duration {
        (self.t.kill_after / 4).min(WATCHDOG_GRACE)
    }

    /// The watchdog's SIGTERM: a grace after `G` (see [`WATCHDOG_GRACE`]).
    pub fn watchdog_term_at(&self) -> Stamp {
        self.give_up_at() + self.grace()
    }

    /// The SIGKILL of a stop whose SIGTERM goes out at `now`: `K` later,
    /// but never past `G + K`, so that the command is dead before the
    /// lease could pass on.
    pub fn kill_from(&self, now: Stamp) -> Stamp {
        (now + self.t.kill_after).min(self.kill_at())
    }
}

/// How often a stop whose SIGKILL went out kills again, and looks whether
/// everything is gone: a process forked between a round's look and its
/// kill is not left running, and an empty tree is seen within a round.
pub const ROUND: Duration = Duration::from_millis(10);

/// How long SIGKILL may take before a process it has not ended counts as
/// stuck (uninterruptible sleep): waiting longer gains nothing.
pub const STUCK: Duration = Duration::from_secs(1);

/// What a stop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// SIGTERM (then SIGCONT) to everything, once per stop.
    Term,
    /// SIGKILL to everything. `first`: the kill deadline's own, not a
    /// later round's.
    Kill { first: bool },
    /// Nothing is due before this instant (call again then, or on news).
    Wait(Stamp),
    /// Everything is gone: the stop is over.
    Gone,
    /// SIGKILL has not ended everything: something is stuck in the kernel.
    Stuck,
}

/// One stop: SIGTERM once when due (if this stop sends one), SIGKILL from
/// its deadline on, again every [`ROUND`] while anything runs, and a
/// verdict of stuck once SIGKILL has had [`STUCK`] (and, for the watchdog
/// after leaderrun's death, until the lease expires) to work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stop {
    term_at: Option<Stamp>,
    kill_at: Stamp,
    /// Not stuck before this, however early the SIGKILL went out.
    until: Option<Stamp>,
    termed: bool,
    killed_at: Option<Stamp>,
    /// When the last SIGKILL round went out.
    round_at: Option<Stamp>,
    /// A SIGKILL went out and the caller has not yet waited and looked.
    unlooked: bool,
}

impl Stop {
    /// leaderrun's stop, begun at `now`: SIGTERM at once, SIGKILL `K` later
    /// but never past `G + K` (at once, with the SIGTERM, when that has
    /// passed: contract §6).
    pub fn at(plan: &StopPlan, now: Stamp) -> Stop {
        Stop::new(Some(now), plan.kill_from(now), None)
    }

    /// The watchdog's stop while leaderrun lives: SIGTERM a grace after
    /// `G`, SIGKILL at `G + K`.
    pub fn watchdog(plan: &StopPlan) -> Stop {
        Stop::new(Some(plan.watchdog_term_at()), plan.kill_at(), None)
    }

    /// leaderrun is gone: SIGKILL at once, no SIGTERM (there is no one left
    /// to wait for a clean exit), kept at until `until` at least.
    pub fn kill_now(now: Stamp, until: Stamp) -> Stop {
        Stop::new(None, now, Some(until))
    }

    fn new(term_at: Option<Stamp>, kill_at: Stamp, until: Option<Stamp>) -> Stop {
        Stop {
            term_at,
            kill_at,
            until,
            termed: false,
            killed_at: None,
            round_at: None,
            unlooked: false,
        }
    }

    /// Whether anything has been sent: a stop under way is not moved by a
    /// later deadline.
    pub fn begun(&self) -> bool {
        self.termed || self.killed_at.is_some()
    }

    /// Whether SIGKILL has gone out.
    pub fn killed(&self) -> bool {
        self.killed_at.is_some()
    }

    /// The next step at `now`, given whether anything of the command still
    /// runs. One signal per call: a caller loops until it gets a `Wait` (or
    /// the end), so that SIGTERM and SIGKILL both go out when both are due.
    /// A SIGKILL is always followed by a `Wait`, even one already due: the
    /// caller then looks again whether anything runs before the next round
    /// or the verdict (a kill that took longer than a round, on a host with
    /// many processes to read, would otherwise be followed by another, and
    /// another, without a look until the verdict of stuck).
    pub fn next(&mut self, now: Stamp, alive: bool) -> Step {
        if !alive {
            return Step::Gone;
        }
        if let Some(at) = self.term_at.filter(|_| !self.termed) {
            // Due at its time, or with the SIGKILL if that comes first (a
            // SIGTERM after the SIGKILL would be pointless, and none is
            // skipped: §6 sends both).
            let due = at.min(self.kill_at);
            if now >= due {
                self.termed = true;
                return Step::Term;
            }
            return Step::Wait(due);
        }
        let Some(killed) = self.killed_at else {
            if now >= self.kill_at {
                self.killed_at = Some(now);
                self.round_at = Some(now);
                self.unlooked = true;
                return Step::Kill { first: true };
            }
            return Step::Wait(self.kill_at);
        };
        let stuck = (killed + STUCK).max(self.until.unwrap_or(killed));
        let round = self.round_at.unwrap_or(killed) + ROUND;
        if std::mem::take(&mut self.unlooked) {
            return Step::Wait(round.min(stuck));
        }
        if now >= stuck {
            return Step::Stuck;
        }
        if now >= round {
            self.round_at = Some(now);
            self.unlooked = true;
            return Step::Kill { first: false };
        }
        Step::Wait(round.min(stuck))
    }
}

#[cfg(test)]
#[path = "stop_tests.rs"]
mod tests;
