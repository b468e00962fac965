//! An etcd cluster of three members fails over under two `leaderrun
//! --wait` contenders: a frozen follower listed first, a frozen and a
//! killed leader, a lost and regained quorum, a member removed. Each
//! contender's command is the chaos suite's child (support/chaos_child.rs):
//! it logs its steps on the boot clock and writes to a fenced Postgres
//! table, and the chaos checker (support/checker.rs) counts overlaps and
//! repeated epochs. Every test prints its figures (`--nocapture`).
//!
//! Timing: `--lease 3s` (R = 1 s, G = 2 s, K = 0.5 s), `--retry 1s`, on
//! a cluster with a 500 ms election timeout (support/etcd.rs says why).

use std::process::Child;
use std::time::{Duration, Instant};

use crate::support::chaos_child::{boot_ns, SCHEMA};
use crate::support::checker::{self, Fault, Limits, Run};
use crate::support::etcd::{election_ms, Cluster};
use crate::support::*;
use nix::sys::signal::Signal;

const LEASE: Duration = Duration::from_secs(3);
const GIVE_UP: Duration = Duration::from_secs(2);
const KILL_AFTER: Duration = Duration::from_millis(500);
const RETRY: Duration = Duration::from_secs(1);
const MS: u128 = 1_000_000;

struct Contender {
    gen: u32,
    proc: Option<Child>,
    restart_at: Option<Instant>,
}

