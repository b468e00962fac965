//! `--once-per`: a firing runs the command unless a run of that name
//! started less than half the period ago by the store's clock; the run
//! record in `status`; the upgrade of a table (or lease file) made before
//! the record existed. The store-generic tests run on a real Postgres
//! (directly and through PgBouncer in both pooling modes), the embedded
//! store, MySQL/MariaDB, Redis, etcd and ZooKeeper (`once_per_on!`, below).

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use crate::support::pgbouncer::{Bouncer, Mode};
use crate::support::stores::{self, Server};
use crate::support::*;

const SEC: Duration = Duration::from_secs(1);
/// The status a skipped firing exits with here (`--conflict-exit-code`),
/// told apart from the command's own 0.
const SKIP: i32 = 3;

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// `leaderrun --store URL status --name NAME --json`.
fn status_json(url: &str, name: &str) -> serde_json::Value {
    let mut c = leaderrun();
    c.args(["--store", url, "status", "--name", name, "--json"]);
    let out = run(c);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    json(&out.stdout)
}

/// A firing of `name` once per `period` whose command appends `line` to
/// `runs`, and sleeps `hold` (so that racers meet a held lease too).
fn firing(url: &str, name: &str, period: &str, runs: &Path, line: &str, hold: &str) -> Child {
    let script = format!("echo {line} >> {}; sleep {hold}", runs.display());
    let mut c = lr(
        url,
        name,
        &[
            "-v",
            "--once-per",
            period,
            "--conflict-exit-code",
            &SKIP.to_string(),
        ],
        &script,
    );
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c.spawn().expect("spawn leaderrun")
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Six firings of one period at once: one runs, five skip with the event
/// that says the period's run is done (not merely "held").
fn six_racing_firings_run_once(url: &str) {
    let dir = TempDir::new("once-race");
    let runs = dir.file("runs");
    let kids: Vec<Child> = (0..6)
        .map(|_| firing(url, "race", "1h", &runs, "ran", "0.3"))
        .collect();
    let outs: Vec<_> = kids
        .into_iter()
        .map(|k| k.wait_with_output().expect("wait"))
        .collect();
    let codes: Vec<_> = outs.iter().map(|o| o.status.code()).collect();
    assert_eq!(lines(&runs), ["ran"], "codes {codes:?}");
    assert_eq!(
        codes.iter().filter(|c| **c == Some(0)).count(),
        1,
        "{codes:?}"
    );
    assert_eq!(
        codes.iter().filter(|c| **c == Some(SKIP)).count(),
        5,
        "{codes:?}"
    );
    for o in outs.iter().filter(|o| o.status.code() == Some(SKIP)) {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("this period's run started"), "{err}");
    }
}

#[test]
fn six_racing_firings_run_once_through_pgbouncer_in_transaction_mode() {
    let pg = Pg::start();
    let b = Bouncer::start(&pg, Mode::Transaction);
    six_racing_firings_run_once(&b.url());
    record_of_a_run(&b.url());
}

#[test]
fn six_racing_firings_run_once_through_pgbouncer_in_session_mode() {
    let pg = Pg::start();
    let b = Bouncer::start(&pg, Mode::Session);
    six_racing_firings_run_once(&b.url());
    record_of_a_run(&b.url());
}

/// One schedule (`--once-per 4s`) fired by three contenders whose clocks
/// disagree and whose cron is late by different amounts: each window's
/// three firings come at offsets spread over most of the half period, in a
/// different order each window. The rule is by the store's clock, so host
/// skew is exactly such an offset. Every window runs the job exactly once.
fn skewed_and_late_firings_run_once_per_window(srv: Server) {
    let url = srv.url;
    let dir = TempDir::new("once-skew");
    let runs = dir.file("runs");
    let period = Duration::from_secs(4);
    let half = period / 2;
    // Offsets within a window: 0, 30 % and 65 % of the half period; the
    // spread (65 %) leaves the store's round trips and process start-up a
    // third of the half period.
    let offsets = [0.0, 0.3, 0.65].map(|f| half.mul_f64(f));
    let windows = 4usize;
    let t0 = Instant::now() + SEC;
    let mut kids = Vec::new();
    let mut schedule: Vec<(Instant, usize)> = (0..windows)
        .flat_map(|w| {
            (0..3).map(move |host| {
                // Each host's lateness rotates from window to window.
                let at = t0 + period * w as u32 + offsets[(host + w) % 3];
                (at, w)
            })
        })
        .collect();
    schedule.sort();
    for (at, w) in schedule {
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        kids.push((
            w,
            firing(&url, "skewed", "4s", &runs, &w.to_string(), "0.1"),
        ));
    }
    let mut skipped = vec![0; windows];
    for (w, k) in kids {
        let o = k.wait_with_output().expect("wait");
        match o.status.code() {
            Some(0) => {}
            Some(SKIP) => skipped[w] += 1,
            c => panic!("{c:?}: {}", String::from_utf8_lossy(&o.stderr)),
        }
    }
    let got = lines(&runs);
    for w in 0..windows {
        let ran = got.iter().filter(|l| **l == w.to_string()).count();
        assert_eq!(ran, 1, "window {w}: {got:?}");
        assert_eq!(skipped[w], 2, "window {w}: {skipped:?}");
    }
    eprintln!(
        "skewed firings: {} firings, {} runs, 0 double runs, 0 missed windows",
        3 * windows,
        got.len()
    );
}

