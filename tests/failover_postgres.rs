//! Postgres across a promotion: a primary, a streaming standby made by
//! `pg_basebackup -R` whose link to the primary runs through a fault proxy,
//! and a third server as the fenced resource. The contenders run the chaos
//! suite's child (support/chaos_child.rs: fenced writes, start and end on
//! the boot clock) and the chaos checker judges the log: overlaps, repeated
//! epochs, accepted writes going back. They name both servers in one URL
//! with `target_session_attrs=read-write`, as an application that follows a
//! promotion does.
//!
//! Timing everywhere: `--lease 3s` (R = 1 s, G = 2 s, K = 0.5 s),
//! `--retry 200ms`.

use std::process::Child;
use std::time::{Duration, Instant};

use crate::support::chaos_child::{boot_ns, SCHEMA};
use crate::support::checker::{self, Limits, Run};
use crate::support::pg::PASSWORD;
use crate::support::*;
use nix::sys::signal::Signal;

const SEC: Duration = Duration::from_secs(1);
const TIMING: [&str; 4] = ["--lease", "3s", "--retry", "200ms"];
const G_MS: u128 = 2000;
const K_MS: u128 = 500;
const MS: u128 = 1_000_000;

struct Cluster {
    primary: Pg,
    standby: Pg,
    /// The standby's link to the primary.
    link: Proxy,
    /// The fenced resource, for tests with contenders.
    fence: Option<Pg>,
    dir: TempDir,
}

impl Cluster {
    /// A primary with the lease table, a standby streaming from it (caught
    /// up), synchronous when `sync`, its clock `clock_ahead` when given; a
    /// fenced resource for contenders.
    fn start(sync: bool, clock_ahead: Option<&str>) -> Cluster {
        let mut c = Cluster::servers(sync, clock_ahead);
        let fence = Pg::start();
        fence.sql(SCHEMA);
        c.fence = Some(fence);
        c
    }

    /// The two servers only.
    fn servers(sync: bool, clock_ahead: Option<&str>) -> Cluster {
        let primary = Pg::start_primary();
        primary.sql(leaderrun::store::postgres::TABLE_SQL);
        let link = Proxy::start(primary.port);
        let standby = Pg::standby_of(&primary, link.port, clock_ahead);
        primary.wait_replayed();
        if sync {
            primary.make_sync();
        }
        Cluster {
            primary,
            standby,
            link,
            fence: None,
            dir: TempDir::new("failover"),
        }
    }

    /// Both servers, the primary first, as libpq names a cluster.
    fn url(&self) -> String {
        format!(
            "postgres://postgres:{PASSWORD}@127.0.0.1:{},127.0.0.1:{}/postgres\
             ?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
            self.primary.port, self.standby.port
        )
    }

    fn fence(&self) -> &Pg {
        self.fence.as_ref().expect("a cluster with a fence")
    }

    fn log(&self) -> std::path::PathBuf {
        self.dir.file("children.log")
    }

    /// `leaderrun --wait` on `url` running the chaos child as `who`.
    fn contender(&self, url: &str, who: &str) -> Child {
        let exe = std::env::current_exe().expect("test binary");
        let mut c = leaderrun();
        c.args(["--store", url, "--name", "job", "--wait"])
            .args(TIMING)
            .args(["-v", "--holder", who, "--"])
            .arg(exe)
            .args(["--exact", "chaos_child", "--ignored", "--nocapture"])
            .args(["--test-threads", "1", "-q"])
            .env(
                "CHAOS_CHILD",
                format!("{}|{}|{who}", self.log().display(), self.fence().url()),
            );
        spawn(c, &self.dir.file(&format!("{who}.log")))
    }

    fn runs(&self) -> Vec<Run> {
        checker::parse(&read(&self.log()))
    }

    /// Wait until `who`'s child has logged its start; its epoch.
    fn started(&self, who: &str) -> i64 {
        let mut epoch = 0;
        wait_for(&format!("{who} to lead"), 15 * SEC, || {
            match self.runs().iter().find(|r| r.who == who) {
                Some(r) => {
                    epoch = r.epoch;
                    true
                }
                None => false,
            }
        });
        epoch
    }

