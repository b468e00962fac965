//! The watchdog's decisions on a made-up clock, with a scripted world: every
//! deadline, thaws, batches of stale renewals (F1), `spawning` before
//! `child` (F2), stops begun by leaderrun, leaderrun's death before and
//! after the command started, hand-back only when the watchdog may vouch
//! (F4, F10), a replacement's state (F11) and `done`.

use std::cell::Cell;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::timing::{Timing, TimingArgs};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn at(n: u64) -> Stamp {
    Stamp::from_origin(ms(n))
}

/// L = 3 s: R = 1 s, G = 2 s, K = 500 ms (the watchdog's grace: 100 ms).
fn timing() -> Timing {
    Timing::resolve(TimingArgs {
        lease: Some(ms(3000).into()),
        ..Default::default()
    })
    .expect("a valid timing")
}

/// Acquired (sent) at 1 s: G at 3 s, the watchdog's SIGTERM at 3.1 s,
/// SIGKILL at 3.5 s, expiry at 4 s.
fn orders() -> Orders {
    Orders {
        store: None,
        origin: crate::store::Origin::Flag,
        name: "n".into(),
        holder: "h".into(),
        epoch: 7,
        timing: timing(),
        min_hold: None,
        acquired_at: at(1000),
        sent: at(1000),
        verbose: 0,
        quiet: false,
        json: false,
    }
}

fn cg() -> Option<PathBuf> {
    Some(PathBuf::from("/sys/fs/cgroup/leaderrun-1-ab"))
}

fn child(cgroup: Option<PathBuf>) -> Msg {
    Msg::Child {
        pid: 42,
        start: 4242,
        cgroup,
    }
}

fn spawning(cgroup: Option<PathBuf>) -> Msg {
    Msg::Spawning { cgroup }
}

fn renewed(n: u64) -> Msg {
    Msg::Renewed { sent: at(n) }
}

/// What the world was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Ready,
    Watch,
    Cgroup(Option<PathBuf>),
    Leader(i32, u64),
    Look,
    Term { stopping: bool },
    Kill { report: bool },
    FreezeAndKill,
    Probe,
    Orphaned,
    RemoveCgroup,
    Release { until: Stamp, keep: Duration },
    Leave(Why),
}

/// A world that answers from a script and records every call.
struct Fake {
    calls: Vec<(Stamp, Call)>,
    now: std::rc::Rc<Cell<Stamp>>,
    ready: bool,
    held: bool,
    looks: VecDeque<Look>,
    /// Answers to `Probe`, in turn; then `alive`.
    probes: VecDeque<bool>,
    alive: bool,
    cgroup_there: bool,
    /// Answers to `FreezeAndKill`, in turn; then true.
    vouches: VecDeque<bool>,
}

impl World for Fake {
    fn ready(&mut self) -> bool {
        self.call(Call::Ready);
        self.ready
    }
    fn watch(&mut self) {
        self.call(Call::Watch)
    }
    fn set_cgroup(&mut self, cgroup: Option<PathBuf>) {
        self.call(Call::Cgroup(cgroup))
    }
    fn hold_leader(&mut self, pid: i32, start: u64) -> bool {
        self.call(Call::Leader(pid, start));
        self.held
    }
    fn look(&mut self) -> Look {
        self.call(Call::Look);
        self.looks.pop_front().unwrap_or(Look::Taken)
    }
    fn terminate(&mut self, stopping: bool) {
        self.call(Call::Term { stopping })
    }
    fn kill(&mut self, report: bool) {
        self.call(Call::Kill { report })
    }
    fn freeze_and_kill(&mut self) -> bool {
        self.call(Call::FreezeAndKill);
        self.vouches.pop_front().unwrap_or(true)
    }
    fn alive(&mut self) -> bool {
        self.call(Call::Probe);
        self.probes.pop_front().unwrap_or(self.alive)
    }
    fn orphaned(&mut self) -> bool {
        self.call(Call::Orphaned);
        self.cgroup_there
    }
    fn remove_cgroup(&mut self) {
        self.call(Call::RemoveCgroup)
    }
    fn release(&mut self, until: Stamp, keep: Duration) {
        self.call(Call::Release { until, keep })
    }
    fn leave_to_expire(&mut self, why: Why) {
        self.call(Call::Leave(why))
    }
}

