//! A ZooKeeper ensemble of three members fails under two `leaderrun
//! --wait` contenders: a frozen follower listed first, a killed leader
//! (right after a renewal, and just before one), a lost and regained
//! quorum. Each contender's command is the chaos suite's child
//! (support/chaos_child.rs): it logs its steps with `LEASE_EPOCH` on the
//! boot clock and writes to a fenced Postgres table, and the chaos checker
//! (support/checker.rs) counts overlaps and repeated epochs. Every test
//! prints its figures (`--no-capture`).
//!
//! Timing: `--lease 3s` (R = 1 s, G = 2 s, K = 0.5 s; one call is given
//! min(R/2, (G − R)/2) = 0.5 s), `--retry 1s`, on an ensemble with a
//! tickTime of 100 ms (support/zookeeper.rs).

use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::chaos_child::{boot_ns, SCHEMA};
use crate::support::checker::{self, Fault, Limits, Run};
use crate::support::zookeeper::{mode, Ensemble};
use crate::support::*;
use nix::sys::signal::Signal;

const LEASE: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);
const GIVE_UP: Duration = Duration::from_secs(2);
const KILL_AFTER: Duration = Duration::from_millis(500);
const RETRY: Duration = Duration::from_secs(1);
/// The ensemble's tickTime: a session expires up to one tick after its
/// timeout.
const TICK: Duration = Duration::from_millis(100);
/// How long the two members left may take to elect a leader and sync:
/// `initLimit` × tickTime, within which a follower must have synced with a
/// new leader or the round starts over.
const ELECTION: Duration = Duration::from_secs(2);
const MS: u128 = 1_000_000;

struct Contender {
    gen: u32,
    proc: Option<Child>,
    restart_at: Option<Instant>,
}

/// An ensemble, the fenced resource, and contenders restarted (like systemd
/// would) when they exit.
struct Rig {
    zk: Ensemble,
    fence: Pg,
    dir: TempDir,
    log: std::path::PathBuf,
    url: String,
    contenders: Vec<Contender>,
    exits: Vec<(String, Option<i32>)>,
}

/// What a run left behind.
struct Outcome {
    runs: Vec<Run>,
    accepted: Vec<i64>,
}

impl Rig {
    fn start() -> Rig {
        let fence = Pg::start();
        fence.sql(SCHEMA);
        let dir = TempDir::new("failover-zk");
        Rig {
            zk: Ensemble::start(),
            fence,
            log: dir.file("children.log"),
            dir,
            url: String::new(),
            contenders: Vec::new(),
            exits: Vec::new(),
        }
    }

    fn who(&self, i: usize) -> String {
        format!("c{i}g{}", self.contenders[i].gen)
    }

    /// `n` contenders on `url`; returns once one of them runs its command.
    fn contend(&mut self, url: String, n: usize) -> Duration {
        self.url = url;
        let before = checker::parse(&read_or_empty(&self.log)).len();
        for _ in 0..n {
            self.contenders.push(Contender {
                gen: 0,
                proc: None,
                restart_at: None,
            });
            self.spawn(self.contenders.len() - 1);
        }
        self.until_a_command_starts(before, Duration::from_secs(30))
            .expect("a command to run")
    }