/// A cluster, the fenced resource, and contenders restarted (like systemd
/// would) when they exit.
struct Rig {
    cluster: Cluster,
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
        let dir = TempDir::new("failover-etcd");
        Rig {
            cluster: Cluster::start(),
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
    fn contend(&mut self, url: String, n: usize) {
        self.url = url;
        for _ in 0..n {
            self.contenders.push(Contender {
                gen: 0,
                proc: None,
                restart_at: None,
            });
            self.spawn(self.contenders.len() - 1);
        }
        let log = self.log.clone();
        wait_for("a command to run", Duration::from_secs(20), || {
            read(&log).contains(" start")
        });
    }

    fn spawn(&mut self, i: usize) {
        self.contenders[i].gen += 1;
        let who = self.who(i);
        let spec = format!("{}|{}|{who}", self.log.display(), self.fence.url());
        let exe = std::env::current_exe().expect("test binary");
        let mut c = leaderrun();
        c.args(["--store", &self.url, "--name", "fo", "--wait", "-v"])
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

    /// `leaderrun status --name fo` on the contenders' URL: its output and
    /// how long it took.
    fn status(&self) -> (Output, Duration) {
        let mut c = leaderrun();
        c.args(["status", "--store", &self.url, "--name", "fo"]);
        let t0 = Instant::now();
        let out = run(c);
        (out, t0.elapsed())
    }

    /// Stop every contender (as `systemctl stop` would) and collect what
    /// the children logged and what the fence accepted.
    fn finish(&mut self) -> Outcome {
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
        let runs = checker::parse(&read(&self.log));
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
            .join(format!("failover-etcd-{}", what.replace(' ', "-")));
        let _ = std::fs::remove_dir_all(&keep);
        let _ = std::fs::create_dir_all(&keep);
        for d in [self.dir.path(), self.cluster.dir.path()] {
            for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
                let _ = std::fs::copy(e.path(), keep.join(e.file_name()));
            }
        }
        eprintln!("{what}: logs kept in {}", keep.display());
    }

    /// Lines of a contender instance's stderr that contain `what`.
    fn count_in_log(&self, who: &str, what: &str) -> usize {
        read(&self.dir.file(&format!("{who}.log")))
            .lines()
            .filter(|l| l.contains(what))
            .count()
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
/// of every fault's end.
fn judge(rig: &Rig, what: &str, out: &Outcome, faults: &[Fault], end: u128, recovery: Duration) {
    let limits = Limits {
        thaw: u128::MAX,
        recovery: recovery.as_nanos(),
    };
    let report = checker::check(&out.runs, &out.accepted, faults, end, &limits);
    eprintln!("{what}:\n{}", report.summary);
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

/// The operator's report: every contender lists a follower first, and that
/// follower hangs (SIGSTOP: a hung VM, a stuck disk) for longer than the
/// lease. The holder must keep its lease throughout (its renewals go to
/// another member within the same call), and `status` on that URL must
/// answer within its 10 s deadline.
#[test]
fn a_frozen_follower_listed_first_costs_the_holder_nothing() {
    let mut rig = Rig::start();
    let f = rig.cluster.follower();
    let url = rig.cluster.url(&rig.cluster.order(f));
    rig.contend(url, 2);
    rig.idle(Duration::from_millis(1500));
    let start = boot_ns();
    rig.cluster.freeze(f, true);
    // Longer than L + P: a holder that cannot renew has lost its lease and
    // a standby that cannot acquire has missed it, well before the thaw.
    let frozen_for = LEASE + RETRY + Duration::from_secs(2);
    rig.idle(Duration::from_millis(2500));
    let (status, took) = rig.status();
    rig.idle(frozen_for.saturating_sub(Duration::from_millis(2500) + took));
    rig.cluster.freeze(f, false);
    let heal = boot_ns();
    rig.idle(Duration::from_secs(1));
    let end = boot_ns();
    let out = rig.finish();

    let gap = longest_gap(&out.runs, start, end);
    let holder = out.runs[0].who.clone();
    let failed = rig.count_in_log(&holder, "renewal failed");
    eprintln!(
        "frozen follower listed first ({} s): longest time without a running command {:.0} ms \
         (bound L + P = {:.0} ms); failed renewals {failed}; leaderships {}; \
         status answered in {:.0} ms (exit {:?})",
        frozen_for.as_secs(),
        ms(gap),
        (LEASE + RETRY).as_secs_f64() * 1e3,
        out.runs.len(),
        took.as_secs_f64() * 1e3,
        status.code
    );
    let fault = Fault {
        kind: "freeze follower listed first",
        frozen: None,
        stopped_after: None,
        start,
        heal,
    };
    judge(&rig, "frozen follower", &out, &[fault], end, LEASE + RETRY);
    assert_eq!(status.code, Some(0), "status: {}", status.stderr);
    assert!(status.stdout.contains(&holder), "{}", status.stdout);
    assert!(
        status.stdout.contains(
            "replication: Raft, 3 voting members (a write is acknowledged once 2 have it); \
             a failover cannot lose an acknowledged acquisition"
        ),
        "{}",
        status.stdout
    );
    assert!(took < Duration::from_secs(10), "status took {took:?}");
    assert!(gap <= (LEASE + RETRY).as_nanos(), "{:.0} ms", ms(gap));
    assert_eq!(
        out.runs.len(),
        1,
        "the holder lost its lease: {:?}",
        rig.exits
    );
}

/// How the leader member fails in [`leader_fails`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// SIGSTOP for this long, then SIGCONT.
    Freeze(Duration),
    /// kill -9, and a restart (with its data) after L + P + 1 s.
    Kill,
}

/// The leader member hangs, or dies (kill -9), under every contender's
/// first URL entry, 1.2 s after the holder acquired (0.2 s after its first
/// renewal, which that member handled): the cluster elects another within
/// two election timeouts. No command may run without the lease, and
/// leading goes on.
fn leader_fails(failure: Failure) {
    let what = match failure {
        Failure::Kill => "killed leader".to_string(),
        Failure::Freeze(d) => format!("leader frozen for {} ms", d.as_millis()),
    };
    let mut rig = Rig::start();
    let l = rig.cluster.leader();
    let url = rig.cluster.url(&rig.cluster.order(l));
    rig.contend(url, 2);
    rig.idle(Duration::from_millis(1200));
    let start = boot_ns();
    match failure {
        Failure::Kill => {
            rig.cluster.kill(l);
            rig.idle(LEASE + RETRY + Duration::from_secs(1));
            rig.cluster.restart(l);
        }
        Failure::Freeze(d) => {
            rig.cluster.freeze(l, true);
            rig.idle(d);
            rig.cluster.freeze(l, false);
        }
    }
    let heal = boot_ns();
    rig.idle(LEASE + RETRY + Duration::from_secs(1));
    let end = boot_ns();
    // Before they are stopped: a contender that exited on its own lost
    // the lease (exit 75).
    let exited = rig.exits.clone();
    let out = rig.finish();

    let gap = longest_gap(&out.runs, start, end);
    let next = out
        .runs
        .iter()
        .find(|r| r.times[0] >= start)
        .map(|r| ms(r.times[0] - start));
    // The worst a handover can take: two election timeouts to elect a
    // leader, which renews every etcd lease by one more election timeout
    // and the TTL; then etcd's 500 ms expiry sweep and one retry.
    let bound =
        Duration::from_millis(election_ms()) * 3 + LEASE + Duration::from_millis(500) + RETRY;
    eprintln!(
        "{what}: longest time without a running command {:.0} ms (bound {:.0} ms); \
         next command started {} after the fault; leaderships {}",
        ms(gap),
        bound.as_secs_f64() * 1e3,
        next.map_or("never".into(), |t| format!("{t:.0} ms")),
        out.runs.len()
    );
    let fault = Fault {
        kind: if failure == Failure::Kill {
            "kill -9 leader"
        } else {
            "freeze leader"
        },
        frozen: None,
        stopped_after: None,
        start,
        heal,
    };
    judge(&rig, &what, &out, &[fault], end, bound);
    assert!(gap <= bound.as_nanos(), "{what}: {:.0} ms", ms(gap));
    // 0.2 s after a renewal, the holder has G - 0.2 s = 1.8 s before it
    // gives up: room for the slowest election (two election timeouts,
    // 1 s) and a retry every 250 ms after it, through another member.
    if out.runs.len() != 1 || !exited.is_empty() {
        rig.keep(&what);
    }
    assert!(
        out.runs.len() == 1 && exited.is_empty(),
        "{what}: the holder lost its lease: {exited:?}"
    );
}

/// Frozen past the holder's give-up deadline (its last renewal + G = 3 s
/// after it acquired), so that only renewals through the other members
/// keep the lease; thawed at 3.2 s, before its own table would end the
/// lease (its last keepalive + L = 4 s): see the next test for why.
#[test]
fn a_frozen_leader_hands_over_without_overlap() {
    leader_fails(Failure::Freeze(Duration::from_secs(2)));
}

/// Frozen longer than the lease. etcd before 3.4.31 and 3.5.13 lets the
/// old leader, once thawed, revoke the leases that its own table says have
/// run out before it notices it no longer leads, and the new leader
/// applies that: a lease the holder renewed in time through the new leader
/// is deleted early, and a rival takes it while the holder's command still
/// runs until its next renewal (up to R; the fence refuses its writes).
/// No client can prevent that (etcd issue 15247, fixed by etcd PR 16822);
/// seen here on etcd 3.4.23 in 2 runs of 7. So this runs only on request.
#[test]
#[ignore = "fails on etcd before 3.4.31 / 3.5.13 (etcd issue 15247); run with --ignored on a fixed etcd"]
fn a_leader_frozen_longer_than_the_lease_hands_over_without_overlap() {
    leader_fails(Failure::Freeze(LEASE + RETRY + Duration::from_secs(1)));
}

#[test]
fn a_killed_leader_hands_over_without_overlap() {
    leader_fails(Failure::Kill);
}

/// Two of three members die: nothing can be renewed or acquired. The holder
/// must have stopped its command by G + K after the fault (its last
/// renewal was sent before it), nobody may run one while there is no
/// quorum, and leading resumes once the two are back.
#[test]
fn losing_quorum_stops_the_holder_and_leading_resumes_after() {
    let mut rig = Rig::start();
    let l = rig.cluster.leader();
    let url = rig.cluster.url(&rig.cluster.order(l));
    rig.contend(url, 2);
    rig.idle(Duration::from_millis(1500));
    let f = rig.cluster.follower();
    let start = boot_ns();
    rig.cluster.kill(l);
    rig.cluster.kill(f);
    rig.idle(LEASE + RETRY + Duration::from_secs(2));
    let lost = boot_ns();
    rig.cluster.restart(l);
    rig.cluster.restart(f);
    assert!(rig.cluster.wait_healthy(Duration::from_secs(20)), "healed");
    let heal = boot_ns();
    rig.idle(LEASE * 2 + RETRY + Duration::from_secs(1));
    let end = boot_ns();
    let out = rig.finish();

    let holder = &out.runs[0];
    let stopped = holder.times.last().expect("a line").saturating_sub(start);
    // Quorum is back as soon as the first restarted member has joined,
    // which can be well before the harness sees the cluster healthy
    // (`heal`): a command may rightly start in between. Nothing may start
    // before the restarts begin (`lost`), and leading resumes counted from
    // `heal` (0 when it came before the harness saw it).
    let during: Vec<&Run> = out.runs[1..].iter().filter(|r| r.times[0] < lost).collect();
    let resumed = out
        .runs
        .iter()
        .skip(1)
        .find(|r| r.times[0] >= lost)
        .map(|r| r.times[0].saturating_sub(heal));
    let bound =
        Duration::from_millis(election_ms()) * 3 + LEASE + Duration::from_millis(500) + RETRY;
    eprintln!(
        "quorum lost for {:.0} ms: the holder's command stopped {:.0} ms after the fault \
         (bound G + K = {:.0} ms); a command ran again {} after the quorum was back \
         (bound {:.0} ms); leaderships {}",
        ms(lost - start),
        ms(stopped),
        (GIVE_UP + KILL_AFTER).as_secs_f64() * 1e3,
        resumed.map_or("never".into(), |t| format!("{:.0} ms", ms(t))),
        bound.as_secs_f64() * 1e3,
        out.runs.len()
    );
    let fault = Fault {
        kind: "quorum lost",
        frozen: None,
        stopped_after: None,
        start,
        heal,
    };
    judge(&rig, "quorum lost", &out, &[fault], end, bound);
    assert!(
        stopped <= (GIVE_UP + KILL_AFTER).as_nanos(),
        "the holder ran {:.0} ms into the outage",
        ms(stopped)
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

/// `etcdctl member remove` of the member every contender lists first: etcd
/// stops it, its connections break, and the next member answers at once.
#[test]
fn removing_the_member_listed_first_costs_at_most_one_retry() {
    let mut rig = Rig::start();
    let f = rig.cluster.follower();
    let url = rig.cluster.url(&rig.cluster.order(f));
    rig.contend(url, 2);
    rig.idle(Duration::from_millis(1500));
    let start = boot_ns();
    rig.cluster.remove(f);
    let heal = boot_ns();
    rig.idle(LEASE + RETRY);
    let end = boot_ns();
    let out = rig.finish();

    let gap = longest_gap(&out.runs, start, end);
    let holder = out.runs[0].who.clone();
    let failed = rig.count_in_log(&holder, "renewal failed");
    eprintln!(
        "member listed first removed: longest time without a running command {:.0} ms; \
         failed renewals {failed}; leaderships {}",
        ms(gap),
        out.runs.len()
    );
    let fault = Fault {
        kind: "member remove",
        frozen: None,
        stopped_after: None,
        start,
        heal,
    };
    judge(&rig, "member remove", &out, &[fault], end, LEASE + RETRY);
    assert!(failed <= 1, "{failed} failed renewals");
    assert_eq!(out.runs.len(), 1, "the holder lost its lease");
}
