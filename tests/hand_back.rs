//! The lease is handed back whenever the store can take it back: a release
//! that meets a restarted or silent store is retried like a renewal, by
//! leaderrun and by its watchdog, and a lease lost to the store's silence is
//! released once the store answers again. Bounds derive from the configured
//! lease (L), renew (R), give-up (G), kill-after (K) and retry (P).

use std::time::{Duration, Instant};

use crate::support::*;
use nix::sys::signal::Signal;

const SEC: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

/// L = 10 s, R = 1 s, G = 3 s, K = 1 s: the lease outlives a give-up by 6 s,
/// so a waiter that starts long before the lease could have expired shows
/// that it was handed back, not waited out.
const TIMING: [&str; 8] = [
    "--lease",
    "10s",
    "--renew",
    "1s",
    "--give-up",
    "3s",
    "--kill-after",
    "1s",
];

fn standby(pg: &Pg, dir: &TempDir, retry: &str) -> std::process::Child {
    spawn(
        lr(
            &pg.url(),
            "hb",
            &[&TIMING[..], &["--wait", "--retry", retry]].concat(),
            &worker(dir, "b"),
        ),
        &dir.file("b.log"),
    )
}

/// `systemctl stop` right after the database restarted: the release meets
/// the dead connection, is retried at once on a fresh one, and the standby
/// (whose own subscription died with the restart, so it polls every P)
/// leads within P, not a lease later.
#[test]
fn a_clean_stop_after_a_store_restart_hands_over_within_the_retry_interval() {
    let mut pg = Pg::start();
    let dir = TempDir::new("hb-restart");
    let args = [&TIMING[..], &["-v"]].concat();
    let mut a = spawn(
        lr(&pg.url(), "hb", &args, &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let mut b = standby(&pg, &dir, "1s");
    std::thread::sleep(300 * MS);
    assert!(!dir.file("b.pid").exists(), "the standby ran beside A");

    pg.crash();
    pg.boot();
    signal(a.id(), Signal::SIGTERM);
    let st = wait_exit(&mut a, 10 * SEC);
    let t0 = Instant::now();
    let alog = read(&dir.file("a.log"));
    assert_eq!(st.code(), Some(143), "{alog}");
    assert!(alog.contains("INFO released"), "{alog}");
    wait_file(&dir.file("b.pid"), 15 * SEC);
    let took = t0.elapsed();
    eprintln!("standby led {took:?} after the holder's exit\n{alog}");
    // P = 1 s, plus one attempt and its subscription (each bounded by the
    // call cap, 0.5 s); the lease itself had at least L - R = 9 s left.
    assert!(
        took < 2500 * MS,
        "the standby waited {took:?}: the lease was not handed back"
    );
    assert_eq!(read(&dir.file("b.epoch")).trim(), "2");
    signal(b.id(), Signal::SIGTERM);
    wait_exit(&mut b, 5 * SEC);
}

/// The store goes silent: the holder gives up at G and stops its command.
/// The store answers again long before the lease would expire (L = 10 s):
/// the holder hands the lease back then, and the standby, woken by the
/// release, leads at once.
#[test]
fn a_lease_lost_to_a_silent_store_is_handed_back_when_it_answers() {
    let pg = Pg::start();
    let proxy = Proxy::start(pg.port);
    let dir = TempDir::new("hb-silent");
    let args = [&TIMING[..], &["-vv"]].concat();
    let mut a = spawn(
        lr(&pg.url_via(proxy.port), "hb", &args, &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let a_child = pid_in(&dir.file("a.pid"));
    let mut b = standby(&pg, &dir, "5s");
    wait_for("a renewal", 5 * SEC, || {
        read(&dir.file("a.log")).contains("renewed")
    });

    let t0 = Instant::now();
    proxy.blackhole();
    wait_for("A to stop its command", 6 * SEC, || {
        read(&dir.file("a.log")).contains("command stopped")
    });
    assert!(!alive(a_child), "A's command outlived the give-up");
    let stopped = t0.elapsed();
    assert!(
        !dir.file("b.pid").exists(),
        "the standby led while A's command ran"
    );
    proxy.heal();
    let st = wait_exit(&mut a, 10 * SEC);
    wait_file(&dir.file("b.pid"), 15 * SEC);
    let took = t0.elapsed();
    let alog = read(&dir.file("a.log"));
    eprintln!("silent at 0; A stopped at {stopped:?}; B led at {took:?}\n{alog}");
    assert_eq!(st.code(), Some(75), "{alog}");
    assert!(alog.contains("INFO released"), "{alog}");
    // A's last renewal was at most R = 1 s before the silence, so the lease
    // would have lasted until 9 s at the earliest; the standby polls every
    // 5 s, so leading this early can only be the release's wake-up.
    assert!(
        took < stopped + 1500 * MS,
        "the standby led {took:?} after the silence (A stopped at {stopped:?})"
    );
    assert_eq!(read(&dir.file("b.epoch")).trim(), "2");
    signal(b.id(), Signal::SIGTERM);
    wait_exit(&mut b, 5 * SEC);
}

/// `kill -9` of leaderrun while the store is silent: the watchdog stops the
/// command and keeps trying to hand the lease back; when the store answers,
/// the standby leads at once instead of waiting out the lease.
#[test]
fn the_watchdog_keeps_trying_to_hand_back_until_the_store_answers() {
    let pg = Pg::start();
    let proxy = Proxy::start(pg.port);
    let dir = TempDir::new("hb-watchdog");
    let mut a = spawn(
        lr(&pg.url_via(proxy.port), "hb", &TIMING, &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let a_child = pid_in(&dir.file("a.pid"));
    let mut b = standby(&pg, &dir, "5s");
    std::thread::sleep(300 * MS);

    let t0 = Instant::now();
    proxy.blackhole();
    signal(a.id(), Signal::SIGKILL);
    let _ = a.wait();
    wait_for("the watchdog to stop A's command", 2 * SEC, || {
        !alive(a_child)
    });
    // Long enough for several abandoned attempts (one every 0.5 s).
    std::thread::sleep(2 * SEC);
    assert!(!dir.file("b.pid").exists());
    let healed = t0.elapsed();
    proxy.heal();
    wait_file(&dir.file("b.pid"), 15 * SEC);
    let took = t0.elapsed();
    let alog = read(&dir.file("a.log"));
    eprintln!("silent and killed at 0; healed at {healed:?}; B led at {took:?}\n{alog}");
    // The lease had at least L - R = 9 s left; B polls every 5 s.
    assert!(
        took < healed + 1500 * MS,
        "the standby led {took:?} after the kill (store back at {healed:?})\n{alog}"
    );
    assert!(alog.contains("lease released"), "{alog}");
    assert_eq!(read(&dir.file("b.epoch")).trim(), "2");
    signal(b.id(), Signal::SIGTERM);
    wait_exit(&mut b, 5 * SEC);
}