    /// Wait until `who`'s child has made one fenced write that was accepted.
    fn wrote(&self, who: &str) {
        wait_for(&format!("{who} to write"), 15 * SEC, || {
            self.runs().iter().any(|r| r.who == who && r.ok > 0)
        });
    }

    fn accepted(&self) -> Vec<i64> {
        self.fence()
            .sql("SELECT epoch FROM chaos_accepted ORDER BY id")
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for e in std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            out.push_str(&format!(
                "== {}\n{}\n",
                e.file_name().to_string_lossy(),
                read(&e.path())
            ));
        }
        out
    }
}

/// What `leaderrun status` says replication can lose, for `url`.
fn replication(url: &str) -> leaderrun::store::Replication {
    use leaderrun::store::{open, Origin};
    let mut s = open(Some((url, Origin::Flag)), "test", 5 * SEC).expect("url");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(s.replication(5 * SEC))
        .expect("replication")
}

fn stop(c: &mut Child) -> Option<i32> {
    signal(c.id(), Signal::SIGTERM);
    wait_exit(c, 10 * SEC).code()
}

/// What the checker says, with overlaps (expected on asynchronous
/// replication) counted apart from every other violation.
struct Verdict {
    overlaps: Vec<String>,
    others: Vec<String>,
    summary: String,
}

fn judge(c: &Cluster) -> Verdict {
    let runs = c.runs();
    let limits = Limits {
        thaw: 250 * MS,
        recovery: u128::MAX / 4,
    };
    let rep = checker::check(&runs, &c.accepted(), &[], boot_ns(), &limits);
    let (overlaps, others) = rep
        .violations
        .into_iter()
        .partition(|v| v.starts_with("overlap:"));
    Verdict {
        overlaps,
        others,
        summary: rep.summary,
    }
}

/// The epoch every child ran with, in the order they started.
fn epochs(c: &Cluster) -> Vec<(String, i64)> {
    c.runs().iter().map(|r| (r.who.clone(), r.epoch)).collect()
}

/// How long two children ran at once: the sum, in ms.
fn overlap_ms(c: &Cluster) -> f64 {
    let runs = c.runs();
    let mut total = 0u128;
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            let (s1, e1) = (a.times[0], *a.times.last().unwrap_or(&a.times[0]));
            let (s2, e2) = (b.times[0], *b.times.last().unwrap_or(&b.times[0]));
            if s2 <= e1 && s1 <= e2 {
                total += e1.min(e2) - s1.max(s2);
            }
        }
    }
    total as f64 / 1e6
}

/// The lease exists on both servers, free, at epoch 1: a first holder came
/// and went before anything below, and the standby replayed it.
fn first_holder(c: &Cluster) {
    let out = run(lr(&c.url(), "job", &TIMING, "true"));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    c.primary.wait_replayed();
    assert_eq!(c.standby.lease_row("job"), "|1|f");
}

