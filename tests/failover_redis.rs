//! Redis failovers, end to end: a primary, a replica following it through a
//! fault proxy (support/redis.rs), `leaderrun` holders running the chaos
//! suite's child (each step a fenced write to a throwaway Postgres, logged on
//! the boot clock) and the chaos checker counting overlaps and repeated
//! epochs.
//!
//! Timings: `--lease 2s`, so R = 667 ms, G = 1333 ms, K = 333 ms; a holder
//! whose renewals fail from time `t` has its command stopped by `t + G + K`.

use std::process::Child;
use std::time::{Duration, Instant};

use crate::support::chaos_child::{boot_ns, SCHEMA};
use crate::support::checker::{self, Limits, Report, Run};
use crate::support::redis::{Pair, Redis, PASSWORD};
use crate::support::*;
use nix::sys::signal::Signal;

const MS: u128 = 1_000_000;
const G_MS: u128 = 1333;
const K_MS: u128 = 333;

/// What one test holds: the fenced resource and where the children log.
struct Bench {
    fence: Pg,
    dir: TempDir,
    log: std::path::PathBuf,
}

impl Bench {
    fn new() -> Bench {
        let fence = Pg::start();
        fence.sql(SCHEMA);
        let dir = TempDir::new("failover-redis");
        let log = dir.file("children.log");
        Bench { fence, dir, log }
    }

    /// `leaderrun --store URL … -- chaos_child` as holder `who`, stderr in
    /// `who.log`.
    fn holder(&self, url: &str, who: &str, extra: &[&str]) -> Child {
        let exe = std::env::current_exe().expect("test binary");
        let mut c = leaderrun();
        c.args(["--store", url, "--name", "f", "--lease", "2s"])
            .args(["--retry", "200ms", "-vv", "--holder", who])
            .args(extra)
            .arg("--")
            .arg(exe)
            .args(["--exact", "chaos_child", "--ignored", "--nocapture"])
            .args(["--test-threads", "1", "-q"])
            .env(
                "CHAOS_CHILD",
                format!("{}|{}|{who}", self.log.display(), self.fence.url()),
            );
        spawn(c, &self.dir.file(&format!("{who}.log")))
    }

    fn stderr(&self, who: &str) -> String {
        read(&self.dir.file(&format!("{who}.log")))
    }

    fn runs(&self) -> Vec<Run> {
        checker::parse(&read(&self.log))
    }

