//! What the ZooKeeper store does beyond the contract (tests/conformance.rs
//! checks that against every store), against a real, throwaway ZooKeeper
//! (tests/support/zookeeper.rs: `tickTime` 100 ms): the session timeout the
//! server grants, read back and held to `--lease`; a session ended under a
//! held lease; a chroot in the URL; digest authentication and ACLs. The
//! `leaderrun` binary end to end. Leases are 2–6 s; bounds derive from the
//! configured durations.

use std::time::{Duration, Instant};

use crate::support::stores;
use crate::support::zookeeper::{session_of, Client, Zk, ALL, READ};
use crate::support::*;

const SEC: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

fn admin(url: &str, args: &[&str]) -> Output {
    let mut c = leaderrun();
    c.args(args).args(["--store", url]);
    run(c)
}

/// With `--wait`, a retry this long: an answer sooner than it was not a
/// retry.
const RETRY: [&str; 3] = ["--wait", "--retry", "5s"];

/// A run that must be refused before anything starts, at once, in both
/// modes (try once, and `--wait`): its exit status and its one line.
fn refused(url: &str, name: &str, extra: &[&str], dir: &TempDir) -> Vec<(Option<i32>, String)> {
    let ran = dir.file("ran");
    let mut out = Vec::new();
    for wait in [false, true] {
        let mut args = extra.to_vec();
        if wait {
            args.extend(RETRY);
        }
        let t0 = Instant::now();
        let res = run(lr(url, name, &args, &format!("touch {}", ran.display())));
        let took = t0.elapsed();
        assert!(
            took < 5 * SEC,
            "{args:?}: retried? {took:?}: {}",
            res.stderr
        );
        assert!(!ran.exists(), "{args:?}: the command ran: {}", res.stderr);
        assert_eq!(
            res.stderr.trim().lines().count(),
            1,
            "{args:?}: {}",
            res.stderr
        );
        assert!(!res.stderr.contains("retrying"), "{args:?}: {}", res.stderr);
        out.push((res.code, res.stderr));
    }
    out
}

/// The session timeout is the lease: the one the server grants is read
/// back from the handshake, and a `--lease` the server clamps to its
/// `minSessionTimeout`..`maxSessionTimeout` is a usage error (exit 2)
/// naming both, in both modes, before the command starts. A lease the
/// server grants as asked runs.
#[test]
fn a_session_timeout_the_server_clamps_is_refused_naming_both() {
    // tickTime 100 ms: sessions of 2 s to 3 s only.
    let z = Zk::start_with("minSessionTimeout=2000\nmaxSessionTimeout=3000\n");
    let url = format!("zk://127.0.0.1:{}", z.port());
    let dir = TempDir::new("zk-timeout");
    for (lease, asked, granted) in [("1s", "1000ms", "2000ms"), ("4s", "4000ms", "3000ms")] {
        for (code, stderr) in refused(&url, "t", &["--lease", lease], &dir) {
            assert_eq!(code, Some(2), "--lease {lease}: {stderr}");
            assert!(
                stderr.contains(&format!(
                    "granted a session timeout of {granted}, not the {asked} --lease asks for"
                )),
                "--lease {lease}: {stderr}"
            );
        }
    }
    let mut c = Client::connect(z.port(), None);
    assert_eq!(c.get("/leaderrun/t/epoch"), None, "nothing was taken");

    let res = run(lr(&url, "t", &["--lease", "2500ms"], "echo $LEASE_EPOCH"));
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    assert_eq!(res.stdout.trim(), "1");
    assert_eq!(c.get("/leaderrun/t/epoch"), Some(b"1".to_vec()));
}