/// A firing less than half a period after the last run's start skips; one
/// past it (by the store's clock, read from the record) runs again. The
/// period is 4 s, the shortest every store keeps (etcd: whole even seconds).
fn a_firing_past_half_the_period_runs_again(srv: Server) {
    let url = srv.url;
    let dir = TempDir::new("once-again");
    let runs = dir.file("runs");
    let fire = || {
        firing(&url, "again", "4s", &runs, "ran", "0")
            .wait_with_output()
            .expect("wait")
    };
    assert_eq!(fire().status.code(), Some(0));
    let o = fire();
    assert_eq!(
        o.status.code(),
        Some(SKIP),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(lines(&runs).len(), 1);
    // Waits on the store's own clock: the record says how long ago the run
    // started.
    wait_for(
        "half the period to pass by the store's clock",
        10 * SEC,
        || {
            status_json(&url, "again")["last_run"]["started_ms_ago"]
                .as_i64()
                .is_some_and(|ms| ms >= 2000)
        },
    );
    // etcd keeps the period as an etcd lease, which its leader expires in
    // a sweep (every 500 ms) and whose record is by this host's clock: a
    // firing just past the half may still find it, for up to a sweep more.
    let mut ran = fire().status.code();
    if url.starts_with("etcd") {
        let t0 = Instant::now();
        while ran == Some(SKIP) && t0.elapsed() < SEC {
            std::thread::sleep(Duration::from_millis(100));
            ran = fire().status.code();
        }
    }
    assert_eq!(ran, Some(0));
    assert_eq!(lines(&runs).len(), 2);
    // Without -v a skip says nothing (a cron mail per host would be noise).
    let out = run(lr(&url, "again", &["--once-per", "4s"], "true"));
    assert_eq!(out.code, Some(0));
    assert_eq!(out.stderr, "");
}

/// The record a run leaves: start, end, holder, epoch, outcome, in
/// `status --json` and in the text.
fn record_of_a_run(url: &str) {
    let out = run(lr(
        url,
        "rec",
        &["--once-per", "1h", "--holder", "h1"],
        "exit 7",
    ));
    assert_eq!(out.code, Some(7), "{}", out.stderr);
    let j = status_json(url, "rec");
    let r = &j["last_run"];
    assert_eq!(r["outcome"], "exit 7", "{j}");
    assert_eq!(r["holder"], "h1", "{j}");
    assert_eq!(r["epoch"], j["epoch"], "{j}");
    let (started, ended) = (r["started_ms_ago"].as_i64(), r["ended_ms_ago"].as_i64());
    assert!(
        started.zip(ended).is_some_and(|(s, e)| s >= e && e >= 0),
        "{j}"
    );
    assert!(
        r["started_at"].as_str().is_some_and(|s| s.ends_with('Z')),
        "{j}"
    );
    assert!(r["ended_at"].is_string(), "{j}");
    let mut c = leaderrun();
    c.args(["--store", url, "status"]);
    let text = run(c).stdout;
    assert!(text.contains("last run of rec: started"), "{text}");
    assert!(text.contains("by h1, epoch"), "{text}");
    assert!(text.contains(": exit 7"), "{text}");
    // A signal is not an exit status.
    let out = run(lr(url, "sig", &["--once-per", "1h"], "kill -USR1 $$"));
    assert_eq!(out.code, Some(128 + 10), "{}", out.stderr);
    assert_eq!(status_json(url, "sig")["last_run"]["outcome"], "signal 10");
}

fn the_record_says_how_a_run_ended(srv: Server) {
    record_of_a_run(&srv.url);
    // A lease without --once-per has no record, and no field for one.
    let out = run(lr(&srv.url, "plain", &[], "true"));
    assert_eq!(out.code, Some(0));
    let j = status_json(&srv.url, "plain");
    assert!(j.get("last_run").is_none(), "{j}");
}

/// A leaderrun killed (with its watchdog) before it could write the end
/// leaves the record without one: no made-up outcome; the text says what
/// became of the lease.
fn a_run_killed_before_its_end_leaves_no_end(srv: Server) {
    let url = srv.url;
    let dir = TempDir::new("once-killed");
    let mut a = spawn(
        lr(
            &url,
            "killed",
            &["--once-per", "1h", "--lease", "2s"],
            &worker(&dir, "a"),
        ),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    kill_holder_and_watchdog(&mut a);
    let worker_pid = pid_in(&dir.file("a.pid"));
    wait_for("the command to die with leaderrun", 5 * SEC, || {
        !alive(worker_pid)
    });
    wait_for("the lease to expire", 10 * SEC, || {
        status_json(&url, "killed")["live"] == false
    });
    let j = status_json(&url, "killed");
    let r = &j["last_run"];
    assert!(r["started_at"].is_string(), "{j}");
    assert_eq!(r["outcome"], serde_json::Value::Null, "{j}");
    assert_eq!(r["ended_at"], serde_json::Value::Null, "{j}");
    let mut c = leaderrun();
    c.args(["--store", &url, "status"]);
    let text = run(c).stdout;
    // Redis and etcd delete an expired lease's key, and ZooKeeper the node
    // of an expired session, and with it the time it ended: the text says
    // no more than it knows.
    let says = if url.starts_with("redis") || url.starts_with("etcd") || url.starts_with("zk") {
        "epoch 1; no end recorded\n"
    } else {
        "no end recorded; lease expired"
    };
    assert!(text.contains(says), "{text}");
}

/// A lease lost to a silent store (a partition: the proxy delivers
/// nothing): the command is stopped at the give-up deadline, and once the
/// store answers again the hand-back writes `lost` into the record.
#[test]
fn a_lost_lease_is_recorded_as_lost() {
    let pg = Pg::start();
    let proxy = crate::support::proxy::Proxy::start(pg.port);
    let url = pg.url_via(proxy.port);
    let dir = TempDir::new("once-lost");
    let stopped = dir.file("stopped");
    let script = format!(
        "trap 'echo > {}; exit 0' TERM; echo $$ > {p}.tmp && mv {p}.tmp {p}; while :; do sleep 0.02; done",
        stopped.display(),
        p = dir.file("a.pid").display()
    );
    let mut a = spawn(
        lr(
            &url,
            "lost",
            &["--once-per", "1h", "--lease", "3s"],
            &script,
        ),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    proxy.blackhole();
    // Stopped at the give-up deadline (2 s after the last renewal was
    // sent); the store answers again while leaderrun still hands the lease
    // back (until 3 s after it).
    let log = dir.file("a.log");
    if wait_for_quietly(&stopped, 10 * SEC).is_none() {
        proxy.heal();
        panic!("the command was not stopped: {}", read(&log));
    }
    proxy.heal();
    let st = wait_exit(&mut a, 10 * SEC);
    assert_eq!(st.code(), Some(75), "{}", read(&log));
    let j = status_json(&pg.url(), "lost");
    assert_eq!(j["last_run"]["outcome"], "lost", "{j}\n{}", read(&log));
    assert_eq!(j["live"], false, "{j}");
}

/// Whether `path` appeared within `limit`.
fn wait_for_quietly(path: &Path, limit: Duration) -> Option<()> {
    let t0 = Instant::now();
    while !path.exists() {
        if t0.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(())
}

/// The table as the release before `--once-per` created it.
const TODAYS_TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS leader_lease (
    name       text PRIMARY KEY,
    holder     text,
    epoch      bigint NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity',
    timeline   bigint
)";

/// Upgrading in place from a table the release before `--once-per` made,
/// used by a role with that release's grants: every other run keeps
/// working untouched; a `--once-per` run exits 125 naming the one
/// statement to run; `init --print` prints it; after `init` (by the owner)
/// the same role runs `--once-per`.
#[test]
fn a_table_made_before_once_per_is_upgraded_by_init() {
    let pg = Pg::start();
    pg.sql(TODAYS_TABLE_SQL);
    pg.sql("CREATE ROLE app LOGIN PASSWORD 'apppw'; GRANT SELECT, INSERT, UPDATE ON leader_lease TO app");
    let app = format!(
        "postgres://app:apppw@127.0.0.1:{}/postgres?sslmode=disable",
        pg.port
    );
    let out = run(lr(&app, "plain", &[], "echo $LEASE_EPOCH"));
    assert_eq!(
        (out.code, out.stdout.trim()),
        (Some(0), "1"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stderr, "");
    let dir = TempDir::new("once-upgrade");
    let ran = dir.file("ran");
    let once = |url: &str| {
        run(lr(
            url,
            "job",
            &["--once-per", "1h"],
            &format!("echo >> {}", ran.display()),
        ))
    };
    let out = once(&app);
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains(leaderrun::store::postgres::UPGRADE_SQL),
        "{}",
        out.stderr
    );
    assert!(!ran.exists(), "the command ran without the rule");
    // Nothing was left half-done: the plain run still works.
    assert_eq!(run(lr(&app, "plain", &[], "true")).code, Some(0));
    let mut print = leaderrun();
    print.args(["init", "--print", "--store", &pg.url()]);
    let out = run(print);
    assert!(
        out.stdout
            .contains("ADD COLUMN IF NOT EXISTS run_started_at"),
        "{}",
        out.stdout
    );
    let mut init = leaderrun();
    init.args(["init", "--store", &pg.url()]);
    let out = run(init);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let out = once(&app);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(lines(&ran).len(), 1);
}

/// The table's owner needs no `init`: the first `--once-per` run adds the
/// columns itself, as a first run creates the table.
#[test]
fn a_once_per_run_as_the_owner_adds_the_columns() {
    let pg = Pg::start();
    pg.sql(TODAYS_TABLE_SQL);
    let out = run(lr(&pg.url(), "job", &["--once-per", "1h"], "true"));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        status_json(&pg.url(), "job")["last_run"]["outcome"],
        "exit 0"
    );
}

/// Bad input is refused before anything runs: exit 2, one line.
#[test]
fn once_per_refusals() {
    let pg = Pg::start();
    let dir = TempDir::new("once-usage");
    let ran = dir.file("ran");
    let script = format!("echo > {}", ran.display());
    // Not started: refused before anything connects.
    let etcd = format!("etcd://127.0.0.1:{}", free_port());
    for (url, extra, says) in [
        (pg.url(), vec!["--once-per", "1s"], "must be at least 2s"),
        (pg.url(), vec!["--once-per", "366d"], "maximum"),
        (
            pg.url(),
            vec!["--once-per", "1h", "--wait"],
            "a standby has no firing",
        ),
        (
            pg.url(),
            vec!["--retry-failed"],
            "--retry-failed needs --once-per",
        ),
        (
            etcd,
            vec!["--once-per", "5s"],
            "on the etcd store must be a multiple of 2s and at least 4s",
        ),
    ] {
        let out = run(lr(&url, "job", &extra, &script));
        assert_eq!(out.code, Some(2), "{extra:?}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{extra:?}: {}", out.stderr);
        assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
        assert!(!ran.exists(), "{extra:?}: the command ran");
    }
}

/// A lock on `name` for `holder` under `--once-per` with this half period.
fn once_lock(url: &str, name: &str, holder: &str, half: Duration) -> leaderrun::store::Lock {
    use leaderrun::store::{open, Origin};
    let mut l = match open(Some((url, Origin::Flag)), "leaderrun-test", 5 * SEC) {
        Ok(s) => s.lock(name, holder),
        Err(e) => panic!("cannot open {url}: {e}"),
    };
    l.once_per(leaderrun::store::Period::new(half));
    l
}

/// What the store answers, call by call: a run whose command never started
/// (handed back as `not started`) leaves the period open; a run that ended
/// closes it, whoever asks, until half the period has passed.
fn a_run_that_never_started_leaves_the_period_open(srv: Server) {
    use leaderrun::store::{Acquired, LeaseLock, Outcome};
    let url = srv.url;
    let (lease, half) = (3 * SEC, Duration::from_secs(1800));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut a = once_lock(&url, "p", "a", half);
        let mut b = once_lock(&url, "p", "b", half);
        assert_eq!(a.take(lease, 5 * SEC).await.unwrap(), Acquired::Taken(1));
        // Held, and this period's: "done", not "held".
        assert!(matches!(
            b.take(lease, 5 * SEC).await.unwrap(),
            Acquired::DoneThisPeriod { .. }
        ));
        a.ending(Outcome::NotStarted);
        assert!(a.release(1, Duration::ZERO, 5 * SEC).await.unwrap());
        assert_eq!(b.take(lease, 5 * SEC).await.unwrap(), Acquired::Taken(2));
        b.ending(Outcome::Exit(0));
        assert!(b.release(2, Duration::ZERO, 5 * SEC).await.unwrap());
        // Free, but this period's run is done.
        match a.take(lease, 5 * SEC).await.unwrap() {
            Acquired::DoneThisPeriod { started_ms_ago } => {
                assert!((0..10_000).contains(&started_ms_ago), "{started_ms_ago}")
            }
            other => panic!("{other:?}"),
        }
        // A plain lock (no --once-per) is not bound by the rule.
        let mut plain = match leaderrun::store::open(
            Some((url.as_str(), leaderrun::store::Origin::Flag)),
            "leaderrun-test",
            5 * SEC,
        ) {
            Ok(s) => s.lock("p", "c"),
            Err(e) => panic!("{e}"),
        };
        assert_eq!(plain.acquire(lease, 5 * SEC).await.unwrap(), Some(3));
    });
    let j = status_json(&url, "p");
    let r = &j["last_run"];
    assert_eq!(
        (&r["holder"], &r["epoch"], &r["outcome"]),
        (&"b".into(), &2.into(), &"exit 0".into()),
        "{j}"
    );
}

/// A lock on `name` for `holder` under `--once-per --retry-failed`.
fn retry_lock(url: &str, name: &str, holder: &str, half: Duration) -> leaderrun::store::Lock {
    let mut l = once_lock(url, name, holder, half);
    l.once_per(leaderrun::store::Period {
        half,
        retry_failed: true,
    });
    l
}

/// `--retry-failed`, call by call: a run in progress is never run beside
/// (held, for a retrying firing too); a failed run's period is taken again
/// by a retrying firing (only: a firing without the flag finds it done); a
/// run that exited 0 is never repeated; a run that never ended (its lease
/// expired without an end) is retried once its lease is gone.
fn a_failed_run_is_retried_and_a_succeeded_one_is_not(srv: Server) {
    use leaderrun::store::{Acquired, LeaseLock, Outcome};
    let url = srv.url;
    let (lease, half) = (2 * SEC, Duration::from_secs(1800));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let t = 5 * SEC;
    rt.block_on(async {
        let mut a = retry_lock(&url, "r", "a", half);
        let mut b = retry_lock(&url, "r", "b", half);
        let mut plain = once_lock(&url, "r", "c", half);
        assert_eq!(a.take(lease, t).await.unwrap(), Acquired::Taken(1));
        // In progress: a retrying firing does not run beside it.
        assert_eq!(b.take(lease, t).await.unwrap(), Acquired::Held);
        a.ending(Outcome::Exit(1));
        assert!(a.release(1, Duration::ZERO, t).await.unwrap());
        // Failed: without the flag the period is done; with it, run again.
        assert!(matches!(
            plain.take(lease, t).await.unwrap(),
            Acquired::DoneThisPeriod { .. }
        ));
        assert_eq!(b.take(lease, t).await.unwrap(), Acquired::Taken(2));
        assert_eq!(a.take(lease, t).await.unwrap(), Acquired::Held);
        b.ending(Outcome::Exit(0));
        assert!(b.release(2, Duration::ZERO, t).await.unwrap());
        // Succeeded: never repeated, with or without the flag.
        for l in [&mut a, &mut plain] {
            assert!(matches!(
                l.take(lease, t).await.unwrap(),
                Acquired::DoneThisPeriod { .. }
            ));
        }
        // Never ended: the holder vanished without a word; its lease
        // expires by the store's clock, and then (only then) it is retried.
        let mut gone = retry_lock(&url, "n", "gone", half);
        assert_eq!(gone.take(lease, t).await.unwrap(), Acquired::Taken(1));
        drop(gone);
        let mut next = retry_lock(&url, "n", "next", half);
        assert_eq!(next.take(lease, t).await.unwrap(), Acquired::Held);
        let t0 = Instant::now();
        let got = loop {
            match next.take(lease, t).await.unwrap() {
                Acquired::Held if t0.elapsed() < 3 * lease => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                other => break other,
            }
        };
        assert_eq!(got, Acquired::Taken(2), "after {:?}", t0.elapsed());
    });
    let j = status_json(&url, "r");
    assert_eq!(j["last_run"]["outcome"], "exit 0", "{j}");
    assert_eq!(j["last_run"]["holder"], "b", "{j}");
}

/// `--retry-failed` from the command line: a failed firing is run again by
/// the next firing of its period that has the flag (not by one without
/// it); once a run exits 0 the period is done. The command fails on its
/// first run and succeeds on its second.
fn retry_failed_from_the_command_line(srv: Server) {
    let url = srv.url;
    let dir = TempDir::new("once-retry");
    let runs = dir.file("runs");
    let script = format!(
        "echo ran >> {r}; test $(wc -l < {r}) -ge 2",
        r = runs.display()
    );
    let fire = |retry: bool| {
        let mut extra = vec!["--once-per", "1h", "--conflict-exit-code", "3"];
        if retry {
            extra.push("--retry-failed");
        }
        run(lr(&url, "cli", &extra, &script))
    };
    assert_eq!(fire(true).code, Some(1));
    let out = fire(false);
    assert_eq!(out.code, Some(SKIP), "{}", out.stderr);
    let out = fire(true);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(lines(&runs).len(), 2);
    let out = fire(true);
    assert_eq!(out.code, Some(SKIP), "{}", out.stderr);
    assert_eq!(lines(&runs).len(), 2);
    assert_eq!(status_json(&url, "cli")["last_run"]["outcome"], "exit 0");
}

/// The store-generic tests, once per store that keeps the rule: a module
/// per store, a function per test over a fresh `Server`
/// (tests/support/stores.rs), as tests/conformance.rs does.
macro_rules! once_per_on {
    ($($store:ident),* $(,)?) => {$(
        mod $store {
            use super::*;
            #[test] fn six_racing_firings_run_once() { super::six_racing_firings_run_once(&stores::$store().url) }
            #[test] fn skewed_and_late_firings_run_once_per_window() { super::skewed_and_late_firings_run_once_per_window(stores::$store()) }
            #[test] fn a_firing_past_half_the_period_runs_again() { super::a_firing_past_half_the_period_runs_again(stores::$store()) }
            #[test] fn the_record_says_how_a_run_ended() { super::the_record_says_how_a_run_ended(stores::$store()) }
            #[test] fn a_run_killed_before_its_end_leaves_no_end() { super::a_run_killed_before_its_end_leaves_no_end(stores::$store()) }
            #[test] fn a_run_that_never_started_leaves_the_period_open() { super::a_run_that_never_started_leaves_the_period_open(stores::$store()) }
        }
    )*};
}

once_per_on!(postgres, sqlite, mysql, redis, etcd, zookeeper);

/// `--retry-failed`'s tests, on the stores that keep it.
macro_rules! retry_failed_on {
    ($($store:ident),* $(,)?) => {$(
        mod $store {
            use super::super::*;
            #[test] fn a_failed_run_is_retried_and_a_succeeded_one_is_not() { super::super::a_failed_run_is_retried_and_a_succeeded_one_is_not(stores::$store()) }
            #[test] fn retry_failed_from_the_command_line() { super::super::retry_failed_from_the_command_line(stores::$store()) }
        }
    )*};
}

mod retry_failed {
    retry_failed_on!(postgres, sqlite, mysql, redis, etcd, zookeeper);
}

/// The lease table as the release before `--once-per` created it on the
/// embedded store, in the store's file and in every lease file.
const LITE_TABLE_BEFORE: &str = "CREATE TABLE IF NOT EXISTS leader_lease (
    name       TEXT PRIMARY KEY,
    holder     TEXT,
    epoch      INTEGER NOT NULL DEFAULT 0,
    expires_at INTEGER NOT NULL DEFAULT 0,
    boot_id    TEXT NOT NULL DEFAULT ''
)";