impl Fake {
    fn call(&mut self, c: Call) {
        self.calls.push((self.now.get(), c));
    }
}

/// A machine, its world and the clock, driven as the poll loop drives them.
struct Sim {
    m: Machine,
    w: Fake,
    now: std::rc::Rc<Cell<Stamp>>,
    flow: Flow,
}

impl Sim {
    fn new(o: &Orders) -> Sim {
        let now = std::rc::Rc::new(Cell::new(o.sent));
        Sim {
            m: Machine::new(o),
            w: Fake {
                calls: Vec::new(),
                now: now.clone(),
                ready: true,
                held: true,
                looks: VecDeque::new(),
                probes: VecDeque::new(),
                alive: true,
                cgroup_there: false,
                vouches: VecDeque::new(),
            },
            now,
            flow: Flow::Go,
        }
    }

    /// Started with the orders alone, at the acquisition.
    fn started() -> Sim {
        let mut s = Sim::new(&orders());
        s.start(vec![]);
        s.take();
        s
    }

    /// Started, and the command started in `cgroup` (leaderrun said
    /// `spawning` then `child`) 100 ms after the acquisition.
    fn running(cgroup: Option<PathBuf>) -> Sim {
        let mut s = Sim::started();
        s.at(1100);
        s.say(vec![spawning(cgroup.clone()), child(cgroup)]);
        s.take();
        s
    }

    fn input(&mut self, input: Input) {
        assert_eq!(self.flow, Flow::Go, "input after the end: {input:?}");
        let now = self.now.clone();
        self.flow = run(&mut self.m, &mut self.w, &move || now.get(), input);
    }

    fn start(&mut self, said: Vec<Msg>) {
        self.input(Input::Start(said));
    }

    fn say(&mut self, msgs: Vec<Msg>) {
        self.input(Input::Said { msgs, open: true });
    }

    /// leaderrun's end of the pipe closes after `msgs`.
    fn die(&mut self, msgs: Vec<Msg>) {
        self.input(Input::Said { msgs, open: false });
    }

    fn at(&mut self, n: u64) {
        self.now.set(at(n));
    }

    /// Sleep until `n` ms, woken at every instant the machine asks for, as
    /// the poll loop's timer wakes it.
    fn until(&mut self, n: u64) {
        while let Some(w) = self.m.wake().filter(|w| *w <= at(n)) {
            if self.flow != Flow::Go {
                break;
            }
            assert!(w >= self.now.get(), "a wake-up in the past: {w:?}");
            self.now.set(w);
            self.input(Input::Tick);
        }
        self.now.set(at(n));
    }

    /// The calls since the last take, without their instants.
    fn take(&mut self) -> Vec<Call> {
        self.w.calls.drain(..).map(|(_, c)| c).collect()
    }

    /// The calls since the last take, with the instant (ms) of each.
    fn take_timed(&mut self) -> Vec<(u64, Call)> {
        self.w
            .calls
            .drain(..)
            .map(|(t, c)| (t.since_origin().as_millis() as u64, c))
            .collect()
    }
}

fn signals(calls: &[Call]) -> Vec<Call> {
    calls
        .iter()
        .filter(|c| matches!(c, Call::Term { .. } | Call::Kill { .. }))
        .cloned()
        .collect()
}

