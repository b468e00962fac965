//! The watchdog's logic as a state machine: what it knows, what it decides,
//! and nothing it does. The poll loop (process.rs) reads the pipe and the
//! clock, hands the machine each [`Input`], and performs the [`Action`]s it
//! answers with through a [`World`], whose answers come back as inputs.
//! Unit tests drive it on a made-up clock with a scripted world
//! (machine_tests.rs).
//!
//! What it enforces (docs/contract.md §10, §11), decided here and only here:
//!
//! * From the first `spawning` on (leaderrun may fork from then), the
//!   deadlines of the stop plan (stop.rs) hold: SIGTERM a grace after `G`,
//!   SIGKILL at `G + K`, counted from the last renewal leaderrun reported.
//!   Before that nothing runs that could be stopped.
//! * Everything leaderrun said is applied before any deadline is acted on:
//!   a watchdog that was itself stopped wakes to a backlog of renewals and
//!   acts on the latest, not on the first stale one (F1). A batch of
//!   renewals takes one look at leaderrun's descendants, not one each.
//! * A stop that has begun is not taken back by a later deadline.
//! * When leaderrun's end of the pipe closes without `done`, it died: what
//!   the command started is killed at once (no SIGTERM: nobody waits for a
//!   clean exit), round after round (without a cgroup, each round first
//!   stops what the last look held and finds its children, F4), until all
//!   of it is gone, or until the lease would have expired and SIGKILL has
//!   had a second. Only then, and only when it may vouch that nothing runs,
//!   is the lease handed back, at this epoch, until it would have expired
//!   anyway. Without a cgroup it may vouch only if it knew which process
//!   the command is, missed no renewal's look (F10), and no process of its
//!   last look had exited by itself (F4). Died before `spawning`: nothing
//!   ran, the lease is handed back.
//! * `done`: everything is gone; leave, touching nothing.

use std::path::PathBuf;
use std::time::Duration;

use super::orders::{Msg, Orders};
use crate::clock::Stamp;
use crate::stop::{Step, Stop, StopPlan};

/// What the machine is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// What leaderrun said before the orders were sent (a replacement's
    /// case), which came inside them: applied before `ready`.
    Start(Vec<Msg>),
    /// Everything read from the pipe since the last batch; `open` false:
    /// leaderrun's end closed after these (it died, unless it said `done`).
    Said { msgs: Vec<Msg>, open: bool },
    /// The time the machine asked to wake at has come (or any time).
    Tick,
    /// The answer to [`Action::Look`].
    Looked(Look),
    /// The answer to [`Action::Leader`]: whether the pid still names the
    /// process leaderrun started.
    Held(bool),
    /// The answer to [`Action::Orphaned`]: whether the command's cgroup is
    /// there (a planned one may never have been made).
    CgroupThere(bool),
    /// The answer to [`Action::FreezeAndKill`]: false when a process of the
    /// last look had exited by itself.
    Vouched(bool),
    /// The answer to [`Action::Probe`]: whether anything of the command
    /// still runs.
    Alive(bool),
}

/// How a look went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// Not needed: the command's cgroup is there and holds everything.
    Cgroup,
    /// Taken while leaderrun provably ran: it replaces the last one.
    Taken,
    /// leaderrun was gone already: the last good look stands, older than
    /// one renewal.
    Missed,
}