/// A session that ends while its lease is held (here ended by the test with
/// the session's id and password, which the lease node records, as an
/// expiry ends it: the ensemble deletes the ephemeral lease node and will
/// not resume the session) is a loss: the next renewal finds the session
/// gone, the command is stopped at once and leaderrun exits 75. With
/// R = 500 ms that is within R (and a call), long before the give-up, which
/// is G − R = 3.5 s after the end at the earliest.
#[test]
fn a_session_ended_under_a_held_lease_is_a_loss() {
    let z = Zk::start();
    let url = format!("zk://127.0.0.1:{}", z.port());
    let dir = TempDir::new("zk-expired");
    let mut a = spawn(
        lr(
            &url,
            "s",
            &["--lease", "6s", "--renew", "500ms", "-v"],
            &worker(&dir, "a"),
        ),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let child = pid_in(&dir.file("a.pid"));
    let mut c = Client::connect(z.port(), None);
    let node = c.get("/leaderrun/s/lease").expect("the lease node");
    let (id, pw) = session_of(&node);

    let t0 = Instant::now();
    Client::connect(z.port(), Some((id, &pw))).close();
    assert_eq!(c.get("/leaderrun/s/lease"), None, "the ephemeral node went");
    let st = wait_exit(&mut a, 10 * SEC);
    let took = t0.elapsed();
    let log = read(&dir.file("a.log"));
    eprintln!("session ended at 0; leaderrun exited at {took:?}\n{log}");
    assert_eq!(st.code(), Some(75), "{log}");
    assert!(!alive(child), "the command outlived the loss");
    assert!(log.contains("the renewal matched nothing"), "{log}");
    assert!(
        log.contains("the ZooKeeper session that held lease s expired (or was closed)"),
        "{log}"
    );
    assert!(
        took < 500 * MS + 1500 * MS,
        "noticed {took:?} after the end"
    );

    // The epoch lives on in the counter: the next holder gets 2.
    let res = run(lr(&url, "s", &["--lease", "2s"], "echo $LEASE_EPOCH"));
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    assert_eq!(res.stdout.trim(), "2");
}

/// `zk://host/apps/x` keeps the leases under `/apps/x/leaderrun`, creating
/// the chroot's nodes the first time; another chroot is another namespace
/// (its own epochs), and nothing lands at the root.
#[test]
fn a_chroot_in_the_url_holds_the_leases() {
    let z = Zk::start();
    let base = format!("zk://127.0.0.1:{}", z.port());
    let (x, y) = (format!("{base}/apps/x"), format!("{base}/apps/y"));
    for (url, want) in [(&x, "1"), (&x, "2"), (&y, "1")] {
        let res = run(lr(url, "job", &["--lease", "2s"], "echo $LEASE_EPOCH"));
        assert_eq!(res.code, Some(0), "{url}: {}", res.stderr);
        assert_eq!(res.stdout.trim(), want, "{url}");
    }
    let mut c = Client::connect(z.port(), None);
    assert_eq!(c.children("/"), ["apps", "zookeeper"]);
    assert_eq!(c.children("/apps"), ["x", "y"]);
    assert_eq!(c.children("/apps/x/leaderrun"), ["job"]);
    assert_eq!(c.get("/apps/x/leaderrun/job/epoch"), Some(b"2".to_vec()));
    assert_eq!(c.get("/apps/y/leaderrun/job/epoch"), Some(b"1".to_vec()));

    let res = admin(&x, &["status"]);
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    assert!(res.stdout.contains("job"), "{}", res.stdout);
    let res = admin(&base, &["status"]);
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    assert!(!res.stdout.contains("job"), "{}", res.stdout);
}

/// With digest authentication the nodes are the identity's (`leaderrun
/// init` made the root so): a wrong password (digest derives another
/// identity from it and refuses nothing itself) meets `NoAuth` on a lease
/// held by the right one and on a new one, which will not heal: exit 125
/// at once in both modes, one line, the password never shown. `status`
/// too.
#[test]
fn a_wrong_password_is_125_at_once_in_both_modes_and_never_shown() {
    let srv = stores::zookeeper();
    let wrong = srv.refused_url.clone().expect("a refused URL");
    let dir = TempDir::new("zk-auth");
    let res = run(lr(&srv.url, "held", &["--lease", "2s"], "true"));
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    for name in ["held", "fresh"] {
        for (code, stderr) in refused(&wrong, name, &["--lease", "2s"], &dir) {
            assert_eq!(code, Some(125), "{name}: {stderr}");
            assert!(stderr.contains("NoAuth"), "{name}: {stderr}");
            assert!(stderr.contains("zk://lr:***@"), "{name}: {stderr}");
            assert!(!stderr.contains("Wr0ng-pw"), "{stderr}");
        }
    }
    for args in [&["status"][..], &["status", "--name", "held"]] {
        let res = admin(&wrong, args);
        assert_eq!(res.code, Some(125), "{args:?}: {}", res.stderr);
        assert!(res.stderr.contains("NoAuth"), "{}", res.stderr);
        assert!(!res.stderr.contains("Wr0ng-pw"), "{}", res.stderr);
    }
    // The right password still works: nothing was taken or broken.
    let res = run(lr(
        &srv.url,
        "held",
        &["--lease", "2s"],
        "echo $LEASE_EPOCH",
    ));
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    assert_eq!(res.stdout.trim(), "2");
}

/// A root this identity may read but not create under (someone else made
/// it so): a run is refused with 125 at once in both modes (`NoAuth` will
/// not heal), `init` names what is missing and the node's ACL, and
/// `status`, which only reads, works.
#[test]
fn a_missing_permission_is_125_and_init_names_it() {
    let z = Zk::start();
    let mut c = Client::connect(z.port(), None);
    c.create("/ro", ALL);
    c.create("/ro/leaderrun", READ);
    let url = format!("zk://127.0.0.1:{}/ro", z.port());
    let dir = TempDir::new("zk-acl");
    for (code, stderr) in refused(&url, "job", &["--lease", "2s"], &dir) {
        assert_eq!(code, Some(125), "{stderr}");
        assert!(stderr.contains("NoAuth"), "{stderr}");
    }
    let res = admin(&url, &["init"]);
    assert_eq!(res.code, Some(125), "{}", res.stderr);
    assert!(
        res.stderr
            .contains("anyone (no user in the store URL) may not create under /ro/leaderrun"),
        "{}",
        res.stderr
    );
    assert!(
        res.stderr.contains("its ACL: world:anyone:r)"),
        "{}",
        res.stderr
    );
    let res = admin(&url, &["status"]);
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    assert_eq!(c.children("/ro/leaderrun"), Vec::<String>::new());
}

/// `init` makes the root (and the chroot above it) and says what it made
/// and whose it is; run again, that it was there and this identity may use
/// it; with a wrong password, what this identity lacks (125). A root open
/// to anyone, meant for a user, is said to be open.
#[test]
fn init_says_what_it_made_and_who_may_use_it() {
    let z = Zk::start();
    let p = z.port();
    let said = |url: &str| {
        let res = admin(url, &["init"]);
        assert!(!res.stdout.contains("nothing to do"), "{}", res.stdout);
        assert!(!res.stderr.contains("pw-1") && !res.stdout.contains("pw-1"));
        (res.code, res.stdout.trim().to_string(), res.stderr)
    };
    let owned = format!("zk://lr:pw-1@127.0.0.1:{p}/apps");
    let shown = format!("zk://lr:***@127.0.0.1:{p}/apps");
    assert_eq!(
        said(&owned),
        (
            Some(0),
            format!("created /apps/leaderrun in {shown} (ACL: digest:lr:cdrwa)"),
            String::new()
        )
    );
    let (code, out, _) = said(&owned);
    assert_eq!(code, Some(0));
    assert_eq!(
        out,
        format!(
            "/apps/leaderrun was already in {shown}; digest user lr may create and read \
             under it (ACL: digest:lr:cdrwa)"
        )
    );
    let (code, _, err) = said(&format!("zk://lr:Wr0ng-pw-1@127.0.0.1:{p}/apps"));
    assert_eq!(code, Some(125), "{err}");
    assert!(
        err.contains("digest user lr may not create or read under /apps/leaderrun"),
        "{err}"
    );
    assert!(
        err.contains("its ACL: not readable by this identity"),
        "{err}"
    );

    let open = format!("zk://127.0.0.1:{p}");
    let (code, out, err) = said(&open);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out,
        format!("created /leaderrun in {open} (ACL: world:anyone:cdrwa)")
    );
    let (code, out, err) = said(&format!("zk://lr:pw-1@127.0.0.1:{p}"));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("anyone may create leases under it"), "{out}");
}

