//! The etcd store's semantics against a real, throwaway etcd, and the
//! `leaderrun` binary end to end on it. etcd grants whole seconds with a
//! minimum of 2 s at its default election timeout, so leases here are 2–3 s.

use std::time::{Duration, Instant};

use crate::support::etcd::Etcd;
use crate::support::*;
use leaderrun::store::{open, AnyStore, Origin, Store, StoreAdmin, StoreError};

const L: Duration = Duration::from_secs(3);
const T: Duration = Duration::from_secs(5);
const ZERO: Duration = Duration::ZERO;

/// Opened through the registry from the URL, as the binary does.
fn store(url: &str) -> AnyStore {
    match open(Some((url, Origin::Flag)), "leaderrun-test", T) {
        Ok(s) => s,
        Err(e) => panic!("cannot open {url}: {e}"),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn racing_acquires_have_one_winner_at_the_next_epoch() {
    let e = Etcd::start();
    rt().block_on(async {
        let mut stores: Vec<AnyStore> = (0..8).map(|_| store(&e.url())).collect();
        for s in stores.iter_mut() {
            s.inspect("warmup", T).await.unwrap(); // connect before the race
        }
        for round in 1..=5i64 {
            let futs: Vec<_> = stores
                .iter_mut()
                .enumerate()
                .map(|(i, s)| {
                    Box::pin(
                        async move { s.acquire("race", &format!("c{i}"), L, T).await.unwrap() },
                    )
                })
                .collect();
            let won: Vec<i64> = join_all(futs).await.into_iter().flatten().collect();
            assert_eq!(won, vec![round], "round {round}: one winner, next epoch");
            // Free it behind everyone's back; the counter must survive that.
            e.ctl(&["del", "leaderrun/lease/race"]);
        }
        assert_eq!(e.get("leaderrun/epoch/race"), "5");
    });
}

#[test]
fn stale_renew_and_stale_release_are_refused() {
    let e = Etcd::start();
    rt().block_on(async {
        let (mut a, mut b) = (store(&e.url()), store(&e.url()));
        assert_eq!(a.acquire("n", "a", L, T).await.unwrap(), Some(1));
        assert_eq!(b.acquire("n", "b", L, T).await.unwrap(), None);
        assert!(!b.renew("n", "b", 1, L, T).await.unwrap(), "wrong holder");
        assert!(!a.renew("n", "a", 2, L, T).await.unwrap(), "wrong epoch");
        assert!(
            !b.release("n", "a", 7, ZERO, T).await.unwrap(),
            "wrong epoch"
        );
        assert!(
            !b.release("n", "b", 1, ZERO, T).await.unwrap(),
            "wrong holder"
        );
        assert_eq!(b.acquire("n", "b", L, T).await.unwrap(), None, "still held");
        assert!(a.renew("n", "a", 1, L, T).await.unwrap());
        // Another process (no remembered grant) can renew with the right
        // holder and epoch too: the grant is read from the key.
        assert!(store(&e.url()).renew("n", "a", 1, L, T).await.unwrap());
        assert!(a.release("n", "a", 1, ZERO, T).await.unwrap());
        assert_eq!(b.acquire("n", "b", L, T).await.unwrap(), Some(2));
        assert!(!a.renew("n", "a", 1, L, T).await.unwrap());
        assert!(!a.release("n", "a", 1, ZERO, T).await.unwrap());
        let info = b.inspect("n", T).await.unwrap().expect("row");
        assert_eq!((info.holder.as_deref(), info.epoch), (Some("b"), 2));
        assert!(
            info.expires_in_ms.expect("an expiry") > 1000
                && info.expires_in_ms.expect("an expiry") <= 3000,
            "{info:?}"
        );
    });
}

/// Expiry is etcd's: the key lives on an etcd lease, and etcd deletes it
/// when the TTL runs out unless a keepalive came.
#[test]
fn expiry_frees_the_lease_by_the_servers_clock() {
    let e = Etcd::start();
    let short = Duration::from_secs(2);
    rt().block_on(async {
        let (mut a, mut b) = (store(&e.url()), store(&e.url()));
        let t0 = Instant::now();
        assert_eq!(a.acquire("n", "a", short, T).await.unwrap(), Some(1));
        tokio::time::sleep(Duration::from_millis(1300)).await;
        assert!(a.renew("n", "a", 1, short, T).await.unwrap());
        tokio::time::sleep(Duration::from_millis(1300)).await;
        // 2.6 s after acquiring: alive only thanks to the keepalive.
        assert_eq!(b.acquire("n", "b", short, T).await.unwrap(), None);
        let took = loop {
            if let Some(ep) = b.acquire("n", "b", short, T).await.unwrap() {
                assert_eq!(ep, 2);
                break t0.elapsed();
            }
            assert!(t0.elapsed() < Duration::from_secs(8), "never expired");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // Renewed at ~1.3 s with a 2 s TTL: free at ~3.3 s (etcd looks for
        // expired leases every 500 ms), never before.
        assert!(took >= Duration::from_millis(3200), "{took:?}");
        assert!(!a.renew("n", "a", 1, short, T).await.unwrap(), "expired");
        assert!(!a.release("n", "a", 1, ZERO, T).await.unwrap());
    });
}

#[test]
fn release_with_keep_holds_until_then() {
    let e = Etcd::start();
    rt().block_on(async {
        let (mut a, mut b) = (store(&e.url()), store(&e.url()));
        assert_eq!(a.acquire("n", "a", L, T).await.unwrap(), Some(1));
        let t0 = Instant::now();
        assert!(a
            .release("n", "a", 1, Duration::from_secs(2), T)
            .await
            .unwrap());
        assert_eq!(b.acquire("n", "b", L, T).await.unwrap(), None, "kept");
        let info = b.inspect("n", T).await.unwrap().expect("row");
        assert_eq!(info.holder.as_deref(), Some("a"));
        assert!(
            info.expires_in_ms.expect("an expiry") > 0
                && info.expires_in_ms.expect("an expiry") <= 2000,
            "{info:?}"
        );
        // The key moved to a lease of its own: the holder's was revoked.
        assert_eq!(e.ctl(&["lease", "list"]).lines().count(), 2, "one lease");
        loop {
            if let Some(ep) = b.acquire("n", "b", L, T).await.unwrap() {
                assert_eq!(ep, 2);
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(6), "kept too long");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            t0.elapsed() >= Duration::from_millis(1900),
            "{:?}",
            t0.elapsed()
        );
    });
}

/// The counter rises by exactly one per acquisition (a compare on its
/// mod_revision in the acquiring transaction), not by etcd's revision.
#[test]
fn a_hundred_acquisitions_raise_the_epoch_by_one_each() {
    let e = Etcd::start();
    rt().block_on(async {
        let mut a = store(&e.url());
        for want in 1..=100i64 {
            let h = format!("h{want}");
            assert_eq!(a.acquire("e", &h, L, T).await.unwrap(), Some(want));
            assert!(a.release("e", &h, want, ZERO, T).await.unwrap());
        }
    });
    assert_eq!(e.get("leaderrun/epoch/e"), "100");
    assert_eq!(e.ctl(&["lease", "list"]).lines().count(), 1, "all revoked");
}

#[test]
fn list_and_clear() {
    let e = Etcd::start();
    rt().block_on(async {
        let mut a = store(&e.url());
        assert!(a.list(T).await.unwrap().is_empty());
        assert_eq!(a.acquire("held", "a", L, T).await.unwrap(), Some(1));
        assert_eq!(a.acquire("freed", "a", L, T).await.unwrap(), Some(1));
        assert!(a.release("freed", "a", 1, ZERO, T).await.unwrap());
        e.ctl(&["put", "unrelated", "x"]);
        let seen: Vec<_> = a
            .list(T)
            .await
            .unwrap()
            .into_iter()
            .map(|i| (i.name.clone(), i.holder.clone(), i.epoch, i.is_live()))
            .collect();
        assert_eq!(
            seen,
            vec![
                ("freed".to_string(), None, 1, false),
                ("held".to_string(), Some("a".to_string()), 1, true)
            ]
        );
        assert_eq!(a.clear("held", Some(2), T).await.unwrap(), None, "epoch");
        assert_eq!(a.clear("nothing", None, T).await.unwrap(), None);
        assert_eq!(a.clear("freed", None, T).await.unwrap(), None, "free");
        let was = a.clear("held", Some(1), T).await.unwrap().expect("cleared");
        assert_eq!((was.holder.as_deref(), was.epoch), (Some("a"), 1));
        assert!(was.expires_in_ms.expect("an expiry") > 0, "{was:?}");
        // Cleared means revoked too: the holder's keepalive fails at once.
        assert!(!a.renew("held", "a", 1, L, T).await.unwrap(), "cleared");
        assert_eq!(a.acquire("held", "b", L, T).await.unwrap(), Some(2));
    });
}

#[test]
fn names_that_look_like_injection_are_inert() {
    let e = Etcd::start();
    let evil = [
        "*",
        "{",
        "}",
        "a/../b",
        "../epoch/x",
        "x\",\"key\":\"eA==",
        "\\",
        "1:2",
        "ü",
    ];
    rt().block_on(async {
        let mut a = store(&e.url());
        assert_eq!(a.acquire("plain", "p", L, T).await.unwrap(), Some(1));
        for n in evil {
            assert_eq!(a.acquire(n, "h:\" --", L, T).await.unwrap(), Some(1), "{n}");
        }
        for n in evil {
            assert_eq!(a.acquire(n, "other", L, T).await.unwrap(), None, "{n}");
        }
        let names: Vec<String> = a
            .list(T)
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
        let mut want: Vec<String> = evil.iter().map(|s| s.to_string()).collect();
        want.push("plain".into());
        want.sort();
        assert_eq!(names, want);
        assert!(a.clear("*", None, T).await.unwrap().is_some());
        for n in evil.iter().filter(|n| **n != "*").chain(["plain"].iter()) {
            let i = a.inspect(n, T).await.unwrap().expect("row");
            assert!(i.is_live(), "{n}: {i:?}");
        }
        let holder = a.inspect("a/../b", T).await.unwrap().expect("row").holder;
        assert_eq!(holder.as_deref(), Some("h:\" --"));
    });
}

/// etcd grants whole seconds and at least its minimum (2 s at the default
/// election timeout): a lease it would lengthen is refused, not shortened
/// behind the holder's back; a fraction is rounded up.
#[test]
fn a_lease_shorter_than_etcds_minimum_is_refused() {
    let e = Etcd::start();
    rt().block_on(async {
        let mut a = store(&e.url());
        let err = a
            .acquire("n", "a", Duration::from_secs(1), T)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Fatal(_)), "{err:?}");
        assert!(err.to_string().contains("at least 2s"), "{err}");
        assert!(a.inspect("n", T).await.unwrap().is_none(), "nothing taken");
        assert_eq!(e.ctl(&["lease", "list"]).lines().count(), 1, "revoked");
        // 1.5 s becomes 2 s on the server.
        let ep = a.acquire("n", "a", Duration::from_millis(1500), T).await;
        assert_eq!(ep.unwrap(), Some(1));
        let ms = a
            .inspect("n", T)
            .await
            .unwrap()
            .expect("row")
            .expires_in_ms
            .expect("an expiry");
        // etcd reports whole seconds left, rounded down.
        assert!((1000..=2000).contains(&ms), "{ms}");
    });
}

#[test]
fn dead_server_and_wrong_password_are_told_apart() {
    let mut e = Etcd::start();
    e.enable_auth("app", "app-pw");
    rt().block_on(async {
        let good = format!("etcd://app:app-pw@127.0.0.1:{}", e.port);
        assert_eq!(store(&good).acquire("n", "a", L, T).await.unwrap(), Some(1));

        let url = format!("etcd://app:Wr0ngSecret@127.0.0.1:{}", e.port);
        let err = store(&url).acquire("n", "a", L, T).await.unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, StoreError::Fatal(_)), "{err:?}");
        assert!(msg.contains("authentication failed"), "{msg}");
        assert!(!msg.contains("Wr0ngSecret"), "password echoed: {msg}");
        assert!(msg.contains("etcd://app:***@"), "{msg}");

        let err = store(&e.url()).acquire("n", "a", L, T).await.unwrap_err();
        assert!(matches!(err, StoreError::Fatal(_)), "no user: {err:?}");

        // A user without a role for leaderrun's keys.
        e.ctl(&["user", "add", "nobody:nobody-pw"]);
        let url = format!("etcd://nobody:nobody-pw@127.0.0.1:{}", e.port);
        let err = store(&url).acquire("n", "a", L, T).await.unwrap_err();
        assert!(matches!(err, StoreError::Fatal(_)), "{err:?}");
        assert!(err.to_string().contains("permission denied"), "{err}");

        let dead = format!("etcd://app:app-pw@127.0.0.1:{}", free_port());
        let err = store(&dead).acquire("n", "a", L, T).await.unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
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
        let (mut a, mut one) = (store(&url), store(&alone));
        assert_eq!(a.acquire("n", "a", L, T).await.unwrap(), Some(1));
        assert!(one.renew("n", "a", 1, L, T).await.unwrap());
        proxy.blackhole();
        let t0 = Instant::now();
        let err = one
            .renew("n", "a", 1, L, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert!(
            t0.elapsed() < Duration::from_millis(800),
            "{:?}",
            t0.elapsed()
        );
        let t0 = Instant::now();
        assert!(
            a.renew("n", "a", 1, L, Duration::from_millis(300))
                .await
                .unwrap(),
            "answered by the second endpoint within the call"
        );
        assert!(
            t0.elapsed() < Duration::from_millis(300),
            "{:?}",
            t0.elapsed()
        );
        assert!(a.renew("n", "a", 1, L, T).await.unwrap(), "second endpoint");

        let url = format!("etcd://127.0.0.1:{},127.0.0.1:{}", free_port(), e.port);
        assert!(store(&url).renew("n", "a", 1, L, T).await.unwrap());
    });
    e.freeze(true);
    rt().block_on(async {
        let t0 = Instant::now();
        let err = store(&e.url())
            .acquire("m", "a", L, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
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
        let mut a = store(&e.url());
        assert_eq!(a.acquire("n", "a", L, T).await.unwrap(), Some(1));
        assert!(a.renew("n", "a", 1, L, T).await.unwrap());
        assert!(a.release("n", "a", 1, ZERO, T).await.unwrap());

        let unverified = format!("etcds://127.0.0.1:{}", e.port);
        let err = store(&unverified)
            .acquire("n", "a", L, T)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Fatal(_)), "{err:?}");
        assert!(err.to_string().contains("certificate"), "{err}");

        // Plain HTTP to the TLS port: etcd hangs up, nothing is taken.
        let plain = format!("etcd://127.0.0.1:{}", e.port);
        let err = store(&plain).acquire("n", "a", L, T).await.unwrap_err();
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
}