/// Asynchronous replication, the standby cut off; two acquisitions on the
/// primary (epochs 2 and 3) that the standby never sees; the primary dies
/// and the standby is promoted. The next holder's epoch is above both (the
/// timeline's floor), so no epoch repeats and the old holder's writes are
/// refused once the new one wrote. The old holder may still run until its
/// renewal fails on the promoted server (at most G): asynchronous
/// replication cannot stop that, only fencing.
#[test]
fn async_promotion_hands_out_no_epoch_twice() {
    let mut c = Cluster::start(false, None);
    first_holder(&c);
    c.link.blackhole();
    let mut a = c.contender(&c.url(), "a");
    assert_eq!(c.started("a"), 2);
    c.wrote("a");
    // b reaches only the old primary (a host cut off with it): its command
    // runs on until its give-up, beside the next holder.
    let mut b = c.contender(&c.primary.url(), "b");
    std::thread::sleep(Duration::from_millis(300));
    stop(&mut a);
    assert_eq!(c.started("b"), 3, "{}", c.logs());
    c.wrote("b");
    let mut n = c.contender(&c.url(), "n");
    std::thread::sleep(Duration::from_millis(300));
    c.primary.kill();

    let promoted = Instant::now();
    c.standby.promote();
    let epoch = c.started("n");
    c.wrote("n");
    let took = promoted.elapsed();
    let code = wait_exit(&mut b, 10 * SEC).code();
    std::thread::sleep(Duration::from_millis(500));
    stop(&mut n);
    let v = judge(&c);
    let stale: usize = c
        .runs()
        .iter()
        .filter(|r| r.who == "b")
        .map(|r| r.stale)
        .sum();
    eprintln!(
        "async promotion: epochs {:?}; new holder led {:.0} ms after the promotion began; \
         overlap {:.0} ms; the fence refused {stale} of b's writes; b exited {code:?}\n{}",
        epochs(&c),
        took.as_secs_f64() * 1e3,
        overlap_ms(&c),
        v.summary
    );
    assert_eq!(epoch, (1 << 32) + 1, "the first epoch of timeline 2");
    assert!(v.others.is_empty(), "{:?}\n{}", v.others, c.logs());
    assert!(
        overlap_ms(&c) <= (G_MS + K_MS) as f64,
        "the old holder ran on past G + K: {}",
        c.logs()
    );
}

/// The old primary is left running after the standby's promotion (split
/// brain): a holder on each side. Both run, for as long as the old primary
/// lives; the fence refuses the old side's writes once the new side wrote,
/// and no epoch repeats. The old primary is then killed, and its holder
/// stops within G + K.
#[test]
fn split_brain_runs_two_holders_but_the_fence_refuses_the_old_side() {
    let mut c = Cluster::start(false, None);
    first_holder(&c);
    let told = replication(&c.primary.url());
    assert_eq!(told.can_lose_acknowledged, Some(true), "{told:?}");
    assert_eq!(told.detail, "asynchronous, 1 standby");
    c.link.blackhole();
    c.standby.promote();
    // A client that still reaches the old primary, one that reaches the new.
    let mut old = c.contender(&c.primary.url(), "old");
    assert_eq!(c.started("old"), 2);
    c.wrote("old");
    let mut new = c.contender(&c.standby.url(), "new");
    assert_eq!(c.started("new"), (1 << 32) + 1);
    c.wrote("new");
    std::thread::sleep(2 * SEC);
    let killed = Instant::now();
    c.primary.kill();
    let code = wait_exit(&mut old, 10 * SEC).code();
    let old_stopped = killed.elapsed();
    stop(&mut new);
    let v = judge(&c);
    let stale: usize = c
        .runs()
        .iter()
        .filter(|r| r.who == "old")
        .map(|r| r.stale)
        .sum();
    eprintln!(
        "split brain: epochs {:?}; both ran for {:.0} ms; the old side stopped {:.0} ms after \
         its primary died (exit {code:?}); the fence refused {stale} of its writes\n{}",
        epochs(&c),
        overlap_ms(&c),
        old_stopped.as_secs_f64() * 1e3,
        v.summary
    );
    assert!(v.others.is_empty(), "{:?}\n{}", v.others, c.logs());
    assert!(
        stale > 0,
        "the old side's writes were not refused: {}",
        c.logs()
    );
    assert!(
        old_stopped.as_millis() <= G_MS + K_MS + 1000,
        "the old side ran {old_stopped:?} after its store died"
    );
}

