//! Faults injected for real: a blackholed link, a reset link, a crashed
//! server, `kill -9`, a frozen process group. Bounds are derived from the
//! configured lease (L), renew (R), give-up (G) and kill-after (K).

use std::time::{Duration, Instant};

use crate::support::*;
use nix::sys::signal::Signal;

const SEC: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

fn remaining_ms(pg: &Pg, name: &str) -> u64 {
    pg.sql(&format!(
        "SELECT (extract(epoch FROM expires_at - now()) * 1000)::bigint FROM leader_lease WHERE name = '{name}'"
    ))
    .parse()
    .expect("remaining ms")
}

/// `kill -9` of the holder: its child dies with it, and a waiting rival takes
/// over with a higher epoch once the lease expires — not before.
#[test]
fn killed_holder_is_cleaned_up_by_its_watchdog_and_rival_takes_over_at_once() {
    let pg = Pg::start();
    let dir = TempDir::new("kill9fast");
    // Default timing: waiting out the lease would take 15 s.
    let mut a = spawn(
        lr(&pg.url(), "k", &[], &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let a_child = pid_in(&dir.file("a.pid"));
    let mut b = spawn(
        lr(
            &pg.url(),
            "k",
            &["--wait", "--retry", "100ms"],
            &worker(&dir, "b"),
        ),
        &dir.file("b.log"),
    );
    std::thread::sleep(300 * MS);
    assert!(
        !dir.file("b.pid").exists(),
        "rival ran while the lease was held"
    );
    let t0 = Instant::now();
    signal(a.id(), Signal::SIGKILL);
    let _ = a.wait();
    let died = wait_for("A's child to die with A", 2 * SEC, || !alive(a_child));
    assert!(died < 500 * MS, "child outlived leaderrun by {died:?}");
    wait_file(&dir.file("b.pid"), 10 * SEC);
    let took = t0.elapsed();
    assert_eq!(read(&dir.file("b.epoch")).trim(), "2");
    // The watchdog released at epoch 1 once the child was gone: B leads
    // within its retry interval (plus start-up), far sooner than L - R.
    assert!(took < 1500 * MS, "took over after {took:?}, not at once");
    assert!(
        read(&dir.file("a.log")).contains("lease released"),
        "{}",
        read(&dir.file("a.log"))
    );
    signal(b.id(), Signal::SIGTERM);
    wait_exit(&mut b, 5 * SEC);
}

#[test]
fn killed_holder_and_watchdog_child_dies_and_rival_takes_over_after_expiry() {
    let pg = Pg::start();
    let dir = TempDir::new("kill9");
    let lease = ["--lease", "2s"]; // R = 667 ms
    let mut a = spawn(
        lr(&pg.url(), "k", &lease, &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let a_child = pid_in(&dir.file("a.pid"));
    let mut b = spawn(
        lr(
            &pg.url(),
            "k",
            &[&lease[..], &["--wait", "--retry", "50ms"]].concat(),
            &worker(&dir, "b"),
        ),
        &dir.file("b.log"),
    );
    std::thread::sleep(200 * MS); // let B contend and be refused at least once
    assert!(
        !dir.file("b.pid").exists(),
        "rival ran while the lease was held"
    );

    let t0 = Instant::now();
    kill_holder_and_watchdog(&mut a);
    let died = wait_for("A's child to die with A", 2 * SEC, || !alive(a_child));
    assert!(died < 500 * MS, "child outlived leaderrun by {died:?}");

    wait_file(&dir.file("b.pid"), 10 * SEC);
    let took = t0.elapsed();
    assert_eq!(read(&dir.file("b.epoch")).trim(), "2");
    // Expiry is at most L after A's last renewal, which was at most R before
    // the kill: so B leads after L - R at the earliest, L + P (+ slack) at the latest.
    assert!(
        took >= 2000 * MS - 667 * MS - 50 * MS,
        "took over too early: {took:?}"
    );
    assert!(
        took < 2000 * MS + 50 * MS + 700 * MS,
        "took over too late: {took:?}"
    );
    signal(b.id(), Signal::SIGTERM);
    wait_exit(&mut b, 5 * SEC);
}

/// The store goes silent (connections open, nothing answered). A child that
/// ignores SIGTERM is SIGKILLed, and leaderrun exits 75, before the lease can
/// expire on the store.
#[test]
fn silent_store_kills_a_term_ignoring_child_before_the_lease_expires() {
    let pg = Pg::start();
    let proxy = Proxy::start(pg.port);
    let dir = TempDir::new("blackhole");
    let script = format!("trap '' TERM; {}", worker(&dir, "a"));
    // L = 3 s, R = 1 s, G = 2 s, K = 0.5 s
    let mut a = spawn(
        lr(
            &pg.url_via(proxy.port),
            "bh",
            &["--lease", "3s", "-vv"],
            &script,
        ),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let child = pid_in(&dir.file("a.pid"));
    // Let at least one renewal happen, so the deadline counts from a renewal.
    wait_for("a renewal", 5 * SEC, || {
        read(&dir.file("a.log")).contains("renewed")
    });

    let t0 = Instant::now();
    proxy.blackhole();
    let left = Duration::from_millis(remaining_ms(&pg, "bh")); // the store's view, over a direct link
    let took = wait_for("the child to die", 10 * SEC, || !alive(child));
    // leaderrun then tries to hand the lease back until it would have
    // expired anyway (the store stays silent here), and exits 75.
    let st = wait_exit(&mut a, 10 * SEC);
    let exited = t0.elapsed();
    let log = read(&dir.file("a.log"));
    eprintln!("blackholed at 0; store expiry at {left:?}; child dead at {took:?}; leaderrun exited at {exited:?}\n{log}");
    assert_eq!(st.code(), Some(75), "{log}");
    assert!(took < left, "the child died {took:?} after the blackhole; the store expires the lease after {left:?}\n{log}");
    // ...and it did not give up before G after its last renewal:
    // last renewal sent at (expiry - L), so give-up + kill at expiry - L + G + K.
    assert!(
        took + 100 * MS >= left.saturating_sub(500 * MS),
        "gave up early: {took:?} vs {left:?}"
    );
    assert!(
        exited < left + 500 * MS,
        "leaderrun tried to release past the lease's end: exited at {exited:?}, expiry at {left:?}"
    );
    assert!(log.contains("SIGKILL"), "{log}");
    assert!(log.contains("lost lease bh"), "{log}");
}

/// A holder frozen past its lease (SIGSTOP of its process group and its
/// child's) while a rival takes over: on thaw, its child is stopped at once,
/// well under one renew interval, and it exits 75.
#[test]
fn frozen_holder_stops_its_child_at_once_on_thaw() {
    let pg = Pg::start();
    let dir = TempDir::new("freeze");
    let args = ["--lease", "3s", "-v"]; // R = 1 s
    let mut a = spawn(
        lr(&pg.url(), "fz", &args, &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let a_child = pid_in(&dir.file("a.pid"));
    let mut b = spawn(
        lr(
            &pg.url(),
            "fz",
            &[&args[..], &["--wait", "--retry", "50ms"]].concat(),
            &worker(&dir, "b"),
        ),
        &dir.file("b.log"),
    );

    signal_group(a.id(), Signal::SIGSTOP);
    signal_group(a_child as u32, Signal::SIGSTOP);
    let took = wait_file(&dir.file("b.pid"), 10 * SEC);
    assert!(
        took < 3 * SEC + 500 * MS,
        "rival waited {took:?} for a 3 s lease"
    );
    assert_eq!(read(&dir.file("b.epoch")).trim(), "2");

    let t0 = Instant::now();
    signal_group(a.id(), Signal::SIGCONT);
    signal_group(a_child as u32, Signal::SIGCONT);
    let st = wait_exit(&mut a, 5 * SEC);
    let thaw = t0.elapsed();
    let log = read(&dir.file("a.log"));
    eprintln!(
        "rival led {took:?} after the freeze; thawed holder exited {thaw:?} after SIGCONT\n{log}"
    );
    assert_eq!(st.code(), Some(75), "{log}");
    assert!(
        thaw < 500 * MS,
        "thawed holder took {thaw:?} to stop its child (R = 1 s)\n{log}"
    );
    assert!(!alive(a_child));
    assert!(log.contains("woke up"), "{log}");
    // The rival is untouched and still leads.
    assert!(alive(pid_in(&dir.file("b.pid"))));
    assert!(
        pg.lease_row("fz").ends_with("|2|t"),
        "{}",
        pg.lease_row("fz")
    );
    signal(b.id(), Signal::SIGTERM);
    wait_exit(&mut b, 5 * SEC);
}

/// SIGTERM to a leading leaderrun: the child is told, the lease released, and
/// a waiting contender takes over at once instead of after expiry.
#[test]
fn terminated_leader_releases_for_a_waiting_contender() {
    let pg = Pg::start();
    let dir = TempDir::new("term");
    let told = dir.file("told");
    let a_script = format!(
        "trap 'echo yes > {}; exit 0' TERM; {}",
        told.display(),
        worker(&dir, "a")
    );
    let args = ["--lease", "10s"];
    let mut a = spawn(lr(&pg.url(), "tm", &args, &a_script), &dir.file("a.log"));
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let mut b = spawn(
        lr(
            &pg.url(),
            "tm",
            &[&args[..], &["--wait", "--retry", "50ms"]].concat(),
            &worker(&dir, "b"),
        ),
        &dir.file("b.log"),
    );
    std::thread::sleep(200 * MS);
    assert!(!dir.file("b.pid").exists());

    signal(a.id(), Signal::SIGTERM);
    let st = wait_exit(&mut a, 5 * SEC);
    assert_eq!(
        st.code(),
        Some(0),
        "the child's own status: it trapped TERM and exited 0"
    );
    assert_eq!(read(&told).trim(), "yes");
    let t0 = Instant::now();
    wait_file(&dir.file("b.pid"), 10 * SEC);
    assert!(
        t0.elapsed() < SEC,
        "contender waited {:?}; the lease was not released",
        t0.elapsed()
    );
    assert_eq!(read(&dir.file("b.epoch")).trim(), "2");
    signal(b.id(), Signal::SIGTERM);
    wait_exit(&mut b, 5 * SEC);
}

/// Dropped connections and a crashed-and-restarted server, each shorter than
/// the give-up interval: leaderrun reconnects and keeps leading.
#[test]
fn short_outages_are_ridden_out_by_reconnecting() {
    let mut pg = Pg::start();
    let proxy = Proxy::start(pg.port);
    let dir = TempDir::new("reconnect");
    // L = 4 s, R = 1.33 s, G = 2.67 s; retry every P = 300 ms after a failure.
    let args = ["--lease", "4s", "--retry", "300ms", "-vv"];
    let mut a = spawn(
        lr(&pg.url_via(proxy.port), "rc", &args, &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let child = pid_in(&dir.file("a.pid"));
    for _ in 0..3 {
        proxy.reset();
        std::thread::sleep(1500 * MS);
    }
    let log = read(&dir.file("a.log"));
    assert!(
        log.contains("renewal failed"),
        "resets were not noticed:\n{log}"
    );
    // Crash the server and bring it back on the same port.
    pg.crash();
    pg.boot();
    std::thread::sleep(4 * SEC); // one more full lease after the crash
    let log = read(&dir.file("a.log"));
    assert!(alive(child), "child stopped during a short outage:\n{log}");
    assert!(
        a.try_wait().expect("try_wait").is_none(),
        "leaderrun exited:\n{log}"
    );
    assert!(
        pg.lease_row("rc").ends_with("|1|t"),
        "epoch changed: {}",
        pg.lease_row("rc")
    );
    signal(a.id(), Signal::SIGTERM);
    wait_exit(&mut a, 5 * SEC);
}

/// `kill -9` of leaderrun while its child (a shell) waits for a grandchild:
/// the whole group dies, not just the shell.
#[test]
fn killed_holder_takes_the_childs_own_children_with_it() {
    let pg = Pg::start();
    let dir = TempDir::new("kill9tree");
    let (bg, fg) = (dir.file("bg"), dir.file("fg"));
    let script = format!(
        "sleep 60 & echo $! > {bg}; sh -c 'echo $$ > {fg}.tmp && mv {fg}.tmp {fg}; exec sleep 60'; true",
        bg = bg.display(),
        fg = fg.display()
    );
    let mut a = spawn(lr(&pg.url(), "tree", &[], &script), &dir.file("a.log"));
    wait_file(&fg, 10 * SEC);
    let pids = [pid_in(&bg), pid_in(&fg)];
    assert!(pids.iter().all(|p| alive(*p)));
    signal(a.id(), Signal::SIGKILL);
    let _ = a.wait();
    let took = wait_for("the whole tree to die", 2 * SEC, || {
        pids.iter().all(|p| !alive(*p))
    });
    assert!(
        took < 500 * MS,
        "grandchildren outlived leaderrun by {took:?}"
    );
}
