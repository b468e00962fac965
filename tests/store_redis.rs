//! The Redis store's semantics against a real, throwaway `redis-server`, and
//! the `leaderrun` binary end to end on it.

mod support;

use std::time::{Duration, Instant};

use leaderrun::store::{open, AnyStore, LeaseInfo, Origin, Store, StoreAdmin, StoreError};
use support::redis::{Redis, PASSWORD};
use support::*;

const L: Duration = Duration::from_secs(5);
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

fn holder_epoch(i: &Option<LeaseInfo>) -> Option<(Option<&str>, i64)> {
    i.as_ref().map(|i| (i.holder.as_deref(), i.epoch))
}

#[test]
fn racing_acquires_have_one_winner_at_the_next_epoch() {
    let r = Redis::start();
    rt().block_on(async {
        let mut stores: Vec<AnyStore> = (0..8).map(|_| store(&r.url())).collect();
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
            r.cli(&["DEL", "{leaderrun:race}:lease"]);
        }
    });
}

#[test]
fn stale_renew_and_stale_release_are_refused() {
    let r = Redis::start();
    rt().block_on(async {
        let (mut a, mut b) = (store(&r.url()), store(&r.url()));
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
        assert!(a.release("n", "a", 1, ZERO, T).await.unwrap());
        assert_eq!(b.acquire("n", "b", L, T).await.unwrap(), Some(2));
        // a's grant is over: neither its renewal nor its release touch b's.
        assert!(!a.renew("n", "a", 1, L, T).await.unwrap());
        assert!(!a.release("n", "a", 1, ZERO, T).await.unwrap());
        let info = b.inspect("n", T).await.unwrap();
        assert_eq!(holder_epoch(&info), Some((Some("b"), 2)));
        let ms = info.expect("row").expires_in_ms.expect("an expiry");
        assert!(ms > 4000 && ms <= 5000, "{ms}");
    });
}

/// Expiry is the server's: the key carries a PX expiry and Redis deletes it.
/// A renewal moves it; without one the lease frees itself, and the late
/// holder can neither renew nor release.
#[test]
fn expiry_frees_the_lease_by_the_servers_clock() {
    let r = Redis::start();
    let short = Duration::from_millis(1200);
    rt().block_on(async {
        let (mut a, mut b) = (store(&r.url()), store(&r.url()));
        assert_eq!(a.acquire("n", "a", short, T).await.unwrap(), Some(1));
        let pttl: i64 = r.cli(&["PTTL", "{leaderrun:n}:lease"]).parse().unwrap();
        assert!(pttl > 1000 && pttl <= 1200, "server-side expiry: {pttl}");
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(a.renew("n", "a", 1, short, T).await.unwrap());
        tokio::time::sleep(Duration::from_millis(700)).await;
        // 1.4 s after acquiring: alive only thanks to the renewal.
        assert_eq!(b.acquire("n", "b", short, T).await.unwrap(), None);
        let left = b
            .inspect("n", T)
            .await
            .unwrap()
            .expect("row")
            .expires_in_ms
            .expect("an expiry");
        assert!(left > 0 && left <= 600, "{left}");
        tokio::time::sleep(Duration::from_millis(left as u64 + 50)).await;
        let free = b.inspect("n", T).await.unwrap().expect("row");
        assert_eq!((free.is_live(), free.holder, free.epoch), (false, None, 1));
        assert!(!a.renew("n", "a", 1, short, T).await.unwrap(), "expired");
        assert_eq!(b.acquire("n", "b", short, T).await.unwrap(), Some(2));
        assert!(!a.release("n", "a", 1, ZERO, T).await.unwrap());
    });
}

#[test]
fn release_with_keep_holds_until_then() {
    let r = Redis::start();
    rt().block_on(async {
        let (mut a, mut b) = (store(&r.url()), store(&r.url()));
        assert_eq!(a.acquire("n", "a", L, T).await.unwrap(), Some(1));
        let keep = Duration::from_millis(800);
        assert!(a.release("n", "a", 1, keep, T).await.unwrap());
        assert_eq!(b.acquire("n", "b", L, T).await.unwrap(), None, "kept");
        let info = b.inspect("n", T).await.unwrap().expect("row");
        assert_eq!(info.holder.as_deref(), Some("a"));
        assert!(
            info.expires_in_ms.expect("an expiry") > 0
                && info.expires_in_ms.expect("an expiry") <= 800,
            "{info:?}"
        );
        tokio::time::sleep(Duration::from_millis(
            info.expires_in_ms.expect("an expiry") as u64 + 30,
        ))
        .await;
        assert_eq!(b.acquire("n", "b", L, T).await.unwrap(), Some(2));
    });
}

