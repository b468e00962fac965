//! Handover (issue 10) against real stores: a waiter polling only every
//! 10 s takes over within about a second of a release (push wake-ups), at
//! a frozen or killed holder's expiry (scheduling by the store's clock), and
//! still within `P` when its subscription is cut; `--max-term` hands over to
//! a waiting contender.
//!
//! Bounds are derived from the configured durations and far below the 10 s
//! poll, so each test fails if its feature is removed; the figures
//! themselves come from the benchmark (tests/bench/run.py), not from here.

use std::process::Child;
use std::time::{Duration, Instant};

use crate::support::stores::Server;
use crate::support::*;

const SEC: Duration = Duration::from_secs(1);
/// The waiters' poll: anything that happens well within it is not a poll.
const SLOW_POLL: &str = "10s";

/// A holder whose command exits when `stop` appears.
fn stoppable(dir: &TempDir, tag: &str) -> String {
    format!(
        "touch {r}; while [ ! -e {s} ]; do sleep 0.01; done",
        r = dir.file(&format!("{tag}.running")).display(),
        s = dir.file(&format!("{tag}.stop")).display(),
    )
}

fn log_has(path: &std::path::Path, what: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|s| s.contains(what))
}

/// Start a waiter (`-v`, so its "waiting:" line says it has made its
/// attempts and subscribed) and wait for that line.
fn waiter(srv: &Server, dir: &TempDir, name: &str, extra: &[&str]) -> (Child, std::path::PathBuf) {
    waiter_as(srv, dir, "b", name, extra)
}

fn waiter_as(
    srv: &Server,
    dir: &TempDir,
    tag: &str,
    name: &str,
    extra: &[&str],
) -> (Child, std::path::PathBuf) {
    let log = dir.file(&format!("{tag}.log"));
    let mut args = vec!["-v", "--wait", "--retry", SLOW_POLL];
    args.extend_from_slice(extra);
    let b = spawn(lr(&srv.url, name, &args, &worker(dir, tag)), &log);
    wait_for("the waiter to wait", 10 * SEC, || log_has(&log, "waiting:"));
    (b, log)
}

fn stop_both(mut a: Child, mut b: Child) {
    for c in [&mut a, &mut b] {
        signal(c.id(), nix::sys::signal::Signal::SIGTERM);
        let _ = wait_exit(c, 10 * SEC);
    }
}