    /// Until `who`'s command has had `n` fenced writes accepted.
    /// On a timeout, the panic quotes `who`'s log: what the store said.
    fn wait_writes(&self, who: &str, n: usize) {
        let t0 = Instant::now();
        while self
            .runs()
            .iter()
            .filter(|r| r.who == who)
            .map(|r| r.ok)
            .sum::<usize>()
            < n
        {
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "timed out after 15s waiting for {n} accepted writes by {who}:\n{}",
                self.stderr(who)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn check(&self) -> Report {
        let accepted: Vec<i64> = self
            .fence
            .sql("SELECT epoch FROM chaos_accepted ORDER BY id")
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        let limits = Limits {
            thaw: 250 * MS,
            recovery: 10_000 * MS,
        };
        let rep = checker::check(&self.runs(), &accepted, &[], boot_ns(), &limits);
        eprintln!("{}", rep.summary);
        rep
    }
}

fn the_run(runs: &[Run], who: &str) -> Run {
    runs.iter()
        .find(|r| r.who == who)
        .unwrap_or_else(|| panic!("{who} ran no command: {runs:?}"))
        .clone()
}

/// With the replication link stalled and `replicas=1`, an acquisition is
/// not acknowledged: the command never starts, the lease is handed back at
/// once (the primary shows it free), and the run ends as on a store outage
/// (125). Under `--wait` it is retried until the link heals; the deployment
/// warning is logged once for the whole run, however many attempts it took.
#[test]
fn a_stalled_link_starts_nothing_and_hands_the_lease_back() {
    let p = Pair::start(false);
    let dir = TempDir::new("failover-stalled");
    let url = p.url(1);
    p.link.stall();
    let ran = dir.file("ran");
    let t0 = Instant::now();
    let res = run(lr(
        &url,
        "f",
        &["--lease", "2s"],
        &format!("touch {}", ran.display()),
    ));
    let took = t0.elapsed();
    assert_eq!(res.code, Some(125), "{}", res.stderr);
    assert!(!ran.exists(), "the command started");
    assert!(
        res.stderr.contains("0 of 1 replica") && res.stderr.contains("handed back"),
        "{}",
        res.stderr
    );
    // One attempt, bounded by G.
    eprintln!("stalled link, replicas=1, try-once: exit 125 after {took:?}");
    assert!(took < Duration::from_millis(G_MS as u64 + 1000), "{took:?}");
    assert_eq!(p.primary.cli(&["EXISTS", "{leaderrun:f}:lease"]), "0");
    assert_eq!(p.primary.cli(&["GET", "{leaderrun:f}:epoch"]), "1");

    let mut w = spawn(
        lr(
            &url,
            "f",
            &["--lease", "2s", "--retry", "200ms", "--wait", "-v"],
            &worker(&dir, "w"),
        ),
        &dir.file("w.log"),
    );
    wait_for("a second refused attempt", Duration::from_secs(10), || {
        p.primary
            .cli(&["GET", "{leaderrun:f}:epoch"])
            .parse::<i64>()
            .is_ok_and(|e| e >= 3)
    });
    assert!(!dir.file("w.pid").exists(), "the command started");
    p.link.heal();
    wait_file(&dir.file("w.pid"), Duration::from_secs(10));
    let epoch: i64 = read(&dir.file("w.epoch")).trim().parse().unwrap();
    assert!(epoch >= 3, "{epoch}");
    signal(w.id(), Signal::SIGTERM);
    assert_eq!(wait_exit(&mut w, Duration::from_secs(10)).code(), Some(143));
    let log = read(&dir.file("w.log"));
    assert_eq!(
        log.matches("appendonly no").count(),
        1,
        "the warning, once per run: {log}"
    );
    assert_eq!(
        log.matches("retrying every").count(),
        1,
        "one warning per outage: {log}"
    );
}

/// `replicas=1`, healthy link: runs as usual. Then the link stalls and the
/// replica is promoted, a second holder waiting on it: the first holder's
/// renewals are not acknowledged, so it gives up and its command is stopped
/// by G + K; the second gets a higher epoch (the replica had the first
/// acquisition) once the lease expires there, and the two never overlap.
#[test]
fn with_replicas_a_failover_hands_over_without_overlap() {
    let b = Bench::new();
    let mut p = Pair::start(true);
    // Under --wait: on a loaded machine the replica's first acknowledgement
    // can miss the call's deadline, which rightly fails that acquisition
    // (exit 125 when trying once); the test is about the failover after.
    let mut a = b.holder(&p.url(1), "a", &["--wait"]);
    b.wait_writes("a", 3);
    wait_for("a renewal", Duration::from_secs(5), || {
        b.stderr("a").contains("renewed")
    });
    let stalled = boot_ns();
    p.link.stall();
    p.replica.promote();
    let mut second = b.holder(&p.replica.url(), "b", &["--wait"]);
    let st = wait_exit(&mut a, Duration::from_secs(10));
    assert_eq!(st.code(), Some(75), "{}", b.stderr("a"));
    assert!(
        b.stderr("a").contains("0 of 1 replica"),
        "{}",
        b.stderr("a")
    );
    let first = the_run(&b.runs(), "a");
    let stopped = *first.times.last().expect("a step");
    assert!(
        stopped <= stalled + (G_MS + K_MS) * MS,
        "a's command ran {} ms after the stall; G + K is {} ms",
        (stopped - stalled) / MS,
        G_MS + K_MS
    );
    eprintln!(
        "replicas=1: a's command stopped {} ms after the stall (G + K = {} ms)",
        (stopped - stalled) / MS,
        G_MS + K_MS
    );
    p.primary.crash();
    b.wait_writes("b", 3);
    signal(second.id(), Signal::SIGTERM);
    assert_eq!(
        wait_exit(&mut second, Duration::from_secs(10)).code(),
        Some(143)
    );

    let runs = b.runs();
    let next = the_run(&runs, "b");
    // The replica had a's acquisition, counter included: the next epoch.
    // (a's first attempt may have been handed back unacknowledged, so its
    // run need not be at epoch 1.)
    assert_eq!(next.epoch, first.epoch + 1, "{runs:?}");
    assert!(next.times[0] > stopped, "{runs:?}");
    eprintln!(
        "replicas=1: epochs {} then {}; b started {} ms after a's command stopped",
        first.epoch,
        next.epoch,
        (next.times[0] - stopped) / MS
    );
    let rep = b.check();
    assert!(rep.summary.contains("overlaps: 0"), "{}", rep.summary);
    assert!(rep.violations.is_empty(), "{:?}", rep.violations);
}

/// The same failover without `replicas=`: what docs/stores.md says can
/// happen, asserted as documentation of the limit. The acquisition on the
/// primary never reached the replica, so the promoted replica hands the
/// *same* epoch to a second holder while the first still runs (its primary
/// is alive and renews it); the fence accepts both. The first holder was
/// warned, once, that the deployment can lose acquisitions.
#[test]
fn without_replicas_a_failover_can_run_two_holders_at_one_epoch() {
    let b = Bench::new();
    let mut p = Pair::start(false);
    p.link.stall();
    let mut a = b.holder(&p.primary.url(), "a", &[]);
    b.wait_writes("a", 3);
    let warned = b.stderr("a");
    assert_eq!(warned.matches("appendonly no").count(), 1, "{warned}");
    assert!(warned.contains("min-replicas-to-write"), "{warned}");
    p.replica.promote();
    let mut second = b.holder(&p.replica.url(), "b", &[]);
    b.wait_writes("b", 3);
    assert!(a.try_wait().expect("try_wait").is_none(), "a still leads");
    p.primary.crash();
    assert_eq!(wait_exit(&mut a, Duration::from_secs(10)).code(), Some(75));
    signal(second.id(), Signal::SIGTERM);
    assert_eq!(
        wait_exit(&mut second, Duration::from_secs(10)).code(),
        Some(143)
    );

    let runs = b.runs();
    let (first, next) = (the_run(&runs, "a"), the_run(&runs, "b"));
    assert_eq!((first.epoch, next.epoch), (1, 1), "{runs:?}");
    let both = first
        .times
        .last()
        .copied()
        .unwrap_or(0)
        .min(next.times.last().copied().unwrap_or(0))
        .saturating_sub(next.times[0]);
    eprintln!(
        "no replicas=: both holders at epoch 1, side by side for {} ms",
        both / MS
    );
    let rep = b.check();
    assert!(!rep.summary.contains("overlaps: 0"), "{}", rep.summary);
    assert!(
        rep.violations
            .iter()
            .any(|v| v.contains("two children ran with the same epoch")),
        "{:?}",
        rep.violations
    );
}

/// A primary restarted under a held lease (a new run_id), its data kept by
/// the append-only file: the lease key is still there and still ours, but
/// this server may not have everything it acknowledged, so the holder
/// stops at its first renewal that reaches it.
#[test]
fn a_restarted_primary_stops_the_holder_at_its_next_renewal() {
    let mut r = Redis::start_with(true);
    let dir = TempDir::new("failover-restart");
    // R = 2 s, G = 4 s, K = 1 s: the restart fits well inside G, so a stop
    // before G is the identity check's doing, not a give-up.
    let mut a = spawn(
        lr(&r.url(), "f", &["--lease", "6s", "-v"], &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), Duration::from_secs(10));
    let child = pid_in(&dir.file("a.pid"));
    r.crash();
    r.boot();
    let booted = Instant::now();
    let kept = r.cli(&["GET", "{leaderrun:f}:lease"]);
    assert!(kept.starts_with("1:"), "the AOF kept the lease: {kept}");
    let st = wait_exit(&mut a, Duration::from_secs(10));
    let took = booted.elapsed();
    let log = read(&dir.file("a.log"));
    assert_eq!(st.code(), Some(75), "{log}");
    assert!(!alive(child));
    assert!(log.contains("run_id"), "{log}");
    eprintln!("restarted primary: the holder exited 75 {took:?} after the restart");
    // At its next renewal, within R of the restart, and stopped within K
    // after that: R + K = 3 s, before a give-up could (G = 4 s after the
    // last renewal, which came before the restart).
    assert!(took < Duration::from_millis(2000 + 1000), "{took:?}: {log}");
    assert!(!log.contains(PASSWORD), "{log}");
}