#[test]
fn ready_is_said_once_the_orders_are_held_and_nothing_is_enforced_before_spawning() {
    let mut s = Sim::new(&orders());
    s.start(vec![]);
    assert_eq!(s.take(), [Call::Ready]);
    // No command can run yet: no deadline, however late it gets.
    assert_eq!(s.m.wake(), None);
    s.at(60_000);
    s.input(Input::Tick);
    s.say(vec![renewed(59_000)]);
    assert_eq!(s.take(), [], "a look or a signal without a command");
    assert_eq!(s.flow, Flow::Go);
}

#[test]
fn a_watchdog_that_cannot_say_ready_leaves_at_once() {
    let mut s = Sim::new(&orders());
    s.w.ready = false;
    s.start(vec![]);
    assert_eq!(s.flow, Flow::Exit(crate::exit::USAGE));
}

#[test]
fn sigterm_a_grace_after_g_and_sigkill_at_g_plus_k() {
    let mut s = Sim::running(cg());
    assert!(!s.m.over());
    assert_eq!(s.m.wake(), Some(at(3100)));
    s.until(3099);
    assert_eq!(s.take(), []);
    s.until(3100);
    assert_eq!(s.take(), [Call::Term { stopping: false }]);
    assert_eq!(s.m.wake(), Some(at(3500)));
    s.until(3499);
    assert_eq!(s.take(), []);
    s.until(3500);
    assert_eq!(s.take(), [Call::Kill { report: true }]);
    // Then every round, while anything runs: a look, and SIGKILL again.
    s.w.probes = VecDeque::from([true, false]);
    s.until(3520);
    assert_eq!(
        s.take_timed(),
        [
            (3510, Call::Probe),
            (3510, Call::Kill { report: false }),
            (3520, Call::Probe),
        ]
    );
    // All gone: the stop is over; nothing more, however late.
    assert_eq!(s.m.wake(), None);
    s.until(60_000);
    s.say(vec![renewed(1500)]);
    assert_eq!(s.take(), [Call::Look]);
    assert_eq!(s.flow, Flow::Go);
}

#[test]
fn a_renewal_moves_every_deadline_and_takes_a_look() {
    let mut s = Sim::running(None);
    s.at(2010);
    s.say(vec![renewed(2000)]);
    assert_eq!(s.take(), [Call::Look]);
    assert_eq!(s.m.plan().give_up_at(), at(4000));
    assert_eq!(s.m.wake(), Some(at(4100)));
    s.until(4099);
    assert_eq!(s.take(), []);
    s.until(4500);
    assert_eq!(
        signals(&s.take()),
        [Call::Term { stopping: false }, Call::Kill { report: true }]
    );
}

/// F1: a watchdog stopped past G while leaderrun went on renewing wakes to
/// a backlog. It applies all of it before acting: no SIGTERM for a lease
/// renewed all along, and one look for the lot.
#[test]
fn a_thawed_watchdog_acts_on_the_latest_renewal_not_on_a_stale_one() {
    let mut s = Sim::running(None);
    // Thawed at 3.3 s: the first renewal's deadline (3.1 s) has passed,
    // the last one's has not. The timer and the pipe are both ready; the
    // pipe is read first.
    s.at(3300);
    s.say(vec![renewed(1500), renewed(2000), renewed(2900)]);
    assert_eq!(s.take(), [Call::Look]);
    assert_eq!(s.m.wake(), Some(at(5000)));
    s.input(Input::Tick);
    assert_eq!(s.take(), []);
    // Out of order: an older renewal read after a newer one moves nothing.
    s.say(vec![renewed(2950), renewed(2100)]);
    assert_eq!(s.m.plan().sent(), at(2950));
}

#[test]
fn a_thaw_past_g_sends_sigterm_and_past_g_plus_k_both_at_once() {
    let mut s = Sim::running(None);
    s.at(3300);
    s.input(Input::Tick);
    assert_eq!(s.take(), [Call::Term { stopping: false }]);
    assert_eq!(s.m.wake(), Some(at(3500)));

    let mut late = Sim::running(None);
    late.at(9000);
    late.input(Input::Tick);
    assert_eq!(
        late.take(),
        [Call::Term { stopping: false }, Call::Kill { report: true }]
    );
    assert_eq!(late.m.wake(), Some(at(9010)));
}