/// A graceful release wakes a waiter whose next poll is 10 s away.
fn wakeup(srv: Server) {
    let dir = TempDir::new("wake");
    let mut a = spawn(
        lr(&srv.url, "w", &[], &stoppable(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.running"), 10 * SEC);
    let (b, blog) = waiter(&srv, &dir, "w", &[]);
    std::fs::write(dir.file("a.stop"), "").unwrap();
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(0));
    let released = Instant::now();
    wait_file(&dir.file("b.pid"), 10 * SEC);
    let took = released.elapsed();
    assert!(
        took < 2 * SEC,
        "took over {took:?} after the release, not on a wake-up: {}",
        read(&blog)
    );
    stop_both(a, b);
}

#[test]
fn wakeup_postgres() {
    wakeup(stores::postgres());
}

#[test]
fn wakeup_redis() {
    wakeup(stores::redis());
}

#[test]
fn wakeup_etcd() {
    wakeup(stores::etcd());
}

#[test]
fn wakeup_zookeeper() {
    wakeup(stores::zookeeper());
}

#[test]
fn wakeup_embedded() {
    wakeup(stores::sqlite());
}

/// `kill -9` of the holding leaderrun: its watchdog stops the command and
/// releases, and that release wakes the waiter too (L = 15 s, P = 10 s: no
/// expiry and no poll comes within the bound).
fn watchdog_release(srv: Server) {
    let dir = TempDir::new("wake-wd");
    let mut a = spawn(
        lr(&srv.url, "k", &[], &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    wait_until_some("the watchdog", 10 * SEC, || watchdog_of(a.id()));
    let (b, blog) = waiter(&srv, &dir, "k", &[]);
    let t0 = Instant::now();
    signal(a.id(), nix::sys::signal::Signal::SIGKILL);
    let _ = a.wait();
    wait_file(&dir.file("b.pid"), 10 * SEC);
    assert!(
        t0.elapsed() < 2 * SEC,
        "{:?}: {}",
        t0.elapsed(),
        read(&blog)
    );
    stop_both(a, b);
}

#[test]
fn watchdog_release_wakes_the_waiter_postgres() {
    watchdog_release(stores::postgres());
}

#[test]
fn watchdog_release_wakes_the_waiter_embedded() {
    watchdog_release(stores::sqlite());
}

/// ZooKeeper: the watchdog's release deletes the dead holder's node at its
/// version from a session of its own (the lease's session is leaderrun's).
#[test]
fn watchdog_release_wakes_the_waiter_zookeeper() {
    watchdog_release(stores::zookeeper());
}

/// `leaderrun release` (clear) publishes the wake-up too.
#[test]
fn admin_release_wakes_the_waiter() {
    let srv = stores::sqlite();
    let dir = TempDir::new("wake-admin");
    // A holder whose process is frozen keeps a live row but cannot release.
    let mut a = spawn(lr(&srv.url, "w", &[], "sleep 60"), &dir.file("a.log"));
    wait_for("the holder to lead", 10 * SEC, || {
        let mut c = leaderrun();
        c.args(["--store", &srv.url, "status", "--name", "w"]);
        run(c).code == Some(0)
    });
    let (b, blog) = waiter(&srv, &dir, "w", &[]);
    let mut c = leaderrun();
    c.args(["--store", &srv.url, "release", "--name", "w"]);
    let t0 = Instant::now();
    assert_eq!(run(c).code, Some(0));
    wait_file(&dir.file("b.pid"), 10 * SEC);
    assert!(
        t0.elapsed() < 2 * SEC,
        "{:?}: {}",
        t0.elapsed(),
        read(&blog)
    );
    let _ = a.kill();
    let _ = a.wait();
    stop_both(a, b);
}

/// `--no-push` waits by polling alone: no LISTEN connection is made.
#[test]
fn no_push_makes_no_subscription() {
    let pg = Pg::start();
    let srv = Server {
        url: pg.url(),
        dead_url: None,
        refused_url: None,
        guard: Box::new(()),
    };
    let dir = TempDir::new("nopush");
    let a = spawn(lr(&srv.url, "np", &[], "sleep 60"), &dir.file("a.log"));
    wait_for("the holder to lead", 10 * SEC, || {
        // The table appears with the holder's first connection.
        pg.try_sql("SELECT count(*) FROM leader_lease WHERE holder IS NOT NULL")
            .is_ok_and(|n| n == "1")
    });
    let listening =
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'DO $$%LISTEN leaderrun_released%'";
    let (b, _) = waiter_as(&srv, &dir, "b", "np", &["--no-push"]);
    assert_eq!(pg.sql(listening), "0");
    // The same count sees a waiter that does subscribe.
    let (c, _) = waiter_as(&srv, &dir, "c", "np", &[]);
    assert_eq!(pg.sql(listening), "1");
    let mut c = c;
    signal(c.id(), nix::sys::signal::Signal::SIGTERM);
    let _ = wait_exit(&mut c, 10 * SEC);
    stop_both(a, b);
}

/// A subscription cut while waiting: the waiter still takes over, by polling
/// at its `P` (here 2 s), after a release it was not told about.
fn lost_subscription(srv: &Server, cut: impl FnOnce()) {
    lost_subscription_via(srv, &srv.url, 1, cut)
}

/// The same, with the waiter reaching the store at `waiter_url`, taking
/// over within `polls` polls.
fn lost_subscription_via(srv: &Server, waiter_url: &str, polls: u32, cut: impl FnOnce()) {
    let dir = TempDir::new("cut");
    let mut a = spawn(
        lr(&srv.url, "c", &[], &stoppable(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.running"), 10 * SEC);
    let log = dir.file("b.log");
    let b = spawn(
        lr(
            waiter_url,
            "c",
            &["-vv", "--wait", "--retry", "2s"],
            &worker(&dir, "b"),
        ),
        &log,
    );
    wait_for("the waiter to wait", 10 * SEC, || log_has(&log, "waiting:"));
    cut();
    wait_for("the waiter to notice", 10 * SEC, || {
        log_has(&log, "push_broken") || log_has(&log, "push wake-ups unavailable")
    });
    std::fs::write(dir.file("a.stop"), "").unwrap();
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(0));
    let released = Instant::now();
    wait_file(&dir.file("b.pid"), 10 * SEC);
    // P per poll, plus the time one attempt and its subscription may take.
    assert!(
        released.elapsed() < polls * 2 * SEC + SEC,
        "{:?}: {}",
        released.elapsed(),
        read(&log)
    );
    stop_both(a, b);
}

#[test]
fn lost_subscription_postgres() {
    let pg = Pg::start();
    let srv = Server {
        url: pg.url(),
        dead_url: None,
        refused_url: None,
        guard: Box::new(()),
    };
    lost_subscription(&srv, || {
        pg.sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query LIKE 'DO $$%LISTEN leaderrun_released%'");
    });
}

#[test]
fn lost_subscription_redis() {
    let r = redis::Redis::start();
    let srv = Server {
        url: r.url(),
        dead_url: None,
        refused_url: None,
        guard: Box::new(()),
    };
    lost_subscription(&srv, || {
        r.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    });
}

/// etcd: every connection of the waiter cut (the watch's among them). The
/// call connection goes too, and the etcd store does not resend a request
/// that may have been applied, so the first poll after the cut may fail:
/// two polls.
#[test]
fn lost_subscription_etcd() {
    let e = etcd::Etcd::start();
    let proxy = Proxy::start(e.port);
    let srv = Server {
        url: e.url(),
        dead_url: None,
        refused_url: None,
        guard: Box::new(()),
    };
    let via = format!("etcd://127.0.0.1:{}", proxy.port);
    lost_subscription_via(&srv, &via, 2, || proxy.reset());
}

#[test]
fn lost_subscription_embedded() {
    let srv = stores::sqlite();
    let url = srv.url.clone();
    lost_subscription(&srv, move || {
        let db = url.trim_start_matches("sqlite://");
        std::fs::remove_dir_all(format!("{db}-wake")).unwrap();
    });
}

/// A holder killed with its watchdog (nothing releases): the waiter, polling
/// every 10 s, takes over when the lease expires by the store's clock.
fn at_expiry(srv: Server, lease: Duration, slack: Duration) {
    let dir = TempDir::new("expiry");
    let l = format!("{}ms", lease.as_millis());
    let mut a = spawn(
        lr(&srv.url, "e", &["--lease", &l], &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let (b, blog) = waiter(&srv, &dir, "e", &["--lease", &l]);
    // The last renewal was sent before this instant, so the lease ends
    // within `lease` of it.
    let killed = Instant::now();
    kill_holder_and_watchdog(&mut a);
    wait_file(&dir.file("b.pid"), 15 * SEC);
    let took = killed.elapsed();
    assert!(
        took < lease + slack,
        "took over {took:?} after the holder died, lease {lease:?}: {}",
        read(&blog)
    );
    stop_both(a, b);
}

#[test]
fn takeover_at_expiry_postgres() {
    at_expiry(stores::postgres(), 2 * SEC, SEC);
}

#[test]
fn takeover_at_expiry_redis() {
    at_expiry(stores::redis(), 2 * SEC, SEC);
}

#[test]
fn takeover_at_expiry_embedded() {
    at_expiry(stores::sqlite(), 2 * SEC, SEC);
}

/// etcd's shortest lease is 2 s; its watch fires when the etcd leader
/// deletes the expired lease's key.
#[test]
fn takeover_at_expiry_etcd() {
    at_expiry(stores::etcd(), 3 * SEC, SEC);
}

/// ZooKeeper ends the session, and deletes the lease node, a tick (100 ms
/// here) after its timeout; the watch on the node fires then.
#[test]
fn takeover_at_expiry_zookeeper() {
    at_expiry(stores::zookeeper(), 2 * SEC, SEC);
}

/// `--max-term`: the leader stops its command, releases, and exits 75 only
/// once the waiting contender leads.
fn max_term(srv: Server) {
    let dir = TempDir::new("maxterm");
    let alog = dir.file("a.log");
    let mut a = spawn(
        lr(
            &srv.url,
            "m",
            &["-v", "--lease", "3s", "--max-term", "2s"],
            &worker(&dir, "a"),
        ),
        &alog,
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let started = Instant::now();
    let (b, blog) = waiter(&srv, &dir, "m", &["--lease", "3s"]);
    let st = wait_exit(&mut a, 10 * SEC);
    assert_eq!(st.code(), Some(75), "{}", read(&alog));
    // Sat out until the successor had the lease.
    assert!(
        log_has(&blog, "acquired lease m"),
        "leaderrun exited before the successor led: {}\n{}",
        read(&alog),
        read(&blog)
    );
    wait_file(&dir.file("b.pid"), 10 * SEC);
    assert!(started.elapsed() < 5 * SEC);
    assert!(
        !alive(pid_in(&dir.file("a.pid"))),
        "the first command was stopped"
    );
    let text = read(&alog);
    assert!(
        text.contains("--max-term") && text.contains("leads m now"),
        "{text}"
    );
    assert!(read(&dir.file("b.epoch")).trim() == "2", "{}", read(&blog));
    stop_both(a, b);
}

#[test]
fn max_term_hands_over_postgres() {
    max_term(stores::postgres());
}

#[test]
fn max_term_hands_over_embedded() {
    max_term(stores::sqlite());
}

#[test]
fn max_term_hands_over_zookeeper() {
    max_term(stores::zookeeper());
}

#[test]
fn max_term_is_checked() {
    for (args, want) in [
        (vec!["--max-term", "0s"], "--max-term must be longer than 0"),
        (
            vec!["--max-term", "1m", "--min-hold", "2m"],
            "--min-hold must be shorter than --max-term",
        ),
        (
            vec!["--max-term", "366days"],
            "longer than the maximum of 365 days",
        ),
    ] {
        let mut c = leaderrun();
        c.args(["--name", "x"]).args(&args).args(["--", "true"]);
        let r = run(c);
        assert_eq!(r.code, Some(2), "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(want), "{args:?}: {}", r.stderr);
    }
}