#[test]
fn a_hundred_acquisitions_raise_the_epoch_by_one_each() {
    let r = Redis::start();
    rt().block_on(async {
        let mut a = store(&r.url());
        for want in 1..=100i64 {
            let h = format!("h{want}");
            assert_eq!(a.acquire("e", &h, L, T).await.unwrap(), Some(want));
            assert!(a.release("e", &h, want, ZERO, T).await.unwrap());
        }
        assert_eq!(r.cli(&["GET", "{leaderrun:e}:epoch"]), "100");
        assert_eq!(
            r.cli(&["TTL", "{leaderrun:e}:epoch"]),
            "-1",
            "the counter never expires"
        );
    });
}

#[test]
fn list_and_clear() {
    let r = Redis::start();
    rt().block_on(async {
        let mut a = store(&r.url());
        assert!(a.list(T).await.unwrap().is_empty());
        assert_eq!(a.acquire("held", "a", L, T).await.unwrap(), Some(1));
        assert_eq!(a.acquire("freed", "a", L, T).await.unwrap(), Some(1));
        assert!(a.release("freed", "a", 1, ZERO, T).await.unwrap());
        r.cli(&["SET", "unrelated", "x"]);
        let all = a.list(T).await.unwrap();
        let seen: Vec<_> = all
            .iter()
            .map(|i| (i.name.as_str(), i.holder.as_deref(), i.epoch, i.is_live()))
            .collect();
        assert_eq!(
            seen,
            vec![("freed", None, 1, false), ("held", Some("a"), 1, true)]
        );
        assert_eq!(a.clear("held", Some(2), T).await.unwrap(), None, "epoch");
        assert_eq!(a.clear("nothing", None, T).await.unwrap(), None);
        assert_eq!(a.clear("freed", None, T).await.unwrap(), None, "free");
        let was = a.clear("held", Some(1), T).await.unwrap().expect("cleared");
        assert_eq!((was.holder.as_deref(), was.epoch), (Some("a"), 1));
        assert!(was.expires_in_ms.expect("an expiry") > 0, "{was:?}");
        assert!(!a.renew("held", "a", 1, L, T).await.unwrap(), "cleared");
        assert_eq!(a.acquire("held", "b", L, T).await.unwrap(), Some(2));
    });
}

/// Names reach Redis only as keys and script arguments: glob, hash-tag and
/// Lua metacharacters mean nothing, and each name is its own lease.
#[test]
fn names_that_look_like_injection_are_inert() {
    let r = Redis::start();
    let evil = [
        "*",
        "?",
        "[a-z]",
        "{",
        "}",
        "}:epoch",
        "a}:lease",
        "x') redis.call('FLUSHALL') --",
        "]] .. redis.call('FLUSHALL') .. [[",
        "\\",
        "1:2",
    ];
    rt().block_on(async {
        let mut a = store(&r.url());
        assert_eq!(a.acquire("plain", "p", L, T).await.unwrap(), Some(1));
        for n in evil {
            assert_eq!(a.acquire(n, "h:' --", L, T).await.unwrap(), Some(1), "{n}");
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
        assert_eq!(r.cli(&["DBSIZE"]), (2 * want.len()).to_string());
        // Clearing `*` clears that lease only.
        assert!(a.clear("*", None, T).await.unwrap().is_some());
        let info = a.inspect("*", T).await.unwrap().expect("counter");
        assert_eq!(info.holder.as_deref(), None);
        for n in evil.iter().filter(|n| **n != "*").chain(["plain"].iter()) {
            let i = a.inspect(n, T).await.unwrap().expect("row");
            assert!(i.is_live(), "{n}: {i:?}");
        }
        let holder = a.inspect("[a-z]", T).await.unwrap().expect("row").holder;
        assert_eq!(holder.as_deref(), Some("h:' --"), "holder kept verbatim");
    });
}

/// After a restart or `SCRIPT FLUSH` the scripts are unknown to the server;
/// the store falls back to EVAL and goes on.
#[test]
fn flushed_scripts_are_sent_again() {
    let r = Redis::start();
    rt().block_on(async {
        let mut a = store(&r.url());
        assert_eq!(a.acquire("n", "a", L, T).await.unwrap(), Some(1));
        r.cli(&["SCRIPT", "FLUSH"]);
        assert!(a.renew("n", "a", 1, L, T).await.unwrap());
        assert!(a.release("n", "a", 1, ZERO, T).await.unwrap());
        r.cli(&["SCRIPT", "FLUSH"]);
        assert_eq!(a.acquire("n", "a", L, T).await.unwrap(), Some(2));
    });
}

#[test]
fn dead_server_and_wrong_password_are_told_apart() {
    let r = Redis::start();
    rt().block_on(async {
        let url = format!("redis://:Wr0ngSecret@127.0.0.1:{}/0", r.port);
        let err = store(&url).acquire("n", "a", L, T).await.unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, StoreError::Fatal(_)), "{err:?}");
        assert!(msg.contains("authentication failed"), "{msg}");
        assert!(!msg.contains("Wr0ngSecret"), "password echoed: {msg}");
        assert!(msg.contains("redis://:***@"), "{msg}");

        let url = format!("redis://127.0.0.1:{}/0", r.port);
        let err = store(&url).acquire("n", "a", L, T).await.unwrap_err();
        assert!(matches!(err, StoreError::Fatal(_)), "no password: {err:?}");
        assert!(err.to_string().contains("NOAUTH"), "{err}");

        // An ACL user that may not run scripts: NOPERM, also fatal.
        r.cli(&[
            "ACL", "SETUSER", "ro", "on", ">ro-pw", "~*", "+ping", "+get",
        ]);
        let url = format!("redis://ro:ro-pw@127.0.0.1:{}/0", r.port);
        let err = store(&url).acquire("n", "a", L, T).await.unwrap_err();
        assert!(matches!(err, StoreError::Fatal(_)), "{err:?}");
        assert!(err.to_string().contains("NOPERM"), "{err}");

        let dead = format!("redis://:{PASSWORD}@127.0.0.1:{}/0", free_port());
        let err = store(&dead).acquire("n", "a", L, T).await.unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    });
}