/// A stop under way is not taken back: a renewal read after the SIGTERM
/// (sent before G, read late) does not postpone the SIGKILL.
#[test]
fn a_begun_stop_keeps_its_kill_deadline() {
    let mut s = Sim::running(None);
    s.until(3100);
    assert_eq!(s.take(), [Call::Term { stopping: false }]);
    s.at(3200);
    s.say(vec![renewed(2900)]);
    assert_eq!(s.take(), [Call::Look]);
    assert_eq!(s.m.wake(), Some(at(3500)));
    s.until(3500);
    assert_eq!(s.take(), [Call::Kill { report: true }]);
}

/// F2: leaderrun frozen between `spawning` and `child`: the deadlines hold
/// all the same, on leaderrun's descendants and the planned cgroup.
#[test]
fn spawning_alone_is_enough_for_the_deadlines_to_hold() {
    let mut s = Sim::started();
    s.at(1100);
    s.say(vec![spawning(cg())]);
    assert_eq!(s.take(), [Call::Watch, Call::Cgroup(cg())]);
    s.until(3500);
    assert_eq!(
        signals(&s.take()),
        [Call::Term { stopping: false }, Call::Kill { report: true }]
    );
    // `child` after `spawning` watches the same tree: no second Watch.
    let mut t = Sim::started();
    t.say(vec![spawning(None), spawning(cg()), child(cg())]);
    assert_eq!(
        t.take(),
        [
            Call::Watch,
            Call::Cgroup(None),
            Call::Cgroup(cg()),
            Call::Cgroup(cg()),
            Call::Leader(42, 4242),
        ]
    );
    // A cgroup that could not be made is unsaid.
    let mut u = Sim::started();
    u.say(vec![spawning(cg()), spawning(None)]);
    u.take();
    u.die(vec![]);
    assert_eq!(
        u.take(),
        [
            Call::Orphaned,
            Call::FreezeAndKill,
            Call::Kill { report: false }
        ]
    );
}

/// leaderrun took the SIGTERM token and said `stopping`: the watchdog's
/// SIGTERM at G + grace says so (the token, tree.rs, then sends nothing;
/// should leaderrun have frozen before sending its own, the command still
/// gets exactly one), and its SIGKILL stays at G + K.
#[test]
fn a_stop_begun_by_leaderrun_is_marked_and_keeps_the_kill_deadline() {
    let mut s = Sim::running(cg());
    s.at(2500);
    s.say(vec![Msg::Stopping]);
    assert_eq!(s.take(), []);
    s.until(3600);
    assert_eq!(
        s.take_timed(),
        [
            (3100, Call::Term { stopping: true }),
            (3500, Call::Kill { report: true }),
            (3510, Call::Probe),
            (3510, Call::Kill { report: false }),
            (3520, Call::Probe),
            (3520, Call::Kill { report: false }),
            (3530, Call::Probe),
            (3530, Call::Kill { report: false }),
            (3540, Call::Probe),
            (3540, Call::Kill { report: false }),
            (3550, Call::Probe),
            (3550, Call::Kill { report: false }),
            (3560, Call::Probe),
            (3560, Call::Kill { report: false }),
            (3570, Call::Probe),
            (3570, Call::Kill { report: false }),
            (3580, Call::Probe),
            (3580, Call::Kill { report: false }),
            (3590, Call::Probe),
            (3590, Call::Kill { report: false }),
            (3600, Call::Probe),
            (3600, Call::Kill { report: false }),
        ]
    );
}