/// Synchronous replication, the standby's clock 3 s ahead: the holder's
/// lease, written by the primary's clock, looks expired on the promoted
/// server at once. It is adopted instead (held L more by the new clock),
/// so the next holder starts only after the old one has stopped (at its
/// give-up, since it cannot reach the promoted server).
#[test]
fn sync_promotion_with_the_standby_clock_ahead_has_no_overlap() {
    let mut c = Cluster::start(true, Some("+3s"));
    let skew = c
        .standby
        .sql("SELECT extract(epoch FROM now())::float8")
        .parse::<f64>()
        .expect("a time")
        - std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64();
    assert!(skew > 2.5, "the standby's clock is not ahead: {skew} s");
    // x reaches only the old primary, so it cannot renew on the promoted
    // server (where it would keep the adopted lease): its command runs until
    // its give-up, the longest a rival could overlap with it.
    let mut x = c.contender(&c.primary.url(), "x");
    assert_eq!(c.started("x"), 1);
    c.wrote("x");
    let mut y = c.contender(&c.url(), "y");
    // A renewal or two, synchronously replicated.
    std::thread::sleep(Duration::from_millis(1500));
    c.primary.kill();
    c.standby.promote();
    let epoch = c.started("y");
    c.wrote("y");
    std::thread::sleep(Duration::from_millis(500));
    let code = wait_exit(&mut x, 10 * SEC).code();
    stop(&mut y);
    let v = judge(&c);
    let runs = c.runs();
    let gap = match (
        runs.iter().find(|r| r.who == "x"),
        runs.iter().find(|r| r.who == "y"),
    ) {
        (Some(x), Some(y)) => (y.times[0] as f64 - *x.times.last().unwrap_or(&0) as f64) / 1e6,
        _ => f64::NAN,
    };
    eprintln!(
        "sync, clock +{skew:.1} s: epochs {:?}; overlap {:.0} ms; y started {gap:.0} ms after x \
         ended; x exited {code:?}\n{}",
        epochs(&c),
        overlap_ms(&c),
        v.summary
    );
    assert!(epoch > 1 << 32, "epoch {epoch}");
    assert!(
        v.overlaps.is_empty() && v.others.is_empty(),
        "{:?} {:?}\n{}",
        v.overlaps,
        v.others,
        c.logs()
    );
}

/// A try-once run whose acquiring commit is left waiting for a synchronous
/// standby that cannot answer (its link blackholed), then `interrupt`ed.
/// Nothing may run, and the lease must be free again (with `handed_back`:
/// its holder cleared, not merely expired). Returns leaderrun's exit, its
/// log, and how long after the interruption it exited.
fn interrupted_commit(
    interrupt: &[&str],
    then_cancel: bool,
    handed_back: bool,
) -> (Option<i32>, String, Duration) {
    let c = Cluster::servers(true, None);
    c.link.blackhole();
    let mut p = spawn(
        lr(&c.primary.url(), "job", &TIMING, &worker(&c.dir, "w")),
        &c.dir.file("lr.log"),
    );
    let waiting = "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' \
                   AND application_name LIKE 'leaderrun%'";
    wait_for("the acquire to wait for the standby", 10 * SEC, || {
        !c.primary.sql(waiting).is_empty()
    });
    let t0 = Instant::now();
    for q in interrupt {
        c.primary.sql(q);
    }
    let mut code = None;
    wait_for("leaderrun to exit", 10 * SEC, || {
        // The hand-back waits for the standby too: cancelled the same way.
        if then_cancel {
            let _ = c
                .primary
                .try_sql(&format!("SELECT pg_cancel_backend(pid) FROM ({waiting}) w"));
        }
        match p.try_wait() {
            Ok(Some(st)) => {
                code = st.code();
                true
            }
            _ => false,
        }
    });
    let took = t0.elapsed();
    let log = read(&c.dir.file("lr.log"));
    assert!(
        !c.dir.file("w.pid").exists(),
        "the command ran on a commit the standby never had:\n{log}"
    );
    wait_for("the lease to be free on the primary", 5 * SEC, || {
        let row = c.primary.lease_row("job");
        if handed_back {
            row.starts_with('|')
        } else {
            row.ends_with("|f")
        }
    });
    (code, log, took)
}

