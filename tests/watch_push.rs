//! `watch --name N` on every store that pushes: an acquisition and a
//! release are each printed on the store's push, not at the next read
//! (`--retry 5s` here, so a line within a second cannot come from a poll).
//! Each latency is measured from the holder's own log line (`-v --log-format
//! json`: the time it logged the acquire's or the release's success) to the
//! moment the test read the watcher's line, on the same host's clock, and
//! printed (`--no-capture`) for the docs' figures. The log line is written
//! just after the store call returns, so a figure may be a little below 0. A waiting contender on
//! ZooKeeper hears of a release after its holder renewed many times (a
//! renewal rewrites the lease node, which fired the watch and used it up).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;

use crate::support::stores::{self, Server};
use crate::support::*;

const SEC: Duration = Duration::from_secs(1);

/// A running `watch --json --name NAME --retry 5s`, each line with the
/// time the test read it.
struct Watch {
    child: Child,
    lines: Receiver<(SystemTime, serde_json::Value)>,
}

impl Watch {
    /// After `leaderrun init`: `watch` creates nothing, and the store is
    /// fresh.
    fn start(url: &str, name: &str, dir: &TempDir) -> Watch {
        let mut init = leaderrun();
        init.args(["init", "--store", url]);
        let res = run(init);
        assert_eq!(res.code, Some(0), "init: {}", res.stderr);
        let mut c = leaderrun();
        c.args(["--store", url, "watch", "--json", "--name", name])
            .args(["--retry", "5s"])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.file("w.log")).expect("log"));
        let mut child = c.spawn().expect("spawn watch");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let at = SystemTime::now();
                let v = serde_json::from_str(&l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
                if tx.send((at, v)).is_err() {
                    break;
                }
            }
        });
        Watch { child, lines }
    }

    fn next(&self, limit: Duration) -> (SystemTime, serde_json::Value) {
        self.lines
            .recv_timeout(limit)
            .unwrap_or_else(|_| panic!("no line from watch within {limit:?}"))
    }

    fn stop(mut self) {
        signal(self.child.id(), Signal::SIGTERM);
        assert_eq!(wait_exit(&mut self.child, 5 * SEC).code(), Some(0));
    }
}

/// When a leaderrun logging `-v --log-format json` to `log` logged `event`
/// (its first such line).
fn logged(log: &Path, event: &str) -> SystemTime {
    wait_until_some(&format!("{event} in {}", log.display()), 10 * SEC, || {
        read(log)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["event"] == event)
            .and_then(|v| humantime::parse_rfc3339(v["time"].as_str()?).ok())
    })
}

/// `later - earlier` in milliseconds, negative when `later` is not.
fn ms(later: SystemTime, earlier: SystemTime) -> f64 {
    match later.duration_since(earlier) {
        Ok(d) => d.as_secs_f64() * 1000.0,
        Err(e) => -e.duration().as_secs_f64() * 1000.0,
    }
}

fn pushed_both_ways(srv: Server, store: &str) {
    let dir = TempDir::new("watch-push");
    let w = Watch::start(&srv.url, "p", &dir);
    let (_, state) = w.next(10 * SEC);
    assert_eq!(state["event"], "state", "{state}");
    assert_eq!(state["live"], false, "{state}");
    let log = dir.file("a.log");
    let script = format!(
        "while [ ! -e {s} ]; do sleep 0.01; done",
        s = dir.file("a.stop").display()
    );
    let mut a = spawn(
        lr(
            &srv.url,
            "p",
            &["-v", "--log-format", "json", "--holder", "a-holder"],
            &script,
        ),
        &log,
    );
    let (seen, line) = w.next(10 * SEC);
    assert_eq!(line["event"], "acquired", "{line}");
    assert_eq!(line["holder"], "a-holder", "{line}");
    let acquired = ms(seen, logged(&log, "acquired"));
    std::fs::write(dir.file("a.stop"), "").expect("stop");
    assert_eq!(
        wait_exit(&mut a, 10 * SEC).code(),
        Some(0),
        "{}",
        read(&log)
    );
    let (seen, line) = w.next(10 * SEC);
    assert_eq!(line["event"], "released", "{line}");
    assert_eq!(line["holder"], "a-holder", "{line}");
    let released = ms(seen, logged(&log, "released"));
    eprintln!(
        "watch push, {store}: acquisition -> line {acquired:.1} ms, release -> line {released:.1} ms"
    );
    for (what, took) in [("acquisition", acquired), ("release", released)] {
        assert!(
            took < 1000.0,
            "the {what} was printed {took:.1} ms after the holder logged it, not on a push: {}",
            read(&dir.file("w.log"))
        );
    }
    w.stop();
}