/// Statements on a SQLite file behind the store's back, as an operator, an
/// older release (or a reboot) would leave it.
fn lite_sql(file: &Path, q: &str) {
    lite_rt().block_on(async {
        use sqlx::Connection;
        let url = format!("sqlite://{}?mode=rwc", file.display());
        let mut c = sqlx::SqliteConnection::connect(&url).await.expect("open");
        sqlx::raw_sql(q).execute(&mut c).await.expect("sql");
    });
}

/// The columns of `file`'s lease table.
fn lite_columns(file: &Path) -> Vec<String> {
    lite_rt().block_on(async {
        use sqlx::Connection;
        let url = format!("sqlite://{}", file.display());
        let mut c = sqlx::SqliteConnection::connect(&url).await.expect("open");
        sqlx::query_scalar("SELECT name FROM pragma_table_info('leader_lease')")
            .fetch_all(&mut c)
            .await
            .expect("sql")
    })
}

fn lite_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Upgrading in place on the embedded store: a store file and a lease file
/// made by the release before `--once-per` (no run record columns). A plain
/// run uses them as they are and adds nothing; then six `--once-per`
/// firings race on the same name: each may be the one to add the columns
/// (inside its write transaction), exactly one runs, none fails, and the
/// epoch goes on rising from the plain run's. `init --print` shows the
/// table with the columns.
#[test]
fn an_embedded_lease_file_made_before_once_per_gets_the_columns() {
    use leaderrun::store::sqlite::{lease_dir, lease_file};
    let dir = TempDir::new("once-lite-upgrade");
    let db = dir.file("leases.db");
    let url = format!("sqlite://{}", db.display());
    lite_sql(&db, LITE_TABLE_BEFORE);
    std::fs::create_dir_all(lease_dir(&db)).expect("lease dir");
    let file = lease_file(&db, "job").expect("a file name");
    lite_sql(&file, LITE_TABLE_BEFORE);
    let before = lite_columns(&file);
    assert!(!before.iter().any(|c| c.starts_with("run_")), "{before:?}");

    let out = run(lr(&url, "job", &[], "echo $LEASE_EPOCH"));
    assert_eq!(
        (out.code, out.stdout.trim()),
        (Some(0), "1"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stderr, "");
    assert_eq!(lite_columns(&file), before, "a plain run added columns");
    assert!(status_json(&url, "job").get("last_run").is_none());

    let runs = dir.file("runs");
    let kids: Vec<Child> = (0..6)
        .map(|_| firing(&url, "job", "1h", &runs, "$LEASE_EPOCH", "0.3"))
        .collect();
    let outs: Vec<_> = kids
        .into_iter()
        .map(|k| k.wait_with_output().expect("wait"))
        .collect();
    let codes: Vec<_> = outs.iter().map(|o| o.status.code()).collect();
    let errs: Vec<_> = outs
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .collect();
    assert_eq!(lines(&runs), ["2"], "{codes:?} {errs:?}");
    assert_eq!(
        codes.iter().filter(|c| **c == Some(SKIP)).count(),
        5,
        "{codes:?} {errs:?}"
    );
    let after = lite_columns(&file);
    for c in [
        "run_started_at",
        "run_boot_id",
        "run_started_wall",
        "run_ended_at",
        "run_ended_wall",
        "run_holder",
        "run_epoch",
        "run_outcome",
    ] {
        assert_eq!(after.iter().filter(|a| *a == c).count(), 1, "{after:?}");
    }
    let j = status_json(&url, "job");
    assert_eq!(j["last_run"]["outcome"], "exit 0", "{j}");
    assert_eq!(j["last_run"]["epoch"], 2, "{j}");
    // A plain run afterwards still works, and the epoch keeps rising.
    let out = run(lr(&url, "job", &[], "echo $LEASE_EPOCH"));
    assert_eq!(
        (out.code, out.stdout.trim()),
        (Some(0), "3"),
        "{}",
        out.stderr
    );

    let mut print = leaderrun();
    print.args(["init", "--print", "--store", &url]);
    let out = run(print);
    assert!(out.stdout.contains("run_started_at"), "{}", out.stdout);
    assert!(out.stdout.contains("run_boot_id"), "{}", out.stdout);
}

/// The reboot rule, without a reboot: a record whose start is of another
/// boot (its boot id is not this one's) has no age by this boot's clock,
/// and counts as started long ago: the period is open. The same record
/// with this boot's id closes it. `status` shows such a record by the wall
/// clock written beside it, and never younger than this boot.
#[test]
fn a_run_of_another_boot_leaves_the_period_open() {
    use leaderrun::store::sqlite::lease_file;
    use leaderrun::store::{Acquired, LeaseLock, Outcome};
    let dir = TempDir::new("once-lite-boot");
    let db = dir.file("leases.db");
    let url = format!("sqlite://{}", db.display());
    let file = lease_file(&db, "r").expect("a file name");
    let (lease, half) = (3 * SEC, Duration::from_secs(1800));
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
    let rt = lite_rt();
    rt.block_on(async {
        let mut a = once_lock(&url, "r", "a", half);
        assert_eq!(a.take(lease, 5 * SEC).await.unwrap(), Acquired::Taken(1));
        a.ending(Outcome::Exit(0));
        assert!(a.release(1, Duration::ZERO, 5 * SEC).await.unwrap());
        assert!(matches!(
            a.take(lease, 5 * SEC).await.unwrap(),
            Acquired::DoneThisPeriod { .. }
        ));
    });
    // As the previous boot would have left it: another boot id, the wall
    // clock at the start an hour ago.
    lite_sql(
        &file,
        "UPDATE leader_lease SET run_boot_id = '00000000-0000-0000-0000-000000000000',
                run_started_wall = CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) - 3600000,
                run_ended_wall = CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) - 3500000",
    );
    let j = status_json(&url, "r");
    let r = &j["last_run"];
    assert!(
        r["started_ms_ago"]
            .as_i64()
            .is_some_and(|ms| ms >= 3_599_000),
        "{j}"
    );
    assert!(
        r["ended_ms_ago"].as_i64().is_some_and(|ms| ms >= 3_499_000),
        "{j}"
    );
    assert_eq!(r["outcome"], "exit 0", "{j}");
    rt.block_on(async {
        let mut b = once_lock(&url, "r", "b", half);
        assert_eq!(b.take(lease, 5 * SEC).await.unwrap(), Acquired::Taken(2));
        b.ending(Outcome::Exit(0));
        assert!(b.release(2, Duration::ZERO, 5 * SEC).await.unwrap());
    });
    // The same rows with this boot's id: the period is closed again.
    lite_sql(
        &file,
        &format!("UPDATE leader_lease SET run_boot_id = '{}'", boot.trim()),
    );
    rt.block_on(async {
        let mut c = once_lock(&url, "r", "c", half);
        assert!(matches!(
            c.take(lease, 5 * SEC).await.unwrap(),
            Acquired::DoneThisPeriod { .. }
        ));
    });
}

