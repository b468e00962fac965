//! `leaderrun watch`: the current state first, then a line per change; a
//! release is printed on the store's push (the watcher reads only every
//! 10 s here, so a line within the bound cannot come from a poll); SIGINT,
//! SIGTERM and a closed stdout end it with 0; a bad interval is refused.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::stores::{self, Server};
use crate::support::*;

const SEC: Duration = Duration::from_secs(1);

/// A running `watch --json`, its lines parsed as they arrive.
struct Watcher {
    child: Child,
    lines: Receiver<serde_json::Value>,
}

impl Watcher {
    fn start(url: &str, args: &[&str], log: &std::path::Path) -> Watcher {
        let mut c = leaderrun();
        c.args(["--store", url, "watch", "--json"]).args(args);
        c.stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).expect("log"));
        let mut child = c.spawn().expect("spawn watch");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let v = serde_json::from_str(&l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Watcher { child, lines }
    }

    fn next(&self, limit: Duration) -> serde_json::Value {
        self.lines
            .recv_timeout(limit)
            .unwrap_or_else(|_| panic!("no line from watch within {limit:?}"))
    }
}

/// A holder whose command runs until `stop` appears.
fn holder(srv: &Server, dir: &TempDir, name: &str) -> Child {
    let script = format!(
        "touch {r}; while [ ! -e {s} ]; do sleep 0.01; done",
        r = dir.file("a.running").display(),
        s = dir.file("a.stop").display(),
    );
    let c = spawn(
        lr(&srv.url, name, &["--holder", "a-holder"], &script),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.running"), 10 * SEC);
    c
}

/// State first, then the release on the push: with reads 10 s apart, the
/// line comes within a second of the holder's exit or the push is broken.
fn release_is_pushed(srv: Server) {
    let dir = TempDir::new("watch");
    let mut a = holder(&srv, &dir, "w");
    let w = Watcher::start(
        &srv.url,
        &["--name", "w", "--retry", "10s"],
        &dir.file("w.log"),
    );
    let state = w.next(10 * SEC);
    assert_eq!(state["event"], "state", "{state}");
    assert_eq!(state["holder"], "a-holder", "{state}");
    assert_eq!(state["live"], true, "{state}");
    let epoch = state["epoch"].as_i64().expect("epoch");
    assert!(epoch >= 1, "{state}");
    std::fs::write(dir.file("a.stop"), "").unwrap();
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(0));
    let t0 = Instant::now();
    let line = w.next(5 * SEC);
    let took = t0.elapsed();
    assert_eq!(line["event"], "released", "{line}");
    assert_eq!(line["holder"], "a-holder", "{line}");
    assert_eq!(line["epoch"], epoch, "{line}");
    assert_eq!(line["live"], false, "{line}");
    assert!(
        took < SEC,
        "the release was printed {took:?} after the holder's exit, not on a push: {}",
        read(&dir.file("w.log"))
    );
    let mut child = w.child;
    signal(child.id(), Signal::SIGTERM);
    assert_eq!(wait_exit(&mut child, 5 * SEC).code(), Some(0));
}

#[test]
fn release_is_pushed_embedded() {
    release_is_pushed(stores::sqlite());
}

#[test]
fn release_is_pushed_postgres() {
    release_is_pushed(stores::postgres());
}

#[test]
fn release_is_pushed_redis() {
    release_is_pushed(stores::redis());
}

#[test]
fn release_is_pushed_etcd() {
    release_is_pushed(stores::etcd());
}