    /// Keep the contenders going until the `before`+1-th command has logged
    /// its start; how long that took, or `None` after `limit`.
    fn until_a_command_starts(&mut self, before: usize, limit: Duration) -> Option<Duration> {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if checker::parse(&read_or_empty(&self.log)).len() > before {
                return Some(t0.elapsed());
            }
            self.idle(Duration::from_millis(10));
        }
        None
    }

    fn spawn(&mut self, i: usize) {
        self.contenders[i].gen += 1;
        let who = self.who(i);
        let spec = format!("{}|{}|{who}", self.log.display(), self.fence.url());
        let exe = std::env::current_exe().expect("test binary");
        let mut c = leaderrun();
        // -vv: every renewal is logged, which the tests time faults by.
        c.args(["--store", &self.url, "--name", "fo", "--wait", "-vv"])
            .args(["--lease", "3s", "--retry", "1s", "--holder", &who, "--"])
            .arg(exe)
            .args(["--exact", "chaos_child", "--ignored", "--nocapture"])
            .args(["--test-threads", "1", "-q"])
            .env("CHAOS_CHILD", spec);
        let p = spawn(c, &self.dir.file(&format!("{who}.log")));
        self.contenders[i].proc = Some(p);
        self.contenders[i].restart_at = None;
    }

    /// Notice exits and restart 300 ms later, for `d`.
    fn idle(&mut self, d: Duration) {
        let until = Instant::now() + d;
        loop {
            for i in 0..self.contenders.len() {
                let exited = match self.contenders[i].proc.as_mut() {
                    Some(p) => p.try_wait().expect("try_wait").map(|st| st.code()),
                    None => None,
                };
                if let Some(code) = exited {
                    self.exits.push((self.who(i), code));
                    self.contenders[i].proc = None;
                    self.contenders[i].restart_at =
                        Some(Instant::now() + Duration::from_millis(300));
                }
                if self.contenders[i]
                    .restart_at
                    .is_some_and(|t| Instant::now() >= t)
                {
                    self.spawn(i);
                }
            }
            if Instant::now() >= until {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stop every contender (as `systemctl stop` would: each releases its
    /// lease), and wait for them to exit.
    fn stop_all(&mut self) {
        for c in self.contenders.iter_mut() {
            c.restart_at = None;
            if let Some(p) = &c.proc {
                signal(p.id(), Signal::SIGTERM);
            }
        }
        for i in 0..self.contenders.len() {
            if let Some(mut p) = self.contenders[i].proc.take() {
                let code = wait_exit(&mut p, Duration::from_secs(15)).code();
                self.exits.push((self.who(i), code));
            }
        }
    }

    /// Stop every contender and collect what the children logged and what
    /// the fence accepted.
    fn finish(&mut self) -> Outcome {
        self.stop_all();
        let runs = checker::parse(&read_or_empty(&self.log));
        for r in &runs {
            assert!(!alive(r.pid), "child {} of {} still runs", r.pid, r.who);
        }
        let accepted = self
            .fence
            .sql("SELECT epoch FROM chaos_accepted ORDER BY id")
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        Outcome { runs, accepted }
    }

    /// Keep the evidence of a failed run: every child's steps, every
    /// contender's log and the members' logs.
    fn keep(&self, what: &str) {
        let keep = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("failover-zk-{}", what.replace(' ', "-")));
        let _ = std::fs::remove_dir_all(&keep);
        let _ = std::fs::create_dir_all(&keep);
        for d in [self.dir.path(), self.zk.dir.path()] {
            for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
                if e.path().is_file() {
                    let _ = std::fs::copy(e.path(), keep.join(e.file_name()));
                }
            }
        }
        eprintln!("{what}: logs kept in {}", keep.display());
    }

    /// Lines of a contender instance's stderr that contain `what`.
    fn count_in_log(&self, who: &str, what: &str) -> usize {
        read_or_empty(&self.dir.file(&format!("{who}.log")))
            .lines()
            .filter(|l| l.contains(what))
            .count()
    }

    /// The renewals a contender instance has logged so far (`-vv`).
    fn renewals(&self, who: &str) -> usize {
        self.count_in_log(who, "DEBUG renewed epoch=")
    }

    /// Keep the contenders going until `who` logs its next renewal: the
    /// moment a fault can be timed from.
    fn until_renewed(&mut self, who: &str) {
        let n = self.renewals(who);
        let t0 = Instant::now();
        while self.renewals(who) == n {
            assert!(
                t0.elapsed() < RENEW + GIVE_UP,
                "{who} logged no renewal: {}",
                read_or_empty(&self.dir.file(&format!("{who}.log")))
            );
            self.idle(Duration::from_millis(5));
        }
    }
}

fn read_or_empty(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// When a member of `ports` next serves as the leader, on the boot clock:
/// polled from a thread of its own (every 20 ms) while the test goes on.
struct LeaderWatch {
    at: Arc<Mutex<Option<u128>>>,
    stop: Arc<AtomicBool>,
}

impl LeaderWatch {
    fn start(ports: Vec<u16>) -> LeaderWatch {
        let at = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (at.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                if ports.iter().any(|&p| mode(p) == "leader") {
                    *a.lock().expect("lock") = Some(boot_ns());
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        LeaderWatch { at, stop }
    }

    fn at(&self) -> Option<u128> {
        self.stop.store(true, Ordering::SeqCst);
        *self.at.lock().expect("lock")
    }
}

/// The longest stretch within `[from, to]` (boot ns) in which no command
/// ran: a command runs from its first logged step to its last (it logs one
/// every 25 ms, or after at most 500 ms when the fence does not answer).
fn longest_gap(runs: &[Run], from: u128, to: u128) -> u128 {
    let mut spans: Vec<(u128, u128)> = runs
        .iter()
        .map(|r| (r.times[0], *r.times.last().expect("a line")))
        .collect();
    spans.sort();
    let (mut covered, mut worst) = (from, 0u128);
    for (s, e) in spans {
        if s > covered && s <= to {
            worst = worst.max(s - covered);
        }
        covered = covered.max(e);
        if covered >= to {
            return worst;
        }
    }
    worst.max(to.saturating_sub(covered))
}

/// The checker's verdict over the whole run: no overlap, no epoch run
/// twice, accepted writes never go back, a command runs within `recovery`
/// of every fault's end; and, no holder being frozen here, every command
/// started at a higher epoch than the one before it.
fn judge(rig: &Rig, what: &str, out: &Outcome, faults: &[Fault], end: u128, recovery: Duration) {
    let limits = Limits {
        thaw: u128::MAX,
        recovery: recovery.as_nanos(),
    };
    let mut report = checker::check(&out.runs, &out.accepted, faults, end, &limits);
    for w in out.runs.windows(2) {
        if w[1].epoch <= w[0].epoch {
            report.violations.push(format!(
                "{} started at epoch {} after {} had run at epoch {}",
                w[1].who, w[1].epoch, w[0].who, w[0].epoch
            ));
        }
    }
    let epochs: Vec<i64> = out.runs.iter().map(|r| r.epoch).collect();
    eprintln!(
        "{what}:\n{}epochs in start order: {epochs:?}",
        report.summary
    );
    if !report.violations.is_empty() {
        rig.keep(what);
    }
    assert!(
        report.violations.is_empty(),
        "{what}: {} violations:\n{}",
        report.violations.len(),
        report.violations.join("\n")
    );
}

fn ms(ns: u128) -> f64 {
    ns as f64 / MS as f64
}

fn ms_of(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Every contender lists a follower first, and that follower hangs
/// (SIGSTOP: a hung VM, a stuck disk) for longer than the lease. The
/// holder's calls start at each member in turn, so it meets the frozen one
/// within three renewals; it moves on to the next member within the same
/// call. Then, with the follower still frozen, every contender is stopped
/// and new ones started: their first call meets the frozen member, and one
/// of them must lead all the same. The frozen member may cost each at most
/// one lease length.
#[test]
fn a_frozen_follower_listed_first_costs_at_most_one_lease() {
    let mut rig = Rig::start();
    let f = rig.zk.follower();
    let url = rig.zk.url(&rig.zk.order(f));
    rig.contend(url, 2);
    rig.idle(Duration::from_millis(1500));
    let start = boot_ns();
    rig.zk.freeze(f, true);
    // Longer than L + P: a holder that cannot renew has lost its lease and
    // a standby that cannot acquire has missed it, well before the thaw.
    let frozen_for = LEASE + RETRY + Duration::from_secs(2);
    rig.idle(frozen_for);
    let held_until = boot_ns();
    let holder = checker::parse(&read_or_empty(&rig.log))[0].who.clone();
    let renewed = rig.renewals(&holder);
    let failed = rig.count_in_log(&holder, "renewal failed");
    let gap = longest_gap(&checker::parse(&read_or_empty(&rig.log)), start, held_until);

    // New contenders, the follower still frozen and listed first.
    rig.stop_all();
    let before = checker::parse(&read_or_empty(&rig.log)).len();
    let restarted = boot_ns();
    for i in 0..rig.contenders.len() {
        rig.spawn(i);
    }
    let new_lead = rig.until_a_command_starts(before, LEASE * 3);
    // The new waiter's watch session starts at the first server listed,
    // the frozen one: its first subscription is abandoned there (after
    // min(R/2, P) = 0.5 s), and the next must go to another member, so by
    // its third poll it is subscribed ("push wake-ups work again"); one
    // poll more for a loaded machine.
    rig.idle(RETRY * 4);
    let runs = checker::parse(&read_or_empty(&rig.log));
    let leader = runs.last().expect("a run").who.clone();
    let index = |who: &str| -> usize { who[1..who.find('g').expect("cNgM")].parse().expect("N") };
    let waiter = rig.who(1 - index(&leader));
    if let Some(p) = &rig.contenders[index(&leader)].proc {
        signal(p.id(), Signal::SIGTERM);
    }
    let handover = rig.until_a_command_starts(runs.len(), LEASE);
    let subscribed = rig.count_in_log(&waiter, "push wake-ups work again");
    // Informational: whether the release itself woke it (a renewal's
    // rewrite of the lease node may have used up the watch: wake.rs).
    let woken = rig.count_in_log(&waiter, "the lease was released; trying now");
    rig.zk.freeze(f, false);
    let heal = boot_ns();
    rig.idle(Duration::from_secs(1));
    let end = boot_ns();
    let out = rig.finish();

    let kept = out.runs.iter().filter(|r| r.times[0] < restarted).count() == 1;
    eprintln!(
        "frozen follower listed first ({:.0} ms): longest time without a running command \
         {:.0} ms (bound L = {:.0} ms); the holder {} its lease ({renewed} renewals, \
         {failed} failed); new contenders on the same URL led {} after they started \
         (bound L = {:.0} ms); the waiter {waiter} {} while the member hung; after their \
         holder's release it led {} later, {}; leaderships {}",
        ms_of(frozen_for),
        ms(gap),
        ms_of(LEASE),
        if kept { "kept" } else { "lost" },
        new_lead.map_or("never".into(), |d| format!("{:.0} ms", ms_of(d))),
        ms_of(LEASE),
        if subscribed > 0 {
            "subscribed to wake-ups"
        } else {
            "never subscribed to wake-ups"
        },
        handover.map_or("never".into(), |d| format!("{:.0} ms", ms_of(d))),
        if woken > 0 {
            "woken by its watch"
        } else {
            "not woken by its watch"
        },
        out.runs.len()
    );
    let faults = [
        Fault {
            kind: "freeze follower listed first",
            frozen: None,
            stopped_after: None,
            start,
            heal: held_until,
        },
        Fault {
            kind: "new contenders, frozen follower listed first",
            frozen: None,
            stopped_after: None,
            start: restarted,
            heal,
        },
    ];
    judge(&rig, "frozen follower", &out, &faults, end, LEASE);
    assert!(
        gap <= LEASE.as_nanos(),
        "{:.0} ms without a command",
        ms(gap)
    );
    assert!(
        new_lead.is_some_and(|d| d <= LEASE),
        "new contenders led after {new_lead:?}"
    );
    assert!(
        subscribed > 0,
        "{waiter} never subscribed to wake-ups: each attempt started at the frozen member"
    );
    assert!(handover.is_some(), "nobody led after the release");
}

/// When, relative to the holder's renewals, the leader member is killed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Moment {
    /// Right after a renewal was answered: G − (a few ms) left to renew.
    AfterRenewal,
    /// 150 ms before the next renewal is due: G − R + 150 ms left.
    BeforeRenewal,
}

/// The ensemble's leader dies (kill -9), listed first by every contender;
/// the two members left elect another. The holder keeps its lease when the
/// election ends before its give-up deadline, or loses it cleanly (stopped
/// by G + K, exit 75) otherwise; either way no two commands overlap, no
/// command runs without the lease, epochs only rise, and someone leads
/// again within election + L + P (a new leader restarts every session's
/// timeout, the lease's too, so a lease its holder lost to the election
/// ends at most a lease, and a tick, after it).
fn leader_killed(moment: Moment) {
    let what = format!("leader killed {moment:?}");
    let mut rig = Rig::start();
    let l = rig.zk.leader();
    let url = rig.zk.url(&rig.zk.order(l));
    rig.contend(url, 2);
    let holder = checker::parse(&read_or_empty(&rig.log))[0].who.clone();
    rig.until_renewed(&holder);
    if moment == Moment::BeforeRenewal {
        rig.idle(RENEW - Duration::from_millis(150));
    }
    let others: Vec<u16> = (0..3)
        .filter(|&i| i != l)
        .map(|i| rig.zk.members[i].port)
        .collect();
    let start = boot_ns();
    rig.zk.kill(l);
    let elected = LeaderWatch::start(others);
    rig.idle(LEASE + RETRY + Duration::from_secs(1));
    let elected = elected.at().map(|t| t.saturating_sub(start));
    rig.zk.restart(l);
    assert!(rig.zk.wait_quorum(Duration::from_secs(30)), "rejoined");
    let heal = boot_ns();
    rig.idle(Duration::from_secs(1));
    let end = boot_ns();
    let exited = rig.exits.clone();
    let out = rig.finish();

    let kept = out.runs.len() == 1 && exited.is_empty();
    let gap = longest_gap(&out.runs, start, end);
    let next = out
        .runs
        .iter()
        .find(|r| r.times[0] >= start)
        .map(|r| ms(r.times[0] - start));
    let first = &out.runs[0];
    let stopped = first.times.last().expect("a line").saturating_sub(start);
    let bound = ELECTION + LEASE + TICK + RETRY;
    eprintln!(
        "{what}: a new leader of the ensemble {} after the kill (bound {:.0} ms); the holder \
         {} its lease{}; longest time without a running command {:.0} ms (bound \
         election + L + tick + P = {:.0} ms); next command started {} after the fault; \
         leaderships {}; exits {exited:?}",
        elected.map_or("never".into(), |t| format!("{:.0} ms", ms(t))),
        ms_of(ELECTION),
        if kept { "kept" } else { "lost" },
        if kept {
            String::new()
        } else {
            format!(
                " (its command stopped {:.0} ms after the fault, bound G + K = {:.0} ms)",
                ms(stopped),
                ms_of(GIVE_UP + KILL_AFTER)
            )
        },
        ms(gap),
        ms_of(bound),
        next.map_or("never".into(), |t| format!("{t:.0} ms")),
        out.runs.len()
    );
    let fault = Fault {
        kind: "kill -9 leader",
        frozen: None,
        stopped_after: None,
        start,
        heal,
    };
    judge(&rig, &what, &out, &[fault], end, bound);
    assert!(gap <= bound.as_nanos(), "{what}: {:.0} ms", ms(gap));
    if !kept {
        // Lost cleanly: stopped by its give-up deadline and exit 75.
        assert!(
            stopped <= (GIVE_UP + KILL_AFTER).as_nanos(),
            "{what}: the holder ran {:.0} ms after the fault",
            ms(stopped)
        );
        assert!(
            exited
                .iter()
                .any(|(who, code)| *who == first.who && *code == Some(75)),
            "{what}: {exited:?}"
        );
    }
}

#[test]
fn a_leader_killed_right_after_a_renewal_hands_over_cleanly() {
    leader_killed(Moment::AfterRenewal);
}

#[test]
fn a_leader_killed_just_before_a_renewal_hands_over_cleanly() {
    leader_killed(Moment::BeforeRenewal);
}

/// Two of three members fail: nothing can be renewed or acquired. The holder
/// must have stopped its command by G + K after the fault (its last
/// renewal was sent before it) and exit 75, nobody may run one while there
/// is no quorum, and leading resumes once the two are back.
fn losing_quorum(frozen: bool) {
    let what = if frozen {
        "quorum lost (two members frozen)"
    } else {
        "quorum lost (two members killed)"
    };
    let mut rig = Rig::start();
    let l = rig.zk.leader();
    let url = rig.zk.url(&rig.zk.order(l));
    rig.contend(url, 2);
    let holder = checker::parse(&read_or_empty(&rig.log))[0].who.clone();
    rig.until_renewed(&holder);
    let f = rig.zk.follower();
    let start = boot_ns();
    if frozen {
        rig.zk.freeze(l, true);
        rig.zk.freeze(f, true);
    } else {
        rig.zk.kill(l);
        rig.zk.kill(f);
    }
    rig.idle(LEASE + RETRY + Duration::from_secs(2));
    let lost = boot_ns();
    let exited = rig.exits.clone();
    if frozen {
        rig.zk.freeze(l, false);
        rig.zk.freeze(f, false);
    } else {
        rig.zk.restart(l);
        rig.zk.restart(f);
    }
    assert!(rig.zk.wait_quorum(Duration::from_secs(30)), "healed");
    let heal = boot_ns();
    let before = checker::parse(&read_or_empty(&rig.log)).len();
    let bound = LEASE + TICK + RETRY + Duration::from_secs(1);
    rig.until_a_command_starts(before, bound + Duration::from_secs(5));
    rig.idle(Duration::from_secs(1));
    let end = boot_ns();
    let out = rig.finish();

    let first = &out.runs[0];
    let stopped = first.times.last().expect("a line").saturating_sub(start);
    // Quorum is back as soon as the first restarted member has joined,
    // which can be before the harness sees both follow (`heal`): a command
    // may rightly start in between. Nothing may start before the restarts
    // begin (`lost`), and leading resumes counted from `heal` (0 when it
    // came before the harness saw it).
    let during: Vec<&Run> = out.runs[1..].iter().filter(|r| r.times[0] < lost).collect();
    let resumed = out
        .runs
        .iter()
        .skip(1)
        .find(|r| r.times[0] >= lost)
        .map(|r| r.times[0].saturating_sub(heal));
    eprintln!(
        "{what} for {:.0} ms: the holder's command stopped {:.0} ms after the fault \
         (bound G + K = {:.0} ms), exits during the outage {exited:?}; a command ran again {} \
         after the quorum was back (bound L + tick + P + 1 s = {:.0} ms: the new leader \
         restarts the lost lease's session); leaderships {}",
        ms(lost - start),
        ms(stopped),
        ms_of(GIVE_UP + KILL_AFTER),
        resumed.map_or("never".into(), |t| format!("{:.0} ms", ms(t))),
        ms_of(bound),
        out.runs.len()
    );
    let fault = Fault {
        kind: if frozen {
            "freeze two members"
        } else {
            "kill -9 two members"
        },
        frozen: None,
        stopped_after: None,
        start,
        heal,
    };
    judge(&rig, what, &out, &[fault], end, bound);
    assert!(
        stopped <= (GIVE_UP + KILL_AFTER).as_nanos(),
        "the holder ran {:.0} ms into the outage",
        ms(stopped)
    );
    assert!(
        exited
            .iter()
            .any(|(who, code)| *who == first.who && *code == Some(75)),
        "the holder did not exit 75 (lost): {exited:?}"
    );
    assert!(
        during.is_empty(),
        "a command started without a quorum: {:?}",
        during.iter().map(|r| &r.who).collect::<Vec<_>>()
    );
    assert!(
        resumed.is_some_and(|t| t <= bound.as_nanos()),
        "leading did not resume within {bound:?}"
    );
}

/// Two of three members die (kill -9), the leader among them, and are
/// restarted on their data.
#[test]
fn losing_quorum_to_killed_members_stops_the_holder_and_leading_resumes_after() {
    losing_quorum(false);
}

/// Two of three members hang (SIGSTOP), the leader among them, and are
/// thawed: the old leader wakes with its view of before (its session table
/// past every timeout) and must neither let a lease be taken twice nor
/// keep the ensemble from leading again.
#[test]
fn losing_quorum_to_frozen_members_stops_the_holder_and_leading_resumes_after() {
    losing_quorum(true);
}