#[test]
fn acquisition_and_release_are_pushed_embedded() {
    pushed_both_ways(stores::sqlite(), "embedded");
}

#[test]
fn acquisition_and_release_are_pushed_postgres() {
    pushed_both_ways(stores::postgres(), "postgres");
}

#[test]
fn acquisition_and_release_are_pushed_redis() {
    pushed_both_ways(stores::redis(), "redis");
}

#[test]
fn acquisition_and_release_are_pushed_etcd() {
    pushed_both_ways(stores::etcd(), "etcd");
}

#[test]
fn acquisition_and_release_are_pushed_zookeeper() {
    pushed_both_ways(stores::zookeeper(), "zookeeper");
}

/// `--slots 2`, on a store whose subscription names one lease: the
/// watcher follows the second slot too, whose first acquisition is pushed.
fn every_slot_is_followed(srv: Server, store: &str) {
    let dir = TempDir::new("watch-push-slots");
    let w = Watch::start(&srv.url, "s", &dir);
    assert_eq!(w.next(10 * SEC).1["event"], "state");
    let mut holders = Vec::new();
    for tag in ["a", "b"] {
        let log = dir.file(&format!("{tag}.log"));
        let script = format!(
            "while [ ! -e {s} ]; do sleep 0.01; done",
            s = dir.file("stop").display()
        );
        let c = spawn(
            lr(
                &srv.url,
                "s",
                &["-v", "--log-format", "json", "--slots", "2"],
                &script,
            ),
            &log,
        );
        let (seen, line) = w.next(10 * SEC);
        assert_eq!(line["event"], "acquired", "{line}");
        let took = ms(seen, logged(&log, "acquired"));
        eprintln!(
            "watch push, {store}: slot {} acquisition -> line {took:.1} ms",
            line["slot"]
        );
        assert!(
            took < 1000.0,
            "slot {} was printed {took:.1} ms after its acquisition, not on a push: {}",
            line["slot"],
            read(&dir.file("w.log"))
        );
        holders.push(c);
    }
    std::fs::write(dir.file("stop"), "").expect("stop");
    for mut c in holders {
        assert_eq!(wait_exit(&mut c, 10 * SEC).code(), Some(0));
    }
    w.stop();
}

#[test]
fn every_slot_is_followed_redis() {
    every_slot_is_followed(stores::redis(), "redis");
}

#[test]
fn every_slot_is_followed_etcd() {
    every_slot_is_followed(stores::etcd(), "etcd");
}

#[test]
fn every_slot_is_followed_zookeeper() {
    every_slot_is_followed(stores::zookeeper(), "zookeeper");
}

/// A waiter on ZooKeeper with a long `--retry` while the holder renews
/// every 300 ms: each renewal rewrites the lease node, which fires the
/// waiter's one-time watch. Set again each time, the release after many
/// renewals still wakes it; left used up (as it once was), the waiter
/// slept until its next attempt, scheduled for the expiry it had read
/// (about L = 6 s later).
#[test]
fn a_zookeeper_waiter_hears_a_release_after_many_renewals() {
    let srv = stores::zookeeper();
    let dir = TempDir::new("zk-renewals");
    let (a_log, b_log) = (dir.file("a.log"), dir.file("b.log"));
    let script = format!(
        "touch {r}; while [ ! -e {s} ]; do sleep 0.01; done",
        r = dir.file("a.running").display(),
        s = dir.file("a.stop").display()
    );
    let json = ["-v", "--log-format", "json"];
    let mut a = spawn(
        lr(
            &srv.url,
            "z",
            &[&json[..], &["--lease", "6s", "--renew", "300ms"]].concat(),
            &script,
        ),
        &a_log,
    );
    wait_file(&dir.file("a.running"), 10 * SEC);
    let mut b = spawn(
        lr(
            &srv.url,
            "z",
            &[&json[..], &["--lease", "6s", "--wait", "--retry", "30s"]].concat(),
            "true",
        ),
        &b_log,
    );
    logged(&b_log, "waiting");
    // Several renewals, each firing the waiter's watch.
    std::thread::sleep(2 * SEC);
    std::fs::write(dir.file("a.stop"), "").expect("stop");
    assert_eq!(
        wait_exit(&mut a, 10 * SEC).code(),
        Some(0),
        "{}",
        read(&a_log)
    );
    assert_eq!(
        wait_exit(&mut b, 15 * SEC).code(),
        Some(0),
        "{}",
        read(&b_log)
    );
    let took = ms(logged(&b_log, "acquired"), logged(&a_log, "released"));
    eprintln!("zookeeper: a waiter led {took:.1} ms after a release that followed renewals");
    assert!(
        took < 1000.0,
        "the waiter led {took:.1} ms after the release: the push was lost: {}",
        read(&b_log)
    );
}