/// What the machine wants done, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Tell leaderrun the orders are held: the command may start.
    Ready,
    /// From now on leaderrun's descendants are the command's (a tree rooted
    /// at leaderrun).
    Watch,
    /// The command's cgroup, or none.
    Cgroup(Option<PathBuf>),
    /// Hold the command by its pid and start time. Answered by `Held`.
    Leader { pid: i32, start: u64 },
    /// Look at leaderrun's descendants (unless the cgroup holds them all).
    /// Answered by `Looked`.
    Look,
    /// SIGTERM, then SIGCONT, to everything, if the SIGTERM token is ours.
    /// `stopping`: leaderrun said it was stopping the command itself.
    Term { stopping: bool },
    /// SIGKILL to everything. `report`: the kill deadline's, while
    /// leaderrun lives (worth a warning if anything still runs).
    Kill { report: bool },
    /// Without a cgroup: stop (SIGSTOP) what the last look held, find what
    /// it started since while it stands still, to a fixpoint, and SIGKILL
    /// all of it. Answered by `Vouched`.
    FreezeAndKill,
    /// Whether anything still runs. Answered by `Alive`.
    Probe,
    /// leaderrun is gone: its descendants are no longer found by walking
    /// it, and a planned cgroup that is not there is forgotten. Answered by
    /// `CgroupThere`.
    Orphaned,
    /// Remove the command's cgroup (only an empty one goes).
    RemoveCgroup,
    /// Hand the lease back at this epoch, retried until `until`, keeping
    /// it `keep` longer (`--min-hold`).
    Release { until: Stamp, keep: Duration },
    /// The lease is not handed back, and why.
    LeaveToExpire(Why),
    /// The watchdog's work is over.
    Exit,
}

/// Why the lease is left to expire after leaderrun's death.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Something survived SIGKILL, or the lease would have expired by the
    /// time all of it was gone.
    Survived,
    /// Without a cgroup, the watchdog cannot vouch that nothing runs.
    Unseen,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Orders held, their state not yet applied, `ready` not said.
    Starting,
    /// leaderrun lives: the deadlines hold.
    Guarding,
    /// leaderrun died: everything goes, then perhaps the lease.
    Orphaned,
    Over,
}

pub struct Machine {
    plan: StopPlan,
    acquired_at: Stamp,
    min_hold: Option<Duration>,
    phase: Phase,
    /// `spawning` or `child` was said: a command may run.
    watched: bool,
    /// A cgroup holds the command (as far as the machine knows).
    cgroup: bool,
    /// The command is held by pid and start time.
    leader: bool,
    /// leaderrun said it is stopping the command (it holds the token).
    stopping: bool,
    /// Renewals whose look was missed since the last good one.
    missed: u32,
    /// The stop under way, or (not begun) the one the plan gives now.
    stop: Stop,
    /// The running stop (while leaderrun lives) has ended: all gone, or
    /// stuck.
    stop_over: bool,
    /// The first round's answer, after leaderrun's death.
    vouched: Option<bool>,
    wake: Option<Stamp>,
}

impl Machine {
    pub fn new(o: &Orders) -> Machine {
        let plan = StopPlan::new(o.sent, o.timing);
        Machine {
            plan,
            acquired_at: o.acquired_at,
            min_hold: o.min_hold,
            phase: Phase::Starting,
            watched: false,
            cgroup: false,
            leader: false,
            stopping: false,
            missed: 0,
            stop: Stop::watchdog(&plan),
            stop_over: false,
            vouched: None,
            wake: None,
        }
    }

    /// When to be woken with [`Input::Tick`], news aside.
    pub fn wake(&self) -> Option<Stamp> {
        self.wake.filter(|_| self.phase != Phase::Over)
    }

    /// The stop plan, with the latest renewal.
    pub fn plan(&self) -> &StopPlan {
        &self.plan
    }

    pub fn over(&self) -> bool {
        self.phase == Phase::Over
    }

    /// One input at `now`; the actions it calls for, in order. An action
    /// that is answered comes last in its list, or is answered only with
    /// facts the rest of the list does not depend on.
    pub fn handle(&mut self, now: Stamp, input: Input) -> Vec<Action> {
        let mut out = Vec::new();
        match (self.phase, input) {
            (Phase::Starting, Input::Start(said)) => {
                if self.apply(&said, &mut out) {
                    return self.exit();
                }
                out.push(Action::Ready);
                self.phase = Phase::Guarding;
                self.enforce(now, &mut out);
            }
            (Phase::Guarding, Input::Said { msgs, open }) => {
                if self.apply(&msgs, &mut out) {
                    return self.exit();
                }
                if open {
                    self.enforce(now, &mut out);
                } else {
                    self.orphan(now, &mut out);
                }
            }
            (Phase::Guarding, Input::Tick) => self.enforce(now, &mut out),
            (Phase::Orphaned, Input::Tick) if self.stop.killed() => out.push(Action::Probe),
            (_, Input::Looked(look)) => match look {
                Look::Cgroup => {}
                Look::Taken => self.missed = 0,
                Look::Missed => self.missed += 1,
            },
            (_, Input::Held(held)) => self.leader = held,
            (_, Input::Vouched(v)) => {
                self.vouched.get_or_insert(v);
            }
            (Phase::Orphaned, Input::CgroupThere(there)) => {
                self.cgroup = there;
                self.stop = Stop::kill_now(now, self.plan.expires());
                self.drive(now, true, &mut out);
            }
            (Phase::Guarding | Phase::Orphaned, Input::Alive(alive)) => {
                self.drive(now, alive, &mut out)
            }
            // Out of place (a tick before the orders or after the end, a
            // tick between leaderrun's death and the answer on its cgroup,
            // an answer to a question not asked in this phase): nothing to
            // do. (An answer after the end changes a count no one reads.)
            _ => {}
        }
        out
    }