/// What SIGKILL does not end within a second is stuck: the rounds stop,
/// and nothing more is done while leaderrun lives.
#[test]
fn the_rounds_stop_once_sigkill_has_had_a_second() {
    let mut s = Sim::running(cg());
    s.until(4600);
    let calls = s.take();
    assert_eq!(calls.last(), Some(&Call::Probe));
    let kills = calls
        .iter()
        .filter(|c| matches!(c, Call::Kill { .. }))
        .count();
    assert_eq!(kills, 100, "one at G + K, then one a round for a second");
    assert_eq!(s.m.wake(), None);
    s.until(9000);
    assert_eq!(s.take(), []);
}

#[test]
fn done_leaves_at_once_touching_nothing() {
    let mut s = Sim::running(cg());
    s.at(2000);
    // A renewal in the same batch: no look, no signal.
    s.say(vec![renewed(1900), Msg::Done, Msg::Stopping]);
    assert_eq!(s.take(), []);
    assert_eq!(s.flow, Flow::Exit(0));
    assert!(s.m.over());
    assert_eq!(s.m.wake(), None);
    // In the middle of a stop, after the SIGTERM.
    let mut t = Sim::running(cg());
    t.until(3200);
    t.take();
    t.say(vec![Msg::Done]);
    assert_eq!(t.take(), []);
    assert_eq!(t.flow, Flow::Exit(0));
    // Said inside a replacement's orders: it leaves without `ready`.
    let mut u = Sim::new(&orders());
    u.start(vec![Msg::Done]);
    assert_eq!(u.take(), []);
    assert_eq!(u.flow, Flow::Exit(0));
}

/// leaderrun died before it said `spawning`: it had not forked, so no
/// command ever ran; the lease is handed back at once, keeping what is
/// left of `--min-hold`.
#[test]
fn leaderrun_gone_before_the_command_started_hands_the_lease_back() {
    let mut s = Sim::started();
    s.at(1500);
    s.die(vec![]);
    assert_eq!(
        s.take(),
        [Call::Release {
            until: at(4000),
            keep: Duration::ZERO
        }]
    );
    assert_eq!(s.flow, Flow::Exit(0));

    let mut o = orders();
    o.min_hold = Some(ms(5000));
    let mut m = Sim::new(&o);
    m.start(vec![]);
    m.take();
    m.at(2500);
    m.say(vec![renewed(2000)]);
    m.die(vec![]);
    assert_eq!(
        m.take(),
        [Call::Release {
            until: at(5000),
            keep: ms(3500)
        }]
    );
}

/// leaderrun died while the command ran in its cgroup: SIGKILL at once
/// (no SIGTERM), again every round until the cgroup is empty, then the
/// cgroup goes and the lease is handed back until it would have expired.
#[test]
fn leaderrun_gone_with_a_cgroup_kills_at_once_then_hands_back() {
    let mut s = Sim::running(cg());
    s.w.cgroup_there = true;
    s.w.probes = VecDeque::from([true, true, false]);
    s.at(2000);
    s.die(vec![]);
    assert_eq!(s.take(), [Call::Orphaned, Call::Kill { report: false }]);
    assert_eq!(s.m.wake(), Some(at(2010)));
    s.until(3000);
    assert_eq!(
        s.take_timed(),
        [
            (2010, Call::Probe),
            (2010, Call::Kill { report: false }),
            (2020, Call::Probe),
            (2020, Call::Kill { report: false }),
            (2030, Call::Probe),
            (2030, Call::RemoveCgroup),
            (
                2030,
                Call::Release {
                    until: at(4000),
                    keep: Duration::ZERO
                }
            ),
        ]
    );
    assert_eq!(s.flow, Flow::Exit(0));
}