/// A holder killed with its watchdog gives nothing back: the lease runs
/// out (L = 1 s) and the watcher says so, whether the store keeps the
/// expired row (embedded) or deletes the key (Redis).
fn expiry_is_told_from_a_release(srv: Server) {
    let dir = TempDir::new("watch-exp");
    let mut a = spawn(
        lr(
            &srv.url,
            "x",
            &["--lease", "1s", "--holder", "a-holder"],
            &worker(&dir, "a"),
        ),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let w = Watcher::start(
        &srv.url,
        &["--name", "x", "--retry", "100ms"],
        &dir.file("w.log"),
    );
    assert_eq!(w.next(10 * SEC)["holder"], "a-holder");
    kill_holder_and_watchdog(&mut a);
    let t0 = Instant::now();
    let line = w.next(5 * SEC);
    assert_eq!(line["event"], "expired", "{line}");
    assert_eq!(line["holder"], "a-holder", "{line}");
    assert!(t0.elapsed() < 2 * SEC, "{:?}", t0.elapsed());
    let mut child = w.child;
    signal(child.id(), Signal::SIGTERM);
    assert_eq!(wait_exit(&mut child, 5 * SEC).code(), Some(0));
}

#[test]
fn expiry_is_told_from_a_release_embedded() {
    expiry_is_told_from_a_release(stores::sqlite());
}

#[test]
fn expiry_is_told_from_a_release_redis() {
    expiry_is_told_from_a_release(stores::redis());
}

/// Without a name, every lease by polling: an acquisition, a takeover at a
/// new epoch and a release, each once, in order; SIGINT ends it with 0.
#[test]
fn every_lease_by_polling() {
    let srv = stores::sqlite();
    let dir = TempDir::new("watch-all");
    // A file store that does not exist is an error for watch, as for
    // status (a typo must not create one): `init` makes it.
    let init = run({
        let mut c = leaderrun();
        c.args(["--store", &srv.url, "init"]);
        c
    });
    assert_eq!(init.code, Some(0), "{}", init.stderr);
    let w = Watcher::start(&srv.url, &["--retry", "100ms"], &dir.file("w.log"));
    // No lease yet: no state line, and nothing else.
    assert!(w.lines.recv_timeout(SEC / 3).is_err());
    let mut a = holder(&srv, &dir, "p");
    let got = w.next(5 * SEC);
    assert_eq!(
        (
            got["event"].as_str(),
            got["name"].as_str(),
            got["holder"].as_str()
        ),
        (Some("acquired"), Some("p"), Some("a-holder")),
        "{got}"
    );
    let epoch = got["epoch"].as_i64().expect("epoch");
    std::fs::write(dir.file("a.stop"), "").unwrap();
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(0));
    let got = w.next(5 * SEC);
    assert_eq!(got["event"], "released", "{got}");
    assert_eq!(got["epoch"], epoch, "{got}");
    let mut child = w.child;
    signal(child.id(), Signal::SIGINT);
    assert_eq!(wait_exit(&mut child, 5 * SEC).code(), Some(0));
    assert!(
        w.lines.try_iter().next().is_none(),
        "a line after the release: {}",
        read(&dir.file("w.log"))
    );
}

/// `watch | head -n 1`: once nobody reads, the watcher ends, with 0, at
/// its next line (here: the release).
#[test]
fn a_closed_stdout_ends_the_watch() {
    let srv = stores::sqlite();
    let dir = TempDir::new("watch-head");
    let mut a = holder(&srv, &dir, "h");
    let mut c = std::process::Command::new("bash");
    c.args([
        "-c",
        &format!(
            "'{}' --store '{}' watch --name h | head -n 1; echo \"watch exited ${{PIPESTATUS[0]}}\"",
            env!("CARGO_BIN_EXE_leaderrun"),
            srv.url
        ),
    ]);
    clean_env(&mut c);
    c.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut sh = c.spawn().expect("bash");
    let mut out = BufReader::new(sh.stdout.take().expect("stdout")).lines();
    let first = out.next().expect("a line").expect("text");
    assert!(first.ends_with("h held by a-holder at epoch 1"), "{first}");
    std::fs::write(dir.file("a.stop"), "").unwrap();
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(0));
    let last = out.next().expect("a second line").expect("text");
    assert_eq!(last, "watch exited 0");
    assert!(wait_exit(&mut sh, 10 * SEC).success());
}

/// A read interval that would busy a core is refused in one line, as the
/// run form's `--retry` is.
#[test]
fn too_short_an_interval_is_refused() {
    let srv = stores::sqlite();
    let out = run({
        let mut c = leaderrun();
        c.args(["--store", &srv.url, "watch", "--retry", "1ms"]);
        c
    });
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("--retry (1ms) must be at least"),
        "{}",
        out.stderr
    );
}