#[test]
fn sync_acquire_whose_wait_is_cancelled_runs_nothing() {
    let (code, log, took) = interrupted_commit(
        &["SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"],
        true,
        true,
    );
    eprintln!("cancelled commit wait: exit {code:?} {took:?} after the cancel\n{log}");
    assert_eq!(code, Some(125), "{log}");
    assert!(log.contains("handed it back"), "{log}");
}

#[test]
fn sync_acquire_released_by_emptying_synchronous_standby_names_runs_nothing() {
    let (code, log, took) = interrupted_commit(
        &[
            "ALTER SYSTEM SET synchronous_standby_names = ''",
            "SELECT pg_reload_conf()",
        ],
        false,
        true,
    );
    eprintln!("synchronous_standby_names emptied: exit {code:?} {took:?} after the reload\n{log}");
    assert_eq!(code, Some(125), "{log}");
    assert!(log.contains("switched off"), "{log}");
}

/// `require=sync` refuses to lead without a synchronous standby (naming
/// what is missing, exit 125, nothing started) and leads with one.
#[test]
fn require_sync_leads_only_with_a_synchronous_standby() {
    let alone = Pg::start_primary();
    let dir = TempDir::new("require-sync");
    let ran = dir.file("ran");
    let script = format!("touch {}", ran.display());
    let out = run(lr(
        &format!("{}&require=sync", alone.url()),
        "job",
        &[],
        &script,
    ));
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    assert!(
        out.stderr.contains("synchronous_standby_names is empty"),
        "{}",
        out.stderr
    );
    assert!(!ran.exists());
    let told = replication(&alone.url());
    assert_eq!(told.can_lose_acknowledged, None, "{told:?}");
    assert!(told.detail.contains("no standby connected"), "{told:?}");
    drop(alone);

    let c = Cluster::servers(true, None);
    // A role that may not see pg_stat_replication's details is told which
    // grant it needs.
    c.primary.sql(
        "CREATE ROLE app LOGIN PASSWORD 'apppw'; \
         GRANT SELECT, INSERT, UPDATE ON leader_lease TO app",
    );
    let app = format!(
        "postgres://app:apppw@127.0.0.1:{}/postgres?sslmode=disable&require=sync",
        c.primary.port
    );
    let told = replication(&c.primary.url());
    assert_eq!(told.can_lose_acknowledged, Some(false), "{told:?}");
    assert!(
        told.detail.contains("synchronous, 1 of 1 standby"),
        "{told:?}"
    );
    let told = replication(&app);
    assert_eq!(told.can_lose_acknowledged, None, "{told:?}");
    assert!(told.detail.contains("pg_monitor"), "{told:?}");
    let out = run(lr(&app, "job", &[], &script));
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    assert!(out.stderr.contains("pg_monitor"), "{}", out.stderr);
    assert!(!out.stderr.contains("apppw"), "{}", out.stderr);
    assert!(!ran.exists());
    c.primary.sql("GRANT pg_monitor TO app");
    let out = run(lr(&app, "job", &[], &script));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(ran.exists());
    // And through the host list, the standby named first.
    let both = format!(
        "postgres://postgres:{PASSWORD}@127.0.0.1:{},127.0.0.1:{}/postgres\
         ?sslmode=disable&target_session_attrs=read-write&require=sync",
        c.standby.port, c.primary.port
    );
    let out = run(lr(&both, "job", &[], "true"));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

/// The backend of an acquire waiting for the standby is terminated: Postgres
/// warns ("canceling the wait … terminating connection") and closes the
/// connection, so the reply never arrives whole. Nothing runs; the lease,
/// granted at an epoch leaderrun never learnt, is left to expire.
#[test]
fn sync_acquire_whose_backend_is_terminated_runs_nothing() {
    let (code, log, took) = interrupted_commit(
        &["SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"],
        false,
        false,
    );
    eprintln!("terminated during the commit wait: exit {code:?} {took:?} after\n{log}");
    assert_eq!(code, Some(125), "{log}");
    assert!(log.contains("terminating connection"), "{log}");
}