    fn exit(&mut self) -> Vec<Action> {
        self.phase = Phase::Over;
        self.wake = None;
        vec![Action::Exit]
    }

    /// Apply what leaderrun said, in order; one look for the batch. True
    /// on `done`.
    fn apply(&mut self, msgs: &[Msg], out: &mut Vec<Action>) -> bool {
        let mut look = false;
        for m in msgs {
            match m {
                Msg::Done => return true,
                Msg::Spawning { cgroup } => {
                    self.watch(out);
                    self.cgroup = cgroup.is_some();
                    out.push(Action::Cgroup(cgroup.clone()));
                }
                Msg::Child { pid, start, cgroup } if *pid > 0 => {
                    self.watch(out);
                    self.cgroup = cgroup.is_some();
                    out.push(Action::Cgroup(cgroup.clone()));
                    // Not held until the world says so: the pid may no
                    // longer name the command (it exited and was reaped).
                    // No look yet: the command has only just started, and
                    // it is in its group. The first renewal takes one.
                    self.leader = false;
                    out.push(Action::Leader {
                        pid: *pid,
                        start: *start,
                    });
                }
                Msg::Child { .. } => {}
                Msg::Renewed { sent } => {
                    self.plan.renewed(*sent);
                    look = true;
                }
                Msg::Look => look = true,
                Msg::Stopping => self.stopping = true,
            }
        }
        // Without a tree there is nothing to look for.
        if look && self.watched {
            out.push(Action::Look);
        }
        false
    }

    fn watch(&mut self, out: &mut Vec<Action>) {
        if !self.watched {
            self.watched = true;
            out.push(Action::Watch);
        }
    }

    /// leaderrun lives: act on the deadlines at `now`.
    fn enforce(&mut self, now: Stamp, out: &mut Vec<Action>) {
        if !self.watched || self.stop_over {
            self.wake = None;
            return;
        }
        if !self.stop.begun() {
            self.stop = Stop::watchdog(&self.plan);
        }
        if self.stop.killed() {
            // A round is due, or news came: whether anything runs decides.
            out.push(Action::Probe);
            return;
        }
        self.drive(now, true, out);
    }

    /// Leaderrun's end of the pipe closed without `done`: it died.
    fn orphan(&mut self, now: Stamp, out: &mut Vec<Action>) {
        self.phase = Phase::Orphaned;
        if self.watched {
            out.push(Action::Orphaned);
            return;
        }
        // It died before it could fork: no command ever ran.
        out.push(Action::Release {
            until: self.plan.expires(),
            keep: self.keep(now),
        });
        out.extend(self.exit());
    }

    /// The stop's steps at `now` until it waits or ends.
    fn drive(&mut self, now: Stamp, alive: bool, out: &mut Vec<Action>) {
        let orphaned = self.phase == Phase::Orphaned;
        loop {
            match self.stop.next(now, alive) {
                Step::Term => out.push(Action::Term {
                    stopping: self.stopping,
                }),
                Step::Kill { first } => {
                    if orphaned && !self.cgroup {
                        out.push(Action::FreezeAndKill);
                    }
                    out.push(Action::Kill {
                        report: first && !orphaned,
                    });
                }
                Step::Wait(at) => {
                    self.wake = Some(at);
                    return;
                }
                Step::Gone | Step::Stuck if !orphaned => {
                    self.stop_over = true;
                    self.wake = None;
                    return;
                }
                Step::Gone => return self.settle(now, true, out),
                Step::Stuck => return self.settle(now, false, out),
            }
        }
    }

