//! What the etcd store does beyond the contract (tests/conformance.rs checks
//! that against every store), against a real, throwaway etcd: whole-second
//! grants and their minimum, etcd leases not left behind, endpoint
//! failover, TLS, authentication and roles, and the `leaderrun` binary end
//! to end on it. Leases here are 2–3 s (etcd's minimum is 2 s at its
//! default election timeout).

use std::time::{Duration, Instant};

use crate::support::etcd::Etcd;
use crate::support::*;
use leaderrun::store::{open, LeaseLock, Lock, Origin, Store};

const L: Duration = Duration::from_secs(3);
const T: Duration = Duration::from_secs(5);
const ZERO: Duration = Duration::ZERO;

/// Opened through the registry from the URL, as the binary does.
fn store(url: &str) -> Store {
    match open(Some((url, Origin::Flag)), "leaderrun-test", T) {
        Ok(s) => s,
        Err(e) => panic!("cannot open {url}: {e}"),
    }
}

fn lock(url: &str, name: &str, holder: &str) -> Lock {
    store(url).lock(name, holder)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// etcd grants whole seconds and at least its minimum (2 s at the default
/// election timeout): a lease it would lengthen is refused, not shortened
/// behind the holder's back; a fraction is rounded up.
#[test]
fn a_lease_shorter_than_etcds_minimum_is_refused() {
    let e = Etcd::start();
    rt().block_on(async {
        let mut a = lock(&e.url(), "n", "a");
        let err = a.acquire(Duration::from_secs(1), T).await.unwrap_err();
        assert!(!err.may_heal(), "{err:?}");
        assert!(err.to_string().contains("at least 2s"), "{err}");
        assert!(a.inspect(T).await.unwrap().is_none(), "nothing taken");
        assert_eq!(e.ctl(&["lease", "list"]).lines().count(), 1, "revoked");
        // 1.5 s becomes 2 s on the server.
        let ep = a.acquire(Duration::from_millis(1500), T).await;
        assert_eq!(ep.unwrap(), Some(1));
        let ms = a
            .inspect(T)
            .await
            .unwrap()
            .expect("row")
            .expires_in_ms
            .expect("an expiry");
        // etcd reports whole seconds left, rounded down.
        assert!((1000..=2000).contains(&ms), "{ms}");
    });
}

/// Every etcd lease a grant made is revoked once it is no longer used: on
/// release, when `--min-hold` moves the key to a lease of its own, and when
/// a grant is refused. `status` lists leaderrun's keys only.
#[test]
fn etcd_leases_are_not_left_behind() {
    let e = Etcd::start();
    let leases = || e.ctl(&["lease", "list"]).lines().count() - 1;
    rt().block_on(async {
        let mut a = lock(&e.url(), "e", "a");
        for want in 1..=20i64 {
            assert_eq!(a.acquire(L, T).await.unwrap(), Some(want));
            assert!(a.release(want, ZERO, T).await.unwrap());
        }
        assert_eq!(leases(), 0, "all revoked");
        assert_eq!(a.acquire(L, T).await.unwrap(), Some(21));
        assert!(a.release(21, Duration::from_secs(2), T).await.unwrap());
        assert_eq!(leases(), 1, "the key moved to a lease of its own");
        e.ctl(&["put", "unrelated", "x"]);
        let listed: Vec<String> = store(&e.url())
            .list(T)
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
        assert_eq!(listed, ["e"]);
    });
}

/// With authentication on, no user at all, or a user without a role for
/// leaderrun's keys, will not heal either. (A wrong password and a dead
/// server are the conformance suite's.)
#[test]
fn no_user_or_no_role_will_not_heal() {
    let mut e = Etcd::start();
    e.enable_auth("app", "app-pw");
    rt().block_on(async {
        let err = lock(&e.url(), "n", "a").acquire(L, T).await.unwrap_err();
        assert!(!err.may_heal(), "no user: {err:?}");

        e.ctl(&["user", "add", "nobody:nobody-pw"]);
        let url = format!("etcd://nobody:nobody-pw@127.0.0.1:{}", e.port);
        let err = lock(&url, "n", "a").acquire(L, T).await.unwrap_err();
        assert!(!err.may_heal(), "{err:?}");
        assert!(err.to_string().contains("permission denied"), "{err}");
        assert!(err.to_string().contains("etcd://nobody:***@"), "{err}");
    });
}

/// A blackholed call returns within its timeout. With a second endpoint
/// listed, the same call is answered by it, within the same timeout (the
/// first endpoint is not waited out), and so is the next one. A dead first
/// endpoint is skipped at once.
#[test]
fn blackholed_call_returns_within_its_timeout_and_endpoints_fail_over() {
    let e = Etcd::start();
    let proxy = Proxy::start(e.port);
    rt().block_on(async {
        let url = format!("etcd://127.0.0.1:{},127.0.0.1:{}", proxy.port, e.port);
        let alone = format!("etcd://127.0.0.1:{}", proxy.port);
        let (mut a, mut one) = (lock(&url, "n", "a"), lock(&alone, "n", "a"));
        assert_eq!(a.acquire(L, T).await.unwrap(), Some(1));
        assert!(one.renew(1, L, T).await.unwrap());
        proxy.blackhole();
        let t0 = Instant::now();
        let err = one
            .renew(1, L, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(err.may_heal(), "{err:?}");
        assert!(
            t0.elapsed() < Duration::from_millis(800),
            "{:?}",
            t0.elapsed()
        );
        let t0 = Instant::now();
        assert!(
            a.renew(1, L, Duration::from_millis(300)).await.unwrap(),
            "answered by the second endpoint within the call"
        );
        assert!(
            t0.elapsed() < Duration::from_millis(300),
            "{:?}",
            t0.elapsed()
        );
        assert!(a.renew(1, L, T).await.unwrap(), "second endpoint");

        let url = format!("etcd://127.0.0.1:{},127.0.0.1:{}", free_port(), e.port);
        assert!(lock(&url, "n", "a").renew(1, L, T).await.unwrap());
    });
    e.freeze(true);
    rt().block_on(async {
        let t0 = Instant::now();
        let err = lock(&e.url(), "m", "a")
            .acquire(L, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(err.may_heal(), "{err:?}");
        assert!(
            t0.elapsed() < Duration::from_millis(800),
            "{:?}",
            t0.elapsed()
        );
    });
    e.freeze(false);
}

#[test]
fn the_binary_runs_a_command_under_an_etcd_lease() {
    let e = Etcd::start();
    let dir = TempDir::new("etcd-e2e");
    let url = e.url();
    let lease = ["--lease", "3s"];
    let out = dir.file("env");
    let script = format!(
        "echo \"$LEASE_EPOCH $LEASE_NAME\" > {}; exit 7",
        out.display()
    );
    let res = run(lr(&url, "job", &lease, &script));
    assert_eq!(res.code, Some(7), "{}", res.stderr);
    assert_eq!(read(&out).trim(), "1 job");

    let mut holder = spawn(
        lr(&url, "job", &lease, &worker(&dir, "w")),
        &dir.file("w.log"),
    );
    wait_file(&dir.file("w.pid"), Duration::from_secs(10));
    assert_eq!(read(&dir.file("w.epoch")).trim(), "2");
    let res = run(lr(
        &url,
        "job",
        &["--lease", "3s", "--conflict-exit-code", "3", "-v"],
        "echo should-not-run",
    ));
    assert_eq!(res.code, Some(3), "{}", res.stderr);
    assert!(!res.stdout.contains("should-not-run"));
    assert!(res.stderr.contains("held by"), "{}", res.stderr);

    // Held across several renew intervals (1 s) by keepalives.
    std::thread::sleep(Duration::from_millis(3500));
    assert!(
        alive(pid_in(&dir.file("w.pid"))),
        "{}",
        read(&dir.file("w.log"))
    );

    signal(holder.id(), nix::sys::signal::Signal::SIGTERM);
    let st = wait_exit(&mut holder, Duration::from_secs(10));
    assert_eq!(st.code(), Some(143), "{}", read(&dir.file("w.log")));
    assert_eq!(e.get("leaderrun/lease/job"), "", "released");
    let res = run(lr(&url, "job", &lease, &script));
    assert_eq!(res.code, Some(7), "{}", res.stderr);
    assert_eq!(read(&out).trim(), "3 job");

    // A lease etcd cannot grant is refused before anything starts (the
    // store's capabilities), said plainly.
    let res = run(lr(&url, "short", &["--lease", "1s"], "true"));
    assert_eq!(res.code, Some(2), "{}", res.stderr);
    assert!(
        res.stderr.contains("shortest lease this store grants (2s)"),
        "{}",
        res.stderr
    );
}

/// `etcds://` verifies the server against the CA named by `cacert=`, and
/// refuses a server it cannot verify (fatal: a certificate does not heal).
#[test]
fn tls_is_verified() {
    let e = Etcd::start_with(true);
    rt().block_on(async {
        let mut a = lock(&e.url(), "n", "a");
        assert_eq!(a.acquire(L, T).await.unwrap(), Some(1));
        assert!(a.renew(1, L, T).await.unwrap());
        assert!(a.release(1, ZERO, T).await.unwrap());

        let unverified = format!("etcds://127.0.0.1:{}", e.port);
        let err = lock(&unverified, "n", "a").acquire(L, T).await.unwrap_err();
        assert!(!err.may_heal(), "{err:?}");
        assert!(err.to_string().contains("certificate"), "{err}");

        // Plain HTTP to the TLS port: etcd hangs up, nothing is taken.
        let plain = format!("etcd://127.0.0.1:{}", e.port);
        let err = lock(&plain, "n", "a").acquire(L, T).await.unwrap_err();
        assert!(err.to_string().contains("connection"), "{err}");
    });
}

fn admin(url: &str, args: &[&str]) -> Output {
    let mut c = leaderrun();
    c.args(args).args(["--store", url]);
    run(c)
}

/// What will not heal ends a `--wait` at once, as it ends a try-once run:
/// exit 125 with one line naming the problem, before the first retry, no
/// password shown, no command started. An unknown CA, a missing `cacert=`
/// file, a wrong password, a user without the role.
#[test]
fn what_will_not_heal_ends_a_wait_too() {
    let tls = Etcd::start_with(true);
    let mut auth = Etcd::start();
    auth.enable_auth("app", "app-pw");
    auth.ctl(&["user", "add", "nobody:nobody-pw"]);
    let dir = TempDir::new("etcd-fatal");
    let ran = dir.file("ran");
    let missing = dir.file("no-such-ca.pem");
    let cases = [
        (format!("etcds://127.0.0.1:{}", tls.port), "certificate"),
        (
            format!(
                "etcds://127.0.0.1:{}?cacert={}",
                tls.port,
                missing.display()
            ),
            "cannot read cacert",
        ),
        (
            format!("etcd://app:Wr0ngSecret@127.0.0.1:{}", auth.port),
            "authentication failed",
        ),
        (
            format!("etcd://nobody:nobody-pw@127.0.0.1:{}", auth.port),
            "permission denied",
        ),
    ];
    // Retried, the first retry would go out after 5 s.
    let extra = ["--wait", "--lease", "3s", "--retry", "5s"];
    for (url, why) in cases {
        let t0 = Instant::now();
        let res = run(lr(&url, "w", &extra, &format!("touch {}", ran.display())));
        let took = t0.elapsed();
        assert_eq!(res.code, Some(125), "{url}: {}", res.stderr);
        assert!(took < Duration::from_secs(5), "{url}: retried? {took:?}");
        assert_eq!(
            res.stderr.trim().lines().count(),
            1,
            "{url}: {}",
            res.stderr
        );
        assert!(res.stderr.contains(why), "{url}: {}", res.stderr);
        assert!(!res.stderr.contains("retrying"), "{url}: {}", res.stderr);
        assert!(!res.stderr.contains("Wr0ngSecret"), "{}", res.stderr);
        assert!(!res.stderr.contains("nobody-pw"), "{}", res.stderr);
        assert!(!ran.exists(), "{url}: the command ran");
    }
}

/// A user with exactly the role docs/stores.md documents (read and write
/// on the `leaderrun/` prefix) can do everything: run and renew, be woken
/// by a release (the watch), release, and `status`, `check` and
/// `release` as an operator. A free lease shows as `free`.
#[test]
fn the_documented_role_is_all_a_user_needs() {
    let mut e = Etcd::start();
    e.enable_auth("app", "app-pw");
    let url = format!("etcd://app:app-pw@127.0.0.1:{}", e.port);
    let dir = TempDir::new("etcd-role");
    // Renewed twice (R = 1 s), then released by the exit.
    let mut first = spawn(
        lr(&url, "job", &["--lease", "3s", "-v"], "sleep 2.5"),
        &dir.file("first.log"),
    );
    wait_for("the first holder", Duration::from_secs(10), || {
        e.get("leaderrun/lease/job").starts_with("1:")
    });
    // With a retry longer than the test, only a wake-up starts it soon.
    let mut second = spawn(
        lr(
            &url,
            "job",
            &["--wait", "--lease", "3s", "--retry", "60s", "-v"],
            &worker(&dir, "w"),
        ),
        &dir.file("second.log"),
    );
    let st = wait_exit(&mut first, Duration::from_secs(10));
    let exited = Instant::now();
    assert_eq!(st.code(), Some(0), "{}", read(&dir.file("first.log")));
    assert!(
        read(&dir.file("first.log")).contains("released"),
        "{}",
        read(&dir.file("first.log"))
    );
    wait_file(&dir.file("w.pid"), Duration::from_secs(10));
    let woken = exited.elapsed();
    let log = read(&dir.file("second.log"));
    assert!(!log.contains("push wake-ups unavailable"), "{log}");
    // The lease lasts 3 s after the last renewal: starting well before
    // that, the second was woken by the watch.
    assert!(woken < Duration::from_secs(1), "{woken:?}: {log}");
    assert_eq!(read(&dir.file("w.epoch")).trim(), "2");

    let res = admin(&url, &["status", "--name", "job"]);
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    assert!(res.stdout.contains("held, expires in"), "{}", res.stdout);
    let res = admin(&url, &["status"]);
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    assert!(res.stdout.contains("job"), "{}", res.stdout);
    assert!(
        res.stdout.contains("replication: Raft, 1 voting member"),
        "{}",
        res.stdout
    );
    let res = admin(&url, &["check", "--name", "job", "--epoch", "2"]);
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    let res = admin(&url, &["release", "--name", "job"]);
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    assert!(res.stdout.contains("released job"), "{}", res.stdout);
    // The holder's next renewal matches nothing: stopped, exit 75.
    let st = wait_exit(&mut second, Duration::from_secs(10));
    assert_eq!(st.code(), Some(75), "{}", read(&dir.file("second.log")));

    let res = admin(&url, &["status", "--name", "job"]);
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    let row = res.stdout.lines().nth(1).unwrap_or_default().to_string();
    assert!(row.starts_with("job"), "{}", res.stdout);
    assert!(row.ends_with("free"), "{}", res.stdout);
    let res = admin(&url, &["status", "--name", "job", "--json"]);
    assert!(
        res.stdout.contains("\"expires_in_ms\":null"),
        "{}",
        res.stdout
    );
    let res = admin(&url, &["check", "--name", "job", "--epoch", "2"]);
    assert_eq!(res.code, Some(1), "{}", res.stderr);

    // --once-per: its period and record keys are under the prefix too.
    let res = run(lr(&url, "once", &["--once-per", "1h"], "exit 3"));
    assert_eq!(res.code, Some(3), "{}", res.stderr);
    let res = run(lr(&url, "once", &["--once-per", "1h"], "exit 4"));
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    let res = admin(&url, &["status"]);
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    assert!(
        res.stdout.contains("last run of once: started"),
        "{}",
        res.stdout
    );
    assert!(res.stdout.contains(": exit 3"), "{}", res.stdout);
}