/// A lease lost on the embedded store (no partition to make there:
/// leaderrun itself stopped past its give-up deadline, while its watchdog
/// stops the command): leaderrun, continued, finds its deadline passed and
/// hands the lease back at its epoch, writing `lost` into the record.
#[test]
fn a_lost_lease_on_the_embedded_store_is_recorded_as_lost() {
    use nix::sys::signal::Signal;
    let srv = stores::sqlite();
    let url = srv.url.clone();
    let dir = TempDir::new("once-lite-lost");
    let stopped = dir.file("stopped");
    let script = format!(
        "trap 'echo > {}; exit 0' TERM; echo $$ > {p}.tmp && mv {p}.tmp {p}; while :; do sleep 0.02; done",
        stopped.display(),
        p = dir.file("a.pid").display()
    );
    let log = dir.file("a.log");
    let mut a = spawn(
        lr(
            &url,
            "lost",
            &["--once-per", "1h", "--lease", "3s", "-vv"],
            &script,
        ),
        &log,
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    // Stopped just after a renewal, so not inside one (holding the file's
    // write lock, it would be ended by its watchdog instead).
    wait_for("a renewal", 10 * SEC, || read(&log).contains("renewed"));
    std::thread::sleep(Duration::from_millis(100));
    signal(a.id(), Signal::SIGSTOP);
    if wait_for_quietly(&stopped, 10 * SEC).is_none() {
        signal(a.id(), Signal::SIGCONT);
        panic!("the command was not stopped: {}", read(&log));
    }
    signal(a.id(), Signal::SIGCONT);
    let st = wait_exit(&mut a, 10 * SEC);
    assert_eq!(st.code(), Some(75), "{}", read(&log));
    let j = status_json(&url, "lost");
    assert_eq!(j["last_run"]["outcome"], "lost", "{j}\n{}", read(&log));
    assert!(j["last_run"]["ended_at"].is_string(), "{j}");
}

/// Run record columns holding what no leaderrun writes (text, a REAL, a
/// huge integer, as a hand-edited or corrupted row may): `status` still
/// shows the lease and a record, clamped; a `--once-per` firing refuses to
/// decide on a start it cannot read, or one years ahead of the boot clock
/// (exit 125, one line, the command not run), and decides as ever on a
/// record whose other columns are odd.
#[test]
fn embedded_run_records_written_by_hand_still_read() {
    use leaderrun::store::sqlite::lease_file;
    let dir = TempDir::new("once-lite-hostile");
    let db = dir.file("leases.db");
    let url = format!("sqlite://{}", db.display());
    let out = run(lr(&url, "h", &["--once-per", "1h"], "true"));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let file = lease_file(&db, "h").expect("a file name");
    let ran = dir.file("ran");
    let script = format!("echo >> {}", ran.display());
    for (set, codes) in [
        (
            "run_started_at = 'soon', run_started_wall = 'then', run_ended_at = 1e300, run_ended_wall = -9223372036854775808, run_epoch = 'x'",
            &[125][..],
        ),
        (
            "run_started_at = 9223372036854775807, run_started_wall = 9223372036854775807, run_ended_at = -1e300, run_ended_wall = 'x'",
            &[125],
        ),
        (
            "run_started_at = 1, run_ended_at = 1e300, run_ended_wall = 'x', run_epoch = 'x', run_holder = 7",
            &[0, 3],
        ),
    ] {
        lite_sql(&file, &format!("UPDATE leader_lease SET {set}"));
        let j = status_json(&url, "h");
        assert!(j["last_run"]["started_ms_ago"].is_i64(), "{set}: {j}");
        let mut c = leaderrun();
        c.args(["--store", &url, "status"]);
        let out = run(c);
        assert_eq!(out.code, Some(0), "{set}: {}", out.stderr);
        assert!(out.stdout.contains("last run of h"), "{set}: {}", out.stdout);
        let _ = std::fs::remove_file(&ran);
        let out = run(lr(&url, "h", &["--once-per", "1h", "--conflict-exit-code", "3"], &script));
        assert!(out.code.is_some_and(|c| codes.contains(&c)), "{set}: {:?} {}", out.code, out.stderr);
        if out.code == Some(125) {
            assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
            assert!(out.stderr.contains("run record"), "{}", out.stderr);
            assert!(!ran.exists(), "{set}: the command ran");
        }
    }
}