/// Without a cgroup (F4): every round first stops what the last look held
/// and finds its children, then kills; the lease goes back only when the
/// look was good and the first round could vouch for it.
#[test]
fn leaderrun_gone_without_a_cgroup_freezes_and_kills_every_round() {
    let mut s = Sim::running(None);
    s.at(2000);
    s.say(vec![renewed(2000)]);
    assert_eq!(s.take(), [Call::Look]);
    s.w.probes = VecDeque::from([true, false]);
    s.at(2100);
    s.die(vec![]);
    s.until(3000);
    assert_eq!(
        s.take_timed(),
        [
            (2100, Call::Orphaned),
            (2100, Call::FreezeAndKill),
            (2100, Call::Kill { report: false }),
            (2110, Call::Probe),
            (2110, Call::FreezeAndKill),
            (2110, Call::Kill { report: false }),
            (2120, Call::Probe),
            (
                2120,
                Call::Release {
                    until: at(5000),
                    keep: Duration::ZERO
                }
            ),
        ]
    );
}

fn orphaned_without_cgroup(s: &mut Sim) -> Vec<Call> {
    s.w.probes = VecDeque::from([false]);
    s.at(2100);
    s.die(vec![]);
    s.until(3000);
    s.take()
}

/// F4: a process of the last look had exited by itself before the first
/// round could stop it: what it forked since may run on, unseen. The
/// lease is left to expire; a later round's answer does not change that.
#[test]
fn a_process_of_the_look_gone_by_itself_keeps_the_lease_from_going_back() {
    let mut s = Sim::running(None);
    s.w.vouches = VecDeque::from([false, true]);
    s.w.probes = VecDeque::from([true, false]);
    s.at(2100);
    s.die(vec![]);
    s.until(3000);
    let calls = s.take();
    assert_eq!(calls.last(), Some(&Call::Leave(Why::Unseen)), "{calls:?}");
    // A later round's failure alone does not count: the first vouched.
    let mut t = Sim::running(None);
    t.w.vouches = VecDeque::from([true, false]);
    t.w.probes = VecDeque::from([true, false]);
    t.at(2100);
    t.die(vec![]);
    t.until(3000);
    assert!(matches!(t.take().last(), Some(Call::Release { .. })));
}

/// F10: a renewal whose look was missed (leaderrun was already gone when
/// the watchdog read it) leaves the last good look older than `R`: no
/// hand-back. A good look after it restores the right.
#[test]
fn a_missed_look_keeps_the_lease_from_going_back_until_a_good_one() {
    let mut s = Sim::running(None);
    s.w.looks = VecDeque::from([Look::Missed]);
    s.at(2000);
    s.say(vec![renewed(2000)]);
    assert_eq!(
        orphaned_without_cgroup(&mut s).last(),
        Some(&Call::Leave(Why::Unseen))
    );

    let mut t = Sim::running(None);
    t.w.looks = VecDeque::from([Look::Missed, Look::Taken]);
    t.at(2000);
    t.say(vec![renewed(2000)]);
    t.say(vec![renewed(2000)]);
    assert!(matches!(
        orphaned_without_cgroup(&mut t).last(),
        Some(Call::Release { .. })
    ));

    // The renewal read together with the end of the pipe: its look could
    // only be missed.
    let mut u = Sim::running(None);
    u.w.looks = VecDeque::from([Look::Missed]);
    u.w.probes = VecDeque::from([false]);
    u.at(2000);
    u.die(vec![renewed(2000)]);
    u.until(3000);
    let calls = u.take();
    assert_eq!(calls.first(), Some(&Call::Look));
    assert_eq!(calls.last(), Some(&Call::Leave(Why::Unseen)));
}

/// With a cgroup there, no look is needed and none is counted as missed.
#[test]
fn with_a_cgroup_looks_are_not_needed_and_not_counted() {
    let mut s = Sim::running(cg());
    s.w.cgroup_there = true;
    s.w.looks = VecDeque::from([Look::Cgroup]);
    s.at(2000);
    s.say(vec![renewed(2000)]);
    s.w.probes = VecDeque::from([false]);
    s.at(2100);
    s.die(vec![]);
    s.until(3000);
    assert!(matches!(s.take().last(), Some(Call::Release { .. })));
}