#[test]
fn blackholed_call_returns_within_its_timeout_and_reconnects() {
    let r = Redis::start();
    let proxy = Proxy::start(r.port);
    rt().block_on(async {
        let mut a = store(&r.url_via(proxy.port));
        assert_eq!(a.acquire("n", "a", L, T).await.unwrap(), Some(1));
        proxy.blackhole();
        let t0 = Instant::now();
        let err = a
            .renew("n", "a", 1, L, Duration::from_millis(300))
            .await
            .unwrap_err();
        let took = t0.elapsed();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert!(took < Duration::from_millis(800), "{took:?}");
        // A new connection is made once the link heals.
        proxy.heal();
        assert!(a.renew("n", "a", 1, L, T).await.unwrap());
    });
    // A frozen server (accepts nothing, answers nothing) is bounded too.
    r.freeze(true);
    rt().block_on(async {
        let t0 = Instant::now();
        let err = store(&r.url())
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
    r.freeze(false);
}

#[test]
fn the_binary_runs_a_command_under_a_redis_lease() {
    let r = Redis::start();
    let dir = TempDir::new("redis-e2e");
    let url = r.url();
    // The child sees its epoch; its exit status passes through.
    let out = dir.file("env");
    let script = format!(
        "echo \"$LEASE_EPOCH $LEASE_NAME\" > {}; exit 7",
        out.display()
    );
    let res = run(lr(&url, "job", &[], &script));
    assert_eq!(res.code, Some(7), "{}", res.stderr);
    assert_eq!(read(&out).trim(), "1 job");
    assert!(!res.stderr.contains(PASSWORD), "{}", res.stderr);

    // While one holds it, a second contender is refused.
    let mut holder = spawn(
        lr(&url, "job", &["--lease", "3s"], &worker(&dir, "w")),
        &dir.file("w.log"),
    );
    wait_file(&dir.file("w.pid"), Duration::from_secs(10));
    assert_eq!(read(&dir.file("w.epoch")).trim(), "2");
    let res = run(lr(
        &url,
        "job",
        &["--conflict-exit-code", "3", "-v"],
        "echo should-not-run",
    ));
    assert_eq!(res.code, Some(3), "{}", res.stderr);
    assert!(!res.stdout.contains("should-not-run"));
    assert!(res.stderr.contains("held by"), "{}", res.stderr);

    // `status` reads it through the same store.
    let mut c = leaderrun();
    c.args(["status", "--store", &url, "--name", "job"]);
    let st = run(c);
    assert_eq!(st.code, Some(0), "{}", st.stderr);
    assert!(st.stdout.contains("job"), "{}", st.stdout);

    // SIGTERM: the command stops, the lease is released, the next run gets 3.
    signal(holder.id(), nix::sys::signal::Signal::SIGTERM);
    let st = wait_exit(&mut holder, Duration::from_secs(10));
    assert_eq!(st.code(), Some(143), "{}", read(&dir.file("w.log")));
    assert_eq!(r.cli(&["EXISTS", "{leaderrun:job}:lease"]), "0");
    let res = run(lr(&url, "job", &[], &script));
    assert_eq!(res.code, Some(7), "{}", res.stderr);
    assert_eq!(read(&out).trim(), "3 job");
}