fn log_has(path: &std::path::Path, what: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|s| s.contains(what))
}

/// A waiter (`-vv`, so that its wake-ups are logged) whose poll is a minute
/// away, once it has made its attempts and set its watch.
fn waiter(url: &str, dir: &TempDir, tag: &str) -> (std::process::Child, std::path::PathBuf) {
    let log = dir.file(&format!("{tag}.log"));
    let c = spawn(
        lr(
            url,
            "w",
            &["-vv", "--wait", "--retry", "60s", "--lease", "3s"],
            &worker(dir, tag),
        ),
        &log,
    );
    wait_for("the waiter to wait", 10 * SEC, || log_has(&log, "waiting:"));
    (c, log)
}

const WOKEN: &str = "the lease was released; trying now";

/// The watch on the lease node wakes a waiting contender at once when the
/// node goes: on a release (the holder's exit), and on an expiry (the
/// holder killed with its watchdog, so nothing releases: the ensemble
/// deletes the node when the session times out, L = 3 s after the last
/// renewal, plus a tick). The waiters poll every 60 s. On the release, the
/// waiter's own schedule by the store is up to L away: leading within a
/// fraction of a second, with the wake-up logged, is the watch. On the
/// expiry, the waiter's schedule (the node's `mtime` plus L, then looks
/// 10, 20, 40 ms apart) lands within a tick of the end too, so either may
/// win the race and the test holds only the promise: a lead within a
/// fraction of a second of the node's end.
#[test]
fn a_waiter_is_woken_by_the_watch_on_release_and_on_expiry() {
    let z = Zk::start();
    let url = format!("zk://127.0.0.1:{}", z.port());
    let dir = TempDir::new("zk-wake");
    let stoppable = format!(
        "touch {r}; while [ ! -e {s} ]; do sleep 0.01; done",
        r = dir.file("a.running").display(),
        s = dir.file("a.stop").display(),
    );
    let mut a = spawn(
        lr(&url, "w", &["--lease", "3s"], &stoppable),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.running"), 10 * SEC);
    let (mut b, blog) = waiter(&url, &dir, "b");
    std::fs::write(dir.file("a.stop"), "").unwrap();
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(0));
    let released = Instant::now();
    wait_file(&dir.file("b.pid"), 10 * SEC);
    let on_release = released.elapsed();
    assert!(log_has(&blog, WOKEN), "{}", read(&blog));
    assert!(on_release < 500 * MS, "{on_release:?}: {}", read(&blog));
    assert_eq!(read(&dir.file("b.epoch")).trim(), "2");

    let (c, clog) = waiter(&url, &dir, "c");
    let mut zk = Client::connect(z.port(), None);
    let b_node = zk.get("/leaderrun/w/lease");
    assert!(b_node.is_some());
    let killed = Instant::now();
    kill_holder_and_watchdog(&mut b);
    // Gone, or already C's: C may lead within a poll of this loop.
    wait_for("the ensemble to expire B's session", 10 * SEC, || {
        zk.get("/leaderrun/w/lease") != b_node
    });
    let (deleted, gone) = (Instant::now(), killed.elapsed());
    wait_file(&dir.file("c.pid"), 10 * SEC);
    let after_expiry = deleted.elapsed();
    eprintln!(
        "release → B led in {on_release:?}; B killed → node gone in {gone:?}, \
         C led {after_expiry:?} after that"
    );
    // The session ends by the ensemble's clock: L after B's last renewal
    // (at most R = 1 s before the kill) plus a tick, and no earlier than
    // L - R after the kill.
    assert!(gone < 3 * SEC + 500 * MS, "{gone:?}");
    assert!(gone > 2 * SEC - 200 * MS, "{gone:?}: expired early");
    assert!(after_expiry < 500 * MS, "{after_expiry:?}: {}", read(&clog));
    assert_eq!(read(&dir.file("c.epoch")).trim(), "3");
    let mut c = c;
    signal(c.id(), nix::sys::signal::Signal::SIGTERM);
    let _ = wait_exit(&mut c, 10 * SEC);
}