/// The watchdog never learnt which process the command is (leaderrun died
/// after `spawning`, or the pid named it no more when `child` came): without
/// a cgroup it cannot vouch.
#[test]
fn without_the_command_held_and_no_cgroup_the_lease_is_left_to_expire() {
    let mut s = Sim::started();
    s.say(vec![spawning(None)]);
    assert_eq!(
        orphaned_without_cgroup(&mut s).last(),
        Some(&Call::Leave(Why::Unseen))
    );
    let mut t = Sim::started();
    t.w.held = false;
    t.say(vec![spawning(None), child(None)]);
    assert_eq!(
        orphaned_without_cgroup(&mut t).last(),
        Some(&Call::Leave(Why::Unseen))
    );
    // With its cgroup there, the cgroup is what vouches.
    let mut u = Sim::started();
    u.w.cgroup_there = true;
    u.say(vec![spawning(cg())]);
    let calls = orphaned_without_cgroup(&mut u);
    assert!(!calls.contains(&Call::FreezeAndKill), "{calls:?}");
    assert_eq!(
        calls[calls.len() - 2..],
        [
            Call::RemoveCgroup,
            Call::Release {
                until: at(4000),
                keep: Duration::ZERO
            }
        ]
    );
}

/// A planned cgroup that is not there (leaderrun died before the mkdir)
/// proves nothing: the rounds freeze and kill as without one, and there
/// is nothing to remove.
#[test]
fn a_planned_cgroup_that_is_not_there_counts_as_none() {
    let mut s = Sim::running(cg());
    s.w.cgroup_there = false;
    let calls = orphaned_without_cgroup(&mut s);
    assert!(calls.contains(&Call::FreezeAndKill), "{calls:?}");
    assert!(!calls.contains(&Call::RemoveCgroup), "{calls:?}");
    assert!(matches!(calls.last(), Some(Call::Release { .. })));
}

/// Something SIGKILL does not end: the watchdog keeps killing until the
/// lease would have expired (a second at least), removes the cgroup if it
/// can, and leaves the lease to expire.
#[test]
fn what_survives_sigkill_until_the_expiry_keeps_the_lease() {
    let mut s = Sim::running(cg());
    s.w.cgroup_there = true;
    s.at(2000);
    s.die(vec![]);
    s.until(10_000);
    let calls = s.take_timed();
    let (last_kill, _) = calls
        .iter()
        .rev()
        .find(|(_, c)| matches!(c, Call::Kill { .. }))
        .expect("kills");
    assert!(*last_kill < 4000 && *last_kill >= 3990, "{last_kill}");
    assert_eq!(
        calls[calls.len() - 2..],
        [
            (4000, Call::RemoveCgroup),
            (4000, Call::Leave(Why::Survived))
        ]
    );
    assert_eq!(s.flow, Flow::Exit(0));

    // Died late (it was itself delayed): a second of SIGKILL all the same.
    let mut t = Sim::running(cg());
    t.w.cgroup_there = true;
    t.at(3800);
    t.die(vec![]);
    t.until(10_000);
    let calls = t.take_timed();
    assert_eq!(calls.last(), Some(&(4800, Call::Leave(Why::Survived))));
}

/// All gone, but only once the lease would have expired: nothing to hand
/// back (someone else may hold it by now).
#[test]
fn gone_only_after_the_expiry_is_not_handed_back() {
    let mut s = Sim::running(cg());
    s.w.cgroup_there = true;
    s.at(3990);
    s.die(vec![]);
    s.w.probes = VecDeque::from([true]);
    s.w.alive = false;
    s.until(5000);
    let calls = s.take_timed();
    assert_eq!(calls.last(), Some(&(4010, Call::Leave(Why::Survived))));

    // Gone at the very instant of the expiry: too late as well.
    let mut t = Sim::running(cg());
    t.w.cgroup_there = true;
    t.at(3980);
    t.die(vec![]);
    t.w.probes = VecDeque::from([true]);
    t.w.alive = false;
    t.until(5000);
    let calls = t.take_timed();
    assert_eq!(calls.last(), Some(&(4000, Call::Leave(Why::Survived))));
    // A round earlier, it goes back.
    let mut u = Sim::running(cg());
    u.w.cgroup_there = true;
    u.at(3979);
    u.die(vec![]);
    u.w.probes = VecDeque::from([true]);
    u.w.alive = false;
    u.until(5000);
    assert!(matches!(
        u.take_timed().last(),
        Some((3999, Call::Release { .. }))
    ));
}