    /// After leaderrun's death, the stop is over: hand the lease back only
    /// when everything is gone in time and the watchdog may vouch for it.
    fn settle(&mut self, now: Stamp, gone: bool, out: &mut Vec<Action>) {
        if self.cgroup {
            out.push(Action::RemoveCgroup);
        }
        let expires = self.plan.expires();
        let unseen =
            !self.cgroup && (!self.leader || self.missed > 0 || self.vouched != Some(true));
        if !gone || now >= expires {
            out.push(Action::LeaveToExpire(Why::Survived));
        } else if unseen {
            out.push(Action::LeaveToExpire(Why::Unseen));
        } else {
            out.push(Action::Release {
                until: expires,
                keep: self.keep(now),
            });
        }
        out.extend(self.exit());
    }

    /// What is left of `--min-hold` at `now`.
    fn keep(&self, now: Stamp) -> Duration {
        self.min_hold
            .map(|m| m.saturating_sub(now - self.acquired_at))
            .unwrap_or_default()
    }
}

/// Where the machine's actions are performed: the watchdog process's tree,
/// pipe and store (process.rs), or a test's script.
pub trait World {
    /// Say `ready`; false when it could not be said.
    fn ready(&mut self) -> bool;
    fn watch(&mut self);
    fn set_cgroup(&mut self, cgroup: Option<PathBuf>);
    fn hold_leader(&mut self, pid: i32, start: u64) -> bool;
    fn look(&mut self) -> Look;
    fn terminate(&mut self, stopping: bool);
    fn kill(&mut self, report: bool);
    fn freeze_and_kill(&mut self) -> bool;
    fn alive(&mut self) -> bool;
    /// Forget leaderrun as the root; whether the cgroup is there.
    fn orphaned(&mut self) -> bool;
    fn remove_cgroup(&mut self);
    fn release(&mut self, until: Stamp, keep: Duration);
    fn leave_to_expire(&mut self, why: Why);
}

/// How a watchdog goes on after an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Go,
    /// Leave with this exit status.
    Exit(i32),
}

/// Hand `input` to the machine at `now()`, perform what it asks in order,
/// and hand each answer back in the order the questions were asked, until
/// nothing is left to answer.
pub fn run(m: &mut Machine, w: &mut impl World, now: &impl Fn() -> Stamp, input: Input) -> Flow {
    let mut inputs = std::collections::VecDeque::from([input]);
    while let Some(input) = inputs.pop_front() {
        for action in m.handle(now(), input) {
            let answer = match action {
                Action::Ready => {
                    if !w.ready() {
                        return Flow::Exit(crate::exit::USAGE);
                    }
                    None
                }
                Action::Watch => {
                    w.watch();
                    None
                }
                Action::Cgroup(cg) => {
                    w.set_cgroup(cg);
                    None
                }
                Action::Leader { pid, start } => Some(Input::Held(w.hold_leader(pid, start))),
                Action::Look => Some(Input::Looked(w.look())),
                Action::Term { stopping } => {
                    w.terminate(stopping);
                    None
                }
                Action::Kill { report } => {
                    w.kill(report);
                    None
                }
                Action::FreezeAndKill => Some(Input::Vouched(w.freeze_and_kill())),
                Action::Probe => Some(Input::Alive(w.alive())),
                Action::Orphaned => Some(Input::CgroupThere(w.orphaned())),
                Action::RemoveCgroup => {
                    w.remove_cgroup();
                    None
                }
                Action::Release { until, keep } => {
                    w.release(until, keep);
                    None
                }
                Action::LeaveToExpire(why) => {
                    w.leave_to_expire(why);
                    None
                }
                Action::Exit => return Flow::Exit(0),
            };
            inputs.extend(answer);
        }
    }
    Flow::Go
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