/// `kill -9` of leaderrun while ZooKeeper cannot be reached: the watchdog
/// stops the command and keeps trying to hand the lease back (deleting the
/// node at its version from a session of its own); when the server answers
/// again, long before the session could expire (L = 10 s), the waiter,
/// woken by the watch, leads at once. (tests/hand_back.rs, on ZooKeeper.)
#[test]
fn the_watchdog_hands_back_once_zookeeper_answers() {
    let z = Zk::start();
    let proxy = Proxy::start(z.port());
    let dir = TempDir::new("zk-hand-back");
    let timing = [
        "--lease",
        "10s",
        "--renew",
        "1s",
        "--give-up",
        "3s",
        "--kill-after",
        "1s",
    ];
    let via = format!("zk://127.0.0.1:{}", proxy.port);
    let mut a = spawn(
        lr(&via, "hb", &timing, &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let a_child = pid_in(&dir.file("a.pid"));
    wait_until_some("the watchdog", 10 * SEC, || watchdog_of(a.id()));
    let direct = format!("zk://127.0.0.1:{}", z.port());
    let b = spawn(
        lr(
            &direct,
            "hb",
            &[&timing[..], &["--wait", "--retry", "5s"]].concat(),
            &worker(&dir, "b"),
        ),
        &dir.file("b.log"),
    );
    std::thread::sleep(300 * MS);

    let t0 = Instant::now();
    proxy.blackhole();
    signal(a.id(), nix::sys::signal::Signal::SIGKILL);
    let _ = a.wait();
    wait_for("the watchdog to stop A's command", 2 * SEC, || {
        !alive(a_child)
    });
    std::thread::sleep(2 * SEC);
    assert!(!dir.file("b.pid").exists(), "B led while A's lease held");
    let healed = t0.elapsed();
    proxy.heal();
    wait_file(&dir.file("b.pid"), 15 * SEC);
    let took = t0.elapsed();
    let alog = read(&dir.file("a.log"));
    eprintln!("silent and killed at 0; healed at {healed:?}; B led at {took:?}");
    // The session had at least L - R = 9 s left; B polls every 5 s.
    assert!(
        took < healed + 1500 * MS,
        "{took:?} (healed {healed:?})\n{alog}"
    );
    assert!(alog.contains("lease released"), "{alog}");
    assert_eq!(read(&dir.file("b.epoch")).trim(), "2");
    let mut b = b;
    signal(b.id(), nix::sys::signal::Signal::SIGTERM);
    let _ = wait_exit(&mut b, 5 * SEC);
}

/// The subcommands on ZooKeeper, as a digest user whose identity owns the
/// root (`init`): `status` (one lease, every lease, `--json`, the
/// replication line), `check` at the holder's epoch and another, `release`
/// of a live lease (its holder's next renewal matches nothing: stopped,
/// exit 75), and `watch`, which prints the release on the node's watch
/// while reading only every 10 s.
#[test]
fn status_check_release_and_watch() {
    let srv = stores::zookeeper();
    let url = srv.url.clone();
    let dir = TempDir::new("zk-admin");
    let mut a = spawn(
        lr(
            &url,
            "job",
            &["--lease", "3s", "--holder", "a-holder"],
            &worker(&dir, "a"),
        ),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let epoch = read(&dir.file("a.epoch")).trim().to_string();
    assert_eq!(epoch, "1");

    let res = admin(&url, &["status", "--name", "job"]);
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    let row = res.stdout.lines().nth(1).unwrap_or_default().to_string();
    assert!(
        row.starts_with("job") && row.contains("a-holder"),
        "{}",
        res.stdout
    );
    assert!(row.contains("held, expires in"), "{}", res.stdout);
    let res = admin(&url, &["status"]);
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    assert!(res.stdout.contains("a-holder"), "{}", res.stdout);
    assert!(
        res.stdout.contains("replication: ZAB, a single server"),
        "{}",
        res.stdout
    );
    let res = admin(&url, &["status", "--name", "job", "--json"]);
    let v: serde_json::Value = serde_json::from_str(res.stdout.trim()).expect("JSON");
    assert_eq!(v["holder"], "a-holder", "{v}");
    assert_eq!(v["epoch"], 1, "{v}");
    assert_eq!(v["live"], true, "{v}");
    assert!(
        v["expires_in_ms"]
            .as_i64()
            .is_some_and(|ms| (1..=3000).contains(&ms)),
        "{v}"
    );
    let res = admin(&url, &["status", "--name", "nothing"]);
    assert_eq!(res.code, Some(1), "{}", res.stderr);

    for (at, want) in [("1", Some(0)), ("2", Some(1))] {
        let res = admin(&url, &["check", "--name", "job", "--epoch", at]);
        assert_eq!(res.code, want, "check --epoch {at}: {}", res.stderr);
    }

    let mut w = leaderrun();
    w.args(["--store", &url, "watch", "--name", "job", "--retry", "10s"]);
    let wlog = dir.file("w.log");
    let mut w = spawn(w, &wlog);
    wait_for("watch's first line", 10 * SEC, || {
        read(&wlog).contains("a-holder")
    });

    let res = admin(&url, &["release", "--name", "job"]);
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    let released = Instant::now();
    assert!(res.stdout.contains("released job"), "{}", res.stdout);
    let said = wait_for("watch to print the release", 5 * SEC, || {
        read(&wlog).contains("released")
    });
    assert!(said < SEC, "{said:?}: not on the watch: {}", read(&wlog));
    // The holder's next renewal (every R = 1 s) matches nothing.
    let st = wait_exit(&mut a, 10 * SEC);
    assert_eq!(st.code(), Some(75), "{}", read(&dir.file("a.log")));
    assert!(released.elapsed() < 2 * SEC, "{:?}", released.elapsed());

    let res = admin(&url, &["status", "--name", "job"]);
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    let row = res.stdout.lines().nth(1).unwrap_or_default().to_string();
    assert!(
        row.starts_with("job") && row.ends_with("free"),
        "{}",
        res.stdout
    );
    let res = admin(&url, &["status", "--name", "job", "--json"]);
    assert!(
        res.stdout.contains("\"expires_in_ms\":null"),
        "{}",
        res.stdout
    );
    let res = admin(&url, &["check", "--name", "job", "--epoch", "1"]);
    assert_eq!(res.code, Some(1), "{}", res.stderr);
    let res = admin(&url, &["release", "--name", "job"]);
    assert_eq!(res.code, Some(1), "nothing to release: {}", res.stdout);
    signal(w.id(), nix::sys::signal::Signal::SIGTERM);
    assert_eq!(wait_exit(&mut w, 5 * SEC).code(), Some(0));
}

/// The time a held lease has left is counted by the ZooKeeper leader's
/// clock from the last renewal (or the acquisition), which stamps the
/// lease node: L = 6 s, R = 3 s, read 2 s after the acquisition and before
/// the first renewal, about 4 s are left, not L.
#[test]
fn status_counts_down_from_the_last_renewal() {
    let z = Zk::start();
    let url = format!("zk://127.0.0.1:{}", z.port());
    let dir = TempDir::new("zk-left");
    let mut a = spawn(
        lr(
            &url,
            "n",
            &["--lease", "6s", "--renew", "3s"],
            &worker(&dir, "a"),
        ),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let started = Instant::now();
    std::thread::sleep(2 * SEC);
    let res = admin(&url, &["status", "--name", "n", "--json"]);
    let since = started.elapsed();
    let v: serde_json::Value = serde_json::from_str(res.stdout.trim()).expect("JSON");
    let left = v["expires_in_ms"].as_i64().expect("a time left");
    eprintln!("{since:?} after the command started: {left} ms left");
    // The acquisition came before the command started; the read after it.
    let most = 6000 - 2000;
    assert!(left <= most && left > most - 1000, "{left} ms left: {v}");
    assert_eq!(v["live"], true, "{v}");
    signal(a.id(), nix::sys::signal::Signal::SIGTERM);
    let _ = wait_exit(&mut a, 10 * SEC);
}

/// `--advertise` and a `--min-hold` keep, end to end: the value is in the
/// lease node from the take (`status` shows it while the command runs,
/// not kept), and once the command has exited the keep shows "kept by
/// --min-hold (run ended)" with the value still there; a later tenure that
/// advertises nothing shows no value, only its own keep.
#[test]
fn status_shows_the_advertised_value_and_the_keep() {
    let srv = stores::zookeeper();
    let url = srv.url.clone();
    let dir = TempDir::new("zk-values");
    let started = dir.file("started");
    let mut a = spawn(
        lr(
            &url,
            "adv",
            &["--advertise", "10.0.0.7:8080", "--min-hold", "3s"],
            &format!("touch {}; sleep 1", started.display()),
        ),
        &dir.file("a.log"),
    );
    wait_file(&started, 10 * SEC);
    let json = |out: Output| -> serde_json::Value {
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        serde_json::from_str(out.stdout.trim()).expect("status --json")
    };
    let j = json(admin(&url, &["status", "--name", "adv", "--json"]));
    assert_eq!(
        (&j["advertised"], &j["kept"]),
        (
            &serde_json::json!("10.0.0.7:8080"),
            &serde_json::json!(false)
        ),
        "running: {j}"
    );
    assert_eq!(a.wait().expect("wait").code(), Some(0));
    let text = admin(&url, &["status", "--name", "adv"]);
    assert!(
        text.stdout.contains("kept by --min-hold (run ended)")
            && text.stdout.contains("advertises 10.0.0.7:8080"),
        "{}",
        text.stdout
    );
    let j = json(admin(&url, &["status", "--name", "adv", "--json"]));
    assert_eq!(
        (&j["advertised"], &j["kept"], &j["live"]),
        (
            &serde_json::json!("10.0.0.7:8080"),
            &serde_json::json!(true),
            &serde_json::json!(true)
        ),
        "kept: {j}"
    );
    let out = run(lr(&url, "adv", &["--wait", "--min-hold", "2s"], "true"));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let j = json(admin(&url, &["status", "--name", "adv", "--json"]));
    assert_eq!(
        (&j["epoch"], &j["advertised"], &j["kept"]),
        (
            &serde_json::json!(2),
            &serde_json::Value::Null,
            &serde_json::json!(true)
        ),
        "a later tenure: {j}"
    );
}