/// F11: a replacement's orders carry what leaderrun said since; it applies
/// all of it (looking at once) before it says `ready`, and a stop that
/// leaderrun had begun stays leaderrun's.
#[test]
fn a_replacement_holds_the_state_in_its_orders_before_it_says_ready() {
    let mut o = orders();
    o.sent = at(2000);
    let mut s = Sim::new(&o);
    s.at(2500);
    s.start(vec![child(cg()), Msg::Stopping, Msg::Look]);
    assert_eq!(
        s.take(),
        [
            Call::Watch,
            Call::Cgroup(cg()),
            Call::Leader(42, 4242),
            Call::Look,
            Call::Ready
        ]
    );
    assert_eq!(s.m.wake(), Some(at(4100)));
    s.until(4500);
    assert_eq!(
        signals(&s.take()),
        [Call::Term { stopping: true }, Call::Kill { report: true }]
    );

    // Started past the deadlines: `ready` first, then both signals.
    let mut late = Sim::new(&orders());
    late.at(3600);
    late.start(vec![spawning(cg())]);
    assert_eq!(
        late.take(),
        [
            Call::Watch,
            Call::Cgroup(cg()),
            Call::Ready,
            Call::Term { stopping: false },
            Call::Kill { report: true }
        ]
    );
}

/// A tick between leaderrun's death and the world's answer on the cgroup
/// (no driver sends one, but nothing may come of it): the stop after the
/// death has not begun, so there is nothing to look at yet. After the end,
/// nothing at all.
#[test]
fn ticks_out_of_turn_after_leaderruns_death_change_nothing() {
    let mut s = Sim::running(cg());
    s.at(2000);
    let now = s.now.get();
    assert_eq!(
        s.m.handle(
            now,
            Input::Said {
                msgs: vec![],
                open: false
            }
        ),
        [Action::Orphaned]
    );
    assert_eq!(s.m.handle(now, Input::Tick), []);
    assert_eq!(
        s.m.handle(now, Input::CgroupThere(true)),
        [Action::Kill { report: false }]
    );
    assert_eq!(s.m.handle(now + ms(10), Input::Tick), [Action::Probe]);
    let end = s.m.handle(now + ms(10), Input::Alive(false));
    assert_eq!(end.last(), Some(&Action::Exit));
    assert!(s.m.over());
    for input in [
        Input::Tick,
        Input::Alive(true),
        Input::Said {
            msgs: vec![spawning(None)],
            open: true,
        },
        Input::CgroupThere(true),
    ] {
        assert_eq!(s.m.handle(now + ms(20), input), []);
    }
    assert_eq!(s.m.wake(), None);
}

#[test]
fn inputs_out_of_place_change_nothing() {
    let mut s = Sim::new(&orders());
    s.input(Input::Tick);
    s.input(Input::Alive(false));
    s.input(Input::CgroupThere(true));
    s.input(Input::Said {
        msgs: vec![spawning(cg())],
        open: true,
    });
    assert_eq!(s.take(), []);
    s.start(vec![]);
    assert_eq!(s.take(), [Call::Ready]);
    s.input(Input::Start(vec![spawning(cg())]));
    s.input(Input::CgroupThere(true));
    assert_eq!(s.take(), []);
    assert_eq!(s.m.wake(), None);
    // A `child` with no pid names nothing.
    s.say(vec![Msg::Child {
        pid: 0,
        start: 1,
        cgroup: cg(),
    }]);
    assert_eq!(s.take(), []);
}
