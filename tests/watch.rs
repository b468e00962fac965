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

/// The watch on the lease node.
#[test]
fn release_is_pushed_zookeeper() {
    release_is_pushed(stores::zookeeper());
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

/// ZooKeeper deletes the node of an expired session; the time left is
/// counted from the last renewal's stamp on it.
#[test]
fn expiry_is_told_from_a_release_zookeeper() {
    expiry_is_told_from_a_release(stores::zookeeper());
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

/// Without `--name`, reads `--retry` apart: with epoch 2 seen held, epochs
/// 3 and 4 each begin and end between two reads. Every tenure gets a line:
/// the end of 2, epoch 3 unseen, the release of 4 (the watcher once printed
/// only the end of 2).
fn no_tenure_is_left_out(srv: Server) {
    let dir = TempDir::new("watch-tenures");
    let once = |tag: &str| {
        let out = run(lr(&srv.url, "t", &["--holder", tag], "true"));
        assert_eq!(out.code, Some(0), "{}", out.stderr);
    };
    // Epoch 1, and the store's table or file, before the watcher starts.
    once("first");
    let w = Watcher::start(&srv.url, &["--retry", "5s"], &dir.file("w.log"));
    let state = w.next(10 * SEC);
    assert_eq!(
        (&state["event"], &state["epoch"]),
        (&"state".into(), &1.into())
    );
    let mut a = holder(&srv, &dir, "t");
    let got = w.next(15 * SEC);
    assert_eq!(
        (&got["event"], &got["epoch"]),
        (&"acquired".into(), &2.into()),
        "{got}"
    );
    // Within the next 5 s, before the watcher reads again: the holder
    // gives the lease back, and two runs take and release it.
    let t0 = Instant::now();
    std::fs::write(dir.file("a.stop"), "").unwrap();
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(0));
    once("third");
    once("fourth");
    assert!(
        t0.elapsed() < 4 * SEC,
        "too slow to fit between two reads: {:?}",
        t0.elapsed()
    );
    let lines: Vec<serde_json::Value> = (0..3).map(|_| w.next(10 * SEC)).collect();
    let said = |i: usize| {
        (
            lines[i]["event"].as_str().unwrap_or("?").to_string(),
            lines[i]["epoch"].as_i64(),
        )
    };
    assert_eq!(said(0), ("released".into(), Some(2)), "{lines:?}");
    assert_eq!(lines[0]["holder"], "a-holder", "{lines:?}");
    assert_eq!(said(1), ("unseen".into(), Some(3)), "{lines:?}");
    assert_eq!(lines[1]["first_epoch"], 3, "{lines:?}");
    assert_eq!(said(2), ("released".into(), Some(4)), "{lines:?}");
    let mut child = w.child;
    signal(child.id(), Signal::SIGTERM);
    assert_eq!(wait_exit(&mut child, 5 * SEC).code(), Some(0));
}

#[test]
fn no_tenure_is_left_out_embedded() {
    no_tenure_is_left_out(stores::sqlite());
}

#[test]
fn no_tenure_is_left_out_postgres() {
    no_tenure_is_left_out(stores::postgres());
}

/// A `--once-per` run's end is a line of its own, with the outcome its
/// record says, after the lease's release.
fn a_runs_end_is_said_with_its_outcome(srv: Server) {
    let dir = TempDir::new("watch-run");
    // The store's file or table first: `watch` never creates one.
    let first = run(lr(&srv.url, "r", &[], "true"));
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    let w = Watcher::start(
        &srv.url,
        &["--name", "r", "--retry", "100ms"],
        &dir.file("w.log"),
    );
    assert_eq!(w.next(10 * SEC)["event"], "state");
    let out = run(lr(&srv.url, "r", &["--once-per", "1h"], "exit 3"));
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    let ended = loop {
        let l = w.next(10 * SEC);
        if l["event"] == "run_ended" {
            break l;
        }
    };
    assert_eq!(ended["outcome"], "exit 3", "{ended}");
    assert!(ended["epoch"].as_i64().is_some_and(|e| e >= 1), "{ended}");
    let mut child = w.child;
    signal(child.id(), Signal::SIGTERM);
    assert_eq!(wait_exit(&mut child, 5 * SEC).code(), Some(0));
}

#[test]
fn a_runs_end_is_said_with_its_outcome_embedded() {
    a_runs_end_is_said_with_its_outcome(stores::sqlite());
}

#[test]
fn a_runs_end_is_said_with_its_outcome_postgres() {
    a_runs_end_is_said_with_its_outcome(stores::postgres());
}

#[test]
fn a_runs_end_is_said_with_its_outcome_redis() {
    a_runs_end_is_said_with_its_outcome(stores::redis());
}
